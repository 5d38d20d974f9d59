"""One implementation's GEMM, a few calls, the last inside an NVTX range named "prof": a target
for Nsight Compute, so xgemm's kernel and a peer's can be profiled the same way.

    ncu --clock-control none --nvtx --nvtx-include "prof/" --section SpeedOfLight \\
        python benchmarks/one_gemm.py --impl xgemm --shape 8192x8192x8192 --dtype bfloat16

--impl xgemm | quack | cublas. Inputs are random normal; the result is checked against
torch.matmul (relative Frobenius error < 1e-2) after the profiled call.
"""
from __future__ import annotations

import argparse
import sys

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=("xgemm", "quack", "cublas"), default="xgemm")
    ap.add_argument("--shape", default="8192x8192x8192")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--config", default="", help="xgemm only: a cute_gemm_sm90 Config as comma-separated "
                    "fields (e.g. 128,192,2,1,1,0,8,0,1), run through the kernel protocol")
    args = ap.parse_args()
    m, n, k = (int(v) for v in args.shape.split("x"))
    dtype = getattr(torch, args.dtype)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    if args.impl == "xgemm" and args.config:
        from _harness import Inputs, impl_xgemm_config
        cfg = tuple(int(v) for v in args.config.split(","))
        cfg = cfg[:4] + tuple(bool(v) for v in cfg[4:6]) + cfg[6:8] + tuple(bool(v) for v in cfg[8:])
        x = Inputs(m, n, k, args.dtype)
        a, b = x.a[0], x.b[0]
        run, _ = impl_xgemm_config(cfg)(x)
        call = lambda: (run(0), x.out(f"cfg{cfg}", 0))[1]   # noqa: E731
    elif args.impl == "xgemm":
        import xgemm
        call = lambda: xgemm.matmul(a, b)          # noqa: E731
    elif args.impl == "quack":
        from quack.gemm_interface import gemm as quack_gemm
        call = lambda: quack_gemm(a, b, tuned=False)   # noqa: E731
    else:
        call = lambda: a @ b                       # noqa: E731
    for _ in range(args.warmup):
        call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("prof")
    d = call()
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    ref = a.float() @ b.float()
    rel = ((d.float() - ref).norm() / ref.norm()).item()
    print(f"{args.impl} {args.shape} {args.dtype}: rel err {rel:.2e} {'ok' if rel < 1e-2 else 'WRONG'}")
    return 0 if rel < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
