#!/usr/bin/env python3
"""Makes the Kineto (PyTorch profiler) fixtures of dflash-analyze.

1. fixtures/traces/kineto_cpu.json.gz: a real `torch.profiler` trace of a tiny MLP
   trained for a few steps on the CPU, with `record_function` sections and
   `ProfilerStep#N` steps. Needs torch (reuse the project venv: .venv/bin/python).
2. fixtures/traces/kineto_gpu_shaped.json: a small hand-made trace in Kineto's shape with
   `gpu_user_annotation` and `kernel` events on pid = device, which a CPU run cannot
   produce. Needs only the standard library.

Usage: .venv/bin/python scripts/make-kineto-fixture.py [--only-gpu-shaped]
"""
import gzip
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fixtures", "traces")


def cpu_trace():
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 16)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    y = torch.randn(32, 16)
    sched = schedule(wait=1, warmup=1, active=6, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched) as prof:
        for _ in range(8):
            with record_function("model.forward"):
                out = model(x)
            with record_function("model.loss"):
                loss = torch.nn.functional.mse_loss(out, y)
            with record_function("model.backward"):
                opt.zero_grad()
                loss.backward()
            with record_function("model.optimizer"):
                opt.step()
            prof.step()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, "rb") as f:
            data = f.read()
    dest = os.path.join(OUT, "kineto_cpu.json.gz")
    with gzip.GzipFile(dest, "wb", mtime=0) as g:
        g.write(data)
    print(f"wrote {dest} ({len(data)} bytes of JSON, torch {torch.__version__})")


def gpu_shaped_trace():
    """Two steps; per step a CPU annotation, its GPU annotation and two kernels each."""
    ev = []
    cpu_pid, cpu_tid, dev, stream = 1234, 1234, 0, 7
    ev.append({"ph": "M", "name": "process_name", "pid": cpu_pid, "tid": 0, "args": {"name": "python"}})
    ev.append({"ph": "M", "name": "process_name", "pid": dev, "tid": 0, "args": {"name": "GPU 0"}})
    ev.append({"ph": "M", "name": "thread_name", "pid": dev, "tid": stream, "args": {"name": "stream 7"}})
    t = 1000.0
    corr = 1
    for step in range(2):
        step_start = t
        # CPU: ProfilerStep > forward (launches 2 kernels), backward (launches 2 kernels).
        gpu_t = step_start + 50.0
        for name, cpu_dur, kernels in (("model.forward", 300.0, [40.0, 60.0]), ("model.backward", 500.0, [120.0, 80.0])):
            ev.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": cpu_pid, "tid": cpu_tid,
                       "ts": t, "dur": cpu_dur, "args": {"External id": corr}})
            gstart = gpu_t
            for k, kd in enumerate(kernels):
                launch = t + 10.0 + 20.0 * k
                ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": cpu_pid,
                           "tid": cpu_tid, "ts": launch, "dur": 8.0, "args": {"correlation": corr}})
                ev.append({"ph": "X", "cat": "kernel", "name": f"{name}_kernel_{k}", "pid": dev, "tid": stream,
                           "ts": gpu_t, "dur": kd,
                           "args": {"device": dev, "stream": stream, "correlation": corr,
                                    "grid": [1, 1, 1], "block": [128, 1, 1]}})
                ev.append({"ph": "s", "id": corr, "pid": cpu_pid, "tid": cpu_tid, "ts": launch,
                           "cat": "ac2g", "name": "ac2g"})
                ev.append({"ph": "f", "id": corr, "pid": dev, "tid": stream, "ts": gpu_t,
                           "cat": "ac2g", "name": "ac2g", "bp": "e"})
                corr += 1
                gpu_t += kd + 5.0
            ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": dev, "tid": stream,
                       "ts": gstart, "dur": gpu_t - 5.0 - gstart, "args": {}})
            t += cpu_dur + 10.0
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": cpu_pid,
                   "tid": cpu_tid, "ts": step_start - 1.0, "dur": t - step_start + 2.0, "args": {}})
        t += 20.0
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150000000000}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "traceEvents": ev,
        "traceName": "hand-made",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1700000000000000000,
    }
    dest = os.path.join(OUT, "kineto_gpu_shaped.json")
    with open(dest, "w") as f:
        json.dump(doc, f, indent=0)
    print(f"wrote {dest} ({len(ev)} events)")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    gpu_shaped_trace()
    if "--only-gpu-shaped" not in sys.argv:
        cpu_trace()
