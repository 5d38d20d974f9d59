"""The tensor-core GEMMs on an H200: cute_gemm_sm90 (wgmma + TMA) and cute_mma_sm80 (mma.sync,
forced onto the H200), called through their kernel protocol (KERNEL.run on ArrayViews built from
torch tensors), plus a few calls through xgemm.gemm with the policy forced.

Inputs are integers in [-5, 5] (exact in fp16/bf16, exact fp32 sums), so the float64 reference
is exact and the only error allowed is the final rounding to the output dtype. Outputs are
NaN-poisoned before every launch; beta == 0 runs get a NaN-filled C to prove C is never read.

The case lists are plain data (SM90_CASES, SM80_CASES, CONFIG_CASES) so that the compile classes
they need can be enumerated and prebuilt on a CPU machine (`cases_for_prebuild()`).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from xgemm import arrays  # noqa: E402
from xgemm.arrays import ArrayView  # noqa: E402
from xgemm.core.problem import Device, Epilogue, GemmProblem  # noqa: E402


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")]

TORCH_DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DT_NAME = {v: k for k, v in TORCH_DT.items()}
# relative error of one rounding to the output dtype (plus fp32 epilogue math)
REL = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -22}

# ------------------------------------------------------------------------------------------
# Cases (plain data). A layout word per operand: "row" (last dim contiguous) or "col".
#   (name, M, N, K, L, dtype, out_dtype, a, b, d, c_dtype|None, c_layout, alpha, beta, bcast)
# bcast: "" | "a" | "b" -- that operand is one matrix broadcast over the batch (stride 0).
# ------------------------------------------------------------------------------------------
SM90_CASES = [
    # ragged M / N / K around the tile edges (N, K multiples of 8 for 16-byte TMA strides)
    ("ragged-1", 1, 8, 8, 1, "bfloat16", "bfloat16", "row", "row", "row", None, "row", 1.0, 0.0, ""),
    ("ragged-2", 333, 200, 136, 1, "bfloat16", "bfloat16", "row", "row", "row", None, "row", 1.0, 0.0, ""),
    ("ragged-3", 1025, 520, 264, 1, "float16", "float16", "row", "row", "row", None, "row", 1.0, 0.0, ""),
    ("multiwave", 2100, 2056, 1032, 1, "bfloat16", "bfloat16", "row", "row", "row", None, "row", 1.0, 0.0, ""),
    # every majorness of A, B, D (M, N, K multiples of 8 so every side may be the contiguous one)
    *[(f"major-{a}{b}{d}", 296, 264, 200, 1, "bfloat16", "bfloat16", a, b, d, None, "row", 1.0, 0.0, "")
      for a in ("row", "col") for b in ("row", "col") for d in ("row", "col")],
    # output dtypes
    ("out-f32", 300, 264, 200, 1, "bfloat16", "float32", "row", "row", "row", None, "row", 1.0, 0.0, ""),
    ("out-f32-fp16", 296, 264, 200, 1, "float16", "float32", "col", "col", "row", None, "row", 1.0, 0.0, ""),
    # alpha / beta / C
    ("alpha", 300, 264, 200, 1, "bfloat16", "bfloat16", "row", "row", "row", None, "row", 2.5, 0.0, ""),
    ("beta-bf16", 300, 264, 200, 1, "bfloat16", "bfloat16", "row", "row", "row", "bfloat16", "row", 0.5, -1.5, ""),
    ("beta-f32-col", 296, 264, 200, 1, "float16", "float32", "row", "col", "row", "float32", "col", 1.0, 1.0, ""),
    ("beta-fp16-dcol", 296, 264, 200, 1, "float16", "float16", "row", "row", "col", "float16", "row", -1.0, 2.0, ""),
    ("beta0-nan-c", 300, 264, 200, 1, "bfloat16", "bfloat16", "row", "row", "row", "bfloat16", "row", 1.0, 0.0, ""),
    # batched, and one operand broadcast over the batch
    ("batched", 200, 136, 72, 3, "bfloat16", "bfloat16", "row", "row", "row", None, "row", 1.0, 0.0, ""),
    ("batched-c", 200, 136, 72, 3, "float16", "float32", "col", "row", "row", "float32", "row", 1.5, 0.5, ""),
    ("bcast-a", 200, 136, 72, 3, "bfloat16", "bfloat16", "row", "row", "row", None, "row", 1.0, 0.0, "a"),
    ("bcast-b", 200, 136, 72, 3, "bfloat16", "bfloat16", "row", "col", "row", None, "row", 1.0, 0.0, "b"),
]

SM80_CASES = [
    ("ragged", 333, 200, 136, 1, "bfloat16", "bfloat16", "row", "row", "row", None, "row", 1.0, 0.0, ""),
    ("ragged-k", 129, 136, 520, 1, "float16", "float16", "row", "row", "row", None, "row", 1.0, 0.0, ""),
    *[(f"major-{a}{b}{d}", 296, 264, 200, 1, "float16", "float16", a, b, d, None, "row", 1.0, 0.0, "")
      for a in ("row", "col") for b in ("row", "col") for d in ("row", "col")],
    ("out-f32", 300, 264, 200, 1, "bfloat16", "float32", "row", "row", "row", None, "row", 1.0, 0.0, ""),
    ("plus-c", 300, 264, 200, 1, "bfloat16", "bfloat16", "row", "row", "row", "bfloat16", "row", 1.0, 1.0, ""),
    ("plus-c-f32-col", 296, 264, 200, 1, "float16", "float32", "row", "row", "col", "float32", "col", 1.0, 1.0, ""),
    ("beta0-nan-c", 300, 264, 200, 1, "bfloat16", "bfloat16", "row", "row", "row", "bfloat16", "row", 1.0, 0.0, ""),
    ("batched-c", 200, 136, 72, 3, "bfloat16", "bfloat16", "row", "row", "row", "bfloat16", "row", 1.0, 1.0, ""),
    ("bcast-b", 200, 136, 72, 3, "float16", "float16", "row", "row", "row", None, "row", 1.0, 0.0, "b"),
]

# Every schedule / tile / cluster the policy table or the benchmark sweep may pick, on a problem
# with several tiles per CTA (pipeline wrap-around, pingpong hand-offs, ragged edges).
CONFIG_CASES = [
    # (tile_m, tile_n, cluster_m, cluster_n, pingpong, raster_m, swizzle)
    (128, 192, 2, 1, True, True, 8), (128, 192, 1, 2, True, False, 8), (128, 128, 2, 1, True, True, 4),
    (128, 160, 2, 1, True, True, 8), (128, 64, 1, 1, True, True, 1), (128, 256, 2, 1, False, True, 8),
    (128, 256, 1, 2, False, True, 8), (256, 128, 2, 1, False, True, 8), (256, 128, 1, 2, False, False, 8),
    (128, 128, 1, 1, False, True, 1), (256, 192, 2, 1, False, True, 8), (128, 128, 1, 2, True, False, 8),
]
CONFIG_SHAPE = (1000, 3080, 1032)
# The transposed run (D^T = B^T @ A^T on transposed views, SWAP_NOTE), which the policy picks for
# row-major A and B on the wave-aware rows: every SM90 case (each majorness, C, batch, broadcast)
# under two swapped configs.
SWAP_CONFIGS = [(128, 192, 2, 1, True, False, 8), (128, 128, 2, 1, True, True, 8)]
# The C path (TMA-loaded C, alpha/beta) and non-default majorness on the cluster configs, and
# configs on shapes chosen for their tile schedule.
CONFIG_C_CASES = [
    ((256, 128, 2, 1, False, True, 8),
     ("coop-c", 1000, 3080, 1032, 1, "bfloat16", "bfloat16", "row", "row", "row", "float32", "col", 0.5, -2.0, "")),
    ((128, 192, 1, 2, True, False, 8),
     ("pp-c", 1000, 3080, 1032, 1, "float16", "float32", "col", "col", "col", "bfloat16", "row", 1.0, 1.0, "")),
    ((128, 256, 2, 1, False, True, 8),
     ("coop-batched-c", 520, 1544, 264, 2, "bfloat16", "bfloat16", "row", "col", "row", "bfloat16", "row", 1.0, 1.0, "b")),
    # swizzle bands with a narrower last band (Sm90Gemm._tile_of): 22 M tiles = 11 clusters in
    # bands of 8 + 3 sweeping N; 11 N tiles in bands of 8 + 3 (and 3 M clusters, the last half
    # empty) sweeping M; 1x2 clusters, 6 N clusters in bands of 4 + 2, batched; 5 M tiles in bands
    # of 2 + 2 + 1
    ((128, 192, 2, 1, True, False, 8),
     ("bands-n", 2766, 1000, 264, 1, "bfloat16", "bfloat16", "row", "row", "row", None, "row", 1.0, 0.0, "")),
    ((128, 128, 2, 1, True, True, 8),
     ("bands-m", 600, 1368, 136, 1, "float16", "float16", "row", "row", "row", None, "row", 1.0, 0.0, "")),
    ((128, 128, 1, 2, True, True, 4),
     ("bands-m-1x2-batched", 520, 1288, 136, 2, "bfloat16", "bfloat16", "row", "row", "row", None, "row", 1.0, 0.0, "")),
    ((128, 192, 1, 2, True, False, 2),
     ("bands-n-1x2", 600, 1000, 200, 1, "bfloat16", "float32", "row", "col", "row", "float32", "row", 0.5, 1.0, "")),
]

# Split-K (Config.split): a tile's K cut into parts whose float32 sums the last part adds
# (Sm90Gemm._split_store, _split_sum). Parts that end past K (zero fill), ragged M / N, both schedules, every
# cluster shape, column-major operands, alpha, batched with a broadcast B, the transposed run.
#   (config with split, case, swap)
SPLIT_CASES = [
    ((128, 192, 2, 1, True, True, 8, 0, True, 4),
     ("split4-kv_a", 4096, 576, 7168, 1, "bfloat16", "bfloat16", "row", "row", "row", None, "row", 1.0, 0.0, ""), False),
    ((128, 128, 2, 1, True, True, 8, 0, True, 3),
     ("split3-ragged", 1000, 520, 1032, 1, "float16", "float16", "row", "row", "row", None, "row", 1.0, 0.0, ""), False),
    ((256, 128, 2, 1, False, True, 8, 0, True, 2),
     ("split2-coop-batched", 520, 1288, 1032, 2, "bfloat16", "bfloat16", "row", "col", "row", None, "row", 1.0, 0.0,
      "b"), False),
    ((128, 192, 1, 2, True, False, 2, 0, True, 5),
     ("split5-1x2-col-f32", 600, 1000, 2056, 1, "bfloat16", "float32", "col", "col", "col", None, "row", 2.5, 0.0, ""),
     False),
    ((128, 64, 1, 1, True, True, 1, 0, True, 8),
     ("split8-128x64", 200, 264, 4104, 1, "bfloat16", "bfloat16", "row", "row", "row", None, "row", 1.0, 0.0, ""), False),
    ((128, 128, 1, 1, False, True, 1, 0, True, 2),
     ("split2-coop-1x1", 300, 264, 2048, 1, "float16", "float16", "row", "row", "row", None, "row", 1.0, 0.0, ""), False),
    ((128, 160, 2, 1, True, True, 8, 0, True, 2),
     ("split2-128x160", 2048, 576, 7168, 1, "float16", "float16", "row", "row", "row", None, "row", 1.0, 0.0, ""), False),
    ((128, 192, 2, 1, True, True, 8, 0, True, 3),
     ("split3-transposed", 7168, 576, 4096, 1, "bfloat16", "bfloat16", "row", "row", "row", None, "row", 1.0, 0.0, ""),
     True),
]

# ------------------------------------------------------------------------------------------
# Building operands and problems
# ------------------------------------------------------------------------------------------
def _ints(shape, device, gen):
    return torch.randint(-5, 6, shape, generator=gen, dtype=torch.int32, device="cpu").to(device)


def matrix(values, dtype: str, layout: str):
    """values (..., R, C) as `dtype` with the last two dims row- or column-major."""
    t = values.to(TORCH_DT[dtype])
    if layout == "col":
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    return t.contiguous()


def view(t, device: Device) -> ArrayView:
    return ArrayView(obj=t, framework="torch", device=device, ptr=t.data_ptr(), shape=tuple(t.shape),
                     strides=tuple(t.stride()), dtype=DT_NAME[t.dtype], itemsize=t.element_size(),
                     readonly=False)


def build_case(case, device="cuda", seed=0):
    """Tensors + ArrayViews + GemmProblem for one case (device="cpu" builds the same layouts
    for prebuilding compile classes on a machine with no GPU)."""
    (_, m, n, k, L, dt, out_dt, la, lb, ld, c_dt, lc, alpha, beta, bcast) = case
    gen = torch.Generator().manual_seed(seed)
    batch = (L,) if L > 1 else ()
    a = matrix(_ints(((1,) if bcast == "a" else batch) + (m, k), device, gen), dt, la)
    b = matrix(_ints(((1,) if bcast == "b" else batch) + (k, n), device, gen), dt, lb)
    if bcast == "a":
        a = a.expand(L, m, k)
    if bcast == "b":
        b = b.expand(L, k, n)
    c = None
    if c_dt is not None:
        c = matrix(_ints(batch + (m, n), device, gen), c_dt, lc)
        if beta == 0.0:
            c = c.fill_(float("nan"))      # must never be read
    out = matrix(torch.zeros(batch + (m, n)), out_dt, ld).to(device)
    dev = Device("cuda", 0, (9, 0))
    va, vb, vo = view(a, dev), view(b, dev), view(out, dev)
    vc = view(c, dev) if c is not None else None
    ep = Epilogue(alpha=alpha, beta=beta, has_c=c is not None, out_dtype=out_dt)
    prob = GemmProblem(m=m, n=n, k=k, batch=batch, a=arrays.operand(va), b=arrays.operand(vb),
                       c=arrays.operand(vc) if vc is not None and beta != 0.0 else None, epilogue=ep,
                       framework="torch", device=dev)
    return dict(a=a, b=b, c=c, out=out, views=(va, vb, vc), vout=vo, problem=prob)


def reference(a, b, c, alpha, beta):
    ref = alpha * torch.matmul(a.double(), b.double())
    if c is not None and beta != 0.0:
        ref = ref + beta * c.double()
    return ref


def check(out, ref, out_dtype: str, what: str):
    got = out.double()
    assert not torch.isnan(got).any(), f"{what}: {int(torch.isnan(got).sum())} outputs never written"
    err = (got - ref).abs()
    tol = REL[out_dtype] * ref.abs() + 1e-6
    bad = err > tol
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.numel()} wrong; worst |err| "
                           f"{float(err.max()):.4g} at {tuple(int(i) for i in torch.nonzero(bad)[0])}")


def run_kernel(kernel, case, policy=None):
    d = build_case(case)
    prob = d["problem"]
    reason = kernel.supports(prob)
    assert reason is None, f"{kernel.name} declined {case[0]}: {reason}"
    pol = policy or kernel.policy(prob)
    d["out"].fill_(float("nan"))
    stream = torch.cuda.current_stream().cuda_stream
    kernel.run(prob, pol, d["views"], d["vout"], stream)
    torch.cuda.synchronize()
    alpha, beta = case[12], case[13]
    check(d["out"], reference(d["a"], d["b"], d["c"], alpha, beta), case[6], f"{kernel.name}/{case[0]}")
    return d


def cases_for_prebuild():
    """(kernel module, case, policy-or-None) for every launch this file makes (CPU-safe)."""
    from xgemm.kernels import cute_gemm_sm90 as k90
    from xgemm.kernels import cute_mma_sm80 as k80
    out = [(k90, c, None) for c in SM90_CASES] + [(k80, c, None) for c in SM80_CASES]
    for cfg in CONFIG_CASES:
        out.append((k90, _config_case(cfg), k90.Config(*cfg).policy("forced")))
    for cfg, case in CONFIG_C_CASES:
        out.append((k90, case, k90.Config(*cfg).policy("forced")))
    for cfg in SWAP_CONFIGS:
        out += [(k90, c, k90.Config(*cfg).policy("forced", swap=True)) for c in SM90_CASES]
    out += [(k90, case, k90.Config(*cfg).policy("forced", swap=swap)) for cfg, case, swap in SPLIT_CASES]
    return out


def _config_case(cfg):
    m, n, k = CONFIG_SHAPE
    return (f"cfg-{cfg}", m, n, k, 1, "bfloat16", "bfloat16", "row", "row", "row", None, "row",
            1.0, 0.0, "")


# ------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", SM90_CASES, ids=[c[0] for c in SM90_CASES])
def test_sm90(case):
    from xgemm.kernels.cute_gemm_sm90 import KERNEL
    run_kernel(KERNEL, case)


@pytest.mark.parametrize("cfg", SWAP_CONFIGS, ids=["pp192-2x1", "pp128-2x1"])
@pytest.mark.parametrize("case", SM90_CASES, ids=[c[0] for c in SM90_CASES])
def test_sm90_transposed(case, cfg):
    from xgemm.kernels.cute_gemm_sm90 import KERNEL, Config
    run_kernel(KERNEL, case, Config(*cfg).policy("forced", swap=True))


@pytest.mark.parametrize("cfg", CONFIG_CASES, ids=[str(c) for c in CONFIG_CASES])
def test_sm90_configs(cfg):
    from xgemm.kernels.cute_gemm_sm90 import KERNEL, Config
    run_kernel(KERNEL, _config_case(cfg), Config(*cfg).policy("forced"))


@pytest.mark.parametrize("cfg,case", CONFIG_C_CASES, ids=[c[1][0] for c in CONFIG_C_CASES])
def test_sm90_configs_with_c(cfg, case):
    from xgemm.kernels.cute_gemm_sm90 import KERNEL, Config
    run_kernel(KERNEL, case, Config(*cfg).policy("forced"))


@pytest.mark.parametrize("cfg,case,swap", SPLIT_CASES, ids=[c[1][0] for c in SPLIT_CASES])
def test_sm90_split_k(cfg, case, swap):
    """Each split-K class, three launches in a row on one stream: the flags each launch leaves at
    zero are what the next one counts from, so a flag left set shows as a wrong or hung second run."""
    from xgemm.kernels.cute_gemm_sm90 import KERNEL, Config
    d = run_kernel(KERNEL, case, Config(*cfg).policy("forced", swap=swap))
    for _ in range(2):
        d["out"].fill_(float("nan"))
        KERNEL.run(d["problem"], Config(*cfg).policy("forced", swap=swap), d["views"], d["vout"],
                   torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        check(d["out"], reference(d["a"], d["b"], d["c"], case[12], case[13]), case[6], f"split again/{case[0]}")


def test_split_k_policy_graph_and_streams():
    """The policy's own split pick through xgemm.matmul (random normal bf16 against float64), on two
    streams at once (a workspace each), and replayed from a CUDA graph captured after a warm call."""
    import xgemm
    gen = torch.Generator(device="cuda").manual_seed(2)
    a = torch.randn(512, 8192, generator=gen, device="cuda").to(torch.bfloat16)
    b = torch.randn(8192, 1024, generator=gen, device="cuda").to(torch.bfloat16)
    assert xgemm.explain(a, b).policy.split_k > 1, xgemm.explain(a, b)
    ref = torch.matmul(a.double(), b.double())

    def close(d, what):
        rel = float(torch.linalg.norm(d.double() - ref) / torch.linalg.norm(ref))
        assert rel < 5e-3, (what, rel)
    close(xgemm.matmul(a, b), "eager")
    streams = [torch.cuda.Stream() for _ in range(2)]
    outs = []
    for s in streams:
        with torch.cuda.stream(s):
            outs.append([xgemm.matmul(a, b) for _ in range(3)])
    torch.cuda.synchronize()
    for i, o in enumerate(outs):
        for d in o:
            close(d, f"stream {i}")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        xgemm.matmul(a, b)                          # this stream's buffers, before the capture
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            d = xgemm.matmul(a, b)
    for _ in range(3):
        d.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        close(d, "graph replay")


@pytest.mark.parametrize("case", SM80_CASES, ids=[c[0] for c in SM80_CASES])
def test_sm80_forced(case):
    from xgemm.kernels.cute_mma_sm80 import KERNEL
    run_kernel(KERNEL, case)


def test_sm90_repeatable():
    """Same inputs, many launches: a race shows up as a result that moves."""
    from xgemm.kernels.cute_gemm_sm90 import KERNEL
    case = SM90_CASES[3]
    d = build_case(case)
    first = None
    for _ in range(5):
        d["out"].fill_(float("nan"))
        KERNEL.run(d["problem"], KERNEL.policy(d["problem"]), d["views"], d["vout"],
                   torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        first = d["out"].clone() if first is None else first
        assert torch.equal(d["out"], first)


def test_sm90_random_normal_big():
    """Random normal bf16 at a policy-table 'big' shape against float64 (relative Frobenius)."""
    from xgemm.kernels.cute_gemm_sm90 import KERNEL
    case = ("big", 4096, 4096, 4096, 1, "bfloat16", "bfloat16", "row", "row", "row", None, "row",
            1.0, 0.0, "")
    d = build_case(case)
    gen = torch.Generator(device="cuda").manual_seed(1)
    d["a"].copy_(torch.randn(d["a"].shape, generator=gen, device="cuda"))
    d["b"].copy_(torch.randn(d["b"].shape, generator=gen, device="cuda"))
    d["out"].fill_(float("nan"))
    KERNEL.run(d["problem"], KERNEL.policy(d["problem"]), d["views"], d["vout"],
               torch.cuda.current_stream().cuda_stream)
    ref = torch.matmul(d["a"].double(), d["b"].double())
    rel = float(torch.linalg.norm(d["out"].double() - ref) / torch.linalg.norm(ref))
    assert rel < 5e-3, rel


@pytest.mark.parametrize("forced", ["cute_gemm_sm90", "cute_mma_sm80"])
def test_through_api(forced):
    """xgemm.gemm with the policy forced onto each kernel (the API folds batch dims, allocates D)."""
    import xgemm
    gen = torch.Generator().manual_seed(3)
    a = _ints((2, 3, 136, 72), "cuda", gen).to(torch.bfloat16)
    b = _ints((72, 264), "cuda", gen).to(torch.bfloat16)
    c = _ints((2, 3, 136, 264), "cuda", gen).to(torch.bfloat16)
    with xgemm.core.policy.force(forced):
        d = xgemm.gemm(a, b, c, alpha=1.0, beta=1.0)
        e = xgemm.matmul(a, b)
    torch.cuda.synchronize()
    check(d, reference(a, b, c, 1.0, 1.0), "bfloat16", f"api/{forced}/gemm")
    check(e, reference(a, b, None, 1.0, 0.0), "bfloat16", f"api/{forced}/matmul")


def test_sm80_declines_alpha():
    from xgemm.kernels.cute_mma_sm80 import KERNEL
    case = ("alpha", 64, 64, 64, 1, "bfloat16", "bfloat16", "row", "row", "row", None, "row", 2.0, 0.0, "")
    reason = KERNEL.supports(build_case(case)["problem"])
    assert reason is not None and "alpha" in reason
