"""FP8 GEMM on the H200 (issue 21): xgemm.scaled_matmul against torch._scaled_mm (cuBLAS) for each
recipe, xgemm.quantize_fp8 against a copy, and xgemm.jax.scaled_matmul inside jax.jit against XLA's
FP8 dot, one process.

    python benchmarks/fp8.py --dry-run       # any machine: the cases and what an FP8 kernel would need
    python benchmarks/fp8.py [--trials 12]   # H200
    python benchmarks/fp8.py --only torch    # or jax
    python benchmarks/fp8.py --only tune     # the promoting class's tile widths vs torch._scaled_mm,
                                             # then quantize_fp8's kernel at each candidate (H200)

Writes benchmarks/results/fp8-h200.{json,md} (or into --out DIR).

Cases, e4m3 x e4m3 -> bf16, at 8192^3 and 16384 x 14336 x 4096 (M x N x K):
  tensor    scalar scales: xgemm.scaled_matmul vs torch._scaled_mm
  row       scale_a [M, 1], scale_b [1, N]: the same pair
  ... fast-accum   tensor and row again with use_fast_accum=True on both sides (sums kept in the
            wgmma accumulator, ~14 bits: what xgemm's FP8 classes serve)
  block     scale_a [M, K/128], scale_b [K/128, N/128]: xgemm, and torch._scaled_mm where this torch
            takes block scales (recorded as failed where it refuses them)
  bf16      cuBLAS's bf16 matmul of the same shape, for scale
  quantize  xgemm.quantize_fp8(x, "row") on a bf16 [M, K] against x.clone() (bytes moved: read 2 +
            write 1 per element + the scales, vs read 2 + write 2)
  jax       jit(xgemm.jax.scaled_matmul) with tensor scales vs jit(jnp.dot) on the fp8 operands with
            preferred_element_type=bfloat16 (XLA's FP8 dot, no scales)
b is handed over column-major (b8 = w8.t() for a row-major w8 [N, K]), the layout torch._scaled_mm
requires and an FP8 wgmma kernel reads without a copy. Outputs are checked against the float32
product of the dequantized operands (relative Frobenius error < 1e-2).
"""
from __future__ import annotations

import sys

import _harness as h

SHAPES = [(8192, 8192, 8192), (16384, 14336, 4096)]
BLOCK = 128


def _operands(torch, m, n, k):
    """e4m3 a [M, K] row-major, b [K, N] column-major, and each recipe's scales (dequantization
    scales, float32), quantized from random normal bf16 by xgemm.quantize_fp8."""
    import xgemm
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, generator=gen, device="cuda").bfloat16()
    w = torch.randn(n, k, generator=gen, device="cuda").bfloat16()           # [N, K]: b = w.t()
    ops = {}
    for recipe, (ra, rw) in {"tensor": ("tensor", "tensor"), "row": ("row", "row"),
                             "block": ("block_1x128", "block_128x128")}.items():
        a8, sa = xgemm.quantize_fp8(x, ra)
        w8, sw = xgemm.quantize_fp8(w, rw)        # per row of w = per column of b; blocks transposed below
        sb = sw.t().contiguous() if sw.ndim == 2 else sw
        ops[recipe] = (a8, w8.t(), sa, sb)
    return x, ops


def _reference(torch, a8, b8, sa, sb):
    from xgemm import arrays
    from xgemm.core import fp8_checks
    xp = arrays.namespace("torch")
    m, k = a8.shape
    n = b8.shape[1]
    rec = fp8_checks.matmul_recipe("fp8.py", a8.shape, b8.shape, sa.shape, sb.shape)
    a = fp8_checks.dequantize(xp, a8, sa, rec.a_block, torch.float32, a8.device)
    b = fp8_checks.dequantize(xp, b8, sb, rec.b_block, torch.float32, b8.device)
    assert a.shape == (m, k) and b.shape == (k, n)
    return a @ b


def run_torch(args, log) -> list:
    import torch
    records = []
    for m, n, k in SHAPES:
        records += _time_shape(torch, m, n, k, args, log)
        torch.cuda.empty_cache()
    return records


