"""gluon_splitk_sm90 on an H200: through its kernel protocol at every split (forced policies), and
through xgemm.matmul (torch eager) and jax.jit, where the dispatch table must pick it for skinny M.
Integer inputs in [-5, 5]: products and fp32 sums are exact, so the float64 reference is exact and
the only error allowed is the final rounding. Outputs are NaN-poisoned before every launch.
Needs the prebuilt cubins (python -m xgemm build-cache)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from helpers import hopper, kernel_view  # noqa: E402

from xgemm import arrays  # noqa: E402
from xgemm.core.problem import COL, ROW, Device, Epilogue, GemmProblem  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not hopper(), reason="needs a Hopper (sm_90) GPU")]

TORCH_DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
REL = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -22}
CASES = [  # (M, N, K, in dtype, out dtype, B layout, BN, split, alpha)
    (1, 8, 1024, "bfloat16", "bfloat16", "row", 64, 2, 1.0),
    (17, 200, 1032, "bfloat16", "bfloat16", "row", 64, 4, 1.0),      # ragged M, N tile, K tail
    (64, 8192, 8192, "bfloat16", "bfloat16", "row", 64, 1, 1.0),     # the benchmark shape's pick
    (64, 4096, 4096, "bfloat16", "bfloat16", "row", 128, 2, 1.0),
    (64, 520, 4096, "float16", "float32", "col", 128, 8, 1.0),
    (40, 1024, 2048, "float16", "float16", "col", 64, 1, 0.5),       # alpha
    (64, 264, 136, "bfloat16", "float32", "row", 64, 8, 1.0),        # 3 K blocks over 8 CTAs: 5 idle
    (100, 136, 1024, "bfloat16", "bfloat16", "row", 128, 4, -2.0),   # two tile rows (run() tiles any M)
]


def _ints(m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-5, 6, (m, k), generator=g).double(), torch.randint(-5, 6, (k, n), generator=g).double()


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:3])) + f"-{c[3]}-{c[4]}-b{c[5]}-n{c[6]}-x{c[7]}")
def test_exact_every_split(case):
    from xgemm.kernels import gluon_splitk_sm90 as sk
    m, n, k, dt, odt, lb, bn, split, alpha = case
    dev = Device("cuda", torch.cuda.current_device(), torch.cuda.get_device_capability())
    a64, b64 = _ints(m, n, k, m * 31 + n)
    a = a64.to(TORCH_DT[dt]).cuda()
    b = (b64.t().contiguous().to(TORCH_DT[dt]).cuda().t() if lb == "col" else b64.to(TORCH_DT[dt]).cuda())
    out = torch.full((m, n), float("nan"), dtype=TORCH_DT[odt], device="cuda")
    va, vb, vo = kernel_view(a), kernel_view(b), kernel_view(out)
    prob = GemmProblem(m=m, n=n, k=k, batch=(), a=arrays.operand(va), b=arrays.operand(vb), c=None,
                       epilogue=Epilogue(alpha=alpha, out_dtype=odt), framework="torch", device=dev)
    assert prob.b.majorness == (COL if lb == "col" else ROW)
    pol = sk.policy_of(sk.Config(dt, odt, bn, *sk._tile(bn, split), split, lb == "col"))
    sk.KERNEL.run(prob, pol, (va, vb, None), vo, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    ref = alpha * (a64 @ b64)
    got = out.double().cpu()
    assert not torch.isnan(got).any(), "elements left unwritten"
    err = ((got - ref).abs() / ref.abs().clamp_min(1.0)).max().item()
    assert err <= REL[odt], err


def test_repeat_calls_are_deterministic():
    """The split-K sum adds the CTAs' partials in a fixed order: bitwise equal results."""
    from xgemm.kernels import gluon_splitk_sm90 as sk
    g = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(64, 8192, device="cuda", generator=g).bfloat16()
    b = torch.randn(8192, 4096, device="cuda", generator=g).bfloat16()
    dev = Device("cuda", torch.cuda.current_device(), torch.cuda.get_device_capability())
    outs = []
    for _ in range(3):
        out = torch.full((64, 4096), float("nan"), dtype=torch.float32, device="cuda")
        va, vb, vo = kernel_view(a), kernel_view(b), kernel_view(out)
        prob = GemmProblem(m=64, n=4096, k=8192, batch=(), a=arrays.operand(va), b=arrays.operand(vb), c=None,
                           epilogue=Epilogue(out_dtype="float32"), framework="torch", device=dev)
        pol = sk.policy_of(sk.Config("bfloat16", "float32", 64, *sk._tile(64, 4), 4, False))
        sk.KERNEL.run(prob, pol, (va, vb, None), vo, torch.cuda.current_stream().cuda_stream)
        outs.append(out)
    torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2])
    ref = a.double() @ b.double()
    assert ((outs[0].double() - ref).norm() / ref.norm()).item() < 1e-5


