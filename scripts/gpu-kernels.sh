#!/usr/bin/env bash
# Kernel-level traces on the GPU host (release build, realistic configuration of
# scripts/gpu-run.sh): a traced run with --trace-kernels (and its raw capture), a small
# one for the test fixture, the PyTorch peer eager and compiled, unprofiled and profiled (its step
# time under the profiler comes from its trace), and interleaved overhead pairs
# (untraced vs --trace --trace-kernels), in the same call.
#
#   scripts/gpu-kernels.sh [BIN] [OUT_DIR] [PEER]   (defaults: target/release/dflash, gpu-runs, none)
#
# Environment: PHASES (default "capture peer pairs"), PAIRS (default 3), DEADLINE (seconds
# from the start after which no further run is begun; default none), RUN_TIMEOUT (seconds
# one training may take before its threads' kernel wait channels and stacks are written
# to NAME.hang.txt and it is killed; default 120). Every result a
# caller needs is also copied flat into OUT_DIR (NAME.summary.json, NAME.trace.json.gz,
# peer-*.json.gz), so that a copy of OUT_DIR without its subdirectories is enough.
set -uo pipefail
bin="${1:-target/release/dflash}"
out="${2:-gpu-runs}"
peer="${3:-}"
pairs="${PAIRS:-3}"
phases="${PHASES:-capture peer pairs}"
source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
common+=(--set summary_every=5)
has() { [[ " $phases " == *" $1 "* ]]; }

if has capture; then
  DFLASH_KERNEL_DUMP="$out/fixture-capture.json.gz" \
    train_run fixture --steps 12 --trace "$out/fixture" --trace-steps 8..11 --trace-kernels --trace-gzip \
    && cp "$out/fixture/trace.json.gz" "$out/fixture.trace.json.gz"
  DFLASH_KERNEL_DUMP="$out/kernels-capture.json.gz" \
    train_run kernels --steps 40 --trace "$out/kernels" --trace-steps 20..30 --trace-kernels --trace-gzip \
    && cp "$out/kernels/trace.json.gz" "$out/kernels.trace.json.gz"
fi
if has peer && [[ -n "$peer" ]] && in_time peer; then
  # unprofiled step time first (printed), then a profiled trace of 10 steps (Kineto)
  t0=$SECONDS
  timeout 120 "$py" "$peer" "$out/peer-eager" --steps 20 2>&1 | tail -1 | tee "$out/peer-eager.txt"
  timeout 300 "$py" "$peer" "$out/peer-compiled" --compile --profile --steps 30 --active 10 2>&1 | tail -3 | tee "$out/peer-compiled.txt"
  echo "== peer took $((SECONDS - t0))s"
  for f in "$out"/peer-compiled/*.json.gz; do [[ -f "$f" ]] && cp "$f" "$out/peer-$(basename "$f")"; done
fi
if has pairs; then
  for i in $(seq 1 "$pairs"); do
    train_run "ovh-notrace-$i" --steps 60 --run-dir "$out/ovh-notrace-$i" || break
    train_run "ovh-kernels-$i" --steps 60 --trace "$out/ovh-kernels-$i" --trace-steps 10..60 --trace-kernels --trace-gzip || break
  done
  for i in $(seq 1 "$pairs"); do
    for r in "$out"/ovh-notrace-$i "$out"/ovh-kernels-$i; do
      [[ -f "$r/summary.json" ]] || continue
      printf '%s ' "$(basename "$r")"; "$py" -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["mean_step_ms"], s["tokens_per_s"])' "$r/summary.json"
    done
  done | tee "$out/overhead.txt"
fi
echo "done: $out (t=$((SECONDS - start))s)"
