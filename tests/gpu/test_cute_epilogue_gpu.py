"""cute_gemm_sm90's fused epilogue classes (Epi: bias along N or M, then an activation) and its FP8
classes (e4m3 / e5m2 A and B, per-row and per-column float32 scales) on an H200, called through
the compiled class itself and through the API (xgemm.gemm / gated / scaled_matmul):
D = act(A @ B + bias) against core/epilogues.apply in float64, D = (A @ B) * alpha * scale_a[row]
* scale_b[col] against the float64 product of the FP8 values, outputs NaN-poisoned, ragged shapes so that tiles overhang D
and the vector indices are clamped, the transposed run's bias along the kernel's M.

The cases are plain data (EPI_CASES) so that tests/gpu/prebuild_classes.py can compile their
classes on a CPU machine (`epilogue_items()`).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")]

TORCH_DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# |d - ref| <= TOL * (|ref| + 1): one rounding to D's dtype, fp32 accumulation of K products of
# values in [-2, 2], and the activation's SFU approximations (tanh.approx for a bf16 D only)
TOL = {"bfloat16": 1e-2, "float16": 2e-3, "float32": 2e-5}


def fast_accum_bound(a8, b8, scale, out: str, ref):
    """|d - ref| bound of an FP8 class: D's rounding (TOL) plus the wgmma accumulator's, which keeps
    ~14 bits of its running sum (DeepSeek-V3 report; torch._scaled_mm's use_fast_accum=True): at
    most 2**-13 of sum |a||b| per 32-deep wgmma step. The 2026-12-02 H200 run measured 2-5% of
    |ref| + 1 at K = 256-512 where a float32-accumulate bound of 1e-2 was asked."""
    k = a8.shape[1]
    mag = (a8.double().abs() @ b8.double().abs()) * scale
    return TOL[out] * (ref.abs() + 1.0) + -(-k // 32) * 2.0 ** -13 * mag

# (name, M, N, K, ab, out, bias dtype | None, activation | None, config (tile_m, tile_n, cluster_m,
#  cluster_n, pingpong, raster_m, swizzle), transposed run)
PP = (128, 192, 2, 1, True, True, 8)
COOP = (256, 128, 1, 2, False, False, 4)
SMALL = (128, 128, 1, 1, True, True, 8)
EPI_CASES = [
    ("bias-gelu_tanh", 1000, 1032, 264, "bfloat16", "bfloat16", "bfloat16", "gelu_tanh", PP, False),
    ("bias-gelu_tanh-f32", 333, 264, 136, "bfloat16", "float32", "float32", "gelu_tanh", SMALL, False),
    ("bias-gelu-fp16", 520, 200, 264, "float16", "float16", "float16", "gelu", COOP, False),
    ("relu-nobias", 300, 264, 200, "bfloat16", "bfloat16", None, "relu", SMALL, False),
    ("bias-only", 300, 520, 72, "bfloat16", "float32", "float32", None, PP, False),
    ("bias-silu-T", 1000, 1032, 264, "bfloat16", "bfloat16", "bfloat16", "silu", PP, True),
    ("bias-relu2-T", 333, 264, 136, "float16", "float16", "float32", "relu2", COOP, True),
    ("sigmoid-T", 296, 264, 200, "bfloat16", "float32", None, "sigmoid", SMALL, True),
]


def _spec(case):
    """(class spec, Epi) of a case: row-major A, B, D as given, or their transposes for the
    transposed run (the kernel's A is B^T, its B is A^T, its D is D^T: all column-major)."""
    from xgemm.core.problem import COL, ROW
    from xgemm.kernels import cute_gemm_sm90 as k90
    _, m, n, k, ab, out, bias, act, cfg, t = case
    cfg = k90.Config(*cfg)
    major = COL if t else ROW
    spec = (cfg, ab, out, major, major, major, None, True, (False,) * 4, k90.max_clusters(132, cfg), "sm_90a")
    epi = k90.Epi(("m" if t else "n") if bias else None, bias, act)
    return spec, epi


# gated classes: (name, M, H, K, ab, out, bias dtype | None, the gate's activation, config, B layout);
# B = [gate | up] is K x 2H, D = act(A @ gate + bias[:H]) * (A @ up + bias[H:]) is M x H (H a
# multiple of tile_n / 2)
GATED_CASES = [
    ("swiglu", 1000, 576, 264, "bfloat16", "bfloat16", "bfloat16", "silu", (128, 128, 2, 1, True, True, 8), "row"),
    ("geglu-kmajor", 333, 576, 136, "float16", "float16", "float32", "gelu", (128, 192, 1, 1, True, True, 8), "col"),
    ("reglu-coop", 520, 384, 200, "bfloat16", "float32", None, "relu", (256, 128, 1, 2, False, False, 4), "row"),
]


def _gated_spec(case):
    from xgemm.core.problem import COL, ROW
    from xgemm.kernels import cute_gemm_sm90 as k90
    _, m, h, k, ab, out, bias, act, cfg, b_layout = case
    cfg = k90.Config(*cfg)
    spec = (cfg, ab, out, ROW, COL if b_layout == "col" else ROW, ROW, None, True, (False,) * 4,
            k90.max_clusters(132, cfg), "sm_90a")
    return spec, k90.Epi("n" if bias else None, bias, act, gated=True)


# (name, M, N, K, ab, out, row/col scales, config): A row-major, B column-major (K-major, as
# wgmma reads FP8 and torch._scaled_mm takes it); tensor scales go in alpha
FP8_CASES = [
    ("e4m3-tensor", 1000, 1040, 512, "float8_e4m3fn", "bfloat16", False, PP),
    ("e4m3-row", 333, 272, 256, "float8_e4m3fn", "bfloat16", True, SMALL),
    ("e4m3-row-f32", 520, 208, 384, "float8_e4m3fn", "float32", True, COOP),
    ("e5m2-row", 300, 256, 128, "float8_e5m2", "float16", True, SMALL),
]


def _fp8_spec(case):
    from xgemm.core.problem import COL, ROW
    from xgemm.kernels import cute_gemm_sm90 as k90
    _, m, n, k, ab, out, rowwise, cfg = case
    cfg = k90.Config(*cfg)
    spec = (cfg, ab, out, ROW, COL, ROW, None, False, (False,) * 4, k90.max_clusters(132, cfg), "sm_90a")
    return spec, (k90.Epi(scale_m=True, scale_n=True) if rowwise else None)


# A promoting FP8 class against the same class without promotion, over a long K (4096) where the
# wgmma accumulator's ~14 bits show: cooperative 128x128, per-row / per-column scales, fp32 D
PROMOTE = (512, 512, 4096, (128, 128, 1, 1, False, True, 8))


def _promote_spec(promote: bool):
    from xgemm.core.problem import COL, ROW
    from xgemm.kernels import cute_gemm_sm90 as k90
    cfg = k90.Config(*PROMOTE[3])
    spec = (cfg, "float8_e4m3fn", "float32", ROW, COL, ROW, None, True, (False,) * 4, k90.max_clusters(132, cfg),
            "sm_90a")
    return spec, k90.Epi(scale_m=True, scale_n=True, promote=promote)


def epilogue_items() -> list:
    """(module, class key) of every case, for tests/gpu/prebuild_classes.py."""
    from xgemm.kernels import cute_gemm_sm90 as k90
    specs = (list(map(_spec, EPI_CASES)) + list(map(_fp8_spec, FP8_CASES)) + list(map(_gated_spec, GATED_CASES))
             + [_promote_spec(True), _promote_spec(False)])
    return [("xgemm.kernels.cute_gemm_sm90", k90.class_key(*spec, epi)) for spec, epi in specs]


@pytest.mark.parametrize("case", EPI_CASES, ids=[c[0] for c in EPI_CASES])
def test_fused_epilogue_class(case):
    from xgemm.core import epilogues
    from xgemm.kernels import cute_gemm_sm90 as k90
    name, m, n, k, ab, out, bias_dt, act, _, t = case
    g = torch.Generator(device="cuda").manual_seed(sum(map(ord, name)))
    a = (torch.rand(m, k, device="cuda", generator=g) * 4 - 2).to(TORCH_DT[ab])
    b = (torch.rand(k, n, device="cuda", generator=g) * 4 - 2).to(TORCH_DT[ab])
    bias = (torch.randn(n, device="cuda", generator=g) * 8).to(TORCH_DT[bias_dt]) if bias_dt else None
    d = torch.full((m, n), float("nan"), dtype=TORCH_DT[out], device="cuda")
    spec, epi = _spec(case)
    fn = k90.compiled(*spec, epi=epi)
    stream = torch.cuda.current_stream().cuda_stream
    ops = (b.t(), a.t(), d.t()) if t else (a, b, d)
    fn(*ops, None, bias, None, None, 1.0, 0.0, stream)
    torch.cuda.synchronize()
    pre = a.double() @ b.double() + (bias.double() if bias is not None else 0.0)
    ref = epilogues.apply(torch, pre, act)
    assert not torch.isnan(d).any(), f"{name}: {int(torch.isnan(d).sum())} elements unwritten"
    err = ((d.double() - ref).abs() / (ref.abs() + 1.0)).max().item()
    assert err <= TOL[out], f"{name}: max rel err {err:.3g} > {TOL[out]}"


@pytest.mark.parametrize("case", FP8_CASES, ids=[c[0] for c in FP8_CASES])
def test_fp8_class(case):
    from xgemm.kernels import cute_gemm_sm90 as k90
    name, m, n, k, ab, out, rowwise, _ = case
    g = torch.Generator(device="cuda").manual_seed(sum(map(ord, name)))
    f8 = getattr(torch, ab)
    a8 = (torch.randn(m, k, device="cuda", generator=g) * 2).to(f8)
    b8 = (torch.randn(n, k, device="cuda", generator=g) * 2).to(f8).t()       # (K, N), column-major
    alpha = 0.375
    d = torch.full((m, n), float("nan"), dtype=TORCH_DT[out], device="cuda")
    spec, epi = _fp8_spec(case)
    fn = k90.compiled(*spec, epi=epi)
    stream = torch.cuda.current_stream().cuda_stream
    ref = (a8.double() @ b8.double()) * alpha
    scale = alpha
    if rowwise:
        sa = torch.rand(m, device="cuda", generator=g) + 0.5
        sb = torch.rand(n, device="cuda", generator=g) + 0.5
        fn(a8, b8, d, None, None, sa, sb, alpha, 0.0, stream)
        scale = alpha * sa.double()[:, None] * sb.double()[None, :]
        ref = ref * scale / alpha
    else:
        fn(a8, b8, d, alpha, stream)
    torch.cuda.synchronize()
    assert not torch.isnan(d).any(), f"{name}: {int(torch.isnan(d).sum())} elements unwritten"
    excess = ((d.double() - ref).abs() / fast_accum_bound(a8, b8, scale, out, ref)).max().item()
    assert excess <= 1.0, f"{name}: error {excess:.3g} x the fast-accumulation bound"


# ---------------------------------------------------------------------------------------------
# Through the API, switched on: xgemm.gemm(bias=, activation=) and xgemm.scaled_matmul reach these
# classes (xgemm/compose.py, xgemm/fp8.py) and agree with their composed / embedded-default results.
# ---------------------------------------------------------------------------------------------
API_SHAPES = [(1000, 1032, 264), (4096, 4096, 4096), (333, 264, 136)]     # the second: the transposed run
API_ACTS = ["gelu_tanh", "silu", None]
def test_promoted_fp8_class_adds_in_float32():
    """Epi.promote adds each 128-deep k-tile's wgmma sum into float32 registers: within 4 wgmma
    steps of 2**-13 of sum |a||b| (the k-tile's own truncation) where the fast class is allowed
    K / 32 of them, and at least 2x more accurate than the fast class on the same operands."""
    from xgemm.kernels import cute_gemm_sm90 as k90
    m, n, k, _ = PROMOTE
    g = torch.Generator(device="cuda").manual_seed(11)
    a8 = (torch.randn(m, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
    b8 = (torch.randn(n, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn).t()
    sa, sb = torch.rand(m, device="cuda", generator=g) + 0.5, torch.rand(n, device="cuda", generator=g) + 0.5
    scale = sa.double()[:, None] * sb.double()[None, :]
    ref = (a8.double() @ b8.double()) * scale
    mag = (a8.double().abs() @ b8.double().abs()) * scale
    stream = torch.cuda.current_stream().cuda_stream
    errs = {}
    for promote in (True, False):
        d = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
        spec, epi = _promote_spec(promote)
        k90.compiled(*spec, epi=epi)(a8, b8, d, None, None, sa, sb, 1.0, 0.0, stream)
        torch.cuda.synchronize()
        assert not torch.isnan(d).any()
        errs[promote] = (d.double() - ref).abs()
    bound = TOL["float32"] * (ref.abs() + 1.0) + 4 * 2.0 ** -13 * mag
    assert (errs[True] / bound).max().item() <= 1.0, (errs[True] / bound).max().item()
    assert 2 * errs[True].max().item() <= errs[False].max().item(), (errs[True].max().item(), errs[False].max().item())


# shapes of their own (plans are cached per problem); 128x128x8192, where the plain product's row
# splits K in 8, failed a build assertion on the H200 on 2026-12-05 (a split class with an Epi);
# 4000x4104: several tiles a CTA, ragged in M and N, so each tile's scale values replace the last's
PROMOTE_API = [(777, 1040, 1024), (128, 128, 8192), (4000, 4104, 1024)]


@pytest.mark.parametrize("mnk", PROMOTE_API, ids=str)
def test_scaled_matmul_default_call_runs_the_promoted_class(mnk):
    """The default call (float32 accumulation) runs the promoting class, within the bound of
    test_promoted_fp8_class_adds_in_float32 of the float64 product."""
    import xgemm
    m, n, k = mnk
    g = torch.Generator(device="cuda").manual_seed(5)
    a8 = (torch.randn(m, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
    b8 = (torch.randn(n, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn).t()
    sa, sb = torch.rand(m, 1, device="cuda", generator=g) + 0.5, torch.rand(1, n, device="cuda", generator=g) + 0.5
    bias = torch.randn(n, device="cuda", generator=g)
    text = str(xgemm.explain(a8, b8, sa, sb, op="scaled_matmul"))
    assert "runs on cute_gemm_sm90" in text and "float32" in text, text
    y = xgemm.scaled_matmul(a8, b8, sa, sb, bias=bias)
    torch.cuda.synchronize()
    scale = sa.double() * sb.double()
    ref = (a8.double() @ b8.double()) * scale + bias.double()
    bound = TOL["bfloat16"] * (ref.abs() + 1.0) + 4 * 2.0 ** -13 * (a8.double().abs() @ b8.double().abs()) * scale
    assert not torch.isnan(y).any() and ((y.double() - ref).abs() / bound).max().item() <= 1.0


@pytest.mark.parametrize("recipe", ["row", "tensor"])
def test_scaled_matmul_fast_call_on_many_tiles(recipe):
    """The fast call (use_fast_accum) on several tiles a CTA with ragged edges: the row and column
    scales each tile loads under its mainloop are its own (tensor-wise: the one value of a vector
    of one, every index clamped to it), within the fast-accumulation bound."""
    import xgemm
    m, n, k = PROMOTE_API[-1]
    g = torch.Generator(device="cuda").manual_seed(6)
    a8 = (torch.randn(m, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
    b8 = (torch.randn(n, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn).t()
    rows, cols = (m, n) if recipe == "row" else (1, 1)
    sa = torch.rand(rows, 1, device="cuda", generator=g) + 0.5
    sb = torch.rand(1, cols, device="cuda", generator=g) + 0.5
    assert "runs on cute_gemm_sm90" in str(xgemm.explain(a8, b8, sa, sb, op="scaled_matmul", use_fast_accum=True))
    # scaled_matmul takes no out=: a freed NaN block of D's size is what torch's caching allocator hands it
    poison = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    ptr = poison.data_ptr()
    del poison
    y = xgemm.scaled_matmul(a8, b8, sa, sb, use_fast_accum=True)
    torch.cuda.synchronize()
    scale = sa.double() * sb.double()
    ref = (a8.double() @ b8.double()) * scale
    assert y.data_ptr() == ptr and not torch.isnan(y).any()
    assert ((y.double() - ref).abs() / fast_accum_bound(a8, b8, scale, "bfloat16", ref)).max().item() <= 1.0


# ragged M (no multiple of 4: scale_a's M-major copy is padded); N in 9 blocks of b's scales, the
# last partial; K in 5 k-tiles, the last partial (80 deep: FP8 K-major rows need K a multiple of 16 bytes)
BLOCK_API = (1002, 1040, 592)
# several 128x192 tiles a CTA: tiles that start mid-block (odd ones), whose blocks lie in two of the
# 4-block boxes of B's scales (tiles 2 and 5), the last block and tile partial; ragged M and K (N a
# multiple of 8: D's rows TMA-stored, as supports() asks)
BLOCK_WIDE = (2050, 2104, 1040)


def _block_operands(seed: int, shape=BLOCK_API):
    m, n, k = shape
    kb, nb = -(-k // 128), -(-n // 128)
    g = torch.Generator(device="cuda").manual_seed(seed)
    a8 = (torch.randn(m, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
    b8 = (torch.randn(n, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn).t()
    sa = torch.rand(m, kb, device="cuda", generator=g) + 0.5
    sb = (torch.rand(nb, kb, device="cuda", generator=g) + 0.5).t()      # (K/128, N/128), stored transposed
    return a8, b8, sa, sb, torch.randn(n, device="cuda", generator=g)


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("layout", ["given", "kernel"])
@pytest.mark.parametrize("shape", [BLOCK_API, BLOCK_WIDE], ids=str)
def test_scaled_matmul_block_scales_run_the_block_class(fast, layout, shape):
    """Block-wise scales (a in 1x128 blocks, b in 128x128) run the block-scaled promoting class with
    either accumulation, within the promoted bound (4 wgmma steps a k-tile) of the float64 product
    of the dequantized operands; the result is written over NaN. The scales as given (scale_a
    row-major, scale_b transposed: copied into the layouts the class loads) or in those layouts
    (scale_a M-major, scale_b row-major, both strides padded to 4 floats, NaN in the padding).
    BLOCK_WIDE runs 128x192 tiles, two blocks of B's scales a tile."""
    import xgemm
    a8, b8, sa, sb, bias = _block_operands(9, shape)
    (m, k), n = a8.shape, b8.shape[1]
    if layout == "kernel":
        kb, nb = sb.shape
        pad_a = torch.full((kb, -(-m // 4) * 4), float("nan"), device="cuda")
        pad_b = torch.full((kb, -(-nb // 4) * 4), float("nan"), device="cuda")
        pad_a[:, :m], pad_b[:, :nb] = sa.t(), sb
        sa, sb = pad_a[:, :m].t(), pad_b[:, :nb]
    text = str(xgemm.explain(a8, b8, sa, sb, op="scaled_matmul", use_fast_accum=fast))
    assert "runs on cute_gemm_sm90" in text and "multiplied by its block scales" in text, text
    assert ("cooperative 128x192" in text) == (shape == BLOCK_WIDE), text
    torch.full((m * n,), float("nan"), dtype=torch.bfloat16, device="cuda")     # freed: the next block of that size
    y = xgemm.scaled_matmul(a8, b8, sa, sb, bias=bias, use_fast_accum=fast)
    torch.cuda.synchronize()
    ad = a8.double() * sa.double().repeat_interleave(128, 1)[:, :k]
    bd = b8.double() * sb.double().repeat_interleave(128, 0)[:k].repeat_interleave(128, 1)[:, :n]
    ref = ad @ bd + bias.double()
    bound = TOL["bfloat16"] * (ref.abs() + 1.0) + 4 * 2.0 ** -13 * (ad.abs() @ bd.abs())
    assert not torch.isnan(y).any()
    excess = ((y.double() - ref).abs() / bound).max().item()
    # the embedded default's float32 dequantize + matmul, for the message
    peer = (a8.float() * sa.repeat_interleave(128, 1)[:, :k]) @ (b8.float() * sb.repeat_interleave(128, 0)[:k]
                                                                .repeat_interleave(128, 1)[:, :n]) + bias
    assert excess <= 1.0, (excess, ((peer.double() - ref).abs() / bound).max().item())


FP8_API = (1000, 1040, 512)
GATED_API = [(1000, 1536, 264), (4096, 4096, 1024), (128, 128, 8192)]   # the last: see PROMOTE_API


def api_items() -> list:
    """(module, class key) of every class the API tests below launch: their calls recorded on CPU
    tensors dressed as an H200 (tests/fake_cuda.py)."""
    import xgemm
    from fake_cuda import Fake
    with Fake(keep=True) as fake:
        for m, n, k in API_SHAPES:
            for act in API_ACTS:
                xgemm.gemm(torch.empty(m, k, dtype=torch.bfloat16), torch.empty(k, n, dtype=torch.bfloat16),
                           bias=torch.empty(n, dtype=torch.bfloat16), activation=act,
                           out=torch.empty(m, n, dtype=torch.bfloat16))
        # benchmarks/epilogue.py's fused products (bias + gelu_tanh, SwiGLU), compiled ahead too
        xgemm.gemm(torch.empty(8192, 4096, dtype=torch.bfloat16), torch.empty(4096, 14336, dtype=torch.bfloat16),
                   bias=torch.empty(14336, dtype=torch.bfloat16), activation="gelu_tanh")
        xgemm.gated(torch.empty(8192, 4096, dtype=torch.bfloat16), torch.empty(4096, 28672, dtype=torch.bfloat16),
                    activation="swiglu")
        for m, h, k in GATED_API:
            xgemm.gated(torch.empty(m, k, dtype=torch.bfloat16), torch.empty(k, 2 * h, dtype=torch.bfloat16),
                        bias=torch.empty(2 * h, dtype=torch.bfloat16), activation="swiglu")
        m, n, k = FP8_API
        a8, b8 = torch.empty(m, k, dtype=torch.float8_e4m3fn), torch.empty(n, k, dtype=torch.float8_e4m3fn).t()
        for sa, sb in ((torch.ones(m, 1), torch.ones(1, n)), (torch.tensor(1.0), torch.tensor(1.0))):
            xgemm.scaled_matmul(a8, b8, sa, sb, bias=torch.empty(n), use_fast_accum=True)
        for m, n, k in PROMOTE_API:
            xgemm.scaled_matmul(torch.empty(m, k, dtype=torch.float8_e4m3fn),
                                torch.empty(n, k, dtype=torch.float8_e4m3fn).t(),
                                torch.ones(m, 1), torch.ones(1, n), bias=torch.empty(n))
        for sa, sb in ((torch.ones(m, 1), torch.ones(1, n)), (torch.ones(1, 1), torch.ones(1, 1))):
            xgemm.scaled_matmul(torch.empty(m, k, dtype=torch.float8_e4m3fn),
                                torch.empty(n, k, dtype=torch.float8_e4m3fn).t(), sa, sb, use_fast_accum=True)
        for m, n, k in (BLOCK_WIDE, BLOCK_API):      # BLOCK_API last: the calls below reuse its operands
            kb, nb = -(-k // 128), -(-n // 128)
            a8, b8 = torch.empty(m, k, dtype=torch.float8_e4m3fn), torch.empty(n, k, dtype=torch.float8_e4m3fn).t()
            xgemm.scaled_matmul(a8, b8, torch.ones(m, kb), torch.ones(nb, kb).t(), bias=torch.empty(n))
        # without a bias, the classes tests/gpu/test_jax_gpu.py's jit FP8 test lowers to
        for sa, sb in ((torch.ones(m, 1), torch.ones(1, n)), (torch.ones(m, kb), torch.ones(kb, nb))):
            xgemm.scaled_matmul(a8, b8, sa, sb)
        # examples/model_layers.py's products (reliability.sh runs the examples on the H200)
        T, D, H = 256, 512, 1024
        xgemm.gated(torch.empty(T, D, dtype=torch.bfloat16), torch.empty(D, 2 * H, dtype=torch.bfloat16),
                    activation="swiglu")
        xgemm.gemm(torch.empty(T, H, dtype=torch.bfloat16), torch.empty(H, D, dtype=torch.bfloat16),
                   bias=torch.empty(D, dtype=torch.bfloat16), activation="gelu_tanh")
        xgemm.scaled_matmul(torch.empty(T, D, dtype=torch.float8_e4m3fn),
                            torch.empty(D, D, dtype=torch.float8_e4m3fn).t(), torch.ones(T, 1), torch.ones(1, D),
                            use_fast_accum=True)
        # benchmarks/fp8.py's products, both accumulations
        for m, n, k in ((8192, 8192, 8192), (16384, 14336, 4096)):
            def bench(*_, m=m, n=n, k=k, fast=True):
                a8, b8 = torch.empty(m, k, dtype=torch.float8_e4m3fn), torch.empty(n, k, dtype=torch.float8_e4m3fn).t()
                kb, nb = -(-k // 128), -(-n // 128)
                for sa, sb in ((torch.ones(m, 1), torch.ones(1, n)), (torch.tensor(1.0), torch.tensor(1.0)),
                               (torch.ones(m, kb), torch.ones(kb, nb))):
                    xgemm.scaled_matmul(a8, b8, sa, sb, use_fast_accum=fast)
            bench()
            bench(fast=False)
    return [(f"xgemm.kernels.{key[0]}", key) for kind, key, _ in fake.calls if kind == "cute"]


@pytest.mark.parametrize("mnk", API_SHAPES)
@pytest.mark.parametrize("act", API_ACTS)
def test_gemm_api_fuses(mnk, act):
    import xgemm
    from xgemm.core import epilogues
    m, n, k = mnk
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = (torch.rand(m, k, device="cuda", generator=g) * 4 - 2).bfloat16()
    b = (torch.rand(k, n, device="cuda", generator=g) * 4 - 2).bfloat16()
    bias = torch.randn(n, device="cuda", generator=g).bfloat16()
    plan = xgemm.explain(a, b, bias=bias, activation=act)
    assert plan.kernel_name == "cute_gemm_sm90" and "fused" in plan.epilogue, plan
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = xgemm.gemm(a, b, bias=bias, activation=act, out=out)
    torch.cuda.synchronize()
    ref = epilogues.apply(torch, a.double() @ b.double() + bias.double(), act)
    assert y is out and not torch.isnan(y).any()
    err = ((y.double() - ref).abs() / (ref.abs() + 1.0)).max().item()
    assert err <= TOL["bfloat16"], err


@pytest.mark.parametrize("recipe", ["tensor", "row"])
def test_scaled_matmul_api_runs_the_fp8_class(recipe):
    import xgemm
    from xgemm import fp8
    from xgemm.kernels import cute_gemm_sm90 as k90
    m, n, k = FP8_API
    g = torch.Generator(device="cuda").manual_seed(7)
    a8 = (torch.randn(m, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
    b8 = (torch.randn(n, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn).t()
    if recipe == "row":
        sa, sb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
    else:
        sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(1.5, device="cuda")
    bias = torch.randn(n, device="cuda")
    checked = fp8.check_scaled_matmul(a8, b8, sa, sb, bias=bias)
    assert fp8.prepare_kernel(checked).plan.kernel.name == k90.NAME
    y = xgemm.scaled_matmul(a8, b8, sa, sb, bias=bias, use_fast_accum=True)
    # the default call runs the promoted class (k-tile sums added in float32), the fast call the fast one
    default = xgemm.explain(a8, b8, sa, sb, op="scaled_matmul")
    fast = xgemm.explain(a8, b8, sa, sb, op="scaled_matmul", use_fast_accum=True)
    assert "runs on cute_gemm_sm90" in default and "promoted to float32" in default
    assert "runs on cute_gemm_sm90" in fast and "promoted to float32" not in fast
    torch.cuda.synchronize()
    scale = sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)
    ref = (a8.double() @ b8.double()) * scale + bias.double()
    bound = fast_accum_bound(a8, b8, scale, "bfloat16", ref)
    # torch._scaled_mm with the same accumulation, for the message: the bound's model holds for cuBLAS too
    peer = torch._scaled_mm(a8, b8, sa.reshape(m, 1) if recipe == "row" else sa,
                            sb.reshape(1, n) if recipe == "row" else sb, bias=bias.bfloat16(),
                            out_dtype=torch.bfloat16, use_fast_accum=True)
    excess = ((y.double() - ref).abs() / bound).max().item()
    peer_excess = ((peer.double() - ref).abs() / bound).max().item()
    assert not torch.isnan(y).any() and excess <= 1.0, (excess, peer_excess)


@pytest.mark.parametrize("case", GATED_CASES, ids=[c[0] for c in GATED_CASES])
def test_gated_class(case):
    from xgemm.core import epilogues
    from xgemm.kernels import cute_gemm_sm90 as k90
    name, m, h, k, ab, out, bias_dt, act, _, b_layout = case
    g = torch.Generator(device="cuda").manual_seed(sum(map(ord, name)))
    a = (torch.rand(m, k, device="cuda", generator=g) * 4 - 2).to(TORCH_DT[ab])
    b = (torch.rand(k, 2 * h, device="cuda", generator=g) * 4 - 2).to(TORCH_DT[ab])
    if b_layout == "col":
        b = b.t().contiguous().t()
    bias = (torch.randn(2 * h, device="cuda", generator=g) * 4).to(TORCH_DT[bias_dt]) if bias_dt else None
    d = torch.full((m, h), float("nan"), dtype=TORCH_DT[out], device="cuda")
    spec, epi = _gated_spec(case)
    fn = k90.compiled(*spec, epi=epi)
    fn(a, b, d, None, bias, None, None, 1.0, 0.0, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    pre = a.double() @ b.double() + (bias.double() if bias is not None else 0.0)
    gate = epilogues.apply(torch, pre[:, :h], act)
    ref = gate * pre[:, h:]
    assert not torch.isnan(d).any(), f"{name}: {int(torch.isnan(d).sum())} elements unwritten"
    # D's rounding, and the float32 sums of gate and up carried through the product (the
    # activations' slopes are at most ~1.1): an fp32 D of a product of two K-deep sums misses
    # 2e-5 of |ref| + 1 where |up| is large against |ref| (5.1e-5 on the H200, 2026-12-02)
    mag = a.double().abs() @ b.double().abs()
    acc = 2 * k * 2.0 ** -24
    bound = 2 * TOL[out] * (ref.abs() + 1.0) + acc * (1.1 * mag[:, :h] * pre[:, h:].abs() + gate.abs() * mag[:, h:])
    excess = ((d.double() - ref).abs() / bound).max().item()
    assert excess <= 1.0, f"{name}: error {excess:.3g} x the bound"


@pytest.mark.parametrize("mhk", GATED_API)
def test_gated_api_fuses(mhk):
    import xgemm
    from xgemm.core import epilogues
    m, h, k = mhk
    g = torch.Generator(device="cuda").manual_seed(m + h)
    a = (torch.rand(m, k, device="cuda", generator=g) * 4 - 2).bfloat16()
    b = (torch.rand(k, 2 * h, device="cuda", generator=g) * 4 - 2).bfloat16()
    bias = torch.randn(2 * h, device="cuda", generator=g).bfloat16()
    plan = xgemm.explain(a, b, bias=bias, activation="swiglu", op="gated")
    assert plan.kernel_name == "cute_gemm_sm90" and "fused" in plan.epilogue, plan
    y = xgemm.gated(a, b, bias=bias, activation="swiglu")
    torch.cuda.synchronize()
    pre = a.double() @ b.double() + bias.double()
    ref = epilogues.gate(torch, pre, "swiglu")
    err = ((y.double() - ref).abs() / (ref.abs() + 1.0)).max().item()
    assert y.shape == (m, h) and not torch.isnan(y).any() and err <= 2 * TOL["bfloat16"], err
