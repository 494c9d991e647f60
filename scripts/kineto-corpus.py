#!/usr/bin/env python3
"""Records the real PyTorch-profiler (Kineto) traces of dflash-analyze's corpus.

Each trace is a small, real `torch.profiler` recording whose bound is known by
construction, so that the analyzer's findings can be checked against the truth:

  gpu_bound       a few large bf16 matmuls per step: the GPU is busy, the CPU waits
  launch_bound    thousands of tiny element-wise kernels per step: the CPU launches,
                  the GPU idles between kernels
  sync_bound      a tiny kernel then `.item()` many times per step: host syncs
  alloc_bound     `torch.cuda.empty_cache()` each step, then fresh allocations:
                  cudaMalloc/cudaFree in every step
  input_bound     the step waits on a (sleeping) data loader before a short GPU step
  two_streams     two CUDA streams working at once
  mlp_train       a small eager training loop (autograd's backward thread launches the
                  backward kernels)
  cpu_mlp         (CPU only) the same loop without CUDA; what a CPU machine can record

On a CUDA host it writes all of them (gzipped, `--steps` active steps each) to OUTDIR;
without CUDA only `cpu_mlp`. `fixtures/traces/README.md` says which are committed.

  python3 scripts/kineto-corpus.py OUTDIR [--steps N] [--only NAME,...]
"""
import argparse
import gzip
import os
import shutil
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule


def gpu_bound(dev):
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)

    def step():
        with record_function("model.matmul"):
            c = a
            for _ in range(4):
                c = (c @ b).clamp_(-1, 1)
        with record_function("model.reduce"):
            return c.float().sum()

    return step


def launch_bound(dev):
    x = torch.randn(256, device=dev)

    def step():
        with record_function("model.elementwise"):
            y = x
            for _ in range(1500):
                y = y * 1.0001 + 0.0001
        with record_function("model.reduce"):
            return y.sum()

    return step


def sync_bound(dev):
    x = torch.randn(1024, device=dev)

    def step():
        total = 0.0
        with record_function("model.read_back"):
            for _ in range(200):
                total += (x * 2).sum().item()
        return total

    return step


def alloc_bound(dev):
    def step():
        with record_function("model.allocate"):
            torch.cuda.empty_cache()
            bufs = [torch.empty(32 << 20, dtype=torch.uint8, device=dev) for _ in range(24)]
            for t in bufs:
                t.fill_(1)
        del bufs
        return None

    return step


def input_bound(dev):
    w = torch.randn(1024, 1024, device=dev)

    def step():
        with record_function("data.next"):
            time.sleep(0.02)  # a slow loader: the GPU has nothing to do meanwhile
            x = torch.randn(64, 1024).to(dev, non_blocking=False)
        with record_function("model.forward"):
            return (x @ w).relu().sum()

    return step


def two_streams(dev):
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)

    def step():
        cur = torch.cuda.current_stream()
        s1.wait_stream(cur)
        s2.wait_stream(cur)
        with record_function("branch.left"), torch.cuda.stream(s1):
            l = a
            for _ in range(6):
                l = (l @ b).clamp_(-1, 1)
        with record_function("branch.right"), torch.cuda.stream(s2):
            r = b
            for _ in range(6):
                r = (r @ a).clamp_(-1, 1)
        cur.wait_stream(s1)
        cur.wait_stream(s2)
        with record_function("merge"):
            return (l + r).float().sum()

    return step


def mlp(dev):
    torch.manual_seed(0)
    width = 2048 if dev != "cpu" else 128
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, width, device=dev)
    y = torch.randn(64, width, device=dev)

    def step():
        with record_function("model.forward"):
            out = model(x)
        with record_function("model.loss"):
            loss = torch.nn.functional.mse_loss(out, y)
        with record_function("model.backward"):
            opt.zero_grad(set_to_none=True)
            loss.backward()
        with record_function("model.optimizer"):
            opt.step()
        return loss

    return step


CUDA_CASES = {
    "gpu_bound": gpu_bound,
    "launch_bound": launch_bound,
    "sync_bound": sync_bound,
    "alloc_bound": alloc_bound,
    "input_bound": input_bound,
    "two_streams": two_streams,
    "mlp_train": mlp,
}


def record(name, make, dev, out, steps):
    step = make(dev)
    for _ in range(2):
        step()
    if dev != "cpu":
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev != "cpu" else [])
    with profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=steps)) as p:
        for _ in range(2 + steps):
            step()
            p.step()
    path = os.path.join(out, name + ".json")
    p.export_chrome_trace(path)
    with open(path, "rb") as f, gzip.GzipFile(path + ".gz", "wb", mtime=0) as g:
        shutil.copyfileobj(f, g)
    os.remove(path)
    print(f"wrote {path}.gz ({os.path.getsize(path + '.gz')} bytes)", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    only = set(filter(None, a.only.split(",")))
    cases = {"cpu_mlp": (mlp, "cpu")}
    if torch.cuda.is_available():
        cases.update({k: (v, "cuda") for k, v in CUDA_CASES.items()})
    for name, (make, dev) in cases.items():
        if not only or name in only:
            record(name, make, dev, a.out, a.steps)


if __name__ == "__main__":
    main()
