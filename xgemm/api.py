"""The entry points: validate, build the Problem, choose a kernel, run it, hand the result back.

Thin by design: interop.py describes arrays, problem.py holds the Problem, policy.py chooses,
kernels/ compute. JAX arrays and tracers go to xgemm.jax (primitives that also work in jax.jit).
"""
from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

from . import errors, fastpath, interop, policy
from .problem import ROW, STRIDED, Epilogue, GemmProblem, Operand, SoftmaxProblem
from .torch_native import OPS as _NATIVE_OPS

_HALF = ("float16", "bfloat16")
_SOFTMAX = _NATIVE_OPS["softmax"]


# ---------------------------------------------------------------------------------------------
# Argument checks shared by every entry point

def _real(fn: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = ("it is traced by JAX; pass a Python float (close over it, or mark it static)"
                if interop.is_jax_tracer(value) else "pass a Python float such as 1.0")
        raise errors.ScalarError(f"{fn}: {name}={value!r} ({type(value).__name__}) is not a real number; {hint}")
    value = float(value)
    if not math.isfinite(value):
        raise errors.NonFiniteScalarError(f"{fn}: {name}={value} is not finite; pass a finite float")
    return value


def _dtype(fn: str, name: str, x: Any) -> str:
    dt = interop.dtype_name(x)
    if dt not in interop.SUPPORTED_DTYPES:
        raise errors.DTypeError(f"{fn}: {name} has dtype {dt}; supported are {', '.join(interop.SUPPORTED_DTYPES)} "
                                f"(cast it, e.g. {name}.astype('float32'))")
    return dt


def _broadcast(fn: str, what: str, *shapes: Tuple[int, ...]) -> Tuple[int, ...]:
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for dims in zip(*[(1,) * (ndim - len(s)) + tuple(s) for s in shapes]):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise errors.ShapeError(f"{fn}: {what} {' and '.join(map(str, shapes))} do not broadcast; "
                                    f"make them equal or 1 in each dimension")
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def _broadcasts_to(shape: Tuple[int, ...], target: Tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(shape[::-1], target[::-1]))


def _check_out(fn: str, out: Any, owner: str, shape: Tuple[int, ...], dtypes: Sequence[str],
               inputs: Sequence[interop.ArrayView]) -> interop.ArrayView:
    fw = interop.require_array(fn, "out", out)
    if fw == "jax":
        raise errors.OutError(f"{fn}: out is a JAX array, and JAX arrays are immutable; drop out= and use the result")
    if fw != owner:
        raise errors.FrameworkError(f"{fn}: out is a {fw} array but the result is {owner} (the first operand's "
                                    f"framework); pass a {owner} array as out")
    v = interop.view(out, "out", fn)
    if v.shape != tuple(shape):
        raise errors.ShapeError(f"{fn}: out has shape {v.shape}; the result has shape {tuple(shape)}; pass an out of that shape")
    if v.dtype not in dtypes:
        raise errors.DTypeError(f"{fn}: out has dtype {v.dtype}; use one of {', '.join(dtypes)}")
    if v.device != inputs[0].device:
        raise errors.DeviceError(f"{fn}: out is on {_dev(v)} but the inputs are on {_dev(inputs[0])}; "
                                 f"allocate out on {_dev(inputs[0])}")
    if v.readonly:
        raise errors.OutError(f"{fn}: out is read-only; pass a writeable array (numpy: out.flags.writeable=True or a copy)")
    for i in inputs:
        if i is not None and v.overlaps(i):
            raise errors.OutError(f"{fn}: out shares memory with an input ({i.shape} at {i.ptr:#x}); "
                                  f"pass a separate out array (in-place is not supported)")
    return v


def _dev(v: interop.ArrayView) -> str:
    return f"{v.device.kind}:{v.device.index}" if v.device.kind != "cpu" else "cpu"


def _same_device(fn: str, views: Sequence[Tuple[str, interop.ArrayView]]) -> None:
    (n0, v0), rest = views[0], views[1:]
    for n, v in rest:
        if v.device != v0.device:
            raise errors.DeviceError(f"{fn}: {n0} is on {_dev(v0)} and {n} on {_dev(v)}; "
                                     f"move {n} to {_dev(v0)} first (e.g. torch: {n}.to({n0}.device))")


def _owner_and_tracers(fn: str, named: Sequence[Tuple[str, Any]]) -> str:
    owner = interop.require_array(fn, named[0][0], named[0][1])
    for name, x in named[1:]:
        interop.require_array(fn, name, x)
        if owner != "jax" and interop.is_jax_tracer(x):
            raise errors.FrameworkError(f"{fn}: {name} is a JAX tracer (inside jax.jit/grad) but {named[0][0]} is a "
                                        f"{owner} array; pass JAX arrays for every operand inside JAX transforms")
    return owner


# ---------------------------------------------------------------------------------------------
# GEMM

@dataclass
class _Prepared:
    plan: policy.Plan
    operands: tuple
    out: Optional[interop.ArrayView]
    finish: Callable[[Any], Any]


def matmul(a: Any, b: Any, *, out: Any = None) -> Any:
    """A @ B with numpy.matmul semantics (1-D operands, broadcast batch dims). Result in a's framework."""
    return gemm(a, b, None, out=out, _fn="matmul")


def gemm(a: Any, b: Any, c: Any = None, *, alpha: float = 1.0, beta: float = 0.0, out: Any = None,
         _fn: str = "gemm") -> Any:
    """D = alpha * A @ B + beta * C. C broadcasts to D's shape; beta == 0 never reads C."""
    native = fastpath.native
    if native is not None and out is None and not fastpath.compiling():   # C++: a signature seen before
        hit = native.hit(_NATIVE_OPS[_fn], policy.forced_kernel(), alpha, beta, a, b, c)
        if hit is not None:
            return hit
    key = fastpath.gemm_key(_fn, a, b, c, alpha, beta) if out is None else None
    if key is not None:                     # a signature seen before: no planning
        hit = fastpath.gemm_hit(key, a, b, c)
        if hit is not None:
            return hit
    elif out is None and _torch_op_needed(a, b, c):
        from . import torch as xtorch
        alpha, beta = _real(_fn, "alpha", alpha), _real(_fn, "beta", beta)
        if not xtorch.compiling():          # validate eagerly, before autograd records anything
            _prepare_gemm(_fn, a, b, c, alpha, beta, None, plan_only=True)
        return xtorch.gemm_op(a, b, c if beta != 0.0 else None, alpha, beta)
    prep = _prepare_gemm(_fn, a, b, c, alpha, beta, out)
    result = _run(prep)
    if key is not None and isinstance(prep, _Prepared):
        fastpath.gemm_store(key, prep, result)
    return result


def _torch_op_needed(*xs: Any) -> bool:
    """Torch tensors that require grad (or a torch.compile trace) go through the torch.library op.
    Decided here without importing xgemm.torch: registering its ops costs a first call ~6 ms."""
    if interop.framework_of(xs[0]) != "torch":
        return False
    torch = sys.modules["torch"]
    if torch.compiler.is_compiling():
        return True
    return torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in xs if x is not None)


