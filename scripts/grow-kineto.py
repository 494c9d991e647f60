#!/usr/bin/env python3
"""Grows a real PyTorch-profiler trace to a given size for load benchmarks: the events of
SOURCE (a .json or .json.gz Kineto trace from fixtures/traces/kineto/) are written again
and again, each copy shifted past the one before in time, with its step numbers,
correlation ids, external ids and flow ids renumbered, so the result reads as one long
profile with the kernels, launches and flows of the original. Standard library only.

    scripts/grow-kineto.py SOURCE OUT.json SIZE_MB
"""

import gzip
import json
import sys


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    src, out, size_mb = sys.argv[1], sys.argv[2], float(sys.argv[3])
    opener = gzip.open if src.endswith(".gz") else open
    with opener(src, "rt") as f:
        doc = json.load(f)
    events = doc.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    period = (t1 - t0) * 1.01
    steps = sorted(
        {
            int(e["name"].split("#")[1])
            for e in events
            if str(e.get("name", "")).startswith("ProfilerStep#")
        }
    )
    nsteps = len(steps) or 1
    max_corr = max(
        [
            (e.get("args") or {}).get("correlation", 0)
            for e in events
            if isinstance((e.get("args") or {}).get("correlation", 0), int)
        ]
        + [0]
    )
    max_ext = max(
        [
            (e.get("args") or {}).get("External id", 0)
            for e in events
            if isinstance((e.get("args") or {}).get("External id", 0), int)
        ]
        + [0]
    )
    max_flow = max([e["id"] for e in events if isinstance(e.get("id"), int)] + [0])
    want = int(size_mb * 1e6)
    written = 0
    copy = 0
    with open(out, "w") as f:
        head = json.dumps(doc)[:-1]
        f.write(head + (', ' if doc else '') + '"traceEvents": [\n')
        written += len(head)
        first = True
        while written < want:
            shift = copy * period
            for e in events:
                if copy > 0 and e.get("ph") == "M":
                    continue
                e2 = dict(e)
                if isinstance(e2.get("ts"), (int, float)):
                    e2["ts"] = round(e2["ts"] + shift, 3)
                name = str(e2.get("name", ""))
                if name.startswith("ProfilerStep#"):
                    n = int(name.split("#")[1])
                    e2["name"] = f"ProfilerStep#{n + copy * nsteps}"
                if isinstance(e2.get("id"), int) and e2.get("ph") in ("s", "f", "t"):
                    e2["id"] = e2["id"] + copy * (max_flow + 1)
                args = e2.get("args")
                if isinstance(args, dict):
                    a = dict(args)
                    if isinstance(a.get("correlation"), int):
                        a["correlation"] += copy * (max_corr + 1)
                    if isinstance(a.get("External id"), int):
                        a["External id"] += copy * (max_ext + 1)
                    e2["args"] = a
                line = json.dumps(e2)
                f.write(("" if first else ",\n") + line)
                first = False
                written += len(line) + 2
            copy += 1
        f.write("\n]}\n")
    print(f"{out}: {copy} copies of {len(events)} events, {written / 1e6:.0f} MB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
