"""torch.ops.xgemm.grouped_mm (issue 23): autograd against a loop of float64 matmuls (empty,
one-row groups, rows in no group), double backward, the typed errors before autograd records, and
torch.compile(fullgraph=True): the op in the graph, and the embedded default itself traced whole
(a host read of the group sizes would break the graph)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from xgemm import errors, grouped  # noqa: E402
from xgemm.torch import grouped_ops  # noqa: E402
from xgemm.kernels import reference  # noqa: E402

SIZES = [3, 0, 1, 1, 0, 4]          # sum 9 < T = 12: rows 9.. in no group


def loop(lhs, rhs, sizes):
    """[T, N]: each group's host slice of lhs times its matrix, zeros for rows in no group."""
    out, start = [], 0
    for e, size in enumerate(sizes):
        out.append(lhs[start:start + size] @ rhs[e])
        start += size
    out.append(lhs[start:] @ rhs.new_zeros(rhs.shape[1:]))
    return torch.cat(out)


def contract_loop(a, b, sizes):
    out, start = [], 0
    for size in sizes:
        out.append(a[:, start:start + size] @ b[start:start + size])
        start += size
    return torch.stack(out)


def leaves(*shapes, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(*s, dtype=dtype, generator=g) for s in shapes]
    return [x.clone().requires_grad_() for x in xs], [x.clone().requires_grad_() for x in xs]


def test_ragged_dot_grads_match_a_loop_of_matmuls():
    (lhs, rhs), (lhs2, rhs2) = leaves((12, 5), (6, 5, 4))
    w = torch.randn(12, 4, dtype=torch.float64)
    out = grouped_ops.ragged_dot(lhs, rhs, torch.tensor(SIZES, dtype=torch.int32))
    (out * w).sum().backward()
    (loop(lhs2, rhs2, SIZES) * w).sum().backward()
    torch.testing.assert_close(out, loop(lhs2, rhs2, SIZES))
    torch.testing.assert_close(lhs.grad, lhs2.grad)
    torch.testing.assert_close(rhs.grad, rhs2.grad)
    assert (lhs.grad[9:] == 0).all() and (rhs.grad[1] == 0).all() and (rhs.grad[4] == 0).all()


