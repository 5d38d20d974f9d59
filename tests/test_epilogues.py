"""Epilogues (issue 24's API, composed after the product until a kernel fuses them): every
activation and gating x NumPy / torch / JAX against float64 NumPy, the grads of torch autograd and
jax.grad against the same formulas in float64, torch.compile(fullgraph=True), the typed errors,
explain()'s epilogue line, and core/epilogues.py's derivatives against finite differences."""
from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import np_dtype

import xgemm
from xgemm import errors
from xgemm.core import epilogues

ACTS = epilogues.ACTIVATIONS
GATED = tuple(epilogues.GATED)
_erf = np.vectorize(math.erf)


def act64(x, name):
    """The activations in float64 NumPy, written independently of core/epilogues.py."""
    if name is None:
        return x
    sig = 1 / (1 + np.exp(-x))
    return {"relu": np.maximum(x, 0), "relu2": np.maximum(x, 0) ** 2, "sigmoid": sig, "silu": x * sig,
            "gelu": 0.5 * x * (1 + _erf(x / math.sqrt(2))),
            "gelu_tanh": 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))}[name]


def ref(a, b, c=None, alpha=1.0, beta=0.0, bias=None, activation=None, gated=False):
    h = alpha * (a.astype(np.float64) @ b.astype(np.float64))
    if c is not None and beta:
        h = h + beta * c.astype(np.float64)
    if bias is not None:
        h = h + bias.astype(np.float64)
    if gated:
        n = h.shape[-1] // 2
        return act64(h[..., :n], epilogues.GATED[activation]) * h[..., n:]
    return act64(h, activation)


TOL = {"float64": 1e-12, "float32": 2e-5, "bfloat16": 1.6e-2, "float16": 2e-3}


def data(dtype, m=7, n=10, k=12, seed=0):
    g = np.random.default_rng(seed)
    cast = lambda x: x.astype(np_dtype(dtype))   # noqa: E731
    return (cast(g.standard_normal((m, k)) / 2), cast(g.standard_normal((k, n)) / 2),
            cast(g.standard_normal((m, n))), cast(g.standard_normal(n)))


def check(got, want, dtype):
    got = np.asarray(got, dtype=np.float64)
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype])


def frameworks():
    out = ["numpy"]
    try:
        import torch  # noqa: F401
        out.append("torch")
    except ImportError:
        pass
    try:
        import jax  # noqa: F401
        out.append("jax")
    except ImportError:
        pass
    return out


def to(fw, x):
    if fw == "numpy":
        return x
    if fw == "torch":
        import torch
        if x.dtype.name == "bfloat16":
            return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(x))
    import jax.numpy as jnp
    return jnp.asarray(x)


def host(x):
    if hasattr(x, "detach"):
        import torch
        return x.detach().to(torch.float64).numpy()
    return np.asarray(x).astype(np.float64)


@pytest.mark.parametrize("fw", frameworks())
@pytest.mark.parametrize("activation", (None,) + ACTS)
def test_gemm_epilogue_matches_float64(fw, activation):
    for dtype in ("float32", "float64", "bfloat16"):
        a, b, c, bias = data(dtype)
        d = xgemm.gemm(to(fw, a), to(fw, b), to(fw, c), alpha=0.5, beta=-1.0, bias=to(fw, bias), activation=activation)
        assert str(d.dtype).rsplit(".", 1)[-1] == dtype
        check(host(d), ref(a, b, c, 0.5, -1.0, bias, activation), dtype)


@pytest.mark.parametrize("fw", frameworks())
@pytest.mark.parametrize("activation", GATED)
def test_gated_matches_float64(fw, activation):
    for dtype in ("float32", "float64", "float16"):
        a, b, _, bias = data(dtype, n=12)
        d = xgemm.gated(to(fw, a), to(fw, b), bias=to(fw, bias), activation=activation)
        assert d.shape == (7, 6)
        check(host(d), ref(a, b, bias=bias, activation=activation, gated=True), dtype)


@pytest.mark.parametrize("fw", frameworks())
def test_stacked_layout_is_the_concat_layout_of_the_same_weights(fw):
    """layout="stacked": b [K, 2, H] (gate, up) and bias (2, H) give what the [gate | up] b gives."""
    a, b, _, bias = data("float32", n=12)
    stacked = np.stack([b[:, :6], b[:, 6:]], axis=1)                    # [K, 2, H]
    d = xgemm.gated(to(fw, a), to(fw, stacked), bias=to(fw, bias.reshape(2, 6)), layout="stacked")
    check(host(d), ref(a, b, bias=bias, activation="swiglu", gated=True), "float32")


