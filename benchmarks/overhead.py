"""Eager host overhead per call: wall time of N back-to-back calls minus the kernel's CUDA-graph time.

    python benchmarks/overhead.py --out DIR      (H200; writes overhead-h200.json)

Issue 3 and 4's bar: <= 8 us per call at 256^3 (GEMM) / a small softmax. torch.matmul and
torch.softmax are measured the same way in the same process as the peer. `xgemm` is the default
path (repeat calls served by the native torch fast path, xgemm/torch/native.py, loaded here
first); `xgemm_python` the same calls with the native module set aside (the Python fast path).
Each record says how many of its calls the native module served.
"""
from __future__ import annotations

import argparse
import time

import torch

import xgemm
from xgemm.torch import fastpath
from xgemm.torch import native as torch_native

import _harness as h
from _harness import graph_us, wall_us_per_call as per_call_us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(h.RESULTS))
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
    saved = torch_native.active
    for case, ours, peer, ok, plan in cases:
        for impl, fn in (("xgemm", ours), ("xgemm_python", ours), ("torch", peer)):
            torch_native.active = saved if impl == "xgemm" else None
            hits = native.stats()["hits"] if native is not None else 0
            wall = per_call_us(fn)
            served = (native.stats()["hits"] - hits) if native is not None else 0
            kern = graph_us(fn)
            records.append({"case": case + "_host_overhead", "shape": [], "dtype": case.split("_")[1], "impl": impl,
                            "metric": "us", "value": wall - kern, "verified": bool(ok),
                            "wall_us": wall, "kernel_us": kern, "plan": plan, "native_calls": served})
            print(f"{case:<28} {impl:<12} wall {wall:7.2f} us  kernel {kern:7.2f} us  overhead {wall - kern:6.2f} us  "
                  f"native {served:4d}/1001  ok={ok}  {plan if impl == 'xgemm' else ''}")
        torch_native.active = saved
    records.append({"meta": {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(),
                             "torch": torch.__version__, "native": torch_native.status(),
                             "command": "python benchmarks/overhead.py"}})
    h.write_json(h.result_path("overhead", out=args.out), records)


if __name__ == "__main__":
    main()
