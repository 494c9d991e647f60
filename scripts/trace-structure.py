#!/usr/bin/env python3
"""Prints the structure of a dflash trace, one sorted line per event, so that two traces
of the same run configuration can be compared with `diff` (timestamps aside):

    diff <(scripts/trace-structure.py runs/a/trace.json) <(scripts/trace-structure.py runs/b/trace.json)

Kept: the header's keys and `metadata` keys, each event's ph, cat, name, its process and
thread by name (not by pid/tid), its args' keys, the values of args that do not depend on
timing (step, batch, tokens), and its flow flags. Dropped: ts, dur, pids, tids, flow ids,
and timing-dependent arg values (wait_us, depth, loss, cpu_ts and counter values). Flows
are checked separately: every flow_in id must have a flow_out with the same id, and the
pairs are printed as (source name, destination name).
"""
import collections
import gzip
import json
import sys

STABLE_ARGS = {"step", "batch", "tokens", "sort_index"}


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def main(path):
    doc = load(path)
    out = []
    out.append("top " + " ".join(k for k in doc if k != "traceEvents"))
    out.append("metadata " + " ".join(sorted(doc.get("metadata", {}))))
    events = doc["traceEvents"]
    procs, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e["pid"]] = e["args"]["name"]
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    lines = []
    outs, ins = {}, []
    for e in events:
        pid = e.get("pid")
        where = procs.get(pid, "?")
        if "tid" in e and e.get("ph") != "M":
            where += " / " + threads.get((pid, e["tid"]), "?")
        if e.get("ph") == "M" and e.get("name", "").startswith("thread"):
            where += " / " + threads.get((pid, e.get("tid")), "?")
        args = e.get("args", {})
        shown = ",".join(
            f"{k}={args[k]}" if k in STABLE_ARGS or e.get("ph") == "M" and k == "name" else k
            for k in args
        )
        flags = "".join(
            f for f, on in (
                (" bind", "bind_id" in e),
                (" out", e.get("flow_out")),
                (" in", e.get("flow_in")),
            ) if on
        )
        keys = ",".join(e.keys())
        lines.append(f"{e.get('ph')} {e.get('cat', '-')} {e.get('name')} @ {where} [{keys}] {{{shown}}}{flags}")
        if e.get("flow_out"):
            outs[e["bind_id"]] = e["name"]
        if e.get("flow_in"):
            ins.append((e["bind_id"], e["name"]))
    out.extend(sorted(lines))
    pairs = collections.Counter()
    for fid, name in ins:
        pairs[f"flow {outs.get(fid, 'MISSING SOURCE')} -> {name}"] += 1
    out.extend(f"{k} x{v}" for k, v in sorted(pairs.items()))
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