def test_stacked_layout_grads_in_torch():
    torch = pytest.importorskip("torch")
    a, b, _, bias = data("float64", n=12)
    stacked = torch.from_numpy(np.stack([b[:, :6], b[:, 6:]], axis=1)).requires_grad_()
    concat = torch.from_numpy(b).requires_grad_()
    ta = torch.from_numpy(a)
    xgemm.gated(ta, stacked, layout="stacked").sum().backward()
    xgemm.gated(ta, concat).sum().backward()
    g = stacked.grad.numpy()
    np.testing.assert_allclose(np.concatenate([g[:, 0], g[:, 1]], axis=1), concat.grad.numpy(), rtol=1e-12)


def test_interleaved_weights_map_onto_gate_up():
    """The docstring's reshape of [g0, u0, g1, u1, ...] columns gives the [gate | up] layout."""
    a, b, _, _ = data("float64", n=12)
    inter = np.stack([b[:, :6], b[:, 6:]], axis=-1).reshape(12, 12)      # g0, u0, g1, u1, ...
    mapped = inter.reshape(12, 6, 2).swapaxes(-1, -2).reshape(12, 12)
    np.testing.assert_array_equal(mapped, b)


def test_out_and_the_result_dtype():
    a, b, c, bias = data("bfloat16")
    import ml_dtypes
    out = np.full((7, 10), np.nan, np.float32)
    assert xgemm.gemm(a, b, bias=bias, activation="silu", out=out) is out
    check(out, ref(a, b, bias=bias, activation="silu"), "float32")
    assert xgemm.gemm(a, b, bias=bias.astype(np.float32), activation="relu").dtype == ml_dtypes.bfloat16


def test_explain_shows_the_epilogue():
    a, b, _, bias = data("float32", n=12)
    text = str(xgemm.explain(a, b, bias=bias, activation="gelu_tanh"))
    assert "epilogue: bias + gelu_tanh, composed after the product in numpy ops (float32" in text, text
    text = str(xgemm.explain(a, b, op="gated", activation="geglu"))
    assert "gemm 7x12x12" in text and "epilogue: geglu (act(gate) * up)" in text, text


@pytest.mark.parametrize("call, words", [
    (lambda a, b, v: xgemm.gemm(a, b, activation="swish"), ["activation='swish'", "gelu_tanh", "or None"]),
    (lambda a, b, v: xgemm.gemm(a, b, activation="swiglu"), ["xgemm.gated(a, b, activation=...)"]),
    (lambda a, b, v: xgemm.gated(a, b, activation="relu"), ["swiglu", "xgemm.gemm(a, b, activation=...)"]),
    (lambda a, b, v: xgemm.gemm(a, b, bias=v[:3]), ["bias has shape (3,)", "pass shape (10,)"]),
    (lambda a, b, v: xgemm.gemm(a, b, bias=v.astype(np.float64)), ["bias is float64", "float32"]),
    (lambda a, b, v: xgemm.gated(a, b[:, :9]), ["9 columns", "even"]),
    (lambda a, b, v: xgemm.gemm(a, b[:, 0], bias=v[:1]), ["b is 1-D", "b[:, None]"]),
    (lambda a, b, v: xgemm.gated(a, b, layout="stacked"), ["layout='stacked' takes b [..., K, 2, H]"]),
    (lambda a, b, v: xgemm.gated(a, b.reshape(12, 2, 5), bias=v, layout="stacked"), ["bias has shape (10,)", "(2, 5)"]),
    (lambda a, b, v: xgemm.gated(a, b, layout="pairs"), ["layout='pairs'", "'concat'", "'stacked'"]),
])
def test_typed_errors(call, words):
    a, b, _, bias = data("float32")
    with pytest.raises(errors.XgemmError) as info:
        call(a, b, bias)
    for w in words:
        assert w in str(info.value), str(info.value)


