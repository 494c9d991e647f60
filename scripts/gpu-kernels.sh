#!/usr/bin/env bash
# Kernel-level traces on the GPU host (release build, realistic configuration of
# scripts/gpu-run.sh): a traced run with --trace-kernels (and its raw capture), a small
# one for the test fixture, interleaved overhead pairs (untraced vs --trace
# --trace-kernels), and the PyTorch peer compiled, unprofiled and profiled (its step time
# under the profiler comes from its trace), in the same call.
#
#   scripts/gpu-kernels.sh [BIN] [OUT_DIR] [PEER]   (defaults: target/release/dflash, gpu-runs, none)
set -uo pipefail
bin="${1:-target/release/dflash}"
out="${2:-gpu-runs}"
peer="${3:-}"
pairs="${PAIRS:-3}"
source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
common+=(--set summary_every=5)
run() { local name="$1"; shift; echo "== $name: $*"; "$bin" train "${common[@]}" "$@" 2>&1 | tee "$out/$name.log"; }

DFLASH_KERNEL_DUMP="$out/kernels-capture.json.gz" \
  run kernels --steps 40 --trace "$out/kernels" --trace-steps 20..30 --trace-kernels --trace-gzip
DFLASH_KERNEL_DUMP="$out/fixture-capture.json.gz" \
  run fixture --steps 12 --trace "$out/fixture" --trace-steps 8..11 --trace-kernels --trace-gzip
for i in $(seq 1 "$pairs"); do
  run "ovh-notrace-$i" --steps 60 --run-dir "$out/ovh-notrace-$i"
  run "ovh-kernels-$i" --steps 60 --trace "$out/ovh-kernels-$i" --trace-steps 10..60 --trace-kernels --trace-gzip
done
for i in $(seq 1 "$pairs"); do
  for r in "$out"/ovh-notrace-$i "$out"/ovh-kernels-$i; do
    printf '%s ' "$(basename "$r")"; "$py" -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["mean_step_ms"], s["tokens_per_s"])' "$r/summary.json"
  done
done | tee "$out/overhead.txt"
if [[ -n "$peer" ]]; then
  # unprofiled step time first (printed), then a profiled trace of 10 steps (Kineto)
  timeout 240 "$py" "$peer" "$out/peer-compiled" --compile --profile --steps 30 --active 10 2>&1 | tail -3 | tee "$out/peer-compiled.txt"
  rm -rf "$out"/peer-compiled/*.json 2>/dev/null
fi
echo "done: $out"
