"""xgemm.jax on CPU (the embedded default): values vs float64 NumPy, jit, grad, vmap, export, errors.

Integer-valued inputs in [-5, 5] make every product and sum exact in the fp32 accumulator, so
results must equal the float64 reference rounded once to the output dtype.
"""
from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from helpers import np_dtype, rounded  # noqa: E402

import xgemm  # noqa: E402
import xgemm.jax as xj  # noqa: E402

DTYPES = ("float32", "float16", "bfloat16", "float64")


def ints(rng, shape):
    return rng.integers(-5, 6, size=shape).astype(np.float64)


def as_jax(v, dtype):
    return jnp.asarray(np.asarray(v).astype(np_dtype(dtype)))


def f64(x):
    return np.asarray(x).astype(np.float64)


# (a shape, b shape, c shape or None): 2-D, broadcast batch both ways, 1-D operands, scalar-ish C
CASES = [
    ((7, 13), (13, 5), (7, 5)),
    ((3, 7, 13), (13, 5), (5,)),               # B shared by the batch: folded into M on cuda
    ((2, 1, 4, 6), (3, 6, 5), (1, 5)),          # both batches broadcast
    ((13,), (3, 13, 5), (3, 5)),                 # 1-D a
    ((4, 13), (13,), (4,)),                      # 1-D b
    ((13,), (13,), ()),                          # dot
    ((1, 1), (1, 1), None),
]


# every dtype on the first three cases, float32 on the rest (compiles dominate the run time)
GEMM_PARAMS = [(d, i) for i in range(len(CASES)) for d in (DTYPES if i < 3 else ("float32",))]


@pytest.mark.parametrize("dtype,case", GEMM_PARAMS)
def test_gemm_matches_float64_reference(dtype, case):
    rng = np.random.default_rng(case)
    a_shape, b_shape, c_shape = CASES[case]
    av, bv = ints(rng, a_shape), ints(rng, b_shape)
    cv = ints(rng, c_shape) if c_shape is not None else None
    alpha, beta = (2.0, 0.5) if cv is not None else (-1.0, 0.0)
    a, b = as_jax(av, dtype), as_jax(bv, dtype)
    c = as_jax(cv, dtype) if cv is not None else None
    ref = alpha * np.matmul(av, bv) + (beta * cv if cv is not None else 0)
    d = xj.gemm(a, b, c, alpha=alpha, beta=beta)
    assert d.dtype == np_dtype(dtype) and d.shape == ref.shape
    np.testing.assert_array_equal(f64(d), rounded(ref, dtype))
    if dtype == "float32":   # the same primitive inside a user's jit, through the public API
        dj = jax.jit(lambda a, b, *c: xgemm.gemm(a, b, *c, alpha=alpha, beta=beta))(a, b, *(() if c is None else (c,)))
        np.testing.assert_array_equal(f64(dj), f64(d))


@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
def test_half_inputs_with_float32_output(dtype):
    rng = np.random.default_rng(1)
    av, bv, cv = rng.standard_normal((8, 64)), rng.standard_normal((64, 8)), rng.standard_normal((8, 8))
    a, b = as_jax(av, dtype), as_jax(bv, dtype)
    d = xj.gemm(a, b, jnp.asarray(cv, jnp.float32), alpha=1.5, beta=-1.0, out_dtype=jnp.float32)
    assert d.dtype == jnp.float32
    ref = 1.5 * f64(a) @ f64(b) - rounded(cv, "float32")
    np.testing.assert_allclose(f64(d), ref, rtol=1e-5, atol=1e-4)


def test_beta_zero_never_reads_c():
    a, b = jnp.ones((4, 8), jnp.float32), jnp.ones((8, 3), jnp.float32)
    c = jnp.full((4, 3), jnp.nan, jnp.float32)
    for fn in (lambda: xj.gemm(a, b, c, beta=0.0), lambda: jax.jit(lambda c: xj.gemm(a, b, c, beta=0.0))(c),
               lambda: xgemm.gemm(a, b, c, beta=0.0)):
        np.testing.assert_array_equal(np.asarray(fn()), np.full((4, 3), 8.0, np.float32))