@pytest.mark.parametrize("activation", (None,) + ACTS)
def test_derivatives_match_finite_differences(activation):
    import array_api_compat.numpy as xp
    x = np.linspace(-3.0, 3.0, 61) + 0.013          # off the kinks of relu
    h = 1e-6
    fd = (epilogues.apply(xp, x + h, activation) - epilogues.apply(xp, x - h, activation)) / (2 * h)
    np.testing.assert_allclose(epilogues.derivative(xp, x, activation), fd, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(epilogues.apply(xp, x, activation), act64(x, activation), rtol=1e-12)


def test_torch_autograd_and_compile():
    torch = pytest.importorskip("torch")
    a, b, c, bias = (torch.from_numpy(x.astype(np.float64)) for x in data("float64", n=12))
    for fn, kw in ((xgemm.gemm, dict(activation="gelu_tanh")), (xgemm.gated, dict(activation="swiglu"))):
        leaves = [x.clone().requires_grad_() for x in (a, b, bias)]
        y = fn(leaves[0], leaves[1], bias=leaves[2], **kw)
        y.sum().backward()
        ref_leaves = [x.clone().requires_grad_() for x in (a, b, bias)]
        h = ref_leaves[0] @ ref_leaves[1] + ref_leaves[2]
        if fn is xgemm.gated:
            yr = torch.nn.functional.silu(h[:, :6]) * h[:, 6:]
        else:
            yr = torch.nn.functional.gelu(h, approximate="tanh")
        yr.sum().backward()
        torch.testing.assert_close(y, yr)
        for got, want in zip(leaves, ref_leaves):
            torch.testing.assert_close(got.grad, want.grad)
    torch._dynamo.reset()
    f = torch.compile(lambda a, b, v: xgemm.gated(a, b, bias=v, activation="reglu") + xgemm.gemm(
        a, b, bias=v, activation="relu2")[:, :6], fullgraph=True)
    a32, b32, v32 = a.float(), b.float(), bias.float()
    h = a32 @ b32 + v32
    torch.testing.assert_close(f(a32, b32, v32), torch.relu(h[:, :6]) * h[:, 6:] + torch.relu(h[:, :6]) ** 2)


def test_jax_grad_vmap_jit():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import xgemm.jax as xj
    a, b, _, bias = (jnp.asarray(x) for x in data("float64", n=12))

    def ours(a, b, v):
        return (xj.gated(a, b, bias=v, activation="geglu") ** 2).sum()

    def theirs(a, b, v):
        h = jnp.matmul(a, b, precision="highest") + v
        return ((jax.nn.gelu(h[:, :6], approximate=False) * h[:, 6:]) ** 2).sum()
    with jax.enable_x64(True):
        got = jax.jit(jax.grad(ours, argnums=(0, 1, 2)))(a, b, bias)
        want = jax.grad(theirs, argnums=(0, 1, 2))(a, b, bias)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-10, atol=1e-10)
        batched = jax.vmap(lambda x: xj.gemm(x, b, bias=bias, activation="sigmoid"))(jnp.stack([a, 2 * a]))
        np.testing.assert_allclose(np.asarray(batched[1]), ref(2 * np.asarray(a), np.asarray(b), bias=np.asarray(bias),
                                                               activation="sigmoid"), rtol=1e-12)
        stacked = jnp.stack([b[:, :6], b[:, 6:]], axis=1)                 # [K, 2, H]
        st = jax.jit(jax.vmap(lambda x: xj.gated(x, stacked, bias=bias.reshape(2, 6), layout="stacked")))
        np.testing.assert_allclose(np.asarray(st(jnp.stack([a, 2 * a]))[1]),
                                   ref(2 * np.asarray(a), np.asarray(b), bias=np.asarray(bias), activation="swiglu",
                                       gated=True), rtol=1e-12)
        g_st = jax.grad(lambda w: (xj.gated(a, w, layout="stacked", activation="geglu") ** 2).sum())(stacked)
        g_cc = jax.grad(lambda w: (xj.gated(a, w, activation="geglu") ** 2).sum())(b)
        np.testing.assert_allclose(np.concatenate([g_st[:, 0], g_st[:, 1]], axis=1), np.asarray(g_cc), rtol=1e-12)


def test_out_under_torch_compile():
    """out= inside a torch.compile trace (the eager checks are skipped there) still writes out."""
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    f = torch.compile(lambda a, b, v, o: xgemm.gemm(a, b, bias=v, activation="relu", out=o))
    a, b, v, o = torch.randn(4, 8), torch.randn(8, 6), torch.randn(6), torch.full((4, 6), float("nan"))
    f(a, b, v, o)
    torch.testing.assert_close(o, torch.relu(a @ b + v))


def test_explain_takes_the_stacked_gated_layout():
    import xgemm
    a, b = np.ones((8, 16), np.float32), np.ones((16, 2, 24), np.float32)
    plan = xgemm.explain(a, b, op="gated", layout="stacked", bias=np.zeros((2, 24), np.float32))
    assert plan.problem.n == 48 and "swiglu" in plan.epilogue          # the concat call it runs
    jnp = pytest.importorskip("jax.numpy")
    plan = xgemm.explain(jnp.asarray(a), jnp.asarray(b), op="gated", layout="stacked")
    assert plan.problem.n == 24 and "this product twice" in plan.epilogue   # JAX: two half products
