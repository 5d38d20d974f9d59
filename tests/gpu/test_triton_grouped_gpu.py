"""triton_grouped_sm90 on the H200: xgemm.ragged_dot / grouped_mm through the public API (the rows
mode forced onto it: cute_gemm_sm90's grouped class runs it by default) against float64 references, with integer operands (every product and sum exact in float32, so the only
error is the final rounding) and NaN-poisoned results; group sizes that are empty, one row, off
the tile, skewed, summing below and above T; both modes and every majorness; CUDA-graph capture
with the sizes changed between replays; torch autograd through the kernel."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import xgemm  # noqa: E402
from xgemm import grouped  # noqa: E402
from xgemm.core import policy  # noqa: E402
from xgemm.kernels import cute_gemm_sm90 as K90  # noqa: E402
from xgemm.kernels import triton_grouped_sm90 as tg  # noqa: E402

pytestmark = pytest.mark.gpu
DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _poisoned(c, ends):
    """The checked call run into a NaN-filled result (grouped.run's out), so unwritten elements
    show; the public call's result must equal it."""
    out = torch.full(c.shape.out, float("nan"), dtype=DT[c.out_dtype], device="cuda")
    assert grouped.run(c, ends, out) is out
    return out


def _lay(x, col):
    """The same values with the other dim contiguous (M-/K-major)."""
    return x.mT.contiguous().mT if col else x


def _ints(shape, gen, dtype):
    return torch.randint(-2, 3, shape, generator=gen).to(DT[dtype]).cuda()


def _bounds(sizes, t):
    out, row0 = [], 0
    for end in np.cumsum(sizes).tolist():
        end = max(min(end, t), row0)
        out.append((row0, end))
        row0 = end
    return out


SIZES = {"edges": [0, 1, 300, 129, 0, 383], "below_t": [100, 0, 7], "above_t": [700, 700],
         "one_group": [1000]}


@pytest.mark.parametrize("dtype,out", [("bfloat16", "bfloat16"), ("float16", "float16"), ("bfloat16", "float32")])
@pytest.mark.parametrize("a_col,b_col", list(itertools.product([False, True], [False, True])))
@pytest.mark.parametrize("sizes", list(SIZES), ids=str)
@pytest.mark.parametrize("n", [136, 2056], ids=lambda n: f"n{n}")
def test_rows_mode_matches_float64(dtype, out, a_col, b_col, sizes, n):
    t, k = 1000, 264
    sizes = SIZES[sizes]
    gen = torch.Generator().manual_seed(len(sizes) * 31 + n)
    a = _lay(_ints((t, k), gen, dtype), a_col)
    w = _ints((len(sizes), k, n), gen, dtype)
    w = w.transpose(1, 2).contiguous().transpose(1, 2) if b_col else w
    gs = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    # forced onto this kernel, except an M-major A: the API's row-major copy of it is what either
    # kernel reads (the override would refuse the problem as given)
    with policy.force(None if a_col else tg.NAME):
        plan = xgemm.explain(a, w, gs, op="ragged_dot")
        assert (K90.NAME if a_col else tg.NAME) in plan and ("  copy: " in plan) == a_col, plan
        got = _poisoned(grouped.check_ragged_dot(a, w, gs, out), torch.cumsum(gs, 0))
        assert torch.equal(xgemm.ragged_dot(a, w, gs, out_dtype=out), got)
    want = torch.zeros(t, n, dtype=torch.float64, device="cuda")
    for g, (r0, r1) in enumerate(_bounds(sizes, t)):
        want[r0:r1] = a[r0:r1].double() @ w[g].double()
    torch.testing.assert_close(got.double(), want.to(DT[out]).double(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype,out", [("bfloat16", "bfloat16"), ("float16", "float32")])
@pytest.mark.parametrize("a_col,b_col", list(itertools.product([False, True], [False, True])))
@pytest.mark.parametrize("sizes", [[0, 1, 300, 129, 0, 383], [100, 0, 7], [700, 700]], ids=str)
def test_ragged_k_mode_matches_float64(dtype, out, a_col, b_col, sizes):
    """out[g] = a[:, T_g] @ b[T_g, :] (grouped_mm's variable-K product, the weight gradient)."""
    t, m, n = 1000, 136, 264
    gen = torch.Generator().manual_seed(len(sizes) * 7 + m)
    a = _lay(_ints((m, t), gen, dtype), a_col)
    b = _lay(_ints((t, n), gen, dtype), b_col)
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
    assert tg.NAME in xgemm.explain(a, b, offs, op="grouped_mm")
    got = _poisoned(grouped.check_grouped_mm(a, b, offs, out), offs)
    assert torch.equal(xgemm.grouped_mm(a, b, offs, out_dtype=out), got)
    want = torch.stack([a[:, r0:r1].double() @ b[r0:r1].double() for r0, r1 in _bounds(sizes, t)])
    torch.testing.assert_close(got.double(), want.to(DT[out]).double(), rtol=0, atol=0)


FLAT_SIZES = {**SIZES, "zipf256": "zipf", "tail_rows": [1, 0, 127, 128, 129, 255, 2]}


def _flat_run(x, w, offs):
    """The flattened kernel (tg.FLAT_TUNE[0]) through the kernel protocol, into a NaN-filled result."""
    from xgemm import arrays
    from xgemm.core.problem import Policy
    c = grouped.check_grouped_mm(x, w, offs)
    plan, va, vb, moves = grouped._plan(c)
    assert moves == (None, None)
    bm, bn, bk, stages, warps = tg.FLAT_TUNE[0]
    pol = Policy(tile=(bm, bn, bk), stages=stages, warps=warps, schedule=tg.FLAT_SCHEDULE)
    y = torch.full(c.shape.out, float("nan"), dtype=x.dtype, device="cuda")
    tg.KERNEL.run(plan.problem, pol, (va, vb, arrays.view(offs, "offs", "test")), arrays.view(y, "out", "test"),
                  torch.cuda.current_stream().cuda_stream)
    return y


@pytest.mark.parametrize("b_col", [False, True], ids=["b_nmajor", "b_kmajor"])
@pytest.mark.parametrize("sizes", list(FLAT_SIZES), ids=str)
def test_flattened_kernel_matches_float64(sizes, b_col):
    """The flattened rows-mode kernel at its tune sweep's first tile, on the edge cases: empty,
    one-row and off-tile groups, sizes summing below and above T (rows in no group are zeros), 256
    Zipf-skewed groups; exact on integer operands."""
    rng = np.random.default_rng(5)
    t, k = (4096, 256) if sizes == "zipf256" else (1000, 264)
    if sizes == "zipf256":
        p = 1.0 / np.arange(1, 193) ** 1.2
        sizes = np.concatenate([rng.multinomial(t, p / p.sum()), np.zeros(64, int)])
        rng.shuffle(sizes)
    else:
        sizes = FLAT_SIZES[sizes]
    n = 520
    gen = torch.Generator().manual_seed(9)
    x = _ints((t, k), gen, "bfloat16")
    w = _lay(_ints((len(sizes), k, n), gen, "bfloat16"), b_col)
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
    got = _flat_run(x, w, offs)
    want = torch.zeros(t, n, dtype=torch.float64, device="cuda")
    for g, (r0, r1) in enumerate(_bounds(sizes, t)):
        want[r0:r1] = x[r0:r1].double() @ w[g].double()
    torch.testing.assert_close(got.double(), want.bfloat16().double(), rtol=0, atol=0)


def test_many_experts_skewed_and_empty():
    """E = 256 with Zipf-skewed sizes, a quarter of the experts empty; the MoE shape of the issue's
    second case, scaled down."""
    rng = np.random.default_rng(0)
    e, t, k, n = 256, 8192, 512, 1024
    p = 1.0 / np.arange(1, 193) ** 1.2
    sizes = np.concatenate([rng.multinomial(t, p / p.sum()), np.zeros(64, int)])
    rng.shuffle(sizes)
    gen = torch.Generator().manual_seed(1)
    x, w = _ints((t, k), gen, "bfloat16"), _ints((e, k, n), gen, "bfloat16")
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
    got = _poisoned(grouped.check_grouped_mm(x, w, offs), offs)
    assert torch.equal(xgemm.grouped_mm(x, w, offs), got)
    want = torch.empty(t, n, dtype=torch.float64, device="cuda")
    for g, (r0, r1) in enumerate(_bounds(sizes, t)):
        want[r0:r1] = x[r0:r1].double() @ w[g].double()
    torch.testing.assert_close(got.double(), want.bfloat16().double(), rtol=0, atol=0)


def test_a_million_rows_over_256_groups():
    """Issue 23's limits: T = 10**6 rows over E = 256 groups (random sizes, some empty), both
    modes, against float64 per group."""
    rng = np.random.default_rng(6)
    e, t, k, n = 256, 1_000_000, 64, 128
    sizes = rng.multinomial(t, rng.dirichlet(np.ones(e) * 0.3))
    gen = torch.Generator().manual_seed(6)
    x, w, dy = _ints((t, k), gen, "bfloat16"), _ints((e, k, n), gen, "bfloat16"), _ints((t, n), gen, "bfloat16")
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
    got = _poisoned(grouped.check_grouped_mm(x, w, offs), offs)
    dw = _poisoned(grouped.check_grouped_mm(x.t(), dy, offs, "float32"), offs)
    for g, (r0, r1) in enumerate(_bounds(sizes, t)):
        want = x[r0:r1].double() @ w[g].double()
        torch.testing.assert_close(got[r0:r1].double(), want.bfloat16().double(), rtol=0, atol=0)
        torch.testing.assert_close(dw[g].double(), x[r0:r1].double().T @ dy[r0:r1].double(), rtol=0, atol=0)


def test_cuda_graph_replays_with_new_sizes():
    """The sizes are read on the device: a captured call, replayed after the offsets changed in
    place, computes the new grouping (on the flattened kernel, whose group table is a stream-ordered
    allocation in the graph)."""
    gen = torch.Generator().manual_seed(2)
    t, k, n = 512, 128, 256
    x, w = _ints((t, k), gen, "bfloat16"), _ints((4, k, n), gen, "bfloat16")
    offs = torch.tensor(np.cumsum([100, 200, 0, 212]), dtype=torch.int32, device="cuda")
    xgemm.grouped_mm(x, w, offs)                        # plan and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = xgemm.grouped_mm(x, w, offs)
    for sizes in ([100, 200, 0, 212], [0, 512, 0, 0], [33, 1, 77, 401]):
        offs.copy_(torch.tensor(np.cumsum(sizes), dtype=torch.int32))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = torch.empty(t, n, dtype=torch.float64, device="cuda")
        for g, (r0, r1) in enumerate(_bounds(sizes, t)):
            want[r0:r1] = x[r0:r1].double() @ w[g].double()
        torch.testing.assert_close(y.double(), want.bfloat16().double(), rtol=0, atol=0)


def test_autograd_runs_both_backward_products_on_the_kernel():
    """torch autograd through xgemm.grouped_mm: dx = grouped_mm(dy, w^T) (rows mode, B K-major: the
    CuTe grouped class) and dw = grouped_mm(x^T, dy) (ragged_k, A M-major: this kernel), against
    float64 per-group grads."""
    gen = torch.Generator().manual_seed(3)
    sizes = [0, 129, 300, 83]
    t, k, n = 512, 264, 136
    x = _ints((t, k), gen, "bfloat16").requires_grad_()
    w = _ints((4, k, n), gen, "bfloat16").requires_grad_()
    dy = _ints((t, n), gen, "bfloat16")
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
    assert K90.NAME in xgemm.explain(dy, w.detach().mT, offs, op="grouped_mm")
    assert tg.NAME in xgemm.explain(x.detach().mT, dy, offs, op="grouped_mm")
    xgemm.grouped_mm(x, w, offs).backward(dy)
    dx = torch.zeros(t, k, dtype=torch.float64, device="cuda")
    dw = torch.zeros(4, k, n, dtype=torch.float64, device="cuda")
    for g, (r0, r1) in enumerate(_bounds(sizes, t)):
        dx[r0:r1] = dy[r0:r1].double() @ w[g].double().T
        dw[g] = x[r0:r1].double().T @ dy[r0:r1].double()
    torch.testing.assert_close(x.grad.double(), dx.bfloat16().double(), rtol=0, atol=0)
    torch.testing.assert_close(w.grad.double(), dw.bfloat16().double(), rtol=0, atol=0)


def test_moe_shape_against_torch_grouped_mm():
    """The issue's first case (E=8, T=16384, K=4096, N=7168, uneven groups), random bf16, against
    torch._grouped_mm: relative Frobenius error of both against a float32 per-group product."""
    rng = np.random.default_rng(4)
    e, t, k, n = 8, 16384, 4096, 7168
    while True:                         # +- up to 1000 rows around the mean, summing to T
        sizes = t // e + rng.integers(-1000, 1001, e)
        sizes[-1] += t - sizes.sum()
        if abs(sizes[-1] - t // e) <= 1000:
            break
    gen = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(t, k, generator=gen, device="cuda").bfloat16()
    w = (torch.randn(e, n, k, generator=gen, device="cuda") / k ** 0.5).bfloat16().transpose(-2, -1)
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
    got = xgemm.grouped_mm(x, w, offs).float()
    peer = torch._grouped_mm(x, w, offs, out_dtype=torch.bfloat16).float()
    want = torch.empty(t, n, device="cuda")
    for g, (r0, r1) in enumerate(_bounds(sizes, t)):
        want[r0:r1] = x[r0:r1].float() @ w[g].float()
    err = ((got - want).norm() / want.norm()).item()
    assert err < 1e-2 and err <= 1.5 * ((peer - want).norm() / want.norm()).item() + 1e-4, err


def test_jax_jit_and_grad_match_jax_lax_ragged_dot():
    """xgemm.jax.ragged_dot inside jax.jit (the CuTe class's TVM-FFI call for the forward and dlhs,
    this kernel's cubin for drhs) and its grads against jax.lax.ragged_dot's, integer operands: exact."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from xgemm import jax as xj
    rng = np.random.default_rng(5)
    sizes = np.array([0, 129, 300, 83])
    t, k, n = 512, 264, 136
    lhs = jnp.asarray(rng.integers(-2, 3, (t, k)), jnp.bfloat16)
    rhs = jnp.asarray(rng.integers(-2, 3, (4, k, n)), jnp.bfloat16)
    dy = jnp.asarray(rng.integers(-2, 3, (t, n)), jnp.float32)
    gs = jnp.asarray(sizes, jnp.int32)

    def loss(f):
        return lambda l, r: jnp.sum(f(l, r, gs, preferred_element_type=jnp.float32) * dy)
    text = jax.jit(jax.grad(loss(xj.ragged_dot), argnums=(0, 1))).lower(lhs, rhs).as_text()
    assert text.count('kernel = "xgemm_grouped_flat_sm90"') == 1      # drhs (the forward is not needed)
    assert text.count("xgemm_tvm_ffi_call") == 1                       # dlhs, on the CuTe class
    got = jax.jit(xj.ragged_dot)(lhs, rhs, gs)
    want = jax.lax.ragged_dot(lhs.astype(jnp.float32), rhs.astype(jnp.float32), gs)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want.astype(jnp.bfloat16), np.float32))
    for g, w in zip(jax.jit(jax.grad(loss(xj.ragged_dot), argnums=(0, 1)))(lhs, rhs),
                    jax.jit(jax.grad(loss(jax.lax.ragged_dot), argnums=(0, 1)))(lhs, rhs)):
        # both round an exact float32 sum to bfloat16 once, unless XLA's transposed product does not
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=8e-3, atol=0)
