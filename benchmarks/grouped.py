"""Grouped GEMM for mixture-of-experts on the H200 (issue 23): xgemm.grouped_mm / ragged_dot against
torch._grouped_mm, quack's variable-length GEMM, a loop of cuBLAS calls and, inside jax.jit,
jax.lax.ragged_dot; one process.

    python benchmarks/grouped.py --dry-run      # any machine: the cases' group sizes and xgemm's plan
    python benchmarks/grouped.py [--trials 12]  # H200
    python benchmarks/grouped.py --only torch   # or jax
    python benchmarks/grouped.py --only tune    # the grouped kernel at each tile candidate (H200)
    python benchmarks/grouped.py --only zipf    # the Zipf forward alone (an A/B of a grouped-class edit)
    python benchmarks/grouped.py --only order   # the Zipf forward with the experts in other orders

Writes benchmarks/results/grouped-h200.{json,md} (or into --out DIR).

Cases (bf16, the issue's acceptance):
  uneven     E=8, T=16384, K=4096, N=7168, group sizes 2048 +- up to 1000 (seeded), summing to T:
             forward x [T, K] @ w[e] [K, N] per group; xgemm.grouped_mm vs torch._grouped_mm, quack's
             gemm(x, w, cu_seqlens_m=...), and a cuBLAS loop (host-known sizes, the peer's advantage).
  uneven_swiglu  the same product as an expert's gated input projection (w[e] = [gate | up]):
             grouped_mm(..., activation="swiglu") (the gate fused into the grouped class) vs
             torch._grouped_mm then silu(gate) * up, and xgemm's product then the same torch ops.
  uneven_drhs  the weight gradient of the same layer, the variable-K product x_g^T @ dy_g -> [E, K, N]:
             xgemm.grouped_mm(x.T, dy, offs) vs torch._grouped_mm(x.T, dy, offs) and a cuBLAS loop.
  zipf       E=64, T=65536, K=N=4096, Zipf(1.2)-skewed sizes with the last 4 experts empty: the forward
             vs xgemm's dense matmul of the same FLOPs (T x K @ K x N).
  jax        jit(xgemm.jax.ragged_dot) vs jit(jax.lax.ragged_dot) at the uneven case, and the gated
             projection: jit(ragged_dot(..., activation="swiglu")) vs jax.lax.ragged_dot then silu * up.
w is handed over as torch._grouped_mm wants it (w[e] column-major: an [E, N, K] tensor transposed);
xgemm takes any layout. Outputs are checked against float32 per-group products (relative Frobenius
error < 1e-2).
"""
from __future__ import annotations

import sys

import _harness as h
import numpy as np

UNEVEN = dict(E=8, T=16384, K=4096, N=7168)
ZIPF = dict(E=64, T=65536, K=4096, N=4096)


