#!/usr/bin/env bash
# GPU experiments with a release build of dflash, on a host that has a CUDA PyTorch 2.11
# install but no Rust toolchain. Finds that install's libtorch and CUDA libraries, runs
# the traced trainings at the realistic size (target hidden 1024 x 28 layers, vocab
# 151936; drafter 3 layers on target layers [1, 13, 25], block 16, 256 anchors, sequence
# 2048, batch 1, bf16) and writes every run directory under OUT_DIR.
#
#   scripts/gpu-run.sh [BIN] [OUT_DIR]      (defaults: target/release/dflash, gpu-runs)
#
# Runs: perf (traced) and perf-notrace; span costs (gpu_span_cost example, driver and
# runtime event records; the trace_span bench binary when present); fidelity (sections also timed by synchronizing);
# overhead-{trace,notrace}-N interleaved; fixture-a / fixture-b (anchors 256 vs 512,
# gzipped traces of a few steps).
set -euo pipefail
bin="${1:-target/release/dflash}"
out="${2:-gpu-runs}"
reps="${REPS:-5}"
source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
common+=(--set summary_every=20)

run() { local name="$1"; shift; echo "== $name: $*"; "$bin" train "${common[@]}" "$@" 2>&1 | tee "$out/$name.log"; }

run perf --steps 60 --trace "$out/perf" --trace-steps 20..40 --trace-gzip
run perf-notrace --steps 60 --run-dir "$out/perf-notrace"
run fidelity --steps 30 --trace "$out/fidelity" --trace-steps 10..25 --trace-gzip --set sync_sections=true
# trace overhead: same binary, interleaved, every step traced
for i in $(seq 1 "$reps"); do
  run "overhead-notrace-$i" --steps 100 --run-dir "$out/overhead-notrace-$i"
  run "overhead-trace-$i" --steps 100 --trace "$out/overhead-trace-$i" --trace-steps 0..100 --trace-gzip
done
# CPU cost of one GPU-timed span
example="$(dirname "$bin")/examples/gpu_span_cost"
if [[ -x "$example" ]]; then
  "$example" | tee "$out/gpu_span_cost.txt"
  DFLASH_CUDA_EVENTS=runtime "$example" | tee "$out/gpu_span_cost_runtime.txt"
fi
# CPU-only span cost on this host's CPU: the trace_span bench binary, if carried
# (cp target/release/deps/trace_span-<hash> target/release/trace_span_bench).
bench="$(dirname "$bin")/trace_span_bench"
if [[ -x "$bench" ]]; then TRACE_BENCH_MIN=1 "$bench" --bench 2>&1 | tee "$out/trace_span_bench.txt"; fi
run fixture-a --steps 14 --trace "$out/fixture-a" --trace-steps 6..14 --trace-gzip
run fixture-b --steps 14 --trace "$out/fixture-b" --trace-steps 6..14 --trace-gzip --set num_anchors=512
echo "done: $out"
