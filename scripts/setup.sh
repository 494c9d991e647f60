#!/usr/bin/env bash
# Installs what building dflash needs into a project-local, git-ignored venv:
# libtorch from the PyPI wheel torch==2.11.0 (CUDA 13 build) and the CUDA C runtime
# headers the small C++ stream/event shim compiles against. Idempotent: a second run
# checks the stamp and returns at once.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
torch_pin="torch==2.11.0"
crt_pin="nvidia-cuda-crt==13.0.88.*"
stamp="$venv/.dflash-setup"
want="$torch_pin $crt_pin"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -e "$venv/libtorch/lib/libtorch.so" ]]; then
  exit 0
fi

py="${PYTHON:-python3}"
if ! command -v "$py" >/dev/null; then
  echo "error: $py not found; install Python 3.9+ or set PYTHON" >&2
  exit 2
fi
# The wheels download to a temporary folder and unpack to about 4 GB; say so plainly when
# the disk cannot hold them, rather than failing halfway through the install.
need_kb=$((7 * 1024 * 1024))
mkdir -p "$venv"
free_kb="$(df -Pk "$venv" | awk 'NR==2 {print $4}')"
tmp_kb="$(df -Pk "${TMPDIR:-/tmp}" | awk 'NR==2 {print $4}')"
if (( free_kb < need_kb )); then
  echo "error: $venv has $((free_kb / 1024)) MiB free; installing libtorch needs about $((need_kb / 1024)) MiB" >&2
  exit 2
fi
if (( tmp_kb < 3 * 1024 * 1024 )); then
  echo "error: ${TMPDIR:-/tmp} has $((tmp_kb / 1024)) MiB free; pip needs about 3 GiB there for the downloads (set TMPDIR)" >&2
  exit 2
fi
echo "setup: installing $torch_pin into $venv (about 4 GB, once)" >&2
[[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir)
# torch itself without its Python dependencies (triton, sympy, ...: about 0.8 GB that a
# libtorch build never loads), then only the native libraries libtorch links against:
# the CUDA toolkit pieces and the nvidia-* wheels torch requires on Linux.
"${pip[@]}" --no-deps "$torch_pin"
mapfile -t native < <("$venv/bin/python" - <<'PY'
import importlib.metadata as m
for req in m.requires("torch"):
    spec, _, marker = req.partition(";")
    if "extra ==" in marker:
        continue
    if spec.startswith(("cuda-toolkit", "nvidia-")):
        print(spec.strip())
PY
)
if (( ${#native[@]} == 0 )); then
  echo "error: torch's metadata names no native CUDA libraries; cannot install libtorch's dependencies" >&2
  exit 1
fi
"${pip[@]}" --no-warn-conflicts "${native[@]}" "$crt_pin"
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
site_rel="$(realpath --relative-to="$venv" "$site")"
# One stable, relocatable path for .cargo/config.toml, whatever the Python minor version is.
ln -sfn "$site_rel/torch" "$venv/libtorch"
ln -sfn "$site_rel/nvidia" "$venv/nvidia"
echo "$want" > "$stamp"
echo "setup: done (torch $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))'))" >&2
