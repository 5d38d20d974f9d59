"""Repeat calls with a seen signature skip planning, and anything that changes the plan misses.

On the H200 this path serves eager torch CUDA calls; here a fake kernel that accepts CPU problems
stands in for the GPU kernels, and _torch_cuda is widened to CPU tensors.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import xgemm  # noqa: E402
from xgemm import prepare  # noqa: E402
from xgemm.core import policy
from xgemm.core.problem import Policy  # noqa: E402
from xgemm.torch import fastpath


class FakeKernel:
    name = "fake_gpu"
    runs = 0

    def supports(self, problem):
        if getattr(problem, "axis", 0) != len(getattr(problem, "shape", (0,))) - 1:
            return "last axis only (the CPU branch hands kernels the caller's layout)"
        return None if problem.device.kind == "cpu" and problem.framework == "torch" else "torch CPU only"

    def policy(self, problem):
        return Policy(notes=("fake",))

    def run(self, problem, pol, operands, out, stream):
        FakeKernel.runs += 1
        if len(operands) == 1:
            out.obj.copy_(torch.softmax(operands[0].obj.float(), -1).to(out.obj.dtype))
            return
        a, b, c = operands
        d = problem.epilogue.alpha * (a.obj.float() @ b.obj.float())
        if c is not None:
            d = d + problem.epilogue.beta * c.obj.float()
        out.obj.copy_(d.to(out.obj.dtype))


@pytest.fixture
def fake(monkeypatch):
    import sys
    import types
    mod = types.ModuleType("xgemm_fake_kernels")
    mod.KERNEL = FakeKernel()
    monkeypatch.setitem(sys.modules, "xgemm_fake_kernels", mod)
    monkeypatch.setattr(fastpath, "_torch_cuda", lambda *xs: None if any(
        x is not None and (type(x) is not torch.Tensor or x.requires_grad) for x in xs) else torch)
    monkeypatch.setattr(prepare, "prepare_gemm", counting(prepare.prepare_gemm))
    monkeypatch.setattr(prepare, "prepare_softmax", counting(prepare.prepare_softmax))
    with policy.snapshot():
        policy.register("gemm", "fake_gpu", "xgemm_fake_kernels:KERNEL", before=policy.kernel_names("gemm")[0])
        policy.register("softmax", "fake_gpu", "xgemm_fake_kernels:KERNEL", before=policy.kernel_names("softmax")[0])
        yield


def counting(fn):
    def wrapper(*args, **kw):
        wrapper.calls += 1
        return fn(*args, **kw)
    wrapper.calls = 0
    return wrapper


def test_repeat_gemm_skips_planning_and_stays_correct(fake):
    a, b, c = torch.randn(8, 16), torch.randn(16, 4), torch.randn(8, 4)
    for _ in range(3):
        a, b, c = torch.randn(8, 16), torch.randn(16, 4), torch.randn(8, 4)   # new buffers each time
        d = xgemm.gemm(a, b, c, alpha=2.0, beta=0.5)
        torch.testing.assert_close(d, 2.0 * a @ b + 0.5 * c)
    assert prepare.prepare_gemm.calls == 1 and FakeKernel.runs >= 3
    xgemm.gemm(a, b, c, alpha=3.0, beta=0.5)                 # other alpha: plans again
    xgemm.matmul(a.T.contiguous().T, b)                       # other strides: plans again
    xgemm.matmul(torch.randn(9, 16), b)                       # other shape: plans again
    assert prepare.prepare_gemm.calls == 4


def test_misaligned_pointer_is_another_signature(fake):
    base = torch.randn(8 * 16 + 1)
    xgemm.matmul(base[:128].view(8, 16), torch.randn(16, 4))
    d = xgemm.matmul(base[1:129].view(8, 16), torch.randn(16, 4))
    assert prepare.prepare_gemm.calls == 2 and d.shape == (8, 4)


def test_errors_still_raise_after_a_hit(fake):
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    xgemm.matmul(a, b)
    with pytest.raises(xgemm.errors.ShapeError):
        xgemm.matmul(a, torch.randn(15, 4))
    with pytest.raises(xgemm.errors.NonFiniteScalarError):
        xgemm.gemm(a, b, alpha=float("nan"))


def test_softmax_repeat_and_non_last_axis(fake):
    for _ in range(3):
        x = torch.randn(6, 33)
        torch.testing.assert_close(xgemm.softmax(x), torch.softmax(x, -1))
    assert prepare.prepare_softmax.calls == 1
    x = torch.randn(6, 33)
    torch.testing.assert_close(xgemm.softmax(x, axis=0), torch.softmax(x, 0))
    torch.testing.assert_close(xgemm.softmax(x, axis=0), torch.softmax(x, 0))
    assert prepare.prepare_softmax.calls == 3      # axis 0 needs a move, never kept


def test_register_clears_kept_plans(fake):
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    xgemm.matmul(a, b)
    assert fastpath.kept("gemm")
    policy.register("gemm", "fake_gpu", "xgemm_fake_kernels:KERNEL")
    assert not fastpath.kept("gemm")


class FakeNative:
    """Stands in for the loaded native module (ffi/torch_fastpath.cc): records what is
    registered; its hits serve nothing, so every call still reaches the Python fast path."""

    def __init__(self):
        self.stored, self.asked = [], 0

    def hit(self, *args):
        self.asked += 1
        return None

    def store_cu(self, *args):
        self.stored.append(args)

    def clear(self):
        self.stored.clear()


def test_bound_signatures_are_registered_natively_at_their_first_repeat(fake, monkeypatch):
    from xgemm.torch import native as torch_native
    native, started = FakeNative(), []
    recipe = ("cu", 0x1234, 0x5678, 4, bytes(16), ((0, torch_native.A), (8, torch_native.OUT)), object())

    def bind(self, problem, pol, operands, out):
        def go(a, b, c, d, stream):
            d.copy_(a @ b)
        go.native = recipe
        return go

    def start():                      # as a cached library loads: the module is there at once
        started.append(True)
        torch_native.active = torch_native._module = native
    monkeypatch.setattr(FakeKernel, "bind", bind, raising=False)
    monkeypatch.setattr(torch_native, "start", start)
    monkeypatch.setattr(torch_native, "_module", None)
    monkeypatch.setattr(torch_native, "active", None)
    monkeypatch.setattr(torch_native, "compiling", torch_native.compiling)
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    torch.testing.assert_close(xgemm.matmul(a, b), a @ b)           # planned and kept
    assert not started and not native.stored, "a one-off call must not load the native module"
    torch.testing.assert_close(xgemm.matmul(a, b), a @ b)           # first repeat: load, register
    assert started and len(native.stored) == 1
    op, forced, s0, s1, ra, rb, rc, result, owner, func, config, ctas, params, slots = native.stored[0]
    assert (op, forced, s0, s1, rc) == (torch_native.OPS["matmul"], None, 1.0, 0.0, None)
    assert ra is a and rb is b and tuple(result.shape) == (8, 4) and owner is recipe[-1]
    assert (func, config, ctas, params, slots) == recipe[1:-1]
    torch.testing.assert_close(xgemm.matmul(a, b), a @ b)           # asks native first, once registered
    assert native.asked == 1 and len(native.stored) == 1
