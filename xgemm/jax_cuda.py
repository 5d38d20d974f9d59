"""The `cuda` lowering of xgemm's primitives: build the Problem, ask the dispatch table, emit the kernel.

At lowering time the operands' shapes, dtypes and layout hints become a GemmProblem /
SoftmaxProblem (framework "jax", device cuda with the target arch) and policy.choose() picks the
kernel, exactly as for eager calls. The chosen kernel object is asked for one of three hooks:

  kernel.jax_launch(problem, policy) -> xgemm.jax_ffi.Launch
      a prebuilt cubin (e.g. Gluon, from the build cache) launched by the native handler in ffi/.
      Buffers: inputs (a, b[, c]) / (x,), then output 0, then scratch; see Param.input/output.
  kernel.jax_tvm_ffi(problem, policy) -> xgemm.jax_ffi.TvmFfiCall
      a TVM-FFI function (a CuTe kernel compiled with --enable-tvm-ffi: the same function the eager
      path calls) invoked by the native handler with the buffers as DLTensor* (or strided views of
      them, Arg.tensor(..., shape, strides)) and XLA's stream. The leanest path for CuTe kernels.
  kernel.jax_call(problem, policy) -> callable(a, b, c_or_None) -> d   /   callable(x2d) -> y2d
      any traceable JAX code, e.g. a CuTe kernel through cutlass.jax.cutlass_call
      (cutlass_gemm_call() below does the plumbing).

What the hooks receive (the same shapes `run()` gets for eager calls):
  gemm     a (M, K) or (L, M, K), b (K, N) or (L, K, N), c and d (M, N) or (L, M, N): batch dims
           broadcast and folded into L; when B has no batch dims and A is row-major, the batch is
           folded into M instead (problem.m = L*M, problem.batch = ()), a free reshape. A and B
           are row- or col-major as problem.a/b.majorness says (the XLA layout requested for
           them); C and D are row-major. alignment: 16 bytes assumed for XLA buffers (the
           handler checks the pointers at run time) and the leading/batch strides.
  softmax  x as (rows, cols), the reduced dim contiguous (an XLA layout, not a copy, for a
           jax_launch; a moved+reshaped array for a jax_call); y likewise.
Under jax.export the jax_tvm_ffi hook is skipped (its function handle is process-local), so an
exported module stays portable: such a problem exports as XLA's own op. A kernel that accepts a
jax problem but offers no hook falls back to XLA's own op with a warning (the reference kernel
does so silently: it is the declared fallback). Kernels written
before the hooks existed get one here (_ADAPTERS: gluon_softmax, cute_sgemm, cute_gemm_sm90,
cute_mma_sm80: they call the kernels' compiled functions exactly as their run() does); a kernel's
own hook wins.
Target arch: the first CUDA device's, or $XGEMM_JAX_CUDA_ARCH (default "9.0") when lowering for
cuda on a machine without one (cross-lowering / export).
"""
from __future__ import annotations

import functools
import math
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import mlir

from . import jax_ffi, policy
from .problem import COL, ROW, Device, Epilogue, GemmProblem, Operand, SoftmaxProblem
from .jax_primitives import reference_gemm, reference_softmax, split_exchange_operands


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


def _ensure_registered() -> None:
    if _cuda_devices():          # XLA needs the target at compile time; pure lowering does not
        jax_ffi.register()


# ---------------------------------------------------------------------------------------------
# Problems

def _align(*byte_values: int) -> int:
    align = 16
    while align > 1 and any(v % align for v in byte_values):
        align //= 2
    return align


def _matrix(shape: Tuple[int, ...], dtype: Any, major: str) -> Operand:
    itemsize = np.dtype(dtype).itemsize
    r, c = shape[-2], shape[-1]
    strides = (c, 1) if major == ROW else (1, r)
    lead = (c if major == ROW else r) * itemsize
    batch = ()
    if len(shape) == 3:
        batch = (r * c,)
    return Operand(shape=tuple(shape), strides=batch + strides, dtype=np.dtype(dtype).name, majorness=major,
                   alignment=_align(lead, *(s * itemsize for s in batch)))


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
    x = Operand(shape=(rows, cols), strides=(cols, 1), dtype=np.dtype(dtype).name, majorness=ROW,
                alignment=_align(cols * np.dtype(dtype).itemsize))
    return SoftmaxProblem(rows=rows, cols=cols, shape=shape, axis=axis, x=x, out_dtype=np.dtype(dtype).name,
                          framework="jax", device=device or target_device())


