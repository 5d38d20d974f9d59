"""JAX primitives for xgemm: abstract evaluation, eager impl, and lowering per platform.

One primitive per op, with static params (jax-triton's shape: one primitive, one lowering):
  xgemm_gemm     a (..., M, K), b (..., K, N) [, c broadcastable to the result]; batch dims
                 broadcast like numpy.matmul. params: alpha, beta (Python floats), out_dtype
                 (dtype name), has_c, a_major / b_major ("row" | "col": the XLA layout to ask
                 for; "col" when the operand is a transpose, so XLA makes that transpose a
                 bitcast instead of a copy), sm_margin (optional, default 0: SMs a persistent
                 kernel leaves free for a collective running alongside, see jax_sharding's
                 ring). D = alpha*(a @ b) + beta*c, accumulated in float32 (float64 for
                 float64) and cast last.
  xgemm_softmax  x; param axis (non-negative). Math in float32 (float64 for float64).
  xgemm_exchange send [, dest] -> recv: the send buffer of another device of this process (param
                 route, a jax_ffi.Route), moved by the copy engines; with param into (jax_ffi.Into)
                 received into rows of a (rows, N) result: dest updated in place (has_dest) or a
                 new one. jax_sharding's ring uses it instead of ppermute when every device is local.
  xgemm_gemm_exchange  xgemm_gemm's operands + send [+ dest] -> (d, recv): the GEMM and an
                 exchange in one custom call, the copy running beside the GEMM (gemm params +
                 route, into, has_dest).
Lowering: `cuda` -> the kernel the dispatch table picks (jax_lowering.py: the native FFI in ffi/ or
a CuTe cutlass_call); every other platform -> the embedded default, a jnp implementation (XLA's
own dot / reductions). Batching (custom_vmap), gradients (custom_vjp) and partitioning
(custom_partitioning) wrap these primitives in transforms.py / sharding.py.
"""
from __future__ import annotations

import functools
from typing import Any, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import mlir

from xgemm.core import policy
from xgemm.jax import ffi as jax_ffi
from xgemm.jax.ffi import exchange_result

gemm_p = Primitive("xgemm_gemm")
softmax_p = Primitive("xgemm_softmax")
exchange_p = Primitive("xgemm_exchange")
gemm_exchange_p = Primitive("xgemm_gemm_exchange")
gemm_exchange_p.multiple_results = True


def acc_dtype(dtype: Any) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


# ---------------------------------------------------------------------------------------------
# Abstract evaluation

def broadcast_batch(a_shape: Tuple[int, ...], b_shape: Tuple[int, ...]) -> Tuple[int, ...]:
    return tuple(jnp.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2])))


def _gemm_abstract(a, b, *c, alpha, beta, out_dtype, has_c, a_major="row", b_major="row", sm_margin=0):
    del alpha, beta, a_major, b_major
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"xgemm_gemm: a {a.shape} and b {b.shape} do not multiply")
    if len(c) != int(has_c):
        raise ValueError("xgemm_gemm: has_c does not match the operands")
    out_shape = broadcast_batch(a.shape, b.shape) + (a.shape[-2], b.shape[-1])
    if c and tuple(jnp.broadcast_shapes(c[0].shape, out_shape)) != out_shape:
        raise ValueError(f"xgemm_gemm: c {c[0].shape} does not broadcast to {out_shape}")
    return jax.core.ShapedArray(out_shape, np.dtype(out_dtype))


def _softmax_abstract(x, *, axis):
    if not 0 <= axis < x.ndim:
        raise ValueError(f"xgemm_softmax: axis {axis} out of range for {x.shape}")
    return jax.core.ShapedArray(x.shape, x.dtype)


def _exchange_abstract(send, *dest, route, into=None, has_dest=False):
    del route
    shape = exchange_result(send.shape, into)
    if len(dest) != int(has_dest) or (dest and (dest[0].shape != shape or dest[0].dtype != send.dtype)):
        raise ValueError(f"xgemm_exchange: dest must be one {shape} {send.dtype} array when has_dest")
    return jax.core.ShapedArray(shape, send.dtype)


def split_exchange_operands(args, has_dest: bool):
    """(gemm operands, send, dest list) of xgemm_gemm_exchange's operands."""
    n = 1 + int(has_dest)
    return args[:-n], args[-n], list(args[len(args) - n + 1:])


def _gemm_exchange_abstract(*args, route, into=None, has_dest=False, **params):
    gemm_args, send, dest = split_exchange_operands(args, has_dest)
    return [_gemm_abstract(*gemm_args, **params),
            _exchange_abstract(send, *dest, route=route, into=into, has_dest=has_dest)]


