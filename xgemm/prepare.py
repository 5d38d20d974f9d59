"""Eager calls: the caller's arrays -> a Problem -> a plan -> the kernel's operands, and how to finish.

prepare_gemm / prepare_softmax validate (core/checks.py), view the arrays (arrays/), build the
Problem, choose a kernel (core/policy.py) and normalize what it cannot read: a compacting copy,
batch folding, or, for fp16/bf16 rows no GPU kernel takes, zero-padded aligned copies (the
padding decision is core/layout.py's). run() launches on the caller's current stream and
finishes in the caller's framework. JAX arrays go to xgemm.jax, whose primitives also work in
jax.jit. The entry points (api.py) and the torch ops (torch/ops.py) both call these.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

from xgemm import arrays, errors
from xgemm.core import checks, epilogues, layout, policy
from xgemm.core.problem import ROW, STRIDED, Epilogue, GemmProblem, Operand, SoftmaxProblem
from xgemm.runtime import driver


@dataclass
class Prepared:
    plan: policy.Plan
    operands: tuple
    out: Optional[arrays.ArrayView]
    finish: Callable[[Any], Any]


def check_out(fn: str, out: Any, owner: str, shape: Tuple[int, ...], dtypes: Sequence[str],
               inputs: Sequence[arrays.ArrayView]) -> arrays.ArrayView:
    fw = arrays.require_array(fn, "out", out)
    if fw == "jax":
        raise errors.OutError(f"{fn}: out is a JAX array, and JAX arrays are immutable; drop out= and use the result")
    if fw != owner:
        what = "a DLPack producer of no known framework" if fw == "other" else f"a {fw} array"
        raise errors.FrameworkError(f"{fn}: out is {what} but the result is {owner} (the first operand's "
                                    f"framework); pass a {owner} array as out")
    if fw == "torch" and out.is_inference() and not sys.modules["torch"].is_inference_mode_enabled():
        # torch refuses in-place writes to these outside inference mode; a kernel would not ask
        raise errors.OutError(f"{fn}: out is an inference tensor (made under torch.inference_mode()), which torch "
                              f"does not let anything write outside that mode; call inside it, or pass out.clone()")
    if fw == "torch" and out.requires_grad and sys.modules["torch"].is_grad_enabled():
        # torch's own out= refuses the same: a write into it would not be recorded for autograd
        raise errors.OutError(f"{fn}: out requires grad, and out= writes are not differentiable; drop out= and "
                              f"use the result, or pass out.detach() / call under torch.no_grad()")
    v = arrays.view(out, "out", fn)
    if layout.self_overlapping(v.shape, v.strides):
        # each element would be written more than once, the last write winning (torch refuses such writes)
        raise errors.OutError(f"{fn}: out has strides {v.strides} for shape {v.shape}: several of its elements "
                              f"share memory (an expand()ed, broadcast or as_strided view); pass a dense out")
    if v.shape != tuple(shape):
        raise errors.ShapeError(f"{fn}: out has shape {v.shape}; the result has shape {tuple(shape)}; pass an out of that shape")
    if v.dtype not in dtypes:
        raise errors.DTypeError(f"{fn}: out has dtype {v.dtype}; use one of {', '.join(dtypes)}")
    if v.device != inputs[0].device:
        raise errors.DeviceError(f"{fn}: out is on {_dev(v)} but the inputs are on {_dev(inputs[0])}; "
                                 f"allocate out on {_dev(inputs[0])}")
    if v.readonly:     # NumPy's writeable flag, or DLPack's read-only flag for other producers
        why = ("" if v.framework == "numpy" else
               f" (its producer, {type(out).__name__}, exports it through DLPack with the read-only flag)")
        raise errors.OutError(f"{fn}: out is read-only{why}; pass a writeable array (numpy: out.flags.writeable=True "
                              f"or a copy), or drop out= and use the result")
    for i in inputs:
        if i is not None and v.overlaps(i):
            raise errors.OutError(f"{fn}: out shares memory with an input ({i.shape} at {i.ptr:#x}); "
                                  f"pass a separate out array (in-place is not supported)")
    return v


def _dev(v: arrays.ArrayView) -> str:
    return f"{v.device.kind}:{v.device.index}" if v.device.kind != "cpu" else "cpu"


def same_device(fn: str, views: Sequence[Tuple[str, arrays.ArrayView]]) -> None:
    """DeviceError unless every (name, view) is on the first one's device, naming both and the fix."""
    (n0, v0), rest = views[0], views[1:]
    for n, v in rest:
        if v.device != v0.device:
            raise errors.DeviceError(f"{fn}: {n0} is on {_dev(v0)} and {n} on {_dev(v)}; "
                                     f"move {n} to {_dev(v0)} first (e.g. torch: {n}.to({n0}.device))")


