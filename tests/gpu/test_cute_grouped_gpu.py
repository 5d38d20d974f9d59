"""cute_gemm_sm90's grouped class (rows mode) on the H200, through the kernel protocol at each of
its policy's candidate configs: integer operands (every product and sum exact in float32, so the
only error is the final rounding) against float64 per group, into NaN-poisoned results; group
sizes empty, one row, off the tile, skewed, summing below and above T (rows in no group are
zeros); B N- and K-major; a CUDA graph replayed with the sizes changed in place."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from xgemm import arrays, grouped  # noqa: E402
from xgemm.kernels import cute_gemm_sm90 as K90  # noqa: E402

pytestmark = pytest.mark.gpu
DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
SIZES = {"edges": [0, 1, 300, 129, 0, 383], "below_t": [100, 0, 7], "above_t": [700, 700],
         "one_group": [1000], "tail_rows": [1, 0, 127, 128, 129, 255, 2], "zipf256": "zipf"}


def _ints(shape, gen, dtype):
    return torch.randint(-2, 3, shape, generator=gen).to(DT[dtype]).cuda()


def _sizes(name, t, rng):
    if SIZES[name] != "zipf":
        return np.array(SIZES[name])
    p = 1.0 / np.arange(1, 193) ** 1.2
    sizes = np.concatenate([rng.multinomial(t, p / p.sum()), np.zeros(64, int)])
    rng.shuffle(sizes)
    return sizes


def _want(x, w, sizes, n, dtype):
    """float64 per group, rows in no group zero, rounded once to the result's dtype."""
    t = x.shape[0]
    want = torch.zeros(t, n, dtype=torch.float64, device="cuda")
    row0 = 0
    for g, end in enumerate(np.cumsum(sizes).tolist()):
        end = max(min(end, t), row0)
        want[row0:end] = x[row0:end].double() @ w[g].double()
        row0 = end
    return want.to(DT[dtype]).double()


def _run(x, w, offs, cfg, out_dtype=None, y=None):
    """The grouped class at `cfg` through the kernel protocol, into a NaN-filled result."""
    c = grouped.check_grouped_mm(x, w, offs, out_dtype)
    plan, va, vb, moves = grouped._plan(c)
    assert moves == (None, None)
    assert K90.GROUPED.supports(plan.problem) is None
    if y is None:
        y = torch.full(c.shape.out, float("nan"), dtype=DT[c.out_dtype], device="cuda")
    K90.GROUPED.run(plan.problem, cfg.policy(), (va, vb, arrays.view(offs, "offs", "test")),
                    arrays.view(y, "out", "test"), torch.cuda.current_stream().cuda_stream)
    return y


@pytest.mark.parametrize("cfg", K90.GROUPED_CONFIGS, ids=lambda c: f"{c.tile_m}x{c.tile_n}_{c.cluster_m}x{c.cluster_n}")
@pytest.mark.parametrize("sizes", list(SIZES), ids=str)
@pytest.mark.parametrize("b_col", [False, True], ids=["b_nmajor", "b_kmajor"])
def test_grouped_class_matches_float64(cfg, sizes, b_col):
    rng = np.random.default_rng(5)
    t, k, n = (4096, 256, 520) if sizes == "zipf256" else (1000, 264, 2056)
    sizes = _sizes(sizes, t, rng)
    gen = torch.Generator().manual_seed(len(sizes))
    x = _ints((t, k), gen, "bfloat16")
    w = _ints((len(sizes), k, n), gen, "bfloat16")
    w = w.transpose(1, 2).contiguous().transpose(1, 2) if b_col else w
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
    got = _run(x, w, offs, cfg)
    torch.testing.assert_close(got.double(), _want(x, w, sizes, n, "bfloat16"), rtol=0, atol=0)


@pytest.mark.parametrize("dtype,out", [("float16", "float16"), ("float16", "float32"), ("bfloat16", "float32")])
def test_grouped_class_dtypes(dtype, out):
    sizes = [0, 1, 300, 129, 0, 383]
    t, k, n = 1000, 136, 136
    gen = torch.Generator().manual_seed(7)
    x, w = _ints((t, k), gen, dtype), _ints((len(sizes), k, n), gen, dtype)
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
    got = _run(x, w, offs, K90.GROUPED_CONFIGS[0], out)
    torch.testing.assert_close(got.double(), _want(x, w, sizes, n, out), rtol=0, atol=0)


def test_grouped_class_a_million_rows_over_256_groups():
    rng = np.random.default_rng(6)
    e, t, k, n = 256, 1_000_000, 64, 128
    sizes = rng.multinomial(t, rng.dirichlet(np.ones(e) * 0.3))
    gen = torch.Generator().manual_seed(6)
    x, w = _ints((t, k), gen, "bfloat16"), _ints((e, k, n), gen, "bfloat16")
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
    got = _run(x, w, offs, K90.GROUPED_CONFIGS[0])
    torch.testing.assert_close(got.double(), _want(x, w, sizes, n, "bfloat16"), rtol=0, atol=0)