gemm_p.def_abstract_eval(_gemm_abstract)
softmax_p.def_abstract_eval(_softmax_abstract)
exchange_p.def_abstract_eval(_exchange_abstract)
gemm_exchange_p.def_abstract_eval(_gemm_exchange_abstract)


# ---------------------------------------------------------------------------------------------
# Eager: a bind outside any trace runs a cached jit of that one bind (the same lowering as in jit)

@functools.lru_cache(maxsize=None)
def _jitted(prim: Primitive, params: Tuple[Tuple[str, Any], ...]):
    kw = dict(params)
    return jax.jit(lambda *args: prim.bind(*args, **kw))


def _impl(prim: Primitive):
    def impl(*args, **params):
        return _jitted(prim, tuple(sorted(params.items())))(*args)
    return impl


for _p in (gemm_p, softmax_p):
    _p.def_impl(_impl(_p))


# ---------------------------------------------------------------------------------------------
# The embedded default (every platform but cuda, and cuda problems no kernel takes)

def reference_gemm(a, b, c=None, *, alpha: float, beta: float, out_dtype: Any, widen: bool = False):
    """widen: fp16/bf16 operands go to fp32 before the dot (exact). XLA:CPU's dot refuses some
    batched bf16 x bf16 -> f32 products ("Unsupported element type for DotThunk", jax 0.10 with
    x64 on; found by benchmarks/fuzz.py), so the non-CUDA lowering widens; on CUDA it would cost
    the operands' traffic twice."""
    acc = acc_dtype(a.dtype)
    if widen and a.dtype != acc:
        a, b = a.astype(acc), b.astype(acc)
    d = jnp.matmul(a, b, precision=lax.Precision.HIGHEST, preferred_element_type=acc)
    if alpha != 1.0:
        d = d * jnp.asarray(alpha, acc)
    if c is not None:
        d = d + jnp.asarray(beta, acc) * c.astype(acc)
    return d.astype(out_dtype)


def reference_softmax(x, *, axis: int):
    if x.size == 0:
        return x
    acc = acc_dtype(x.dtype)
    x32 = x.astype(acc)
    e = jnp.exp(x32 - jnp.max(x32, axis=axis, keepdims=True))
    return (e / jnp.sum(e, axis=axis, keepdims=True)).astype(x.dtype)


def forced_only_reference(ctx, op: str) -> None:
    """In a reference lowering rule (XLA's own op): a forced kernel other than the reference raises,
    naming the platforms lowered for (policy.forced_only_reference)."""
    policy.forced_only_reference(op, "/".join(ctx.module_context.platforms))


def _gemm_reference_rule(ctx, a, b, *c, alpha, beta, out_dtype, has_c, a_major="row", b_major="row", sm_margin=0):
    forced_only_reference(ctx, "gemm")
    fn = lambda a, b, *c: reference_gemm(a, b, c[0] if c else None, alpha=alpha, beta=beta, out_dtype=out_dtype,
                                         widen=True)
    return mlir.lower_fun(fn, multiple_results=False)(ctx, a, b, *c)


def _softmax_reference_rule(ctx, x, *, axis):
    forced_only_reference(ctx, "softmax")
    return mlir.lower_fun(functools.partial(reference_softmax, axis=axis), multiple_results=False)(ctx, x)


mlir.register_lowering(gemm_p, _gemm_reference_rule)
mlir.register_lowering(softmax_p, _softmax_reference_rule)


# The exchange has no embedded default: jax_sharding uses it only where it runs (CUDA devices of
# this process, or XLA:CPU fake devices once a test registered the host variant).
def _exchange_cpu_rule(ctx, send, *dest, route, into=None, has_dest=False):

    def fn(x, *d):
        return jax_ffi.call_exchange(route, x, into=into, dest=d[0] if d else None, platform="cpu")[0]
    return mlir.lower_fun(fn, multiple_results=False)(ctx, send, *dest)


def _gemm_exchange_cpu_rule(ctx, *args, route, into=None, has_dest=False, alpha, beta, out_dtype, has_c,
                            a_major="row", b_major="row", sm_margin=0):

    def fn(*args):
        (a, b, *c), send, dest = split_exchange_operands(args, has_dest)
        d = reference_gemm(a, b, c[0] if c else None, alpha=alpha, beta=beta, out_dtype=out_dtype, widen=True)
        return [d, jax_ffi.call_exchange(route, send, into=into, dest=dest[0] if dest else None,
                                         platform="cpu")[0]]
    return mlir.lower_fun(fn, multiple_results=True)(ctx, *args)


mlir.register_lowering(exchange_p, _exchange_cpu_rule, platform="cpu")
mlir.register_lowering(gemm_exchange_p, _gemm_exchange_cpu_rule, platform="cpu")
