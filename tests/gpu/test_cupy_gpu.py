"""The public API on CuPy arrays (a Hopper GPU): GEMM through the GPU kernels, including the
policy's transposed run (the kernel gets swapaxes views of CuPy arrays) and the zero-padded
staging copies for rows that are not 16-byte multiples, with and without out=, and softmax.

Inputs are integers in [-5, 5], so fp32 accumulation is exact and results are compared for
equality with float64 references rounded to the output dtype; out= buffers are NaN-poisoned so
unwritten elements show.
"""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
import xgemm  # noqa: E402


def _hopper() -> bool:
    try:
        return cp.cuda.runtime.getDeviceCount() > 0 and cp.cuda.Device(0).compute_capability == "90"
    except cp.cuda.runtime.CUDARuntimeError:
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")]


def ints(shape, dtype, seed):
    g = np.random.default_rng(seed).integers(-5, 6, shape).astype(np.float64)
    return cp.asarray(g.astype(dtype)), g


# (id, M, N, K, whether explain() must show the transposed run, whether it must show copies)
GEMMS = [
    ("small", 300, 264, 200, False, False),
    ("mid-row-transposed", 3072, 2560, 1024, True, False),
    ("unaligned-staged", 300, 1001, 999, False, True),
]


@pytest.mark.parametrize("with_out", [False, True])
@pytest.mark.parametrize("case", GEMMS, ids=[g[0] for g in GEMMS])
def test_cupy_half_matmul(case, with_out):
    _, m, n, k, transposed, copies = case
    a, ga = ints((m, k), np.float16, 0)
    b, gb = ints((k, n), np.float16, 1)
    out = cp.full((m, n), cp.nan, dtype=cp.float16) if with_out else None
    d = xgemm.matmul(a, b, out=out)
    cp.cuda.get_current_stream().synchronize()
    assert isinstance(d, cp.ndarray) and d.shape == (m, n) and d.dtype == cp.float16
    assert d is out if with_out else d.flags.c_contiguous
    np.testing.assert_array_equal(cp.asnumpy(d), (ga @ gb).astype(np.float16))
    plan = xgemm.explain(a, b)
    assert plan.kernel_name == "cute_gemm_sm90", str(plan)
    assert ("D^T = B^T A^T" in str(plan)) == transposed, str(plan)
    assert any("16-byte-aligned" in c for c in plan.copies) == copies, str(plan)


def test_cupy_gemm_with_c_transposed_run():
    m, n, k = 2560, 3072, 512
    a, ga = ints((m, k), np.float16, 2)
    b, gb = ints((k, n), np.float16, 3)
    c, gc = ints((m, n), np.float32, 4)
    out = cp.full((m, n), cp.nan, dtype=cp.float32)     # an fp32 result of fp16 operands
    d = xgemm.gemm(a, b, c, alpha=0.5, beta=2.0, out=out)
    cp.cuda.get_current_stream().synchronize()
    assert d is out
    np.testing.assert_array_equal(cp.asnumpy(d), (0.5 * (ga @ gb) + 2.0 * gc).astype(np.float32))
    assert "D^T = B^T A^T" in str(xgemm.explain(a, b, c, alpha=0.5, beta=2.0, out=out))


def test_cupy_fp32_matmul_and_softmax():
    a, ga = ints((257, 131), np.float32, 5)
    b, gb = ints((131, 67), np.float32, 6)
    np.testing.assert_array_equal(cp.asnumpy(xgemm.matmul(a, b)), (ga @ gb).astype(np.float32))
    x = cp.asarray(np.random.default_rng(7).standard_normal((64, 1024)).astype(np.float32))
    y = cp.asnumpy(xgemm.softmax(x, axis=-1)).astype(np.float64)
    xs = cp.asnumpy(x).astype(np.float64)
    e = np.exp(xs - xs.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=-1, keepdims=True), rtol=2e-5, atol=1e-9)
