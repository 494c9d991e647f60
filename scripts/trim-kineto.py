#!/usr/bin/env python3
"""Cuts a PyTorch-profiler (Kineto) trace down to its first N `ProfilerStep#` steps, for
the committed corpus under fixtures/traces/kineto/. Events are kept as recorded, byte for
byte (Kineto writes one event per `  {` ... `  }` block; the header and the keys after
`traceEvents` stay as they are):

- every event that is not a span, flow or instant (process/thread names, ...) stays;
- a CPU-side event stays when it starts inside a kept step;
- GPU-side events (kernels, copies, sets, GPU annotations) and `ac2g` flow ends stay when
  their correlation id belongs to a kept launch, or, without one, when they start inside
  the kept steps' span of time on the GPU;
- events whose pid/tid are not numbers (Kineto's "Spans"/"Traces" rows, overhead records
  with pid -1) stay, so that readers meet them as they are in real files.

  python3 scripts/trim-kineto.py IN.json[.gz] OUT.json.gz --steps N
"""
import argparse
import gzip
import json
import re

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}


def read_text(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        return f.read()


def split_events(text):
    """(head, [event texts], tail): the text before the first event, each event's block,
    and the text after the last one."""
    start = text.index('"traceEvents": [') + len('"traceEvents": [')
    end = text.rindex("\n  ]")
    body = text[start:end]
    blocks, cur = [], None
    for line in body.split("\n"):
        if line == "  {":
            cur = [line]
        elif cur is not None:
            cur.append(line.rstrip(",") if line in ("  },", "  }") else line)
            if line in ("  },", "  }"):
                blocks.append("\n".join(cur))
                cur = None
    return text[:start], blocks, text[end:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--steps", type=int, default=1)
    a = ap.parse_args()
    text = read_text(a.src)
    head, blocks, tail = split_events(text)
    ev = [json.loads(b) for b in blocks]
    assert len(ev) == len(json.loads(text)["traceEvents"]), "event blocks do not match the array"
    steps = sorted(
        (e for e in ev if e.get("ph") == "X" and re.fullmatch(r"ProfilerStep#\d+", str(e.get("name", "")))),
        key=lambda e: e["ts"],
    )
    if not steps:
        raise SystemExit(f"{a.src}: no ProfilerStep# spans")
    kept_steps = steps[: a.steps]
    lo = kept_steps[0]["ts"]
    hi = kept_steps[-1]["ts"] + kept_steps[-1]["dur"]

    def corr(e):
        args = e.get("args") or {}
        return args.get("correlation", args.get("External id"))

    launches = set()
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and lo <= e["ts"] < hi:
            c = corr(e)
            if c is not None:
                launches.add(c)
    gpu_times = [e["ts"] for e in ev if e.get("cat") in GPU_CATS and corr(e) in launches]
    glo, ghi = (min(gpu_times), max(gpu_times)) if gpu_times else (lo, hi)

    out = []
    for e, block in zip(ev, blocks):
        ph, cat = e.get("ph"), e.get("cat")
        numeric = isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int) and e["pid"] >= 0
        if ph not in ("X", "s", "f", "i", "I", "t"):
            out.append(block)
        elif not numeric:
            out.append(block)
        elif cat in GPU_CATS or (ph == "f" and cat == "ac2g"):
            c = corr(e) if ph == "X" else e.get("id")
            if c in launches or (c is None and glo <= e["ts"] <= ghi):
                out.append(block)
        elif cat == "ac2g" and ph == "s":
            if e.get("id") in launches:
                out.append(block)
        elif lo <= e.get("ts", lo - 1) < hi:
            out.append(block)
    trimmed = head + "\n" + ",\n".join(out) + tail
    json.loads(trimmed)  # still one valid document
    with gzip.GzipFile(a.dst, "wb", mtime=0) as g:
        g.write(trimmed.encode())
    print(f"{a.dst}: {len(out)} of {len(ev)} events, steps {kept_steps[0]['name']}..{kept_steps[-1]['name']}")


if __name__ == "__main__":
    main()
