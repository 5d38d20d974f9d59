"""The entry points, thin: a repeat call served by the torch fast path, else validate -> plan -> run.

prepare.py turns caller arrays into a Prepared call (checks, views, Problem, plan, the kernel's
operands) and runs it; torch tensors under autograd or a torch.compile trace go through the
torch.library ops (torch/ops.py); JAX arrays and tracers go to xgemm.jax.
"""
from __future__ import annotations

from typing import Any, Optional

from xgemm import arrays, compose, errors, fp8, grouped, prepare
from xgemm.core import checks, fp8_checks, policy
from xgemm.torch import fastpath
from xgemm.torch import native as torch_native

_SOFTMAX = torch_native.OPS["softmax"]


def matmul(a: Any, b: Any, *, out: Any = None) -> Any:
    """A @ B with numpy.matmul semantics (1-D operands, broadcast batch dims). Result in a's framework."""
    return gemm(a, b, None, out=out, _fn="matmul")


def gemm(a: Any, b: Any, c: Any = None, *, alpha: float = 1.0, beta: float = 0.0, out: Any = None,
         bias: Any = None, activation: Optional[str] = None, _fn: str = "gemm") -> Any:
    """D = act(alpha * A @ B + beta * C + bias). C broadcasts to D's shape; beta == 0 never reads C;
    bias is a vector of N values added to every row; activation is one of relu, relu2, gelu,
    gelu_tanh, silu, sigmoid (None: none). The epilogue runs in float32 (float64 for float64)."""
    if bias is not None or activation is not None:
        return compose.run(_fn, a, b, c, alpha, beta, bias, activation, False, out)
    if out is not None and prepare.torch_tracing(a):
        # dynamo cannot trace out='s DLPack view: the op writes a result of out's dtype, copied into out
        from xgemm.torch import ops as xtorch
        alpha, beta = checks.scalar(_fn, "alpha", alpha), checks.scalar(_fn, "beta", beta)
        dt = checks.out_dtype(_fn, arrays.dtype_name(a), arrays.dtype_name(out))
        return _copied_into(_fn, out, xtorch.gemm(_fn, a, b, c if beta != 0.0 else None, alpha, beta, dt))
    # C++: a signature seen before. Under a torch.compile trace the native module is never touched
    # (dynamo can neither guard on a module object nor trace its call): compiling() is asked first.
    if out is None and not torch_native.compiling() and torch_native.active is not None:
        hit = torch_native.active.hit(torch_native.OPS[_fn], policy.forced_kernel(), alpha, beta, a, b, c)
        if hit is not None:
            return hit
    key = fastpath.gemm_key(_fn, a, b, c, alpha, beta) if out is None else None
    if key is not None:                     # a signature seen before: no planning
        hit = fastpath.gemm_hit(key, a, b, c)
        if hit is not None:
            return hit
    elif out is None and prepare.torch_op_needed(a, b, c):
        from xgemm.torch import ops as xtorch
        alpha, beta = checks.scalar(_fn, "alpha", alpha), checks.scalar(_fn, "beta", beta)
        return xtorch.gemm(_fn, a, b, c if beta != 0.0 else None, alpha, beta)
    prep = prepare.prepare_gemm(_fn, a, b, c, alpha, beta, out)
    result = prepare.run(prep)
    if key is not None and isinstance(prep, prepare.Prepared):
        fastpath.gemm_store(key, prep, result)
    return result


def gated(a: Any, b: Any, *, bias: Any = None, activation: str = "swiglu", out: Any = None,
          layout: str = "concat") -> Any:
    """act(gate) * up, where A @ B + bias = [gate | up]: b's first N/2 columns are the gate
    projection, its last N/2 the up projection; the result has N/2 columns. activation: swiglu
    (silu gate), geglu (exact gelu) or reglu (relu). layout="stacked": b [..., K, 2, H] with
    b[..., 0, :] the gate and b[..., 1, :] the up projection, bias (2, H): the layout to shard
    along H in JAX, as each shard then holds matching gate and up columns. Interleaved weights
    ([g0, u0, g1, u1, ...]): pass b.reshape(K, N // 2, 2).swapaxes(-1, -2).reshape(K, N)."""
    if layout != "concat":
        if arrays.framework_of(a) == "jax":          # it checks the layout itself
            from xgemm import jax as xjax
            compose.no_jax_out("gated", out)
            return xjax.gated(a, b, bias=bias, activation=activation, layout=layout, fn="gated")
        b, bias = _stacked_as_concat("gated", a, b, bias, layout)
    return compose.run("gated", a, b, None, 1.0, 0.0, bias, activation, True, out)