def _run(prep: "_Prepared | Any") -> Any:
    if not isinstance(prep, _Prepared):     # JAX: already computed by its primitive
        return prep
    plan = prep.plan
    stream = interop.current_stream(plan.problem.framework, plan.problem.device)
    result = plan.kernel.run(plan.problem, plan.policy, prep.operands, prep.out, stream)
    return prep.finish(prep.out.obj if result is None else result)


def _prepare_gemm(fn: str, a: Any, b: Any, c: Any, alpha: Any, beta: Any, out: Any, *, plan_only: bool = False):
    alpha, beta = _real(fn, "alpha", alpha), _real(fn, "beta", beta)
    named = [("a", a), ("b", b)] + ([("c", c)] if c is not None else [])
    owner = _owner_and_tracers(fn, named)
    for name, x in named[:2]:
        if len(x.shape) < 1:
            raise errors.ShapeError(f"{fn}: {name} is 0-d (shape ()); {fn} needs at least 1 dimension; "
                                    f"multiply by a scalar instead")
    dt = _dtype(fn, "a", a)
    if _dtype(fn, "b", b) != dt:
        raise errors.DTypeError(f"{fn}: a is {dt} and b is {interop.dtype_name(b)}; cast b to {dt} (b.astype(a.dtype))")
    out_dtypes = (dt, "float32") if dt in _HALF else (dt,)
    if c is not None and _dtype(fn, "c", c) not in out_dtypes:
        raise errors.DTypeError(f"{fn}: c is {interop.dtype_name(c)}; with {dt} operands c must be one of {out_dtypes}")
    if c is None and beta != 0.0:
        raise errors.ShapeError(f"{fn}: beta={beta:g} but c is None; pass c=... or beta=0.0")

    a_vec, b_vec = len(a.shape) == 1, len(b.shape) == 1
    a_shape = (1,) + tuple(a.shape) if a_vec else tuple(a.shape)
    b_shape = tuple(b.shape) + (1,) if b_vec else tuple(b.shape)
    if a_shape[-1] != b_shape[-2]:
        raise errors.ShapeError(f"{fn}: a has shape {tuple(a.shape)} and b {tuple(b.shape)}; "
                                f"a.shape[-1] ({a_shape[-1]}) must equal b.shape[{-1 if b_vec else -2}] ({b_shape[-2]})")
    batch = _broadcast(fn, "batch dims", a_shape[:-2], b_shape[:-2])
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    full = batch + (m, n)                                   # the promoted result shape
    final = batch + ((m,) if not a_vec else ()) + ((n,) if not b_vec else ())
    if c is not None and not _broadcasts_to(tuple(c.shape), final):
        raise errors.ShapeError(f"{fn}: c has shape {tuple(c.shape)}, which does not broadcast to the result "
                                f"shape {final}; pass c of shape {final} or one that broadcasts to it")
    c_used = c if (c is not None and beta != 0.0) else None
    out_dtype = interop.dtype_name(out) if out is not None and interop.framework_of(out) not in (None, "jax") else dt

    if owner == "jax":
        if out is not None:
            raise errors.OutError(f"{fn}: out= is not supported for JAX (its arrays are immutable); use the result")
        b_j = interop.import_into("jax", b, "b", fn)
        c_j = interop.import_into("jax", c_used, "c", fn) if c_used is not None else None
        from . import jax as xjax
        if plan_only:
            return _jax_plan(fn, a, b_j, c_j, alpha, beta, dt)
        return xjax.gemm(a, b_j, c_j, alpha=alpha, beta=beta, out_dtype=dt)

    b = interop.import_into(owner, b, "b", fn)
    c_used = interop.import_into(owner, c_used, "c", fn) if c_used is not None else None
    va, vb = interop.view(a, "a", fn), interop.view(b, "b", fn)
    vc = interop.view(c_used, "c", fn) if c_used is not None else None
    _same_device(fn, [("a", va), ("b", vb)] + ([("c", vc)] if vc is not None else []))
    vout = _check_out(fn, out, owner, final, out_dtypes, [va, vb] + ([vc] if vc is not None else [])) if out is not None else None

    # Promote 1-D operands to matrices as views (numpy.matmul semantics), in the owner framework.
    a2 = a[None, :] if a_vec else a
    b2 = b[:, None] if b_vec else b
    copies: List[str] = []
    on_gpu = va.device.kind == "cuda"
    if on_gpu:
        a2v = _kernel_operand(a2, va if not a_vec else None, "a", batch, copies)
        bv2 = _kernel_operand(b2, vb if not b_vec else None, "b", batch, copies)
        cv2 = None
        if vc is not None:
            c_full = _broadcast_to(c_used, final, owner)
            cv2 = _kernel_operand(_promote_c(c_full, a_vec, b_vec), vc if c_full is c_used and not (a_vec or b_vec) else None,
                                  "c", batch, copies)
    else:
        a2v = va if not a_vec else interop.view(a2, "a", fn)
        bv2 = vb if not b_vec else interop.view(b2, "b", fn)
        cv2 = vc
    # where the GPU kernel writes D: out itself when it can take it in place, else a compact result
    target_v = None
    if on_gpu and out is not None:
        cand = _batched(_promote_out(out, a_vec, b_vec), batch)
        target_v = interop.view(cand, "out", fn) if cand is not None else None
        if target_v is not None and interop.majorness(target_v.shape, target_v.strides) == STRIDED:
            target_v = None
    out_op = interop.operand(target_v) if target_v is not None else None
    epilogue = Epilogue(alpha=alpha, beta=beta, has_c=cv2 is not None, out_dtype=out_dtype,
                        out_majorness=out_op.majorness if out_op else ROW, out_alignment=out_op.alignment if out_op else 16)
    problem = GemmProblem(m=m, n=n, k=k, batch=batch, a=interop.operand(a2v), b=interop.operand(bv2),
                          c=interop.operand(cv2) if cv2 is not None else None, epilogue=epilogue,
                          framework=owner, device=va.device)
    empty = m * n * k * math.prod(batch) == 0
    plan = _choose("gemm", problem, empty=empty)
    plan.copies.extend(copies)
    if on_gpu and not empty and dt in _HALF and plan.kernel.name == "reference":
        staged = _stage_aligned(fn, plan, problem, (a2v, bv2, cv2), batch, out, a_vec, b_vec)
        if staged is not None:
            return staged.plan if plan_only else staged
    if plan_only:
        return plan

    is_reference = plan.kernel.name == "reference"
    if is_reference:
        out2 = None if out is None else (vout if not (a_vec or b_vec) else interop.view(_promote_out(out, a_vec, b_vec), "out", fn))
        operands = (a2v if not on_gpu else interop.view(a2, "a", fn), bv2 if not on_gpu else interop.view(b2, "b", fn),
                    (vc if not (a_vec or b_vec) else interop.view(_promote_c(c_used, a_vec, b_vec), "c", fn))
                    if c_used is not None else None)
        def finish(r):
            return out if out is not None else _squeeze(r, a_vec, b_vec)
        return _Prepared(plan, operands, out2, finish)

    # GPU kernel: it writes a contiguous (L, M, N) or (M, N) result; out is written in place when it can be.
    target = target_v.obj if target_v is not None else None
    result = interop.empty(owner, full, out_dtype, va.device, a) if target is None else None
    if target is None and out is not None:
        plan.copies.append(f"out: strided {vout.strides} -> result written to a temporary, then copied into out")
    kernel_out = target_v if target is not None else interop.view(_batched(result, batch), "out", fn)

    def finish(r):
        if out is None:
            return _squeeze(result, a_vec, b_vec)
        if target is None:
            out[...] = _squeeze(result, a_vec, b_vec)
        return out
    return _Prepared(plan, (a2v, bv2, cv2), kernel_out, finish)