def uneven_sizes(e: int, t: int, spread: int = 1000, seed: int = 0) -> np.ndarray:
    """t / e rows per group +- up to `spread` each, seeded, summing to t (the last group takes the
    remainder; draws whose remainder leaves the spread are redrawn)."""
    rng = np.random.default_rng(seed)
    while True:
        sizes = t // e + rng.integers(-spread, spread + 1, e)
        sizes[-1] += t - sizes.sum()
        if abs(sizes[-1] - t // e) <= spread:
            return sizes


def zipf_sizes(e: int, t: int, empty: int = 4, a: float = 1.2, seed: int = 0) -> np.ndarray:
    """Zipf(a)-skewed sizes over the first e - empty experts (multinomial, seeded); the rest empty."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, e - empty + 1) ** a
    sizes = np.concatenate([rng.multinomial(t, p / p.sum()), np.zeros(empty, int)])
    assert sizes.sum() == t and (sizes[-empty:] == 0).all()
    return sizes


def _operands(torch, e, t, k, n, sizes, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(t, k, generator=gen, device="cuda").bfloat16()
    w = (torch.randn(e, n, k, generator=gen, device="cuda") / k ** 0.5).bfloat16().transpose(-2, -1)
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
    return x, w, offs


def _ref_forward(torch, x, w, sizes):
    out, start = torch.zeros(x.shape[0], w.shape[2], device="cuda"), 0
    for g, s in enumerate(sizes.tolist()):
        out[start:start + s] = x[start:start + s].float() @ w[g].float()
        start += s
    return out


def _loop(torch, x, w, sizes, out):
    """The cuBLAS loop: one matmul per non-empty group, sizes read on the host."""
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()

    def call():
        for g in range(len(sizes)):
            if bounds[g + 1] > bounds[g]:
                torch.matmul(x[bounds[g]:bounds[g + 1]], w[g], out=out[bounds[g]:bounds[g + 1]])
        return out
    return call


def _counts(args, log, name, x, w, offs):
    """(reps, trials) for one case: the embedded default's E masked products take ~150 ms a call at
    these shapes (H200, 2026-12-02), so while it is what runs, every implementation of the case is
    timed in one call per graph and 3 trials, and the study fits its time budget."""
    import xgemm
    if "masked products" in str(xgemm.explain(x, w, offs, op="grouped_mm")):
        log(f"{name}: xgemm runs the embedded default (masked products): 1 call per graph, 3 trials")
        return 1, min(args.trials, 3)
    return args.reps, args.trials


def _forced(kernel, fn, *args):
    """fn(*args) with the policy forced onto `kernel` (xgemm's other grouped kernel, timed beside the
    routed one)."""
    from xgemm.core import policy
    with policy.force(kernel):
        return fn(*args)


def grouped_class_call(x, w, offs, activation=None):
    """((problem, operand views), None) to run cute_gemm_sm90's grouped class (fusing `activation`)
    through the kernel protocol on these operands as given, or (None, the reason it does not take them)."""
    from xgemm import arrays, grouped
    from xgemm.kernels import cute_gemm_sm90 as K90
    plan, va, vb, moves = grouped._plan(grouped.check_grouped_mm(x, w, offs), activation)
    why = f"operands moved: {moves}" if moves != (None, None) else K90.GROUPED.supports(plan.problem)
    if why is not None:
        return None, why
    return (plan.problem, (va, vb, arrays.view(offs, "offs", "bench"))), None


def _cute_candidates(torch, x, w, offs, out, impls, activation=None) -> None:
    """cute_gemm_sm90's grouped class at each of its policy's candidate configs, through the kernel
    protocol (labels `cute grouped <tile> <cluster>`), where the class takes the problem; with a
    gated activation, at each gated candidate whose gate half fits H (labels `cute gated ...`)."""
    from xgemm import arrays
    from xgemm.core.epilogues import GATED
    from xgemm.kernels import cute_gemm_sm90 as K90
    call_args, _ = grouped_class_call(x, w, offs, activation)
    if call_args is None:
        return
    problem, views = call_args
    gated = activation in GATED
    cfgs = [c for c in K90.GATED_GROUPED_CONFIGS if K90.gate_half_fits(w.shape[-1] // 2, c.tile_n)] if gated \
        else K90.GROUPED_CONFIGS
    for cfg in cfgs:
        label = f"cute {'gated' if gated else 'grouped'} {cfg.tile_m}x{cfg.tile_n} {cfg.cluster_m}x{cfg.cluster_n}"

        def call(i, pol=cfg.policy(), label=label):
            y = torch.empty(problem.out_shape, dtype=torch.bfloat16, device="cuda")
            K90.GROUPED.run(problem, pol, views, arrays.view(y, "out", "bench"),
                            torch.cuda.current_stream().cuda_stream)
            out[label] = y
        impls[label] = call


def forward_case(torch, name, cfg, sizes, args, log, dense=False, every_peer=True) -> list:
    """The forward at these group sizes; every_peer=False times only xgemm, torch._grouped_mm and
    (with dense) the dense matmul."""
    import xgemm
    e, t, k, n = cfg["E"], cfg["T"], cfg["K"], cfg["N"]
    x, w, offs = _operands(torch, e, t, k, n, sizes)
    out, impls = {}, {}

    def keep(label, fn):
        def call(i):
            out[label] = fn()
        impls[label] = call
    keep("xgemm grouped_mm", lambda: xgemm.grouped_mm(x, w, offs))
    keep("torch._grouped_mm", lambda: torch._grouped_mm(x, w, offs, out_dtype=torch.bfloat16))
    if every_peer:
        keep("triton grouped_mm", lambda: _forced("triton_grouped_sm90", xgemm.grouped_mm, x, w, offs))
        loop_out = torch.empty(t, n, dtype=torch.bfloat16, device="cuda")
        keep("cuBLAS loop", _loop(torch, x, w, sizes, loop_out))
        try:
            from quack.gemm_interface import gemm as quack_gemm
            cu = torch.cat([offs.new_zeros(1), offs])
            keep("quack varlen gemm", lambda: quack_gemm(x, w, cu_seqlens_m=cu, tuned=False))
        except ImportError:
            pass
        _cute_candidates(torch, x, w, offs, out, impls)
    ref = _ref_forward(torch, x, w, sizes)
    refs = dict.fromkeys(impls, ref)
    if dense:                                   # the same FLOPs as one dense product
        w0 = w[0].contiguous()
        keep("xgemm dense matmul", lambda: xgemm.matmul(x, w0))
        refs["xgemm dense matmul"] = x.float() @ w0.float()
    records, by_name = h.time_checked(name, (e, t, k, n), "bfloat16", 2 * t * k * n, "TFLOP/s", impls, out, refs,
                                      *_counts(args, log, name, x, w, offs), log)
    return records + h.paired_records(name, (e, t, k, n), "bfloat16", "xgemm grouped_mm", by_name, log)


def drhs_case(torch, name, cfg, sizes, args, log) -> list:
    """dW[e] = x_e^T @ dy_e: the variable-K grouped product, [E, K, N]."""
    import xgemm
    e, t, k, n = cfg["E"], cfg["T"], cfg["K"], cfg["N"]
    x, _, offs = _operands(torch, e, t, k, n, sizes)
    dy = torch.randn(t, n, device="cuda").bfloat16()
    xt = x.t()
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    ref = torch.stack([xt[:, bounds[g]:bounds[g + 1]].float() @ dy[bounds[g]:bounds[g + 1]].float() for g in range(e)])
    loop_out = torch.empty(e, k, n, dtype=torch.bfloat16, device="cuda")

    def loop():
        for g in range(e):
            torch.matmul(xt[:, bounds[g]:bounds[g + 1]], dy[bounds[g]:bounds[g + 1]], out=loop_out[g])
        return loop_out
    out = {}
    impls = {"xgemm grouped_mm (variable K)": lambda i: out.__setitem__("xgemm grouped_mm (variable K)",
                                                                        xgemm.grouped_mm(xt, dy, offs)),
             "torch._grouped_mm (variable K)": lambda i: out.__setitem__(
                 "torch._grouped_mm (variable K)", torch._grouped_mm(xt, dy, offs, out_dtype=torch.bfloat16)),
             "cuBLAS loop": lambda i: out.__setitem__("cuBLAS loop", loop())}
    records, by_name = h.time_checked(name, (e, t, k, n), "bfloat16", 2 * t * k * n, "TFLOP/s", impls, out,
                                      dict.fromkeys(impls, ref), *_counts(args, log, name, xt, dy, offs), log)
    return records + h.paired_records(name, (e, t, k, n), "bfloat16", "xgemm grouped_mm (variable K)", by_name,
                                      log)


def swiglu_case(torch, name, cfg, sizes, args, log) -> list:
    """An MoE expert's gated input projection at the uneven sizes: w[e] holds [gate | up] (N = 2H),
    the result silu(gate) * up [T, H]. xgemm.grouped_mm(..., activation="swiglu") (fused into the
    grouped class's epilogue) against torch._grouped_mm followed by torch's silu and product, and
    xgemm's bf16 product followed by the same (what fusing saves); the product's FLOPs."""
    import xgemm
    e, t, k, n = cfg["E"], cfg["T"], cfg["K"], cfg["N"]
    x, w, offs = _operands(torch, e, t, k, n, sizes)
    half = n // 2
    f = torch.nn.functional
    pre = _ref_forward(torch, x, w, sizes)
    ref = f.silu(pre[:, :half]) * pre[:, half:]
    del pre

    def gate(h):
        return f.silu(h[:, :half]) * h[:, half:]
    out = {}
    impls = {"xgemm grouped_mm swiglu": lambda i: out.__setitem__(
                 "xgemm grouped_mm swiglu", xgemm.grouped_mm(x, w, offs, activation="swiglu")),
             "torch._grouped_mm + silu * up": lambda i: out.__setitem__(
                 "torch._grouped_mm + silu * up", gate(torch._grouped_mm(x, w, offs, out_dtype=torch.bfloat16))),
             "xgemm grouped_mm + silu * up": lambda i: out.__setitem__(
                 "xgemm grouped_mm + silu * up", gate(xgemm.grouped_mm(x, w, offs)))}
    _cute_candidates(torch, x, w, offs, out, impls, "swiglu")
    log(xgemm.explain(x, w, offs, op="grouped_mm", activation="swiglu"))
    records, by_name = h.time_checked(name, (e, t, k, n), "bfloat16", 2 * t * k * n, "TFLOP/s", impls, out,
                                      dict.fromkeys(impls, ref), *_counts(args, log, name, x, w, offs), log)
    return records + h.paired_records(name, (e, t, k, n), "bfloat16", "xgemm grouped_mm swiglu", by_name, log)


def run_torch(args, log) -> list:
    import torch
    records = forward_case(torch, "uneven", UNEVEN, uneven_sizes(UNEVEN["E"], UNEVEN["T"]), args, log)
    torch.cuda.empty_cache()
    records += swiglu_case(torch, "uneven_swiglu", UNEVEN, uneven_sizes(UNEVEN["E"], UNEVEN["T"]), args, log)
    torch.cuda.empty_cache()
    records += drhs_case(torch, "uneven_drhs", UNEVEN, uneven_sizes(UNEVEN["E"], UNEVEN["T"]), args, log)
    torch.cuda.empty_cache()
    return records + run_zipf(args, log)


def run_jax(args, log) -> list:
    import jax
    import jax.numpy as jnp

    import xgemm.jax as xj
    e, t, k, n = (UNEVEN[key] for key in "ETKN")
    sizes = jnp.asarray(uneven_sizes(e, t), jnp.int32)
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(k1, (t, k), jnp.bfloat16)
    w = (jax.random.normal(k2, (e, k, n), jnp.float32) / k ** 0.5).astype(jnp.bfloat16)
    from xgemm.core import policy
    ours = jax.jit(lambda x, w, s: xj.ragged_dot(x, w, s))
    peer = jax.jit(lambda x, w, s: jax.lax.ragged_dot(x, w, s))
    with policy.force("triton_grouped_sm90"):     # xgemm's other grouped kernel, compiled in the override
        triton = jax.jit(lambda x, w, s: xj.ragged_dot(x, w, s)).lower(x, w, sizes).compile()
    ref = jax.lax.ragged_dot(x.astype(jnp.float32), w.astype(jnp.float32), sizes)
    records, secs = _jax_timed("jax uneven", {"xgemm.jax.ragged_dot": ours, "jax.lax.ragged_dot": peer,
                                              "xgemm.jax.ragged_dot (triton)": triton}, x, w, sizes, ref, args, log)
    records.append(dict(case="jax uneven", shape=[e, t, k, n], dtype="bfloat16", impl="xgemm.jax vs its triton kernel",
                        metric="ratio", value=round(secs[2] / secs[0], 3), verified=True))
    return records + jax_swiglu(args, log, x, w, sizes, ref)


def _jax_timed(case, fns, x, w, sizes, ref, args, log):
    """(records, seconds) of jitted fns(x, w, sizes) by name, timed interleaved, each output checked
    against ref (relative Frobenius error < 1e-2), TFLOP/s of the product; and the first against the
    second as a ratio record ("xgemm.jax vs jax.lax")."""
    import jax.numpy as jnp
    e, t, k, n = w.shape[0], x.shape[0], x.shape[1], w.shape[-1]
    got = {name: fn(x, w, sizes) for name, fn in fns.items()}
    secs = h.wall_interleaved(list(fns.values()), x, w, sizes, calls=5, reps=args.jax_reps)
    records = []
    for (name, y), sec in zip(got.items(), secs):
        rel = float(jnp.linalg.norm(y.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
        tf = 2 * t * k * n / sec / 1e12
        records.append(dict(case=case, shape=[e, t, k, n], dtype="bfloat16", impl=name, metric="TFLOP/s",
                            value=round(tf, 1), verified=rel < 1e-2, us=round(sec * 1e6, 1), rel_err=rel))
        log(f"{case:18s} {name:32s} {tf:8.1f} TFLOP/s  {sec * 1e6:9.1f} us  rel {rel:.1e}")
    records.append(dict(case=case, shape=[e, t, k, n], dtype="bfloat16", impl="xgemm.jax vs jax.lax",
                        metric="ratio", value=round(secs[1] / secs[0], 3), verified=True))
    return records, secs


def jax_swiglu(args, log, x, w, sizes, pre) -> list:
    """The gated projection inside jit: xgemm.jax.ragged_dot(activation="swiglu") (the gate fused
    into the grouped class) against jax.lax.ragged_dot then jax.nn.silu(gate) * up, each checked
    against the float32 product's gate (pre: that product)."""
    import jax

    import xgemm
    import xgemm.jax as xj
    half = w.shape[-1] // 2
    ref = jax.nn.silu(pre[:, :half]) * pre[:, half:]
    ours = jax.jit(lambda x, w, s: xj.ragged_dot(x, w, s, activation="swiglu"))

    def composed(x, w, s):
        h = jax.lax.ragged_dot(x, w, s)
        return jax.nn.silu(h[:, :half]) * h[:, half:]
    peer = jax.jit(composed)
    log(xgemm.explain(x, w, sizes, op="ragged_dot", activation="swiglu"))
    return _jax_timed("jax uneven_swiglu", {"xgemm.jax.ragged_dot swiglu": ours, "jax.lax.ragged_dot + silu * up": peer},
                      x, w, sizes, ref, args, log)[0]


def run_zipf(args, log) -> list:
    """The Zipf forward against the dense matmul of the same FLOPs (run_torch's last case; alone
    with --only zipf)."""
    import torch
    return forward_case(torch, "zipf", ZIPF, zipf_sizes(ZIPF["E"], ZIPF["T"]), args, log, dense=True)


def zipf_orders() -> dict:
    """The Zipf sizes in other expert orders: as drawn (largest first, the empty experts last),
    reversed, and three seeded shuffles."""
    base = zipf_sizes(ZIPF["E"], ZIPF["T"])
    orders = {"as drawn": base, "reversed": base[::-1].copy()}
    for seed in (1, 2, 3):
        orders[f"shuffled {seed}"] = np.random.default_rng(seed).permutation(base)
    return orders


def run_order(args, log) -> list:
    """--only order: the Zipf forward at the same group sizes in other expert orders, each beside
    torch._grouped_mm and the dense matmul. As drawn, the smallest groups (each reading its
    expert's whole weight) come last and run together; a router's loads come in any order."""
    import torch
    records = []
    for label, sizes in zipf_orders().items():
        records += forward_case(torch, f"zipf {label}", ZIPF, sizes, args, log, dense=True, every_peer=False)
        torch.cuda.empty_cache()
    return records


def run_tune(args, log) -> list:
    """--only tune: the grouped kernel at every prebuilt tile candidate (kernels/triton_grouped_sm90.py
    TILES and TUNE; the TUNE ones are built on request, docs/development.md), forward and weight
    gradient of the uneven case and the Zipf forward, launched through the kernel with that tile's
    policy; outputs checked."""
    import torch

    from xgemm import arrays, grouped
    from xgemm.core.problem import Policy
    from xgemm.kernels import triton_grouped_sm90 as tg
    from xgemm.runtime import gluon_cache
    e, t, k, n = (UNEVEN[key] for key in "ETKN")
    sizes = uneven_sizes(e, t)
    x, w, offs = _operands(torch, e, t, k, n, sizes)
    dy = torch.randn(t, n, device="cuda").bfloat16()
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    refs = {"uneven": _ref_forward(torch, x, w, sizes),
            "uneven_drhs": torch.stack([x[bounds[g]:bounds[g + 1]].float().T @ dy[bounds[g]:bounds[g + 1]].float()
                                        for g in range(e)])}
    zipf = zipf_sizes(ZIPF["E"], ZIPF["T"])
    xz, wz, offz = _operands(torch, ZIPF["E"], ZIPF["T"], ZIPF["K"], ZIPF["N"], zipf)
    refs["zipf"] = _ref_forward(torch, xz, wz, zipf)
    records = []
    for case, a, b, offs in (("uneven", x, w, offs), ("uneven_drhs", x.t(), dy, offs), ("zipf", xz, wz, offz)):
        c = grouped.check_grouped_mm(a, b, offs)
        plan, va, vb, moves = grouped._plan(c)
        if moves != (None, None):   # the sweep times the kernel alone, on operands it reads as they are
            raise SystemExit(f"tune {case}: the operands need copies {moves}; give the sweep readable layouts")
        views = (va, vb, arrays.view(offs, "offs", "tune"))
        out, impls = {}, {}
        for key in tg.tune_entries():
            cfg = tg.Config.from_key(key)
            if cfg.ragged_k != c.shape.ragged_k or gluon_cache.available(key):
                continue
            label = f"{cfg.bm}x{cfg.bn}x{cfg.bk} s{cfg.stages} " + ("flat" if cfg.flat else f"split{tg.epilogue_split(cfg)}")
            pol = Policy(tile=(cfg.bm, cfg.bn, cfg.bk), stages=cfg.stages, warps=cfg.warps,
                         schedule=tg.FLAT_SCHEDULE if cfg.flat else "")

            def call(i, pol=pol, label=label):
                y = torch.empty(c.shape.out, dtype=torch.bfloat16, device="cuda")
                tg.KERNEL.run(plan.problem, pol, views, arrays.view(y, "out", "tune"),
                              torch.cuda.current_stream().cuda_stream)
                out[label] = y
            impls[label] = call
        s = c.shape
        got, _ = h.time_checked(f"tune {case}", (s.groups, s.rows, s.k, s.n), "bfloat16", 2 * s.m * s.k * s.n,
                                "TFLOP/s", impls, out, dict.fromkeys(impls, refs[case]), args.reps, args.trials, log)
        records += got
    return records


def dry_run(log) -> None:
    import torch

    import xgemm
    from xgemm.kernels import cute_gemm_sm90_policy as P
    for name, cfg, sizes in (("uneven", UNEVEN, uneven_sizes(UNEVEN["E"], UNEVEN["T"])),
                             ("zipf", ZIPF, zipf_sizes(ZIPF["E"], ZIPF["T"]))):
        e, t, k, n = cfg["E"], cfg["T"], cfg["K"], cfg["N"]
        x = torch.empty(t, k, dtype=torch.bfloat16)
        w = torch.empty(e, n, k, dtype=torch.bfloat16).transpose(-2, -1)
        offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32)
        y = xgemm.grouped_mm(x[:0], w, torch.zeros(e, dtype=torch.int32))       # the call path, no work
        log(f"{name}: E={e} T={t} K={k} N={n}; sizes min {sizes.min()} max {sizes.max()}, "
            f"{int((sizes == 0).sum())} empty; offs[-1] = {int(offs[-1])}; result {tuple(y.shape)}")
        # the ceiling each grouped candidate's tiles put on its rate against the dense product
        log(f"{name}: tile fill at these sizes: " + ", ".join(
            f"{c.tile_m}x{c.tile_n} {c.cluster_m}x{c.cluster_n} {P.grouped_fill_of(sizes, n, c):.3f}"
            for c in P.GROUPED_CONFIGS))


def main(argv=None) -> int:
    return h.run_study("grouped", __doc__.split("\n\n")[0], {"torch": run_torch, "jax": run_jax, "tune": run_tune,
                                                                  "zipf": run_zipf, "order": run_order}, dry_run, argv,
                       opt_in=("tune", "zipf", "order"))


if __name__ == "__main__":
    sys.exit(main())
