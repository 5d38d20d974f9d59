"""Eager host overhead per call: wall time of N back-to-back calls minus the kernel's CUDA-graph time.

    python benchmarks/overhead.py --out DIR      (H200; writes overhead-h200.json)

Issue 3 and 4's bar: <= 8 us per call at 256^3 (GEMM) / a small softmax. torch.matmul and
torch.softmax are measured the same way in the same process as the peer. `xgemm` is the default
path (repeat calls served by the native torch fast path, xgemm/torch_native.py, loaded here
first); `xgemm_python` the same calls with the native module set aside (the Python fast path).
Each record says how many of its calls the native module served.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import xgemm  # noqa: E402
from xgemm import fastpath, torch_native  # noqa: E402


def per_call_us(fn, n=1000):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def graph_us(fn, n=200):
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(20):
                fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n // 20):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    native = torch_native.load()
    print(f"native fast path: {torch_native.status()}")
    records = []
    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(256, 256, device="cuda").to(dtype)
        b = torch.randn(256, 256, device="cuda").to(dtype)
        ref = (a.double() @ b.double())
        d = xgemm.matmul(a, b)
        ok = torch.allclose(d.double(), ref, rtol=2e-2, atol=2e-1 if dtype != torch.float32 else 1e-3)
        name = str(dtype).split(".")[-1]
        cases.append((f"matmul_{name}_256x256x256", lambda a=a, b=b: xgemm.matmul(a, b),
                      lambda a=a, b=b: torch.matmul(a, b), ok, str(xgemm.explain(a, b)).splitlines()[1].strip()))
    x = torch.randn(64, 1024, device="cuda")
    y = xgemm.softmax(x)
    cases.append(("softmax_float32_64x1024", lambda: xgemm.softmax(x), lambda: torch.softmax(x, -1),
                  torch.allclose(y, torch.softmax(x, -1), atol=1e-6), str(xgemm.explain(x)).splitlines()[1].strip()))
    saved = (fastpath.native, fastpath.compiling)
    for case, ours, peer, ok, plan in cases:
        for impl, fn in (("xgemm", ours), ("xgemm_python", ours), ("torch", peer)):
            fastpath.use_native(*(saved if impl == "xgemm" else (None, saved[1])))
            hits = native.stats()["hits"] if native is not None else 0
            wall = per_call_us(fn)
            served = (native.stats()["hits"] - hits) if native is not None else 0
            kern = graph_us(fn)
            records.append({"case": case + "_host_overhead", "shape": [], "dtype": case.split("_")[1], "impl": impl,
                            "metric": "us", "value": wall - kern, "verified": bool(ok),
                            "wall_us": wall, "kernel_us": kern, "plan": plan, "native_calls": served})
            print(f"{case:<28} {impl:<12} wall {wall:7.2f} us  kernel {kern:7.2f} us  overhead {wall - kern:6.2f} us  "
                  f"native {served:4d}/1001  ok={ok}  {plan if impl == 'xgemm' else ''}")
        fastpath.use_native(*saved)
    records.append({"meta": {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(),
                             "torch": torch.__version__, "native": torch_native.status(),
                             "command": "python benchmarks/overhead.py"}})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "overhead-h200.json"), "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
