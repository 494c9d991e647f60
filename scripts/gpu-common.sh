# Sourced by the GPU scripts (gpu-run.sh, gpu-kernels.sh, gpu-step.sh) after they set
# `bin` and `out`: refuses an `out` that is not empty (exit 2), finds the host's CUDA
# PyTorch install (its libtorch and CUDA libraries), writes $out/device.txt, and defines
# `common`, the realistic configuration's train arguments (target hidden 1024 x 28 layers,
# vocab 151936; drafter 3 layers, block 16, 256 anchors, sequence 2048, batch 1; target
# and drafter on cuda:0; the loss in chunks of 128 blocks, 2048 tokens: 27.1 ms/step on
# one H100 against 28.7 with 32 and 27.2 with all 256), and `train_run NAME ARGS...`, one
# training with those arguments under a watchdog: DEADLINE (seconds from the start after
# which no further run is begun; default none), RUN_TIMEOUT (seconds one training may take
# before its threads' kernel wait channels and stacks are written to NAME.hang.txt and it
# is killed; default 120).
if [[ -d "$out" && -n "$(ls -A "$out")" ]]; then
  # its earlier runs would be listed with this call's (and trainings refuse their run dirs)
  echo "error: output directory $out is not empty; choose a new one" >&2
  exit 2
fi
py="${PYTHON:-python3}"
torch_dir="$("$py" -c 'import torch, os; print(os.path.dirname(torch.__file__))')"
site="$(dirname "$torch_dir")"
export LD_LIBRARY_PATH="$torch_dir/lib:$site/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
  "$bin" --version
} | tee "$out/device.txt"
common=(--target-preset realistic --set synthetic_seq_len=2048 --set seq_len=2048 --set batch_tokens=2048
  --set num_anchors=256 --set block_size=16 --set drafter_layers=3 --set chunk_blocks=128
  --target-devices cuda:0 --drafter-device cuda:0 --set log_every=20 --set save_checkpoints=false)
deadline="${DEADLINE:-0}"
run_timeout="${RUN_TIMEOUT:-120}"
start=$SECONDS
in_time() {
  if [[ "$deadline" -gt 0 && $((SECONDS - start)) -ge "$deadline" ]]; then
    echo "== skipped $1: ${deadline}s deadline reached"; return 1
  fi
}
train_run() {
  local name="$1"; shift
  in_time "$name" || return 1
  echo "== $name (t=$((SECONDS - start))s): $*"
  local t0=$SECONDS
  "$bin" train "${common[@]}" "$@" > "$out/$name.log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null && ((SECONDS - t0 < run_timeout)); do sleep 1; done
  if kill -0 "$pid" 2>/dev/null; then
    # a hang: say where each thread waits before killing it
    {
      echo "$name: still running after ${run_timeout}s"
      for t in /proc/"$pid"/task/*; do
        echo "$(basename "$t") $(cat "$t/comm") wchan=$(cat "$t/wchan" 2>/dev/null) state=$(awk '{print $3}' "$t/stat")"
      done
      if command -v gdb >/dev/null; then
        timeout 60 gdb -p "$pid" -batch -ex "thread apply all bt 30" 2>&1
      elif command -v eu-stack >/dev/null; then
        timeout 60 eu-stack -p "$pid" 2>&1
      fi
    } > "$out/$name.hang.txt" 2>&1
    kill -9 "$pid"
    echo "== $name HUNG after ${run_timeout}s (stacks: $out/$name.hang.txt)"
  fi
  wait "$pid"
  echo "== $name took $((SECONDS - t0))s (exit $?)"
  tail -4 "$out/$name.log"
  [[ -f "$out/$name/summary.json" ]] && cp "$out/$name/summary.json" "$out/$name.summary.json"
  return 0
}
