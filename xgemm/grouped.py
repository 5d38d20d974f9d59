"""Grouped (ragged) GEMM for mixture-of-experts, eager: NumPy, torch and CuPy arrays; JAX arrays
and tracers go to xgemm.jax.grouped.

    ragged_dot(lhs[T, K], rhs[E, K, N], group_sizes[E]) -> [T, N]   jax.lax.ragged_dot's semantics
    grouped_mm(x[T, K], w[E, K, N], offs[E]) -> [T, N]              torch._grouped_mm's offsets
    grouped_mm(x[M, T], w[T, N], offs[E]) -> [E, M, N]              the variable-K product (dW)

Rows of lhs are grouped contiguously: group e is rows [ends[e-1], ends[e]) with ends =
cumsum(group_sizes) (= offs), each row times rhs[e]. Rows at or beyond ends[-1] (sum of the sizes
< T) are zeros, as in jax.lax.ragged_dot (torch._grouped_mm leaves them unwritten); a sum above T
truncates the last groups at T. Sizes must be >= 0 (offsets non-decreasing): they are never read
on the host, so this is not checked; other values give unspecified rows.

The embedded default never reads the group sizes on the host (no device synchronization: CUDA-graph
capturable, and a torch.compile trace of it has no data-dependent branch): each row's group is
searchsorted(ends, arange(T), side='right') on the device, then for each group e the full product
lhs @ rhs[e] is computed and its rows selected (`where`, so NaN/Inf in other groups' rows or unused
experts never leak). Cost: E GEMMs of T x K x N (E times the useful flops) and, beyond the
inputs and result, O(T·K + T·N + K·N) memory; the variable-K product likewise E GEMMs of
M x T x N plus masked copies O(M·T + T·N). fp16/bf16 accumulate in float32, float64 in float64.
It is a reference for CPU and a fallback; the GPU kernel (a persistent grouped GEMM with a
device-side scheduler) plugs in at run_default(): a "grouped" op in core/registry.py and a
GroupedProblem that policy.choose() walks, with this default as its `reference` kernel.

Autograd and torch.compile: torch tensors that need them go through the torch.library op
xgemm::grouped_mm (torch/grouped_ops.py, which calls back into this module's eager path); that
routing is the public entry's (api.py), as for gemm, since the op imports this module.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from xgemm import arrays, errors, prepare
from xgemm.core import checks, grouped_checks


class Checked(NamedTuple):
    """A grouped call's arguments after the checks: operands in the owner framework."""
    owner: str
    a: Any
    b: Any
    index: Any                      # group sizes (ragged_dot) or end offsets (grouped_mm)
    dtype: str
    out_dtype: str
    shape: grouped_checks.GroupedShape


def _check(fn: str, names: tuple, a: Any, b: Any, index: Any, out_dtype: Any, ragged_dot: bool) -> Checked:
    owner = prepare.owner_of(fn, names[0], a)
    for name, x in zip(names[1:], (b, index)):
        arrays.require_array(fn, name, x)
        if owner != "jax" and arrays.is_jax_tracer(x):
            raise errors.FrameworkError(f"{fn}: {name} is a JAX tracer (inside jax.jit/grad) but {names[0]} is a "
                                        f"{owner} array; pass JAX arrays for every operand inside JAX transforms")
    b = arrays.import_into(owner, b, names[1], fn)
    index = arrays.import_into(owner, index, names[2], fn)
    dt = checks.operand_dtypes(fn, names[:2], arrays.dtype_name(a), arrays.dtype_name(b))
    grouped_checks.index_dtype(fn, names[2], arrays.dtype_name(index))
    shapes = (tuple(a.shape), tuple(b.shape), tuple(index.shape))
    shape = grouped_checks.ragged_dot(fn, *shapes) if ragged_dot else grouped_checks.grouped_mm(fn, *shapes)
    out = checks.out_dtype(fn, dt, arrays.requested_dtype(out_dtype))
    if owner != "jax":
        prepare.same_device(fn, [(n, arrays.view(x, n, fn)) for n, x in zip(names, (a, b, index))])
    return Checked(owner, a, b, index, dt, out, shape)


def check_ragged_dot(lhs: Any, rhs: Any, group_sizes: Any, out_dtype: Any = None, *, fn: str = "ragged_dot") -> Checked:
    return _check(fn, ("lhs", "rhs", "group_sizes"), lhs, rhs, group_sizes, out_dtype, True)


def check_grouped_mm(x: Any, w: Any, offs: Any, out_dtype: Any = None, *, fn: str = "grouped_mm") -> Checked:
    return _check(fn, ("x", "w", "offs"), x, w, offs, out_dtype, False)


def ragged_dot(lhs: Any, rhs: Any, group_sizes: Any, *, out_dtype: Any = None, fn: str = "ragged_dot") -> Any:
    """lhs [T, K] in E contiguous groups of group_sizes[e] rows, row-group e times rhs[e] [K, N]:
    out [T, N] in lhs's framework, of lhs.dtype (or out_dtype: float32 for fp16/bf16 operands).
    jax.lax.ragged_dot's semantics, rows beyond sum(group_sizes) zero (module docstring)."""
    c = check_ragged_dot(lhs, rhs, group_sizes, out_dtype, fn=fn)
    if c.owner == "jax":
        from xgemm.jax import grouped as jax_grouped
        return jax_grouped.ragged_dot(c.a, c.b, c.index, preferred_element_type=c.out_dtype, fn=fn)
    xp = arrays.namespace(c.owner)
    return run_default(xp, c, xp.cumulative_sum(c.index))