def _explain_stacked(a: Any, b: Any, bias: Any, activation: str, layout: str, out: Any) -> policy.Plan:
    """gated(layout="stacked")'s plan: eagerly the concat layout's (the call reshapes b so); for JAX,
    which runs the gate and the up halves as two products, the plan of one of them."""
    b2, bias2 = _stacked_as_concat("explain", a, b, bias, layout)
    if arrays.framework_of(a) != "jax":
        return compose.run("explain", a, b2, None, 1.0, 0.0, bias2, activation, True, out, plan_only=True)
    acc = "float64" if arrays.dtype_name(a) == "float64" else "float32"
    plan = prepare.prepare_gemm("explain", a, b[..., 0, :], None, 1.0, 0.0, None, plan_only=True, out_dtype=acc)
    plan.epilogue = (f"layout='stacked': this product twice (b's gate and up halves, each [K, H]), then "
                     f"{activation}'s gate of the two in {acc} and one cast (jax.numpy)")
    return plan


def _stacked_as_concat(fn: str, a: Any, b: Any, bias: Any, layout: str):
    """(b, bias) of the stacked layout ([..., K, 2, H], (2, H)), checked in the caller's shapes, as
    the concat layout's [..., K, 2H] and (2H,): views where the strides allow (the same numbers)."""
    arrays.require_arrays(fn, (("a", a), ("b", b)), (("bias", bias),))
    checks.gated_layout(fn, layout, tuple(b.shape), None if bias is None else tuple(bias.shape), tuple(a.shape))
    b = b.reshape(*b.shape[:-2], 2 * b.shape[-1])
    return b, None if bias is None else bias.reshape(2 * bias.shape[-1])


def ragged_dot(lhs: Any, rhs: Any, group_sizes: Any, *, out_dtype: Any = None,
               activation: Optional[str] = None) -> Any:
    """lhs [T, K] in contiguous groups of group_sizes[e] rows, each times rhs[e] [K, N] -> [T, N]
    (jax.lax.ragged_dot's semantics; rows beyond sum(group_sizes) are zeros). Result in lhs's framework;
    the group sizes are never read on the host. activation: one of gemm's (applied to the product)
    or swiglu | geglu | reglu (rhs[e] holds [gate | up] columns, the result act(gate) * up, N / 2
    wide: an MoE expert's gated MLP input projection); composed after the product (compose.run_grouped)."""
    if activation is not None:
        return compose.run_grouped("ragged_dot", ragged_dot, lhs, rhs, group_sizes, out_dtype, activation)
    if prepare.torch_op_needed(lhs, rhs):
        from xgemm.torch import grouped_ops
        return grouped_ops.ragged_dot(lhs, rhs, group_sizes, out_dtype=out_dtype)
    return grouped.ragged_dot(lhs, rhs, group_sizes, out_dtype=out_dtype)


def grouped_mm(x: Any, w: Any, offs: Any, *, out_dtype: Any = None, activation: Optional[str] = None) -> Any:
    """torch._grouped_mm's offsets (cumulative group ends): x [T, K], w [E, K, N] -> [T, N];
    x [M, T], w [T, N] -> [E, M, N]. Rows beyond offs[-1] are zeros (torch leaves them unwritten).
    activation: as ragged_dot takes it."""
    if activation is not None:
        return compose.run_grouped("grouped_mm", grouped_mm, x, w, offs, out_dtype, activation)
    if prepare.torch_op_needed(x, w):
        from xgemm.torch import grouped_ops
        return grouped_ops.grouped_mm(x, w, offs, out_dtype=out_dtype)
    return grouped.grouped_mm(x, w, offs, out_dtype=out_dtype)


def scaled_matmul(a: Any, b: Any, scale_a: Any, scale_b: Any, *, out_dtype: Any = "bfloat16", bias: Any = None,
                  use_fast_accum: bool = False) -> Any:
    """(a * scale_a) @ (b * scale_b) + bias in float32, cast to out_dtype; a, b fp8 (e4m3fn / e5m2);
    the scales' shapes select the recipe: tensor-wise (scalars), row-wise ([M, 1], [1, N]) or
    block-wise ([M, K/128], [K/128, N/128]) (xgemm/fp8.py). use_fast_accum=True (as
    torch._scaled_mm takes it) lets an FP8 kernel keep its sums in the tensor core's accumulator,
    ~14 bits, for speed. Result in a's framework."""
    if prepare.torch_op_needed(a, b, scale_a, scale_b, bias):
        from xgemm.torch import fp8_ops
        return fp8_ops.scaled_matmul(a, b, scale_a, scale_b, out_dtype=out_dtype, bias=bias,
                                     use_fast_accum=use_fast_accum)
    return fp8.scaled_matmul(a, b, scale_a, scale_b, out_dtype=out_dtype, bias=bias, use_fast_accum=use_fast_accum)


