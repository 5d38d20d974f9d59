"""Epilogues, gated products, grouped GEMM and FP8 on CUDA tensors (issues 24, 23, 21): the public
API on the GPU, whatever serves it (the product through a kernel and the epilogue composed, or the
embedded default), against float64 references, with NaN-poisoned outputs and CUDA-graph capture.

When fused, grouped and FP8 kernels land they take these calls over; these tests stay the check.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import xgemm  # noqa: E402
from xgemm.core import fp8_checks  # noqa: E402

from test_epilogues import ACTS, GATED, TOL, act64, ref  # noqa: E402
from test_fp8 import _deq64  # noqa: E402

pytestmark = pytest.mark.gpu
DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _cuda(x, dtype, layout="row"):
    t = torch.from_numpy(np.ascontiguousarray(x)).to(DT[dtype])
    if layout == "col":
        return t.t().contiguous().cuda().t() if t.ndim == 2 else t.cuda()
    return t.cuda()


def _host(x, dtype):
    """The values as the operand of this dtype holds them, in float64 (the reference's inputs)."""
    return torch.from_numpy(np.ascontiguousarray(x)).to(DT[dtype]).double().numpy()


def _close(got, want, dtype):
    got = got.double().cpu().numpy()
    assert np.isfinite(got).all(), "an element was left unwritten (NaN) or overflowed"
    scale = max(np.abs(want).max(), 1.0)
    assert np.abs(got - want).max() <= TOL[dtype] * scale * 4, np.abs(got - want).max() / scale


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("activation", (None,) + tuple(ACTS))
@pytest.mark.parametrize("la,lb", [("row", "row"), ("col", "col")])
def test_bias_activation_on_cuda(dtype, activation, la, lb):
    rng = np.random.default_rng(0)
    m, n, k = 257, 131, 67                      # ragged in every dimension
    a, b, bias = rng.standard_normal((m, k)) / 4, rng.standard_normal((k, n)) / 4, rng.standard_normal(n)
    out = torch.full((m, n), float("nan"), dtype=DT[dtype], device="cuda")
    y = xgemm.gemm(_cuda(a, dtype, la), _cuda(b, dtype, lb), bias=_cuda(bias, dtype), activation=activation, out=out)
    torch.cuda.synchronize()
    assert y is out
    _close(y, ref(_host(a, dtype), _host(b, dtype), bias=_host(bias, dtype), activation=activation), dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("activation", GATED)
def test_gated_on_cuda_with_grads(dtype, activation):
    rng = np.random.default_rng(1)
    m, h, k = 129, 96, 80
    a, w, bias = rng.standard_normal((m, k)) / 4, rng.standard_normal((k, 2 * h)) / 4, rng.standard_normal(2 * h)
    ta, tw = _cuda(a, dtype).requires_grad_(), _cuda(w, dtype).requires_grad_()
    y = xgemm.gated(ta, tw, bias=_cuda(bias, dtype), activation=activation)
    _close(y.detach(), ref(_host(a, dtype), _host(w, dtype), bias=_host(bias, dtype), activation=activation,
                           gated=True), dtype)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(3)).to(y.device, y.dtype)
    if activation == "reglu":
        # ReLU's kink: a gate input within float32 rounding of 0 may take either side in the kernel's
        # sum and in torch's; no gradient flows through those (a handful at most)
        gate = (ta.detach().double() @ tw.detach().double() + _cuda(bias, dtype).double())[:, :h]
        dy[gate.abs() < 1e-3] = 0
    y.backward(dy)
    # the same layer in torch ops, float32, for the grads
    xa, xw = ta.detach().float().requires_grad_(), tw.detach().float().requires_grad_()
    hh = xa @ xw + _cuda(bias, dtype).float()
    act = {"swiglu": torch.nn.functional.silu, "geglu": torch.nn.functional.gelu, "reglu": torch.relu}[activation]
    (act(hh[:, :h]) * hh[:, h:]).backward(dy.float())
    for got, want in ((ta.grad, xa.grad), (tw.grad, xw.grad)):
        _close(got, want.double().cpu().numpy(), dtype)


def _groups(sizes, k, n, dtype, seed=2):
    rng = np.random.default_rng(seed)
    t = int(sum(sizes))
    x, w = rng.integers(-3, 4, (t, k)).astype(np.float64), rng.integers(-3, 4, (len(sizes), k, n)).astype(np.float64)
    want, start = np.zeros((t, n)), 0
    for e, s in enumerate(sizes):
        want[start:start + s] = x[start:start + s] @ w[e]
        start += s
    return x, w, want


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("sizes", [[0, 5, 0, 130, 1, 64], [300, 0, 0, 0], [1] * 16], ids=["skewed", "one", "ones"])
def test_ragged_dot_and_grouped_mm_on_cuda(dtype, sizes):
    x, w, want = _groups(sizes, 48, 40, dtype)
    gs = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    y = xgemm.ragged_dot(_cuda(x, dtype), _cuda(w, dtype), gs)
    assert y.is_cuda
    _close(y, want, dtype)
    offs = torch.cumsum(gs, 0, dtype=torch.int32)
    _close(xgemm.grouped_mm(_cuda(x, dtype), _cuda(w, dtype), offs), want, dtype)


def test_grouped_mm_captures_in_a_cuda_graph():
    """No host read of the group sizes: the call records into a CUDA graph, and a replay follows
    new sizes written into the same device tensor."""
    k, n = 32, 24
    x, w, _ = _groups([7, 9, 0, 16], k, n, "float32")
    tx, tw = _cuda(x, "float32"), _cuda(w, "float32")
    offs = torch.tensor([7, 16, 16, 32], dtype=torch.int32, device="cuda")
    xgemm.grouped_mm(tx, tw, offs)                      # warm up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = xgemm.grouped_mm(tx, tw, offs)
    for sizes in ([7, 9, 0, 16], [0, 0, 32, 0], [10, 10, 10, 2]):
        offs.copy_(torch.tensor(np.cumsum(sizes), dtype=torch.int32))
        g.replay()
        torch.cuda.synchronize()
        want_x = np.zeros((32, n))
        start = 0
        for e, s in enumerate(sizes):
            want_x[start:start + s] = x[start:start + s] @ w[e]
            start += s
        _close(y, want_x, "float32")


@pytest.mark.parametrize("activation", ["gelu", "swiglu", "geglu"])
def test_grouped_activation_on_cuda_forward_and_backward(activation):
    """MoE expert input projections: the grouped product on its kernel, the activation (or gate)
    after it, bf16 under autograd (the gate as xgemm::gate), against float64."""
    sizes = [0, 5, 0, 130, 1, 64, 300]
    k, n = 64, 96
    x, w, pre = _groups(sizes, k, n, "bfloat16")
    x, w, pre = x / 4, w / 4, pre / 16                  # the activations' curved parts
    gated = activation in GATED
    h = pre[:, : n // 2] if gated else pre
    want = (act64(h, {"swiglu": "silu", "geglu": "gelu"}[activation]) * pre[:, n // 2:] if gated
            else act64(pre, activation))
    tx, tw = _cuda(x, "bfloat16").requires_grad_(), _cuda(w, "bfloat16").requires_grad_()
    y = xgemm.ragged_dot(tx, tw, torch.tensor(sizes, dtype=torch.int32, device="cuda"), activation=activation)
    assert y.is_cuda and y.dtype == torch.bfloat16
    _close(y.detach(), want, "bfloat16")
    y.float().sum().backward()
    xr = torch.from_numpy(x).double().requires_grad_()
    wr = torch.from_numpy(w).double().requires_grad_()
    p, start = [], 0
    for e, s in enumerate(sizes):
        p.append(xr[start:start + s] @ wr[e])
        start += s
    p = torch.cat(p + [torch.zeros(x.shape[0] - start, n, dtype=torch.float64)])
    fn = torch.nn.functional
    r = (fn.silu(p[:, : n // 2]) * p[:, n // 2:] if activation == "swiglu" else
         fn.gelu(p[:, : n // 2]) * p[:, n // 2:] if activation == "geglu" else fn.gelu(p))
    r.sum().backward()
    _close(tx.grad, xr.grad.numpy(), "bfloat16")
    _close(tw.grad, wr.grad.numpy(), "bfloat16")


@pytest.mark.parametrize("recipe", ["tensor", "row", "block"])
@pytest.mark.parametrize("shape", [(257, 300, 131), (1, 128, 8)], ids=str)
def test_scaled_matmul_on_cuda(recipe, shape):
    m, k, n = shape
    rng = np.random.default_rng(3)
    a, b = _cuda(rng.standard_normal((m, k)), "float32"), _cuda(rng.standard_normal((k, n)), "float32")
    ra, rb = fp8_checks.OPERAND_RECIPES[recipe]
    a8, sa = xgemm.quantize_fp8(a, ra)
    b8, sb = xgemm.quantize_fp8(b, rb)
    assert a8.is_cuda and a8.dtype == torch.float8_e4m3fn and sa.dtype == torch.float32
    y = xgemm.scaled_matmul(a8, b8, sa, sb)
    want = _deq64(a8.cpu(), sa.cpu(), ra) @ _deq64(b8.cpu(), sb.cpu(), rb)
    _close(y, want, "bfloat16")
    ta, tb = a.clone().requires_grad_(), b.clone().requires_grad_()
    y2 = xgemm.fp8_matmul(ta, tb, recipe=recipe)
    _close(y2.detach(), want, "float32")
    y2.sum().backward()
    assert ta.grad.is_cuda and torch.isfinite(ta.grad).all() and torch.isfinite(tb.grad).all()


def test_quantize_saturates_and_keeps_nan_on_cuda():
    x = torch.tensor([[1.0, 1e9, -float("inf"), float("nan"), 0.0, -3.0]], device="cuda")
    q, s = xgemm.quantize_fp8(x, "row")
    deq = q.float() * s
    assert deq[0, 1] == 448 * s[0, 0] and deq[0, 2] == -448 * s[0, 0]      # saturated, as torch's clamp
    assert torch.isnan(deq[0, 3]) and deq[0, 4] == 0
