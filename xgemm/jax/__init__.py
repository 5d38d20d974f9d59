"""xgemm for JAX: gemm / matmul / softmax as primitives that work eagerly and inside jax.jit.

    import xgemm.jax as xj
    d = xj.gemm(a, b, c, alpha=2.0, beta=1.0)          # D = alpha*A@B + beta*C
    y = jax.jit(lambda x: xj.softmax(x, axis=-1))(x)   # an XLA custom call on the GPU
    jax.grad, jax.vmap (nested), sharded jit (NamedSharding) and jax.export all work.

xgemm.matmul/gemm/softmax route JAX arrays and tracers here; both check arguments with
core/checks.py. On `cuda` the primitives lower to the kernel the dispatch table picks (lowering.py,
through the kernel's jax_lowering hook) as an XLA custom call of the
native handler in ffi/: Gluon cubins are launched directly (xgemm_cubin_launch_v1), CuTe kernels
are called through their TVM-FFI function (xgemm_tvm_ffi_call_v1); on other platforms they lower
to XLA's own ops (the embedded default). Eager arrays run the same primitives through a cached jit.

Files: primitives.py (primitives, abstract eval, the embedded default), lowering.py (the cuda
lowering), ffi.py (the native handler in ffi/), sharding.py (custom_partitioning), transforms.py
(custom_vmap, custom_vjp), testing.py (a fake GPU for CPU tests).
Exports of cuda lowerings need `disabled_checks=xgemm.jax.export_disabled_safety_checks()`; they
use only the portable cubin target (CuTe problems export as XLA's op), and a process that runs a
deserialized export on a GPU calls `xgemm.jax.register_ffi()` first.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from xgemm import arrays
from xgemm.jax import inputs
from xgemm.core import checks, epilogues, policy
from xgemm.core.problem import Device
from xgemm.jax import ffi as jax_ffi
from xgemm.jax import lowering  # noqa: F401  (registers the cuda lowerings of the primitives)
from xgemm.jax.lowering import gemm_shapes, padded_shapes, softmax_problem, target_device
from xgemm.jax.fp8 import fp8_matmul, quantize_fp8, scaled_matmul
from xgemm.jax.grouped import grouped_mm, ragged_dot, ragged_dot_expert_parallel
from xgemm.jax.transforms import GemmConfig
from xgemm.jax.transforms import gemm as _gemm_op
from xgemm.jax.transforms import softmax as _softmax_op


def _scalar(fn: str, name: str, v: Any) -> float:
    return checks.scalar(fn, name, v, traced=inputs.is_tracer(v))


def _checked_gemm(fn: str, a: Any, b: Any, c: Any, alpha: Any, beta: Any, out_dtype: Any):
    """gemm()'s arguments as JAX arrays and floats, checked by core/checks.py as the eager path
    checks them: (a, b, c or None when beta == 0, alpha, beta, out dtype name, GemmShape)."""
    a, b = inputs.as_jax(fn, "a", a), inputs.as_jax(fn, "b", b)
    alpha, beta = _scalar(fn, "alpha", alpha), _scalar(fn, "beta", beta)
    has_c = c is not None
    c = inputs.as_jax(fn, "c", c) if has_c and beta != 0.0 else None
    dt = checks.gemm_dtypes(fn, np.dtype(a.dtype).name, np.dtype(b.dtype).name,
                            np.dtype(c.dtype).name if c is not None else None)
    out = checks.out_dtype(fn, dt, arrays.requested_dtype(out_dtype))
    shape = checks.gemm_shape(fn, a.shape, b.shape, c.shape if c is not None else None,
                              beta, has_c)
    return a, b, c, alpha, beta, out, shape


def _checked_softmax(fn: str, x: Any, axis: Any):
    """softmax()'s x as a JAX array and its axis normalized, checked as the eager path checks them."""
    x = inputs.as_jax(fn, "x", x)
    if x.ndim:
        checks.dtype(fn, "x", np.dtype(x.dtype).name)
    return x, checks.softmax_axis(fn, x.ndim, axis)


# ---------------------------------------------------------------------------------------------
# GEMM