def test_grouped_class_graph_replays_with_new_sizes():
    """The sizes are read on the device: a captured launch, replayed after the offsets changed in
    place, computes the new grouping."""
    gen = torch.Generator().manual_seed(2)
    t, k, n = 512, 128, 256
    x, w = _ints((t, k), gen, "bfloat16"), _ints((4, k, n), gen, "bfloat16")
    offs = torch.tensor(np.cumsum([100, 200, 0, 212]), dtype=torch.int32, device="cuda")
    y = _run(x, w, offs, K90.GROUPED_CONFIGS[0])       # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _run(x, w, offs, K90.GROUPED_CONFIGS[0], y=y)
    for sizes in ([100, 200, 0, 212], [0, 512, 0, 0], [33, 1, 77, 300]):
        offs.copy_(torch.tensor(np.cumsum(sizes), dtype=torch.int32))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y.double(), _want(x, w, sizes, n, "bfloat16"), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["int32", "int64", "strided", "offset"])
def test_routed_call_reads_or_copies_the_offsets(kind):
    """xgemm.grouped_mm reads dense, 16-byte aligned int32 offsets in place and copies any others
    (int64, a strided or a 4-byte offset view) to the kernels' int32: the same result each way."""
    import xgemm
    sizes = [300, 0, 129, 595]
    t, k, n = 1024, 128, 264
    gen = torch.Generator().manual_seed(5)
    x, w = _ints((t, k), gen, "bfloat16"), _ints((len(sizes), k, n), gen, "bfloat16")
    ends = torch.tensor(np.cumsum(sizes), dtype=torch.int32)
    if kind == "int64":
        offs = ends.long().cuda()
    elif kind == "strided":
        offs = torch.stack([ends, -ends], 1).cuda()[:, 0]
    elif kind == "offset":
        offs = torch.cat([ends[:1], ends]).cuda()[1:]
    else:
        offs = ends.cuda()
    got = xgemm.grouped_mm(x, w, offs)
    torch.testing.assert_close(got.double(), _want(x, w, sizes, n, "bfloat16"), rtol=0, atol=0)


_GATE = {"swiglu": torch.nn.functional.silu, "geglu": torch.nn.functional.gelu, "reglu": torch.relu}


def _want_activated(x, w, sizes, activation, dtype):
    """The float64 product (rows in no group zero), then the activation or the gate of its
    [gate | up] halves in float64, rounded once to the result's dtype."""
    pre = _want(x, w, sizes, w.shape[-1], "float32")       # exact: integer operands, K small
    if activation in _GATE:
        h = pre.shape[1] // 2
        y = _GATE[activation](pre[:, :h]) * pre[:, h:]
    else:
        y = {"gelu": torch.nn.functional.gelu, "sigmoid": torch.sigmoid, "relu": torch.relu}[activation](pre)
    return y.to(DT[dtype]).double()


def _run_fused(x, w, offs, activation, cfg):
    """The grouped class fusing `activation`, at `cfg`, through the kernel protocol, into a NaN-filled result."""
    c = grouped.check_grouped_mm(x, w, offs)
    plan, va, vb, moves = grouped._plan(c, activation)
    assert moves == (None, None) and plan.kernel is K90.GROUPED, plan
    problem = plan.problem
    assert K90.GROUPED.supports(problem) is None
    y = torch.full(problem.out_shape, float("nan"), dtype=DT[c.out_dtype], device="cuda")
    K90.GROUPED.run(problem, cfg.policy(), (va, vb, arrays.view(offs, "offs", "test")),
                    arrays.view(y, "out", "test"), torch.cuda.current_stream().cuda_stream)
    return y


@pytest.mark.parametrize("cfg", K90.GATED_GROUPED_CONFIGS, ids=lambda c: f"{c.tile_m}x{c.tile_n}_{c.cluster_m}x{c.cluster_n}")
@pytest.mark.parametrize("activation", ["swiglu", "geglu", "reglu"])
@pytest.mark.parametrize("sizes", ["edges", "below_t", "tail_rows"], ids=str)
@pytest.mark.parametrize("b_col", [False, True], ids=["b_nmajor", "b_kmajor"])
def test_gated_grouped_class_matches_float64(cfg, activation, sizes, b_col):
    """The gate fused into the grouped class's epilogue: D = act(gate) * up of each group's
    [gate | up] columns, H = 384 (three, four and six gate halves of the candidates' tiles), rows in
    no group zero; integer operands (the product exact), so the error is the activation's and the
    one rounding to bf16."""
    sizes = np.array(SIZES[sizes])
    t, k, n = 1000, 136, 768
    gen = torch.Generator().manual_seed(11)
    x = _ints((t, k), gen, "bfloat16") / 8                # the activations' curved parts
    w = _ints((len(sizes), k, n), gen, "bfloat16") / 4
    w = w.transpose(1, 2).contiguous().transpose(1, 2) if b_col else w
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
    got = _run_fused(x, w, offs, activation, cfg)
    torch.testing.assert_close(got.double(), _want_activated(x, w, sizes, activation, "bfloat16"),
                               rtol=8e-3, atol=1e-2)


