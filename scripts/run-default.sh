#!/usr/bin/env bash
# The main job on the embedded default: sets up libtorch once, builds the two programs,
# trains a drafter on the bundled corpus against the bundled tiny target with tracing,
# analyses the trace, and ends by saying where to look. Idempotent: re-running starts a
# fresh run directory.
#
#   scripts/run-default.sh [RUN_DIR]          (default: runs/default-<date>-<time>)
#
# Environment (for tests; users need none of it):
#   DFLASH_PROFILE      cargo profile to build with (default release; the test suite
#                       passes dev, which reuses the binaries `cargo test` built)
#   DFLASH_TRAIN_ARGS   extra arguments for `dflash train` (the test suite shortens the run)
#   DFLASH_BUILD_ARGS   extra arguments for `cargo build` (scripts/measure-cold.sh passes
#                       --timings to record each crate's build time)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# The programs this script builds, by package (each package's binary has its name). The
# script runs nothing else, and README commands call nothing else (tests/main_command.rs).
bins=(dflash dflash-analyze)
profile="${DFLASH_PROFILE:-release}"

step() { printf '\n== %s\n' "$*" >&2; }
elapsed() { local s=$((SECONDS - $1)); printf '%d min %02d s' $((s / 60)) $((s % 60)); }

t0=$SECONDS
step "set-up (libtorch into .venv, once)"
bash scripts/setup.sh
t_setup=$SECONDS

step "build: ${bins[*]} ($profile)"
packages=()
for b in "${bins[@]}"; do packages+=(-p "$b"); done
# shellcheck disable=SC2086 # DFLASH_BUILD_ARGS is a list of words
cargo build --locked --profile "$profile" "${packages[@]}" --bins ${DFLASH_BUILD_ARGS:-}
out_dir="${CARGO_TARGET_DIR:-$root/target}/$([[ "$profile" == dev ]] && echo debug || echo "$profile")"
t_build=$SECONDS

bin() { # NAME ARGS...: runs one of the programs built above, and only those
  local name="$1"
  shift
  if [[ " ${bins[*]} " != *" $name "* ]]; then
    echo "error: scripts/run-default.sh does not build $name" >&2
    exit 1
  fi
  "$out_dir/$name" "$@"
}

run="${1:-runs/default-$(date +%Y%m%d-%H%M%S)}"
step "train the embedded default, traced, into $run"
# shellcheck disable=SC2086 # DFLASH_TRAIN_ARGS is a list of words
bin dflash train --trace "$run" ${DFLASH_TRAIN_ARGS:-}
t_train=$SECONDS

step "analyse"
bin dflash-analyze breakdown "$run"
bin dflash-analyze plot "$run" --out "$run/plots"
breakdown_json="$(bin dflash-analyze breakdown "$run" --json --color never)"
top="$(printf '%s' "$breakdown_json" | python3 -c '
import json, sys
f = json.load(sys.stdin).get("findings") or []
print(f[0]["text"] if f else "no finding: nothing stands out in this run")')"
t_done=$SECONDS

trace_file="$run/trace.json"
[[ -f "$trace_file" ]] || trace_file="$run/trace.json.gz"
abs() { (cd "$(dirname "$1")" && printf '%s/%s' "$(pwd)" "$(basename "$1")"); }
cat <<EOF

Where to look
  trace:        $(abs "$trace_file")   (open it in https://ui.perfetto.dev)
  plots:        $(abs "$run/plots")
  top finding:  $top
  more:         $out_dir/dflash-analyze breakdown $run   |   compare $run OTHER_RUN
  took:         $(elapsed "$t0"): set-up $((t_setup - t0)) s, build $((t_build - t_setup)) s, train $((t_train - t_build)) s, analysis $((t_done - t_train)) s
EOF
