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

run() plans a GroupedProblem (policy.choose("grouped", ...), core/registry.py): on Hopper the
row groups run on cute_gemm_sm90's grouped class and the variable-K product on the persistent
Triton kernel (kernels/triton_grouped_sm90.py), each finding a tile's group on the device;
elsewhere, or for what both decline, the embedded default (kernels/reference.py), a masked product
per group in the framework's own ops. Neither reads the group sizes on the host (no
device synchronization: CUDA-graph capturable, and a torch.compile trace has no data-dependent
branch). fp16/bf16 accumulate in float32, float64 in float64. run_fused() asks for an activation
or gate in the grouped class's epilogue (compose.run_grouped composes it where none fuses it).

Autograd and torch.compile: torch tensors that need them go through the torch.library op
xgemm::grouped_mm (torch/grouped_ops.py, which calls back into this module's eager path); that
routing is the public entry's (api.py), as for gemm, since the op imports this module.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

from xgemm import arrays, errors, prepare
from xgemm.core import checks, grouped_checks, layout, policy
from xgemm.core.dtypes import ITEMSIZE
from xgemm.core.problem import COL, ROW


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
    return _check(fn, grouped_checks.ARG_NAMES["ragged_dot"], lhs, rhs, group_sizes, out_dtype, True)


def check_grouped_mm(x: Any, w: Any, offs: Any, out_dtype: Any = None, *, fn: str = "grouped_mm") -> Checked:
    return _check(fn, grouped_checks.ARG_NAMES["grouped_mm"], x, w, offs, out_dtype, False)


def ragged_dot(lhs: Any, rhs: Any, group_sizes: Any, *, out_dtype: Any = None, fn: str = "ragged_dot") -> Any:
    """lhs [T, K] in E contiguous groups of group_sizes[e] rows, row-group e times rhs[e] [K, N]:
    out [T, N] in lhs's framework, of lhs.dtype (or out_dtype: float32 for fp16/bf16 operands).
    jax.lax.ragged_dot's semantics, rows beyond sum(group_sizes) zero (module docstring)."""
    c = check_ragged_dot(lhs, rhs, group_sizes, out_dtype, fn=fn)
    if c.owner == "jax":
        from xgemm.jax import grouped as jax_grouped
        return jax_grouped.ragged_dot(c.a, c.b, c.index, preferred_element_type=c.out_dtype, fn=fn)
    xp = arrays.namespace(c.owner)
    return run(c, xp.cumulative_sum(c.index))


def grouped_mm(x: Any, w: Any, offs: Any, *, out_dtype: Any = None, fn: str = "grouped_mm") -> Any:
    """torch._grouped_mm's offsets (offs[e]: the end of group e, cumulative, int32 or int64):
    x [T, K], w [E, K, N] -> [T, N] (x's rows [offs[e-1], offs[e]) times w[e]; rows beyond offs[-1]
    zero), or x [M, T], w [T, N] -> [E, M, N] (group e: x[:, offs[e-1]:offs[e]] @ w[offs[e-1]:offs[e]],
    zeros for an empty group). Result in x's framework, of x.dtype or out_dtype."""
    c = check_grouped_mm(x, w, offs, out_dtype, fn=fn)
    if c.owner == "jax":
        from xgemm.jax import grouped as jax_grouped
        return jax_grouped.grouped_mm(c.a, c.b, c.index, out_dtype=c.out_dtype, fn=fn)
    return run(c, c.index)


def explain(op: str, a: Any, b: Any, index: Any, out_dtype: Any = None) -> str:
    """What a ragged_dot / grouped_mm call runs, in words: its problem, the kernel and policy, and
    why the kernels before it declined."""
    c = (check_ragged_dot if op == "ragged_dot" else check_grouped_mm)(a, b, index, out_dtype, fn="explain")
    if c.owner == "jax":
        from xgemm.jax import grouped as jax_grouped
        return jax_grouped.explain(op, c.a, c.b, c.index, c.out_dtype)
    return f"{op}: " + str(_plan(c)[0])


def run_fused(op: str, a: Any, b: Any, index: Any, out_dtype: Any, activation: str, *, fn: str,
              plan_only: bool = False) -> Any:
    """ragged_dot / grouped_mm (op) with `activation` (gemm's, or a gate over rhs's [gate | up]
    columns) fused into the grouped kernel's epilogue: the result (with plan_only, the Plan), or
    None where no kernel fuses it (JAX arrays, the variable-K product, no GPU kernel takes the
    problem), and the caller composes it (compose.run_grouped)."""
    c = (check_ragged_dot if op == "ragged_dot" else check_grouped_mm)(a, b, index, out_dtype, fn=fn)
    if c.owner == "jax" or c.shape.ragged_k:
        return None
    planned = _plan(c, activation)
    if planned[0].kernel.name == "reference":       # a plan naming the reference means "compose"
        return None
    if plan_only:
        return planned[0]
    ends = arrays.namespace(c.owner).cumulative_sum(c.index) if op == "ragged_dot" else c.index
    return run(c, ends, planned=planned)


def _plan(c: Checked, activation: Optional[str] = None):
    """(plan, A view, B view, the majorness each must be copied to or None): the plan of the
    operands as they are or, where only the kernel-friendly layouts (_READS) would get a kernel,
    of those, with the copies they take recorded for explain()."""
    va, vb = arrays.view(c.a, "a", "grouped"), arrays.view(c.b, "b", "grouped")
    ops = (arrays.operand(va), arrays.operand(vb))
    plan = policy.choose("grouped", _problem(c, ops, va.device, activation))
    if plan.kernel.name != "reference":
        return plan, va, vb, (None, None)
    want = _READS[c.shape.ragged_k]
    moves = tuple(None if op.majorness == major else major for op, major in zip(ops, want))
    if moves == (None, None):
        return plan, va, vb, moves
    fresh = tuple(op if move is None else layout.dense_operand(op.shape, op.dtype, ITEMSIZE[op.dtype], move)
                  for op, move in zip(ops, moves))
    staged = policy.choose("grouped", _problem(c, fresh, va.device, activation))
    if staged.kernel.name == "reference":
        return plan, va, vb, (None, None)
    staged.declined = list(plan.declined)
    staged.copies = [f"{name}: {op.majorness}-major {op.shape} -> a {move}-major copy ({c.owner})"
                     for name, op, move in zip(("a", "b"), ops, moves) if move is not None]
    return staged, va, vb, moves


# The layouts (A, B) a grouped kernel reads without a TMA load starting inside a 16-byte chunk:
# the grouped axis is never the contiguous one (a group starts at any row of it)
_READS = {False: (ROW, ROW), True: (COL, ROW)}


def _problem(c: Checked, ops, device, activation: Optional[str] = None) -> grouped_checks.GroupedProblem:
    return grouped_checks.GroupedProblem(c.shape, ops[0], ops[1], c.out_dtype, c.owner, device, activation)


def _moved(v: arrays.ArrayView, major, name: str) -> arrays.ArrayView:
    """v itself, or a copy of it stored `major`-major (COL: a row-major copy of the transpose,
    transposed back, which is a view)."""
    if major is None:
        return v
    if major == ROW:
        return arrays.compact(v, name, [])
    t = arrays.compact(arrays.view(v.obj.T, name, "grouped"), name, [])
    return arrays.view(t.obj.T, name, "grouped")


def run(c: Checked, ends: Any, out: Any = None, *, planned=None) -> Any:
    """Run the chosen kernel (or planned's: a _plan() result); `ends` are the groups' end offsets,
    on the device. (The kernel declines an empty problem: the embedded default makes its zeros.)
    `out`: an array of the result's shape and dtype to write (the GPU tests hand in a NaN-filled
    one), else a new one."""
    plan, va, vb, moves = planned or _plan(c)
    if plan.kernel.name != "reference":
        out = arrays.empty(c.owner, plan.problem.out_shape, c.out_dtype, va.device, c.a) if out is None else out
        # dense, 16-byte aligned int32, as the kernels read them: such ends are read in place (a captured
        # graph replays their new values), any others copied
        v = arrays.view(ends, "ends", "grouped")
        if v.dtype != "int32" or v.ptr % 16 or (v.size > 1 and v.strides != (1,)):
            # an end past T means T: capped first, an int64 one cannot wrap in the int32 copy
            xp = arrays.namespace(c.owner)
            ends = xp.astype(xp.clip(ends, max=c.shape.rows), arrays.framework_dtype(c.owner, "int32"), copy=True)
    operands = (_moved(va, moves[0], "a"), _moved(vb, moves[1], "b"), arrays.view(ends, "ends", "grouped"))
    return prepare.run(prepare.Prepared(plan, operands, None if out is None else arrays.view(out, "out", "grouped"),
                                        lambda result: result))