def test_gemm_errors_name_the_argument():
    a32, b16 = jnp.ones((2, 3), jnp.float32), jnp.ones((3, 2), jnp.float16)
    with pytest.raises(xgemm.errors.DTypeError, match="cast b"):
        xj.gemm(a32, b16)
    with pytest.raises(xgemm.errors.ShapeError, match=r"a.shape\[-1\]"):
        xj.gemm(jnp.ones((2, 3)), jnp.ones((4, 2)))
    with pytest.raises(xgemm.errors.DTypeError, match="out_dtype"):
        xj.gemm(a32, jnp.ones((3, 2), jnp.float32), out_dtype=jnp.float16)
    with pytest.raises(xgemm.errors.ShapeError, match="c is None"):
        xj.gemm(a32, jnp.ones((3, 2), jnp.float32), beta=1.0)
    with pytest.raises(xgemm.errors.ShapeError, match="broadcast"):
        xj.gemm(a32, jnp.ones((3, 2), jnp.float32), jnp.ones((5, 2), jnp.float32), beta=1.0)
    with pytest.raises(xgemm.errors.ScalarError, match="static"):
        jax.jit(lambda a, s: xj.gemm(a, a.T, alpha=s))(a32, 2.0)


@pytest.mark.parametrize("dtype,shape,axis", [("float32", (5, 33), -1), ("bfloat16", (4, 6, 9), 1),
                                              ("float64", (7, 3), 0), ("float16", (1,), 0)])
def test_softmax_matches_float64_reference(dtype, shape, axis):
    rng = np.random.default_rng(7)
    xv = rng.standard_normal(shape) * 8 + 50          # large values: needs the max shift
    x = as_jax(xv, dtype)
    xr = f64(x)
    e = np.exp(xr - xr.max(axis=axis, keepdims=True))
    ref = e / e.sum(axis=axis, keepdims=True)
    y = xj.softmax(x, axis=axis)
    assert y.dtype == x.dtype
    tol = {"float32": 1e-6, "bfloat16": 8e-3, "float16": 1e-3, "float64": 1e-14}[dtype]
    np.testing.assert_allclose(f64(y), ref, rtol=tol, atol=tol)
    np.testing.assert_array_equal(f64(jax.jit(lambda x: xgemm.softmax(x, axis=axis))(x)), f64(y))


def test_softmax_special_rows_match_jax_nn():
    x = jnp.asarray([[-np.inf] * 4, [0.0, -np.inf, 1.0, -np.inf], [np.nan, 0, 0, 0], [np.inf, 0, 0, 0]], jnp.float32)
    y, ref = np.asarray(xj.softmax(x)), np.asarray(jax.nn.softmax(x))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    assert np.isnan(y[0]).all() and np.isnan(y[2]).all()
    np.testing.assert_allclose(y[1], ref[1], rtol=1e-6)
    assert xj.softmax(jnp.ones((0, 5), jnp.float32)).shape == (0, 5)


# ---------------------------------------------------------------------------------------------
# grad

def _ref_gemm(a, b, c, alpha, beta):
    return alpha * jnp.matmul(a, b, precision="highest") + (beta * c if c is not None else 0)


@pytest.mark.parametrize("a_shape,b_shape,c_shape", [((6, 5), (5, 4), (4,)), ((2, 1, 6, 5), (3, 5, 4), (1, 6, 4)),
                                                     ((3, 6, 5), (5, 4), (3, 6, 4)), ((6, 5), (2, 5, 4), None)])
def test_gemm_grad_matches_jnp(a_shape, b_shape, c_shape):
    rng = np.random.default_rng(3)
    a, b = jnp.asarray(rng.standard_normal(a_shape)), jnp.asarray(rng.standard_normal(b_shape))
    c = jnp.asarray(rng.standard_normal(c_shape)) if c_shape else None
    beta = 0.75 if c is not None else 0.0
    w = jnp.asarray(rng.standard_normal(np.broadcast_shapes(a_shape[:-1], b_shape[:-2] + (1,))[:-1] + (a_shape[-2], b_shape[-1])))

    def loss(fn):
        return lambda a, b, c: jnp.sum(jnp.sin(fn(a, b, c, -1.5, beta)) * w)
    argnums = (0, 1, 2) if c is not None else (0, 1)
    got = jax.jit(jax.grad(loss(lambda a, b, c, al, be: xj.gemm(a, b, c, alpha=al, beta=be)), argnums))(a, b, c)
    want = jax.jit(jax.grad(loss(_ref_gemm), argnums))(a, b, c)
    for g, r in zip(got, want):
        assert g.shape == r.shape and g.dtype == r.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-12, atol=1e-12)


def test_gemm_second_order_and_half_grad():
    rng = np.random.default_rng(4)
    a, b = jnp.asarray(rng.standard_normal((2, 3))), jnp.asarray(rng.standard_normal((3, 2)))
    f = lambda a: jnp.sum(xj.gemm(a, b) ** 3)
    fr = lambda a: jnp.sum(jnp.matmul(a, b, precision="highest") ** 3)
    # reverse over reverse (custom_vjp has no forward mode, so not jax.hessian)
    hess = lambda f: jax.jit(jax.jacrev(jax.jacrev(f)))(a)
    np.testing.assert_allclose(np.asarray(hess(f)), np.asarray(hess(fr)), rtol=1e-10)
    a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    g = jax.jit(jax.grad(lambda a: jnp.sum(xj.gemm(a, b16, out_dtype=jnp.float32))))(a16)
    assert g.dtype == jnp.bfloat16
    np.testing.assert_allclose(f64(g), np.ones((2, 2)) @ f64(b16).T, rtol=1e-2)