def owner_of(fn: str, name: str, x: Any) -> str:
    """The result's framework: the first operand's, one xgemm can allocate in and hand back."""
    owner = arrays.require_array(fn, name, x)
    if owner == "other":
        raise errors.FrameworkError(
            f"{fn}: {name} is a {type(x).__name__} (a DLPack producer xgemm does not know), and the result takes "
            f"the first operand's framework; pass a NumPy, torch, CuPy or JAX array first, e.g. "
            f"numpy.from_dlpack({name}) or torch.from_dlpack({name})")
    return owner


def _owner_and_tracers(fn: str, named: Sequence[Tuple[str, Any]]) -> str:
    fw = owner_of(fn, named[0][0], named[0][1])
    for name, x in named[1:]:
        arrays.require_array(fn, name, x)
        if fw != "jax" and arrays.is_jax_tracer(x):
            raise errors.FrameworkError(f"{fn}: {name} is a JAX tracer (inside jax.jit/grad) but {named[0][0]} is a "
                                        f"{fw} array; pass JAX arrays for every operand inside JAX transforms")
    return fw


def torch_tracing(x: Any) -> bool:
    """Is x a torch tensor inside a torch.compile trace?"""
    return arrays.framework_of(x) == "torch" and sys.modules["torch"].compiler.is_compiling()


def torch_op_needed(*xs: Any) -> bool:
    """Torch tensors that require grad (or a torch.compile trace) go through the torch.library ops.
    Decided without importing xgemm.torch.ops: registering its ops costs a first call ~6 ms."""
    if arrays.framework_of(xs[0]) != "torch":
        return False
    torch = sys.modules["torch"]
    if torch.compiler.is_compiling():
        return True
    return torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in xs if x is not None)


def run(prep: "Prepared | Any") -> Any:
    """Launch a Prepared call on the caller's current stream; the result in the caller's framework."""
    if not isinstance(prep, Prepared):      # JAX: already computed by its primitive
        return prep
    plan = prep.plan
    device = plan.problem.device
    if device.kind == "cuda":
        driver.bind_thread(device.index)        # a thread with no context yet (torch's autograd workers)
    stream = arrays.current_stream(plan.problem.framework, device)
    # the next kernel where this one's binary cannot be built: every kernel of a table takes the
    # operands and out a GPU kernel was prepared with (fastpath stores the plan that ran)
    prep.plan, result = policy.attempt(plan, lambda p: p.kernel.run(p.problem, p.policy, prep.operands, prep.out, stream))
    return prep.finish(prep.out.obj if result is None else result)


def adopt_foreign(owner: str, fn: str, x: Any, name: str) -> Any:
    """x, or, where it is a DLPack producer of no known framework (which may have no .dtype or
    .shape to check), x brought into the owner's framework first, as it would be later anyway."""
    return arrays.import_into(owner, x, name, fn) if x is not None and arrays.framework_of(x) == "other" else x


def numpy_copied_into_jax(named: Sequence[Tuple[str, Any]]) -> List[str]:
    """explain()'s lines for the NumPy operands of a JAX call: jnp.asarray copies them (JAX arrays
    own their buffers; arrays/ops.import_into)."""
    return [f"{name}: a NumPy array, copied into a JAX array (JAX arrays own their buffers)"
            for name, x in named if x is not None and arrays.framework_of(x) == "numpy"]