def _concrete(*shapes) -> bool:
    return all(isinstance(d, (int, np.integer)) for s in shapes if s is not None for d in s)


_warned: set = set()


def _for_export(ctx) -> bool:
    """jax.export lowerings must be portable: no process-local TVM-FFI function handles."""
    return bool(getattr(getattr(ctx.module_context, "lowering_parameters", None), "for_export", False))


def _hook(kernel: Any, portable: bool = False) -> Optional[str]:
    """'jax_launch' | 'jax_tvm_ffi' | 'jax_call' (the kernel's own or an adapter's), or None."""
    for name in ("jax_launch", "jax_tvm_ffi", "jax_call"):
        if callable(getattr(kernel, name, None)) and not (portable and name == "jax_tvm_ffi"):
            return name
    if kernel.name in _ADAPTERS and not (portable and _ADAPTERS[kernel.name][0] == "jax_tvm_ffi"):
        return _ADAPTERS[kernel.name][0]
    if portable and (callable(getattr(kernel, "jax_tvm_ffi", None)) or kernel.name in _ADAPTERS):
        return None          # the exported module runs XLA's op instead (declared, portable)
    if kernel.name != "reference" and kernel.name not in _warned:
        _warned.add(kernel.name)
        warnings.warn(f"xgemm: kernel {kernel.name} accepts this JAX problem but has no jax_launch/jax_call "
                      f"hook; running XLA's own op instead", RuntimeWarning, stacklevel=3)
    return None


def _col_layout(rank: int) -> Tuple[int, ...]:
    """Major-to-minor order with the second-to-last dim minor-most (column-major matrices)."""
    return tuple(range(rank - 2)) + (rank - 1, rank - 2)


# ---------------------------------------------------------------------------------------------
# GEMM

def _hook_fn(kernel: Any, hook: str) -> Callable[..., Any]:
    own = getattr(kernel, hook, None)
    return own if callable(own) else _ADAPTERS[kernel.name][1]


def gemm_rule(ctx, *args, alpha, beta, out_dtype, has_c, a_major=ROW, b_major=ROW, sm_margin=0,
              target: str = jax_ffi.TARGET, tvm_target: Optional[str] = None, route=None, into=None,
              has_dest=False):
    """xgemm_gemm; with `route`, xgemm_gemm_exchange (its result [d, recv])."""
    if route is not None:
        _ensure_registered()
    fn = functools.partial(_gemm_kernel, alpha=alpha, beta=beta, out_dtype=out_dtype, a_major=a_major,
                           b_major=b_major, sm_margin=sm_margin, target=target, tvm_target=tvm_target,
                           portable=_for_export(ctx), route=route, into=into, has_dest=has_dest)
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
    hook = _hook(plan.kernel, portable)
    if hook is None:
        return plus_exchange(reference_gemm(a, b, c, alpha=alpha, beta=beta, out_dtype=out_dtype))
    p = gs.problem
    # Broadcast batch dims materialize only where an operand lacks them (XLA buffers are dense);
    # folding L into M (B without batch dims) is a bitcast of row-major A.
    a2 = jnp.broadcast_to(a, gs.batch + a.shape[-2:]).reshape(p.a.shape)
    b2 = b.reshape(p.b.shape) if gs.fold_m else jnp.broadcast_to(b, gs.batch + b.shape[-2:]).reshape(p.b.shape)
    c2 = jnp.broadcast_to(c, gs.out_shape).reshape(p.c.shape) if c is not None else None
    out_aval = jax.ShapeDtypeStruct(gs.lead + (p.m, p.n), np.dtype(out_dtype))
    operands = [a2, b2] + ([c2] if c2 is not None else [])
    layouts = [_col_layout(a2.ndim) if a_major == COL else None,
               _col_layout(b2.ndim) if b_major == COL else None] + ([None] if c2 is not None else [])
    make = _hook_fn(plan.kernel, hook)
    if sm_margin and make is cute_gemm_sm90_call:      # the persistent kernel: a smaller grid
        make = functools.partial(make, sm_margin=sm_margin)
    made = make(p, plan.policy)
    if made is None:                 # the hook declined this problem after all
        return plus_exchange(reference_gemm(a, b, c, alpha=alpha, beta=beta, out_dtype=out_dtype))
    if hook == "jax_tvm_ffi" and route is not None:     # the copy runs beside the kernel
        _ensure_registered()
        d, recv = jax_ffi.call_exchange(route, send, tc=made, operands=operands, out_avals=[out_aval],
                                        in_layouts=layouts, **xkw)
        return [d.reshape(gs.out_shape), recv]
    if hook == "jax_launch":
        _ensure_registered()
        (d,) = jax_ffi.call(made, operands, [out_aval], in_layouts=layouts, target=target)
    elif hook == "jax_tvm_ffi":
        _ensure_registered()
        (d,) = jax_ffi.call_tvm_ffi(made, operands, [out_aval], in_layouts=layouts, target=tvm_target)
    else:
        d = made(a2, b2, c2)
    return plus_exchange(d.reshape(gs.out_shape))


