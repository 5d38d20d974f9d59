"""FP8 GEMM in JAX: scaled_matmul and fp8_matmul with their custom_vjps, and quantize_fp8; all work eagerly and in
jax.jit, jax.vmap and jax.export (xgemm/fp8.py's docstring has the recipes and the scale convention:
dequantized = fp8 value * scale).

Gradients (custom_vjp). The forward is out = a_deq @ b_deq + bias with a_deq = a * scale_a,
b_deq = b * scale_b. The fp8 operands a and b receive the gradients of the DEQUANTIZED operands:
    grad a := d loss / d a_deq = dy @ b_deq^T        grad b := d loss / d b_deq = a_deq^T @ dy
(not d/da, which would carry an extra factor scale_a): the straight-through convention of FP8
training, where a_deq stands for the high-precision tensor a was quantized from. They are float32
products cast to out_dtype (bfloat16 by default; float32 when out_dtype is float32), not fp8.
bias gets sum(dy) over rows in its dtype; a scale gets its exact gradient, the sum of
(grad a) * a over the block it scales (the same for b).
grad_dtype="float8_e5m2": dy is first quantized row-wise to e5m2 (one scale per row of dy, as
quantize_fp8(dy, "row", "float8_e5m2")) and dequantized, then the same two products run: what an
FP8 kernel's dgrad / wgrad would compute. Forward mode (jvp) is not defined, as for xgemm.jax.gemm.

The forward is one primitive, xgemm_scaled_matmul (a, b, scales[, bias]). Its cuda lowering plans
an FP8 GemmProblem for float32 accumulation (GemmProblem.float32_accumulation), as eager calls do,
and calls cute_gemm_sm90's promoting FP8 class (tensor- and row-wise scales as M / N vectors,
block-wise ones as they are; b asked for column-major, the K-major layout FP8 wgmma reads, so XLA
transposes it, as its own FP8 dot does); elsewhere the embedded default: dequantize and XLA's dot
in float32.
The backward products are XLA's dot in float32; vmap of the forward runs the embedded default.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap
from jax.extend.core import Primitive
from jax.interpreters import mlir

from xgemm import arrays
from xgemm.core import fp8_checks, layout, policy
from xgemm.core.problem import COL, ROW, Epilogue, GemmProblem, Operand
from xgemm.jax import ffi as jax_ffi
from xgemm.jax import inputs, lowering, primitives
from xgemm.runtime.calls import TvmFfiCall

_PRECISION = jax.lax.Precision.HIGHEST          # float32 products in float32 on GPUs too (no TF32)


class Fp8Config(NamedTuple):
    out: str
    a_block: Tuple[int, int]
    b_block: Tuple[int, int]
    grad_dtype: Optional[str]


def _checked(fn, a, b, scale_a, scale_b, bias, out_dtype):
    a, b, sa, sb = (inputs.as_jax(fn, n, x) for n, x in zip(("a", "b", "scale_a", "scale_b"), (a, b, scale_a, scale_b)))
    fp8_checks.fp8_dtype(fn, "a", arrays.requested_dtype(a.dtype))
    fp8_checks.fp8_dtype(fn, "b", arrays.requested_dtype(b.dtype))
    fp8_checks.scale_dtype(fn, "scale_a", arrays.requested_dtype(sa.dtype))
    fp8_checks.scale_dtype(fn, "scale_b", arrays.requested_dtype(sb.dtype))
    recipe = fp8_checks.matmul_recipe(fn, a.shape, b.shape, sa.shape, sb.shape)
    if bias is not None:
        bias = inputs.as_jax(fn, "bias", bias)
        fp8_checks.bias(fn, arrays.requested_dtype(bias.dtype), bias.shape, recipe.n)
    return a, b, sa, sb, bias, fp8_checks.out_dtype(fn, arrays.requested_dtype(out_dtype)), recipe


def scaled_matmul(a: Any, b: Any, scale_a: Any, scale_b: Any, *, out_dtype: Any = jnp.bfloat16, bias: Any = None,
                  grad_dtype: Optional[str] = None, fn: str = "scaled_matmul") -> jax.Array:
    """(a * scale_a) @ (b * scale_b) + bias in float32, cast to out_dtype; a [M, K], b [K, N] fp8;
    the recipe from the scales' shapes. Gradients: the module docstring."""
    a, b, sa, sb, bias, out, recipe = _checked(fn, a, b, scale_a, scale_b, bias, out_dtype)
    cfg = Fp8Config(out, recipe.a_block, recipe.b_block, fp8_checks.grad_dtype(fn, grad_dtype))
    return _jit_scaled_matmul(a, b, sa, sb, bias, cfg)


