#!/usr/bin/env bash
# Step time of dflash against the PyTorch peer in one call on the GPU host (release
# build, realistic configuration of scripts/gpu-common.sh): the peer eager and compiled,
# then dflash's VARIANTS interleaved, each untraced and with --trace, REPS times, then the
# compiled peer again; one --trace-kernels run of the last variant (its window running to
# the run's end). Prints and writes
# $OUT_DIR/step-times.txt (name, mean step ms, tokens/s); traced runs keep their gzipped
# traces flat in OUT_DIR (NAME.trace.json.gz) for `dflash-analyze compare`.
#
#   scripts/gpu-step.sh [BIN] [OUT_DIR] [PEER]   (defaults: target/release/dflash, gpu-runs, none)
#
# Environment: VARIANTS (space-separated NAME[@BIN]:SETTING[,SETTING...]: BIN, another
# dflash binary to run instead of BIN, for a before/after pair; default
# "target:fused_drafter_kernels=false dense:attn_batch_blocks=0 batched:attn_batch_blocks=32"),
# REPS (default 2), STEPS (default 60),
# DEADLINE and RUN_TIMEOUT as in scripts/gpu-kernels.sh, PEER_EAGER (0: skip the eager
# peer; default 1).
set -uo pipefail
bin="${1:-target/release/dflash}"
out="${2:-gpu-runs}"
peer="${3:-}"
variants="${VARIANTS:-target:fused_drafter_kernels=false dense:attn_batch_blocks=0 batched:attn_batch_blocks=32}"
reps="${REPS:-2}"
steps="${STEPS:-60}"
source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
common+=(--set summary_every=20)

peer_run() {
  [[ -n "$peer" ]] || return 0
  in_time "$1" || return 0
  echo "== $1 (t=$((SECONDS - start))s)"
  timeout 300 "$py" "$peer" "$out/$1" "${@:2}" 2>&1 | tail -1 | tee "$out/$1.txt"
}
settings_of() {
  local s=() kv
  IFS=, read -ra kv <<< "${1#*:}"
  for x in "${kv[@]}"; do s+=(--set "$x"); done
  printf '%s\n' "${s[@]}"
}

[[ "${PEER_EAGER:-1}" == 0 ]] || peer_run peer-eager --steps 20
peer_run peer-compiled-1 --compile --steps 30
last=""
main_bin="$bin"
for i in $(seq 1 "$reps"); do
  for v in $variants; do
    name="${v%%:*}"; bin="$main_bin"; last="$v"
    if [[ "$name" == *@* ]]; then bin="${name#*@}"; name="${name%%@*}"; fi
    mapfile -t set < <(settings_of "$v")
    train_run "$name-notrace-$i" --steps "$steps" --run-dir "$out/$name-notrace-$i" "${set[@]}"
    train_run "$name-trace-$i" --steps "$steps" --trace "$out/$name-trace-$i" \
      --trace-steps 10.."$steps" --trace-gzip "${set[@]}" \
      && cp "$out/$name-trace-$i/trace.json.gz" "$out/$name-trace-$i.trace.json.gz"
  done
done
bin="$main_bin"
peer_run peer-compiled-2 --compile --steps 30
if [[ -n "$last" && "$last" != *@* ]]; then
  mapfile -t set < <(settings_of "$last")
  train_run "${last%%:*}-kernels" --steps 20 --trace "$out/${last%%:*}-kernels" --trace-steps 14..20 \
    --trace-kernels --trace-gzip "${set[@]}" \
    && cp "$out/${last%%:*}-kernels/trace.json.gz" "$out/${last%%:*}-kernels.trace.json.gz"
fi
{
  for f in "$out"/peer-*.txt; do [[ -f "$f" ]] && echo "$(basename "$f" .txt) $(cat "$f")"; done
  for r in "$out"/*-notrace-* "$out"/*-trace-*; do
    [[ -f "$r/summary.json" ]] || continue
    printf '%s ' "$(basename "$r")"
    "$py" -c 'import json,sys; s=json.load(open(sys.argv[1])); print(round(s["mean_step_ms"], 2), round(s["tokens_per_s"]), s["losses"][-1])' "$r/summary.json"
  done
} | tee "$out/step-times.txt"
echo "done: $out (t=$((SECONDS - start))s)"