# Inside jit the pads and D's slice are XLA copies of their own, which only pay on big problems
# (H200, benchmarks/jax_unaligned.py, bf16, jax_unaligned-h200.json: 2500^3 (31 GFLOP) 320 vs XLA's
# 187 TFLOP/s, 4096x50257x4096 568 vs 263, 8191^3 582 vs 161; 1024x1000x999 (2 GFLOP) 47 vs 62).
PAD_MIN_FLOP = 8e9


def padded_shapes(gs: GemmShapes, a_shape, a_dtype, b_shape, c_shape, c_dtype, out_dtype, a_major=ROW,
                  b_major=ROW) -> Optional[Tuple[GemmShapes, int, int]]:
    """xgemm.api's staged problem inside jit: an fp16/bf16 GEMM of at least PAD_MIN_FLOP that no
    GPU kernel takes because a row of A, B or C is not a multiple of 16 bytes gets K and N padded
    (interop.padded_dims; the K padding of A and B zero, so it adds nothing; C padded only if it
    has D's N columns). (the padded problem's GemmShapes, K, N) when a GPU kernel takes that, else
    None."""
    from .interop import padded_dims
    p = gs.problem
    if p.device.kind != "cuda" or np.dtype(a_dtype).name not in ("float16", "bfloat16"):
        return None
    if 2.0 * p.m * p.n * p.k * p.batch_count < PAD_MIN_FLOP:
        return None
    k, n = a_shape[-1], b_shape[-1]
    kp, np_ = padded_dims(k, n, np.dtype(a_dtype).itemsize)
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
    _ensure_registered()
    fn = lambda x, *d: jax_ffi.call_exchange(route, x, into=into, dest=d[0] if d else None)[0]    # noqa: E731
    return mlir.lower_fun(fn, multiple_results=False)(ctx, send, *dest)


# ---------------------------------------------------------------------------------------------
# Softmax

def softmax_rule(ctx, x, *, axis, target: str = jax_ffi.TARGET, tvm_target: Optional[str] = None):
    (aval,) = ctx.avals_in
    if not _concrete(aval.shape) or 0 in aval.shape:
        return mlir.lower_fun(functools.partial(reference_softmax, axis=axis), multiple_results=False)(ctx, x)
    fn = functools.partial(_softmax_kernel, axis=axis, target=target, tvm_target=tvm_target, portable=_for_export(ctx))
    return mlir.lower_fun(fn, multiple_results=False)(ctx, x)