def grouped_mm(x: Any, w: Any, offs: Any, *, out_dtype: Any = None, fn: str = "grouped_mm") -> Any:
    """torch._grouped_mm's offsets (offs[e]: the end of group e, cumulative, int32 or int64):
    x [T, K], w [E, K, N] -> [T, N] (x's rows [offs[e-1], offs[e]) times w[e]; rows beyond offs[-1]
    zero), or x [M, T], w [T, N] -> [E, M, N] (group e: x[:, offs[e-1]:offs[e]] @ w[offs[e-1]:offs[e]],
    zeros for an empty group). Result in x's framework, of x.dtype or out_dtype."""
    c = check_grouped_mm(x, w, offs, out_dtype, fn=fn)
    if c.owner == "jax":
        from xgemm.jax import grouped as jax_grouped
        return jax_grouped.grouped_mm(c.a, c.b, c.index, out_dtype=c.out_dtype, fn=fn)
    return run_default(arrays.namespace(c.owner), c, c.index)


def explain(op: str, a: Any, b: Any, index: Any, out_dtype: Any = None) -> str:
    """What a ragged_dot / grouped_mm call runs, in words: its shape, and the embedded default's
    cost (every group's product over all T rows or indices, masked: E times the grouped FLOPs)."""
    c = (check_ragged_dot if op == "ragged_dot" else check_grouped_mm)(a, b, index, out_dtype, fn="explain")
    s = c.shape
    what = (f"{s.groups} groups of the {s.rows} contraction indices: a [{s.m}, {s.rows}] @ b [{s.rows}, {s.n}] "
            f"-> [{s.groups}, {s.m}, {s.n}]" if s.ragged_k else
            f"{s.groups} groups of the {s.rows} rows: [{s.rows}, {s.k}] @ [{s.groups}, {s.k}, {s.n}] -> [{s.rows}, {s.n}]")
    flops = 2 * s.m * s.k * s.n if not s.ragged_k else 2 * s.m * s.rows * s.n
    runs = ("XLA's jax.lax.ragged_dot" + ("_general" if s.ragged_k else "") + f" ({flops / 1e9:.3g} GFLOP)"
            if c.owner == "jax" else
            f"the embedded default in {c.owner} ops, {s.groups} masked products of every "
            f"{'index' if s.ragged_k else 'row'} ({s.groups} x the grouped product's {flops / 1e9:.3g} GFLOP)")
    return (f"{op} {c.dtype}->{c.out_dtype} on {c.owner}: {what}\n"
            f"  runs on: {runs}; no grouped kernel yet, no host read of the group sizes")


def run_default(xp: Any, c: Checked, ends: Any) -> Any:
    """The embedded default on the owner framework's own ops; `ends` are the groups' end offsets,
    on the device. Where a grouped kernel plugs in: plan a GroupedProblem and run the chosen kernel."""
    acc = "float64" if c.dtype == "float64" else "float32"
    acc_t, out_t = arrays.framework_dtype(c.owner, acc), arrays.framework_dtype(c.owner, c.out_dtype)
    if c.shape.ragged_k:
        return contract_groups(xp, c.a, c.b, ends, acc_t, out_t)
    return multiply_groups(xp, c.a, c.b, ends, acc_t, out_t)


def _group_of_rows(xp: Any, ends: Any, rows: int, device: Any) -> Any:
    """Each row's group, on the device: E for rows at or beyond ends[-1] (they belong to none)."""
    return xp.searchsorted(ends, xp.arange(rows, dtype=ends.dtype, device=device), side="right")


def multiply_groups(xp: Any, lhs: Any, rhs: Any, ends: Any, acc: Any, out: Any) -> Any:
    """out[t] = lhs[t] @ rhs[group of t], zero for rows in no group. Any strides."""
    dev = lhs.device                 # not array_api_compat.device(): its lru_cache makes torch.compile warn
    rows, groups, n = lhs.shape[0], rhs.shape[0], rhs.shape[2]
    group = _group_of_rows(xp, ends, rows, dev)
    lhs_acc = xp.astype(lhs, acc)
    result = xp.zeros((rows, n), dtype=acc, device=dev)
    for e in range(groups):          # select, not add: other groups' NaN/Inf never reach a row
        result = xp.where((group == e)[:, None], xp.matmul(lhs_acc, xp.astype(rhs[e, ...], acc)), result)
    return xp.astype(result, out)


def contract_groups(xp: Any, a: Any, b: Any, ends: Any, acc: Any, out: Any) -> Any:
    """out[e] = a[:, T_e] @ b[T_e, :] over the contraction indices T_e of group e; zeros for an
    empty group and for indices in no group."""
    dev = a.device
    m, rows, n, groups = a.shape[0], a.shape[1], b.shape[1], ends.shape[0]
    group = _group_of_rows(xp, ends, rows, dev)
    a_acc, b_acc = xp.astype(a, acc), xp.astype(b, acc)
    zero = xp.zeros((), dtype=acc, device=dev)
    blocks = []
    for e in range(groups):          # both sides masked: 0 * NaN would leak from the other one
        mine = group == e
        blocks.append(xp.matmul(xp.where(mine[None, :], a_acc, zero), xp.where(mine[:, None], b_acc, zero)))
    result = xp.stack(blocks) if blocks else xp.zeros((0, m, n), dtype=acc, device=dev)
    return xp.astype(result, out)
