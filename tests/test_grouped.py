"""Grouped GEMM (issue 23), eager: xgemm.grouped.ragged_dot / grouped_mm on NumPy, torch and JAX
arrays against a loop of float64 matmuls written apart from the code (host slices of the group
sizes) and against jax.lax.ragged_dot / torch._grouped_mm; empty, one-row and Zipf-skewed groups,
rows beyond sum(group_sizes), every dtype, the typed errors, and no host read of the sizes."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import FRAMEWORKS, make, np_dtype, rounded
from hypothesis import given, settings
from hypothesis import strategies as st

from xgemm import errors, grouped

DTYPES = ("float32", "float16", "bfloat16", "float64")


def loop_ref(lhs, rhs, sizes):
    """float64 [T, N]: rows [start, start + size) of lhs times rhs[e], clipped at T; the rest zero."""
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    out = np.zeros((lhs.shape[0], rhs.shape[2]))
    start = 0
    for e, size in enumerate(np.asarray(sizes).tolist()):
        end = min(start + size, lhs.shape[0])
        out[start:end] = lhs[start:end] @ rhs[e]
        start = end
    return out


def contract_ref(a, b, sizes):
    """float64 [E, M, N]: a[:, T_e] @ b[T_e, :] per group (clipped at T), zeros for an empty group."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    out, start = [], 0
    for size in np.asarray(sizes).tolist():
        end = min(start + size, a.shape[1])
        out.append(a[:, start:end] @ b[start:end])
        start = end
    return np.stack(out) if out else np.zeros((0, a.shape[0], b.shape[1]))


def ints(rng, shape):
    return rng.integers(-5, 6, shape).astype(np.float64)


def zipf_sizes(rng, experts, rows, zeros):
    """Zipf-skewed sizes summing to at most `rows`, `zeros` of them empty."""
    w = 1.0 / np.arange(1, experts + 1) ** 1.2
    w[rng.choice(experts, zeros, replace=False)] = 0
    return np.floor(rng.permutation(w) / w.sum() * rows).astype(np.int64)


def index(values, fw, dtype="int32"):
    v = np.asarray(values, dtype)
    if fw == "torch":
        import torch
        return torch.from_numpy(v)
    if fw == "jax":
        import jax.numpy as jnp
        return jnp.asarray(v)
    return v


def to_f64(x):
    if type(x).__module__.startswith("torch"):
        return x.double().numpy()
    return np.asarray(x).astype(np.float64)


# name: (T, K, N, sizes)
CASES = {
    "empty and odd groups": (23, 5, 7, [4, 0, 9, 0, 10]),
    "one-row groups": (6, 3, 4, [1, 1, 1, 1, 1, 1]),
    "sum below T": (12, 4, 3, [3, 0, 2]),               # rows 5..11 belong to no group: zeros
    "sum above T": (9, 4, 3, [5, 4, 3]),                # the last group is truncated at T
    "all empty": (5, 3, 2, [0, 0]),
    "E=1": (10, 6, 5, [10]),
    "no rows": (0, 3, 2, [0, 0, 0]),
    "K=0": (4, 0, 3, [2, 2]),
    "no groups": (4, 3, 2, []),
}