def _softmax_kernel(x, *, axis, target, tvm_target, portable):
    problem = softmax_problem(x.shape, x.dtype, axis)
    plan = policy.choose("softmax", problem)
    hook = _hook(plan.kernel, portable)
    if hook is None:
        return reference_softmax(x, axis=axis)
    if hook == "jax_launch":
        _ensure_registered()
        launch = _hook_fn(plan.kernel, hook)(problem, plan.policy)
        # The reduced dim minor-most, the others row-major: rows x cols in memory, no copy when
        # the producer can write that layout (XLA inserts a relayout only if it must).
        layout = tuple(d for d in range(x.ndim) if d != axis) + (axis,)
        (y,) = jax_ffi.call(launch, [x], [jax.ShapeDtypeStruct(x.shape, x.dtype)],
                            in_layouts=[layout], out_layouts=[layout], target=target)
        return y
    moved = jnp.moveaxis(x, axis, -1)
    x2 = moved.reshape(problem.rows, problem.cols)
    made = _hook_fn(plan.kernel, hook)(problem, plan.policy)
    if hook == "jax_tvm_ffi":
        _ensure_registered()
        (y2,) = jax_ffi.call_tvm_ffi(made, [x2], [jax.ShapeDtypeStruct(x2.shape, x2.dtype)], target=tvm_target)
    else:
        y2 = made(x2)
    return jnp.moveaxis(y2.reshape(moved.shape), -1, axis)


# ---------------------------------------------------------------------------------------------
# Adapters for kernels without their own hook

