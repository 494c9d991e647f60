#!/usr/bin/env bash
# Benchmarks loading a large trace with dflash-analyze, and the same file with Holistic
# Trace Analysis (HTA) for comparison. Not run in CI (it writes >= 1 GB and takes minutes).
#
#   scripts/bench-analyze.sh [SIZE_MB]      (default 1100; results in $BENCH_DIR/results.txt)
#
# Measures wall time and peak RSS with /usr/bin/time -v. The file is read once before the
# timed runs so every tool reads it from the page cache. HTA is installed into a
# throwaway venv under /tmp (set SKIP_HTA=1 to leave it out).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
size_mb="${1:-1100}"
bench="${BENCH_DIR:-/tmp/dflash-bench}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/h-analyze}"
mkdir -p "$bench/run"
results="$bench/results.txt"
: > "$results"
say() { echo "$*" | tee -a "$results"; }

cargo build --release -p dflash-analyze --manifest-path "$root/Cargo.toml" >&2
bin="$CARGO_TARGET_DIR/release/dflash-analyze"

# 1. A trace of at least size_mb: measure bytes per step on a small one, then scale.
trace="$bench/run/trace.json"
if [[ ! -f "$trace" || $(stat -c %s "$trace") -lt $((size_mb * 1000000)) ]]; then
  "$bin" synth --steps 1000 --out "$bench/probe.json"
  per_step=$(( $(stat -c %s "$bench/probe.json") / 1000 ))
  steps=$(( size_mb * 1000000 / per_step + 1 ))
  echo "generating $steps steps (~${size_mb} MB)" >&2
  "$bin" synth --steps "$steps" --out "$trace"
fi
bytes=$(stat -c %s "$trace")
say "trace: $trace, $bytes bytes ($(( bytes / 1000000 )) MB)"
cat "$trace" > /dev/null

measure() { # label, command...
  local label="$1"; shift
  local log="$bench/time-$label.log"
  /usr/bin/time -v "$@" > "$bench/out-$label.txt" 2> "$log" || { say "$label: failed (see $log)"; return; }
  local wall rss
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$log")
  rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
  local secs
  secs=$(echo "$wall" | awk -F: '{ if (NF==3) print $1*3600+$2*60+$3; else print $1*60+$2 }')
  say "$label: wall ${secs} s, $(awk -v b="$bytes" -v s="$secs" 'BEGIN{printf "%.0f", b/1e6/s}') MB/s, peak RSS $(( rss / 1024 )) MiB ($(awk -v r="$rss" -v b="$bytes" 'BEGIN{printf "%.2f", r*1024/b}') x file size)"
}

# 2. dflash-analyze: load only (info), three times; then a full breakdown once.
for i in 1 2 3; do measure "dflash-analyze-info-$i" "$bin" info "$trace"; done
say "  (its own timer: $(cat "$bench/out-dflash-analyze-info-3.txt"))"
measure "dflash-analyze-breakdown" "$bin" breakdown --json "$trace"

# 3. Holistic Trace Analysis on the same file.
if [[ "${SKIP_HTA:-0}" != 1 ]]; then
  venv=/tmp/hta-venv
  [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
  "$venv/bin/python" -c "import hta" 2>/dev/null || "$venv/bin/pip" install --quiet HolisticTraceAnalysis
  cat > "$bench/hta_load.py" <<'PY'
import sys, time
from hta.trace_analysis import TraceAnalysis
t = time.time()
a = TraceAnalysis(trace_dir=sys.argv[1])
df = a.t.get_trace(0)
print(f"HTA loaded {len(df)} events in {time.time() - t:.1f} s")
PY
  say "HTA $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("HolisticTraceAnalysis"))')"
  measure "hta" timeout 1800 "$venv/bin/python" "$bench/hta_load.py" "$bench/run"
  say "  ($(tail -1 "$bench/out-hta.txt" 2>/dev/null))"
fi
echo "results in $results" >&2