def _stage_aligned(fn: str, plan: policy.Plan, problem: GemmProblem, operands: tuple, batch: Tuple[int, ...],
                   out: Any, a_vec: bool, b_vec: bool) -> Optional["_Prepared"]:
    """An fp16/bf16 GEMM every GPU kernel declined (a row of A, B, C or D is not a multiple of 16
    bytes, or a base address is not 16-byte aligned) runs on 16-byte-aligned copies instead of
    the framework fallback (which computes in fp32): a K or N that is not a multiple of 8 elements
    is padded to a multiple of 16, the K padding of A and B zero-filled so it adds nothing, and D
    is written into a padded buffer whose first N columns become the result. None when no kernel
    takes even that."""
    m, n, k = problem.m, problem.n, problem.k
    a2v, bv2, cv2 = operands
    # a dim that must be padded goes to whole 32-byte sectors: some row pitches 16 bytes off a
    # sector run slower (bf16 5000^3, rows of 10000 bytes: 477 TFLOP/s dense, 602 in rows padded
    # to 128 bytes; benchmarks/row_alignment.py, row_alignment-h200.json)
    kp, np_ = interop.padded_dims(k, n, a2v.itemsize)
    copies = list(plan.copies)

    def ready(v: interop.ArrayView) -> bool:
        op = interop.operand(v)
        return op.majorness != STRIDED and op.alignment >= 16

    def staged(v, rows_p, cols_p, zero_rows, zero_cols, name):
        if v.shape[-2:] == (rows_p, cols_p) and ready(v):
            return v
        lead = v.shape[:-2]
        if lead and not any(v.strides[:-2]):     # one matrix broadcast over the batch: pad it once
            one = interop.padded_copy(interop.view(v.obj[(0,) * len(lead)], name, fn), (rows_p, cols_p),
                                      zero_rows, zero_cols, name, copies)
            return interop.view(_broadcast_to(one.obj, lead + (rows_p, cols_p), problem.framework), name, fn)
        return interop.padded_copy(v, lead + (rows_p, cols_p), zero_rows, zero_cols, name, copies)

    a_p = staged(a2v, m, kp, False, True, "a")
    b_p = staged(bv2, kp, np_, True, False, "b")
    c_p = staged(cv2, m, np_, False, False, "c") if cv2 is not None else None
    full_p = batch + (m, np_)
    ep = problem.epilogue
    epilogue = Epilogue(alpha=ep.alpha, beta=ep.beta, has_c=ep.has_c, out_dtype=ep.out_dtype)
    padded = GemmProblem(m=m, n=np_, k=kp, batch=batch, a=interop.operand(a_p), b=interop.operand(b_p),
                         c=interop.operand(c_p) if c_p is not None else None, epilogue=epilogue,
                         framework=problem.framework, device=problem.device)
    plan_p = policy.choose("gemm", padded)
    if plan_p.kernel.name == "reference":
        return None
    if np_ != n:
        copies.append(f"out: written as {full_p} (N padded to {np_}); its first {n} columns "
                      + ("copied into out" if out is not None else "copied into a compact result"))
    elif out is not None:
        copies.append("out: the kernel writes a compact temporary that is copied into out")
    plan_p.copies = copies
    plan_p.declined = list(plan.declined) + [(f"{d} (padded problem)", why) for d, why in plan_p.declined]
    result_p = interop.empty(problem.framework, full_p, ep.out_dtype, problem.device, a2v.obj)

    def finish(r):
        res = result_p[..., :n] if np_ != n else result_p
        if out is not None:
            out[...] = _squeeze(res, a_vec, b_vec)
            return out
        if np_ != n:
            res = interop.compact(interop.view(res, "out", fn), "out", []).obj
        return _squeeze(res, a_vec, b_vec)
    return _Prepared(plan_p, (a_p, b_p, c_p), interop.view(_batched(result_p, batch), "out", fn), finish)


