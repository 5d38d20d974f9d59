"""xgemm.jax.grouped (issue 23): ragged_dot / grouped_mm grads (custom_vjp) against jax.grad of
jax.lax.ragged_dot, reverse over reverse, vmap over any operand (folded into one call), jit with
traced sizes, the jax.export round trip, and expert-parallel sharding on 8 fake CPU devices."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import run_on_fake_devices

jax = pytest.importorskip("jax")
jnp = jax.numpy
from xgemm import errors  # noqa: E402
from xgemm.jax import grouped as jg  # noqa: E402

SIZES = {
    "empty and one-row groups": [3, 0, 1, 0, 6],       # sum 10 = T
    "sum below T": [2, 0, 4, 1, 0],                     # rows 7.. in no group
    "sum above T": [6, 3, 0, 4, 2],                     # last groups cut at T
}


def operands(seed, t=10, k=4, n=3, e=5, dtype=jnp.float64):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal((t, k)), dtype), jnp.asarray(rng.standard_normal((e, k, n)), dtype),
            jnp.asarray(rng.standard_normal((t, n)), dtype))


def _groups(sizes, rows):
    return jnp.searchsorted(jnp.cumsum(sizes), jnp.arange(rows), side="right")


def dense_ref(lhs, rhs, sizes):
    """ragged_dot as a masked sum of dense products: differentiable to any order (XLA's ragged_dot
    has no second derivative for the variable-K product that its first one uses)."""
    group = _groups(sizes, lhs.shape[0])
    return sum(jnp.where((group == e)[:, None], lhs @ rhs[e], 0) for e in range(rhs.shape[0]))


def contract_ref(a, b, sizes):
    """a [T, M], b [T, N] -> [E, M, N]: each group's rows masked, then a^T @ b (jnp, differentiable)."""
    group = _groups(sizes, a.shape[0])
    return jnp.stack([jnp.where((group == e)[:, None], a, 0).T @ jnp.where((group == e)[:, None], b, 0)
                      for e in range(sizes.shape[0])])


@pytest.mark.parametrize("case", sorted(SIZES))
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_grads_match_jax_lax_ragged_dot(case, dtype):
    dt = jnp.dtype(dtype)
    lhs, rhs, w = operands(0, dtype=dt)
    sizes = jnp.asarray(SIZES[case], jnp.int32)

    def loss(f):
        return lambda l, r: jnp.sum(f(l, r, sizes).astype(jnp.float32 if dt != jnp.float64 else dt) * w)
    ours = jax.grad(loss(jg.ragged_dot), argnums=(0, 1))(lhs, rhs)
    theirs = jax.grad(loss(jax.lax.ragged_dot), argnums=(0, 1))(lhs, rhs)
    tol = {"float64": 1e-12, "float32": 1e-5, "bfloat16": 3e-2}[dtype]
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype == dt
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol)
    np.testing.assert_array_equal(np.asarray(ours[0], np.float64)[sum(SIZES[case]):], 0)   # rows in no group
    for e in np.flatnonzero(np.asarray(SIZES[case]) == 0):
        np.testing.assert_array_equal(np.asarray(ours[1][e], np.float64), 0)           # empty groups


