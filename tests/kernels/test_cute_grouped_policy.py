"""cute_gemm_sm90's grouped class on the CPU: what supports() takes and declines, and the policy's
pick among its candidate configs (the fill model at the mean group size)."""
from __future__ import annotations

import dataclasses

import pytest
from helpers import lower_ragged_dot_grad

from xgemm.core import grouped_checks, layout
from xgemm.core.problem import COL, ROW, Device
from xgemm.kernels import cute_gemm_sm90 as K90
from xgemm.kernels.cute_gemm_sm90_policy import (GATE_HALF_STEP, GATED_GROUPED_CONFIGS, GROUPED_CONFIGS,
                                                  choose_gated_grouped_config,
                                                  choose_grouped_config, group_tiles, grouped_fill, grouped_fill_of)

H200 = Device("cuda", 0, (9, 0))


def _problem(t=16384, k=4096, n=7168, e=8, dtype="bfloat16", out=None, a_major=ROW, b_major=COL, ragged_k=False,
             device=H200, activation=None):
    if ragged_k:
        shape = grouped_checks.grouped_mm("test", (k, t), (t, n), (e,))
        a = layout.dense_operand((k, t), dtype, 2, a_major)
        b = layout.dense_operand((t, n), dtype, 2, b_major)
    else:
        shape = grouped_checks.ragged_dot("test", (t, k), (e, k, n), (e,))
        a = layout.dense_operand((t, k), dtype, 2 if dtype != "float32" else 4, a_major)
        b = layout.dense_operand((e, k, n), dtype, 2 if dtype != "float32" else 4, b_major)
    return grouped_checks.GroupedProblem(shape, a, b, out or dtype, "torch", device, activation)


def test_supports_the_moe_forward_and_its_dlhs():
    assert K90.GROUPED.supports(_problem()) is None                       # torch's K-major weights
    assert K90.GROUPED.supports(_problem(b_major=ROW)) is None            # N-major (jax's rhs)
    assert K90.GROUPED.supports(_problem(out="float32")) is None


@pytest.mark.parametrize("kw,why", [
    (dict(ragged_k=True), "variable-K"),
    (dict(a_major=COL), "K-major"),
    (dict(dtype="float32"), "float16 or bfloat16"),
    (dict(out="float16"), "output dtype"),
    (dict(n=100), "16 bytes"),
    (dict(device=Device("cuda", 0, (8, 0))), "sm_90"),
    (dict(device=Device("cpu")), "CUDA device"),
])
def test_declines_what_it_has_no_class_for(kw, why):
    assert why in K90.GROUPED.supports(_problem(**kw))


def test_policy_keeps_the_first_candidate_unless_another_fills_tiles_better():
    # the uneven case: 2048 rows a group on average, N = 7168 (37.3 tiles of 192)
    cfg = choose_grouped_config(16384, 7168, 8)
    assert grouped_fill(16384, 7168, 8, cfg) >= grouped_fill(16384, 7168, 8, GROUPED_CONFIGS[0])
    assert grouped_fill(16384, 7168, 8, cfg) > 0.9
    # many tiny groups (16 rows each): a 2x1 class folds its last cluster row, so its tiles are as
    # full as a 1x2 class's (128 rows), not half as full (a 256-row block)
    first = GROUPED_CONFIGS[0]
    assert (first.cluster_m, first.cluster_n) == (2, 1)
    one_by_two = dataclasses.replace(first, cluster_m=1, cluster_n=2)
    assert grouped_fill(4096, 4096, 256, first) == grouped_fill(4096, 4096, 256, one_by_two) == 16 / 128 * 4096 / 4224
    assert choose_grouped_config(4096, 4096, 256) == first
    # groups of 300 rows: three 128-row tiles (two full-width cluster rows would be four)
    assert grouped_fill(300 * 8, 384, 8, first) == 300 / 384
    # unless N is one column of tiles: the folded row's cluster tile is two columns wide, and the
    # CTA past N still runs its mainloop
    assert grouped_fill(300 * 8, 192, 8, first) == 300 / 512
    # a candidate whose tiles are fuller by the margin wins: 64-column products on 192-wide tiles
    narrow = choose_grouped_config(16384, 64, 8)
    assert grouped_fill(16384, 64, 8, narrow) >= 1.25 * grouped_fill(16384, 64, 8, first)
    pol = K90.GROUPED.policy(_problem())
    assert "grouped" in " ".join(pol.notes) and K90.Config.from_policy(pol) == cfg


