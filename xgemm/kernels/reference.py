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
from xgemm.core import epilogues, fp8_checks
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
        return fp8_checks.quantize(arrays.namespace(fw), x, problem.block, problem.scale_shape,
                                   arrays.framework_dtype(fw, problem.out_dtype),
                                   fp8_checks.FP8_MAX[problem.out_dtype], arrays.framework_dtype(fw, "float32"),
                                   x.device)


class _ReferenceGrouped(_Reference):
    """The grouped products on the owner framework's own ops, never reading the group sizes on the
    host (no device synchronization: CUDA-graph capturable, and a torch.compile trace of it has no
    data-dependent branch): each row's group is searchsorted(ends, arange(T), side='right') on the
    device, then each group's product over every row is computed and its rows selected (`where`, so
    NaN/Inf in other groups' rows or unused experts never leak). Cost: E times the grouped FLOPs,
    and O(T·K + T·N + K·N) memory beyond the operands."""
    ops = ("grouped",)

    def policy(self, problem) -> Policy:
        s = problem.shape
        if problem.framework == "jax":          # xgemm.jax's lowering: XLA's own ragged dot
            return Policy(notes=(f"XLA's jax.lax.ragged_dot{'_general' if s.ragged_k else ''} on "
                                 f"{problem.device.kind}",))
        return Policy(notes=(f"{problem.framework} ops on {problem.device.kind}: {s.groups} masked products "
                             f"of every {'index' if s.ragged_k else 'row'} ({s.groups} x the grouped FLOPs)",))

    def run(self, problem, policy, operands, out, stream) -> Any:
        """operands: (A, B, ends) views; the result in the owner framework."""
        a, b, ends = (v.obj for v in operands)
        fw = problem.framework
        xp = arrays.namespace(fw)
        acc = arrays.framework_dtype(fw, "float64" if problem.a.dtype == "float64" else "float32")
        result = (contract_groups if problem.shape.ragged_k else multiply_groups)(
            xp, a, b, ends, acc, arrays.framework_dtype(fw, problem.out_dtype))
        return _store(result, out)


class _ReferenceGate(_Reference):
    """The gated activation (and its backward) in the owner framework's ops, in float32."""
    ops = ("gate",)

    def policy(self, problem) -> Policy:
        return Policy(notes=(f"{problem.framework} ops in float32 on {problem.device.kind}",))

    def run(self, problem, policy, operands, out, stream) -> Any:
        """operands: (h, dy or None) views; the result in the owner framework."""
        fw = problem.framework
        xp = arrays.namespace(fw)
        f32 = arrays.framework_dtype(fw, "float32")
        h = xp.astype(operands[0].obj, f32)
        if problem.backward:
            y = epilogues.gate_backward(xp, h, xp.astype(operands[1].obj, f32), problem.gated)
        else:
            y = epilogues.gate(xp, h, problem.gated)
        return _store(xp.astype(y, arrays.framework_dtype(fw, problem.out_dtype)), out)


def _group_of_rows(xp: Any, ends: Any, rows: int, device: Any) -> Any:
    """Each row's group, on the device: E for rows at or beyond ends[-1] (they belong to none)."""
    return xp.searchsorted(ends, xp.arange(rows, dtype=ends.dtype, device=device), side="right")


def multiply_groups(xp: Any, lhs: Any, rhs: Any, ends: Any, acc: Any, out: Any) -> Any:
    """out[t] = lhs[t] @ rhs[group of t], zero for rows in no group. Any strides."""
    dev = lhs.device                 # not array_api_compat.device(): its lru_cache makes torch.compile warn
    rows, groups, n = lhs.shape[0], rhs.shape[0], rhs.shape[2]
    group = _group_of_rows(xp, ends, rows, dev)
    lhs_acc = xp.astype(lhs, acc)
    result = xp.zeros((rows, n), dtype=acc, device=dev)
    for e in range(groups):          # select, not add: other groups' NaN/Inf never reach a row
        result = xp.where((group == e)[:, None], xp.matmul(lhs_acc, xp.astype(rhs[e, ...], acc)), result)
    return xp.astype(result, out)


def contract_groups(xp: Any, a: Any, b: Any, ends: Any, acc: Any, out: Any) -> Any:
    """out[e] = a[:, T_e] @ b[T_e, :] over the contraction indices T_e of group e; zeros for an
    empty group and for indices in no group."""
    dev = a.device
    m, rows, n, groups = a.shape[0], a.shape[1], b.shape[1], ends.shape[0]
    group = _group_of_rows(xp, ends, rows, dev)
    a_acc, b_acc = xp.astype(a, acc), xp.astype(b, acc)
    zero = xp.zeros((), dtype=acc, device=dev)
    blocks = []
    for e in range(groups):          # both sides masked: 0 * NaN would leak from the other one
        mine = group == e
        blocks.append(xp.matmul(xp.where(mine[None, :], a_acc, zero), xp.where(mine[:, None], b_acc, zero)))
    result = xp.stack(blocks) if blocks else xp.zeros((0, m, n), dtype=acc, device=dev)
    return xp.astype(result, out)


GEMM = _ReferenceGemm()
SOFTMAX = _ReferenceSoftmax()
QUANTIZE = _ReferenceQuantize()
GROUPED = _ReferenceGrouped()
GATE = _ReferenceGate()
KERNELS = (GEMM, SOFTMAX, QUANTIZE, GROUPED, GATE)
