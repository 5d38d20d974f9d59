"""vmap and grad for xgemm's JAX ops, around the partitionable primitives of sharding.py.

Layers, outermost first: custom_vjp (gradients, computed by xgemm itself) -> custom_vmap (the
vmapped dim joins the operands' batch dims: one batched call, never a loop) -> custom_partitioning
(sharded jit) -> the primitive (primitives.py). Nested vmap re-enters the custom_vmap rule.

GEMM gradients for D = alpha*A@B + beta*C (batch dims broadcast):
  dA = alpha * dD @ B^T   (summed over the batch dims A was broadcast along)
  dB = alpha * A^T @ dD   (when B has no batch dims: one GEMM over the folded batch, A^T (K, L*M))
  dC = beta * dD          (summed to C's shape)
The transposed operands go in as swapaxes views with a "col" layout hint, so XLA hands the kernel
the original buffer (a bitcast), not a transposed copy. Cotangents are cast to the operands'
dtype. Softmax: dx = y * (dy - sum(dy * y)) along the axis, in float32 (float64 for float64).
Forward-mode (jvp) is not defined: custom_vjp functions support reverse mode only.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from xgemm.jax import sharding as jax_sharding
from xgemm.jax.primitives import acc_dtype


@dataclass(frozen=True)
class GemmConfig:
    alpha: float
    beta: float
    out_dtype: str
    a_major: str = "row"
    b_major: str = "row"

    def but(self, **kw) -> "GemmConfig":
        return GemmConfig(**{**self.__dict__, **kw})


def _flip(major: str) -> str:
    return "col" if major == "row" else "row"


# ---------------------------------------------------------------------------------------------
# vmap

def _front(x, batched: bool, rank_after: int):
    """x with its vmapped dim (or a broadcasting 1) first, padded with 1s to rank 1 + rank_after."""
    if not batched:
        x = x[None]
    pad = rank_after - (x.ndim - 1)
    return x.reshape((x.shape[0],) + (1,) * pad + x.shape[1:]) if pad > 0 else x


@functools.lru_cache(maxsize=None)
def _batchable_gemm(cfg: GemmConfig, has_c: bool):
    @custom_vmap
    def f(a, b, *c):
        return jax_sharding.gemm(a, b, c[0] if has_c else None, alpha=cfg.alpha, beta=cfg.beta,
                                 out_dtype=cfg.out_dtype, a_major=cfg.a_major, b_major=cfg.b_major)

    @f.def_vmap
    def rule(size, in_batched, a, b, *c):
        ba, bb = in_batched[0], in_batched[1]
        nb = max(a.ndim - ba, b.ndim - bb) - 2            # batch rank of one vmap item's result
        if has_c and not (ba or bb):
            # Only C varies: one product in the accumulator type, then beta*C per item.
            acc = acc_dtype(a.dtype)
            d = _batchable_gemm(cfg.but(beta=0.0, out_dtype=acc.name), False)(a, b)
            c2 = _front(c[0], True, nb + 2)
            return (d[None] + jnp.asarray(cfg.beta, acc) * c2.astype(acc)).astype(cfg.out_dtype), True
        args = [_front(a, ba, nb + 2), _front(b, bb, nb + 2)]
        if has_c:
            args.append(_front(c[0], in_batched[2], nb + 2))
        return f(*args), True

    return f


@functools.lru_cache(maxsize=None)
def _batchable_softmax(axis: int):
    @custom_vmap
    def f(x):
        return jax_sharding.softmax(x, axis=axis)

    @f.def_vmap
    def rule(size, in_batched, x):
        return _batchable_softmax(axis + 1)(x), True      # the vmapped dim is first

    return f


# ---------------------------------------------------------------------------------------------
# grad

def _sum_to(x, shape: Tuple[int, ...]):
    """Sum x over the dims it was broadcast along to come from `shape`."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)
    return jnp.sum(x, axis=axes).reshape(shape) if axes else x


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def gemm(a, b, c: Optional[Any], cfg: GemmConfig):
    """D = alpha*a@b + beta*c (c None: no C) with vmap, grad and sharding rules."""
    return _batchable_gemm(cfg, c is not None)(a, b, *(() if c is None else (c,)))


def _gemm_fwd(a, b, c, cfg):
    return gemm(a, b, c, cfg), (a, b, c)


def _gemm_bwd(cfg: GemmConfig, res, g):
    a, b, c = res
    dt = a.dtype
    acc = acc_dtype(dt)
    k, n = a.shape[-1], b.shape[-1]
    gi = g.astype(dt)
    out_batch = g.shape[:-2]

    # dA = alpha * g @ B^T, reduced to a's batch shape
    a_reduced = tuple(a.shape[:-2]) != tuple(out_batch)
    da = gemm(gi, jnp.swapaxes(b, -1, -2), None,
              cfg.but(beta=0.0, out_dtype=acc.name if a_reduced else dt.name, a_major="row",
                      b_major=_flip(cfg.b_major)))
    da = _sum_to(da, a.shape).astype(dt)

    # dB = alpha * A^T @ g
    if b.ndim == 2 and out_batch and math.prod(out_batch) > 1 and tuple(a.shape[:-2]) == tuple(out_batch):
        # B was shared by every batch item: fold the batch into the contraction, one GEMM.
        a_f, g_f = a.reshape(-1, k), gi.reshape(-1, n)
        db = gemm(jnp.swapaxes(a_f, -1, -2), g_f, None,
                  cfg.but(beta=0.0, out_dtype=dt.name, a_major=_flip(cfg.a_major), b_major="row"))
    else:
        b_reduced = tuple(b.shape[:-2]) != tuple(out_batch)
        db = gemm(jnp.swapaxes(a, -1, -2), gi, None,
                  cfg.but(beta=0.0, out_dtype=acc.name if b_reduced else dt.name,
                          a_major=_flip(cfg.a_major), b_major="row"))
        db = _sum_to(db, b.shape).astype(dt)

    dc = None
    if c is not None:
        dc = _sum_to(jnp.asarray(cfg.beta, acc) * g.astype(acc), c.shape).astype(c.dtype)
    return da, db, dc


gemm.defvjp(_gemm_fwd, _gemm_bwd)


# A custom_jvp, not a custom_vjp: the tangent y * (dx - sum(y * dx)) is linear in dx, so JAX
# transposes it for grad (the same formula with the cotangent) and jvp, jacfwd and hessian work too
@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def softmax(x, axis: int):
    return _batchable_softmax(axis)(x)


@softmax.defjvp
def _softmax_jvp(axis, primals, tangents):
    (x,), (dx,) = primals, tangents
    y = softmax(x, axis)
    acc = acc_dtype(y.dtype)
    y32, dx32 = y.astype(acc), dx.astype(acc)
    dy = y32 * (dx32 - jnp.sum(dx32 * y32, axis=axis, keepdims=True))
    return y, dy.astype(y.dtype)