def prepare_gemm(fn: str, a: Any, b: Any, c: Any, alpha: Any, beta: Any, out: Any, *, plan_only: bool = False,
                 out_dtype: Optional[str] = None, bias: Any = None, activation: Optional[str] = None):
    """A Prepared GEMM (or, with plan_only, its Plan); for JAX operands the result itself.
    out_dtype: the result's dtype without out= (one of checks.out_dtypes; default the operands').
    bias / activation: a fused epilogue (compose.py checked them): only a kernel that fuses may run
    it; a plan naming the reference means the caller composes (the reference refuses to run it)."""
    alpha = checks.scalar(fn, "alpha", alpha, traced=arrays.is_jax_tracer(alpha))
    beta = checks.scalar(fn, "beta", beta, traced=arrays.is_jax_tracer(beta))
    named = [("a", a), ("b", b)] + ([("c", c)] if c is not None else [])
    owner = _owner_and_tracers(fn, named)
    b, c = adopt_foreign(owner, fn, b, "b"), adopt_foreign(owner, fn, c, "c")
    c_used = c if (c is not None and beta != 0.0) else None
    if owner == "jax":               # xgemm.jax checks the arrays as below (core/checks.py)
        if out is not None:
            raise errors.OutError(f"{fn}: out= is not supported for JAX (its arrays are immutable); use the result")
        b_j = arrays.import_into("jax", b, "b", fn)
        c_j = arrays.import_into("jax", c_used, "c", fn) if c_used is not None else None
        from xgemm import jax as xjax
        if plan_only:
            plan = xjax.explain_gemm(a, b_j, c_j, alpha=alpha, beta=beta, out_dtype=out_dtype, fn=fn)
            plan.copies[:0] = numpy_copied_into_jax([("b", b), ("c", c_used)])
            return plan
        return xjax.gemm(a, b_j, c_j, alpha=alpha, beta=beta, out_dtype=out_dtype, fn=fn)
    dt = checks.gemm_dtypes(fn, arrays.dtype_name(a), arrays.dtype_name(b),
                            arrays.dtype_name(c) if c is not None else None)
    shape = checks.gemm_shape(fn, tuple(a.shape), tuple(b.shape), tuple(c.shape) if c is not None else None,
                              beta, c is not None)
    m, n, k, batch, a_vec, b_vec = shape.m, shape.n, shape.k, shape.batch, shape.a_vec, shape.b_vec
    full, final = shape.full, shape.final
    if activation in epilogues.GATED:   # act(gate) * up of B = [gate | up]: D is half as wide (compose checked)
        n = n // 2
        full, final = full[:-1] + (n,), final[:-1] + (n,)
    out_dtypes = checks.out_dtypes(dt)
    if out is not None and arrays.framework_of(out) not in (None, "jax"):
        out_dtype = arrays.dtype_name(out)
    else:
        out_dtype = checks.out_dtype(fn, dt, out_dtype)

    b = arrays.import_into(owner, b, "b", fn)
    c_used = arrays.import_into(owner, c_used, "c", fn) if c_used is not None else None
    va, vb = arrays.view(a, "a", fn), arrays.view(b, "b", fn)
    vc = arrays.view(c_used, "c", fn) if c_used is not None else None
    vbias = arrays.view(arrays.import_into(owner, bias, "bias", fn), "bias", fn) if bias is not None else None
    same_device(fn, [("a", va), ("b", vb)] + ([("c", vc)] if vc is not None else [])
                + ([("bias", vbias)] if vbias is not None else []))
    vout = check_out(fn, out, owner, final, out_dtypes, [va, vb] + ([vc] if vc is not None else [])) if out is not None else None

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
        a2v = va if not a_vec else arrays.view(a2, "a", fn)
        bv2 = vb if not b_vec else arrays.view(b2, "b", fn)
        cv2 = vc
    # where the GPU kernel writes D: out itself when it can take it in place, else a compact result
    target_v = None
    if on_gpu and out is not None:
        cand = _batched(_promote_out(out, a_vec, b_vec), batch)
        target_v = arrays.view(cand, "out", fn) if cand is not None else None
        if target_v is not None and layout.majorness(target_v.shape, target_v.strides) == STRIDED:
            target_v = None
    out_op = arrays.operand(target_v) if target_v is not None else None
    epilogue = Epilogue(alpha=alpha, beta=beta, has_c=cv2 is not None, out_dtype=out_dtype,
                        out_majorness=out_op.majorness if out_op else ROW, out_alignment=out_op.alignment if out_op else 16,
                        activation=activation)
    problem = GemmProblem(m=m, n=n, k=k, batch=batch, a=arrays.operand(a2v), b=arrays.operand(bv2),
                          c=arrays.operand(cv2) if cv2 is not None else None, epilogue=epilogue,
                          framework=owner, device=va.device,
                          bias=arrays.operand(vbias) if vbias is not None else None)
    empty = shape.empty
    plan = _choose("gemm", problem, empty=empty)
    plan.copies.extend(copies)
    # (a fused epilogue is never staged: the padded problem would drop it)
    if on_gpu and not empty and dt in checks.HALF and plan.kernel.name == "reference" and not problem.fused:
        staged = _stage_aligned(fn, plan, problem, (a2v, bv2, cv2), batch, out, a_vec, b_vec)
        if staged is not None:
            return staged.plan if plan_only else staged
    if plan_only:
        return plan

    is_reference = plan.kernel.name == "reference"
    if is_reference:
        out2 = None if out is None else (vout if not (a_vec or b_vec) else arrays.view(_promote_out(out, a_vec, b_vec), "out", fn))
        operands = (a2v if not on_gpu else arrays.view(a2, "a", fn), bv2 if not on_gpu else arrays.view(b2, "b", fn),
                    (vc if not (a_vec or b_vec) else arrays.view(_promote_c(c_used, a_vec, b_vec), "c", fn))
                    if c_used is not None else None)
        def finish(r):
            return out if out is not None else _squeeze(r, a_vec, b_vec)
        return Prepared(plan, operands, out2, finish)

    # GPU kernel: it writes a contiguous (L, M, N) or (M, N) result; out is written in place when it can be.
    target = target_v.obj if target_v is not None else None
    result = arrays.empty(owner, full, out_dtype, va.device, a) if target is None else None
    if target is None and out is not None:
        plan.copies.append(f"out: strided {vout.strides} -> result written to a temporary, then copied into out")
    kernel_out = target_v if target is not None else arrays.view(_batched(result, batch), "out", fn)

    def finish(r):
        if out is None:
            return _squeeze(result, a_vec, b_vec)
        if target is None:
            out[...] = _squeeze(result, a_vec, b_vec)
        return out
    # a fused epilogue's operands follow C: (bias, scale_m, scale_n), None where absent
    return Prepared(plan, (a2v, bv2, cv2) + ((vbias, None, None) if problem.fused else ()), kernel_out, finish)


