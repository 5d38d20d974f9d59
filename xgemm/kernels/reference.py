"""The embedded default: the owner framework's own ops (NumPy, torch, CuPy; JAX goes through xgemm.jax).

Contract
- dtypes: float32, float16, bfloat16, float64; fp16/bf16 accumulate in float32, float64 in float64,
  then alpha/beta are applied in the accumulator type and the result is cast to the output dtype —
  the same numerics as the GPU kernels' fp32-accumulate epilogue.
- majorness / alignment / strides: any (the framework handles them; no copy is made).
- devices: whatever the framework runs on. On CPU this is the only kernel; on a GPU it is the declared
  fallback (torch.matmul -> cuBLAS, cupy.matmul -> cuBLAS), and explain() says why the others declined.
- beta == 0 never reads C, so NaN/Inf in C cannot leak into D.
"""
from __future__ import annotations

import contextlib
from typing import Any, Optional

from xgemm import arrays, errors
from xgemm.core import fp8_checks
from xgemm.core.problem import Policy


def _xp(x: Any):
    from array_api_compat import array_namespace
    return array_namespace(x)


def _dtype(xp, name: str):
    if name == "bfloat16" and xp.__name__.endswith("numpy"):
        import ml_dtypes
        return ml_dtypes.bfloat16
    return getattr(xp, name)


def _quiet(fw: str):
    """NumPy warns on inf-inf in softmax rows of -inf; the NaN result is the documented answer."""
    if fw == "numpy":
        import numpy
        return numpy.errstate(invalid="ignore", over="ignore")
    return contextlib.nullcontext()


def _store(result: Any, out: Optional[Any]) -> Any:
    if out is None:
        return result
    out.obj[...] = result
    return out.obj


class _Reference:
    """What the embedded default declares beside run(): it accepts every problem, inside jax.jit it
    is XLA's own op (jax/primitives.py's reference), and it has nothing to build ahead of time."""
    name = "reference"
    backend = "host"

    def supports(self, problem) -> Optional[str]:
        return None

    def jax_lowering(self, problem, policy, *, portable: bool = False, sm_margin: int = 0):
        return None

    def prebuild(self, arch: str):
        return []


class _ReferenceGemm(_Reference):
    ops = ("gemm",)

    def policy(self, problem) -> Policy:
        return Policy(notes=(f"{problem.framework}.matmul on {problem.device.kind}",))

    def run(self, problem, policy, operands, out, stream) -> Any:
        if problem.fused:            # a plan that names the reference for one means: compose it
            raise errors.KernelUnavailableError(
                f"no kernel fuses {problem.summary()}; compose the epilogue (xgemm.gemm does)")
        a, b, c = operands
        xp = _xp(a.obj)
        acc_t = _dtype(xp, "float64" if problem.a.dtype == "float64" else "float32")
        epi = problem.epilogue
        with _quiet(problem.framework):
            acc = xp.matmul(xp.astype(a.obj, acc_t), xp.astype(b.obj, acc_t))
            if epi.alpha != 1.0:
                acc = acc * epi.alpha
            if epi.reads_c:
                acc = acc + epi.beta * xp.astype(c.obj, acc_t)
            return _store(xp.astype(acc, _dtype(xp, epi.out_dtype)), out)


class _ReferenceSoftmax(_Reference):
    ops = ("softmax",)

    def policy(self, problem) -> Policy:
        return Policy(notes=(f"{problem.framework} max/exp/sum on {problem.device.kind}",))

    def run(self, problem, policy, operands, out, stream) -> Any:
        (x,) = operands
        xp = _xp(x.obj)
        acc_t = _dtype(xp, "float64" if problem.x.dtype == "float64" else "float32")
        axis = problem.axis
        with _quiet(problem.framework):
            x32 = xp.astype(x.obj, acc_t)
            if problem.rows * problem.cols == 0:
                return _store(xp.astype(x32, _dtype(xp, problem.out_dtype)), out)
            shifted = x32 - xp.max(x32, axis=axis, keepdims=True)
            e = xp.exp(shifted)
            y = e / xp.sum(e, axis=axis, keepdims=True)
            return _store(xp.astype(y, _dtype(xp, problem.out_dtype)), out)


class _ReferenceQuantize(_Reference):
    ops = ("quantize_fp8",)

    def policy(self, problem) -> Policy:
        return Policy(notes=(f"{problem.framework} abs/max/divide/clamp/cast on {problem.device.kind}",))

    def run(self, problem, policy, operands, out, stream) -> Any:
        """(q, scale) in the owner framework (operands (x, None); out None)."""
        x = operands[0].obj
        fw = problem.framework
        return fp8_checks.quantize(arrays.namespace(fw), x, problem.block, arrays.framework_dtype(fw, problem.out_dtype),
                                   fp8_checks.FP8_MAX[problem.out_dtype], arrays.framework_dtype(fw, "float32"),
                                   x.device)


GEMM = _ReferenceGemm()
SOFTMAX = _ReferenceSoftmax()
QUANTIZE = _ReferenceQuantize()
KERNELS = (GEMM, SOFTMAX, QUANTIZE)
