"""The copy-engine exchange's host variant (ffi/peer_exchange.h) on 2 fake CPU devices: what it moves,
and that bad use fails with an error instead of hanging or writing out of bounds.

Runs in a subprocess: --xla_force_host_platform_device_count must be set before jax starts. The
ring that uses the exchange is tested in test_jax_sharding.py; here the op is called directly.
"""
from __future__ import annotations

import pytest
from helpers import run_on_fake_devices

pytest.importorskip("jax")

SCRIPT = r'''
import time
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
try:
    from jax import shard_map
    NO_CHECK = dict(check_vma=False)
except ImportError:                     # older jax
    from jax.experimental.shard_map import shard_map
    NO_CHECK = dict(check_rep=False)
from xgemm.jax import ffi as jax_ffi
from xgemm.jax.primitives import exchange_p

jax_ffi.register_exchange_host_test()
mesh = jax.make_mesh((2,), ("d",))
ordinals = tuple(d.local_hardware_id for d in mesh.devices.flat)
channel = iter(range(10_000, 20_000))

def run(fn, x, out_specs=P("d")):
    f = jax.jit(shard_map(fn, mesh=mesh, in_specs=P("d"), out_specs=out_specs, **NO_CHECK))
    return np.asarray(f(jax.device_put(x, NamedSharding(mesh, P("d")))))

X = np.arange(2 * 3 * 4, dtype=np.float32).reshape(6, 4)       # device d holds rows 3d..3d+2

# swap: each device receives the other's block
swap = jax_ffi.Route(next(channel), (ordinals,), (1, 0))
got = run(lambda x: exchange_p.bind(x, route=swap), X)
np.testing.assert_array_equal(got, np.concatenate([X[3:], X[:3]]))
# itself as its source: a local copy
me = jax_ffi.Route(next(channel), (ordinals,), (0, 1))
np.testing.assert_array_equal(run(lambda x: exchange_p.bind(x, route=me), X), X)
# into rows of a result: the peer's block lands at its rank's rows, the own block copied beside
into = jax_ffi.Into(rows=6, block_rows=3, chunk_row=0, local=True)
got = run(lambda x: exchange_p.bind(x, route=jax_ffi.Route(next(channel), (ordinals,), (1, 0)), into=into),
          X, out_specs=P("d"))
np.testing.assert_array_equal(got, np.concatenate([X, X]))      # each device: the whole (6, 4)
print("moved ok")

def fails(fn, x, want):
    try:
        run(fn, x)
    except Exception as exc:       # XLA wraps the handler's error
        assert want in str(exc), str(exc)[-600:]
        return
    raise AssertionError("no error for: " + want)

# a route that does not name this device
fails(lambda x: exchange_p.bind(x, route=jax_ffi.Route(next(channel), ((97, 98),), (1, 0))), X,
      "is not in this exchange's route")
# rows that would fall outside the result
bad_into = jax_ffi.Into(rows=6, block_rows=4, chunk_row=0, local=False)
fails(lambda x: exchange_p.bind(x, route=jax_ffi.Route(next(channel), (ordinals,), (1, 0)), into=bad_into), X,
      "fall outside the result")
# a peer that never comes (the op runs on one device of a 2-device group): an error after the
# timeout, not a hang
t = time.perf_counter()
lonely = jax_ffi.Route(next(channel), (ordinals,), (1, 0))
try:
    jax.jit(lambda x: exchange_p.bind(x, route=lonely))(jax.device_put(X[:3], mesh.devices.flat[0]))
    raise AssertionError("no timeout")
except Exception as exc:
    assert "never reached this exchange (timeout)" in str(exc), str(exc)[-600:]
assert time.perf_counter() - t < 60
print("errors ok")
print("ALL OK")
'''


def test_exchange_moves_and_fails_cleanly():
    run_on_fake_devices(SCRIPT, 2, XGEMM_EXCHANGE_TIMEOUT_S="2")
