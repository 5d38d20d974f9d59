"""A CuTe class whose compiler dies (cute_cache raises errors.KernelBuildError: the build's child
process was killed) sends the call to the next kernel of the table (core/policy.attempt), on a
(fake) H200: the call returns, that kernel declines the problem from then on with the reason in
explain(), a fused epilogue is composed after a plain product, an FP8 product runs the embedded
default, and only a forced kernel raises. Launches are recorded, not run (tests/fake_cuda.py);
tests/runtime/test_cute_cache.py and test_cute_gemm_compile.py make a real child die."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.bindings")
from fake_cuda import Fake  # noqa: E402

import xgemm  # noqa: E402
from xgemm import errors  # noqa: E402
from xgemm.core import policy  # noqa: E402
from xgemm.runtime import cute_cache  # noqa: E402

BF16 = torch.bfloat16
DIED = "compiling <the class> killed its build process (SIGABRT; it said: nothing)"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(policy, "_unbuildable", {})


def _dying(fake, dies):
    """Fake's compile cache, but a key for which dies(key) is true raises as a killed build does."""
    recorded = cute_cache.cute

    def cute(key, build):
        if dies(key):
            fake.died.append(key)
            raise errors.KernelBuildError(DIED)
        return recorded(key, build)
    fake.died = []
    fake._set(cute_cache, "cute", cute)
    fake._set(cute_cache, "cute_eager", cute)


def _cute_keys(fake):
    return [c[1] for c in fake.calls if c[0] == "cute"]


def test_a_class_that_cannot_be_built_sends_the_call_to_the_next_kernel(monkeypatch):
    """cute_gemm_sm90's class dies, then cute_mma_sm80's: the embedded default runs the call
    (gluon_matmul_sm90, between them, declines here: its launcher is not one the fake records)."""
    from xgemm.kernels import gluon_matmul_sm90
    monkeypatch.setattr(gluon_matmul_sm90.KERNEL, "supports", lambda problem: "not on the fake GPU")
    a, b = torch.randn(512, 256, dtype=BF16), torch.randn(256, 384, dtype=BF16)
    with Fake(keep=True) as fake:
        _dying(fake, lambda key: True)
        assert xgemm.explain(a, b).kernel_name == "cute_gemm_sm90"
        y = xgemm.matmul(a, b)
        after = xgemm.explain(a, b)
        again = xgemm.matmul(a, b)
    assert len(fake.died) == 2 and not _cute_keys(fake)      # one class each, asked once
    assert after.kernel_name == "reference", after
    for name in ("cute_gemm_sm90", "cute_mma_sm80"):
        why = dict(after.declined)[name]
        assert why.startswith("its binary could not be built here") and "SIGABRT" in why, why
    want = (a.float() @ b.float()).to(BF16)
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(again, want)


def test_a_forced_kernel_whose_class_cannot_be_built_raises():
    a, b = torch.randn(512, 256, dtype=BF16), torch.randn(256, 384, dtype=BF16)
    with Fake(keep=True) as fake, policy.force("cute_gemm_sm90"):
        _dying(fake, lambda key: True)
        with pytest.raises(errors.KernelBuildError, match="SIGABRT"):
            xgemm.matmul(a, b)
    assert not policy._unbuildable


def test_a_fused_class_that_cannot_be_built_is_composed_after_the_plain_product():
    a, b, bias = torch.randn(512, 256, dtype=BF16), torch.randn(256, 384, dtype=BF16), torch.randn(384)
    with Fake(keep=True) as fake:
        _dying(fake, lambda key: getattr(key[-1], "activation", None) is not None)
        y = xgemm.gemm(a, b, bias=bias, activation="gelu_tanh")
        plan = xgemm.explain(a, b, bias=bias, activation="gelu_tanh")
    (died,) = fake.died
    (plain,) = _cute_keys(fake)                  # the product, on the plain class
    assert len(plain) == 12 and y.shape == (512, 384) and y.dtype == BF16
    assert "composed after the product" in plan.epilogue, plan


F8 = getattr(torch, "float8_e4m3fn", None)


@pytest.mark.skipif(F8 is None, reason="this torch has no float8_e4m3fn")
def test_an_fp8_class_that_cannot_be_built_runs_the_embedded_default():
    a = torch.randn(256, 512).to(F8)
    b = torch.randn(384, 512).to(F8).t()
    sa, sb = torch.tensor(0.5), torch.tensor(2.0)
    with Fake(keep=True) as fake:
        _dying(fake, lambda key: True)
        y = xgemm.scaled_matmul(a, b, sa, sb, use_fast_accum=True)
    assert fake.died and not _cute_keys(fake)
    want = (a.float() * 0.5) @ (b.float() * 2.0)
    torch.testing.assert_close(y.float(), want.to(torch.bfloat16).float(), rtol=1e-2, atol=1e-2)