def gemm(a: Any, b: Any, c: Any = None, *, alpha: float = 1.0, beta: float = 0.0,
         out_dtype: Any = None, bias: Any = None, activation: Optional[str] = None, fn: str = "gemm") -> jax.Array:
    """D = act(alpha * a @ b + beta * c + bias) with numpy.matmul semantics (1-D operands, batch
    broadcasting).

    float32 / float16 / bfloat16 / float64; a and b of one dtype; fp32 accumulation (fp64 for
    fp64), alpha/beta (and the epilogue: bias, a vector of N values, then activation, one of
    core/epilogues.ACTIVATIONS) applied in that type, then the cast to out_dtype (a.dtype by
    default; float32 is also allowed for fp16/bf16). beta == 0 never reads c.
    """
    if bias is not None or activation is not None:
        return _with_epilogue(fn, a, b, c, alpha, beta, out_dtype, bias, activation, False)
    a, b, c, alpha, beta, out, shape = _checked_gemm(fn, a, b, c, alpha, beta, out_dtype)
    a_vec, b_vec = shape.a_vec, shape.b_vec
    a2 = a[None, :] if a_vec else a
    b2 = b[:, None] if b_vec else b
    c2 = c                                  # None when beta == 0: c is never read (its NaNs cannot leak)
    if c is not None:
        if c.ndim >= 1 and (a_vec or b_vec):   # back to the promoted (..., M, N) form
            c2 = c[..., None, :] if a_vec and not b_vec else c[..., None] if b_vec and not a_vec else c[..., None, None]
    cfg = GemmConfig(alpha=alpha, beta=beta, out_dtype=out)
    if any(inputs.is_tracer(x) for x in (a2, b2, c2) if x is not None):
        d = _gemm_op(a2, b2, c2, cfg)
    else:
        d = _eager_gemm(cfg, c2 is not None)(a2, b2, *(() if c2 is None else (c2,)))
    if b_vec:
        d = d[..., 0]
    if a_vec:
        d = d[..., 0, :] if not b_vec else d[..., 0]
    return d


def matmul(a: Any, b: Any, *, out_dtype: Any = None) -> jax.Array:
    """a @ b with numpy.matmul semantics; out_dtype as gemm takes it (float32 for fp16/bf16 operands)."""
    return gemm(a, b, out_dtype=out_dtype)


def gated(a: Any, b: Any, *, bias: Any = None, activation: str = "swiglu", out_dtype: Any = None,
          layout: str = "concat", fn: str = "gated") -> jax.Array:
    """act(gate) * up of [gate | up] = a @ b + bias (b's first N/2 columns the gate projection);
    activation swiglu, geglu or reglu (xgemm.gated says more). layout="stacked": b [..., K, 2, H],
    bias (2, H), run as two products (a @ b[..., 0, :] and a @ b[..., 1, :]), so that b sharded
    along H keeps each device's gate and up columns together: no collective (a [gate | up] b
    sharded along its columns puts the gate on some devices and the up on others)."""
    if layout == "concat":
        return _with_epilogue(fn, a, b, None, 1.0, 0.0, out_dtype, bias, activation, True)
    b, bias = inputs.as_jax(fn, "b", b), None if bias is None else inputs.as_jax(fn, "bias", bias)
    checks.gated_layout(fn, layout, b.shape, None if bias is None else bias.shape, tuple(getattr(a, "shape", ())))
    checks.activation(fn, activation, True)
    a, _, _, _, _, out, _ = _checked_gemm(fn, a, b[..., 0, :], None, 1.0, 0.0, out_dtype)
    acc = "float64" if a.dtype == jnp.float64 else "float32"
    gate, up = (_with_epilogue(fn, a, b[..., i, :], None, 1.0, 0.0, acc, None if bias is None else bias[i], None, False)
                for i in (0, 1))
    return (epilogues.apply(jnp, gate, epilogues.GATED[activation]) * up).astype(out)


def _checked_epilogue(fn, a, b, c, alpha, beta, out_dtype, bias, activation, gated):
    checks.activation(fn, activation, gated)
    a, b, c, alpha, beta, out, shape = _checked_gemm(fn, a, b, c, alpha, beta, out_dtype)
    if bias is not None:
        bias = inputs.as_jax(fn, "bias", bias)
    checks.epilogue_shape(fn, shape, gated, np.dtype(bias.dtype).name if bias is not None else None,
                          bias.shape if bias is not None else None, np.dtype(a.dtype).name)
    acc = "float64" if a.dtype == jnp.float64 else "float32"
    return a, b, c, alpha, beta, out, bias, acc


def _with_epilogue(fn, a, b, c, alpha, beta, out_dtype, bias, activation, gated):
    """The product through xgemm's primitive in the accumulator type, the epilogue in jnp ops
    (core/epilogues.py), one cast: jax.grad, vmap, jit and sharding see ordinary ops around it."""
    a, b, c, alpha, beta, out, bias, acc = _checked_epilogue(fn, a, b, c, alpha, beta, out_dtype, bias,
                                                             activation, gated)
    pre = gemm(a, b, c, alpha=alpha, beta=beta, out_dtype=acc, fn=fn)
    if bias is not None:
        pre = pre + bias.astype(acc)
    y = epilogues.gate(jnp, pre, activation) if gated else epilogues.apply(jnp, pre, activation)
    return y.astype(out)


def explain_epilogue(a: Any, b: Any, c: Any = None, *, alpha: float = 1.0, beta: float = 0.0, bias: Any = None,
                     activation: Optional[str] = None, gated: bool = False, out_dtype: Any = None,
                     fn: str = "explain") -> policy.Plan:
    """The plan of gemm(..., bias=, activation=) or gated(...): the product's, with its epilogue line."""
    a, b, c, alpha, beta, out, bias, acc = _checked_epilogue(fn, a, b, c, alpha, beta, out_dtype, bias,
                                                             activation, gated)
    plan = explain_gemm(a, b, c, alpha=alpha, beta=beta, out_dtype=acc, fn=fn)
    plan.epilogue = epilogues.describe(bias is not None, activation, gated, acc, "jax")
    return plan


