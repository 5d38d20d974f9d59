"""FP8 (xgemm.fp8): every recipe against a float64 reference of the dequantized operands, for
NumPy (ml_dtypes), torch and JAX; quantize_fp8's round-trip bounds, saturation, NaN, zeros; typed errors."""
import math

import ml_dtypes
import numpy as np
import pytest

from xgemm import arrays, errors, fp8
from xgemm.core import fp8_checks

torch = pytest.importorskip("torch")
jnp = pytest.importorskip("jax.numpy")

PAIRS = [("tensor", "tensor"), ("row", "col"), ("block_1x128", "block_128x128")]
SHAPES = [(5, 300, 130), (3, 128, 256), (1, 7, 1)]          # partial K and N blocks, exact blocks, tiny
MANTISSA = {"float8_e4m3fn": 3, "float8_e5m2": 2}
SUBNORMAL_MIN = {"float8_e4m3fn": 2.0 ** -9, "float8_e5m2": 2.0 ** -16}


def _to(fw, x):
    if fw == "torch":
        return torch.from_numpy(np.asarray(x))
    if fw == "jax":
        return jnp.asarray(x)
    return x


def _np(x):
    if isinstance(x, torch.Tensor):
        return x.float().numpy() if x.dtype != torch.float32 else x.numpy()
    return np.asarray(x).astype(np.float32) if np.asarray(x).dtype != np.float32 else np.asarray(x)


def _expand(scale, shape, block):
    """The reference's per-element scale, float64, written independently of fp8_checks."""
    s = np.asarray(scale, np.float64)
    if s.ndim == 0:
        return np.full(shape, float(s))
    r = np.arange(shape[0]) // block[0] if s.shape[0] > 1 else np.zeros(shape[0], int)
    c = np.arange(shape[1]) // block[1] if s.shape[1] > 1 else np.zeros(shape[1], int)
    return s[r][:, c]


BLOCKS = {"tensor": None, "row": (1, 10 ** 9), "col": (10 ** 9, 1), "block_1x128": (1, 128),
          "block_128x128": (128, 128)}


def _deq64(q, scale, recipe):
    q = _np(q).astype(np.float64)
    return q * _expand(_np(scale), q.shape, BLOCKS[recipe])


@pytest.mark.parametrize("fw", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("recipes", PAIRS, ids=lambda p: p[0])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_scaled_matmul_matches_float64_of_dequantized(fw, recipes, shape):
    m, k, n = shape
    rng = np.random.default_rng(0)
    # rows / blocks of very different magnitudes, so a wrong scale expansion cannot pass
    x = (rng.standard_normal((m, k)) * np.exp(rng.uniform(-4, 4, (m, 1)))).astype(np.float32)
    w = (rng.standard_normal((k, n)) * np.exp(rng.uniform(-4, 4, (1, n)))).astype(np.float32)
    x[:, :min(k, 128)] *= 50.0
    qa, sa = fp8.quantize_fp8(_to(fw, x), recipes[0])
    qb, sb = fp8.quantize_fp8(_to(fw, w), recipes[1], "float8_e5m2")     # e4m3 x e5m2
    bias = rng.standard_normal(n).astype(np.float32)
    y = fp8.scaled_matmul(qa, qb, sa, sb, out_dtype="float32", bias=_to(fw, bias))
    assert type(y) is type(qa)
    ref = _deq64(qa, sa, recipes[0]) @ _deq64(qb, sb, recipes[1]) + bias
    tol = 1e-5 * (np.abs(_deq64(qa, sa, recipes[0])) @ np.abs(_deq64(qb, sb, recipes[1])) + 1)
    assert np.all(np.abs(_np(y) - ref) <= tol)
    ybf = fp8.scaled_matmul(qa, qb, sa, sb, bias=_to(fw, bias))             # bfloat16 by default
    assert arrays.requested_dtype(ybf.dtype) == "bfloat16"
    np.testing.assert_allclose(_np(ybf), _np(y), rtol=2 ** -8, atol=1e-30)   # one rounding of the float32 result


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("recipe", sorted(BLOCKS))
@pytest.mark.parametrize("fw", ["numpy", "torch", "jax"])
def test_quantize_round_trip_within_fp8_rounding(fw, recipe, dtype):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((130, 260)) * np.exp(rng.uniform(-6, 6, (130, 1)))).astype(np.float32)
    q, s = fp8.quantize_fp8(_to(fw, x), recipe, dtype)
    assert arrays.requested_dtype(q.dtype) == dtype and arrays.requested_dtype(s.dtype) == "float32"
    exp_shape = fp8_checks.quantize_block("t", recipe, x.shape)[1]
    assert tuple(s.shape) == exp_shape
    full = _expand(_np(s), x.shape, BLOCKS[recipe])
    err = np.abs(_deq64(q, s, recipe) - x)
    bound = 2.0 ** -(MANTISSA[dtype] + 1) * np.abs(x) + SUBNORMAL_MIN[dtype] / 2 * full
    assert np.all(err <= bound * (1 + 1e-6))
    # each block's amax maps onto the fp8 max: the scale is amax / fmax
    assert np.isclose(np.abs(_np(q)).max(), fp8_checks.FP8_MAX[dtype])