def test_an_experts_inf_and_nan_reach_only_its_own_rows():
    """On CPU, XLA's ragged dot multiplies every row by every expert's masked weights (0 * inf):
    an Inf in an expert with no rows made every row NaN. xgemm's lowering selects each row's own
    product, as its eager path and kernels do; grads and the variable-K form too."""
    lhs, rhs = jnp.ones((6, 2), jnp.float32), np.ones((3, 2, 4), np.float32)
    rhs[2] = np.inf
    rhs[1, 0, 0] = np.nan
    rhs = jnp.asarray(rhs)
    for sizes, want in (([3, 3, 0], [2, 2, 2]), ([3, 2, 1], [2, 2, 2])):
        y = jax.jit(jg.ragged_dot)(lhs, rhs, jnp.asarray(sizes, jnp.int32))
        np.testing.assert_array_equal(y[:3], 2.0)                       # expert 0's rows: finite
        assert np.isnan(y[3:5, 0]).all() and (y[3:5, 1:] == 2.0).all()  # expert 1's NaN: its column only
        if sizes[2]:
            assert np.isinf(y[5]).all()
        dlhs = jax.grad(lambda x, s=sizes: jnp.sum(jg.ragged_dot(x, rhs, jnp.asarray(s, jnp.int32))[:3]))(lhs)
        np.testing.assert_array_equal(dlhs[:3], 4.0)
    a, b = jnp.ones((6, 2), jnp.float32), jnp.ones((6, 3), jnp.float32).at[5].set(jnp.inf)
    y = jg.grouped_mm(a.T, b, jnp.asarray([3, 5, 6], jnp.int32))     # variable K: [E, 2, 3]
    np.testing.assert_array_equal(y[:2], np.array([3.0, 2.0])[:, None, None] * np.ones((2, 2, 3)))
    assert np.isinf(y[2]).all()


def test_int64_sizes_past_t_are_capped_not_wrapped():
    if not jax.config.jax_enable_x64:
        pytest.skip("int64 arrays need jax_enable_x64")
    lhs, rhs = jnp.ones((8, 2), jnp.float32), jnp.ones((2, 2, 3), jnp.float32)
    sizes = jnp.asarray([3, 2 ** 32 + 1], jnp.int64)          # wrapped to int32: [3, 1]
    np.testing.assert_array_equal(jg.ragged_dot(lhs, rhs, sizes), jax.lax.ragged_dot(lhs, rhs, sizes))
    np.testing.assert_array_equal(jg.grouped_mm(lhs, rhs, jnp.asarray([3, 2 ** 33], jnp.int64)), 2.0)


