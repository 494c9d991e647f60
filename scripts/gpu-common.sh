# Sourced by the GPU scripts (gpu-run.sh, gpu-kernels.sh) after they set `bin` and `out`:
# finds the host's CUDA PyTorch install (its libtorch and CUDA libraries), writes
# $out/device.txt, and defines `common`, the realistic configuration's train arguments
# (target hidden 1024 x 28 layers, vocab 151936; drafter 3 layers, block 16, 256
# anchors, sequence 2048, batch 1; target and drafter on cuda:0).
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
  --set num_anchors=256 --set block_size=16 --set drafter_layers=3 --set chunk_blocks=32
  --target-devices cuda:0 --drafter-device cuda:0 --set log_every=20 --set save_checkpoints=false)
