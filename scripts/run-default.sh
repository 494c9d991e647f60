#!/usr/bin/env bash
# The main job on the embedded default: sets up libtorch once, builds in release mode,
# trains a drafter on the bundled corpus against the bundled tiny target with tracing,
# then analyses the trace. Idempotent: re-running starts a fresh run directory.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
cargo build --release --locked --bins
run="${1:-runs/default-$(date +%Y%m%d-%H%M%S)}"
./target/release/dflash train --trace "$run"
./target/release/dflash-analyze breakdown "$run"
./target/release/dflash-analyze plot "$run" --out "$run/plots"
echo "run directory: $run (trace: $run/trace.json, plots: $run/plots)"