def test_grad_under_jit_with_traced_sizes_and_reverse_over_reverse():
    lhs, rhs, w = operands(1)
    sizes = jnp.asarray(SIZES["empty and one-row groups"], jnp.int32)

    def inner(f):
        return lambda l, r, g: jnp.sum(jnp.tanh(f(l, r, g)) * w)

    def outer(f):   # grad, then grad of a function of the grad
        return lambda l, r, g: jnp.sum(jax.grad(inner(f), argnums=1)(l, r, g) ** 2)
    ours = jax.jit(jax.grad(outer(jg.ragged_dot), argnums=(0, 1)))(lhs, rhs, sizes)
    theirs = jax.jit(jax.grad(outer(dense_ref), argnums=(0, 1)))(lhs, rhs, sizes)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_grouped_mm_both_cases_and_their_grads():
    lhs, rhs, w = operands(2)
    sizes = jnp.asarray(SIZES["sum below T"], jnp.int32)
    offs = jnp.cumsum(sizes)
    np.testing.assert_allclose(jg.grouped_mm(lhs, rhs, offs), jax.lax.ragged_dot(lhs, rhs, sizes), rtol=1e-12)
    # the variable-K product: x [M, T], w [T, N] -> [E, M, N]
    x, dy = lhs.T, w
    np.testing.assert_allclose(jg.grouped_mm(x, dy, offs), contract_ref(lhs, dy, sizes), rtol=1e-12, atol=1e-12)
    g = jax.random.normal(jax.random.key(0), (5, 4, 3), jnp.float64)
    ours = jax.jit(jax.grad(lambda x, dy: jnp.sum(jg.grouped_mm(x, dy, offs) * g), argnums=(0, 1)))(x, dy)
    theirs = jax.jit(jax.grad(lambda x, dy: jnp.sum(contract_ref(x.T, dy, sizes) * g), argnums=(0, 1)))(x, dy)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_vmap_over_any_operands_folds_into_one_call():
    """XLA's ragged_dot batches only when all three are batched; the rule folds every case into
    one unbatched call (the jaxpr holds a single ragged_dot, no loop), and grads vmap too."""
    rng = np.random.default_rng(3)
    b, t, k, n, e = 3, 9, 4, 3, 4
    lhs, rhs = jnp.asarray(rng.standard_normal((b, t, k))), jnp.asarray(rng.standard_normal((b, e, k, n)))
    sizes = jnp.asarray([[2, 0, 3, 4], [1, 1, 0, 3], [0, 6, 2, 5]], jnp.int32)   # sums 9, 5 (< T), 13 (> T)
    cases = [a for a in itertools.product([0, None], repeat=3) if a != (None,) * 3]

    def ours(lhs, rhs, sizes):       # every batching at once: one compile
        out = []
        for axes in cases:
            args = [x if a == 0 else x[0] for x, a in zip((lhs, rhs, sizes), axes)]    # unbatched: element 0
            loss = jax.grad(lambda l, r, g: jnp.sum(jg.ragged_dot(l, r, g) ** 2), argnums=(0, 1))
            out.append((jax.vmap(jg.ragged_dot, in_axes=axes)(*args), jax.vmap(loss, in_axes=axes)(*args)))
        return out

    def theirs(lhs, rhs, sizes):     # the same, every operand batched (elements 0 broadcast), dense
        out = []
        for axes in cases:
            full = [x if a == 0 else jnp.broadcast_to(x[0], x.shape) for x, a in zip((lhs, rhs, sizes), axes)]
            loss = jax.grad(lambda l, r, g: jnp.sum(dense_ref(l, r, g) ** 2), argnums=(0, 1))
            out.append((jax.vmap(jax.lax.ragged_dot)(*full), jax.vmap(loss)(*full)))
        return out
    for axes, got, want in zip(cases, jax.jit(ours)(lhs, rhs, sizes), jax.jit(theirs)(lhs, rhs, sizes)):
        # an unbatched rhs gets one gradient per batch element here (vmap of grad)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, err_msg=str(axes))
    jaxpr = str(jax.make_jaxpr(jax.vmap(jg.ragged_dot, in_axes=(0, None, None)))(lhs, rhs[0], sizes[0]))
    assert jaxpr.count("xgemm_grouped[") == 1, jaxpr


@pytest.mark.parametrize("b, t, k, n, e", [(0, 5, 3, 4, 3), (2, 0, 3, 4, 3), (2, 5, 3, 0, 3), (2, 5, 0, 4, 3),
                                           (2, 5, 3, 4, 0)])
def test_vmap_of_zero_size_extents(b, t, k, n, e):
    """A zero-size batch, T, K, N or E under vmap gives the unbatched call's empty or zero result
    (reshape(-1) beside a zero extent raised ZeroDivisionError)."""
    sizes = jnp.zeros((b, e), jnp.int32).at[:, 0].set(min(t, 2)) if e else jnp.zeros((b, 0), jnp.int32)
    for shared in (False, True):
        rhs = jnp.ones((e, k, n), jnp.float32) if shared else jnp.ones((b, e, k, n), jnp.float32)
        y = jax.vmap(jg.ragged_dot, in_axes=(0, None if shared else 0, 0))(jnp.ones((b, t, k), jnp.float32), rhs, sizes)
        want = np.zeros((b, t, n), np.float32)
        want[:, :min(t, 2) if e else 0] = k
        np.testing.assert_array_equal(y, want)
    y = jax.vmap(jg.grouped_mm)(jnp.ones((b, k, t), jnp.float32), jnp.ones((b, t, n), jnp.float32),
                                jnp.full((b, e), t, jnp.int32))
    assert y.shape == (b, e, k, n)