def _choose(op: str, problem, *, empty: bool) -> policy.Plan:
    if empty:   # nothing to launch; the framework's own op returns the correctly shaped zeros / beta*C
        ref = policy.load(policy._TABLE[op][-1][1])
        return policy.Plan(op=op, problem=problem, kernel=ref, policy=ref.policy(problem),
                           declined=[("all kernels", "empty problem (a zero-size dimension): nothing to launch")])
    return policy.choose(op, problem)


def _broadcast_to(x: Any, shape: Tuple[int, ...], fw: str) -> Any:
    if tuple(x.shape) == tuple(shape):
        return x
    return x.expand(*shape) if fw == "torch" else __import__("sys").modules[fw].broadcast_to(x, shape)


def _collapsible(shape: Sequence[int], strides: Sequence[int]) -> bool:
    dims = [(d, s) for d, s in zip(shape, strides) if d != 1]
    return all(s0 == s1 * d1 for (_, s0), (d1, s1) in zip(dims, dims[1:]))


def _batched(x: Any, batch: Tuple[int, ...]) -> Optional[Any]:
    """x (batch..., R, C) as a (L, R, C) view, or (R, C) when there is no batch; None if not collapsible."""
    if not batch:
        return x
    shape, strides = tuple(x.shape), interop.view(x, "x", "batch").strides
    if not _collapsible(shape[:-2], strides[:-2]):
        return None
    return x.reshape((math.prod(batch),) + shape[-2:])


