"""xgemm: Hopper-class GEMM and softmax for any DLPack array (NumPy, torch, JAX, CuPy).

    xgemm.matmul(a, b)                          # numpy.matmul semantics, result in a's framework
    xgemm.gemm(a, b, c, alpha=2.0, beta=1.0)    # D = alpha*A@B + beta*C
    xgemm.gemm(a, b, bias=v, activation="gelu_tanh")   # D = act(A@B + bias)
    xgemm.gated(x, w_gate_up, activation="swiglu")     # silu(x@Wg) * (x@Wu)
    xgemm.ragged_dot(x, w_experts, group_sizes)        # jax.lax.ragged_dot semantics (MoE)
    xgemm.scaled_matmul(a8, b8, sa, sb)                # FP8: tensor / row / block-wise scales
    xgemm.fp8_matmul(x, w, recipe="row")               # quantize + FP8 GEMM, differentiable
    xgemm.softmax(x, axis=-1)
    print(xgemm.explain(a, b))                  # kernel, policy, why others declined, copies made

Importing xgemm imports no framework and no compiler; they load when an array of theirs arrives.
"""
from xgemm import array_api, errors
from xgemm.api import (explain, fp8_matmul, gated, gemm, grouped_mm, matmul, quantize_fp8, ragged_dot, scaled_matmul,
                       softmax)
from xgemm.core import policy

__version__ = "0.1.0"
__all__ = ["matmul", "gemm", "gated", "ragged_dot", "grouped_mm", "scaled_matmul", "fp8_matmul", "quantize_fp8", "softmax", "explain", "errors", "policy", "array_api", "__version__"]