def fp8_matmul(a: Any, b: Any, *, recipe: str = "tensor", out_dtype: Any = None, bias: Any = None,
               grad_dtype: Optional[str] = None, fn: str = "fp8_matmul") -> jax.Array:
    """a and b (high precision) quantized to e4m3 with the recipe's blocks ("tensor", "row",
    "block"), multiplied as scaled_matmul does; out_dtype defaults to a's dtype. Differentiable:
    the gradients of the dequantized operands, in a's and b's dtypes (xgemm/fp8.py's docstring)."""
    a, b = inputs.as_jax(fn, "a", a), inputs.as_jax(fn, "b", b)
    plan = fp8_checks.fp8_matmul_plan(fn, recipe, a.shape, b.shape)
    a_dt, b_dt = arrays.requested_dtype(a.dtype), arrays.requested_dtype(b.dtype)
    out = fp8_checks.fp8_matmul_dtypes(fn, a_dt, b_dt, arrays.requested_dtype(out_dtype))
    if bias is not None:
        bias = inputs.as_jax(fn, "bias", bias)
        fp8_checks.bias(fn, arrays.requested_dtype(bias.dtype), bias.shape, plan.matmul.n)
    cfg = Fp8MatmulConfig(plan, out, a_dt, b_dt, fp8_checks.grad_dtype(fn, grad_dtype))
    return _jit_fp8_matmul(a, b, bias, cfg)


def quantize_fp8(x: Any, recipe: str = "tensor", dtype: Any = jnp.float8_e4m3fn, *, fn: str = "quantize_fp8"):
    """(x_fp8, scale), x ~= x_fp8 * scale (float32 scale); recipes and saturation as xgemm.quantize_fp8.
    No gradient is defined through it (a cast)."""
    x = inputs.as_jax(fn, "x", x)
    dt = fp8_checks.fp8_dtype(fn, "dtype", arrays.requested_dtype(dtype))
    fp8_checks.quantize_block(fn, recipe, x.shape)
    fp8_checks.quantize_source(fn, arrays.requested_dtype(x.dtype))
    return _jit_quantize(x, recipe, dt)


def explain_scaled_matmul(a: Any, b: Any, scale_a: Any, scale_b: Any, *, fn: str = "explain") -> str:
    """The plan text: JAX arrays are row-major, so a is K-major and b would need a transposing copy."""
    _, _, _, _, _, _, recipe = _checked(fn, a, b, scale_a, scale_b, None, None)
    return fp8_checks.kernel_needs(recipe, True, recipe.n <= 1 or recipe.k <= 1)


# ---------------------------------------------------------------------------------------------

def _quantize(x, recipe: str, dt: str):
    block, scales = fp8_checks.quantize_block("quantize_fp8", recipe, x.shape)
    return fp8_checks.quantize(jnp, x, block, scales, jnp.dtype(dt), fp8_checks.FP8_MAX[dt], jnp.float32)


def _dequantized(a, b, sa, sb, cfg: Fp8Config):
    return (fp8_checks.dequantize(jnp, a, sa, cfg.a_block, jnp.float32),
            fp8_checks.dequantize(jnp, b, sb, cfg.b_block, jnp.float32))


def _product(x, y):
    return jnp.matmul(x, y, precision=_PRECISION, preferred_element_type=jnp.float32)


def _reference(a, b, sa, sb, bias, cfg: Fp8Config):
    """The embedded default: dequantize, XLA's dot in float32, the bias, one cast."""
    a_deq, b_deq = _dequantized(a, b, sa, sb, cfg)
    y = _product(a_deq, b_deq)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(cfg.out)


# ---------------------------------------------------------------------------------------------
# The forward primitive: operands a, b, sa, sb[, bias]; params cfg (an Fp8Config, hashable)

scaled_p = Primitive("xgemm_scaled_matmul")


