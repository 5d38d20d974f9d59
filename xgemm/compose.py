"""Epilogues composed after the product, in the caller's framework: bias, activation, gating.

    gemm(a, b, c, alpha=, beta=, bias=, activation=)   D = act(alpha A@B + beta C + bias)
    gated(a, b, bias=, activation="swiglu")             D = act(gate) * up of [gate | up] = A@B + bias
    ragged_dot / grouped_mm(..., activation=)           act(the grouped product), or its gate (run_grouped)

Where a kernel fuses the epilogue (cute_gemm_sm90's Epi classes: bias + activation, or gated
with a [gate | up] bias; its grouped class: an activation or a gate; eager fp16/bf16 on the GPU
without autograd), the call is planned with it (a gated one with activation = the gated name) and
that kernel writes D once. Otherwise the product runs through the usual kernels with a
float32 result (float64 for float64 operands), the epilogue runs on it with the framework's own
ops in that type (core/epilogues.py), and the result is cast once: the numerics of a fused fp32
epilogue, at the cost of one more pass over D. The product is xgemm's (for torch under autograd
or torch.compile, its custom op; for JAX, xgemm.jax), the epilogue ordinary framework ops, so
autograd, torch.compile and jax.grad / vmap / jit need nothing new. explain() says which.
"""
from __future__ import annotations

import sys
from typing import Any, Optional

from xgemm import arrays, errors, grouped, prepare
from xgemm.core import checks, epilogues, grouped_checks, policy


def _check(fn: str, a: Any, b: Any, c: Any, beta: float, bias: Any, activation: Optional[str], gated: bool):
    """(dtype, result shape) after gemm's checks and those an epilogue adds."""
    checks.activation(fn, activation, gated)
    dt = checks.gemm_dtypes(fn, arrays.dtype_name(a), arrays.dtype_name(b),
                            arrays.dtype_name(c) if c is not None else None)
    shape = checks.gemm_shape(fn, tuple(a.shape), tuple(b.shape), tuple(c.shape) if c is not None else None,
                              beta, c is not None)
    final = checks.epilogue_shape(fn, shape, gated, arrays.dtype_name(bias) if bias is not None else None,
                                  tuple(bias.shape) if bias is not None else None, dt)
    return dt, final


def no_jax_out(fn: str, out: Any) -> None:
    if out is not None:
        raise errors.OutError(f"{fn}: out= is not supported for JAX (its arrays are immutable); use the result")


