"""Eager host overhead per call: wall time of N back-to-back calls minus the kernel's CUDA-graph time.

    python benchmarks/overhead.py --out DIR      (H200; writes overhead-h200.json)

Issue 3 and 4's bar: <= 8 us per call at 256^3 (GEMM) / a small softmax. torch.matmul and
torch.softmax are measured the same way in the same process as the peer.
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
    for case, ours, peer, ok, plan in cases:
        for impl, fn in (("xgemm", ours), ("torch", peer)):
            wall, kern = per_call_us(fn), graph_us(fn)
            records.append({"case": case + "_host_overhead", "shape": [], "dtype": case.split("_")[1], "impl": impl,
                            "metric": "us", "value": wall - kern, "verified": bool(ok),
                            "wall_us": wall, "kernel_us": kern, "plan": plan})
            print(f"{case:<28} {impl:<6} wall {wall:7.2f} us  kernel {kern:7.2f} us  overhead {wall - kern:6.2f} us  ok={ok}  {plan if impl == 'xgemm' else ''}")
    records.append({"meta": {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(),
                             "torch": torch.__version__, "command": "python benchmarks/overhead.py"}})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "overhead-h200.json"), "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
