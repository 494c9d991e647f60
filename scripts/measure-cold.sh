#!/usr/bin/env bash
# Times the README's main command (and, with --ci, the CI command) as a new user meets
# them: a fresh clone of HEAD, an empty cargo registry and no pip cache. Prints the split
# by phase; the main command's own last lines give set-up, build, training and analysis.
#
#   scripts/measure-cold.sh [--ci] [WORK_DIR]     (default WORK_DIR: a new temp dir)
#
# Needs about 10 GB free in WORK_DIR (libtorch, both builds). Nothing outside WORK_DIR is
# touched; the cargo registry and the pip cache live inside it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ci=0
if [[ "${1:-}" == "--ci" ]]; then ci=1; shift; fi
work="${1:-$(mktemp -d)}"
mkdir -p "$work"
git clone -q "$root" "$work/clone"
export CARGO_HOME="$work/cargo-home" PIP_CACHE_DIR="$work/pip-cache"
mkdir -p "$CARGO_HOME"
cd "$work/clone"
t0=$SECONDS
DFLASH_BUILD_ARGS=--timings bash scripts/run-default.sh "$work/run" 2>&1 | tee "$work/main-command.log"
echo "main command: $((SECONDS - t0)) s (cold: fresh clone, empty cargo registry, no pip cache)"
# Per-crate build times of the main command's build (cargo's --timings report). The build
# keeps every core busy, so its wall time is about the summed crate times over the cores.
report="$(ls target/cargo-timings/cargo-timing-*.html 2>/dev/null | head -1)"
if [[ -n "$report" ]]; then
  python3 - "$report" <<'PY'
import json, re, sys
html = open(sys.argv[1]).read()
units = json.loads(re.search(r"const UNIT_DATA = (\[.*?\]);\n", html, re.S).group(1))
print(f"build: crate compile times summed {sum(u['duration'] for u in units):.0f} s; the longest:")
for u in sorted(units, key=lambda u: -u["duration"])[:10]:
    print(f"  {u['duration']:6.1f} s  {u['name']} {u.get('target', '').strip()}")
print(f"report: {sys.argv[1]}")
PY
fi
if (( ci )); then
  rm -rf "$work/clone2" && git clone -q "$root" "$work/clone2" && cd "$work/clone2"
  rm -rf "$CARGO_HOME/registry" "$PIP_CACHE_DIR"
  t1=$SECONDS
  CI=true bash .ci/run > "$work/ci.log" 2>&1
  echo "CI (.ci/run): $((SECONDS - t1)) s, fresh clone; log: $work/ci.log"
fi