@pytest.mark.parametrize("fw", FRAMEWORKS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_ragged_dot_matches_a_loop_of_matmuls(fw, dtype, case):
    t, k, n, sizes = CASES[case]
    rng = np.random.default_rng(len(case))
    lhs, rhs = ints(rng, (t, k)), ints(rng, (len(sizes), k, n))
    out = grouped.ragged_dot(make(lhs, fw, dtype), make(rhs, fw, dtype), index(sizes, fw))
    assert type(out).__module__.split(".")[0] == type(make(lhs, fw, dtype)).__module__.split(".")[0]
    assert out.shape == (t, n) and str(out.dtype).endswith(dtype)
    # integers in [-5, 5], K <= 6: every product and sum is exact in fp32 and in each result dtype
    np.testing.assert_array_equal(to_f64(out), loop_ref(lhs, rhs, sizes))


@pytest.mark.parametrize("fw", FRAMEWORKS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_zipf_skewed_sizes_over_64_experts(fw, dtype):
    rng = np.random.default_rng(7)
    sizes = zipf_sizes(rng, 64, 300, zeros=12)
    assert (sizes == 0).sum() >= 12 and (sizes == 1).any() and sizes.max() > 50 and sizes.sum() <= 300
    lhs, rhs = ints(rng, (300, 16)), ints(rng, (64, 16, 8))
    out = grouped.ragged_dot(make(lhs, fw, dtype), make(rhs, fw, dtype), index(sizes, fw, "int64"))
    # exact sums in the fp32 accumulator, then one rounding to the result dtype
    np.testing.assert_array_equal(to_f64(out), rounded(loop_ref(lhs, rhs, sizes), dtype))


@pytest.mark.parametrize("fw", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matches_jax_lax_ragged_dot(fw, dtype):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = np.random.default_rng(1)
    sizes = [7, 0, 1, 12, 0, 3]                              # sum 23 < T = 30
    lhs, rhs = rng.standard_normal((30, 24)), rng.standard_normal((6, 24, 10))
    want = jax.lax.ragged_dot(jnp.asarray(lhs, np_dtype(dtype)), jnp.asarray(rhs, np_dtype(dtype)),
                              jnp.asarray(sizes, jnp.int32), preferred_element_type=jnp.float32)
    got = grouped.ragged_dot(make(lhs, fw, dtype), make(rhs, fw, dtype), index(sizes, fw), out_dtype="float32")
    assert str(got.dtype).endswith("float32")
    np.testing.assert_allclose(to_f64(got), np.asarray(want, np.float64), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(to_f64(got)[23:], 0)


def test_jax_arrays_take_the_same_entry_and_trace_the_sizes():
    """JAX arrays go to xgemm.jax.grouped; under jax.jit group_sizes stay a tracer (a host read
    would raise a concretization error) and are an input of the jaxpr, not a constant."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = np.random.default_rng(2)
    lhs, rhs, sizes = ints(rng, (11, 4)), ints(rng, (3, 4, 5)), [3, 0, 6]
    a, b, g = jnp.asarray(lhs, jnp.float32), jnp.asarray(rhs, jnp.float32), jnp.asarray(sizes, jnp.int32)
    assert isinstance(grouped.ragged_dot(a, b, g), jax.Array)
    f = jax.jit(lambda a, b, g: grouped.ragged_dot(a, b, g))
    np.testing.assert_array_equal(np.asarray(f(a, b, g)), loop_ref(lhs, rhs, sizes))
    jaxpr = jax.make_jaxpr(lambda g: grouped.ragged_dot(a, b, g))(g)
    assert "ragged_dot" in str(jaxpr) and len(jaxpr.jaxpr.invars) == 1
    # NumPy rhs and sizes join a JAX lhs; grouped_mm's offsets too
    np.testing.assert_array_equal(np.asarray(grouped.grouped_mm(a, rhs.astype(np.float32), np.cumsum(sizes))),
                                  loop_ref(lhs, rhs, sizes))


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_grouped_mm_offsets_are_cumulative_ends(fw):
    rng = np.random.default_rng(3)
    sizes = [3, 0, 1, 5]
    x, w = ints(rng, (12, 4)), ints(rng, (4, 4, 6))
    offs = np.cumsum(sizes).astype(np.int32)
    out = grouped.grouped_mm(make(x, fw, "float32"), make(w, fw, "float32"), index(offs, fw))
    np.testing.assert_array_equal(to_f64(out), loop_ref(x, w, sizes))
    # groups of the contraction: x [M, T], w [T, N] -> [E, M, N], zeros for the empty group
    a, b = ints(rng, (5, 12)), ints(rng, (12, 3))
    out = grouped.grouped_mm(make(a, fw, "float32"), make(b, fw, "float32"), index(offs, fw, "int64"))
    assert out.shape == (4, 5, 3)
    np.testing.assert_array_equal(to_f64(out), contract_ref(a, b, sizes))
    np.testing.assert_array_equal(to_f64(out)[1], 0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_grouped_mm_matches_torch_grouped_mm(dtype):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch._grouped_mm is not in this torch")
    rng = np.random.default_rng(4)
    dt = getattr(torch, dtype)
    x, w = torch.from_numpy(rng.standard_normal((40, 16))).to(dt), torch.from_numpy(rng.standard_normal((4, 16, 8))).to(dt)
    offs = torch.tensor([8, 8, 24, 32], dtype=torch.int32)       # 16-byte-aligned groups: torch's CPU path asks
    got, want = grouped.grouped_mm(x, w, offs), torch._grouped_mm(x, w, offs)
    torch.testing.assert_close(got[:32], want[:32])              # torch leaves rows 32.. unwritten
    assert (got[32:] == 0).all()
    a, b = torch.from_numpy(rng.standard_normal((8, 40))).to(dt), torch.from_numpy(rng.standard_normal((40, 16))).to(dt)
    torch.testing.assert_close(grouped.grouped_mm(a, b, offs), torch._grouped_mm(a, b, offs))


@pytest.mark.parametrize("fw", ["numpy", "torch"])
def test_rows_in_no_group_and_unused_experts_do_not_leak_nan(fw):
    rng = np.random.default_rng(5)
    lhs, rhs = ints(rng, (8, 3)), ints(rng, (3, 3, 2))
    lhs[6:] = np.nan                    # beyond sum(sizes) = 6
    rhs[1] = np.nan                     # the empty expert
    out = to_f64(grouped.ragged_dot(make(lhs, fw, "float32"), make(rhs, fw, "float32"), index([2, 0, 4], fw)))
    np.testing.assert_array_equal(out, loop_ref(np.nan_to_num(lhs), np.nan_to_num(rhs), [2, 0, 4]))
    a, b = ints(rng, (2, 8)), ints(rng, (8, 3))
    a[:, 6:], b[6:] = np.nan, np.nan
    b[0] = np.inf                       # group 0 only: contraction of the other groups stays finite
    out = to_f64(grouped.grouped_mm(make(a, fw, "float64"), make(b, fw, "float64"), index([1, 1, 6], fw)))
    assert np.isfinite(out[1:]).all()


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_out_dtype(fw):
    rng = np.random.default_rng(6)
    lhs, rhs = ints(rng, (6, 4)), ints(rng, (2, 4, 3))
    args = (make(lhs, fw, "bfloat16"), make(rhs, fw, "bfloat16"), index([2, 4], fw))
    for spelled in ("float32", np.float32, np.dtype("float32")):
        out = grouped.ragged_dot(*args, out_dtype=spelled)
        assert str(out.dtype).endswith("float32")
        np.testing.assert_array_equal(to_f64(out), loop_ref(lhs, rhs, [2, 4]))
    with pytest.raises(errors.DTypeError, match="out_dtype=float16 with bfloat16 operands"):
        grouped.ragged_dot(*args, out_dtype="float16")


BAD = [  # (call, error, message fragment)
    (lambda np_: grouped.ragged_dot(np_.ones((2, 3, 4)), np_.ones((2, 4, 5)), np_.zeros(2, np_.int32)),
     errors.ShapeError, r"lhs has shape \(2, 3, 4\); it must be 2-D"),
    (lambda np_: grouped.ragged_dot(np_.ones((3, 4)), np_.ones((4, 5)), np_.zeros(2, np_.int32)),
     errors.ShapeError, r"rhs has shape \(4, 5\); it must be 3-D \[E, K, N\]"),
    (lambda np_: grouped.ragged_dot(np_.ones((3, 4)), np_.ones((2, 5, 6)), np_.zeros(2, np_.int32)),
     errors.ShapeError, r"lhs.shape\[1\] \(4\) must equal rhs.shape\[1\] \(5\)"),
    (lambda np_: grouped.ragged_dot(np_.ones((3, 4)), np_.ones((2, 4, 6)), np_.zeros(3, np_.int32)),
     errors.ShapeError, r"group_sizes has shape \(3,\).*pass shape \(2,\)"),
    (lambda np_: grouped.ragged_dot(np_.ones((3, 4)), np_.ones((2, 4, 6)), np_.zeros(2)),
     errors.DTypeError, r"group_sizes has dtype float64; pass int32 or int64"),
    (lambda np_: grouped.ragged_dot(np_.ones((3, 4)), np_.ones((2, 4, 6), np_.float32), np_.zeros(2, np_.int32)),
     errors.DTypeError, r"lhs is float64 and rhs is float32; cast rhs"),
    (lambda np_: grouped.ragged_dot(np_.ones((3, 4), np_.int32), np_.ones((2, 4, 6), np_.int32), np_.zeros(2, np_.int32)),
     errors.DTypeError, r"lhs has dtype int32; supported are"),
    (lambda np_: grouped.ragged_dot([[1.0]], np_.ones((1, 1, 1)), np_.zeros(1, np_.int32)),
     errors.NotAnArrayError, r"lhs is a list, not an array"),
    (lambda np_: grouped.grouped_mm(np_.ones((2, 3, 4)), np_.ones((2, 4, 5)), np_.zeros(2, np_.int32)),
     errors.ShapeError, r"grouped_mm takes x \[T, K\] with w \[E, K, N\]"),
    (lambda np_: grouped.grouped_mm(np_.ones((3, 4)), np_.ones((2, 4, 5)), np_.zeros(3, np_.int32)),
     errors.ShapeError, r"offs has shape \(3,\) and w \(2, 4, 5\)"),
    (lambda np_: grouped.grouped_mm(np_.ones((3, 4)), np_.ones((5, 2)), np_.zeros(3, np_.int32)),
     errors.ShapeError, r"x.shape\[1\] \(4\) must equal w.shape\[0\] \(5\) \(the grouped contraction\)"),
    (lambda np_: grouped.grouped_mm(np_.ones((3, 4)), np_.ones((2, 4, 5)), np_.zeros((2, 1), np_.int32)),
     errors.ShapeError, r"offs has shape \(2, 1\); it must be 1-D"),
]


@pytest.mark.parametrize("i", range(len(BAD)))
def test_typed_errors_name_the_argument_and_the_fix(i):
    call, error, message = BAD[i]
    with pytest.raises(error, match=message):
        call(np)


def test_errors_across_frameworks_and_devices():
    torch = pytest.importorskip("torch")
    lhs, rhs, sizes = torch.ones(3, 4), torch.ones(2, 4, 5), torch.tensor([1, 2])
    with pytest.raises(errors.DeviceError, match="rhs lives on a device DLPack cannot describe"):
        grouped.ragged_dot(lhs, rhs.to("meta"), sizes)
    # NumPy operands join a torch lhs (zero-copy); the result is torch
    assert isinstance(grouped.ragged_dot(lhs, rhs.numpy(), sizes.numpy()), torch.Tensor)
    jax = pytest.importorskip("jax")
    with pytest.raises(errors.FrameworkError, match="group_sizes is a JAX tracer"):
        jax.jit(lambda g: grouped.ragged_dot(np.ones((3, 4)), np.ones((2, 4, 5)), g))(jax.numpy.asarray([1, 2]))


def test_torch_path_never_reads_tensor_values_on_the_host(monkeypatch):
    """The eager torch path reads no tensor value on the host (.item(), .tolist(), int(), bool(),
    .numpy()): on a GPU it would synchronize, and under CUDA-graph capture it would fail."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    lhs, rhs, a, b = ints(rng, (9, 3)), ints(rng, (3, 3, 2)), ints(rng, (2, 9)), ints(rng, (9, 4))
    sizes = torch.tensor([2, 0, 5], dtype=torch.int32)
    t = [torch.from_numpy(v) for v in (lhs, rhs, a, b)]
    offs = torch.cumsum(sizes, 0)

    def host_read(*args, **kwargs):
        raise AssertionError("a tensor value was read on the host")
    for name in ("item", "tolist", "numpy", "__int__", "__index__", "__bool__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    out = grouped.ragged_dot(t[0], t[1], sizes)
    out2 = grouped.grouped_mm(t[0], t[1], offs)
    out3 = grouped.grouped_mm(t[2], t[3], offs)
    monkeypatch.undo()
    np.testing.assert_array_equal(out.numpy(), loop_ref(lhs, rhs, [2, 0, 5]))
    np.testing.assert_array_equal(out2.numpy(), out.numpy())
    np.testing.assert_array_equal(out3.numpy(), contract_ref(a, b, [2, 0, 5]))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), fw=st.sampled_from([f for f in FRAMEWORKS if f != "jax"]))
def test_any_sizes_match_the_loop(data, fw):
    """Sizes of any kind (zeros, ones, sums below and above T) and any T, E, on the fp64 path."""
    t = data.draw(st.integers(0, 20))
    sizes = data.draw(st.lists(st.integers(0, 8), min_size=0, max_size=6))
    k, n = data.draw(st.integers(0, 4)), data.draw(st.integers(1, 4))
    rng = np.random.default_rng(t * 131 + len(sizes))
    lhs, rhs = rng.standard_normal((t, k)), rng.standard_normal((len(sizes), k, n))
    out = grouped.ragged_dot(make(lhs, fw, "float64"), make(rhs, fw, "float64"), index(sizes, fw, "int64"))
    np.testing.assert_allclose(to_f64(out), loop_ref(lhs, rhs, sizes), rtol=1e-12, atol=1e-12)
    a, b = rng.standard_normal((n, t)), rng.standard_normal((t, k))
    offs = np.cumsum(sizes).astype(np.int64)
    out = grouped.grouped_mm(make(a, fw, "float64"), make(b, fw, "float64"), index(offs, fw, "int64"))
    np.testing.assert_allclose(to_f64(out), contract_ref(a, b, sizes), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fw", ["numpy", "torch", "jax"])
def test_explain_names_the_default_and_its_cost(fw):
    """explain(op="ragged_dot" | "grouped_mm") says what runs; on the CPU that is the default, with
    its cost (E masked products: E x the grouped FLOPs) and why the grouped kernel declined."""
    import xgemm
    mod = {"numpy": np, "torch": pytest.importorskip("torch"), "jax": pytest.importorskip("jax.numpy")}[fw]
    x, w = mod.asarray(np.zeros((100, 32), np.float32)), mod.asarray(np.zeros((4, 32, 16), np.float32))
    gs = mod.asarray(np.array([10, 0, 50, 40], np.int32))
    text = xgemm.explain(x, w, gs, op="ragged_dot")
    assert f"on {fw}" in text and "[100, 32] @ [4, 32, 16] -> [100, 16]" in text
    if fw == "jax":
        assert "jax.lax.ragged_dot" in text
    else:
        assert "4 masked products" in text and "4 x the grouped FLOPs" in text
        assert "declined triton_grouped_sm90: needs a CUDA device" in text
    xt, dy, offs = mod.asarray(np.zeros((32, 100), np.float32)), mod.asarray(np.zeros((100, 16), np.float32)), \
        mod.asarray(np.array([10, 60, 100], np.int32))
    assert "-> [3, 32, 16]" in xgemm.explain(xt, dy, offs, op="grouped_mm")
    with pytest.raises(errors.ShapeError):
        xgemm.explain(x, w, mod.asarray(np.array([1, 2], np.int32)), op="ragged_dot")
