"""torch.library ops xgemm::scaled_matmul and xgemm::fp8_matmul: FP8 GEMM under torch.compile
(opaque ops, fake impls), the second with autograd.

    scaled_matmul_op(a[M, K] fp8, b[K, N] fp8, scale_a, scale_b, bias[N] | None, out_dtype) -> [M, N]
    fp8_matmul_op(a[M, K], b[K, N], bias[N] | None, recipe, out_dtype, grad_dtype) -> [M, N]

The real implementation is xgemm/fp8.py's eager path (the embedded default now, an FP8 kernel later);
recipes and the scale convention are in that module's docstring.

scaled_matmul's autograd gives the scales (their exact gradients, the sum of the dequantized
operand's gradient times the fp8 values over each scale's block) and the bias theirs; an fp8 a or
b that requires grad is refused (errors.GradientError): torch casts a gradient to its input's
dtype, so it could only hold an fp8 (saturated, 3-bit-mantissa) gradient. The differentiable path is fp8_matmul, on the high-precision a and b: it quantizes
inside the op, and its backward gives the dequantized operands' gradients (straight through the
cast; core/fp8_checks.straight_through) in a's and b's dtypes. The backward re-quantizes a and b
(saved as given) rather than keeping their fp8 copies: one elementwise pass each, and no tensors
beyond the inputs held for it.
Imported only when a torch tensor needs the op (import xgemm stays light).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from xgemm import arrays, errors, fp8
from xgemm.core import fp8_checks


@torch.library.custom_op("xgemm::scaled_matmul", mutates_args=())
def scaled_matmul_op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                     bias: Optional[torch.Tensor], out_dtype: torch.dtype, use_fast_accum: bool = False) -> torch.Tensor:
    return fp8.scaled_matmul(a, b, scale_a, scale_b, out_dtype=out_dtype, bias=bias, use_fast_accum=use_fast_accum)


@scaled_matmul_op.register_fake
def _scaled_matmul_fake(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum=False):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def _scaled_matmul_setup(ctx, inputs, output):
    a, b, scale_a, scale_b, bias = inputs[:5]
    ctx.save_for_backward(a, b, scale_a, scale_b)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _scale_grad(xp, q: torch.Tensor, scale: torch.Tensor, block, dq: torch.Tensor) -> torch.Tensor:
    """d loss / d scale, given d loss / d (q * scale) = dq: the dequantize's own backward (a sum of
    dq * q over each scale's block)."""
    with torch.enable_grad():
        s = scale.detach().requires_grad_()
        (ds,) = torch.autograd.grad(fp8_checks.dequantize(xp, q, s, block, torch.float32, q.device), s, dq)
    return ds.to(scale.dtype)


def _scaled_matmul_backward(ctx, dy):
    """The scales' and the bias's gradients (a and b, fp8, get none: scaled_matmul() refuses them)."""
    a, b, scale_a, scale_b = ctx.saved_tensors
    xp = arrays.namespace("torch")
    recipe = fp8_checks.matmul_recipe("scaled_matmul", a.shape, b.shape, scale_a.shape, scale_b.shape)
    a_deq = fp8_checks.dequantize(xp, a, scale_a, recipe.a_block, torch.float32, a.device)
    b_deq = fp8_checks.dequantize(xp, b, scale_b, recipe.b_block, torch.float32, b.device)
    da, db, dsum = fp8_checks.straight_through(xp, dy, a_deq, b_deq, None, torch.float32, a.device)
    need = ctx.needs_input_grad
    return (None, None, _scale_grad(xp, a, scale_a, recipe.a_block, da) if need[2] else None,
            _scale_grad(xp, b, scale_b, recipe.b_block, db) if need[3] else None,
            dsum.to(ctx.bias_dtype) if need[4] else None, None, None)


scaled_matmul_op.register_autograd(_scaled_matmul_backward, setup_context=_scaled_matmul_setup)