def _kernel_operand(x: Any, v: Optional[interop.ArrayView], name: str, batch: Tuple[int, ...],
                    copies: List[str]) -> interop.ArrayView:
    """Broadcast to the batch, fold batch dims into one, and compact once if a kernel could not read it.
    `v` is x's view when the caller already has one (the common 2-D case costs no further work)."""
    if not batch and v is not None and interop.majorness(v.shape, v.strides) != STRIDED:
        return v
    fw = interop.framework_of(x)
    if batch:
        x = _broadcast_to(x, batch + tuple(x.shape[-2:]), fw)
    v = interop.view(x, name, "gemm")
    folded = _batched(x, batch)
    if folded is None or interop.majorness(v.shape, v.strides) == STRIDED:
        v = interop.compact(v, name, copies)
        folded = _batched(v.obj, batch)
    return interop.view(folded, name, "gemm")


def _promote_out(out: Any, a_vec: bool, b_vec: bool) -> Any:
    if a_vec:
        out = out[..., None, :] if not b_vec else out[..., None]
    if b_vec:
        out = out[..., None]
    return out


def _promote_c(c: Any, a_vec: bool, b_vec: bool) -> Any:
    return _promote_out(c, a_vec, b_vec) if len(c.shape) >= 1 and (a_vec or b_vec) else c