@pytest.mark.parametrize("m,n,k", [(64, 8192, 8192), (8, 4096, 2048), (48, 1024, 4096)])
def test_matmul_picks_it_for_skinny_m(m, n, k):
    import xgemm
    a64, b64 = _ints(m, n, k, 7)
    a, b = a64.bfloat16().cuda(), b64.bfloat16().cuda()
    plan = xgemm.explain(a, b)
    assert plan.kernel_name == "gluon_splitk_sm90", str(plan)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    for _ in range(2):              # the second call takes the bound fast path
        out.fill_(float("nan"))
        xgemm.matmul(a, b, out=out)
        got = xgemm.matmul(a, b)
    torch.cuda.synchronize()
    ref = a64 @ b64
    for y in (out, got):
        assert not torch.isnan(y).any()
        assert ((y.double().cpu() - ref).abs() / ref.abs().clamp_min(1.0)).max().item() <= REL["bfloat16"]


def _check_under_jit(m, n, k, seed, calls=1):
    """xgemm.matmul inside jax.jit on integer inputs: an xgemm custom call, exact up to rounding."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import numpy as np

    import xgemm
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax has no GPU here")
    a64, b64 = _ints(m, n, k, seed)
    a = jnp.asarray(a64.numpy(), dtype=jnp.bfloat16)
    b = jnp.asarray(b64.numpy(), dtype=jnp.bfloat16)
    f = jax.jit(lambda a, b: xgemm.matmul(a, b))
    assert "xgemm" in f.lower(a, b).as_text()
    ref = (a64 @ b64).numpy()
    for _ in range(calls):
        got = np.asarray(f(a, b).astype(jnp.float32), dtype=np.float64)
        assert np.max(np.abs(got - ref) / np.maximum(np.abs(ref), 1.0)) <= REL["bfloat16"]


def test_jit_uses_it():
    _check_under_jit(32, 2048, 4096, 11)


@pytest.mark.parametrize("kind", ["col", "misaligned"])
def test_out_it_cannot_write_goes_elsewhere(kind):
    """out= column-major or 2-byte aligned: another kernel writes it (the split-K kernel declines
    through the Epilogue's out_majorness / out_alignment), with the right values and nothing
    written outside out."""
    import xgemm
    a64, b64 = _ints(64, 4096, 4096, 5)
    a, b = a64.bfloat16().cuda(), b64.bfloat16().cuda()
    if kind == "col":
        buf = torch.full((4096, 64), float("nan"), dtype=torch.bfloat16, device="cuda")
        out = buf.t()
    else:
        buf = torch.full((64 * 4096 + 2,), float("nan"), dtype=torch.bfloat16, device="cuda")
        out = buf[1:-1].view(64, 4096)
    assert xgemm.matmul(a, b, out=out) is out
    torch.cuda.synchronize()
    ref = a64 @ b64
    assert ((out.double().cpu() - ref).abs() / ref.abs().clamp_min(1.0)).max().item() <= REL["bfloat16"]
    if kind == "misaligned":
        assert torch.isnan(buf[0]) and torch.isnan(buf[-1]), "wrote outside out"


# ----------------------------------------------------------------------------------------------
# Stream-K: (tile, K block) units shared evenly by a one-wave grid, parts summed in a workspace
# ----------------------------------------------------------------------------------------------
# Tiles other than STREAMK are the tune set's (bf16, B row-major): build them with the sweep's
# entries (docs/development.md, "The split-K kernel's tune entries")
STREAMK_CASES = [  # (M, N, K, in dtype, out dtype, B layout, (bn, bk, stages), alpha)
    (1, 18432, 7168, "bfloat16", "bfloat16", "row", (128, 64, 4), 1.0),   # 61 units a CTA, tiles of 112
    (16, 3072, 8192, "bfloat16", "float32", "row", (128, 64, 4), 1.0),    # every tile shared by ~9 CTAs
    (5, 1000, 2056, "float16", "float16", "col", (128, 64, 4), -0.5),     # N, K tails; B K-major
    (64, 4096, 4096, "bfloat16", "bfloat16", "row", (64, 128, 4), 1.0),
    (33, 520, 1024, "bfloat16", "bfloat16", "row", (128, 128, 4), 2.0),   # the grid shrinks (MIN_UNITS)
    (1, 24, 256, "bfloat16", "bfloat16", "row", (64, 256, 3), 1.0),       # one unit: a one-CTA grid
    (2, 8192, 1024, "float16", "float32", "row", (128, 64, 4), 1.0),      # tiles of 16 units
]


def _streamk_run(m, n, k, dt, odt, lb, tile, alpha, a, b, stream=None):
    from xgemm.kernels import gluon_splitk_sm90 as sk
    from xgemm.runtime import gluon_cache
    dev = Device("cuda", torch.cuda.current_device(), torch.cuda.get_device_capability())
    out = torch.full((m, n), float("nan"), dtype=TORCH_DT[odt], device="cuda")
    va, vb, vo = kernel_view(a), kernel_view(b), kernel_view(out)
    prob = GemmProblem(m=m, n=n, k=k, batch=(), a=arrays.operand(va), b=arrays.operand(vb), c=None,
                       epilogue=Epilogue(alpha=alpha, out_dtype=odt), framework="torch", device=dev)
    cfg = sk.Config(dt, odt, *tile, 1, lb == "col", True)
    if gluon_cache.lookup(cfg.key, compile=False) is None:
        pytest.skip(f"{cfg.key} is not built (a tune entry: docs/development.md)")
    pol = sk.policy_of(cfg)
    s = stream or torch.cuda.current_stream()
    sk.KERNEL.run(prob, pol, (va, vb, None), vo, s.cuda_stream)
    return out


@pytest.mark.parametrize("case", STREAMK_CASES,
                         ids=lambda c: "x".join(map(str, c[:3])) + f"-{c[3]}-{c[4]}-b{c[5]}-n{c[6][0]}k{c[6][1]}")
def test_streamk_exact_three_runs(case):
    """Three launches in a row, each on a NaN-poisoned output: a flag left non-zero by one launch
    would leave a tile unwritten (or summed wrong) in the next."""
    m, n, k, dt, odt, lb, tile, alpha = case
    a64, b64 = _ints(m, n, k, m * 7 + n)
    a = a64.to(TORCH_DT[dt]).cuda()
    b = (b64.t().contiguous().to(TORCH_DT[dt]).cuda().t() if lb == "col" else b64.to(TORCH_DT[dt]).cuda())
    ref = alpha * (a64 @ b64)
    for _ in range(3):
        out = _streamk_run(m, n, k, dt, odt, lb, tile, alpha, a, b)
        torch.cuda.synchronize()
        got = out.double().cpu()
        assert not torch.isnan(got).any(), "elements left unwritten"
        err = ((got - ref).abs() / ref.abs().clamp_min(1.0)).max().item()
        assert err <= REL[odt], err


def test_streamk_deterministic_and_two_streams():
    """Random inputs: bitwise equal results run after run (the parts are summed in CTA order), and
    on two streams at once (each stream has its own workspace and flags)."""
    g = torch.Generator(device="cuda").manual_seed(5)
    m, n, k = 4, 18432, 7168
    a = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    b = torch.randn(k, n, device="cuda", generator=g).bfloat16()
    args = (m, n, k, "bfloat16", "float32", "row", (128, 64, 4), 1.0, a, b)
    first = _streamk_run(*args)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    outs = []
    for _ in range(4):
        for s in (s1, s2):
            with torch.cuda.stream(s):
                outs.append(_streamk_run(*args, stream=s))
    torch.cuda.synchronize()
    for o in outs:
        assert torch.equal(o, first)
    ref = a.double() @ b.double()
    assert ((first.double() - ref).norm() / ref.norm()).item() < 1e-5


def test_streamk_through_matmul_eager_and_graph():
    """xgemm.matmul picks stream-K at a decode shape the cluster split leaves unbalanced; under a CUDA
    graph capture on a fresh stream (no workspace yet) it runs the cluster split instead."""
    import xgemm
    m, n, k = 1, 18432, 7168
    a64, b64 = _ints(m, n, k, 9)
    a, b = a64.bfloat16().cuda(), b64.bfloat16().cuda()
    plan = xgemm.explain(a, b)
    assert plan.kernel_name == "gluon_splitk_sm90" and plan.policy.schedule == "stream-k", str(plan)
    ref = a64 @ b64
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    for _ in range(2):
        out.fill_(float("nan"))
        xgemm.matmul(a, b, out=out)
    got = xgemm.matmul(a, b)
    s = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    gout = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    with torch.cuda.graph(graph, stream=s):
        xgemm.matmul(a, b, out=gout)
    graph.replay()
    torch.cuda.synchronize()
    for y in (out, got, gout):
        assert not torch.isnan(y).any()
        assert ((y.double().cpu() - ref).abs() / ref.abs().clamp_min(1.0)).max().item() <= REL["bfloat16"]


def test_streamk_under_jit():
    """Three calls: the flags (zeros XLA passes in) and the workspace (XLA scratch) of each."""
    _check_under_jit(2, 18432, 7168, 13, calls=3)
