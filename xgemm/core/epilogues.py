"""The epilogues a GEMM may end with: their names, their math and their derivatives, once.

    D = act(alpha * A @ B + beta * C + bias)                     gemm(..., bias=, activation=)
    D = act(H[..., :n]) * H[..., n:],  H = A @ B + bias          gated(..., activation=)

`bias` is a vector of N values added to every row. A gated product's B holds the gate and up
projections side by side ([gate | up], N = 2n columns); weights stored interleaved (gate and up
columns alternating, [g0, u0, g1, u1, ...]) map onto it by `b.reshape(K, n, 2).swapaxes(-1, -2)
.reshape(K, 2 * n)` (and the bias likewise).

The functions take the array namespace `xp` (NumPy, torch and CuPy through array_api_compat, or
jax.numpy), so the embedded default, the composed eager path and the JAX rules compute the same
expressions; they run in the accumulator type (float32, or float64 for float64 operands). Names
follow torch.nn.functional: gelu is the exact (erf) GELU, gelu_tanh its tanh approximation,
relu2 the squared ReLU, silu x * sigmoid(x); swiglu, geglu and reglu gate with silu, gelu and
relu. No framework is imported here.
"""
from __future__ import annotations

import math
from typing import Any, Optional

ACTIVATIONS = ("relu", "relu2", "gelu", "gelu_tanh", "silu", "sigmoid")
GATED = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu"}     # gated name -> the gate's activation

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _erf(xp: Any, x: Any) -> Any:
    """erf, which the array API lacks: each framework's own, NumPy's through math.erf."""
    name = getattr(xp, "__name__", "")
    if "torch" in name:
        import torch
        return torch.erf(x)
    if name.startswith("jax"):
        import jax.lax
        return jax.lax.erf(x)
    if "cupy" in name:
        import cupyx.scipy.special
        return cupyx.scipy.special.erf(x)
    import numpy
    return numpy.vectorize(math.erf, otypes=[x.dtype])(x)


def _sigmoid(xp: Any, x: Any) -> Any:
    return 1.0 / (1.0 + xp.exp(-x))


def apply(xp: Any, x: Any, activation: Optional[str]) -> Any:
    """act(x) elementwise; None is the identity."""
    if activation is None:
        return x
    if activation == "relu":
        return xp.maximum(x, xp.zeros_like(x))
    if activation == "relu2":
        r = xp.maximum(x, xp.zeros_like(x))
        return r * r
    if activation == "gelu":
        return 0.5 * x * (1.0 + _erf(xp, x * _INV_SQRT_2))
    if activation == "gelu_tanh":
        return 0.5 * x * (1.0 + xp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    if activation == "silu":
        return x * _sigmoid(xp, x)
    if activation == "sigmoid":
        return _sigmoid(xp, x)
    raise ValueError(activation)


def derivative(xp: Any, x: Any, activation: Optional[str]) -> Any:
    """act'(x) elementwise (what a backward multiplies the incoming gradient by)."""
    if activation is None:
        return xp.ones_like(x)
    if activation == "relu":
        return xp.astype(x > 0, x.dtype)
    if activation == "relu2":
        return 2.0 * xp.maximum(x, xp.zeros_like(x))
    if activation == "gelu":
        return 0.5 * (1.0 + _erf(xp, x * _INV_SQRT_2)) + x * _INV_SQRT_2PI * xp.exp(-0.5 * x * x)
    if activation == "gelu_tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        t = xp.tanh(inner)
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)
    if activation == "silu":
        s = _sigmoid(xp, x)
        return s * (1.0 + x * (1.0 - s))
    if activation == "sigmoid":
        s = _sigmoid(xp, x)
        return s * (1.0 - s)
    raise ValueError(activation)


def gate(xp: Any, h: Any, gated: str) -> Any:
    """act(gate) * up of a [gate | up] pre-activation h (last dim 2n) -> last dim n."""
    n = h.shape[-1] // 2
    return apply(xp, h[..., :n], GATED[gated]) * h[..., n:]


def activate(xp: Any, h: Any, activation: Optional[str]) -> Any:
    """apply() for a plain activation (or None), gate() for a gated one (a GATED name)."""
    return gate(xp, h, activation) if activation in GATED else apply(xp, h, activation)


def gate_backward(xp: Any, h: Any, dy: Any, gated: str) -> Any:
    """d(act(gate) * up)/dh, given dy of the gated result: [dy * up * act'(gate) | dy * act(gate)]."""
    n = h.shape[-1] // 2
    g, u, act = h[..., :n], h[..., n:], GATED[gated]
    return xp.concat([dy * u * derivative(xp, g, act), dy * apply(xp, g, act)], axis=-1)


def describe(bias: bool, activation: Optional[str], gated: bool, acc: str, where: str,
             fused_by: Optional[str] = None, gate_op: bool = False) -> str:
    """explain()'s epilogue line: fused into a kernel's epilogue (fused_by), or composed (the gate
    as the op xgemm::gate when gate_op)."""
    parts = (["bias"] if bias else []) + ([f"{activation} (act(gate) * up)" if gated else activation]
                                          if activation else [])
    if fused_by:
        return f"{' + '.join(parts)}, fused into {fused_by}'s epilogue (float32, one rounding to the output dtype)"
    if gate_op:
        return (f"{' + '.join(parts)}, composed after the product ({acc}): the gate as the op xgemm::gate "
                f"(one pass; no kernel fused it)")
    return f"{' + '.join(parts) or 'none'}, composed after the product in {where} ops ({acc}; no kernel fused it)"
