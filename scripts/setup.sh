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
echo "setup: installing $torch_pin into $venv (about 3 GB, once)" >&2
[[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$torch_pin" "$crt_pin"
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
site_rel="$(realpath --relative-to="$venv" "$site")"
# One stable, relocatable path for .cargo/config.toml, whatever the Python minor version is.
ln -sfn "$site_rel/torch" "$venv/libtorch"
ln -sfn "$site_rel/nvidia" "$venv/nvidia"
echo "$want" > "$stamp"
echo "setup: done (torch $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))'))" >&2