def _time_shape(torch, m, n, k, args, log) -> list:
    """Every recipe's xgemm and torch._scaled_mm, cuBLAS bf16, then quantize_fp8, at one shape."""
    import xgemm
    x, ops = _operands(torch, m, n, k)
    out, refs, impls = {}, {}, {}

    def keep(name, fn, ref):
        def call(i):
            out[name] = fn()
        impls[name], refs[name] = call, ref
    for recipe, (a8, b8, sa, sb) in ops.items():
        ref = _reference(torch, a8, b8, sa, sb)
        keep(f"xgemm {recipe}", lambda a8=a8, b8=b8, sa=sa, sb=sb: xgemm.scaled_matmul(a8, b8, sa, sb), ref)
        if recipe == "block":
            # torch takes block scales column-major (ScaledBlas.cpp: is_blockwise_1x128_scaling wants
            # scale_a strides (1, M), and b.t()'s 128x128 scales row-major, i.e. scale_b (1, K/128))
            sa, sb = sa.t().contiguous().t(), sb.t().contiguous().t()
        keep(f"torch._scaled_mm {recipe}", lambda a8=a8, b8=b8, sa=sa, sb=sb: torch._scaled_mm(
            a8, b8, sa, sb, out_dtype=torch.bfloat16), ref)
        if recipe != "block":
            # the FP8 classes keep their sums in the wgmma accumulator: the peer that does the same
            keep(f"xgemm {recipe} fast-accum", lambda a8=a8, b8=b8, sa=sa, sb=sb: xgemm.scaled_matmul(
                a8, b8, sa, sb, use_fast_accum=True), ref)
            keep(f"torch._scaled_mm {recipe} fast-accum", lambda a8=a8, b8=b8, sa=sa, sb=sb: torch._scaled_mm(
                a8, b8, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True), ref)
    b16 = torch.randn(k, n, device="cuda").bfloat16()
    keep("cuBLAS bf16", lambda: torch.matmul(x, b16), x.float() @ b16.float())
    records, _ = h.time_checked(f"{m}x{n}x{k}", (m, n, k), "float8_e4m3fn", 2 * m * n * k, "TFLOP/s", impls, out,
                                refs, args.reps, args.trials, log)
    return records + _time_quantize(torch, x, args, log)