def _split(args):
    return args[:4] + ((args[4] if len(args) > 4 else None),)


def _scaled_abstract(a, b, sa, sb, *bias, cfg):
    return jax.core.ShapedArray((a.shape[0], b.shape[1]), jnp.dtype(cfg.out))


def _scaled_cuda(*args, cfg, portable):
    """cute_gemm_sm90's promoting FP8 class on (a, b asked K-major, bias, the scales: tensor- and
    row-wise ones as M / N vectors, block-wise ones as they are), or the embedded default."""
    a, b, sa, sb, bias = _split(args)
    (m, k), n = a.shape, b.shape[1]
    if 0 in (m, n, k):
        return _reference(*_split(args), cfg)
    # the recipe from the scales' shapes (blocks alone are ambiguous where K or N is one block)
    if fp8_checks.matmul_recipe("scaled_matmul", a.shape, b.shape, sa.shape, sb.shape).name == "block":
        # the layouts the kernel loads (fp8_checks.kernel_block_scales): sa's rows padded to its
        # stride and asked column-major, sb's columns padded to its row stride
        want_a, want_b = fp8_checks.kernel_block_scales(m, k, n)
        scale_ops = tuple(Operand(*want, "float32", major, 16) for want, major in ((want_a, COL), (want_b, ROW)))
        scale_args = [jnp.pad(sa.astype(jnp.float32), ((0, want_a[1][1] - m), (0, 0))),
                      jnp.pad(sb.astype(jnp.float32), ((0, 0), (0, want_b[1][0] - sb.shape[1])))]
        scale_layouts = [lowering.col_layout(2), None]
    else:
        # tensor-wise scales as vectors of one value (the kernel clamps its indices), row-wise of M / N
        scale_args = [x.reshape(-1).astype(jnp.float32) for x in (sa, sb)]
        scale_ops = tuple(Operand(x.shape, (1,), "float32", ROW, 16) for x in scale_args)
        scale_layouts = [None, None]
    problem = GemmProblem(
        m=m, n=n, k=k, batch=(), c=None, framework="jax", device=lowering.target_device(),
        a=layout.dense_operand((m, k), jnp.dtype(a.dtype).name, 1, ROW),
        b=layout.dense_operand((k, n), jnp.dtype(b.dtype).name, 1, COL),
        epilogue=Epilogue(out_dtype=cfg.out),
        bias=Operand((n,), (1,), jnp.dtype(bias.dtype).name, ROW, 16) if bias is not None else None,
        scales=scale_ops, float32_accumulation=True)
    # None also where the FP8 class could not be built (policy.built_or_none): XLA's dot
    made = policy.built_or_none(lambda: policy.attempt(policy.choose("gemm", problem), lambda plan: (
        plan.kernel.jax_lowering(problem, plan.policy, portable=portable)
        if fp8_checks.PROMOTE_NOTE in plan.policy.notes else None))[1])
    if not isinstance(made, TvmFfiCall):
        return _reference(*_split(args), cfg)
    lowering.ensure_registered()
    operands = [a, b] + ([bias] if bias is not None else []) + scale_args
    layouts = [None, lowering.col_layout(2)] + ([None] if bias is not None else []) + scale_layouts
    (y,) = jax_ffi.call_tvm_ffi(made, operands, [jax.ShapeDtypeStruct((m, n), jnp.dtype(cfg.out))],
                                in_layouts=layouts)
    return y


def _scaled_cuda_rule(ctx, *args, cfg):
    fn = functools.partial(_scaled_cuda, cfg=cfg, portable=lowering.for_export(ctx))
    return mlir.lower_fun(fn, multiple_results=False)(ctx, *args)


scaled_p.def_abstract_eval(_scaled_abstract)
scaled_p.def_impl(lambda *args, cfg: jax.jit(functools.partial(scaled_p.bind, cfg=cfg))(*args))
def _scaled_reference_rule(ctx, *args, cfg):
    primitives.forced_only_reference(ctx, "gemm")
    return mlir.lower_fun(lambda *xs: _reference(*_split(xs), cfg), multiple_results=False)(ctx, *args)


mlir.register_lowering(scaled_p, _scaled_reference_rule)
mlir.register_lowering(scaled_p, _scaled_cuda_rule, platform="cuda")