def test_softmax_grad_matches_jnp():
    rng = np.random.default_rng(5)
    x, w = jnp.asarray(rng.standard_normal((3, 4, 7))), jnp.asarray(rng.standard_normal((3, 4, 7)))
    for axis in (-1, 1):
        got = jax.jit(jax.grad(lambda x: jnp.sum(xj.softmax(x, axis) * w)))(x)
        want = jax.jit(jax.grad(lambda x: jnp.sum(jax.nn.softmax(x, axis) * w)))(x)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------------------------------
# vmap: one batched primitive, never a loop

def _count(f, *args, name="xgemm_gemm"):
    return str(jax.make_jaxpr(f)(*args)).count(name + "[")


def test_vmap_folds_into_one_batched_call():
    rng = np.random.default_rng(6)
    A, B, C = ints(rng, (2, 3, 4, 5)), ints(rng, (5, 6)), ints(rng, (3, 4, 6))
    f = jax.vmap(jax.vmap(lambda a, b, c: xj.gemm(a, b, c, alpha=2.0, beta=1.0), in_axes=(0, None, 0)),
                 in_axes=(0, None, None))
    args = (jnp.asarray(A), jnp.asarray(B), jnp.asarray(C))
    np.testing.assert_array_equal(np.asarray(f(*args)), 2 * A @ B + C)
    assert _count(f, *args) == 1
    # vmap over B only, over C only, and with the batch axis elsewhere
    B3 = ints(rng, (5, 7, 6))
    g = jax.vmap(lambda b: xj.gemm(jnp.asarray(A[0, 0]), b), in_axes=1)
    np.testing.assert_array_equal(np.asarray(g(jnp.asarray(B3))), A[0, 0] @ np.moveaxis(B3, 1, 0))
    h = jax.vmap(lambda c: xj.gemm(jnp.asarray(A[0, 0]), jnp.asarray(B), c, beta=-1.0))
    np.testing.assert_array_equal(np.asarray(h(jnp.asarray(C))), A[0, 0] @ B - C)
    assert _count(h, jnp.asarray(C)) == 1


def test_vmap_of_grad_and_softmax():
    rng = np.random.default_rng(8)
    A, B = jnp.asarray(rng.standard_normal((4, 3, 5))), jnp.asarray(rng.standard_normal((5, 2)))
    got = jax.jit(jax.vmap(jax.grad(lambda a: jnp.sum(xj.gemm(a, B) ** 2))))(A)
    want = jax.jit(jax.vmap(jax.grad(lambda a: jnp.sum(jnp.matmul(a, B, precision="highest") ** 2))))(A)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12)
    X = jnp.asarray(rng.standard_normal((2, 3, 4, 5)))
    s = jax.vmap(jax.vmap(lambda x: xj.softmax(x, 0), in_axes=2), in_axes=1)
    sr = jax.jit(jax.vmap(jax.vmap(lambda x: jax.nn.softmax(x, 0), in_axes=2), in_axes=1))
    np.testing.assert_allclose(np.asarray(jax.jit(s)(X)), np.asarray(sr(X)), rtol=1e-12)
    assert _count(s, X, name="xgemm_softmax") == 1


# ---------------------------------------------------------------------------------------------
# export, explain, eager == jit

@pytest.mark.parametrize("axis", [0, -1])
def test_softmax_forward_mode_and_hessian_match_jax_nn(axis):
    """softmax is a custom_jvp (its tangent transposed for grad): jvp, jacfwd and hessian work, as
    jax.nn.softmax's do."""
    x = jax.random.normal(jax.random.key(0), (4, 7))
    t, w = jax.random.normal(jax.random.key(1), (4, 7)), jax.random.normal(jax.random.key(2), (4, 7))
    ours, ref = (lambda x: xj.softmax(x, axis=axis)), (lambda x: jax.nn.softmax(x, axis=axis))
    np.testing.assert_allclose(jax.jvp(ours, (x,), (t,))[1], jax.jvp(ref, (x,), (t,))[1], atol=1e-6)
    hess = [jax.jit(jax.hessian(lambda x, f=f: jnp.sum(f(x) * w)))(x) for f in (ours, ref)]
    np.testing.assert_allclose(hess[0], hess[1], atol=1e-6)
    grads = [jax.grad(lambda x, f=f: jnp.sum(f(x) * w))(x) for f in (ours, ref)]
    np.testing.assert_allclose(grads[0], grads[1], atol=1e-6)