def gluon_softmax_launch(problem: SoftmaxProblem, pol) -> jax_ffi.Launch:
    """jax_launch for kernels/gluon_softmax.py: its prebuilt cubin, rows x cols with row stride cols."""
    from . import gluon_cache
    from .kernels import gluon_softmax as gs
    vec = 16 // np.dtype(problem.x.dtype).itemsize
    aligned = problem.x.alignment >= 16 and problem.cols % vec == 0   # XLA buffers: >= 16-byte bases
    cfg = gs.config_from_policy(pol, problem.x.dtype, problem.out_dtype, aligned)
    entry = gluon_cache.lookup(cfg.key)
    if entry is None:
        raise ValueError(f"gluon_softmax: no cache entry {cfg.key}")
    P = jax_ffi.Param
    rows, cols = problem.rows, problem.cols
    args = (P.input(0), P.output(0), P.i32(rows), P.i32(cols), P.i64(cols), P.i64(cols))
    return jax_ffi.triton_launch(entry.cubin, entry.meta, -(-rows // cfg.block_m), args,
                                 alignment=16 if aligned else 1)


def _views(problem: GemmProblem):
    """ArrayViews (no data) of the kernel's a, b, c, d as the handler will describe the XLA buffers."""
    from .interop import ArrayView
    ep = problem.epilogue

    def view(op: Operand) -> ArrayView:    # XLA buffers: 16-byte (or better) aligned bases
        return ArrayView(None, "jax", problem.device, 0, tuple(op.shape), tuple(op.strides), op.dtype,
                         np.dtype(op.dtype).itemsize, False)
    c = view(problem.c) if problem.c is not None and ep.reads_c else None
    out = view(_matrix(problem.a.shape[:-2] + (problem.m, problem.n), ep.out_dtype, ROW))
    return view(problem.a), view(problem.b), c, out


def _tensors(c) -> Tuple[jax_ffi.Arg, ...]:
    A = jax_ffi.Arg
    return (A.tensor("in", 0), A.tensor("in", 1), A.tensor("out", 0)) + ((A.tensor("in", 2),) if c is not None else ())


def cute_sgemm_call(problem: GemmProblem, pol) -> Optional[jax_ffi.TvmFfiCall]:
    """jax_tvm_ffi for kernels/cute_sgemm.py: its compiled function, called as its run() calls it.

    Split-K is turned off inside jit (one launch, no workspace): the policy's other choices stay.
    """
    import dataclasses

    from . import compile as xcompile
    from .kernels import cute_sgemm as cs
    pol = dataclasses.replace(pol, split_k=1)
    ep = problem.epilogue
    a, b, c, out = _views(problem)
    launch, builds = cs.KERNEL.resolve(problem, pol, a, b, c, out)
    if launch.splits != 1 or len(builds) != 1:
        return None
    fn = xcompile.cute(*builds[0])
    A = jax_ffi.Arg
    args = (A.tensor("in", 0), A.tensor("in", 1), A.tensor("out", 0), A.tensor("in", 2) if c is not None else A.none(),
            A.f64(ep.alpha), A.f64(ep.beta), A.i64(launch.kps), A.i64(1), A.stream())
    return jax_ffi.TvmFfiCall(fn, args)


def cute_gemm_sm90_call(problem: GemmProblem, pol, sm_margin: int = 0) -> jax_ffi.TvmFfiCall:
    """jax_tvm_ffi for kernels/cute_gemm_sm90.py (its run(): fn(a, b, d[, c], alpha[, beta], stream);
    our buffers are already the (L,)rows,cols arrays its _as_kernel_arg would make). sm_margin: SMs
    its persistent grid leaves free (the class compiled for that many fewer)."""
    from . import compile as xcompile
    from .kernels import cute_gemm_sm90 as k
    a, b, c, out = _views(problem)
    try:
        sms = k._sm_count(problem.device.index)
    except Exception:                 # cross-lowering without a GPU: the H200's count
        sms = k.H200_SMS
    sms = max(sms - sm_margin, 1)
    fn = k.compiled(*k.KERNEL.spec(problem, pol, (a, b, c), out, xcompile.arch_for(problem.device), sms))
    A, ep = jax_ffi.Arg, problem.epilogue
    scalars = (A.f64(ep.alpha), A.f64(ep.beta)) if c is not None else (A.f64(ep.alpha),)
    if k.swapped(pol):       # D^T = B^T @ A^T (+ C^T): transposed views of the same buffers
        def t(role, i, v):
            v = k.transposed(v)
            return A.tensor(role, i, v.shape, v.strides)
        tensors = (t("in", 1, b), t("in", 0, a), t("out", 0, out)) + ((t("in", 2, c),) if c is not None else ())
    else:
        tensors = _tensors(c)
    return jax_ffi.TvmFfiCall(fn, tensors + scalars + (A.stream(),))


def cute_mma_sm80_call(problem: GemmProblem, pol) -> jax_ffi.TvmFfiCall:
    """jax_tvm_ffi for kernels/cute_mma_sm80.py (its run(): fn(a, b, d[, c], stream); alpha 1, beta 0|1)."""
    from . import compile as xcompile
    from .kernels import cute_mma_sm80 as k
    a, b, c, out = _views(problem)
    fn = k.compiled(*k.KERNEL.spec(problem, pol, (a, b, c), out, xcompile.arch_for(problem.device)))
    return jax_ffi.TvmFfiCall(fn, _tensors(c) + (jax_ffi.Arg.stream(),))


_ADAPTERS = {
    "gluon_softmax": ("jax_launch", gluon_softmax_launch),
    "cute_sgemm": ("jax_tvm_ffi", cute_sgemm_call),
    "cute_gemm_sm90": ("jax_tvm_ffi", cute_gemm_sm90_call),
    "cute_mma_sm80": ("jax_tvm_ffi", cute_mma_sm80_call),
}


# ---------------------------------------------------------------------------------------------
# CuTe kernels: a jax_call through cutlass.jax.cutlass_call

def cutlass_gemm_call(launcher: Callable[..., None], problem: GemmProblem, *, compile_key: Any = None,
                      **static: Any) -> Callable[..., Any]:
    """A `jax_call` for a CuTe kernel: f(a, b, c_or_None) -> d via cutlass.jax.cutlass_call.

    `launcher` is a @cute.jit function launcher(stream, a, b, [c,] d, **static) taking cute
    Tensors in the shapes described above ((L,)M,K etc.), with the compact layouts of
    problem.a/b.majorness (requested from XLA, so no transpose is materialized). alpha/beta are
    passed in `static` by the kernel if it wants them as compile-time constants. `compile_key`
    (hashable) skips CuTe's IR-based cache lookup: pass a stable id of the kernel + policy.
    """
    import cutlass.jax as cjax

    def spec(op: Operand):
        rank = len(op.shape)
        if op.majorness == COL:   # CuTe convention: layout[i] = stride rank of dim i (0 = innermost)
            layout = (2, 0, 1) if rank == 3 else (0, 1)
        else:
            layout = tuple(reversed(range(rank)))
        return cjax.TensorSpec(layout=layout)

    out = jax.ShapeDtypeStruct(problem.a.shape[:-2] + (problem.m, problem.n), np.dtype(problem.epilogue.out_dtype))

    def call(a, b, c=None):
        specs = [spec(problem.a), spec(problem.b)] + ([spec(problem.c)] if c is not None else [])
        args = (a, b) + ((c,) if c is not None else ())
        return cjax.cutlass_call(launcher, output_shape_dtype=out, input_spec=specs,
                                 compile_key=compile_key, **static)(*args)
    return call
