"""xgemm.fp8_matmul: quantize a and b (high precision) with a recipe, multiply as scaled_matmul does,
and differentiate straight through the quantization (issue 21's torch autograd and JAX custom_vjp).

Values: against float64 products of the operands as quantize_fp8 dequantizes them (test_fp8.py's
independent expansion of the scales). Grads: against float64 dy @ b_deq^T, a_deq^T @ dy and
sum(dy), for torch autograd (eager and torch.compile(fullgraph=True)) and jax.grad."""
import contextlib

import ml_dtypes
import numpy as np
import pytest

import xgemm
from xgemm import errors
from xgemm.core import fp8_checks

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy

from test_fp8 import _deq64, _np  # noqa: E402

RECIPES = list(fp8_checks.OPERAND_RECIPES)
SHAPES = [(5, 300, 130), (3, 128, 256), (1, 7, 1)]


def _operands(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32),
            rng.standard_normal(n).astype(np.float32))


def _dequantized64(x, recipe):
    """x as the forward multiplies it: quantize_fp8 on NumPy, expanded in float64 by the test's code."""
    q, s = xgemm.quantize_fp8(x, recipe)
    return _deq64(q, s, recipe)


def _close(got, ref, tol):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape and np.isfinite(got).all()
    err = np.abs(got - ref).max() / max(np.abs(ref).max(), 1.0)
    assert err <= tol, f"max error {err:.2e} (relative to the largest |ref|) > {tol}"


def _to(fw, x, dtype):
    if fw == "torch":
        return torch.from_numpy(x).to(getattr(torch, dtype))
    if fw == "jax":
        return jnp.asarray(x, dtype)
    return x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


@pytest.mark.parametrize("fw", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_values_match_float64_of_the_quantized_operands(fw, recipe, shape):
    m, k, n = shape
    a, b, bias = _operands(m, k, n)
    ra, rb = fp8_checks.OPERAND_RECIPES[recipe]
    y = xgemm.fp8_matmul(_to(fw, a, "float32"), _to(fw, b, "float32"), recipe=recipe, bias=_to(fw, bias, "float32"))
    assert str(y.dtype).endswith("float32")                 # a's dtype by default
    ref = _dequantized64(a, ra) @ _dequantized64(b, rb) + bias
    _close(_np(y), ref, 1e-5)
    # and the quantization is the recipe's: the float64 product of the unquantized operands is only near
    _close(_np(y), a.astype(np.float64) @ b + bias, 0.25)


@pytest.mark.parametrize("recipe", RECIPES)
def test_out_dtype_and_bfloat16_inputs(recipe):
    a, b, _ = _operands(4, 256, 128)
    y = xgemm.fp8_matmul(torch.from_numpy(a).bfloat16(), torch.from_numpy(b).bfloat16(), recipe=recipe)
    assert y.dtype == torch.bfloat16
    y32 = xgemm.fp8_matmul(jnp.asarray(a, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16), recipe=recipe, out_dtype="float32")
    assert y32.dtype == jnp.float32


def _reference_grads(a, b, dy, recipe, grad_dtype=None):
    ra, rb = fp8_checks.OPERAND_RECIPES[recipe]
    a_deq, b_deq = _dequantized64(a, ra), _dequantized64(b, rb)
    dy = dy.astype(np.float64)
    if grad_dtype is not None:                       # row-wise e5m2 of dy, expanded by the test
        q, s = xgemm.quantize_fp8(dy.astype(np.float32), "row", grad_dtype)
        dy = _deq64(q, s, "row")
    return dy @ b_deq.T, a_deq.T @ dy, dy.sum(0)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("grad_dtype", [None, "float8_e5m2"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_torch_grads_are_the_dequantized_operands(recipe, grad_dtype, compiled):
    m, k, n = 6, 260, 132
    a, b, bias = _operands(m, k, n, seed=1)
    dy = np.random.default_rng(2).standard_normal((m, n)).astype(np.float32)
    ta, tb, tbias = (torch.from_numpy(x).requires_grad_() for x in (a, b, bias))

    def f(a, b, bias):
        return xgemm.fp8_matmul(a, b, recipe=recipe, bias=bias, grad_dtype=grad_dtype)
    with contextlib.ExitStack() as stack:
        if compiled:
            # the compile caches key on the forward graph, not on the op's backward source: a stale
            # entry would test an older backward
            stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
            stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
            torch._dynamo.reset()
            f = torch.compile(f, fullgraph=True)
        y = f(ta, tb, tbias)
        y.backward(torch.from_numpy(dy))
    da, db, dbias = _reference_grads(a, b, dy, recipe, grad_dtype)
    _close(ta.grad.numpy(), da, 1e-5)
    _close(tb.grad.numpy(), db, 1e-5)
    _close(tbias.grad.numpy(), dbias, 1e-5)
    assert ta.grad.dtype == tb.grad.dtype == torch.float32


def test_torch_grads_keep_each_operand_dtype():
    a, b, _ = _operands(3, 128, 64)
    ta = torch.from_numpy(a).bfloat16().requires_grad_()
    tb = torch.from_numpy(b).half().requires_grad_()
    xgemm.fp8_matmul(ta, tb, recipe="row").float().sum().backward()
    assert ta.grad.dtype == torch.bfloat16 and tb.grad.dtype == torch.float16


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("grad_dtype", [None, "float8_e5m2"])
def test_jax_grads_are_the_dequantized_operands(recipe, grad_dtype):
    m, k, n = 6, 260, 132
    a, b, bias = _operands(m, k, n, seed=1)
    dy = np.random.default_rng(2).standard_normal((m, n)).astype(np.float32)

    def loss(a, b, bias):
        y = xgemm.fp8_matmul(a, b, recipe=recipe, bias=bias, grad_dtype=grad_dtype)
        return jnp.sum(y * dy)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(jnp.asarray(a), jnp.asarray(b), jnp.asarray(bias))
    for got, ref in zip(grads, _reference_grads(a, b, dy, recipe, grad_dtype)):
        _close(got, ref, 1e-5)


def test_jax_vmap_quantizes_each_instance():
    a, b, _ = _operands(4, 128, 32)
    stack = np.stack([a, 8 * a])
    y = jax.vmap(lambda x: xgemm.fp8_matmul(x, jnp.asarray(b)))(jnp.asarray(stack))
    for i in range(2):
        _close(y[i], np.asarray(xgemm.fp8_matmul(stack[i], b)), 1e-6)


def test_typed_errors_name_the_argument():
    a, b, _ = _operands(4, 128, 32)
    with pytest.raises(errors.ShapeError, match="recipe='rows'"):
        xgemm.fp8_matmul(a, b, recipe="rows")
    with pytest.raises(errors.ShapeError, match=r"a.shape\[1\]"):
        xgemm.fp8_matmul(a, b[:64])
    with pytest.raises(errors.DTypeError, match="a has dtype float8_e4m3fn.*scaled_matmul"):
        xgemm.fp8_matmul(a.astype(ml_dtypes.float8_e4m3fn), b)
    with pytest.raises(errors.DTypeError, match="grad_dtype"):
        xgemm.fp8_matmul(torch.from_numpy(a).requires_grad_(), torch.from_numpy(b), grad_dtype="float8_e4m3fn")
    with pytest.raises(errors.ShapeError, match="bias"):
        xgemm.fp8_matmul(jnp.asarray(a), jnp.asarray(b), bias=jnp.ones(31))