def run(fn: str, a: Any, b: Any, c: Any, alpha: Any, beta: Any, bias: Any, activation: Optional[str],
        gated: bool, out: Any, *, plan_only: bool = False) -> Any:
    """The composed call (or, with plan_only, the product's Plan with its epilogue line)."""
    arrays.require_arrays(fn, (("a", a), ("b", b)), (("c", c), ("bias", bias)))
    alpha = checks.scalar(fn, "alpha", alpha, traced=arrays.is_jax_tracer(alpha))
    beta = checks.scalar(fn, "beta", beta, traced=arrays.is_jax_tracer(beta))
    owner = prepare.owner_of(fn, "a", a)
    b, c, bias = (prepare.adopt_foreign(owner, fn, x, name) for x, name in ((b, "b"), (c, "c"), (bias, "bias")))
    if owner == "jax":
        no_jax_out(fn, out)
        from xgemm import jax as xjax
        given = [("b", b), ("c", c), ("bias", bias)]
        b, c, bias = (arrays.import_into("jax", x, name, fn) if x is not None else None for name, x in given)
        if plan_only:
            plan = xjax.explain_epilogue(a, b, c, alpha=alpha, beta=beta, bias=bias, activation=activation,
                                         gated=gated, fn=fn)
            plan.copies[:0] = prepare.numpy_copied_into_jax(given)
            return plan
        if gated:
            return xjax.gated(a, b, bias=bias, activation=activation, fn=fn)
        return xjax.gemm(a, b, c, alpha=alpha, beta=beta, bias=bias, activation=activation, fn=fn)
    c_used = c if beta != 0.0 else None
    tracing = owner == "torch" and sys.modules["torch"].compiler.is_compiling()
    if tracing:
        # a torch.compile trace: the product's checks run inside the op (prepare_gemm, at run
        # time), the epilogue's shapes are torch's; dynamo cannot trace checks.broadcast's max(default=)
        checks.activation(fn, activation, gated)
        dt = arrays.dtype_name(a)
    else:
        dt, final = _check(fn, a, b, c, beta, bias, activation, gated)
        if bias is not None:
            bias = arrays.import_into(owner, bias, "bias", fn)
            prepare.same_device(fn, [("a", arrays.view(a, "a", fn)), ("bias", arrays.view(bias, "bias", fn))])
    acc = "float64" if dt == "float64" else "float32"
    if out is not None and not tracing:
        inputs = [arrays.view(x, name, fn) for x, name in ((a, "a"), (b, "b"), (c_used, "c"), (bias, "bias"))
                  if x is not None]
        prepare.check_out(fn, out, owner, final, checks.out_dtypes(dt), inputs)
    fused = None if tracing else _fused(fn, owner, a, b, c_used, alpha, beta, bias, activation, out, dt, plan_only)
    # a torch gated product of fp16/bf16 operands under autograd (or a trace): the product in the
    # input dtype, as torch's own layer rounds it, then the gate as the op xgemm::gate
    # (triton_gate_sm90 on a GPU: one pass forward, one backward; 1.17x torch's unfused SwiGLU
    # forward + backward on the H200, docs/performance.md). Without autograd the float32 product
    # keeps the fp32-accumulate tolerance that the fused kernels hold.
    gate_op = gated and owner == "torch" and dt in checks.HALF and prepare.torch_op_needed(a, b, c_used, bias)
    product_dt = dt if gate_op else acc
    if plan_only:
        if fused is not None:
            fused.epilogue = epilogues.describe(bias is not None, activation, gated, acc, owner, fused.kernel.name)
            return fused
        plan = prepare.prepare_gemm(fn, a, b, c_used, alpha, beta, None, plan_only=True, out_dtype=product_dt)
        plan.epilogue = epilogues.describe(bias is not None, activation, gated, product_dt, owner, gate_op=gate_op)
        return plan
    # None: the only kernel that fuses it could not build its class (policy.attempt): composed
    result = None if fused is None else policy.built_or_none(lambda: prepare.run(fused))
    if result is not None:
        return result
    xp = arrays.namespace(owner)
    pre = _product(fn, owner, a, b, c_used, alpha, beta, product_dt)
    if bias is not None:
        pre = pre + xp.astype(bias, pre.dtype)
    if gate_op:
        y = _torch_gate(pre, activation)
    else:
        y = epilogues.gate(xp, pre, activation) if gated else epilogues.apply(xp, pre, activation)
    out_dt = arrays.dtype_name(out) if out is not None else dt
    y = xp.astype(y, arrays.framework_dtype(owner, out_dt))
    if out is None:
        return y
    if owner == "torch":
        out.copy_(y)
    else:
        out[...] = y
    return out


def _fused(fn: str, owner: str, a: Any, b: Any, c: Any, alpha: float, beta: float, bias: Any,
           activation: Optional[str], out: Any, dt: str, plan_only: bool) -> Optional[Any]:
    """The Prepared call (with plan_only, the Plan) of a kernel that fuses this bias / activation
    (or gating: activation is then the gated name, swiglu | geglu | reglu) into its epilogue, or
    None (then the epilogue is composed): eager fp16/bf16 matrices on a GPU, no autograd (the
    composed path's product op carries the gradient)."""
    if owner not in ("torch", "cupy") or dt not in checks.HALF or a.ndim < 2 or b.ndim < 2:
        return None
    if arrays.view(a, "a", fn).device.kind != "cuda" or prepare.torch_op_needed(a, b, c, bias):
        return None
    got = prepare.prepare_gemm(fn, a, b, c, alpha, beta, out, plan_only=plan_only, bias=bias, activation=activation)
    return got if (got if plan_only else got.plan).kernel.name != "reference" else None


