"""xgemm.gated's layouts under sharded jit on 8 fake CPU devices (issue 24): the stacked weight
[K, 2, H] sharded along H keeps every device's gate and up columns together, so the call compiles
to local products with no collective and a result sharded along H; the concat [gate | up] weight
sharded along its columns gives the same numbers through XLA's resharding."""
from __future__ import annotations

import pytest
from helpers import run_on_fake_devices

pytest.importorskip("jax")

SCRIPT = r'''
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import xgemm, xgemm.jax as xj

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")
mesh = jax.make_mesh((8,), ("x",))
rng = np.random.default_rng(0)
K, H = 32, 64
a = rng.integers(-3, 4, (16, K)).astype(np.float32)
w = rng.integers(-3, 4, (K, 2, H)).astype(np.float32)
bias = rng.integers(-3, 4, (2, H)).astype(np.float32)
h = a.astype(np.float64) @ w.reshape(K, 2 * H) + bias.reshape(2 * H)
want = (h[:, :H] / (1 + np.exp(-h[:, :H]))) * h[:, H:]

put = lambda v, spec: jax.device_put(v, NamedSharding(mesh, spec))
stacked = jax.jit(lambda a, w, b: xj.gated(a, w, bias=b, layout="stacked"))
args = (put(a, P()), put(w, P(None, None, "x")), put(bias, P(None, "x")))
hlo = stacked.lower(*args).compile().as_text()
found = [c for c in COLLECTIVES if c in hlo]
assert not found, found
y = stacked(*args)
assert y.sharding.spec == P(None, "x"), y.sharding
np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=2e-5, atol=1e-3)

concat = jax.jit(lambda a, w, b: xj.gated(a, w, bias=b))
cargs = (put(a, P()), put(w.reshape(K, 2 * H), P(None, "x")), put(bias.reshape(2 * H), P("x")))
chlo = concat.lower(*cargs).compile().as_text()
assert any(c in chlo for c in COLLECTIVES), "the concat layout's column shards had to meet"   # the contrast
y2 = concat(*cargs)
np.testing.assert_allclose(np.asarray(y2, np.float64), want, rtol=2e-5, atol=1e-3)

# grads through the stacked layout, sharded: the same as the concat layout's, unsharded
loss = lambda w, a, b: jnp.sum(xj.gated(a, w, bias=b, layout="stacked") ** 2)
g_st = jax.jit(jax.grad(loss))(args[1], args[0], args[2])
g_cc = jax.grad(lambda w: jnp.sum(xj.gated(a, w, bias=bias.reshape(2 * H)) ** 2))(w.reshape(K, 2 * H))
np.testing.assert_allclose(np.asarray(g_st).reshape(K, 2 * H), np.asarray(g_cc), rtol=1e-5, atol=1e-6 * np.abs(np.asarray(g_cc)).max())
print("ALL OK")
'''


def test_stacked_gated_weights_shard_along_h_without_collectives():
    run_on_fake_devices(SCRIPT, 8)