def _stage_aligned(fn: str, plan: policy.Plan, problem: GemmProblem, operands: tuple, batch: Tuple[int, ...],
                   out: Any, a_vec: bool, b_vec: bool) -> Optional["Prepared"]:
    """An fp16/bf16 GEMM every GPU kernel declined (a row of A, B, C or D is not a multiple of 16
    bytes, or a base address is not 16-byte aligned) runs on 16-byte-aligned copies instead of
    the framework fallback (which computes in fp32): a K or N that is not a multiple of 8 elements
    is padded to a multiple of 16, the K padding of A and B zero-filled so it adds nothing, and D
    is written into a padded buffer whose first N columns become the result. None when no kernel
    takes even that."""
    m, n, k = problem.m, problem.n, problem.k
    a2v, bv2, cv2 = operands
    kp, np_ = layout.padded_dims(k, n, a2v.itemsize)
    copies = list(plan.copies)

    def ready(v: arrays.ArrayView) -> bool:
        op = arrays.operand(v)
        return op.majorness != STRIDED and op.alignment >= 16

    def staged(v, rows_p, cols_p, zero_rows, zero_cols, name):
        if v.shape[-2:] == (rows_p, cols_p) and ready(v):
            return v
        lead = v.shape[:-2]
        if lead and not any(v.strides[:-2]):     # one matrix broadcast over the batch: pad it once
            one = arrays.padded_copy(arrays.view(v.obj[(0,) * len(lead)], name, fn), (rows_p, cols_p),
                                      zero_rows, zero_cols, name, copies)
            return arrays.view(_broadcast_to(one.obj, lead + (rows_p, cols_p), problem.framework), name, fn)
        return arrays.padded_copy(v, lead + (rows_p, cols_p), zero_rows, zero_cols, name, copies)

    a_p = staged(a2v, m, kp, False, True, "a")
    b_p = staged(bv2, kp, np_, True, False, "b")
    c_p = staged(cv2, m, np_, False, False, "c") if cv2 is not None else None
    full_p = batch + (m, np_)
    ep = problem.epilogue
    epilogue = Epilogue(alpha=ep.alpha, beta=ep.beta, has_c=ep.has_c, out_dtype=ep.out_dtype)
    padded = GemmProblem(m=m, n=np_, k=kp, batch=batch, a=arrays.operand(a_p), b=arrays.operand(b_p),
                         c=arrays.operand(c_p) if c_p is not None else None, epilogue=epilogue,
                         framework=problem.framework, device=problem.device)
    plan_p = policy.choose("gemm", padded)
    if plan_p.kernel.name == "reference":
        return None
    if np_ != n:
        copies.append(f"out: written as {full_p} (N padded to {np_}); its first {n} columns "
                      + ("copied into out" if out is not None else "copied into a compact result"))
    elif out is not None:
        copies.append("out: the kernel writes a compact temporary that is copied into out")
    plan_p = plan_p.padded_from(plan, copies)
    result_p = arrays.empty(problem.framework, full_p, ep.out_dtype, problem.device, a2v.obj)

    def finish(r):
        res = result_p[..., :n] if np_ != n else result_p
        if out is not None:
            out[...] = _squeeze(res, a_vec, b_vec)
            return out
        if np_ != n:
            res = arrays.compact(arrays.view(res, "out", fn), "out", []).obj
        return _squeeze(res, a_vec, b_vec)
    return Prepared(plan_p, (a_p, b_p, c_p), arrays.view(_batched(result_p, batch), "out", fn), finish)


