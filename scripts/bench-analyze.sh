#!/usr/bin/env bash
# Benchmarks loading a large trace with dflash-analyze, and the same file with Holistic
# Trace Analysis (HTA) for comparison. Not run in CI (it writes >= 1 GB and takes minutes).
#
#   scripts/bench-analyze.sh [SIZE_MB]      (default 1100; results in $BENCH_DIR/results.txt)
#
# Environment:
#   BIN=path        a dflash-analyze binary to use instead of building one (release)
#   THREADS="0 2"   --threads values to load with (0: one per core; the default "0")
#   RUNS=3          timed loads per thread count
#   SKIP_HTA=1      leave HTA out (it is installed into a throwaway venv under /tmp)
#   KINETO=FILE     grow a real PyTorch-profiler trace (e.g. one of fixtures/traces/kineto/,
#                   with kernels) to the size instead of a synthetic dflash trace
#   SKIP_JSON=1     leave out Python's json.load of the file
#
# Wall time and peak RSS come from a small Python wrapper (resource.getrusage of the
# child), so the script needs only python3. The file is read once before the timed runs so
# every tool reads it from the page cache.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
size_mb="${1:-1100}"
bench="${BENCH_DIR:-/tmp/dflash-bench}"
runs="${RUNS:-3}"
mkdir -p "$bench/run"
results="$bench/results.txt"
: > "$results"
say() { echo "$*" | tee -a "$results"; }

if [[ -n "${BIN:-}" ]]; then
  bin="$BIN"
else
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/h-analyze}"
  cargo build --release -p dflash-analyze --manifest-path "$root/Cargo.toml" >&2
  bin="$CARGO_TARGET_DIR/release/dflash-analyze"
fi

# 1. A trace of at least size_mb: measure bytes per step on a small one, then scale.
trace="$bench/run/trace.json"
if [[ -n "${KINETO:-}" ]]; then
  trace="$bench/run/kineto.pt.trace.json"
  if [[ ! -f "$trace" || $(stat -c %s "$trace") -lt $((size_mb * 1000000)) ]]; then
    python3 "$root/scripts/grow-kineto.py" "$KINETO" "$trace" "$size_mb"
  fi
elif [[ ! -f "$trace" || $(stat -c %s "$trace") -lt $((size_mb * 1000000)) ]]; then
  "$bin" synth --steps 1000 --out "$bench/probe.json"
  per_step=$(( $(stat -c %s "$bench/probe.json") / 1000 ))
  steps=$(( size_mb * 1000000 / per_step + 1 ))
  echo "generating $steps steps (~${size_mb} MB)" >&2
  "$bin" synth --steps "$steps" --out "$trace"
fi
bytes=$(stat -c %s "$trace")
say "trace: $trace, $bytes bytes ($(( bytes / 1000000 )) MB); $(nproc) cores"
cat "$trace" > /dev/null

cat > "$bench/measure.py" <<'PY'
import resource, subprocess, sys, time
out = open(sys.argv[1], "w")
t = time.monotonic()
rc = subprocess.run(sys.argv[2:], stdout=out).returncode
wall = time.monotonic() - t
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(f"{wall:.3f} {rss} {rc}")
PY
measure() { # label, command...
  local label="$1"; shift
  local wall rss rc
  read -r wall rss rc < <(python3 "$bench/measure.py" "$bench/out-$label.txt" "$@")
  if [[ "$rc" != 0 ]]; then say "$label: failed (exit $rc)"; return; fi
  say "$label: wall $wall s, $(awk -v b="$bytes" -v s="$wall" 'BEGIN{printf "%.0f", b/1e6/s}') MB/s, peak RSS $(( rss / 1048576 )) MiB ($(awk -v r="$rss" -v b="$bytes" 'BEGIN{printf "%.2f", r/b}') x file size)"
}

# 2. dflash-analyze: load only (info), RUNS times per thread count; then a full breakdown.
for t in ${THREADS:-0}; do
  for i in $(seq "$runs"); do
    measure "info-threads$t-$i" "$bin" --threads "$t" info "$trace"
    say "  ($(cat "$bench/out-info-threads$t-$i.txt"))"
  done
done
measure "breakdown" "$bin" breakdown --json "$trace"

# 3. Python's json.load of the same file (what a script over the trace starts with).
if [[ "${SKIP_JSON:-0}" != 1 ]]; then
  measure "json.load" python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$trace"
fi

# 4. Holistic Trace Analysis on the same file.
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
