"""Equivalence of matmul / gemm / softmax with float64 NumPy references, across frameworks,
dtypes, shapes (0, 1, primes), batch broadcasting and memory layouts (embedded default on CPU)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import to_f64
from helpers import DTYPES, FRAMEWORKS, LAYOUTS, make, rounded
from hypothesis import given, settings
from hypothesis import strategies as st

import xgemm

DIMS = st.sampled_from([0, 1, 2, 3, 5, 7, 13, 16, 17])
BATCHES = st.sampled_from([((), ()), ((2,), ()), ((), (3,)), ((2, 1), (3,)), ((1, 3), (2, 1)), ((4,), (4,))])


def ints(rng: np.random.Generator, shape) -> np.ndarray:
    """Integers in [-5, 5]: every product and sum below is exact in the fp32 accumulator."""
    return rng.integers(-5, 6, size=shape).astype(np.float64)


@settings(max_examples=120, deadline=None)
@given(fw=st.sampled_from(FRAMEWORKS), dtype=st.sampled_from(DTYPES), m=DIMS, n=DIMS, k=DIMS,
       batches=BATCHES, la=st.sampled_from(LAYOUTS), lb=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**16))
def test_matmul_matches_float64_reference(fw, dtype, m, n, k, batches, la, lb, seed):
    rng = np.random.default_rng(seed)
    av, bv = ints(rng, batches[0] + (m, k)), ints(rng, batches[1] + (k, n))
    a, b = make(av, fw, dtype, la), make(bv, fw, dtype, lb)
    d = xgemm.matmul(a, b)
    assert type(d).__module__.split(".")[0] == type(a).__module__.split(".")[0]
    assert xgemm.errors is not None and str(d.dtype).endswith(dtype)
    np.testing.assert_array_equal(to_f64(d), rounded(np.matmul(av, bv), dtype))


@settings(max_examples=80, deadline=None)
@given(fw=st.sampled_from(FRAMEWORKS), dtype=st.sampled_from(DTYPES), m=DIMS, n=DIMS, k=DIMS,
       alpha=st.sampled_from([1.0, -2.0, 0.5, 0.0]), beta=st.sampled_from([0.0, 1.0, -1.0, 2.0]),
       c_shape=st.sampled_from(["full", "row", "scalar_col"]), lc=st.sampled_from(LAYOUTS),
       seed=st.integers(0, 2**16))
def test_gemm_alpha_beta_c(fw, dtype, m, n, k, alpha, beta, c_shape, lc, seed):
    rng = np.random.default_rng(seed)
    av, bv = ints(rng, (m, k)), ints(rng, (k, n))
    cv = ints(rng, {"full": (m, n), "row": (n,), "scalar_col": (m, 1)}[c_shape])
    a, b, c = make(av, fw, dtype), make(bv, fw, dtype), make(cv, fw, dtype, lc)
    d = xgemm.gemm(a, b, c, alpha=alpha, beta=beta)
    expected = alpha * (av @ bv) + (beta * cv if beta != 0 else 0)
    np.testing.assert_array_equal(to_f64(d), rounded(np.broadcast_to(expected, (m, n)), dtype))


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_beta_zero_never_reads_c(fw):
    av, bv = np.ones((3, 4)), np.ones((4, 5))
    c = make(np.full((3, 5), np.nan), fw, "float32")
    d = xgemm.gemm(make(av, fw, "float32"), make(bv, fw, "float32"), c, alpha=1.0, beta=0.0)
    np.testing.assert_array_equal(to_f64(d), np.full((3, 5), 4.0))


@pytest.mark.parametrize("fw", FRAMEWORKS)
@pytest.mark.parametrize("shapes", [((3, 0), (0, 4)), ((0, 3), (3, 4)), ((2, 0, 3), (3, 5)), ((0,), (0,))])
def test_zero_size(fw, shapes):
    av, bv = np.ones(shapes[0]), np.ones(shapes[1])
    d = xgemm.matmul(make(av, fw, "float32"), make(bv, fw, "float32"))
    np.testing.assert_array_equal(to_f64(d), np.matmul(av, bv))
    cv = np.full(np.matmul(av, bv).shape, 3.0)
    d = xgemm.gemm(make(av, fw, "float32"), make(bv, fw, "float32"), make(cv, fw, "float32"), alpha=2.0, beta=2.0)
    np.testing.assert_array_equal(to_f64(d), 2 * np.matmul(av, bv) + 2 * cv)   # K = 0 -> beta*C


@settings(max_examples=80, deadline=None)
@given(fw=st.sampled_from(FRAMEWORKS), dtype=st.sampled_from(DTYPES),
       shape=st.sampled_from([(1,), (7,), (3, 1), (4, 13), (2, 3, 17), (5, 256)]),
       axis=st.integers(-3, 2), layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**16))
def test_softmax_matches_float64_reference(fw, dtype, shape, axis, layout, seed):
    if not -len(shape) <= axis < len(shape):
        axis = -1
    rng = np.random.default_rng(seed)
    xv = rounded(rng.normal(scale=4.0, size=shape), dtype)
    y = xgemm.softmax(make(xv, fw, dtype, layout), axis=axis)
    e = np.exp(xv - xv.max(axis=axis, keepdims=True))
    ref = e / e.sum(axis=axis, keepdims=True)
    tol = {"float64": 1e-12, "float32": 1e-6, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
    np.testing.assert_allclose(to_f64(y), ref, rtol=tol, atol=tol)
    assert str(y.dtype).endswith(dtype)


@pytest.mark.parametrize("fw", ["numpy", "torch"])
def test_softmax_special_values_match_torch(fw):
    torch = pytest.importorskip("torch")
    inf, nan = float("inf"), float("nan")
    rows = [[-inf, -inf, -inf], [inf, 1.0, 2.0], [nan, 1.0, 2.0], [-inf, 0.0, 1.0], [1e30, -1e30, 0.0]]
    expected = torch.softmax(torch.tensor(rows, dtype=torch.float64), dim=-1).numpy()
    y = xgemm.softmax(make(np.array(rows), fw, "float32"))
    np.testing.assert_allclose(to_f64(y), expected, rtol=1e-6, atol=1e-6, equal_nan=True)
    assert np.array_equal(np.isnan(to_f64(y)), np.isnan(expected))


def test_out_numpy_is_written_in_place():
    a, b = np.ones((3, 4), np.float32), np.ones((4, 5), np.float32)
    out = np.full((3, 5), np.nan, np.float32)
    assert xgemm.matmul(a, b, out=out) is out
    np.testing.assert_array_equal(out, 4.0)
    y = np.full((3, 4), np.nan, np.float32)
    assert xgemm.softmax(a, out=y) is y
    np.testing.assert_allclose(y, 0.25)


def test_out_torch_is_written_in_place_and_may_be_float32_for_half():
    torch = pytest.importorskip("torch")
    a, b = torch.ones(2, 3, 4, dtype=torch.bfloat16), torch.ones(4, 5, dtype=torch.bfloat16)
    out = torch.full((2, 3, 5), float("nan"))
    assert xgemm.matmul(a, b, out=out) is out
    assert torch.equal(out, torch.full((2, 3, 5), 4.0))


def test_vector_operands_follow_numpy_matmul():
    a, b = np.arange(4.0), np.arange(12.0).reshape(4, 3)
    for x, y in [(a, b), (b.T, a), (a, a), (np.ones((2, 3, 4)), a)]:
        np.testing.assert_array_equal(xgemm.matmul(x, y), np.matmul(x, y))