def _choose(op: str, problem, *, empty: bool) -> policy.Plan:
    if empty:   # nothing to launch; the framework's own op returns the correctly shaped zeros / beta*C
        ref = policy.reference(op)
        return policy.Plan(op=op, problem=problem, kernel=ref, policy=ref.policy(problem),
                           declined=[("all kernels", "empty problem (a zero-size dimension): nothing to launch")])
    return policy.choose(op, problem)


def _broadcast_to(x: Any, shape: Tuple[int, ...], fw: str) -> Any:
    if tuple(x.shape) == tuple(shape):
        return x
    return x.expand(*shape) if fw == "torch" else __import__("sys").modules[fw].broadcast_to(x, shape)


def _batched(x: Any, batch: Tuple[int, ...]) -> Optional[Any]:
    """x (batch..., R, C) as a (L, R, C) view, or (R, C) when there is no batch; None if not collapsible."""
    if not batch:
        return x
    shape, strides = tuple(x.shape), arrays.view(x, "x", "batch").strides
    if not layout.collapsible(shape[:-2], strides[:-2]):
        return None
    return x.reshape((math.prod(batch),) + shape[-2:])


def _kernel_operand(x: Any, v: Optional[arrays.ArrayView], name: str, batch: Tuple[int, ...],
                    copies: List[str]) -> arrays.ArrayView:
    """Broadcast to the batch, fold batch dims into one, and compact once if a kernel could not read it.
    `v` is x's view when the caller already has one (the common 2-D case costs no further work)."""
    if not batch and v is not None and layout.majorness(v.shape, v.strides) != STRIDED:
        return v
    fw = arrays.framework_of(x)
    if batch:
        x = _broadcast_to(x, batch + tuple(x.shape[-2:]), fw)
    v = arrays.view(x, name, "gemm")
    folded = _batched(x, batch)
    if folded is None or layout.majorness(v.shape, v.strides) == STRIDED:
        v = arrays.compact(v, name, copies)
        folded = _batched(v.obj, batch)
    return arrays.view(folded, name, "gemm")


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


