"""A repeat call launches exactly what the planned call launches.

The fast path binds a signature once (xgemm/fastpath.py) and then skips views and run(); these
tests record the stubbed launches (tests/fake_cuda.py: CPU tensors dressed as an sm_90 device,
the TVM-FFI functions and cuLaunchKernelEx replaced by recorders) of a planned call and of
several repeat calls on fresh buffers, and require them equal once every pointer is named by
the buffer it points into -- for each kernel, several shapes, dtypes and majorness.
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.bindings")
from conftest import have  # noqa: E402
from fake_cuda import STREAM, Fake, normalize, stream_of  # noqa: E402

import xgemm  # noqa: E402
from xgemm.core import policy  # noqa: E402
from xgemm.torch import fastpath

ROUNDS = 4      # planned call, first hit (softmax binds here), bound hits


def col(t):
    """Same values, column-major storage."""
    return t.T.contiguous().T


def record(fn, make, kernel):
    """Launch records of ROUNDS calls on fresh inputs, each normalized to its own buffers."""
    out = []
    with Fake(keep=True) as fake:
        for _ in range(ROUNDS):
            inputs = make()
            before = len(fake.calls)
            result = fn(*inputs)
            named = {f"in{i}": t for i, t in enumerate(inputs) if t is not None}
            out.append(normalize(fake.calls[before:], {**named, "out": result}))
        assert fastpath.kept("gemm") or fastpath.kept("softmax"), "the call was not kept for repeats: nothing is compared"
        arrays = [t for t in make() if t is not None]
        plan = str(xgemm.explain(*arrays, **({"alpha": 1.5, "beta": -0.5} if len(arrays) == 3 else {})))
        assert stream_of(fake.calls) == {STREAM}
    assert f"kernel: {kernel}" in plan, plan
    return out


def g(*shape, dtype=torch.float32):
    return lambda: torch.randint(-5, 6, shape).to(dtype)


GEMMS = [
    # (id, kernel, dtype, A maker, B maker, with C)
    ("sgemm-rr-256", "cute_sgemm", torch.float32, (256, 256), (256, 256), False, False, False),
    ("sgemm-cr-odd", "cute_sgemm", torch.float32, (33, 65), (65, 17), True, False, False),
    ("sgemm-rc-c", "cute_sgemm", torch.float32, (64, 128), (128, 96), False, True, True),
    ("sgemm-splitk", "cute_sgemm", torch.float32, (32, 8192), (8192, 32), False, False, False),
    ("sm90-bf16-rr", "cute_gemm_sm90", torch.bfloat16, (256, 256), (256, 256), False, False, False),
    ("sm90-fp16-cc-c", "cute_gemm_sm90", torch.float16, (128, 64), (64, 192), True, True, True),
    ("sm90-bf16-rc", "cute_gemm_sm90", torch.bfloat16, (200, 96), (96, 136), False, True, False),
]


@pytest.mark.parametrize("case", GEMMS, ids=[c[0] for c in GEMMS])
def test_gemm_repeat_launches_what_the_planned_call_launches(case):
    _, kernel, dtype, sa, sb, a_col, b_col, with_c = case

    def make():
        a, b = g(*sa, dtype=dtype)(), g(*sb, dtype=dtype)()
        a, b = (col(a) if a_col else a), (col(b) if b_col else b)
        return a, b, (g(sa[0], sb[1], dtype=dtype)() if with_c else None)

    fn = (lambda a, b, c: xgemm.gemm(a, b, c, alpha=1.5, beta=-0.5)) if with_c else \
        (lambda a, b, c: xgemm.matmul(a, b))
    rounds = record(fn, make, kernel)
    assert rounds[0], "the planned call launched nothing"
    for r in rounds[1:]:
        assert r == rounds[0]


SOFTMAXES = [
    ("fp32-64x1024", (64, 1024), torch.float32),
    ("bf16-3d", (4, 16, 512), torch.bfloat16),
    ("fp32-ragged", (7, 1000), torch.float32),
    ("fp16-one-row", (1, 96), torch.float16),
]


@pytest.mark.skipif(not have("triton"), reason="builds the Gluon cubins (needs triton)")
@pytest.mark.parametrize("case", SOFTMAXES, ids=[c[0] for c in SOFTMAXES])
def test_softmax_repeat_launches_what_the_planned_call_launches(case):
    _, shape, dtype = case
    rounds = record(lambda x: xgemm.softmax(x), lambda: (torch.randn(shape).to(dtype),), "gluon_softmax")
    assert rounds[0], "the planned call launched nothing"
    for r in rounds[1:]:
        assert r == rounds[0]


def test_bound_repeats_skip_run(monkeypatch):
    """The bound path is the one taken: run() is not called on a bound repeat."""
    from xgemm.kernels import cute_sgemm
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with Fake(keep=True) as fake:
        xgemm.matmul(a, b)
        calls = []
        monkeypatch.setattr(cute_sgemm.KERNEL, "run", lambda *args: calls.append(args))
        xgemm.matmul(a, b)
        assert not calls and len(fake.calls) == 2


def test_forced_kernel_reads_force_then_environment(monkeypatch):
    """policy.forced_kernel() reads os.environ's byte store directly (hot path): same answers."""
    monkeypatch.delenv("XGEMM_KERNEL", raising=False)
    assert policy.forced_kernel() is None
    monkeypatch.setenv("XGEMM_KERNEL", "cute_sgemm")
    assert policy.forced_kernel() == os.environ["XGEMM_KERNEL"] == "cute_sgemm"
    with policy.force("reference"):
        assert policy.forced_kernel() == "reference"
    monkeypatch.setenv("XGEMM_KERNEL", "")
    assert policy.forced_kernel() is None
    assert os.environ.get("XGEMM_KERNEL") == ""


def test_grouped_int64_offsets_past_t_reach_the_kernel_capped_not_wrapped():
    """The kernels read int32 ends; an int64 offset past T (2**33 here) is copied capped at T, so
    its groups keep every row after it, instead of wrapping to a small or negative end."""
    x, w = torch.randn(256, 128, dtype=torch.bfloat16), torch.randn(4, 128, 256, dtype=torch.bfloat16)
    offs = torch.tensor([64, 128, 2 ** 33, 2 ** 34], dtype=torch.int64)
    with Fake(keep=True) as fake:
        xgemm.grouped_mm(x, w, offs)
    (call,) = [c for c in fake.calls if c[0] == "cute"]
    ends = call[2][3]
    assert ends.dtype == torch.int32 and ends.tolist() == [64, 128, 256, 256]


def test_the_variable_k_grouped_product_launches_under_two_fakes_in_a_row():
    """The Triton grouped kernel's launch (its group table in stream-ordered scratch) under the fake
    driver, twice: each Fake starts without the last one's launchers."""
    x, w = torch.randn(656, 529, dtype=torch.float16), torch.randn(529, 64, dtype=torch.float16)
    offs = torch.tensor([22, 61, 62, 285, 285, 306, 306, 306, 330, 358], dtype=torch.int32)
    for _ in range(2):
        with Fake(keep=True) as fake:
            y = xgemm.grouped_mm(x, w, offs)
        assert y.shape == (10, 656, 64) and [c[0] for c in fake.calls] == ["gluon"]