def _row_quantized(torch, x):
    """x quantized row-wise to e4m3, written out here apart from xgemm's code, as float32."""
    xf = x.float()
    amax = xf.abs().amax(1, keepdim=True)
    scale = torch.where(amax > 0, amax / 448.0, 1.0)
    return (xf * (1.0 / scale)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()


def _time_quantize(torch, x, args, log) -> list:
    """quantize_fp8(x, "row") against a copy of x, in GB/s of the bytes each moves."""
    import xgemm
    m, k = x.shape
    out = {}
    xf = x.float()
    q_ref = _row_quantized(torch, x)
    impls = {"xgemm quantize_fp8 row": lambda i: out.__setitem__("xgemm quantize_fp8 row", xgemm.quantize_fp8(x, "row")[0]),
             "copy (x.clone())": lambda i: out.__setitem__("copy (x.clone())", x.clone())}
    refs = {"xgemm quantize_fp8 row": q_ref, "copy (x.clone())": xf}
    moved = {"xgemm quantize_fp8 row": m * k * 3 + m * 4, "copy (x.clone())": m * k * 4}
    return h.time_checked(f"quantize {m}x{k}", (m, k), "bfloat16", moved, "GB/s", impls, out, refs, args.reps,
                          args.trials, log)[0]


def run_jax(args, log) -> list:
    import jax
    import jax.numpy as jnp

    import xgemm.jax as xj
    records = []
    m = n = k = 8192
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    a8, sa = xj.quantize_fp8(jax.random.normal(k1, (m, k), jnp.bfloat16))
    b8, sb = xj.quantize_fp8(jax.random.normal(k2, (k, n), jnp.bfloat16))
    ours = jax.jit(lambda a, b, sa, sb: xj.scaled_matmul(a, b, sa, sb))
    xla = jax.jit(lambda a, b, sa, sb: jnp.dot(a, b, preferred_element_type=jnp.bfloat16))
    ref = (a8.astype(jnp.float32) * sa) @ (b8.astype(jnp.float32) * sb)
    got = {"xgemm.jax.scaled_matmul": ours(a8, b8, sa, sb), "XLA fp8 dot": xla(a8, b8, sa, sb) * (sa * sb)}
    secs = h.wall_interleaved([ours, xla], a8, b8, sa, sb, calls=10, reps=args.jax_reps)
    for (name, y), sec in zip(got.items(), secs):
        rel = float(jnp.linalg.norm(y.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
        ok = rel < 1e-2
        tf = 2 * m * n * k / sec / 1e12
        records.append(dict(case="jit 8192x8192x8192", shape=[m, n, k], dtype="float8_e4m3fn", impl=name,
                            metric="TFLOP/s", value=round(tf, 1), verified=ok, us=round(sec * 1e6, 1), rel_err=rel))
        log(f"jit 8192^3         {name:30s} {tf:8.1f} TFLOP/s  {sec * 1e6:9.1f} us  rel {rel:.1e} {'ok' if ok else 'WRONG'}")
    return records


# the promoting FP8 class's tile widths, which choose_fp8_promoted_policy picks from by waves: 128
# and 192 (96 accumulator registers a thread, twice; fewer shared-memory bytes per FLOP)
PROMOTE_TILES = (128, 192)


def _promoted_spec(m: int, n: int, k: int, tile_n=None) -> tuple:
    """The class spec (build()'s arguments) of e4m3 -> bf16 at the promoting policy's config for
    this shape (its tile_n replaced where given), A row- and B column-major, on an H200."""
    import dataclasses

    from xgemm.core.problem import COL, ROW
    from xgemm.kernels import cute_gemm_sm90 as k90
    from xgemm.kernels.cute_gemm_sm90_policy import choose_fp8_promoted_policy
    cfg = k90.Config.from_policy(choose_fp8_promoted_policy(m, n, k, 1))
    if tile_n is not None:
        cfg = dataclasses.replace(cfg, tile_n=tile_n)
    return (cfg, "float8_e4m3fn", "bfloat16", ROW, COL, ROW, None, True, (False,) * 4,
            k90.max_clusters(k90.H200_SMS, cfg), "sm_90a")


def promote_candidates(m: int, n: int, k: int) -> list:
    """(label, class spec, Epi) of the promoting FP8 class (tensor / row scales as vectors) at each
    PROMOTE_TILES width (128: the default call's class); the policy's cluster, raster and swizzle
    otherwise. Also the 128x192 class without promotion, which tells what promoting costs at that
    tile (nothing measurable on the H200 on 2026-12-05). tests/gpu/prebuild_classes.py compiles them ahead."""
    from xgemm.kernels import cute_gemm_sm90 as k90
    return [(f"promoted 128x{tn}", _promoted_spec(m, n, k, tn), k90.Epi(scale_m=True, scale_n=True, promote=True))
            for tn in PROMOTE_TILES] + [
        ("fast 128x192", _promoted_spec(m, n, k, 192), k90.Epi(scale_m=True, scale_n=True))]


def block_candidates(m: int, n: int, k: int) -> list:
    """(label, class spec, Epi) of the block-scaled class at each PROMOTE_TILES width (192: two
    blocks of B's scales a tile), the policy's cluster, raster and swizzle otherwise."""
    from xgemm.kernels import cute_gemm_sm90 as k90
    epi = k90.Epi(scale_m=True, scale_n=True, promote=True, block=True)
    return [(f"block 128x{tn}", _promoted_spec(m, n, k, tn), epi) for tn in PROMOTE_TILES]


def run_tune(args, log) -> list:
    """--only tune: the promoting FP8 class at each promote_candidates entry against torch._scaled_mm's
    default (row-wise scales), the block-scaled class at each block_candidates entry against its
    block-wise path (the classes called directly); then triton_quantize_sm90 at each
    prebuilt candidate of its TUNE set (built on request, docs/development.md), row recipe, bf16 ->
    e4m3, at the benchmark's two shapes, launched through the kernel with that candidate's policy;
    q checked, GB/s of the bytes moved."""
    import torch
    return (_tune_classes(torch, args, log, "row", promote_candidates)
            + _tune_classes(torch, args, log, "block", block_candidates) + _tune_quantize(torch, args, log))


def _tune_classes(torch, args, log, recipe: str, candidates) -> list:
    """Each candidates(m, n, k) class called directly on the recipe's operands (row scales as
    vectors), beside torch._scaled_mm on the same recipe (block scales column-major, as it takes
    them), every output checked against the dequantized product."""
    from xgemm.kernels import cute_gemm_sm90 as k90
    records = []
    for m, n, k in SHAPES:
        _, ops = _operands(torch, m, n, k)
        a8, b8, sa, sb = ops[recipe]
        ref = _reference(torch, a8, b8, sa, sb)
        # block scales as the class loads them (fp8_checks.kernel_block_scales): sa M-major
        ours = (sa.t().contiguous().t(), sb) if recipe == "block" else (sa.reshape(-1), sb.reshape(-1))
        out, impls = {}, {}
        for label, spec, epi in candidates(m, n, k):
            fn = k90.compiled(*spec, epi=epi)

            def call(i, fn=fn, label=label):
                d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                # torch's stream of the moment: the harness captures on its own
                fn(a8, b8, d, None, None, *ours, 1.0, 0.0, torch.cuda.current_stream().cuda_stream)
                out[label] = d
            impls[label] = call
        peer = f"torch._scaled_mm {recipe}"
        ta, tb = (sa.t().contiguous().t(), sb.t().contiguous().t()) if recipe == "block" else (sa, sb)
        impls[peer] = lambda i: out.__setitem__(peer, torch._scaled_mm(a8, b8, ta, tb, out_dtype=torch.bfloat16))
        tag = "promoted" if recipe == "row" else recipe
        records += h.time_checked(f"tune {tag} {m}x{n}x{k}", (m, n, k), "float8_e4m3fn", 2 * m * n * k,
                                  "TFLOP/s", impls, out, dict.fromkeys(impls, ref), args.reps, args.trials, log)[0]
        torch.cuda.empty_cache()
    return records


def _tune_quantize(torch, args, log) -> list:
    from xgemm import arrays
    from xgemm.core.problem import Policy
    from xgemm.core.quantize import QuantizeProblem
    from xgemm.kernels import triton_quantize_sm90 as tq
    from xgemm.runtime import gluon_cache
    records = []
    for m, k in ((8192, 8192), (16384, 4096)):
        x = torch.randn(m, k, device="cuda").bfloat16()
        xf = x.float()
        q_ref = _row_quantized(torch, x)
        vx = arrays.view(x, "x", "tune")
        problem = QuantizeProblem(arrays.operand(vx), "row", (1, k), (m, 1), "float8_e4m3fn", "torch", vx.device)
        out, impls = {}, {}
        for key in tq.tune_entries():
            cfg = tq.Config.from_key(key)
            if cfg.block_c != k or gluon_cache.available(key):
                continue
            label = f"c{cfg.block_c} m{cfg.block_m} w{cfg.warps} ({cfg.block_c // (32 * cfg.warps) * cfg.block_m} a thread)"
            pol = Policy(tile=(cfg.block_m, cfg.block_c), warps=cfg.warps)

            def call(i, pol=pol, label=label):
                q = torch.empty(m, k, device="cuda", dtype=torch.float8_e4m3fn)
                scale = torch.empty(m, 1, device="cuda")
                tq.KERNEL.run(problem, pol, (vx, arrays.view(scale, "scale", "tune")), arrays.view(q, "q", "tune"),
                              torch.cuda.current_stream().cuda_stream)
                out[label] = q
            impls[label] = call
        impls["copy (x.clone())"] = lambda i: out.__setitem__("copy (x.clone())", x.clone())
        refs = {name: (xf if name.startswith("copy") else q_ref) for name in impls}
        moved = {name: m * k * (4 if name.startswith("copy") else 3) + (0 if name.startswith("copy") else m * 4)
                 for name in impls}
        records += h.time_checked(f"tune quantize {m}x{k}", (m, k), "bfloat16", moved, "GB/s", impls, out, refs,
                                  args.reps, args.trials, log)[0]
    return records


def dry_run(log) -> None:
    import torch

    import xgemm
    for m, n, k in SHAPES:
        a8 = torch.empty(m, k, dtype=torch.float8_e4m3fn)
        b8 = torch.empty(n, k, dtype=torch.float8_e4m3fn).t()
        for recipe, (sa, sb) in {"tensor": ((), ()), "row": ((m, 1), (1, n)),
                                 "block": ((m, -(-k // BLOCK)), (-(-k // BLOCK), -(-n // BLOCK)))}.items():
            s_a, s_b = torch.ones(sa), torch.ones(sb)
            log(f"{m}x{n}x{k} {recipe}: {xgemm.fp8.explain_scaled_matmul(a8, b8, s_a, s_b)}")


def main(argv=None) -> int:
    return h.run_study("fp8", __doc__.split("\n\n")[0], {"torch": run_torch, "jax": run_jax, "tune": run_tune}, dry_run,
                       argv, opt_in=("tune",))


if __name__ == "__main__":
    sys.exit(main())