def fp8_matmul(a: Any, b: Any, *, recipe: str = "tensor", out_dtype: Any = None, bias: Any = None,
               grad_dtype: Any = None) -> Any:
    """a and b (high precision) quantized to e4m3 ("tensor"; "row": a per row, b per column;
    "block": 1x128 / 128x128), multiplied as scaled_matmul does; out_dtype defaults to a's dtype.
    Differentiable in torch and JAX: the dequantized operands' gradients in a's and b's dtypes
    (grad_dtype="float8_e5m2" quantizes the incoming gradient first). Result in a's framework."""
    grad = fp8_checks.grad_dtype("fp8_matmul", arrays.requested_dtype(grad_dtype))
    if prepare.torch_op_needed(a, b, bias):
        from xgemm.torch import fp8_ops
        return fp8_ops.fp8_matmul(a, b, recipe=recipe, out_dtype=out_dtype, bias=bias, grad_dtype=grad)
    if arrays.framework_of(a) == "jax":
        from xgemm.jax import fp8 as jax_fp8
        return jax_fp8.fp8_matmul(a, b, recipe=recipe, out_dtype=out_dtype, bias=bias, grad_dtype=grad)
    return fp8.fp8_matmul(a, b, recipe=recipe, out_dtype=out_dtype, bias=bias)


def quantize_fp8(x: Any, recipe: str = "tensor", dtype: Any = "float8_e4m3fn") -> Any:
    """(x_fp8, scale) with x ~= x_fp8 * scale, out-of-range values saturated; recipes tensor, row,
    col, block_1x128, block_128x128."""
    return fp8.quantize_fp8(x, recipe, dtype)


# ---------------------------------------------------------------------------------------------
# Softmax

def softmax(x: Any, axis: int = -1, *, out: Any = None) -> Any:
    """Numerically stable softmax along `axis` (fp32 math for fp16/bf16). Result in x's framework."""
    if out is None and not torch_native.compiling() and torch_native.active is not None:   # as in gemm()
        hit = torch_native.active.hit(_SOFTMAX, policy.forced_kernel(), axis, 0, x, None, None)
        if hit is not None:
            return hit
    if out is not None and prepare.torch_tracing(x):
        if out.dtype != x.dtype:                             # as prepare_softmax's check_out
            raise errors.DTypeError(f"softmax: out has dtype {arrays.dtype_name(out)}; use {arrays.dtype_name(x)}")
        from xgemm.torch import ops as xtorch
        return _copied_into("softmax", out, xtorch.softmax_op(x, checks.softmax_axis("softmax", x.dim(), axis)))
    key = fastpath.softmax_key(x, axis) if out is None else None
    if key is not None:                     # a signature seen before: no planning
        hit = fastpath.softmax_hit(key, x)
        if hit is not None:
            return hit
    elif out is None and prepare.torch_op_needed(x):
        from xgemm.torch import ops as xtorch
        if not xtorch.compiling():
            axis = prepare.prepare_softmax("softmax", x, axis, None, plan_only=True).problem.axis
        # inside a trace too: an axis out of range (or a float) would otherwise wrap to another axis
        return xtorch.softmax_op(x, checks.softmax_axis("softmax", x.dim(), axis))
    prep = prepare.prepare_softmax("softmax", x, axis, out)
    result = prepare.run(prep)
    if key is not None and isinstance(prep, prepare.Prepared):
        fastpath.softmax_store(key, prep)
    return result


def _copied_into(fn: str, out: Any, result: Any) -> Any:
    """out=, inside a torch.compile trace: the result copied into out (copy_ would broadcast a smaller one)."""
    if tuple(out.shape) != tuple(result.shape):
        raise errors.ShapeError(f"{fn}: out has shape {tuple(out.shape)}; the result has shape "
                                f"{tuple(result.shape)}; pass an out of that shape")
    return out.copy_(result)


# ---------------------------------------------------------------------------------------------
# explain