def test_nested_vmap_and_vmap_of_the_variable_k_product():
    rng = np.random.default_rng(4)
    lhs = jnp.asarray(rng.standard_normal((2, 3, 8, 4)))
    rhs = jnp.asarray(rng.standard_normal((2, 3, 4, 5)))
    sizes = jnp.asarray([[1, 0, 5], [3, 3, 3], [0, 0, 2]], jnp.int32)
    got = jax.jit(jax.vmap(jax.vmap(jg.ragged_dot, in_axes=(0, None, 0)), in_axes=(0, 0, None)))(lhs, rhs, sizes)
    want = np.stack([np.stack([jax.lax.ragged_dot(lhs[i, j], rhs[i], sizes[j]) for j in range(3)]) for i in range(2)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    a, b = jnp.asarray(rng.standard_normal((3, 4, 8))), jnp.asarray(rng.standard_normal((8, 6)))
    offs = jnp.cumsum(sizes, axis=1)
    got = jax.jit(jax.vmap(jg.grouped_mm, in_axes=(0, None, 0)))(a, b, offs)
    want = jax.jit(jax.vmap(lambda a, g: contract_ref(a.T, b, g)))(a, sizes)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_export_round_trip_with_its_vjp():
    export = pytest.importorskip("jax.export")
    lhs, rhs, w = operands(5, dtype=jnp.float32)
    sizes = jnp.asarray([3, 0, 1, 0, 6], jnp.int32)
    exp = export.export(jax.jit(jg.ragged_dot))(lhs, rhs, sizes)
    back = export.deserialize(exp.serialize(vjp_order=1))
    np.testing.assert_array_equal(back.call(lhs, rhs, sizes), jg.ragged_dot(lhs, rhs, sizes))
    other = jnp.asarray([0, 4, 4, 2, 0], jnp.int32)          # sizes are an input, not baked in
    np.testing.assert_allclose(back.call(lhs, rhs, other), jax.lax.ragged_dot(lhs, rhs, other), rtol=1e-6)
    g = jax.grad(lambda r: jnp.sum(back.call(lhs, r, sizes) * w))(rhs)
    np.testing.assert_allclose(g, jax.grad(lambda r: jnp.sum(jax.lax.ragged_dot(lhs, r, sizes) * w))(rhs),
                               rtol=1e-5, atol=1e-5)


def test_errors_are_typed():
    lhs, rhs, _ = operands(6)
    with pytest.raises(errors.ShapeError, match=r"group_sizes has shape \(4,\).*pass shape \(5,\)"):
        jg.ragged_dot(lhs, rhs, jnp.zeros(4, jnp.int32))
    with pytest.raises(errors.DTypeError, match="group_sizes has dtype float32"):
        jg.ragged_dot(lhs, rhs, jnp.zeros(5, jnp.float32))
    with pytest.raises(errors.DTypeError, match="preferred_element_type|out_dtype=float32 with float64"):
        jg.ragged_dot(lhs, rhs, jnp.zeros(5, jnp.int32), preferred_element_type=jnp.float32)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("e",))
    with pytest.raises(errors.ShapeError, match="axis 'x' is not an axis of the mesh"):
        jg.ragged_dot_expert_parallel(lhs, rhs, jnp.zeros(5, jnp.int32), mesh, "x")
    with pytest.raises(errors.ShapeError, match=r"axis \['e'\] is not an axis of the mesh"):
        jg.ragged_dot_expert_parallel(lhs, rhs, jnp.zeros(5, jnp.int32), mesh, ["e"])
    with pytest.raises(errors.ShapeError, match="mesh is a NoneType; pass a jax.sharding.Mesh"):
        jg.ragged_dot_expert_parallel(lhs, rhs, jnp.zeros(5, jnp.int32), None, "e")


SHARDED = r'''
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
from xgemm import errors
from xgemm.jax import grouped as jg

assert len(jax.devices()) == 8
D, E, K, N, C = 8, 32, 8, 6, 12          # 4 experts a device, blocks of 12 rows
rng = np.random.default_rng(0)
sizes = np.zeros(E, np.int32)
for d in range(D):                        # each device's experts fill at most its capacity; some empty
    sizes[d * 4:(d + 1) * 4] = rng.multinomial(rng.integers(0, C + 1), [0.55, 0.3, 0.15, 0.0])
assert (sizes == 0).sum() >= D and sizes.reshape(D, 4).sum(1).max() <= C
lhs = rng.standard_normal((D * C, K)).astype(np.float32)
rhs = rng.standard_normal((E, K, N)).astype(np.float32)
dy = rng.standard_normal((D * C, N)).astype(np.float32)

# the same tokens unsharded: every block's real rows, in order (the padding dropped)
real = np.concatenate([np.arange(d * C, d * C + sizes[d * 4:(d + 1) * 4].sum()) for d in range(D)])
pad = np.setdiff1d(np.arange(D * C), real)

for mesh in (jax.make_mesh((8,), ("e",)),                                        # Explicit axes
             jax.make_mesh((4, 2), ("e", "dp"), axis_types=(AxisType.Auto,) * 2)):   # Auto, another axis
    d = mesh.shape["e"]
    put = lambda v, spec: jax.device_put(v, NamedSharding(mesh, spec))
    args = (put(lhs, P("e", None)), put(rhs, P("e", None, None)), put(sizes, P("e")))
    f = jax.jit(lambda l, r, g: jg.ragged_dot_expert_parallel(l, r, g, mesh, "e"))
    out = f(*args)
    assert out.sharding.spec[0] == "e", out.sharding
    hlo = f.lower(*args).compile().as_text()
    assert not any(c in hlo for c in ("all-gather", "all-reduce", "all-to-all", "collective-permute")), hlo
    got = np.asarray(out)
    if d == D:
        want = np.asarray(jax.lax.ragged_dot(jnp.asarray(lhs[real]), jnp.asarray(rhs), jnp.asarray(sizes)))
        np.testing.assert_allclose(got[real], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[pad], 0)
    else:      # 4 devices: each block of 24 rows (from its start, grouped) against its 8 experts
        for b in range(d):
            sl = slice(b * 2 * C, (b + 1) * 2 * C)
            want = jax.lax.ragged_dot(jnp.asarray(lhs[sl]), jnp.asarray(rhs[b * 8:(b + 1) * 8]),
                                      jnp.asarray(sizes[b * 8:(b + 1) * 8]))
            np.testing.assert_allclose(got[sl], np.asarray(want), rtol=1e-5, atol=1e-5)
    # grads: sharded like their operands, equal to the per-device ones
    loss = lambda l, r, g: jnp.sum(jg.ragged_dot_expert_parallel(l, r, g, mesh, "e") * jnp.asarray(dy))
    dl, dr = jax.jit(jax.grad(loss, argnums=(0, 1)))(*args)
    assert dr.sharding.spec[0] == "e" and dl.sharding.spec[0] == "e", (dl.sharding, dr.sharding)
    if d == D:
        rl, rr = jax.grad(lambda l, r: jnp.sum(jax.lax.ragged_dot(l, r, jnp.asarray(sizes)) * jnp.asarray(dy[real])),
                          argnums=(0, 1))(jnp.asarray(lhs[real]), jnp.asarray(rhs))
        np.testing.assert_allclose(np.asarray(dl)[real], rl, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(np.asarray(dl)[pad], 0)
        np.testing.assert_allclose(np.asarray(dr), rr, rtol=1e-4, atol=1e-4)
    print("ok", mesh.axis_types)

mesh = jax.make_mesh((8,), ("e",))
try:
    jg.ragged_dot_expert_parallel(lhs, rhs[:12], sizes[:12], mesh, "e")
    raise SystemExit("no error for 12 experts over 8 devices")
except errors.ShapeError as exc:
    assert "must be multiples of 8" in str(exc), exc
print("ALL OK")
'''


def test_expert_parallel_sharding_on_8_fake_devices():
    run_on_fake_devices(SHARDED, 8)
