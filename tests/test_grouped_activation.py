"""The grouped products' activation (issue 23 takes issue 24's epilogues): xgemm.ragged_dot /
grouped_mm(..., activation=) on NumPy, torch and JAX, against float64 references written with
torch.nn.functional (apart from xgemm's own formulas): values with empty groups and rows in no
group, the gated halves, gradients through torch autograd and jax.grad, torch.compile, explain()
and the typed errors."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import FRAMEWORKS, make

import xgemm
from xgemm import errors

torch = pytest.importorskip("torch")
F = torch.nn.functional

# T = 23 rows: groups of 4, 0, 9 and 6 rows, rows 19..22 in no group
SIZES = [4, 0, 9, 6]
T, K, N = 23, 6, 10


def act_ref(p: "torch.Tensor", activation: str) -> "torch.Tensor":
    """float64 reference of the activation (or gate) of the product p, from torch.nn.functional."""
    plain = {"relu": F.relu, "relu2": lambda x: F.relu(x) ** 2, "gelu": F.gelu,
             "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "sigmoid": torch.sigmoid}
    gate = {"swiglu": F.silu, "geglu": F.gelu, "reglu": F.relu}
    if activation in gate:
        h = p.shape[-1] // 2
        return gate[activation](p[..., :h]) * p[..., h:]
    return plain[activation](p)


def product_ref(lhs: "torch.Tensor", rhs: "torch.Tensor", sizes) -> "torch.Tensor":
    """float64 loop of per-group products; rows in no group zero (differentiable)."""
    rows, start = [], 0
    for e, size in enumerate(sizes):
        rows.append(lhs[start:start + size].double() @ rhs[e].double())
        start += size
    rows.append(torch.zeros(lhs.shape[0] - start, rhs.shape[-1], dtype=torch.float64))
    return torch.cat(rows)


def operands(seed: int = 0):
    rng = np.random.default_rng(seed)
    # small values: the activations' curved parts, not only their tails
    return rng.integers(-3, 4, (T, K)) / 4.0, rng.integers(-3, 4, (len(SIZES), K, N)) / 4.0


def index(values, fw):
    v = np.asarray(values, np.int32)
    if fw == "torch":
        return torch.from_numpy(v)
    if fw == "jax":
        import jax.numpy as jnp
        return jnp.asarray(v)
    return v


def to_f64(x) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        return x.detach().double().numpy()
    return np.asarray(x).astype(np.float64)


@pytest.mark.parametrize("fw", FRAMEWORKS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("activation", ["relu2", "gelu", "gelu_tanh", "silu", "sigmoid", "swiglu", "geglu", "reglu"])
@pytest.mark.parametrize("entry", ["ragged_dot", "grouped_mm"])
def test_values_match_the_activated_loop_of_matmuls(fw, dtype, activation, entry):
    lhs, rhs = operands()
    index_values = SIZES if entry == "ragged_dot" else np.cumsum(SIZES)
    call = getattr(xgemm, entry)
    out = call(make(lhs, fw, dtype), make(rhs, fw, dtype), index(index_values, fw), activation=activation)
    want = act_ref(product_ref(torch.from_numpy(lhs), torch.from_numpy(rhs), SIZES), activation).numpy()
    gated = activation in ("swiglu", "geglu", "reglu")
    assert out.shape == (T, N // 2 if gated else N) and str(out.dtype).endswith(dtype)
    assert type(out).__module__.split(".")[0] == type(make(lhs, fw, dtype)).__module__.split(".")[0]
    # the product is exact in float32; the activation runs in float32, then one rounding
    rtol, atol = (1e-2, 1e-2) if dtype == "bfloat16" else (1e-5, 1e-6)
    np.testing.assert_allclose(to_f64(out), want, rtol=rtol, atol=atol)
    # rows in no group hold act(0): zero, and sigmoid's 0.5
    np.testing.assert_array_equal(to_f64(out)[sum(SIZES):], 0.5 if activation == "sigmoid" else 0.0)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_torch_autograd_matches_float64(dtype, tol, activation):
    lhs, rhs = operands(1)
    x = torch.from_numpy(lhs).to(getattr(torch, dtype)).requires_grad_()
    w = torch.from_numpy(rhs).to(getattr(torch, dtype)).requires_grad_()
    y = xgemm.ragged_dot(x, w, index(SIZES, "torch"), activation=activation)
    dy = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
    y.backward(dy.to(y.dtype))
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    act_ref(product_ref(xr, wr, SIZES), activation).backward(dy.double())
    for got, want in ((y, act_ref(product_ref(xr, wr, SIZES), activation)), (x.grad, xr.grad), (w.grad, wr.grad)):
        want = to_f64(want)
        np.testing.assert_allclose(to_f64(got), want, rtol=tol, atol=tol * np.abs(want).max())


def test_torch_compile_fullgraph_matches_eager():
    lhs, rhs = operands(2)
    x, w = torch.from_numpy(lhs).bfloat16(), torch.from_numpy(rhs).bfloat16()
    offs = torch.tensor(np.cumsum(SIZES), dtype=torch.int32)
    compiled = torch.compile(lambda x, w: xgemm.grouped_mm(x, w, offs, activation="swiglu"), fullgraph=True)
    torch.testing.assert_close(compiled(x, w), xgemm.grouped_mm(x, w, offs, activation="swiglu"), rtol=0, atol=0)


@pytest.mark.parametrize("activation", ["silu", "swiglu"])
def test_jax_grad_in_jit_matches_jax_lax_ragged_dot(activation):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import xgemm.jax as xj
    lhs, rhs = (jnp.asarray(v, jnp.float32) for v in operands(3))
    sizes = jnp.asarray(SIZES, jnp.int32)

    def ref(a, b):
        p = jax.lax.ragged_dot(a, b, sizes)
        if activation == "swiglu":
            return jax.nn.silu(p[:, :N // 2]) * p[:, N // 2:]
        return jax.nn.silu(p)

    weights = jnp.linspace(-1.0, 1.0, T * N).reshape(T, N)[:, :N // 2 if activation == "swiglu" else N]
    for call in (xgemm.ragged_dot, xj.ragged_dot):
        def loss(a, b, f):
            return jnp.sum(f(a, b) * weights)
        got = jax.jit(jax.grad(lambda a, b: loss(a, b, lambda a, b: call(a, b, sizes, activation=activation)),
                               argnums=(0, 1)))(lhs, rhs)
        want = jax.grad(lambda a, b: loss(a, b, ref), argnums=(0, 1))(lhs, rhs)
        for g, r in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.jit(lambda a, b: xj.grouped_mm(a, b, jnp.cumsum(sizes),
                                                                                activation=activation))(lhs, rhs)),
                               np.asarray(ref(lhs, rhs)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_typed_errors_name_the_argument_and_the_fix(fw):
    lhs, rhs = operands()
    with pytest.raises(errors.EpilogueError, match="activation='tanh'; use one of .*swiglu"):
        xgemm.ragged_dot(make(lhs, fw, "float32"), make(rhs, fw, "float32"), index(SIZES, fw), activation="tanh")
    odd = make(rhs[..., :N - 1], fw, "float32")
    with pytest.raises(errors.ShapeError, match="gates the first half of w's 9 columns.*even last dim"):
        xgemm.grouped_mm(make(lhs, fw, "float32"), odd, index(np.cumsum(SIZES), fw), activation="geglu")


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_explain_names_the_epilogue(fw):
    lhs, rhs = operands()
    text = xgemm.explain(make(lhs, fw, "float32"), make(rhs, fw, "float32"), index(SIZES, fw), op="ragged_dot",
                         activation="swiglu")
    assert text.startswith("ragged_dot") and "epilogue: swiglu (act(gate) * up), composed after the product" in text
    # the product is planned in float32, as it runs
    assert "float32->float32" in text


def test_jax_vmap_over_a_batch_of_token_blocks():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    rng = np.random.default_rng(4)
    blocks = jnp.asarray(rng.integers(-3, 4, (3, T, K)) / 4.0, jnp.float32)
    rhs = jnp.asarray(operands()[1], jnp.float32)
    sizes = jnp.asarray(SIZES, jnp.int32)
    got = jax.vmap(lambda a: xgemm.ragged_dot(a, rhs, sizes, activation="swiglu"))(blocks)
    for a, y in zip(blocks, got):
        want = act_ref(product_ref(torch.tensor(np.asarray(a)), torch.tensor(np.asarray(rhs)), SIZES),
                       "swiglu").numpy()
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("entry", ["ragged_dot", "grouped_mm"])
def test_eager_half_calls_ask_for_the_fused_class_first(entry, monkeypatch):
    """Eager torch fp16/bf16 calls without autograd ask grouped.run_fused (the grouped class with
    the gate in its epilogue) and return what it runs; where it declines (None: no CUDA kernel
    takes the problem, as here on the CPU) or autograd needs the op, the activation is composed."""
    from xgemm import grouped
    lhs, rhs = operands()
    asked = []

    def fused(op, a, b, idx, out_dtype, activation, *, fn, plan_only=False):
        asked.append((op, out_dtype, activation, fn, plan_only))
        return None if len(asked) > 1 else "ran fused"
    monkeypatch.setattr(grouped, "run_fused", fused)
    idx = index(SIZES if entry == "ragged_dot" else np.cumsum(SIZES), "torch")
    x, w = make(lhs, "torch", "bfloat16"), make(rhs, "torch", "bfloat16")
    call = getattr(xgemm, entry)
    assert call(x, w, idx, activation="swiglu") == "ran fused"
    assert asked == [(entry, "bfloat16", "swiglu", entry, False)]
    y = call(x, w, idx, activation="swiglu", out_dtype="float32")          # declined: composed
    assert asked[-1][1] == "float32" and y.shape == (T, N // 2) and y.dtype == torch.float32
    want = act_ref(product_ref(torch.tensor(lhs).bfloat16(), torch.tensor(rhs).bfloat16(), SIZES), "swiglu")
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
    n = len(asked)
    call(x.requires_grad_(), w, idx, activation="swiglu")                 # autograd: composed, not asked
    call(make(lhs, "torch", "float32"), make(rhs, "torch", "float32"), idx, activation="swiglu")   # fp32: composed
    assert len(asked) == n


def test_run_fused_declines_where_no_kernel_fuses():
    """On the CPU the grouped plan is the reference, so run_fused declines (the caller composes); it
    declines JAX arrays and the variable-K product outright."""
    from xgemm import grouped
    lhs, rhs = operands()
    x, w = make(lhs, "torch", "bfloat16"), make(rhs, "torch", "bfloat16")
    offs = index(np.cumsum(SIZES), "torch")
    assert grouped.run_fused("grouped_mm", x, w, offs, None, "swiglu", fn="grouped_mm") is None
    assert grouped.run_fused("grouped_mm", x, w, offs, None, "swiglu", fn="explain", plan_only=True) is None
    dy = make(np.ones((T, N)), "torch", "bfloat16")
    assert grouped.run_fused("grouped_mm", x.T, dy, offs, None, "gelu", fn="grouped_mm") is None      # variable K
