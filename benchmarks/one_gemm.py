"""One implementation's GEMM, a few calls, the last inside an NVTX range named "prof": a target
for Nsight Compute, so xgemm's kernel and a peer's can be profiled the same way.

    ncu --clock-control none --nvtx --nvtx-include "prof/" --section SpeedOfLight \\
        python benchmarks/one_gemm.py --impl xgemm --shape 8192x8192x8192 --dtype bfloat16

--impl xgemm | quack | cublas; with xgemm, --config (a cute_gemm_sm90 Config) or --splitk (a
gluon_splitk_sm90 tile, cluster split or stream-K) forces one kernel config. Inputs are random normal; the result is checked against
torch.matmul (relative Frobenius error < 1e-2) after the profiled call. --fp8 tensor | row | block
| fast: xgemm.scaled_matmul on e4m3 operands quantized by xgemm.quantize_fp8 (fast: row scales,
use_fast_accum), or with --impl cublas torch._scaled_mm where it takes the recipe; checked
against the product of the dequantized operands. --grouped zipf | uneven | even: cute_gemm_sm90's
grouped class on grouped.py's operands (even: its Zipf problem in equal groups), at --config or the
policy's pick; with --dense, the dense class at that config on x @ w[0] (w[0] in the grouped
operand's layout), the same rows, K and N in one product: the per-tile comparison of the two classes.
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
    ap.add_argument("--splitk", default="", help="xgemm only: a gluon_splitk_sm90 tile as bn,bk,stages,split "
                    "(e.g. 128,128,4,2) or bn,bk,stages,sk for its stream-K kernel, run through the kernel protocol")
    ap.add_argument("--fp8", choices=("tensor", "row", "block", "fast"), default=None)
    ap.add_argument("--grouped", choices=("zipf", "uneven", "even"), default=None)
    ap.add_argument("--dense", action="store_true", help="with --grouped: the dense class on x @ w[0]")
    args = ap.parse_args()
    if args.grouped:
        return _grouped(args)
    m, n, k = (int(v) for v in args.shape.split("x"))
    if args.fp8:
        return _fp8(args, m, n, k)
    dtype = getattr(torch, args.dtype)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    if args.impl == "xgemm" and args.config:
        from _harness import Inputs, impl_xgemm_config
        cfg = _config(args.config)
        x = Inputs(m, n, k, args.dtype)
        a, b = x.a[0], x.b[0]
        run, _ = impl_xgemm_config(cfg)(x)
        call = lambda: (run(0), x.out(f"cfg{cfg}", 0))[1]   # noqa: E731
    elif args.impl == "xgemm" and args.splitk:
        from _harness import Inputs
        from gemm_tc import impl_splitk_config
        from xgemm.kernels import gluon_splitk_sm90 as sk
        bn, bk, stages, split = args.splitk.split(",")
        streamk = split == "sk"
        cfg = sk.Config(args.dtype, args.dtype, int(bn), int(bk), int(stages), 1 if streamk else int(split), False,
                        streamk)
        x = Inputs(m, n, k, args.dtype)
        a, b = x.a[0], x.b[0]
        run, _ = impl_splitk_config(cfg)(x)
        call = lambda: (run(0), x.out(f"sk{tuple(cfg)}", 0))[1]   # noqa: E731
    elif args.impl == "xgemm":
        import xgemm
        call = lambda: xgemm.matmul(a, b)          # noqa: E731
    elif args.impl == "quack":
        from quack.gemm_interface import gemm as quack_gemm
        call = lambda: quack_gemm(a, b, tuned=False)   # noqa: E731
    else:
        call = lambda: a @ b                       # noqa: E731
    return _profile(call, args.warmup, lambda: a.float() @ b.float(), f"{args.impl} {args.shape} {args.dtype}")


def _config(text: str) -> tuple:
    """--config's comma-separated cute_gemm_sm90 Config fields as the Config's field values."""
    cfg = tuple(int(v) for v in text.split(","))
    return cfg[:4] + tuple(bool(v) for v in cfg[4:6]) + cfg[6:8] + tuple(bool(v) for v in cfg[8:])


def _grouped(args) -> int:
    """--grouped: the grouped class (or with --dense the dense class) at one config, profiled like
    main()'s calls and checked against grouped.py's float32 reference."""
    import grouped as bench
    import numpy as np
    from _harness import problem

    from xgemm import arrays
    from xgemm.kernels import cute_gemm_sm90 as K90
    shape = bench.UNEVEN if args.grouped == "uneven" else bench.ZIPF
    e, t, k, n = shape["E"], shape["T"], shape["K"], shape["N"]
    sizes = {"zipf": lambda: bench.zipf_sizes(e, t), "uneven": lambda: bench.uneven_sizes(e, t),
             "even": lambda: np.full(e, t // e)}[args.grouped]()
    x, w, offs = bench._operands(torch, e, t, k, n, sizes)
    call_args, why = bench.grouped_class_call(x, w, offs)
    if call_args is None:
        raise SystemExit(f"the grouped class does not take this problem: {why}")
    grouped_problem, views = call_args
    pol = (K90.Config(*_config(args.config)).policy("one_gemm") if args.config
           else K90.GROUPED.policy(grouped_problem))
    stream = torch.cuda.current_stream().cuda_stream
    y = torch.full((t, n), float("nan"), dtype=torch.bfloat16, device="cuda")   # unwritten rows fail the check
    what = f"{'dense' if args.dense else 'grouped'} {args.grouped} {pol.summary()}"
    if args.dense:
        prob, ops, vy = problem(x, w[0], y)
        reference = lambda: x.float() @ w[0].float()                       # noqa: E731
        call = lambda: (K90.KERNEL.run(prob, pol, ops, vy, stream), y)[1]    # noqa: E731
    else:
        vy = arrays.view(y, "out", "bench")
        reference = lambda: bench._ref_forward(torch, x, w, sizes)          # noqa: E731
        call = lambda: (K90.GROUPED.run(grouped_problem, pol, views, vy, stream), y)[1]   # noqa: E731
    return _profile(call, args.warmup, reference, what)


def _profile(call, warmup: int, reference, what: str) -> int:
    """warmup calls, one inside the NVTX range "prof", its result checked against reference()."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("prof")
    d = call()
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    ref = reference()
    rel = ((d.float() - ref).norm() / ref.norm()).item()
    print(f"{what}: rel err {rel:.2e} {'ok' if rel < 1e-2 else 'WRONG'}")
    return 0 if rel < 1e-2 else 1