def prepare_softmax(fn: str, x: Any, axis: Any, out: Any, *, plan_only: bool = False):
    """A Prepared softmax (or, with plan_only, its Plan); for JAX arrays the result itself."""
    owner = owner_of(fn, "x", x)
    if owner == "jax":               # xgemm.jax checks the array as below (core/checks.py)
        if out is not None:
            raise errors.OutError(f"{fn}: out= is not supported for JAX (its arrays are immutable); use the result")
        from xgemm import jax as xjax
        return xjax.explain_softmax(x, axis, fn=fn) if plan_only else xjax.softmax(x, axis=axis, fn=fn)
    ndim = len(x.shape)
    dt = checks.dtype(fn, "x", arrays.dtype_name(x)) if ndim else None
    axis = checks.softmax_axis(fn, ndim, axis)
    vx = arrays.view(x, "x", fn)
    vout = check_out(fn, out, owner, vx.shape, (dt,), [vx]) if out is not None else None
    shape = vx.shape
    cols = shape[axis]
    rows = math.prod(shape) // cols if cols else math.prod(shape[:axis] + shape[axis + 1:])
    copies: List[str] = []
    on_gpu = vx.device.kind == "cuda"
    if on_gpu:
        moved = _moveaxis_last(x, axis, owner)
        mv = arrays.view(moved, "x", fn)
        if mv.strides[-1] != 1 or not layout.collapsible(mv.shape[:-1], mv.strides[:-1]):
            mv = arrays.compact(mv, "x", copies)
            if axis != ndim - 1:
                copies[-1] += f" (axis {axis} moved last: the kernel reduces a contiguous dim)"
        x2 = arrays.view(mv.obj.reshape(rows, cols), "x", fn)
        xop = Operand(shape=x2.shape, strides=x2.strides, dtype=dt, majorness=ROW, alignment=arrays.alignment(x2, ROW))
    else:
        x2 = vx
        major = ROW if vx.strides[axis] == 1 or cols <= 1 else STRIDED
        xop = Operand(shape=vx.shape, strides=vx.strides, dtype=dt, majorness=major, alignment=arrays.alignment(vx, STRIDED))
    problem = SoftmaxProblem(rows=rows, cols=cols, shape=shape, axis=axis, x=xop, out_dtype=dt,
                             framework=owner, device=vx.device)
    plan = _choose("softmax", problem, empty=(rows * cols == 0))
    plan.copies.extend(copies)
    if plan_only:
        return plan
    if plan.kernel.name == "reference":
        return Prepared(plan, (vx,), vout, lambda r: out if out is not None else r)

    if vout is not None and axis == ndim - 1 and (vout.strides[-1] == 1 or cols <= 1) \
            and layout.collapsible(vout.shape[:-1], vout.strides[:-1]):
        # out's rows are the kernel's rows (any row stride): write them in place, no temporary
        direct = arrays.view(out.reshape(rows, cols), "out", fn)
        if direct.ptr == vout.ptr or rows * cols == 0:
            return Prepared(plan, (x2,), direct, lambda r: out)
    moved_shape = tuple(d for i, d in enumerate(shape) if i != axis) + (cols,)
    result = arrays.empty(owner, moved_shape, dt, vx.device, x)
    kernel_out = arrays.view(result.reshape(rows, cols), "out", fn)

    def finish(r):
        y = _moveaxis_back(result, axis, owner)
        if out is None:
            return y
        out[...] = y
        return out
    if out is not None:
        plan.copies.append("out: the kernel writes a row-major temporary that is copied into out")
    return Prepared(plan, (x2,), kernel_out, finish)


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