def _squeeze(r: Any, a_vec: bool, b_vec: bool) -> Any:
    if b_vec:
        r = r[..., 0]
    if a_vec:
        r = r[..., 0, :] if not b_vec else r[..., 0]
    return r


def _jax_plan(fn, a, b, c, alpha, beta, dt) -> policy.Plan:
    """explain() for JAX operands: the same table, seen through the primitive's problem."""
    from . import jax as xjax
    return xjax.explain_gemm(a, b, c, alpha=alpha, beta=beta, out_dtype=dt)


# ---------------------------------------------------------------------------------------------
# Softmax

def softmax(x: Any, axis: int = -1, *, out: Any = None) -> Any:
    """Numerically stable softmax along `axis` (fp32 math for fp16/bf16). Result in x's framework."""
    native = fastpath.native
    if native is not None and out is None and not fastpath.compiling():   # C++: a signature seen before
        hit = native.hit(_SOFTMAX, policy.forced_kernel(), axis, 0, x, None, None)
        if hit is not None:
            return hit
    key = fastpath.softmax_key(x, axis) if out is None else None
    if key is not None:                     # a signature seen before: no planning
        hit = fastpath.softmax_hit(key, x)
        if hit is not None:
            return hit
    elif out is None and _torch_op_needed(x):
        from . import torch as xtorch
        if not xtorch.compiling():
            axis = _prepare_softmax("softmax", x, axis, None, plan_only=True).problem.axis
        return xtorch.softmax_op(x, int(axis) % x.dim())
    prep = _prepare_softmax("softmax", x, axis, out)
    result = _run(prep)
    if key is not None and isinstance(prep, _Prepared):
        fastpath.softmax_store(key, prep)
    return result