@functools.lru_cache(maxsize=None)
def _eager_gemm(cfg: GemmConfig, has_c: bool):
    if has_c:
        return jax.jit(lambda a, b, c: _gemm_op(a, b, c, cfg))
    return jax.jit(lambda a, b: _gemm_op(a, b, None, cfg))


# ---------------------------------------------------------------------------------------------
# Softmax

def softmax(x: Any, axis: int = -1, *, fn: str = "softmax") -> jax.Array:
    """Numerically stable softmax along `axis`, same dtype as x (fp32 math; fp64 for fp64).
    Rows of all -inf give NaN, like jax.nn.softmax."""
    x, axis = _checked_softmax(fn, x, axis)
    if inputs.is_tracer(x):
        return _softmax_op(x, axis)
    return _eager_softmax(axis)(x)


@functools.lru_cache(maxsize=None)
def _eager_softmax(axis: int):
    return jax.jit(lambda x: _softmax_op(x, axis))


# ---------------------------------------------------------------------------------------------
# explain(): the plan the lowering would make for these operands

def _device_of(x: Any):
    if inputs.is_tracer(x):
        platform = jax.default_backend()
    else:
        platform = next(iter(x.devices())).platform
    return target_device() if platform in ("gpu", "cuda") else Device("cpu", 0)


def explain_gemm(a: Any, b: Any, c: Any = None, *, alpha: float = 1.0, beta: float = 0.0,
                 out_dtype: Any = None, fn: str = "explain") -> policy.Plan:
    """The plan jax.jit's lowering would make for gemm(a, b, c, ...) (checked as gemm() checks it)."""
    a, b, c_used, alpha, beta, out, _ = _checked_gemm(fn, a, b, c, alpha, beta, out_dtype)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    gs = gemm_shapes(a2.shape, a.dtype, b2.shape, None if c_used is None else c_used.shape,
                     None if c_used is None else c_used.dtype, alpha=alpha, beta=beta, out_dtype=out,
                     device=_device_of(a))
    plan = policy.choose("gemm", gs.problem)
    if plan.kernel.name == "reference":          # rows that are not 16-byte multiples: jit pads them
        padded = padded_shapes(gs, a2.shape, a.dtype, b2.shape, None if c_used is None else c_used.shape,
                               None if c_used is None else c_used.dtype, out)
        if padded is not None:
            gp, kp, np_ = padded
            n = b2.shape[-1]
            copies = [f"a, b: zero-padded by XLA to K={kp}" + (f", N={np_}" if np_ != n else "")
                      + " (16-byte-aligned rows)"]
            if np_ != n:
                copies.append(f"out: the first {n} of {np_} columns (a slice)")
            plan = policy.choose("gemm", gp.problem).padded_from(plan, copies)
    if gs.fold_m and gs.problem.device.kind == "cuda":
        plan.policy = dataclasses.replace(plan.policy, notes=plan.policy.notes + (
            f"batch {gs.batch} folded into M (B has no batch dims)",))
    return plan


def explain_softmax(x: Any, axis: int = -1, *, fn: str = "explain") -> policy.Plan:
    """The plan jax.jit's lowering would make for softmax(x, axis) (checked as softmax() checks it)."""
    x, axis = _checked_softmax(fn, x, axis)
    return policy.choose("softmax", softmax_problem(x.shape, x.dtype, axis, device=_device_of(x)))


# ---------------------------------------------------------------------------------------------
# Export and registration

CUSTOM_CALL_TARGETS: Tuple[str, ...] = (jax_ffi.TARGET,)


def export_disabled_safety_checks(include_cutlass: Optional[bool] = None) -> Tuple[Any, ...]:
    """The `disabled_checks` for jax.export.export of functions calling xgemm on cuda.

    Our FFI target, plus CuTe's cutlass_call targets when cutlass is installed (or
    include_cutlass=True). Pass as jax.export.export(jax.jit(f), disabled_checks=...).
    """
    from jax.export import DisabledSafetyCheck
    disabled = [DisabledSafetyCheck.custom_call(t) for t in CUSTOM_CALL_TARGETS]
    if include_cutlass is None:
        import importlib.util
        include_cutlass = importlib.util.find_spec("cutlass") is not None
    if include_cutlass:
        try:
            import cutlass.jax as cjax
            disabled.extend(cjax.get_export_disabled_safety_checks())
        except Exception:          # cutlass without its JAX extension: nothing of it to allow
            pass
    return tuple(disabled)


def register_ffi() -> None:
    """Build (once, cached) and register the native FFI target with XLA's CUDA platform."""
    jax_ffi.register()


__all__ = ["gemm", "matmul", "gated", "softmax", "ragged_dot", "grouped_mm", "ragged_dot_expert_parallel",
           "scaled_matmul", "fp8_matmul", "quantize_fp8",
           "explain_gemm", "explain_softmax", "explain_epilogue", "export_disabled_safety_checks",
           "register_ffi", "CUSTOM_CALL_TARGETS"]
