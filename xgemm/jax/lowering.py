"""The `cuda` lowering of xgemm's primitives: build the Problem, ask the dispatch table, emit the kernel.

At lowering time the operands' shapes, dtypes and layout hints become a GemmProblem /
SoftmaxProblem (framework "jax", device cuda with the target arch) and policy.choose() picks the
kernel, exactly as for eager calls. The kernel's `jax_lowering(problem, policy)` hook
(kernels/_common.py) says what to run:
  runtime.calls.Launch      a prebuilt cubin (Gluon) launched by the native handler in ffi/;
  runtime.calls.TvmFfiCall  a TVM-FFI function (a CuTe kernel, the same function eager calls use)
                            called with the buffers as DLTensor* (or strided views of them);
  None                      XLA's own op (the embedded default, jax/primitives.py's reference).

What the hooks receive (the same shapes `run()` gets for eager calls):
  gemm     a (M, K) or (L, M, K), b (K, N) or (L, K, N), c and d (M, N) or (L, M, N): batch dims
           broadcast and folded into L; when B has no batch dims and A is row-major, the batch is
           folded into M instead (problem.m = L*M, problem.batch = ()), a free reshape. A and B
           are row- or col-major as problem.a/b.majorness says (the XLA layout requested for
           them); C and D are row-major. alignment: 16 bytes assumed for XLA buffers (the
           handler checks the pointers at run time) and the leading/batch strides.
  softmax  x as (rows, cols), the reduced dim contiguous (an XLA layout, not a copy).
Under jax.export the hook is asked for a portable call (no process-local TVM-FFI handle), so an
exported module stays portable: such a problem exports as XLA's own op.
Target arch: the first CUDA device's, or $XGEMM_JAX_CUDA_ARCH (default "9.0") when lowering for
cuda on a machine without one (cross-lowering / export).
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import mlir

from xgemm.core import layout, policy
from xgemm.core.problem import COL, ROW, Device, Epilogue, GemmProblem, Operand, SoftmaxProblem
from xgemm.jax import ffi as jax_ffi
from xgemm.jax import primitives
from xgemm.jax.primitives import reference_gemm, reference_softmax, split_exchange_operands
from xgemm.runtime.calls import Launch, TvmFfiCall

# ---------------------------------------------------------------------------------------------
# The target device

@functools.lru_cache(maxsize=None)
def _cuda_devices() -> Tuple[Any, ...]:
    try:
        return tuple(jax.devices("cuda"))
    except RuntimeError:         # no CUDA backend in this process: cross-lowering
        return ()


def target_device() -> Device:
    devices = _cuda_devices()
    cc = getattr(devices[0], "compute_capability", None) if devices else None
    text = str(cc) if cc else os.environ.get("XGEMM_JAX_CUDA_ARCH", "9.0")
    major, _, minor = text.partition(".")
    return Device("cuda", 0, (int(major), int(minor or 0)))


def ensure_registered() -> None:
    if _cuda_devices():          # XLA needs the target at compile time; pure lowering does not
        jax_ffi.register()


# ---------------------------------------------------------------------------------------------
# Problems

def _matrix(shape: Tuple[int, ...], dtype: Any, major: str) -> Operand:
    return layout.dense_operand(tuple(shape), np.dtype(dtype).name, np.dtype(dtype).itemsize, major)


@dataclass(frozen=True)
class GemmShapes:
    """How the primitive's operands become the kernel's (L,)M,K / K,N / M,N arrays."""
    problem: GemmProblem
    fold_m: bool                     # batch folded into M (B has no batch dims, A row-major)
    batch: Tuple[int, ...]           # broadcast batch shape of the result
    lead: Tuple[int, ...]            # (L,) or () for the kernel arrays
    out_shape: Tuple[int, ...]       # the primitive's result shape


def gemm_shapes(a_shape, a_dtype, b_shape, c_shape, c_dtype, *, alpha, beta, out_dtype,
                a_major=ROW, b_major=ROW, device: Optional[Device] = None) -> GemmShapes:
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    batch = tuple(jnp.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    count = math.prod(batch)
    b_batched = math.prod(b_shape[:-2]) > 1
    fold_m = count > 1 and not b_batched and a_major == ROW
    lead = () if (fold_m or count == 1) else (count,)
    mm = m * count if fold_m else m
    a_op = _matrix(lead + (mm, k), a_dtype, a_major)
    b_op = _matrix(lead + (k, n), a_dtype, b_major)
    c_op = _matrix(lead + (mm, n), c_dtype, ROW) if c_shape is not None else None
    epilogue = Epilogue(alpha=float(alpha), beta=float(beta), has_c=c_shape is not None,
                        out_dtype=np.dtype(out_dtype).name)
    problem = GemmProblem(m=mm, n=n, k=k, batch=() if fold_m else batch, a=a_op, b=b_op, c=c_op,
                          epilogue=epilogue, framework="jax", device=device or target_device())
    return GemmShapes(problem, fold_m, batch, lead, batch + (m, n))


def softmax_problem(shape, dtype, axis: int, device: Optional[Device] = None) -> SoftmaxProblem:
    shape = tuple(shape)
    cols = shape[axis]
    rows = math.prod(shape) // cols if cols else math.prod(shape[:axis] + shape[axis + 1:])
    x = _matrix((rows, cols), dtype, ROW)
    return SoftmaxProblem(rows=rows, cols=cols, shape=shape, axis=axis, x=x, out_dtype=np.dtype(dtype).name,
                          framework="jax", device=device or target_device())


def _concrete(*shapes) -> bool:
    return all(isinstance(d, (int, np.integer)) for s in shapes if s is not None for d in s)


def for_export(ctx) -> bool:
    """jax.export lowerings must be portable: no process-local TVM-FFI function handles."""
    return bool(getattr(getattr(ctx.module_context, "lowering_parameters", None), "for_export", False))


def col_layout(rank: int) -> Tuple[int, ...]:
    """Major-to-minor order with the second-to-last dim minor-most (column-major matrices)."""
    return tuple(range(rank - 2)) + (rank - 1, rank - 2)


# ---------------------------------------------------------------------------------------------
# GEMM

def gemm_rule(ctx, *args, alpha, beta, out_dtype, has_c, a_major=ROW, b_major=ROW, sm_margin=0,
              target: str = jax_ffi.TARGET, tvm_target: Optional[str] = None, route=None, into=None,
              has_dest=False):
    """xgemm_gemm; with `route`, xgemm_gemm_exchange (its result [d, recv])."""
    if route is not None:
        ensure_registered()
    fn = functools.partial(_gemm_kernel, alpha=alpha, beta=beta, out_dtype=out_dtype, a_major=a_major,
                           b_major=b_major, sm_margin=sm_margin, target=target, tvm_target=tvm_target,
                           portable=for_export(ctx), route=route, into=into, has_dest=has_dest)
    return mlir.lower_fun(fn, multiple_results=route is not None)(ctx, *args)


def _gemm_kernel(a, b, *c, alpha, beta, out_dtype, a_major, b_major, sm_margin, target, tvm_target, portable,
                 route=None, into=None, has_dest=False):
    """The GEMM's custom call; with `route` the trailing operands are an exchange's send buffer
    [and dest] and the result is [d, recv] (one fused call when the kernel is a TVM-FFI one, else two)."""
    send = dest = None
    if route is not None:
        (_, _, *c), send, dest = split_exchange_operands((a, b) + c, has_dest)
        dest = dest[0] if dest else None
    c = c[0] if c else None
    xkw = dict(into=into, dest=dest)

    def plus_exchange(d):
        return d if route is None else [d, jax_ffi.call_exchange(route, send, **xkw)[0]]

    if not _concrete(a.shape, b.shape, c.shape if c is not None else None) or 0 in a.shape + b.shape:
        return plus_exchange(reference_gemm(a, b, c, alpha=alpha, beta=beta, out_dtype=out_dtype))
    gs = gemm_shapes(a.shape, a.dtype, b.shape, c.shape if c is not None else None,
                     c.dtype if c is not None else None, alpha=alpha, beta=beta, out_dtype=out_dtype,
                     a_major=a_major, b_major=b_major)
    plan = policy.choose("gemm", gs.problem)
    if plan.kernel.name == "reference" and route is None:
        padded = _padded_operands(a, b, c, gs, out_dtype, a_major, b_major)
        if padded is not None:       # rows that are not 16-byte multiples: run on padded arrays
            a_p, b_p, c_p = padded
            d = _gemm_kernel(a_p, b_p, *([c_p] if c_p is not None else []), alpha=alpha, beta=beta,
                             out_dtype=out_dtype, a_major=a_major, b_major=b_major, sm_margin=sm_margin,
                             target=target, tvm_target=tvm_target, portable=portable)
            return d[..., :b.shape[-1]]
    p = gs.problem
    # Broadcast batch dims materialize only where an operand lacks them (XLA buffers are dense);
    # folding L into M (B without batch dims) is a bitcast of row-major A.
    a2 = jnp.broadcast_to(a, gs.batch + a.shape[-2:]).reshape(p.a.shape)
    b2 = b.reshape(p.b.shape) if gs.fold_m else jnp.broadcast_to(b, gs.batch + b.shape[-2:]).reshape(p.b.shape)
    c2 = jnp.broadcast_to(c, gs.out_shape).reshape(p.c.shape) if c is not None else None
    out_aval = jax.ShapeDtypeStruct(gs.lead + (p.m, p.n), np.dtype(out_dtype))
    operands = [a2, b2] + ([c2] if c2 is not None else [])
    layouts = [col_layout(a2.ndim) if a_major == COL else None,
               col_layout(b2.ndim) if b_major == COL else None] + ([None] if c2 is not None else [])
    plan, made = policy.attempt(plan, lambda plan: plan.kernel.jax_lowering(p, plan.policy, portable=portable,
                                                                             sm_margin=sm_margin))
    if made is None:                 # XLA's own op (the declared fallback)
        return plus_exchange(reference_gemm(a, b, c, alpha=alpha, beta=beta, out_dtype=out_dtype))
    ensure_registered()
    if isinstance(made, TvmFfiCall) and route is not None:     # the copy runs beside the kernel
        d, recv = jax_ffi.call_exchange(route, send, tc=made, operands=operands, out_avals=[out_aval],
                                        in_layouts=layouts, **xkw)
        return [d.reshape(gs.out_shape), recv]
    if isinstance(made, Launch):
        (d,) = jax_ffi.call(made, operands, [out_aval], in_layouts=layouts, target=target)
    else:
        (d,) = jax_ffi.call_tvm_ffi(made, operands, [out_aval], in_layouts=layouts, target=tvm_target)
    return plus_exchange(d.reshape(gs.out_shape))


def padded_shapes(gs: GemmShapes, a_shape, a_dtype, b_shape, c_shape, c_dtype, out_dtype, a_major=ROW,
                  b_major=ROW) -> Optional[Tuple[GemmShapes, int, int]]:
    """The eager staged problem (prepare.py) inside jit: an fp16/bf16 GEMM that no GPU kernel takes
    because a row of A, B or C is not a multiple of 16 bytes gets K and N padded (layout.padded_dims;
    the K padding of A and B zero, so it adds nothing; C padded only if it has D's N columns), when
    it is big enough to pay for XLA's pads (layout.pad_worth_it_in_jit). (the padded problem's
    GemmShapes, K, N) when a GPU kernel takes that, else None."""
    p = gs.problem
    if p.device.kind != "cuda" or np.dtype(a_dtype).name not in ("float16", "bfloat16"):
        return None
    if not layout.pad_worth_it_in_jit(p.flops):
        return None
    k, n = a_shape[-1], b_shape[-1]
    kp, np_ = layout.padded_dims(k, n, np.dtype(a_dtype).itemsize)
    if (kp, np_) == (k, n):
        return None
    if c_shape is not None and c_shape[-1] == n:
        c_shape = tuple(c_shape[:-1]) + (np_,)
    gp = gemm_shapes(tuple(a_shape[:-1]) + (kp,), a_dtype, tuple(b_shape[:-2]) + (kp, np_), c_shape, c_dtype,
                     alpha=p.epilogue.alpha, beta=p.epilogue.beta, out_dtype=out_dtype, a_major=a_major,
                     b_major=b_major, device=p.device)
    if policy.choose("gemm", gp.problem).kernel.name == "reference":
        return None
    return gp, kp, np_


def _padded_operands(a, b, c, gs: GemmShapes, out_dtype, a_major, b_major):
    """a, b, c zero-padded to padded_shapes()'s problem (XLA materializes them), or None."""
    got = padded_shapes(gs, a.shape, a.dtype, b.shape, c.shape if c is not None else None,
                        c.dtype if c is not None else None, out_dtype, a_major, b_major)
    if got is None:
        return None
    _, kp, np_ = got

    def pad(x, *tail):               # zeros after the last len(tail) dims' ends, up to `tail`
        lead = [(0, 0)] * (x.ndim - len(tail))
        return jnp.pad(x, lead + [(0, t - d) for t, d in zip(tail, x.shape[x.ndim - len(tail):])])
    c_p = pad(c, np_) if c is not None and c.shape[-1] == b.shape[-1] else c
    return pad(a, a.shape[-2], kp), pad(b, kp, np_), c_p