@pytest.mark.parametrize("activation", ["gelu", "sigmoid"])
def test_grouped_class_fuses_an_activation(activation):
    """A plain activation in the grouped class: rows in no group are act(0) (sigmoid's 0.5)."""
    sizes = np.array(SIZES["below_t"])
    t, k, n = 256, 64, 136
    gen = torch.Generator().manual_seed(3)
    x, w = _ints((t, k), gen, "bfloat16") / 8, _ints((len(sizes), k, n), gen, "bfloat16") / 4
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
    got = _run_fused(x, w, offs, activation, K90.GROUPED_CONFIGS[0])
    torch.testing.assert_close(got.double(), _want_activated(x, w, sizes, activation, "bfloat16"),
                               rtol=8e-3, atol=1e-2)


@pytest.mark.parametrize("entry", ["grouped_mm", "ragged_dot"])
def test_public_calls_take_the_fused_class(entry):
    """xgemm.grouped_mm / ragged_dot(activation="swiglu") on eager CUDA bf16 tensors run the fused
    class (explain says so) and match the float64 gate; under autograd they compose it."""
    import xgemm
    sizes = [300, 0, 129, 595]
    t, k, n = 1024, 128, 512
    gen = torch.Generator().manual_seed(9)
    x, w = _ints((t, k), gen, "bfloat16") / 8, _ints((len(sizes), k, n), gen, "bfloat16") / 4
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
    index = offs if entry == "grouped_mm" else torch.tensor(sizes, dtype=torch.int32, device="cuda")
    call = getattr(xgemm, entry)
    text = xgemm.explain(x, w, index, op=entry, activation="swiglu")
    assert "fused into cute_gemm_sm90's epilogue" in text, text
    got = call(x, w, index, activation="swiglu")
    assert got.shape == (t, n // 2) and got.dtype == torch.bfloat16
    want = _want_activated(x, w, sizes, "swiglu", "bfloat16")
    torch.testing.assert_close(got.double(), want, rtol=8e-3, atol=1e-2)
    composed = call(x.requires_grad_(), w, index, activation="swiglu")
    torch.testing.assert_close(composed.detach().double(), want, rtol=2e-2, atol=2e-2)


def test_jax_jit_fuses_the_gate_and_grad_composes_it():
    """jit(xgemm.jax.ragged_dot(..., activation="swiglu")): one TVM-FFI call of the gated class, its
    result against jax.lax.ragged_dot then silu * up in float32; jax.grad through it (composed)
    against the same composition's grads."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from xgemm import jax as xj
    rng = np.random.default_rng(8)
    sizes = np.array([0, 129, 300, 83])
    t, k, n = 512, 136, 512
    lhs = jnp.asarray(rng.integers(-2, 3, (t, k)) / 8, jnp.bfloat16)
    rhs = jnp.asarray(rng.integers(-2, 3, (4, k, n)) / 4, jnp.bfloat16)
    gs = jnp.asarray(sizes, jnp.int32)

    def peer(l, r, g):
        p = jax.lax.ragged_dot(l.astype(jnp.float32), r.astype(jnp.float32), g)
        return (jax.nn.silu(p[:, : n // 2]) * p[:, n // 2:]).astype(jnp.bfloat16)

    def fused(l, r, g):
        return xj.ragged_dot(l, r, g, activation="swiglu")
    text = jax.jit(fused).lower(lhs, rhs, gs).as_text()
    assert text.count("xgemm_tvm_ffi_call") == 1 and "tensor<512x256xbf16>" in text
    got, want = jax.jit(fused)(lhs, rhs, gs), jax.jit(peer)(lhs, rhs, gs)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=8e-3, atol=1e-2)

    def loss(f):
        return lambda l, r: jnp.sum(f(l, r, gs).astype(jnp.float32) ** 2)
    for g, w in zip(jax.jit(jax.grad(loss(fused), argnums=(0, 1)))(lhs, rhs),
                    jax.jit(jax.grad(loss(peer), argnums=(0, 1)))(lhs, rhs)):
        scale = float(jnp.max(jnp.abs(w.astype(jnp.float32))))
        assert float(jnp.max(jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32)))) <= 2e-2 * scale