def _product(fn: str, owner: str, a: Any, b: Any, c: Any, alpha: float, beta: float, acc: str) -> Any:
    """alpha A @ B + beta C in `acc`, through xgemm (the torch op when autograd or a trace needs it)."""
    if prepare.torch_op_needed(a, b, c):
        from xgemm.torch import ops as xtorch
        return xtorch.gemm(fn, a, b, c, alpha, beta, acc)
    return prepare.run(prepare.prepare_gemm(fn, a, b, c, alpha, beta, None, out_dtype=acc))


def run_grouped(op: str, entry: Any, a: Any, b: Any, index: Any, out_dtype: Any, activation: Optional[str], *,
                fn: Optional[str] = None, plan_only: bool = False) -> Any:
    """ragged_dot / grouped_mm (op) with an activation: for eager torch / CuPy fp16/bf16 operands,
    fused into the grouped kernel's epilogue where one takes the problem (grouped.run_fused: float32
    accumulator, the activation, one rounding). Otherwise composed: `entry` (the public call
    without one) in float32 (float64 for float64 operands), then the activation, or for swiglu /
    geglu / reglu the gate of the product's [gate | up] halves, in that type, and one cast to the
    result's dtype. Rows in no group are act(0) (zero but for sigmoid's 0.5), as composing the
    framework's own activation after the product gives. torch fp16/bf16 under autograd: the product
    in the input dtype and the gate as the op xgemm::gate, as run() does for gated(). JAX arrays:
    xgemm.jax, whose primitive fuses it where the grouped kernel takes it and composes it as here
    otherwise and under jax.grad. plan_only: explain()'s text, the plan and the epilogue line."""
    fn = fn or op
    names = grouped_checks.ARG_NAMES[op]
    arrays.require_arrays(fn, zip(names, (a, b, index)))
    gated = grouped_checks.activation(fn, activation, names, tuple(b.shape))
    owner = prepare.owner_of(fn, names[0], a)
    dt = checks.operand_dtypes(fn, names[:2], arrays.dtype_name(a), arrays.dtype_name(b))
    gate_op = gated and owner == "torch" and dt in checks.HALF and prepare.torch_op_needed(a, b)
    product_dt = dt if gate_op else "float64" if dt == "float64" else "float32"
    want = checks.out_dtype(fn, dt, arrays.requested_dtype(out_dtype))
    if owner in ("torch", "cupy") and dt in checks.HALF and not prepare.torch_op_needed(a, b):
        # None also where the fusing class could not be built (policy.built_or_none): composed, as in run()
        fused = policy.built_or_none(lambda: grouped.run_fused(op, a, b, index, want, activation, fn=fn,
                                                               plan_only=plan_only))
        if fused is not None and plan_only:
            fused.epilogue = epilogues.describe(False, activation, gated, "float32", owner, fused.kernel.name)
            return f"{op}: {fused}"
        if fused is not None:
            return fused
    if owner == "jax":
        from xgemm.jax import grouped as jax_grouped
        if plan_only:
            return jax_grouped.explain(op, a, b, index, out_dtype, activation)
        if op == "ragged_dot":
            return jax_grouped.ragged_dot(a, b, index, preferred_element_type=out_dtype, activation=activation, fn=fn)
        return jax_grouped.grouped_mm(a, b, index, out_dtype=out_dtype, activation=activation, fn=fn)
    if plan_only:
        return (grouped.explain(op, a, b, index, product_dt) + "\n  epilogue: "
                + epilogues.describe(False, activation, gated, product_dt, owner, gate_op=gate_op))
    pre = entry(a, b, index, out_dtype=product_dt)
    xp = arrays.namespace(owner)
    y = _torch_gate(pre, activation) if gate_op else epilogues.activate(xp, pre, activation)
    return xp.astype(y, arrays.framework_dtype(owner, want))


def _torch_gate(pre: Any, activation: str) -> Any:
    """act(gate) * up of a torch [..., 2n] pre-activation through the op xgemm::gate (2-D)."""
    from xgemm.torch import ops as xtorch
    return xtorch.gate_op(pre.reshape(-1, pre.shape[-1]), activation).reshape(*pre.shape[:-1], pre.shape[-1] // 2)