@functools.lru_cache(maxsize=None)
def _forward(cfg: Fp8Config, has_bias: bool):
    """The primitive's bind, with a vmap rule: a batch runs the embedded default, vmapped."""
    @custom_vmap
    def forward(*args):
        return scaled_p.bind(*args, cfg=cfg)

    @forward.def_vmap
    def forward_batched(axis_size, in_batched, *args):
        args = [x if batched else jnp.broadcast_to(x, (axis_size,) + x.shape) for x, batched in zip(args, in_batched)]
        return jax.vmap(lambda *xs: _reference(*_split(xs), cfg))(*args), True
    return forward


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _scaled_matmul(a, b, sa, sb, bias, cfg: Fp8Config):
    return _forward(cfg, bias is not None)(a, b, sa, sb, *([bias] if bias is not None else []))


def _fwd(a, b, sa, sb, bias, cfg):
    return _scaled_matmul(a, b, sa, sb, bias, cfg), (a, b, sa, sb, bias)


def _grads(dy, a_deq, b_deq, grad_dtype):
    """float32 (da, db, dbias): fp8_checks.straight_through in float32 products."""
    e5m2 = None if grad_dtype is None else jnp.dtype(grad_dtype)
    return fp8_checks.straight_through(jnp, dy, a_deq, b_deq, e5m2, jnp.float32, matmul=_product)


def _bwd(cfg, res, dy):
    a, b, sa, sb, bias = res
    da, db, dsum = _grads(dy, *_dequantized(a, b, sa, sb, cfg), cfg.grad_dtype)
    dbias = None if bias is None else dsum.astype(bias.dtype)
    # the scales' gradients are exact: a_deq = a * broadcast(scale_a), so d/d scale_a sums da * a
    # over each scale's block (the broadcast's transpose, as jax.vjp of the dequantize gives it)
    dsa = jax.vjp(lambda s: fp8_checks.dequantize(jnp, a, s, cfg.a_block, jnp.float32), sa)[1](da)[0]
    dsb = jax.vjp(lambda s: fp8_checks.dequantize(jnp, b, s, cfg.b_block, jnp.float32), sb)[1](db)[0]
    return da.astype(cfg.out), db.astype(cfg.out), dsa.astype(sa.dtype), dsb.astype(sb.dtype), dbias


_scaled_matmul.defvjp(_fwd, _bwd)


class Fp8MatmulConfig(NamedTuple):
    plan: fp8_checks.Fp8MatmulPlan
    out: str
    a_dtype: str
    b_dtype: str
    grad_dtype: Optional[str]

    @property
    def inner(self) -> Fp8Config:
        """The scaled_matmul of the quantized operands (no gradients of its own: _fp8_bwd's)."""
        return Fp8Config(self.out, self.plan.matmul.a_block, self.plan.matmul.b_block, None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fp8_matmul(a, b, bias, cfg: Fp8MatmulConfig):
    return _fp8_fwd(a, b, bias, cfg)[0]


def _fp8_fwd(a, b, bias, cfg):
    (a8, sa), (b8, sb) = _quantize(a, cfg.plan.a_recipe, "float8_e4m3fn"), _quantize(b, cfg.plan.b_recipe, "float8_e4m3fn")
    # the fp8 operands are the residuals, not a and b
    return _scaled_matmul(a8, b8, sa, sb, bias, cfg.inner), (a8, b8, sa, sb, bias)


def _fp8_bwd(cfg, res, dy):
    a8, b8, sa, sb, bias = res
    da, db, dsum = _grads(dy, *_dequantized(a8, b8, sa, sb, cfg.inner), cfg.grad_dtype)
    return da.astype(cfg.a_dtype), db.astype(cfg.b_dtype), None if bias is None else dsum.astype(bias.dtype)


_fp8_matmul.defvjp(_fp8_fwd, _fp8_bwd)

# eager arrays run one compiled call; inside a trace the jit is inlined
_jit_scaled_matmul = jax.jit(_scaled_matmul, static_argnums=5)
_jit_quantize = jax.jit(_quantize, static_argnums=(1, 2))
_jit_fp8_matmul = jax.jit(_fp8_matmul, static_argnums=3)