def _fp8(args, m: int, n: int, k: int) -> int:
    """The FP8 call of --fp8 (benchmarks/fp8.py's operands and reference), profiled like main()'s."""
    import fp8 as bench

    import xgemm
    recipe = "row" if args.fp8 == "fast" else args.fp8
    a8, b8, sa, sb = bench._operands(torch, m, n, k)[1][recipe]
    fast = args.fp8 == "fast"
    if args.impl == "xgemm":
        call = lambda: xgemm.scaled_matmul(a8, b8, sa, sb, out_dtype=torch.bfloat16,   # noqa: E731
                                           use_fast_accum=fast)
    elif args.impl == "cublas":
        if recipe == "block":          # torch takes block scales column-major (fp8.py)
            sa, sb = sa.t().contiguous().t(), sb.t().contiguous().t()
        call = lambda: torch._scaled_mm(a8, b8, sa, sb, out_dtype=torch.bfloat16,      # noqa: E731
                                        use_fast_accum=fast)
    else:
        raise SystemExit("--fp8 profiles xgemm or cublas (torch._scaled_mm)")
    return _profile(call, args.warmup, lambda: bench._reference(torch, a8, b8, sa, sb),
                    f"{args.impl} fp8 {args.fp8} {args.shape}")


if __name__ == "__main__":
    sys.exit(main())
