"""torch.library op xgemm::scaled_matmul: FP8 GEMM under torch.compile (one opaque op, fake impl).

    scaled_matmul_op(a[M, K] fp8, b[K, N] fp8, scale_a, scale_b, bias[N] | None, out_dtype) -> [M, N]

The real implementation is xgemm/fp8.py's eager path (the embedded default now, an FP8 kernel later);
recipes and the scale convention are in that module's docstring.

No autograd: torch casts a gradient to its input's dtype, so an fp8 a or b could only hold an fp8
(saturated, 3-bit-mantissa) gradient. The differentiable path belongs on high-precision inputs
(quantize inside the op, straight-through for the cast, grads dx = dy @ w_deq^T, dw = x_deq^T @ dy
in x's and w's dtypes), which is not built yet; scaled_matmul() below refuses inputs that require grad.
Imported only when a torch tensor needs the op (import xgemm stays light).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from xgemm import arrays, errors, fp8


@torch.library.custom_op("xgemm::scaled_matmul", mutates_args=())
def scaled_matmul_op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                     bias: Optional[torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:
    return fp8.scaled_matmul(a, b, scale_a, scale_b, out_dtype=out_dtype, bias=bias)


@scaled_matmul_op.register_fake
def _scaled_matmul_fake(a, b, scale_a, scale_b, bias, out_dtype):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def scaled_matmul(a: Any, b: Any, scale_a: Any, scale_b: Any, *, out_dtype: Any = "bfloat16",
                  bias: Any = None) -> torch.Tensor:
    """xgemm.fp8.scaled_matmul through the op (checked eagerly first; inside a torch.compile trace
    the op checks at run time)."""
    if torch.compiler.is_compiling():
        return scaled_matmul_op(a, b, scale_a, scale_b, bias, getattr(torch, arrays.requested_dtype(out_dtype)))
    c = fp8.check_scaled_matmul(a, b, scale_a, scale_b, out_dtype, bias)
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad
                                       for x in (c.a, c.b, c.scale_a, c.scale_b, c.bias)):
        raise errors.DTypeError("scaled_matmul: an input requires grad, but torch would cast a gradient to fp8; "
                                "the torch op has no backward yet: call it under torch.no_grad(), or use "
                                "xgemm.jax.scaled_matmul for dequantized-operand gradients")
    return scaled_matmul_op(c.a, c.b, c.scale_a, c.scale_b, c.bias, getattr(torch, c.out_dtype))