def test_prebuild_covers_the_grouped_class():
    keys = [key for key, _ in K90.KERNEL.prebuild("sm_90a")]
    grouped = [key for key in keys if key[-1] == K90.GROUPED_MARK]
    plain = [key for key in grouped if not isinstance(key[-2], K90.Epi)]
    assert len(plain) == 8 and all(key[2] == GROUPED_CONFIGS[0] for key in plain)
    # the SwiGLU forward's classes: bf16 / fp16, D of the inputs' dtype, B N- and K-major
    gated = [key for key in grouped if isinstance(key[-2], K90.Epi)]
    assert len(gated) == 4 and all(key[2] == GATED_GROUPED_CONFIGS[0] and key[3] == key[4] for key in gated)
    assert {key[-2] for key in gated} == {K90.Epi(activation="silu", gated=True)}
    assert {key[6] for key in gated} == {ROW, COL}


def test_gated_problems_take_a_tile_whose_gate_half_divides_h():
    # the first candidate whose tile_n / 2 divides H: 128x128 (H % 64 == 0), then 128x256; no
    # 128x192 (a 96-column half: CuTe-DSL aborts building its TMA atom for a row-major B)
    assert all(c.tile_n // 2 % GATE_HALF_STEP == 0 for c in GATED_GROUPED_CONFIGS)
    assert [choose_gated_grouped_config(h).tile_n for h in (3584, 3520)] == [128, 128]
    for activation in ("swiglu", "geglu", "reglu"):
        p = _problem(activation=activation)                     # N = 7168: H = 3584
        assert K90.GROUPED.supports(p) is None and p.out_shape == (16384, 3584)
        pol = K90.GROUPED.policy(p)
        assert K90.Config.from_policy(pol) == GATED_GROUPED_CONFIGS[0] and "gated" in " ".join(pol.notes)
    assert "multiple of 64" in K90.GROUPED.supports(_problem(n=80, activation="swiglu"))     # H = 40
    assert "multiple of 64" in K90.GROUPED.supports(_problem(n=2 * 3552, activation="swiglu"))   # 96 | H
    # a plain activation keeps the plain product's pick and shape
    p = _problem(activation="gelu")
    assert K90.GROUPED.supports(p) is None and p.out_shape == (16384, 7168)
    assert K90.Config.from_policy(K90.GROUPED.policy(p)) == K90.Config.from_policy(K90.GROUPED.policy(_problem()))
    assert "has no class" in K90.GROUPED.supports(_problem(activation="softplus"))


def test_only_the_cute_class_serves_a_fused_problem():
    """policy.choose: the Triton kernel fuses nothing, so a problem the CuTe class declines plans the
    reference, which the caller reads as "compose it"."""
    from xgemm.core import policy
    assert policy.choose("grouped", _problem(activation="swiglu")).kernel.name == "cute_gemm_sm90"
    plan = policy.choose("grouped", _problem(n=80, activation="swiglu"))
    assert plan.kernel.name == "reference"
    assert ("triton_grouped_sm90", "fuses no bias / activation epilogue") in plan.declined
    assert K90.grouped_epi(None) is None
    assert K90.grouped_epi("geglu") == K90.Epi(activation="gelu", gated=True)
    assert K90.grouped_epi("sigmoid") == K90.Epi(activation="sigmoid")


def test_cuda_lowering_runs_the_class_forward_and_dlhs(tmp_path, monkeypatch):
    """jax's cuda lowering of ragged_dot and its grad: the forward and dlhs (rhs^T taken K-major, a
    bitcast) are the class's TVM-FFI calls, drhs (the variable-K product) the Triton cubin; export
    takes the Triton cubin for every product (a TVM-FFI handle is process-local)."""
    jax = pytest.importorskip("jax")
    pytest.importorskip("cutlass")
    import jax.numpy as jnp

    from xgemm import jax as xj
    from xgemm.core import policy
    from xgemm.runtime import gluon_cache
    monkeypatch.setenv("XGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gluon_cache, "available", lambda key, arch=None: None)
    text = lower_ragged_dot_grad()
    lines = text.splitlines()
    assert sum("stablehlo.custom_call @xgemm_tvm_ffi_call" in ln for ln in lines) == 2
    assert sum('kernel = "xgemm_grouped_flat_sm90"' in ln for ln in lines) == 1
    from jax import export
    policy.clear_plans()
    try:
        exp = export.export(jax.jit(xj.ragged_dot), platforms=("cuda",),
                            disabled_checks=xj.export_disabled_safety_checks(False))(
            jax.ShapeDtypeStruct((4096, 1024), jnp.bfloat16), jax.ShapeDtypeStruct((8, 1024, 2048), jnp.bfloat16),
            jax.ShapeDtypeStruct((8,), jnp.int32))
    finally:
        policy.clear_plans()
    text = exp.mlir_module()
    assert "xgemm_tvm_ffi_call" not in text and 'kernel = "xgemm_grouped_flat_sm90"' in text


@pytest.mark.parametrize("cfg", GROUPED_CONFIGS, ids=lambda c: f"{c.tile_m}x{c.tile_n}_{c.cluster_m}x{c.cluster_n}")
def test_group_tiles_counts_what_the_kernel_runs(cfg):
    # a straight count of the class's cluster tiles: full cluster rows across every cluster column,
    # then (2x1) a last cluster row of at most tile_m rows as one row of tiles over column pairs
    n = 4096
    cols = -(-n // (cfg.tile_n * cfg.cluster_n))
    block = cfg.tile_m * cfg.cluster_m
    for rows in (0, 1, cfg.tile_m, cfg.tile_m + 1, block, block + 1, 3 * block - 5, 19474):
        full, rest = divmod(rows, block)
        fold = (cfg.cluster_m, cfg.cluster_n) == (2, 1) and 0 < rest <= cfg.tile_m
        cluster_tiles = full * cols + (-(-cols // 2) if fold else cols if rest else 0)
        assert group_tiles(rows, n, cfg) == cluster_tiles * cfg.cluster_m * cfg.cluster_n, rows
    sizes = (0, 131, 300, 19474)
    assert grouped_fill_of(sizes, n, cfg) == sum(sizes) * n / (
        sum(group_tiles(s, n, cfg) for s in sizes) * cfg.tile_m * cfg.tile_n)
    # at equal sizes the known-size fill is the pick's mean-size fill
    for rows in (131, 300, 2048):
        assert grouped_fill_of((rows,) * 8, n, cfg) == grouped_fill(rows * 8, n, 8, cfg)


def test_cuda_lowering_fuses_the_gate_and_composes_it_under_grad(tmp_path, monkeypatch):
    """jit(xgemm.jax.ragged_dot(..., activation="swiglu")) lowers to one TVM-FFI call of the gated
    class writing [T, N / 2]; under value_and_grad the forward is the plain product in float32 (the
    gate's backward needs it) and the gate composed in XLA ops, then dlhs and drhs as without one."""
    jax = pytest.importorskip("jax")
    pytest.importorskip("cutlass")
    import jax.numpy as jnp

    from xgemm import jax as xj
    from xgemm.core import policy
    from xgemm.runtime import gluon_cache
    monkeypatch.setenv("XGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gluon_cache, "available", lambda key, arch=None: None)
    lhs = jax.ShapeDtypeStruct((4096, 1024), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((8, 1024, 3072), jnp.bfloat16)        # H = 1536
    sizes = jax.ShapeDtypeStruct((8,), jnp.int32)

    def fwd(l, r, g):
        return xj.ragged_dot(l, r, g, activation="swiglu")

    def loss(l, r, g):
        return jnp.sum(fwd(l, r, g).astype(jnp.float32))

    def lowered(f):
        return jax.jit(f).trace(lhs, rhs, sizes).lower(lowering_platforms=("cuda",)).as_text().splitlines()
    policy.clear_plans()
    try:
        calls = [ln for ln in lowered(fwd) if "stablehlo.custom_call @xgemm_tvm_ffi_call" in ln]
        assert len(calls) == 1 and "-> tensor<4096x1536xbf16>" in calls[0], calls
        grad = lowered(jax.value_and_grad(loss, argnums=(0, 1)))
        calls = [ln for ln in grad if "stablehlo.custom_call @xgemm_tvm_ffi_call" in ln]
        assert len(calls) == 2 and any("-> tensor<4096x3072xf32>" in ln for ln in calls), calls
        assert sum('kernel = "xgemm_grouped_flat_sm90"' in ln for ln in grad) == 1
        assert not any("-> tensor<4096x1536xbf16>" in ln for ln in calls)       # no fused class
        # an export takes the Triton cubin for the product (a TVM-FFI handle is process-local) and
        # composes the gate after it, rather than falling back to XLA's ragged dot
        from jax import export
        exp = export.export(jax.jit(fwd), platforms=("cuda",),
                            disabled_checks=xj.export_disabled_safety_checks(False))(lhs, rhs, sizes)
        text = exp.mlir_module()
        assert "xgemm_tvm_ffi_call" not in text and text.count('kernel = "xgemm_grouped_flat_sm90"') == 1
        assert exp.out_avals[0].shape == (4096, 1536)
    finally:
        policy.clear_plans()