def _prepare_softmax(fn: str, x: Any, axis: Any, out: Any, *, plan_only: bool = False):
    owner = interop.require_array(fn, "x", x)
    ndim = len(x.shape)
    if ndim < 1:
        raise errors.ShapeError(f"{fn}: x is 0-d (shape ()); softmax needs at least 1 dimension")
    dt = _dtype(fn, "x", x)
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise errors.AxisError(f"{fn}: axis={axis!r} is not an integer; pass an int in [-{ndim}, {ndim})")
    if not -ndim <= int(axis) < ndim:
        raise errors.AxisError(f"{fn}: axis={axis} is out of range for x with {ndim} dims; pass an int in [-{ndim}, {ndim})")
    axis = int(axis) % ndim
    if owner == "jax":
        if out is not None:
            raise errors.OutError(f"{fn}: out= is not supported for JAX (its arrays are immutable); use the result")
        from . import jax as xjax
        return xjax.explain_softmax(x, axis) if plan_only else xjax.softmax(x, axis=axis)
    vx = interop.view(x, "x", fn)
    vout = _check_out(fn, out, owner, vx.shape, (dt,), [vx]) if out is not None else None
    shape = vx.shape
    cols = shape[axis]
    rows = math.prod(shape) // cols if cols else math.prod(shape[:axis] + shape[axis + 1:])
    copies: List[str] = []
    on_gpu = vx.device.kind == "cuda"
    if on_gpu:
        moved = _moveaxis_last(x, axis, owner)
        mv = interop.view(moved, "x", fn)
        if mv.strides[-1] != 1 or not _collapsible(mv.shape[:-1], mv.strides[:-1]):
            mv = interop.compact(mv, "x", copies)
            if axis != ndim - 1:
                copies[-1] += f" (axis {axis} moved last: the kernel reduces a contiguous dim)"
        x2 = interop.view(mv.obj.reshape(rows, cols), "x", fn)
        xop = Operand(shape=x2.shape, strides=x2.strides, dtype=dt, majorness=ROW, alignment=interop.alignment(x2, ROW))
    else:
        x2 = vx
        major = ROW if vx.strides[axis] == 1 or cols <= 1 else STRIDED
        xop = Operand(shape=vx.shape, strides=vx.strides, dtype=dt, majorness=major, alignment=interop.alignment(vx, STRIDED))
    problem = SoftmaxProblem(rows=rows, cols=cols, shape=shape, axis=axis, x=xop, out_dtype=dt,
                             framework=owner, device=vx.device)
    plan = _choose("softmax", problem, empty=(rows * cols == 0))
    plan.copies.extend(copies)
    if plan_only:
        return plan
    if plan.kernel.name == "reference":
        return _Prepared(plan, (vx,), vout, lambda r: out if out is not None else r)

    if vout is not None and axis == ndim - 1 and (vout.strides[-1] == 1 or cols <= 1) \
            and _collapsible(vout.shape[:-1], vout.strides[:-1]):
        # out's rows are the kernel's rows (any row stride): write them in place, no temporary
        direct = interop.view(out.reshape(rows, cols), "out", fn)
        if direct.ptr == vout.ptr or rows * cols == 0:
            return _Prepared(plan, (x2,), direct, lambda r: out)
    moved_shape = tuple(d for i, d in enumerate(shape) if i != axis) + (cols,)
    result = interop.empty(owner, moved_shape, dt, vx.device, x)
    kernel_out = interop.view(result.reshape(rows, cols), "out", fn)

    def finish(r):
        y = _moveaxis_back(result, axis, owner)
        if out is None:
            return y
        out[...] = y
        return out
    if out is not None:
        plan.copies.append("out: the kernel writes a row-major temporary that is copied into out")
    return _Prepared(plan, (x2,), kernel_out, finish)


def _moveaxis_last(x: Any, axis: int, fw: str) -> Any:
    if axis == len(x.shape) - 1:
        return x
    mod = __import__("sys").modules[fw]
    return mod.movedim(x, axis, -1) if fw == "torch" else mod.moveaxis(x, axis, -1)


def _moveaxis_back(y: Any, axis: int, fw: str) -> Any:
    if axis == len(y.shape) - 1:
        return y
    mod = __import__("sys").modules[fw]
    return mod.movedim(y, -1, axis) if fw == "torch" else mod.moveaxis(y, -1, axis)


# ---------------------------------------------------------------------------------------------
# explain

def explain(*arrays: Any, op: Optional[str] = None, alpha: float = 1.0, beta: Optional[float] = None,
            axis: int = -1, out: Any = None) -> policy.Plan:
    """The plan a call would run: kernel, policy, why others declined, and any copy made.

    explain(x) -> softmax, explain(a, b) -> matmul, explain(a, b, c, alpha=, beta=) -> gemm;
    op="softmax"|"matmul"|"gemm" overrides. Printing the result gives a few readable lines.
    """
    op = op or {1: "softmax", 2: "matmul", 3: "gemm"}.get(len(arrays))
    if op == "softmax" and len(arrays) == 1:
        return _prepare_softmax("explain", arrays[0], axis, out, plan_only=True)
    if op in ("matmul", "gemm") and len(arrays) in (2, 3):
        c = arrays[2] if len(arrays) == 3 else None
        beta = (1.0 if c is not None else 0.0) if beta is None else beta
        return _prepare_gemm("explain", arrays[0], arrays[1], c, alpha, beta, out, plan_only=True)
    raise errors.ShapeError(f"explain: got {len(arrays)} arrays with op={op!r}; pass (x) for softmax, "
                            f"(a, b) for matmul or (a, b, c) for gemm")