def exchange_rule(ctx, send, *dest, route, into=None, has_dest=False):
    """xgemm_exchange alone: the copy-engine collective-permute."""
    ensure_registered()
    fn = lambda x, *d: jax_ffi.call_exchange(route, x, into=into, dest=d[0] if d else None)[0]    # noqa: E731
    return mlir.lower_fun(fn, multiple_results=False)(ctx, send, *dest)


# ---------------------------------------------------------------------------------------------
# Softmax

def softmax_rule(ctx, x, *, axis, target: str = jax_ffi.TARGET, tvm_target: Optional[str] = None):
    (aval,) = ctx.avals_in
    if not _concrete(aval.shape) or 0 in aval.shape:
        return mlir.lower_fun(functools.partial(reference_softmax, axis=axis), multiple_results=False)(ctx, x)
    fn = functools.partial(_softmax_kernel, axis=axis, target=target, tvm_target=tvm_target, portable=for_export(ctx))
    return mlir.lower_fun(fn, multiple_results=False)(ctx, x)


def _softmax_kernel(x, *, axis, target, tvm_target, portable):
    problem = softmax_problem(x.shape, x.dtype, axis)
    plan = policy.choose("softmax", problem)
    made = plan.kernel.jax_lowering(problem, plan.policy, portable=portable)
    if made is None:
        return reference_softmax(x, axis=axis)
    ensure_registered()
    if isinstance(made, Launch):
        # The reduced dim minor-most, the others row-major: rows x cols in memory, no copy when
        # the producer can write that layout (XLA inserts a relayout only if it must).
        layout = tuple(d for d in range(x.ndim) if d != axis) + (axis,)
        (y,) = jax_ffi.call(made, [x], [jax.ShapeDtypeStruct(x.shape, x.dtype)],
                            in_layouts=[layout], out_layouts=[layout], target=target)
        return y
    moved = jnp.moveaxis(x, axis, -1)
    x2 = moved.reshape(problem.rows, problem.cols)
    (y2,) = jax_ffi.call_tvm_ffi(made, [x2], [jax.ShapeDtypeStruct(x2.shape, x2.dtype)], target=tvm_target)
    return jnp.moveaxis(y2.reshape(moved.shape), -1, axis)


# The kernel is chosen when a module is lowered (the cache of lowerings is per module), so a
# policy.force() or table change applies to the next jit trace, not to executables already compiled.
mlir.register_lowering(primitives.gemm_p, gemm_rule, platform="cuda")
mlir.register_lowering(primitives.softmax_p, softmax_rule, platform="cuda")
mlir.register_lowering(primitives.exchange_p, exchange_rule, platform="cuda")
mlir.register_lowering(primitives.gemm_exchange_p, gemm_rule, platform="cuda")