def explain(*arrays: Any, op: Optional[str] = None, alpha: float = 1.0, beta: Optional[float] = None,
            axis: int = -1, out: Any = None, bias: Any = None, activation: Optional[str] = None,
            use_fast_accum: bool = False, layout: str = "concat") -> policy.Plan:
    """The plan a call would run: kernel, policy, why others declined, any copy made, the epilogue.

    explain(x) -> softmax, explain(a, b) -> matmul, explain(a, b, c, alpha=, beta=) -> gemm,
    bias= / activation= as gemm() takes them; op="softmax"|"matmul"|"gemm"|"gated" overrides
    (gated takes layout= as gated() does).
    Printing the result gives a few readable lines. op="ragged_dot" | "grouped_mm" with
    (lhs, rhs, group_sizes) | (x, w, offs) returns those lines as a string (the grouped plan, and
    with activation= the epilogue),
    and so does op="scaled_matmul" with (a, b, scale_a, scale_b): where it runs, and the copies an
    FP8 kernel would need (use_fast_accum as scaled_matmul takes it).
    """
    _applies(op or {1: "softmax", 2: "matmul", 3: "gemm"}.get(len(arrays)), alpha=alpha, beta=beta, axis=axis,
             out=out, bias=bias, activation=activation, use_fast_accum=use_fast_accum, layout=layout)
    if op in ("ragged_dot", "grouped_mm") and len(arrays) == 3:
        if activation is not None:
            return compose.run_grouped(op, None, *arrays, None, activation, fn="explain", plan_only=True)
        return grouped.explain(op, *arrays)
    if op == "scaled_matmul" and len(arrays) == 4:
        return fp8.explain_scaled_matmul(*arrays, use_fast_accum=use_fast_accum)
    op = op or {1: "softmax", 2: "matmul", 3: "gemm"}.get(len(arrays))
    if op == "softmax" and len(arrays) == 1:
        return prepare.prepare_softmax("explain", arrays[0], axis, out, plan_only=True)
    if op in ("matmul", "gemm", "gated") and len(arrays) in (2, 3):
        c = arrays[2] if len(arrays) == 3 else None
        beta = (1.0 if c is not None else 0.0) if beta is None else beta
        if op == "gated":
            a, b = arrays[0], arrays[1]
            if layout != "concat":
                return _explain_stacked(a, b, bias, activation or "swiglu", layout, out)
            return compose.run("explain", a, b, None, 1.0, 0.0, bias, activation or "swiglu", True, out,
                               plan_only=True)
        if bias is not None or activation is not None:
            return compose.run("explain", arrays[0], arrays[1], c, alpha, beta, bias, activation, False, out,
                               plan_only=True)
        return prepare.prepare_gemm("explain", arrays[0], arrays[1], c, alpha, beta, out, plan_only=True)
    if op not in _EXPLAINED:
        raise errors.ShapeError(f"explain: op={op!r} is not an op it explains; use one of {', '.join(map(repr, _EXPLAINED))} "
                         f"(or leave op out: the number of arrays picks softmax, matmul or gemm)")
    raise errors.ShapeError(f"explain: got {len(arrays)} arrays with op={op!r}; pass (x) for softmax, "
                            f"(a, b) for matmul or gated, (a, b, c) for gemm, (lhs, rhs, group_sizes) for "
                            f"ragged_dot, (x, w, offs) for grouped_mm, or (a, b, scale_a, scale_b) for scaled_matmul")


_EXPLAINED = ("softmax", "matmul", "gemm", "gated", "ragged_dot", "grouped_mm", "scaled_matmul")
_GEMM_ARGS = {"alpha", "beta", "out", "bias", "activation"}
_APPLIES = {"softmax": {"axis", "out"}, "matmul": _GEMM_ARGS, "gemm": _GEMM_ARGS,
            "gated": {"bias", "activation", "out", "layout"}, "ragged_dot": {"activation"},
            "grouped_mm": {"activation"}, "scaled_matmul": {"use_fast_accum"}}
_UNSET = {"alpha": 1.0, "axis": -1, "use_fast_accum": False, "layout": "concat"}       # the rest: None


def _applies(op: Optional[str], **given: Any) -> None:
    """ShapeError for explain()'s arguments that the op does not take: its plan would drop them unsaid."""
    if op not in _APPLIES:
        return                      # explain() says what is wrong with the op itself
    extra = [name for name, v in given.items() if name not in _APPLIES[op]
             and (v is not None if name not in _UNSET else not (isinstance(v, type(_UNSET[name])) and v == _UNSET[name]))]
    if extra:
        raise errors.ShapeError(f"explain: {', '.join(extra)} given, which {op} does not take; "
                                f"{op} takes {', '.join(sorted(_APPLIES[op])) or 'none of them'}")