@pytest.mark.parametrize("fw", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("shape", [(0, 5), (4, 0)], ids=str)
def test_empty_operands_quantize_to_unit_scales_and_multiply_to_zeros(fw, shape):
    """A zero-size x (no rows, or K = 0): scales of 1 in the recipe's shape (a row-wise scale is
    [M, 1] also at K = 0), and fp8_matmul of such operands is zeros; both used to raise a
    reduction error, or a ShapeError about a scale the caller never passed."""
    x = _to(fw, np.zeros(shape, np.float32))
    want = {"tensor": (), "row": (shape[0], 1), "col": (1, shape[1]),
            "block_1x128": (shape[0], -(-shape[1] // 128)), "block_128x128": (-(-shape[0] // 128), -(-shape[1] // 128))}
    for recipe, scale_shape in want.items():
        q, s = fp8.quantize_fp8(x, recipe)
        assert tuple(q.shape) == shape and tuple(s.shape) == scale_shape, (recipe, s.shape)
        assert np.all(_np(s) == 1.0)
    m, k = shape
    a, b = _to(fw, np.zeros((m, k), np.float32)), _to(fw, np.ones((k, 3), np.float32))
    for recipe in ("tensor", "row", "block"):
        y = _np(fp8.fp8_matmul(a, b, recipe=recipe))
        assert y.shape == (m, 3) and np.all(y == 0), recipe


def test_block_scales_follow_partial_blocks():
    x = np.ones((3, 130), np.float32)
    x[:, 128:] = 1000.0                  # the partial last K block has its own scale
    _, s = fp8.quantize_fp8(x, "block_1x128")
    np.testing.assert_allclose(s, [[1 / 448, 1000 / 448]] * 3, rtol=1e-6)
    _, s = fp8.quantize_fp8(np.ones((129, 1), np.float32) * np.r_[np.ones(128), 7.0][:, None], "block_128x128")
    np.testing.assert_allclose(s, [[1 / 448], [7 / 448]], rtol=1e-6)


@pytest.mark.parametrize("fw", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_saturation_nan_and_zeros(fw, dtype):
    fmax = fp8_checks.FP8_MAX[dtype]
    x = np.array([[1.0, -2.0, np.inf, -np.inf, np.nan, 0.5]], np.float32)
    q, s = fp8.quantize_fp8(_to(fw, x), "row", dtype)
    qf = _np(q)[0]
    assert float(_np(s)[0, 0]) == pytest.approx(2.0 / fmax)      # the scale ignores inf and NaN
    assert qf[2] == fmax and qf[3] == -fmax                        # +-inf saturate
    assert math.isnan(qf[4])                                       # NaN stays NaN
    assert qf[1] == -fmax and qf[0] == pytest.approx(fmax / 2, rel=2 ** -3)
    # finite values beyond the range (a tensor scale fixed by the bigger ones) never become NaN/inf
    q, s = fp8.quantize_fp8(_to(fw, np.zeros((2, 2), np.float32)), "tensor", dtype)
    assert np.all(_np(q) == 0) and 0 < float(_np(s)) < np.inf
    q, s = fp8.quantize_fp8(_to(fw, np.zeros((2, 200), np.float32)), "block_1x128", dtype)
    assert np.all(_np(q) == 0) and np.all(_np(s) == 1.0)


def test_nan_in_an_operand_reaches_only_its_row():
    a = np.array([[1.0, np.nan], [1.0, 1.0]], np.float32).astype(ml_dtypes.float8_e4m3fn)
    b = np.ones((2, 3), ml_dtypes.float8_e4m3fn)
    one = np.ones((), np.float32)
    y = fp8.scaled_matmul(a, b, one, one, out_dtype="float32")
    assert np.all(np.isnan(y[0])) and np.all(y[1] == 2.0)


def _ops():
    a = np.ones((4, 256), ml_dtypes.float8_e4m3fn)
    b = np.ones((256, 8), ml_dtypes.float8_e4m3fn)
    return a, b, np.ones((), np.float32)


def test_scale_shapes_matching_no_recipe_list_every_recipe():
    a, b, one = _ops()
    with pytest.raises(errors.ShapeError, match=r"scale_a has shape \(4, 3\).*tensor-wise.*row-wise: scale_a \(4, 1\) "
                                                 r"and scale_b \(1, 8\).*block-wise.*scale_a \(4, 2\) and scale_b \(2, 1\)"):
        fp8.scaled_matmul(a, b, np.ones((4, 3), np.float32), np.ones((1, 8), np.float32))
    with pytest.raises(errors.ShapeError, match="row-wise"):       # mixed recipes are refused too
        fp8.scaled_matmul(a, b, np.ones((4, 1), np.float32), one)


@pytest.mark.parametrize("dtype", ["float99", "float8_e4m3fnuz", np.int8])
def test_quantize_to_a_dtype_it_does_not_make(dtype):
    with pytest.raises(errors.DTypeError, match="quantize to float8_e4m3fn"):
        fp8.quantize_fp8(np.ones((2, 4), np.float32), "row", dtype)


def test_typed_errors_name_the_argument():
    a, b, one = _ops()
    with pytest.raises(errors.DTypeError, match="a has dtype float32.*quantize_fp8"):
        fp8.scaled_matmul(a.astype(np.float32), b, one, one)
    with pytest.raises(errors.DTypeError, match="scale_b has dtype float64"):
        fp8.scaled_matmul(a, b, one, one.astype(np.float64))
    with pytest.raises(errors.ShapeError, match=r"a.shape\[1\] \(256\) must equal b.shape\[0\] \(255\)"):
        fp8.scaled_matmul(a, b[:255], one, one)
    with pytest.raises(errors.ShapeError, match=r"bias has shape \(4,\).*\(8,\)"):
        fp8.scaled_matmul(a, b, one, one, bias=np.ones(4, np.float32))
    with pytest.raises(errors.DTypeError, match="out_dtype=float64"):
        fp8.scaled_matmul(a, b, one, one, out_dtype="float64")
    with pytest.raises(errors.FrameworkError, match="b a jax"):          # NumPy and torch fp8 mix; JAX's not
        fp8.scaled_matmul(a, jnp.ones((256, 8), jnp.float8_e4m3fn), one, one)
    with pytest.raises(errors.ShapeError, match="recipe='blocks'"):
        fp8.quantize_fp8(np.ones((2, 2), np.float32), "blocks")
    with pytest.raises(errors.ShapeError, match="needs a 2-D x"):
        fp8.quantize_fp8(np.ones((2, 2, 2), np.float32), "row")
    with pytest.raises(errors.DTypeError, match="dtype=float8_e4m3fnuz"):
        fp8.quantize_fp8(np.ones((2, 2), np.float32), dtype="float8_e4m3fnuz")


def test_explain_reports_the_copy_a_kernel_would_need():
    a, b, one = _ops()
    assert "b: a transposing copy to K-major (2048 bytes)" in fp8.explain_scaled_matmul(a, b, one, one)
    text = fp8.explain_scaled_matmul(a, np.asfortranarray(b), one, one)
    assert "no copy" in text.rsplit(":", 1)[1] and "tensor-wise" in text
    assert "a: a transposing copy" in fp8.explain_scaled_matmul(np.asfortranarray(a), np.asfortranarray(b), one, one)


def test_explain_takes_scaled_matmul():
    """xgemm.explain(a, b, scale_a, scale_b, op="scaled_matmul") is fp8.explain_scaled_matmul's text."""
    import xgemm
    a, b, one = _ops()
    assert xgemm.explain(a, b, one, one, op="scaled_matmul") == fp8.explain_scaled_matmul(a, b, one, one)
    assert "transposing copy" in xgemm.explain(a, b, one, one, op="scaled_matmul")


def test_numpy_and_torch_fp8_operands_mix_both_ways():
    """NumPy's fp8 (ml_dtypes) has no DLPack type code: the bytes cross as uint8 views, zero-copy,
    as bfloat16's do as int16."""
    rng = np.random.default_rng(0)
    qa, sa = fp8.quantize_fp8(rng.standard_normal((6, 200)).astype(np.float32), "tensor")
    qb, sb = fp8.quantize_fp8(rng.standard_normal((140, 200)).astype(np.float32), "tensor")
    qb = qb.T                                                   # (K, N), K-major
    want = fp8.scaled_matmul(qa, qb, sa, sb, out_dtype="float32")
    ta = torch.from_numpy(qa.view(np.uint8)).view(torch.float8_e4m3fn)
    tb = torch.from_numpy(qb.view(np.uint8)).view(torch.float8_e4m3fn)
    got = fp8.scaled_matmul(ta, qb, torch.from_numpy(np.asarray(sa)), torch.from_numpy(np.asarray(sb)), out_dtype="float32")
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    got = fp8.scaled_matmul(qa, tb, sa, sb, out_dtype="float32")
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
