"""Sharded jit on 8 fake CPU devices: the xgemm call partitions (custom_partitioning) instead of gathering.

Runs in a subprocess: --xla_force_host_platform_device_count must be set before jax starts, and
other test modules share this process's jax. Two lowerings are checked: the embedded default
(XLA's dot, per shard) and the cuda rule through the native handler with the fake driver, a
custom call XLA could not partition by itself, so shard-shaped custom calls prove our rule ran.
"""
from __future__ import annotations

import pytest
from helpers import run_on_fake_devices

pytest.importorskip("jax")

SCRIPT = r'''
import re
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import xgemm.jax as xj
from xgemm.jax import testing as jax_testing

assert len(jax.devices()) == 8
mesh = jax.make_mesh((4, 2), ("x", "y"))
rng = np.random.default_rng(0)
A = rng.integers(-5, 6, (64, 32)).astype(np.float32)
B = rng.integers(-5, 6, (32, 48)).astype(np.float32)
C = rng.integers(-5, 6, (64, 48)).astype(np.float32)
put = lambda v, spec: jax.device_put(v, NamedSharding(mesh, spec))

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")

def check(tag, sa, sb, sc=None, *, collectives=(), local=None, ncalls=None, out=None, exchanges=None,
          placed=None):
    """collectives: exactly the collective ops the compiled HLO may hold. An operand gathered
    instead of partitioned shows up as an unexpected all-gather or as full-size local shapes."""
    args = [put(A, sa), put(B, sb)] + ([put(C, sc)] if sc is not None else [])
    if sc is None:
        fn, ref = (lambda a, b: xj.gemm(a, b)), A @ B
    else:
        fn, ref = (lambda a, b, c: xj.gemm(a, b, c, alpha=2.0, beta=-1.0)), 2 * A @ B - C
    f = jax.jit(fn, out_shardings=None if out is None else NamedSharding(mesh, out))
    hlo = f.lower(*args).compile().as_text()
    res = f(*args)
    np.testing.assert_array_equal(np.asarray(res), ref)
    found = {w for w in COLLECTIVES if w in hlo}
    assert found == set(collectives), (tag, found, hlo)
    if out is not None:
        assert res.sharding.spec == out, (tag, res.sharding.spec)
    if local is not None:       # the custom call runs on shard-shaped operands
        calls = [l for l in hlo.splitlines() if "custom-call(" in l and "xgemm_cubin_launch" in l]
        assert calls and all(local in l for l in calls), (tag, calls)
        assert ncalls is None or len(calls) == ncalls, (tag, calls)
    if exchanges is not None:   # the copy-engine exchange's host variant moved the ring's blocks
        moved = [l for l in hlo.splitlines() if "custom-call(" in l and "xgemm_exchange_host_test_v1" in l]
        assert len(moved) == exchanges, (tag, moved)
    if placed is not None:      # received pieces land in the result's rows: no update-slice pass
        assert ("dynamic-update-slice" not in hlo) == placed, (tag, hlo)
    print("ok", tag, res.sharding.spec)

# the sum over K shards, per K_REDUCTION: replicated result / result sharded over the K axis
K_SUM = {"ring": ({"collective-permute"}, {"collective-permute"}),
         "gather": ({"all-to-all", "all-gather"}, {"all-to-all", "all-gather"}),
         "scatter": ({"reduce-scatter", "all-gather"}, {"reduce-scatter"}),
         "all_reduce": ({"all-reduce"}, {"reduce-scatter"})}

def suite(tag, fake):
    from xgemm.jax import sharding as jax_sharding
    loc = (lambda s: s) if fake else (lambda s: None)
    assert jax_sharding.K_REDUCTION == "ring" and set(K_SUM) == set(jax_sharding.K_REDUCTIONS)
    check(tag + " rows x cols", P("x", None), P(None, "y"), local=loc("f32[16,32]"))
    # ring on 2 K shards: two half-row-block products per device (64 rows -> 32; K 32 -> 16)
    check(tag + " K-sharded", P(None, "y"), P("y", None), collectives=K_SUM["ring"][0],
          local=loc("f32[32,16]"), ncalls=2)
    check(tag + " rows+K, C", P("x", "y"), P("y", None), P("x", None), collectives=K_SUM["ring"][0],
          local=loc("f32[8,16]"), ncalls=2)
    check(tag + " rows x cols, C", P("x", None), P(None, "y"), P("x", "y"))
    rows_min = jax_sharding.K_RING_MIN_ROWS
    try:     # the ring in chunks: 32-row blocks -> two 16-row chunks per hop, each gathered apart
        jax_sharding.K_RING_MIN_ROWS = 8
        check(tag + " K-sharded, chunked ring", P(None, "y"), P("y", None), collectives=K_SUM["ring"][0],
              local=loc("f32[16,16]"), ncalls=4)
        check(tag + " K-sharded, chunked ring -> rows", P(None, "y"), P("y", None),
              collectives=K_SUM["ring"][1], local=loc("f32[16,16]"), ncalls=4, out=P("y", None))
        check(tag + " K-sharded, chunked ring, C", P(None, "y"), P("y", None), P(None, None),
              collectives=K_SUM["ring"][0], local=loc("f32[16,16]"), ncalls=4)
    finally:
        jax_sharding.K_RING_MIN_ROWS = rows_min
    check(tag + " K over 8 devices", P(None, ("x", "y")), P(("x", "y"), None), collectives=K_SUM["ring"][0],
          local=loc("f32[8,4]"), ncalls=8)
    try:
        for strategy, (full, scattered) in K_SUM.items():
            jax_sharding.K_REDUCTION = strategy
            check(f"{tag} K-sharded {strategy}, C", P(None, "y"), P("y", None), P(None, None), collectives=full)
            check(f"{tag} K over 8 devices, {strategy}", P(None, ("x", "y")), P(("x", "y"), None),
                  collectives=full)
            check(f"{tag} K-sharded {strategy} -> rows", P(None, "y"), P("y", None), collectives=scattered,
                  out=P("y", None))
            check(f"{tag} K-sharded {strategy} -> cols, C", P(None, "y"), P("y", None), P(None, None),
                  collectives={"reduce-scatter"}, out=P(None, "y"))
    finally:
        jax_sharding.K_REDUCTION = "ring"
    # batch-sharded A against a shared B, with grad and vmap in the same jit
    Ab = rng.integers(-5, 6, (8, 16, 32)).astype(np.float32)
    a, b = put(Ab, P("x", None, None)), put(B, P(None, "y"))
    g = jax.jit(jax.grad(lambda a, b: jnp.sum(xj.gemm(a, b) ** 2), (0, 1)))
    hlo = g.lower(a, b).compile().as_text()
    G = 2 * (Ab @ B)
    ga, gb = g(a, b)
    np.testing.assert_array_equal(np.asarray(ga), G @ B.T)
    np.testing.assert_array_equal(np.asarray(gb), np.einsum("lmk,lmn->kn", Ab, G))
    v = jax.jit(jax.vmap(lambda a: xj.gemm(a, b)))(a)
    np.testing.assert_array_equal(np.asarray(v), Ab @ B)
    print("ok", tag, "grad/vmap")
    # softmax keeps every dim's sharding (the reduced one here is not sharded)
    X = rng.standard_normal((16, 8, 32)).astype(np.float32)
    x = put(X, P("x", "y", None))
    f = jax.jit(lambda x: xj.softmax(x, -1))
    hlo = f.lower(x).compile().as_text()
    e = np.exp(X - X.max(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(f(x)), e / e.sum(-1, keepdims=True), rtol=1e-6)
    assert "all-gather" not in hlo and "all-to-all" not in hlo
    if fake:
        calls = [l for l in hlo.splitlines() if "custom-call(" in l and "xgemm_cubin_launch" in l]
        assert calls and all("f32[4,4,32]" in l for l in calls), calls
    print("ok", tag, "softmax")
    # a sharded reduced dim stays sharded: one max and one sum per row cross the devices (all-reduce)
    Xs = rng.standard_normal((16, 64)).astype(np.float32) * 4
    Xs[3] = -np.inf                      # all -inf row: NaN, as torch.softmax gives
    Xs[5, 7] = np.inf                    # +inf in a row: NaN row
    Xs[6, :40] = -np.inf                 # a whole shard of the row -inf, the rest finite
    one = np.asarray(jax.jit(lambda x: xj.softmax(x, -1))(jax.device_put(Xs, jax.devices()[0])))
    for spec in (P(None, "y"), P("x", ("x", "y")[1:]), P(None, ("x", "y"))):
        x = put(Xs, spec)
        f = jax.jit(lambda x: xj.softmax(x, -1))
        hlo = f.lower(x).compile().as_text()
        got = f(x)
        assert got.sharding.spec == spec, (spec, got.sharding.spec)
        np.testing.assert_allclose(np.asarray(got), one, rtol=1e-6, atol=1e-7)   # NaNs in the same places
        assert "all-gather" not in hlo and "all-to-all" not in hlo and "all-reduce" in hlo, (spec, hlo)
    e = np.exp(Xs[6] - Xs[6].max())
    np.testing.assert_allclose(one[6], e / e.sum(), rtol=1e-6)
    # uneven split of the reduced dim (65 columns over 2): gathered, not padded into the sums
    # (device_put refuses an uneven split; a sharding constraint inside the jit asks for one)
    Xu = rng.standard_normal((8, 65)).astype(np.float32)
    auto = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("u",))      # Auto axes: constraints allowed
    fu = jax.jit(lambda x: xj.softmax(jax.lax.with_sharding_constraint(x * 2, NamedSharding(auto, P(None, "u"))), -1))
    eu = np.exp(2 * Xu - (2 * Xu).max(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(fu(Xu)), eu / eu.sum(-1, keepdims=True), rtol=1e-6)
    assert "all-gather" in fu.lower(Xu).compile().as_text()
    print("ok", tag, "softmax over a sharded row")

def copy_engine_suite():
    """The ring with its blocks moved by xgemm's exchange (host variant: the devices meet on the
    host, the copy a memcpy) instead of collective-permutes. Each send is one custom call, alone or
    (on CUDA) fused with the next product; n shards, c chunks: (n-1) c partial sums moved, plus
    (n-1) c result pieces when the result is replicated, received straight into the result's rows
    when there is no C. rows+K: four groups of 2 on one channel."""
    from xgemm.jax import ffi as jax_ffi
    from xgemm.jax import sharding as jax_sharding
    jax_ffi.register_exchange_host_test()
    check("ce K-sharded", P(None, "y"), P("y", None), exchanges=2, placed=True)
    check("ce rows+K, C", P("x", "y"), P("y", None), P("x", None), exchanges=2, placed=False)
    check("ce K over 8 devices", P(None, ("x", "y")), P(("x", "y"), None), exchanges=14, placed=True)
    check("ce K over 4 devices -> rows", P(None, "x"), P("x", None), exchanges=3, out=P("x", None))
    rows_min = jax_sharding.K_RING_MIN_ROWS
    try:
        jax_sharding.K_RING_MIN_ROWS = 8
        check("ce K-sharded, chunked ring", P(None, "y"), P("y", None), exchanges=4, placed=True)
        check("ce K-sharded, chunked ring -> rows", P(None, "y"), P("y", None), exchanges=2, out=P("y", None))
        check("ce K-sharded, chunked ring, C", P(None, "y"), P("y", None), P(None, None), exchanges=4,
              placed=False)
        # 4-way ring, 16-row blocks in two 8-row chunks: 3 hops x 2 chunks of sums, 3 x 2 pieces
        check("ce K over 4 devices, chunked", P(None, "x"), P("x", None), exchanges=12, placed=True)
        check("ce K over 4 devices, chunked, C", P(None, "x"), P("x", None), P(None, None), exchanges=12,
              placed=False)
        check("ce K over 4 devices, chunked -> rows", P(None, "x"), P("x", None), exchanges=6, out=P("x", None))
    finally:
        jax_sharding.K_RING_MIN_ROWS = rows_min
    jax_sharding.K_RING_TRANSPORT = "nccl"           # still selectable
    try:
        check("ce off: nccl", P(None, "y"), P("y", None), collectives=K_SUM["ring"][0], exchanges=0)
    finally:
        jax_sharding.K_RING_TRANSPORT = "auto"

suite("xla", False)
with jax_testing.fake_gpu():
    suite("ffi", True)
copy_engine_suite()
print("ALL OK")
'''


def test_sharded_jit_partitions_the_call():
    run_on_fake_devices(SCRIPT, 8, XGEMM_EXCHANGE_TIMEOUT_S="60")