def test_grouped_mm_contraction_grads_and_double_backward():
    (a, b), (a2, b2) = leaves((3, 9), (9, 4))
    offs = torch.cumsum(torch.tensor(SIZES), 0)      # int64 offsets; sum 9 = T here
    w = torch.randn(6, 3, 4, dtype=torch.float64)
    out = grouped_ops.grouped_mm(a, b, offs)
    (out * w).sum().backward()
    (contract_loop(a2, b2, SIZES) * w).sum().backward()
    torch.testing.assert_close(out, contract_loop(a2, b2, SIZES))
    torch.testing.assert_close(a.grad, a2.grad)
    torch.testing.assert_close(b.grad, b2.grad)
    # double backward, both cases: the grads of a function of the first grads (which the op computes)
    offs32 = offs.to(torch.int32)
    for shapes, ours, ref in (
            (((12, 5), (6, 5, 4)), lambda x, w: grouped_ops.grouped_mm(x, w, offs32), lambda x, w: loop(x, w, SIZES)),
            (((3, 9), (9, 4)), lambda a, b: grouped_ops.grouped_mm(a, b, offs32), lambda a, b: contract_loop(a, b, SIZES))):
        (p, q), (p2, q2) = leaves(*shapes, seed=1)
        for f, x, y in ((ours, p, q), (ref, p2, q2)):
            out = f(x, y)
            gx, gy = torch.autograd.grad(out.sin().sum(), (x, y), create_graph=True)
            (gx.square().sum() + gy.square().sum()).backward()
        torch.testing.assert_close(p.grad, p2.grad)
        torch.testing.assert_close(q.grad, q2.grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_half_and_single_grads_only_where_asked(dtype):
    (lhs, rhs), _ = leaves((12, 8), (6, 8, 4), dtype=dtype)
    rhs.requires_grad_(False)
    out = grouped_ops.ragged_dot(lhs, rhs, torch.tensor(SIZES), out_dtype="float32" if dtype != torch.float32 else None)
    assert out.dtype == torch.float32
    out.square().sum().backward()
    assert lhs.grad.dtype == dtype and rhs.grad is None
    ref = loop(lhs.detach().double(), rhs.double(), SIZES)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    want = 2 * loop(ref, rhs.double().mT, SIZES)
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(lhs.grad.double(), want, rtol=tol, atol=tol)


def test_errors_are_typed_before_autograd_records():
    lhs = torch.randn(4, 3, requires_grad=True)
    with pytest.raises(errors.ShapeError, match=r"lhs.shape\[1\] \(3\) must equal rhs.shape\[1\] \(5\)"):
        grouped_ops.ragged_dot(lhs, torch.randn(2, 5, 2), torch.tensor([1, 3]))
    with pytest.raises(errors.DTypeError, match="group_sizes has dtype float32"):
        grouped_ops.ragged_dot(lhs, torch.randn(2, 3, 2), torch.tensor([1.0, 3.0]))
    with pytest.raises(errors.DTypeError, match="offs has dtype int16"):
        grouped_ops.grouped_mm(lhs, torch.randn(2, 3, 2), torch.tensor([1, 3], dtype=torch.int16))


class Graphs:
    """A torch.compile backend that keeps dynamo's FX graphs and runs them as they are (no inductor:
    fast on CPU, and the graph is what the test looks at)."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def targets(self):
        return {str(n.target) for g in self.graphs for n in g.graph.nodes if n.op == "call_function"}


def test_torch_compile_fullgraph_holds_the_op_and_its_backward_runs():
    backend = Graphs()
    f = torch.compile(lambda x, w, g: grouped_ops.ragged_dot(x, w, g).relu(), backend=backend, fullgraph=True)
    (x, w), (x2, w2) = leaves((12, 5), (6, 5, 4))
    sizes = torch.tensor(SIZES, dtype=torch.int32)
    out = f(x, w, sizes)
    assert "xgemm.grouped_mm.default" in backend.targets(), backend.targets()
    out.sum().backward()
    loop(x2, w2, SIZES).relu().sum().backward()
    torch.testing.assert_close(out, loop(x2, w2, SIZES).relu())
    torch.testing.assert_close(w.grad, w2.grad)
    g = torch.compile(lambda a, b, o: grouped_ops.grouped_mm(a, b, o, out_dtype=torch.float32) * 2,
                      backend="aot_eager", fullgraph=True)     # the fake impl and autograd, through AOT
    a, b = torch.randint(-5, 6, (3, 12)).bfloat16(), torch.randint(-5, 6, (12, 4)).bfloat16()
    got = g(a.requires_grad_(), b, torch.cumsum(sizes, 0))
    assert got.dtype == torch.float32                            # the fake impl's dtype, out_dtype's
    torch.testing.assert_close(got, 2 * contract_loop(a.float(), b.float(), SIZES), rtol=0, atol=0)
    got.sum().backward()
    assert a.grad.dtype == torch.bfloat16 and a.grad.shape == a.shape


def test_the_default_traces_whole_so_it_reads_nothing_on_the_host():
    """torch.compile(fullgraph=True) of the embedded default's torch code: a .item()/.tolist()/int()
    of the group sizes (a host synchronization on a GPU) would be a graph break, an error here."""
    import array_api_compat.torch as xp
    backend = Graphs()
    rows = torch.compile(lambda l, r, ends: reference.multiply_groups(xp, l, r, ends, torch.float32, torch.float16),
                         backend=backend, fullgraph=True)
    cols = torch.compile(lambda a, b, ends: reference.contract_groups(xp, a, b, ends, torch.float32, torch.float32),
                         backend=backend, fullgraph=True)
    ends = torch.cumsum(torch.tensor([2, 0, 5]), 0)
    lhs, rhs = torch.randint(-5, 6, (9, 3)).half(), torch.randint(-5, 6, (3, 3, 2)).half()
    torch.testing.assert_close(rows(lhs, rhs, ends).double(), loop(lhs.double(), rhs.double(), [2, 0, 5]))
    a, b = torch.randn(2, 9), torch.randn(9, 4)
    torch.testing.assert_close(cols(a, b, ends), contract_loop(a, b, [2, 0, 5]))
    assert len(backend.graphs) == 2


def test_ragged_dot_errors_under_torch_compile_name_its_own_arguments():
    """Inside a trace the op sees grouped_mm's offsets: ragged_dot checks its shapes and sizes' dtype
    first, so its errors name lhs / rhs / group_sizes (they said grouped_mm: x, w, offs)."""
    import xgemm
    f = torch.compile(lambda l, r, g: xgemm.ragged_dot(l, r, g))
    torch._dynamo.reset()
    with pytest.raises(errors.DTypeError, match="ragged_dot: group_sizes has dtype float32"):
        f(torch.randn(8, 4), torch.randn(3, 4, 6), torch.tensor([3.0, 2.0, 3.0]))
    torch._dynamo.reset()
    with pytest.raises(errors.ShapeError, match=r"ragged_dot: lhs has shape \(8, 5\) and rhs"):
        f(torch.randn(8, 5), torch.randn(3, 4, 6), torch.tensor([3, 2, 3]))
