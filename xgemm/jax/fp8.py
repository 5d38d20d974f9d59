"""FP8 GEMM in JAX: scaled_matmul with its custom_vjp, and quantize_fp8; both work eagerly and in
jax.jit, jax.vmap and jax.export (xgemm/fp8.py's docstring has the recipes and the scale convention:
dequantized = fp8 value * scale).

Gradients (custom_vjp). The forward is out = a_deq @ b_deq + bias with a_deq = a * scale_a,
b_deq = b * scale_b. The fp8 operands a and b receive the gradients of the DEQUANTIZED operands:
    grad a := d loss / d a_deq = dy @ b_deq^T        grad b := d loss / d b_deq = a_deq^T @ dy
(not d/da, which would carry an extra factor scale_a): the straight-through convention of FP8
training, where a_deq stands for the high-precision tensor a was quantized from. They are float32
products cast to out_dtype (bfloat16 by default; float32 when out_dtype is float32), not fp8.
bias gets sum(dy) over rows in its dtype; the scales get zeros (no gradient).
grad_dtype="float8_e5m2": dy is first quantized row-wise to e5m2 (one scale per row of dy, as
quantize_fp8(dy, "row", "float8_e5m2")) and dequantized, then the same two products run: what an
FP8 kernel's dgrad / wgrad would compute. Forward mode (jvp) is not defined, as for xgemm.jax.gemm.

The products are XLA's dot in float32 (the embedded default); an FP8 kernel replaces _product with
a primitive whose cuda lowering takes the scales, the custom_vjp structure unchanged.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp

from xgemm import arrays
from xgemm.core import fp8_checks
from xgemm.jax import inputs

_PRECISION = jax.lax.Precision.HIGHEST          # float32 products in float32 on GPUs too (no TF32)


class Fp8Config(NamedTuple):
    out: str
    a_block: Tuple[int, int]
    b_block: Tuple[int, int]
    grad_dtype: Optional[str]


def _checked(fn, a, b, scale_a, scale_b, bias, out_dtype):
    a, b, sa, sb = (inputs.as_jax(fn, n, x) for n, x in zip(("a", "b", "scale_a", "scale_b"), (a, b, scale_a, scale_b)))
    fp8_checks.fp8_dtype(fn, "a", arrays.requested_dtype(a.dtype))
    fp8_checks.fp8_dtype(fn, "b", arrays.requested_dtype(b.dtype))
    fp8_checks.scale_dtype(fn, "scale_a", arrays.requested_dtype(sa.dtype))
    fp8_checks.scale_dtype(fn, "scale_b", arrays.requested_dtype(sb.dtype))
    recipe = fp8_checks.matmul_recipe(fn, a.shape, b.shape, sa.shape, sb.shape)
    if bias is not None:
        bias = inputs.as_jax(fn, "bias", bias)
        fp8_checks.bias(fn, arrays.requested_dtype(bias.dtype), bias.shape, recipe.n)
    return a, b, sa, sb, bias, fp8_checks.out_dtype(fn, arrays.requested_dtype(out_dtype)), recipe


def scaled_matmul(a: Any, b: Any, scale_a: Any, scale_b: Any, *, out_dtype: Any = jnp.bfloat16, bias: Any = None,
                  grad_dtype: Optional[str] = None, fn: str = "scaled_matmul") -> jax.Array:
    """(a * scale_a) @ (b * scale_b) + bias in float32, cast to out_dtype; a [M, K], b [K, N] fp8;
    the recipe from the scales' shapes. Gradients: the module docstring."""
    a, b, sa, sb, bias, out, recipe = _checked(fn, a, b, scale_a, scale_b, bias, out_dtype)
    cfg = Fp8Config(out, recipe.a_block, recipe.b_block, fp8_checks.grad_dtype(fn, grad_dtype))
    return _jit_scaled_matmul(a, b, sa, sb, bias, cfg)


def quantize_fp8(x: Any, recipe: str = "tensor", dtype: Any = jnp.float8_e4m3fn, *, fn: str = "quantize_fp8"):
    """(x_fp8, scale), x ~= x_fp8 * scale (float32 scale); recipes and saturation as xgemm.quantize_fp8.
    No gradient is defined through it (a cast)."""
    x = inputs.as_jax(fn, "x", x)
    dt = fp8_checks.fp8_dtype(fn, "dtype", arrays.requested_dtype(dtype))
    fp8_checks.quantize_block(fn, recipe, x.shape)
    fp8_checks.quantize_source(fn, arrays.requested_dtype(x.dtype))
    return _jit_quantize(x, recipe, dt)


def explain_scaled_matmul(a: Any, b: Any, scale_a: Any, scale_b: Any, *, fn: str = "explain") -> str:
    """The plan text: JAX arrays are row-major, so a is K-major and b would need a transposing copy."""
    _, _, _, _, _, _, recipe = _checked(fn, a, b, scale_a, scale_b, None, None)
    return fp8_checks.kernel_needs(recipe, True, recipe.n <= 1 or recipe.k <= 1)


# ---------------------------------------------------------------------------------------------

def _quantize(x, recipe: str, dt: str):
    block, _ = fp8_checks.quantize_block("quantize_fp8", recipe, x.shape)
    return fp8_checks.quantize(jnp, x, block, jnp.dtype(dt), fp8_checks.FP8_MAX[dt], jnp.float32)


def _dequantized(a, b, sa, sb, cfg: Fp8Config):
    return (fp8_checks.dequantize(jnp, a, sa, cfg.a_block, jnp.float32),
            fp8_checks.dequantize(jnp, b, sb, cfg.b_block, jnp.float32))


def _product(x, y):
    return jnp.matmul(x, y, precision=_PRECISION, preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _scaled_matmul(a, b, sa, sb, bias, cfg: Fp8Config):
    a_deq, b_deq = _dequantized(a, b, sa, sb, cfg)
    y = _product(a_deq, b_deq)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(cfg.out)


def _fwd(a, b, sa, sb, bias, cfg):
    return _scaled_matmul(a, b, sa, sb, bias, cfg), (a, b, sa, sb, bias)


def _bwd(cfg, res, dy):
    a, b, sa, sb, bias = res
    a_deq, b_deq = _dequantized(a, b, sa, sb, cfg)
    dy = dy.astype(jnp.float32)
    if cfg.grad_dtype is not None:            # row-wise e5m2, as an FP8 dgrad / wgrad kernel would read it
        q, s = _quantize(dy, "row", cfg.grad_dtype)
        dy = fp8_checks.dequantize(jnp, q, s, (1, dy.shape[1]), jnp.float32)
    da = _product(dy, b_deq.T).astype(cfg.out)
    db = _product(a_deq.T, dy).astype(cfg.out)
    dbias = None if bias is None else jnp.sum(dy, axis=0).astype(bias.dtype)
    return da, db, jnp.zeros_like(sa), jnp.zeros_like(sb), dbias


_scaled_matmul.defvjp(_fwd, _bwd)

# eager arrays run one compiled call; inside a trace the jit is inlined
_jit_scaled_matmul = jax.jit(_scaled_matmul, static_argnums=5)
_jit_quantize = jax.jit(_quantize, static_argnums=(1, 2))