def scaled_matmul(a: Any, b: Any, scale_a: Any, scale_b: Any, *, out_dtype: Any = "bfloat16",
                  bias: Any = None, use_fast_accum: bool = False) -> torch.Tensor:
    """xgemm.fp8.scaled_matmul through the op (checked eagerly first; inside a torch.compile trace
    the op checks at run time)."""
    if torch.compiler.is_compiling():
        return scaled_matmul_op(a, b, scale_a, scale_b, bias, getattr(torch, arrays.requested_dtype(out_dtype)),
                                use_fast_accum)
    c = fp8.check_scaled_matmul(a, b, scale_a, scale_b, out_dtype, bias)
    needs = [name for name, x in (("a", c.a), ("b", c.b)) if x.requires_grad]
    if needs and torch.is_grad_enabled():
        # fp8 a and b could only hold fp8 gradients (torch casts a gradient to its input's dtype)
        raise errors.GradientError(
            f"scaled_matmul: {' and '.join(needs)} require{'s' if len(needs) == 1 else ''} grad, and an fp8 tensor "
            f"can only hold an fp8 gradient; detach {' and '.join(needs)} (the scales and the bias get gradients), "
            f"train through xgemm.fp8_matmul on the high-precision tensors, or use xgemm.jax.scaled_matmul "
            f"(gradients of the dequantized operands)")
    return scaled_matmul_op(c.a, c.b, c.scale_a, c.scale_b, c.bias, getattr(torch, c.out_dtype), use_fast_accum)


@torch.library.custom_op("xgemm::fp8_matmul", mutates_args=())
def fp8_matmul_op(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], recipe: str,
                  out_dtype: torch.dtype, grad_dtype: Optional[str]) -> torch.Tensor:
    return fp8.fp8_matmul(a, b, recipe=recipe, out_dtype=out_dtype, bias=bias)


@fp8_matmul_op.register_fake
def _fp8_matmul_fake(a, b, bias, recipe, out_dtype, grad_dtype):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def _fp8_matmul_setup(ctx, inputs, output):
    a, b, bias, recipe, _, grad_dtype = inputs
    ctx.save_for_backward(a, b)
    ctx.recipe, ctx.grad_dtype = recipe, grad_dtype
    ctx.bias_dtype = None if bias is None else bias.dtype


def _dequantized(x: torch.Tensor, recipe: str) -> torch.Tensor:
    """x quantized to e4m3 with the recipe's blocks and back, in float32: the operand the forward used."""
    xp = arrays.namespace("torch")
    block, scales = fp8_checks.quantize_block("fp8_matmul", recipe, x.shape)
    q, s = fp8_checks.quantize(xp, x, block, scales, torch.float8_e4m3fn, fp8_checks.FP8_MAX["float8_e4m3fn"],
                               torch.float32, x.device)
    return fp8_checks.dequantize(xp, q, s, block, torch.float32, x.device)


def _fp8_matmul_backward(ctx, dy):
    a, b = ctx.saved_tensors
    ra, rb = fp8_checks.OPERAND_RECIPES[ctx.recipe]
    e5m2 = None if ctx.grad_dtype is None else torch.float8_e5m2
    da, db, dsum = fp8_checks.straight_through(arrays.namespace("torch"), dy, _dequantized(a, ra),
                                               _dequantized(b, rb), e5m2, torch.float32, a.device)
    dbias = None if ctx.bias_dtype is None else dsum.to(ctx.bias_dtype)
    return da.to(a.dtype), db.to(b.dtype), dbias, None, None, None


fp8_matmul_op.register_autograd(_fp8_matmul_backward, setup_context=_fp8_matmul_setup)


def fp8_matmul(a: Any, b: Any, *, recipe: str = "tensor", out_dtype: Any = None, bias: Any = None,
               grad_dtype: Optional[str] = None) -> torch.Tensor:
    """xgemm.fp8.fp8_matmul through the differentiable op (checked eagerly first; inside a
    torch.compile trace the op checks at run time)."""
    fn = "fp8_matmul"
    if torch.compiler.is_compiling():
        out = fp8_checks.fp8_matmul_dtypes(fn, arrays.dtype_name(a), arrays.dtype_name(b),
                                           arrays.requested_dtype(out_dtype))
    else:
        b, bias, _, out = fp8.check_fp8_matmul("torch", a, b, recipe, out_dtype, bias, fn=fn)
    return fp8_matmul_op(a, b, bias, recipe, getattr(torch, out), fp8_checks.grad_dtype(fn, grad_dtype))
