"""Grouped (ragged) GEMM in JAX: ragged_dot / grouped_mm with their custom_vjp, a vmap rule, and an
expert-parallel sharding over a mesh axis.

    ragged_dot(lhs[T, K], rhs[E, K, N], group_sizes[E]) -> [T, N]     jax.lax.ragged_dot's semantics
    grouped_mm(x[T, K], w[E, K, N], offs[E]) -> [T, N]                torch._grouped_mm's offsets
    grouped_mm(x[M, T], w[T, N], offs[E]) -> [E, M, N]                the variable-K product
    ragged_dot_expert_parallel(lhs, rhs, group_sizes, mesh, axis)    rhs sharded over experts

Rows beyond sum(group_sizes) are zeros; group sizes stay on the device (traced under jit: never
concretized). xgemm/grouped.py's docstring has the full semantics.

Both products are one primitive, xgemm_grouped (a, b, sizes; static: the result dtype, the mode
and the operands' majorness). Its cuda lowering plans a GroupedProblem as eager calls do and emits
the chosen kernel's call (on Hopper cute_gemm_sm90's grouped class for row groups, a TVM-FFI call,
and kernels/triton_grouped_sm90.py's cubin for the variable-K product and under export: ends =
cumsum(sizes) on the device, then one custom call); elsewhere, or for a problem they decline,
XLA's ragged_dot (the embedded default). The backward is
    dlhs = ragged_dot(dout, rhs^T, group_sizes)
    drhs[e] = lhs_e^T @ dout_e  (the variable-K product; zeros for an empty group)
and both call this module's custom_vjp functions, so reverse over reverse works (forward mode,
jvp, does not, as for xgemm.jax.gemm). A transposed operand (rhs^T, lhs^T, dout^T) is handed to
the primitive with a column-major layout request, so XLA makes the transpose a bitcast.

vmap: XLA's ragged_dot batches only when every operand is batched; the rule here folds any batching
into ONE unbatched call instead: rows are permuted (on the device) so that each group's rows of every
batch element are contiguous, and the result is gathered back. Cost: a gather of lhs and of the
result; rhs is never copied when it is shared (unbatched), and reshaped (free) when batched.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.extend.core import Primitive
from jax.interpreters import mlir
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from xgemm import arrays, errors
from xgemm.core import checks, epilogues, grouped_checks, layout, policy
from xgemm.core.problem import COL, ROW, Device
from xgemm.jax import ffi as jax_ffi
from xgemm.jax import inputs, lowering, primitives
from xgemm.runtime.calls import Launch, TvmFfiCall

# the variable-K product: a [T, M] . b [T, N] contracted over T, which is ragged -> [E, M, N]
_CONTRACT_GROUPS = jax.lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((0,), (0,)), ((), ())), lhs_ragged_dimensions=[0], rhs_group_dimensions=[])


def _checked(fn: str, names: tuple, a: Any, b: Any, index: Any, out_dtype: Any, ragged_dot: bool):
    a, b, index = (inputs.as_jax(fn, n, x) for n, x in zip(names, (a, b, index)))
    dt = checks.operand_dtypes(fn, names[:2], arrays.requested_dtype(a.dtype), arrays.requested_dtype(b.dtype))
    grouped_checks.index_dtype(fn, names[2], arrays.requested_dtype(index.dtype))
    check = grouped_checks.ragged_dot if ragged_dot else grouped_checks.grouped_mm
    shape = check(fn, a.shape, b.shape, index.shape)
    out = checks.out_dtype(fn, dt, arrays.requested_dtype(out_dtype))
    if index.dtype != jnp.int32:
        # int32 on the device, as the kernels read them; a size or offset past T means T (every row
        # after it in that group), so capping at T first keeps an int64 one from wrapping
        index = jnp.minimum(index, shape.rows).astype(jnp.int32)
    return a, b, index, out, shape


def ragged_dot(lhs: Any, rhs: Any, group_sizes: Any, *, preferred_element_type: Any = None,
               activation: Any = None, fn: str = "ragged_dot") -> jax.Array:
    """lhs [T, K] in contiguous groups of group_sizes[e] rows, each times rhs[e] [K, N] -> [T, N].
    preferred_element_type: the result dtype (lhs.dtype by default; float32 allowed for fp16/bf16);
    fp16/bf16 accumulate in float32. Rows beyond sum(group_sizes) are zeros. activation: as
    xgemm.ragged_dot takes it (a gated one halves N): fused into the grouped kernel's epilogue
    where one takes it, composed under differentiation (_ragged_dot_act)."""
    names = grouped_checks.ARG_NAMES["ragged_dot"]
    lhs, rhs, sizes, out, _ = _checked(fn, names, lhs, rhs, group_sizes, preferred_element_type, True)
    grouped_checks.activation(fn, activation, names, rhs.shape)
    if activation is None:
        return _jit_ragged_dot(lhs, rhs, sizes, out, ROW)
    return _jit_ragged_dot_act(lhs, rhs, sizes, out, ROW, activation)


def grouped_mm(x: Any, w: Any, offs: Any, *, out_dtype: Any = None, activation: Any = None,
               fn: str = "grouped_mm") -> jax.Array:
    """torch._grouped_mm's convention (offs: each group's end offset, cumulative): x [T, K] with
    w [E, K, N] -> [T, N], or x [M, T] with w [T, N] -> [E, M, N] (the variable-K product).
    activation: as ragged_dot takes it."""
    names = grouped_checks.ARG_NAMES["grouped_mm"]
    x, w, offs, out, shape = _checked(fn, names, x, w, offs, out_dtype, False)
    grouped_checks.activation(fn, activation, names, w.shape)
    sizes = jnp.diff(offs, prepend=jnp.zeros((1,), offs.dtype))
    if not shape.ragged_k:
        if activation is None:
            return _jit_ragged_dot(x, w, sizes, out, ROW)
        return _jit_ragged_dot_act(x, w, sizes, out, ROW, activation)
    if activation is None:
        return _jit_contract(x.T, w, sizes, out)
    # no kernel fuses an epilogue into the variable-K product: composed (jax.grad differentiates it)
    y = epilogues.activate(jnp, _jit_contract(x.T, w, sizes, _acc_name(x.dtype)), activation)
    return y.astype(arrays.framework_dtype("jax", out))


def _acc_name(dt: Any) -> str:
    """The accumulation (and composed epilogue) dtype of fp16/bf16/fp32 or float64 operands."""
    return "float64" if np.dtype(dt) == np.float64 else "float32"


def ragged_dot_expert_parallel(lhs: Any, rhs: Any, group_sizes: Any, mesh: jax.sharding.Mesh, axis: str, *,
                               preferred_element_type: Any = None, fn: str = "ragged_dot_expert_parallel"):
    """ragged_dot with the experts sharded over mesh axis `axis` (D devices): no collective.

    Layout (the caller's token dispatch produces it):
      rhs [E, K, N]: sharded over E, PartitionSpec(axis): device d holds experts
          [d*E/D, (d+1)*E/D) (E a multiple of D).
      group_sizes [E]: the global sizes, sharded like rhs: device d reads the sizes of its experts.
      lhs [D*C, K]: sharded over rows in D equal blocks of capacity C, PartitionSpec(axis): block d
          holds the rows of device d's experts, grouped by expert in expert order from the block's
          start; the block's rows after its experts' total (padding, sum of its sizes <= C) are
          ignored and give zero rows.
    Result [D*C, N], sharded over rows like lhs. Other mesh axes: operands replicated over them.
    Each device runs ragged_dot(its block, its experts, their sizes); grads (custom_vjp) shard alike.
    """
    lhs, rhs, sizes, out, shape = _checked(fn, grouped_checks.ARG_NAMES["ragged_dot"], lhs, rhs, group_sizes,
                                           preferred_element_type, True)
    if not isinstance(mesh, jax.sharding.Mesh):
        raise errors.ShapeError(f"{fn}: mesh is a {type(mesh).__name__}; pass a jax.sharding.Mesh (e.g. "
                                f"jax.make_mesh((D,), ('e',))) whose axis `axis` shards the experts")
    if not isinstance(axis, str) or axis not in mesh.shape:
        raise errors.ShapeError(f"{fn}: axis {axis!r} is not an axis of the mesh {dict(mesh.shape)}; "
                                f"pass one of {tuple(mesh.shape)}")
    d = mesh.shape[axis]
    if shape.groups % d or shape.rows % d:
        raise errors.ShapeError(f"{fn}: rhs has {shape.groups} experts and lhs {shape.rows} rows over {d} devices "
                                f"of axis {axis!r}; both must be multiples of {d} (pad lhs to D blocks of equal "
                                f"capacity, and the experts to a multiple of D with empty groups)")
    specs = (PartitionSpec(axis, None), PartitionSpec(axis, None, None), PartitionSpec(axis))
    placed = (lhs, rhs, sizes)
    if dict(zip(mesh.axis_names, mesh.axis_types))[axis] == AxisType.Explicit:
        # jax.make_mesh's default: shard_map takes operands only as its in_specs say (Auto axes
        # reshard by themselves); a no-op where they already are
        placed = [jax.reshard(x, NamedSharding(mesh, s)) for x, s in zip(placed, specs)]
    # check_vma=False: xgemm_grouped's abstract eval does not track varying manual axes (every
    # operand and the result vary over `axis` alike here)
    local = jax.shard_map(lambda l, r, g: _ragged_dot(l, r, g, out, ROW), mesh=mesh, in_specs=specs,
                          out_specs=specs[0], check_vma=False)
    return local(*placed)


# ---------------------------------------------------------------------------------------------
# The forward products (XLA's ragged dot here; a kernel's primitive later), with their vmap rule

# float32 products in float32 on GPUs too (no TF32), as the GEMM reference (primitives.py)
_PRECISION = jax.lax.Precision.HIGHEST


# ---------------------------------------------------------------------------------------------
# The primitive: rows mode a [T, K], b [E, K, N] -> [T, N]; ragged_k a [M, T], b [T, N] -> [E, M, N].
# a_major / b_major: the layout to ask XLA for (COL where the operand is a transpose).

grouped_p = Primitive("xgemm_grouped")


def _shape(a, b, sizes) -> grouped_checks.GroupedShape:
    """The primitive's operands as grouped_mm takes them: b 3-D for row groups, 2-D for ragged_k."""
    return grouped_checks.grouped_mm("xgemm_grouped", a.shape, b.shape, sizes.shape)


def _grouped_abstract(a, b, sizes, *, out, ragged_k, a_major=ROW, b_major=ROW, activation=None):
    shape = _shape(a, b, sizes).out
    if activation in epilogues.GATED:
        shape = (*shape[:-1], shape[-1] // 2)
    return jax.core.ShapedArray(shape, np.dtype(out))


def _grouped_reference(a, b, sizes, *, out, ragged_k, a_major=ROW, b_major=ROW, activation=None, selected=False):
    """XLA's ragged dot (selected: _selected_groups), accumulated in float32 (float64 for float64),
    then the activation (or gate) in that type: what compose.run_grouped composes."""
    if selected:
        y = _selected_groups(a, b, sizes, ragged_k)
    elif ragged_k:
        y = jax.lax.ragged_dot_general(a.T, b, sizes, _CONTRACT_GROUPS, precision=_PRECISION,
                                       preferred_element_type=_acc_name(a.dtype))
    else:
        y = jax.lax.ragged_dot(a, b, sizes, precision=_PRECISION, preferred_element_type=_acc_name(a.dtype))
    if activation is not None:
        y = epilogues.activate(jnp, y, activation)
    return y.astype(out)


def _selected_groups(a, b, sizes, ragged_k):
    """The grouped product by selection, as kernels/reference.py's multiply_groups and
    contract_groups compute it: XLA's CPU ragged dot multiplies every group's rows by every
    expert's weights masked to zero, so a NaN or Inf in one expert reached every row (0 * inf).
    Each row here takes its own expert's product; the variable-K form masks both sides. Dense like
    XLA's CPU path (E products of all rows)."""
    acc = _acc_name(a.dtype)
    e = sizes.shape[0]
    ends = jnp.cumsum(sizes)
    rows = a.shape[1] if ragged_k else a.shape[0]
    group = jnp.searchsorted(ends, jnp.arange(rows, dtype=ends.dtype), side="right")     # e: in no group
    if ragged_k:                    # a [M, T], b [T, N] -> [E, M, N]
        mine = group[None, :] == jnp.arange(e, dtype=group.dtype)[:, None]              # [E, T]
        a_e = jnp.where(mine[:, None, :], a.astype(acc)[None], 0)
        b_e = jnp.where(mine[:, :, None], b.astype(acc)[None], 0)
        return jnp.einsum("emt,etn->emn", a_e, b_e, precision=_PRECISION)
    if e == 0:
        return jnp.zeros((rows, b.shape[2]), acc)
    every = jnp.einsum("tk,ekn->etn", a.astype(acc), b.astype(acc), precision=_PRECISION)
    picked = jnp.take_along_axis(every, jnp.minimum(group, e - 1)[None, :, None], axis=0)[0]
    return jnp.where((group < e)[:, None], picked, 0)


def explain(op: str, a: Any, b: Any, index: Any, out_dtype: Any = None, activation: Any = None) -> str:
    """The plan xgemm.jax's ragged_dot / grouped_mm lowers to for these arrays' platform: the
    grouped kernel's custom call on a Hopper GPU, else XLA's ragged dot; with an activation, the
    epilogue line too (fused where the kernel takes it, else composed)."""
    names = grouped_checks.ARG_NAMES[op]
    a, b, index, out, shape = _checked("explain", names, a, b, index, out_dtype, op == "ragged_dot")
    gated = grouped_checks.activation("explain", activation, names, b.shape)
    fused = activation is not None and not shape.ragged_k
    acc = _acc_name(a.dtype)
    # as the custom_vjp functions bind it: ragged_k's x [M, T] asked column-major (x^T's rows)
    problem = _grouped_problem(a, b, index, out if activation is None or fused else acc,
                               COL if shape.ragged_k else ROW, ROW, activation if fused else None)
    if not _on_gpu(a):
        problem = dataclasses.replace(problem, device=Device("cpu"))
    plan = policy.choose("grouped", problem)
    if activation is not None:
        by = plan.kernel.name if fused and plan.kernel.name != "reference" else None
        plan.epilogue = epilogues.describe(False, activation, gated, acc, "jax", by) + (
            "; composed under jax.grad" if by else "")
    return f"{op} (inside jax.jit): " + str(plan)


def _on_gpu(x: Any) -> bool:
    return any(d.platform == "gpu" for d in x.devices())


def _grouped_problem(a, b, sizes, out, a_major, b_major, activation=None) -> grouped_checks.GroupedProblem:
    def operand(x, major):
        return layout.dense_operand(tuple(x.shape), np.dtype(x.dtype).name, np.dtype(x.dtype).itemsize, major)
    return grouped_checks.GroupedProblem(_shape(a, b, sizes), operand(a, a_major), operand(b, b_major),
                                         np.dtype(out).name, "jax", lowering.target_device(), activation)


def _grouped_cuda(a, b, sizes, *, out, ragged_k, portable, a_major=ROW, b_major=ROW, activation=None):
    """The chosen kernel's custom call on (a, b, ends = cumsum(sizes)), or XLA's ragged dot. An
    activation no kernel fuses here (an export: the fusing class's TVM-FFI call cannot leave the
    process) follows the product's own lowering, in float32 (float64), composed in jax.numpy."""
    kw = dict(out=out, ragged_k=ragged_k, a_major=a_major, b_major=b_major, activation=activation)
    # (the kernel declines an empty problem)
    problem = _grouped_problem(a, b, sizes, out, a_major, b_major, activation)
    made = _lowered(problem, portable)
    if not isinstance(made, (Launch, TvmFfiCall)) and activation is not None:
        pre = _grouped_cuda(a, b, sizes, **dict(kw, out=_acc_name(a.dtype), activation=None), portable=portable)
        return epilogues.activate(jnp, pre, activation).astype(out)
    if not isinstance(made, (Launch, TvmFfiCall)):
        return _grouped_reference(a, b, sizes, **kw)
    lowering.ensure_registered()
    ends = jnp.cumsum(sizes, dtype=jnp.int32)
    layouts = [lowering.col_layout(x.ndim) if major == COL else None for x, major in ((a, a_major), (b, b_major))]
    call = jax_ffi.call if isinstance(made, Launch) else jax_ffi.call_tvm_ffi
    (y,) = call(made, [a, b, ends], [jax.ShapeDtypeStruct(problem.out_shape, np.dtype(out))],
                in_layouts=layouts + [None])
    return y


def _lowered(problem, portable: bool):
    """The chosen kernel's launch; for an export, where the chosen kernel has none that leaves the
    process (a TVM-FFI class), the first kernel after it in the table that takes the problem."""
    lowered = policy.built_or_none(lambda: policy.attempt(
        policy.choose("grouped", problem), lambda plan: plan.kernel.jax_lowering(problem, plan.policy, portable=portable)))
    if lowered is None:         # the class that fuses the activation could not be built here: composed
        return None
    plan, made = lowered
    if made is not None or not portable:
        return made
    names = policy.kernel_names("grouped")
    for name in names[names.index(plan.kernel.name) + 1:]:
        try:
            with policy.force(name):
                nxt = policy.choose("grouped", problem)
        except errors.KernelUnavailableError:           # it declines the problem
            continue
        made = nxt.kernel.jax_lowering(problem, nxt.policy, portable=portable)
        if made is not None:
            return made
    return None


def _grouped_cuda_rule(ctx, a, b, sizes, **params):
    fn = functools.partial(_grouped_cuda, portable=lowering.for_export(ctx), **params)
    return mlir.lower_fun(fn, multiple_results=False)(ctx, a, b, sizes)


grouped_p.def_abstract_eval(_grouped_abstract)
grouped_p.def_impl(lambda *args, **params: jax.jit(functools.partial(grouped_p.bind, **params))(*args))
def _grouped_reference_rule(ctx, a, b, sizes, *, selected=False, **params):
    primitives.forced_only_reference(ctx, "grouped")
    fn = functools.partial(_grouped_reference, selected=selected, **params)
    return mlir.lower_fun(fn, multiple_results=False)(ctx, a, b, sizes)


mlir.register_lowering(grouped_p, _grouped_reference_rule)
mlir.register_lowering(grouped_p, functools.partial(_grouped_reference_rule, selected=True), platform="cpu")
mlir.register_lowering(grouped_p, _grouped_cuda_rule, platform="cuda")


@functools.lru_cache(maxsize=None)
def _multiply_groups(out: str, b_major: str, activation: Any = None):
    """(lhs [T, K], rhs [E, K, N], sizes [E] int32) -> [T, N] of `out` (then the activation, or the
    gate: [T, N / 2])."""
    @custom_vmap
    def multiply(lhs, rhs, sizes):
        return grouped_p.bind(lhs, rhs, sizes, out=out, ragged_k=False, b_major=b_major, activation=activation)

    @multiply.def_vmap
    def multiply_batched(axis_size, in_batched, lhs, rhs, sizes):
        lhs_b, rhs_b, sizes_b = in_batched
        rows, k = lhs.shape[-2:]
        lhs = lhs if lhs_b else jnp.broadcast_to(lhs, (axis_size, rows, k))
        sizes = sizes if sizes_b else jnp.broadcast_to(sizes, (axis_size,) + sizes.shape)
        dest, folded = _fold(sizes, rows, shared=not rhs_b)
        # explicit extents, no -1: reshape cannot infer one where another is 0
        rhs = rhs.reshape((axis_size * rhs.shape[-3],) + rhs.shape[-2:]) if rhs_b else rhs
        y = multiply(lhs.reshape(axis_size * rows, k)[_inverse(dest)], rhs, folded)
        return y[dest.reshape(-1)].reshape(axis_size, rows, y.shape[-1]), True
    return multiply


@functools.lru_cache(maxsize=None)
def _contract_groups(out: str):
    """(a [T, M], b [T, N], sizes [E] int32) -> [E, M, N] of `out`: a_e^T @ b_e per group."""
    @custom_vmap
    def contract(a, b, sizes):
        # the kernel's A is a^T [M, T]: asked for column-major, it is a's own row-major buffer
        return grouped_p.bind(a.T, b, sizes, out=out, ragged_k=True, a_major=COL)

    @contract.def_vmap
    def contract_batched(axis_size, in_batched, a, b, sizes):
        rows, groups = a.shape[-2], sizes.shape[-1]
        a, b, sizes = (x if batched else jnp.broadcast_to(x, (axis_size,) + x.shape)
                       for x, batched in zip((a, b, sizes), in_batched))
        dest, folded = _fold(sizes, rows, shared=False)
        src = _inverse(dest)
        flat = axis_size * rows                      # explicit, no -1 (as in multiply_batched)
        y = contract(a.reshape(flat, a.shape[-1])[src], b.reshape(flat, b.shape[-1])[src], folded)
        return y.reshape((axis_size, groups) + y.shape[1:]), True
    return contract


def _fold(sizes: Any, rows: int, *, shared: bool):
    """A batch of groupings -> one: sizes [B, E] of B row sets of `rows` rows each. Returns dest
    [B, rows] (where row t of batch b goes among the B*rows folded rows) and the folded group sizes:
    shared=True (one rhs for the batch): E groups, group e = every batch's rows of group e in batch
    order; shared=False: B*E groups (b, e) in that order. Rows in no group go last, in no group."""
    batch, groups = sizes.shape
    ends = jnp.minimum(jnp.cumsum(sizes, axis=1), rows)                # clipped at T, as ragged_dot
    ends = jnp.concatenate([jnp.zeros((batch, 1), ends.dtype), ends], axis=1)   # [B, E+1], 0 first
    counts = jnp.diff(ends, axis=1)                                    # effective sizes [B, E]
    counts_all = jnp.concatenate([counts, rows - ends[:, -1:]], axis=1)          # + rows in no group
    if shared:
        order = counts_all.T.reshape(-1)                               # group-major
        first = (jnp.cumsum(order) - order).reshape(groups + 1, batch).T
        folded = counts.sum(axis=0, dtype=jnp.int32)
    else:
        flat = counts.reshape(-1)                                      # batch-major, leftovers last
        tail = counts_all[:, -1]
        first = jnp.concatenate([(jnp.cumsum(flat) - flat).reshape(batch, groups),
                                 (flat.sum() + jnp.cumsum(tail) - tail)[:, None]], axis=1)
        folded = flat.astype(jnp.int32)
    t = jnp.arange(rows, dtype=ends.dtype)
    group = jax.vmap(lambda e: jnp.searchsorted(e[1:], t, side="right"))(ends)   # [B, rows] in [0, E]
    start = jnp.take_along_axis(ends, group, axis=1)
    dest = jnp.take_along_axis(first, group, axis=1) + t - start
    return dest.astype(jnp.int32), folded


def _inverse(dest: Any) -> Any:
    """The permutation's inverse: src[dest[i]] = i."""
    n = dest.size
    return jnp.zeros((n,), jnp.int32).at[dest.reshape(-1)].set(jnp.arange(n, dtype=jnp.int32), unique_indices=True)


# ---------------------------------------------------------------------------------------------
# custom_vjp: the backward as grouped products of this module

@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _ragged_dot(lhs, rhs, sizes, out: str, b_major: str):
    return _multiply_groups(out, b_major)(lhs, rhs, sizes)


def _ragged_dot_fwd(lhs, rhs, sizes, out, b_major):
    return _ragged_dot(lhs, rhs, sizes, out, b_major), (lhs, rhs, sizes)


def _ragged_dot_bwd(out, b_major, res, dy):
    lhs, rhs, sizes = res
    dy = dy.astype(lhs.dtype)      # the kernels' input dtype; accumulation is float32 again
    dlhs = _ragged_dot(dy, jnp.swapaxes(rhs, 1, 2), sizes, np.dtype(lhs.dtype).name, _flip(b_major))
    drhs = _contract(lhs, dy, sizes, np.dtype(rhs.dtype).name)
    return dlhs, drhs, None


def _flip(major: str) -> str:
    """The layout to ask for a transpose of an operand asked for as `major`."""
    return ROW if major == COL else COL


_ragged_dot.defvjp(_ragged_dot_fwd, _ragged_dot_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _ragged_dot_act(lhs, rhs, sizes, out: str, b_major: str, activation: str):
    """act(ragged_dot) in one primitive: the grouped kernel fuses the activation (or gate) into its
    epilogue. Differentiated, it is composed instead (the backward needs the product): the product
    in float32 (float64 for float64) through _ragged_dot, the activation in that type, one cast."""
    return _multiply_groups(out, b_major, activation)(lhs, rhs, sizes)


def _ragged_dot_act_fwd(lhs, rhs, sizes, out, b_major, activation):
    acc = _acc_name(lhs.dtype)
    pre, product_vjp = jax.vjp(lambda l, r: _ragged_dot(l, r, sizes, acc, b_major), lhs, rhs)
    y, act_vjp = jax.vjp(lambda p: epilogues.activate(jnp, p, activation).astype(out), pre)
    return y, (product_vjp, act_vjp)


def _ragged_dot_act_bwd(out, b_major, activation, res, dy):
    product_vjp, act_vjp = res
    dlhs, drhs = product_vjp(*act_vjp(dy))
    return dlhs, drhs, None


_ragged_dot_act.defvjp(_ragged_dot_act_fwd, _ragged_dot_act_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _contract(a, b, sizes, out: str):
    """a [T, M], b [T, N] -> [E, M, N]."""
    return _contract_groups(out)(a, b, sizes)


def _contract_fwd(a, b, sizes, out):
    return _contract(a, b, sizes, out), (a, b, sizes)


def _contract_bwd(out, res, dy):
    a, b, sizes = res
    dy = dy.astype(a.dtype)
    da = _ragged_dot(b, jnp.swapaxes(dy, 1, 2), sizes, np.dtype(a.dtype).name, COL)    # [T, M]
    db = _ragged_dot(a, dy, sizes, np.dtype(b.dtype).name, ROW)                    # [T, N]
    return da, db, None


_contract.defvjp(_contract_fwd, _contract_bwd)

# eager arrays run one compiled call; inside a trace the jit is inlined
_jit_ragged_dot = jax.jit(_ragged_dot, static_argnums=(3, 4))
_jit_ragged_dot_act = jax.jit(_ragged_dot_act, static_argnums=(3, 4, 5))
_jit_contract = jax.jit(_contract, static_argnums=3)
