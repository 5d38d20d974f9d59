"""The public API on CUDA tensors: routing to the GPU kernels, layouts, batch, out=, explain().

Outputs are poisoned with NaN first so unwritten elements show; inputs are integers in [-5, 5]
so fp32 accumulation is exact and results are compared for equality with float64 references.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import xgemm  # noqa: E402

pytestmark = pytest.mark.gpu
DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def ints(*shape, dtype="float32", layout="row"):
    g = torch.randint(-5, 6, shape, dtype=torch.float64)
    if layout == "col":     # same values, column-major storage
        x = g.transpose(-1, -2).contiguous().to(DT[dtype]).cuda().transpose(-1, -2)
    elif layout == "sliced":
        big = torch.zeros(*shape[:-1], 2 * shape[-1], dtype=torch.float64)
        big[..., ::2] = g
        x = big.to(DT[dtype]).cuda()[..., ::2]
    else:
        x = g.to(DT[dtype]).cuda()
    return x, g


def exact(d, ref, dtype):
    torch.testing.assert_close(d.double().cpu(), ref.to(DT[dtype]).double(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("la,lb", [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col"), ("sliced", "row")])
@pytest.mark.parametrize("mnk", [(128, 128, 128), (257, 131, 67), (64, 512, 1024), (1, 96, 40)])
def test_matmul_routes_and_matches(dtype, la, lb, mnk):
    m, n, k = mnk
    a, ga = ints(m, k, dtype=dtype, layout=la)
    b, gb = ints(k, n, dtype=dtype, layout=lb)
    out = torch.full((m, n), float("nan"), dtype=DT[dtype], device="cuda")
    d = xgemm.matmul(a, b, out=out)
    torch.cuda.synchronize()
    assert d is out
    exact(d, ga @ gb, dtype)
    plan = xgemm.explain(a, b)
    assert (plan.kernel_name != "reference") or plan.declined, str(plan)
    if la == "sliced" and m > 1:      # a 1-row slice is a valid column-major matrix: no copy needed
        assert plan.copies, "a strided operand must be compacted and the copy reported"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batched_broadcast_gemm_alpha_beta(dtype):
    a, ga = ints(3, 1, 64, 48, dtype=dtype)
    b, gb = ints(4, 48, 80, dtype=dtype)
    c, gc = ints(80, dtype=dtype)
    d = xgemm.gemm(a, b, c, alpha=2.0, beta=-1.0)
    exact(d, 2.0 * (ga @ gb) - gc, dtype)


def test_beta_zero_with_nan_c_on_gpu():
    a, ga = ints(64, 32)
    b, gb = ints(32, 48)
    c = torch.full((64, 48), float("nan"), device="cuda")
    exact(xgemm.gemm(a, b, c, alpha=1.0, beta=0.0), ga @ gb, "float32")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape,axis", [((64, 1000), -1), ((8, 65536), -1), ((3, 5, 300), 1), ((4097, 256), 0)])
def test_softmax_routes_and_matches(dtype, shape, axis):
    x = (torch.randn(*shape, dtype=torch.float64) * 3).to(DT[dtype]).cuda()
    y = xgemm.softmax(x, axis=axis)
    ref = torch.softmax(x.double(), axis)
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)
    assert y.dtype == x.dtype and not torch.isnan(y).any()


def test_current_stream_is_used():
    s = torch.cuda.Stream()
    a, ga = ints(512, 512)
    b, gb = ints(512, 512)
    with torch.cuda.stream(s):
        d = xgemm.matmul(a, b)
    s.synchronize()
    exact(d, ga @ gb, "float32")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_repeat_calls_through_the_fast_path_stay_exact(dtype):
    from xgemm.torch import fastpath
    for i in range(4):                       # same signature, fresh buffers: calls 2..4 skip planning
        a, ga = ints(192, 96, dtype=dtype)
        b, gb = ints(96, 160, dtype=dtype, layout="col")
        c, gc = ints(192, 160, dtype=dtype)
        exact(xgemm.gemm(a, b, c, alpha=1.0, beta=1.0), ga @ gb + gc, dtype)
        x = (torch.randn(33, 2000, dtype=torch.float64) * 3).to(DT[dtype]).cuda()
        torch.testing.assert_close(xgemm.softmax(x).double(), torch.softmax(x.double(), -1), rtol=1e-2, atol=1e-2)
    assert fastpath.kept("gemm") and fastpath.kept("softmax")


def test_info_lists_the_gpus_through_the_driver():
    from xgemm.__main__ import _gpus
    gpus = _gpus()
    assert len(gpus) == torch.cuda.device_count(), gpus
    props = torch.cuda.get_device_properties(0)
    assert gpus[0] == f"cuda:0 {props.name} sm_{props.major}{props.minor} {props.multi_processor_count} SMs"


UNALIGNED = [
    # (id, A shape, B shape, C shape or None, a view of A offset by one element)
    ("k-and-n", (300, 999), (999, 1001), None, False),
    ("n-only", (256, 512), (512, 1001), None, False),
    ("with-c", (77, 136), (136, 1003), (77, 1003), False),
    ("batched-bcast-b", (3, 100, 999), (999, 1001), None, False),
    ("offset-base", (128, 256), (256, 136), None, True),
    ("vector", (300, 999), (999,), None, False),
]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", UNALIGNED, ids=[c[0] for c in UNALIGNED])
@pytest.mark.parametrize("with_out", [False, True])
def test_unaligned_half_runs_on_padded_copies(dtype, case, with_out):
    """Rows that are not a multiple of 16 bytes (or a base off 16): a tensor-core kernel runs on
    16-byte-aligned zero-padded copies (reported by explain()), and the result is exact."""
    _, sa, sb, sc, offset = case
    a, ga = ints(*sa[:-1], sa[-1] + offset, dtype=dtype)
    if offset:
        a, ga = a[..., 1:], ga[..., 1:]
    b, gb = ints(*sb, dtype=dtype)
    c, gc = ints(*sc, dtype=dtype) if sc else (None, None)
    ref = (ga @ gb) if c is None else 2.0 * (ga @ gb) - gc
    out = torch.full(tuple(ref.shape), float("nan"), dtype=DT[dtype], device="cuda") if with_out else None
    d = xgemm.gemm(a, b, c, alpha=2.0, beta=-1.0, out=out) if c is not None else xgemm.matmul(a, b, out=out)
    torch.cuda.synchronize()
    assert d.shape == ref.shape and (d is out if with_out else d.is_contiguous())
    exact(d, ref, dtype)
    plan = xgemm.explain(a, b, c, alpha=2.0, beta=-1.0) if c is not None else xgemm.explain(a, b)
    assert plan.kernel_name != "reference", str(plan)
    assert any("16-byte-aligned" in cp for cp in plan.copies), str(plan)


@pytest.mark.parametrize("n", [63, 64])
@pytest.mark.parametrize("out_dtype", [None, "float32"])
@pytest.mark.parametrize("contiguous", [False, True])
def test_one_row_with_an_arbitrary_row_stride(n, out_dtype, contiguous):
    """Issue 22: A of shape (1, 8) from (8, 1).t() has strides (1, 1) (and .contiguous() keeps
    them: torch ignores a size-1 dim's stride); the Gluon matmul took the (padded) problem and
    raised TMA's ValueError at launch. A kernel that accepts it must run it."""
    g_a = torch.randint(-5, 6, (8, 1), dtype=torch.float64)
    g_b = torch.randint(-5, 6, (n, 8), dtype=torch.float64)
    a = g_a.to(torch.float16).cuda().t()
    b = g_b.to(torch.float16).cuda().t()
    if contiguous:
        a = a.contiguous()
    out = None
    if out_dtype is not None:
        out = torch.full((1, n), float("nan"), dtype=DT[out_dtype], device="cuda")
    d = xgemm.matmul(a, b, out=out)
    exact(d, g_a.t() @ g_b.t(), out_dtype or "float16")


def test_numpy_and_cuda_operands_get_a_device_error():
    """Issue 22: a NumPy array first and a CUDA tensor second gave a FrameworkError from DLPack."""
    import numpy as np
    a = np.ones((3, 4), np.float32)
    b = torch.ones(4, 5, device="cuda")
    with pytest.raises(xgemm.errors.DeviceError, match="b is on cuda:0.*move b to the CPU"):
        xgemm.matmul(a, b)
    with pytest.raises(xgemm.errors.DeviceError, match="a is on cuda:0 and b on cpu"):
        xgemm.matmul(b.T.contiguous(), a.T.copy())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", ["out", "a", "both", "issue"])
def test_extent_one_dims_with_any_stride(dtype, case):
    """torch's (n, 1).t() is (1, n) with strides (1, 1); the kernels get the dense stride of the
    same memory (issue 22: cute_gemm_sm90 refused the real one at launch with a raw ValueError)."""
    if case == "issue":                  # the reproducer: (1, 8) @ (8, 63) and (8, 64)
        for n in (63, 64):
            a = torch.randint(-5, 6, (8, 1), dtype=DT[dtype], device="cuda").t()
            b = torch.randint(-5, 6, (n, 8), dtype=DT[dtype], device="cuda").t()
            exact(xgemm.matmul(a, b), a.double().cpu() @ b.double().cpu(), dtype)
        return
    a = torch.randint(-5, 6, (64, 1), dtype=DT[dtype], device="cuda").t() if case in ("a", "both") else \
        torch.randint(-5, 6, (1, 64), dtype=DT[dtype], device="cuda")
    b, gb = ints(64, 64, dtype=dtype)
    out = torch.full((64, 1), float("nan"), dtype=DT[dtype], device="cuda").t() if case in ("out", "both") else None
    d = xgemm.matmul(a, b, out=out)
    exact(d, a.double().cpu() @ gb, dtype)
    if out is not None:
        assert d is out


def test_launches_from_threads_without_a_context():
    """A thread that has made no CUDA runtime call has no current context: torch's autograd
    workers (the 2026-12-02 run's gated backward failed there with CUDA_ERROR_INVALID_CONTEXT) and
    fresh user threads. Each kernel family launches from one, eagerly and in a backward pass."""
    import threading
    a, ga = ints(256, 512, dtype="bfloat16")
    b, gb = ints(512, 384, dtype="bfloat16")
    out, errors = {}, []

    def work():
        try:
            out["matmul"] = xgemm.matmul(a, b)                     # CuTe (TVM-FFI)
            out["softmax"] = xgemm.softmax(a.float())               # Gluon (driver launch)
            out["repeat"] = xgemm.matmul(a, b)                      # the fast path
        except Exception as exc:     # noqa: BLE001 -- reported below, with the thread's traceback
            errors.append(exc)
    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert not errors, errors
    exact(out["matmul"], ga @ gb, "bfloat16")
    exact(out["repeat"], ga @ gb, "bfloat16")
    torch.testing.assert_close(out["softmax"], torch.softmax(a.float(), -1))
    x = a.clone().requires_grad_()
    y = xgemm.gated(x, torch.cat([b, b], 1), activation="swiglu")   # the gate op under autograd
    y.float().sum().backward()                                      # on torch's autograd worker
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()