def test_export_round_trip_cpu():
    export = pytest.importorskip("jax.export")
    pytest.importorskip("flatbuffers")
    rng = np.random.default_rng(9)
    a, b = jnp.asarray(ints(rng, (3, 8, 16)), jnp.float32), jnp.asarray(ints(rng, (16, 4)), jnp.float32)
    f = jax.jit(lambda a, b: xj.softmax(xj.gemm(a, b, alpha=0.25), axis=-1))
    exp = export.export(f, disabled_checks=xj.export_disabled_safety_checks(include_cutlass=False))(a, b)
    back = export.deserialize(exp.serialize(vjp_order=1))
    np.testing.assert_array_equal(np.asarray(back.call(a, b)), np.asarray(f(a, b)))
    g = jax.grad(lambda a: jnp.sum(back.call(a, b) * jnp.arange(4.0, dtype=jnp.float32)))(a)   # vjp of the export
    gr = jax.grad(lambda a: jnp.sum(f(a, b) * jnp.arange(4.0, dtype=jnp.float32)))(a)
    # the export's vjp and jax.grad transpose softmax's jvp each in its own order: float32 rounding apart
    np.testing.assert_allclose(np.asarray(g), np.asarray(gr), rtol=1e-6, atol=1e-6 * float(jnp.abs(gr).max()))


def test_explain_uses_the_dispatch_table():
    a, b = jnp.ones((3, 4, 5), jnp.float32), jnp.ones((5, 6), jnp.float32)
    plan = xgemm.explain(a, b)
    assert plan.kernel_name == "reference" and plan.problem.framework == "jax"
    assert xgemm.explain(jnp.ones((4, 8), jnp.float32)).kernel_name == "reference"


def test_eager_arrays_run_the_primitive():
    # eager calls go through the same primitive (a cached jit of it), not through another framework
    a, b = jnp.ones((4, 5), jnp.float32), jnp.ones((5, 3), jnp.float32)
    d = xj.gemm(a, b)
    assert isinstance(d, jax.Array)
    fn = xj._eager_gemm(xj.GemmConfig(alpha=1.0, beta=0.0, out_dtype="float32"), False)
    assert "xgemm_gemm" in str(jax.make_jaxpr(fn)(a, b))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_batched_half_products_under_x64_on_the_cpu_default(dtype):
    """XLA:CPU's dot refuses some batched bf16 x bf16 -> f32 products with x64 on ("Unsupported
    element type for DotThunk"; found by benchmarks/fuzz.py): the embedded default widens first."""
    rng = np.random.default_rng(0)
    a, b, c = ints(rng, (64, 3)), ints(rng, (2, 2, 2048, 64)), ints(rng, (2048,))
    with jax.enable_x64(True):
        d = jax.jit(lambda a, b, c: xj.gemm(a.T, b.swapaxes(-1, -2), c, alpha=-2.0, beta=1.0))(
            as_jax(a, dtype), as_jax(b, dtype), as_jax(c, dtype))
        assert d.dtype == jnp.dtype(dtype)
    ref = -2.0 * np.matmul(a.T, b.swapaxes(-1, -2)) + c
    np.testing.assert_array_equal(f64(d), rounded(ref, dtype))


@pytest.mark.parametrize("forced, words", [("garbage", "is not one of"),
                                            ("cute_sgemm", "cannot run on cpu|is not one of")])   # softmax: not one of its
def test_a_forced_kernel_that_cannot_run_on_the_cpu_raises_for_jax_too(forced, words):
    """NumPy and torch raise for a forced kernel that declines; JAX's CPU lowering (XLA's own op)
    ran anyway. The reference itself stays allowed."""
    from xgemm import errors, policy
    from xgemm.jax import fp8 as jfp8
    x = jnp.ones((4, 8), jnp.float32)
    q, s = jfp8.quantize_fp8(x, "tensor")
    calls = (lambda: xj.matmul(x, x.T), lambda: xj.softmax(x),
             lambda: xj.ragged_dot(x, jnp.ones((2, 8, 3), jnp.float32), jnp.asarray([1, 3], jnp.int32)),
             lambda: jfp8.scaled_matmul(q, q.T, s, s))
    for call in calls:
        with policy.force(forced), pytest.raises(errors.KernelUnavailableError, match=words):
            jax.jit(call)()
    with policy.force("reference"):
        for call in calls:
            jax.jit(call)()


def test_matmul_takes_out_dtype():
    y = xj.matmul(jnp.ones((2, 3), jnp.bfloat16), jnp.ones((3, 4), jnp.bfloat16), out_dtype=jnp.float32)
    assert y.dtype == jnp.float32 and float(y[0, 0]) == 3.0
