"""How an xgemm call partitions under jax.jit with sharded operands (custom_partitioning).

GEMM D[b..., m, n] = sum_k A[b..., m, k] B[b..., k, n]:
  batch dims keep the operands' sharding, A's rows (m) stay row-sharded, B's columns (n) stay
  column-sharded, and a sharded K runs the local product on each K shard then sums the partial
  results over the K axes (in the accumulator type, before beta*C and the final cast; K_REDUCTION
  below says how). A result the caller shards along rows or columns over the K axes gets a
  reduce-scatter only. A mesh axis can shard one dim only: a later claim on an axis already used
  (batch, then m, then n, then k) is dropped and that operand dim is gathered instead. Size-1
  (broadcast) dims are never sharded.
Softmax: every dim keeps its sharding. Rows run through the kernel on each shard; a sharded
reduced dim instead exchanges one max and one sum per row (pmax / psum), never x itself.
Under Shardy (the default) the same facts are stated as einsum-like sharding rules.
With one device, custom_partitioning inlines the local computation: no custom call is added.
custom_partitioning has no batching or JVP rule; transforms.py puts custom_vmap and custom_vjp
around these functions, so vmap and grad never reach it.
"""
from __future__ import annotations

import itertools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from xgemm.jax import ffi as jax_ffi
from xgemm.jax.lowering import _cuda_devices
from xgemm.jax.primitives import acc_dtype, exchange_p, gemm_exchange_p, gemm_p, softmax_p

Axes = Tuple[str, ...]


def _axes(entry: Any) -> Axes:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _spec(sharding: Any, rank: int) -> List[Axes]:
    spec = getattr(sharding, "spec", None)       # not a NamedSharding: treat as replicated
    entries = list(spec) if spec is not None else []
    entries += [None] * (rank - len(entries))
    return [_axes(e) for e in entries[:rank]]


def _entry(axes: Axes) -> Any:
    return None if not axes else axes[0] if len(axes) == 1 else axes


def plan_gemm(a_shape, b_shape, c_shape, out_shape, a_spec, b_spec, c_spec):
    """Per-dim mesh axes for a, b, c, out and the K axes to psum over. Shapes are tuples."""
    nb = len(out_shape) - 2
    used: set = set()

    def claim(axes: Axes) -> Axes:
        if not axes or any(x in used for x in axes):
            return ()
        used.update(axes)
        return axes

    def operand_dim(shape, j):            # operand dim aligned with out batch dim j, or None
        i = j - (nb - (len(shape) - 2))
        return i if 0 <= i < len(shape) - 2 else None

    out_batch: List[Axes] = []
    for j in range(nb):
        choice: Axes = ()
        for shape, spec in ((a_shape, a_spec), (b_shape, b_spec)):
            i = operand_dim(shape, j)
            if i is not None and shape[i] == out_shape[j] and out_shape[j] > 1 and not choice:
                choice = claim(spec[i])
        out_batch.append(choice)
    m = claim(a_spec[-2]) if a_shape[-2] > 1 else ()
    n = claim(b_spec[-1]) if b_shape[-1] > 1 else ()
    k = claim(a_spec[-1]) or claim(b_spec[-2]) if a_shape[-1] > 1 else ()

    def batch_of(shape):
        dims = []
        for i in range(len(shape) - 2):
            j = i + (nb - (len(shape) - 2))
            dims.append(out_batch[j] if shape[i] == out_shape[j] else ())
        return dims

    a_new = batch_of(a_shape) + [m, k]
    b_new = batch_of(b_shape) + [k, n]
    out_new = out_batch + [m, n]
    c_new = _c_dims(c_shape, out_shape, out_new) if c_shape is not None else None
    return a_new, b_new, c_new, out_new, k


def _named(mesh, dims: Sequence[Axes]) -> NamedSharding:
    return NamedSharding(mesh, P(*(_entry(d) for d in dims)))


# How the K shards' partial products are summed (benchmarks/multi_gpu.py --k-reductions times each;
# figures in docs/performance.md, "xgemm/jax/sharding.py"):
#   "ring"        the output's row blocks travel a ring of collective-permutes; each next device's
#                 kernel adds what it receives as its C (beta = 1), the last hop writes the output
#                 dtype. Blocks go in K_RING_CHUNKS row chunks so every transfer has a product to
#                 run under; a replicated result is shared chunk by chunk, written in place.
#   "gather"      move the inputs instead (all-to-all of A's rows, all-gather of B); XLA serializes
#                 those transfers with the products, so it measured slower than the ring.
#   "scatter"     reduce-scatter of the fp32 partials, cast, all-gather in the output dtype.
#   "all_reduce"  one all-reduce of the fp32 partials (what XLA does for a K-sharded dot).
# All four sum the same fp32 per-shard products in different orders (last bits may differ; tests
# use integer data). A result asked row-sharded over the K axes keeps each device's own block;
# a column-sharded one is always a reduce-scatter.
K_REDUCTIONS = ("ring", "gather", "scatter", "all_reduce")
K_REDUCTION = "ring"
K_RING_CHUNKS = 2          # row chunks per ring block (each hop of a chunk runs under the next one)
K_RING_MIN_ROWS = 1024     # ... when each chunk keeps at least this many rows
# SMs each ring product leaves free for XLA's collective-permute (an NCCL kernel, which needs SMs
# of its own and otherwise serializes with a persistent GEMM holding every SM).
K_RING_SM_MARGIN = 16
# How the ring's blocks move between devices:
#   "copy_engine"  xgemm's own exchange (ffi/peer_exchange.h): a peer cuMemcpyAsync on a side stream,
#                  fused into the next product's custom call, so the copy engines move the block
#                  while that GEMM holds every SM (no SM margin, and XLA cannot reorder a transfer
#                  behind the product it belongs under). A replicated result (no C, 2-D) is
#                  assembled by the exchanges themselves. Needs every device of the mesh in this
#                  process; not inside CUDA graphs.
#   "nccl"         XLA's collective-permute (ppermute), with the SM margin above.
#   "auto"         copy_engine where it can run (CUDA devices all local, or XLA:CPU fake devices
#                  once a test registered the host variant), else nccl.
K_RING_TRANSPORTS = ("auto", "copy_engine", "nccl")
K_RING_TRANSPORT = "auto"
_channels = itertools.count(1)


def _axes_size(mesh, axes: Axes) -> int:
    """Devices along `axes` of the mesh (1 for none)."""
    n = 1
    for name in axes:
        n *= mesh.shape[name]
    return n


def _scatter_dim(result_spec: List[Axes], k: Axes, out_shape, n_k: int, out_dims: List[Axes]):
    """-2 (rows) or -1 (columns) when the requested output shards that dim over exactly the K
    axes, it divides evenly and no other axis shards it already; else None (a replicated result)."""
    for dim in (-2, -1):
        if result_spec[dim] == k and out_shape[dim] % n_k == 0 and not out_dims[dim]:
            return dim
    return None


def _c_dims(c_shape, out_shape, out_dims: List[Axes]) -> List[Axes]:
    """C's dims take the output's sharding where they are not broadcast (size 1 against more)."""
    off = len(out_shape) - len(c_shape)
    return [out_dims[i + off] if c_shape[i] == out_shape[i + off] else () for i in range(len(c_shape))]


def _sum_k_shards(a, b, c, *, k, n_k, scatter, strategy, alpha, beta, out_dtype, a_major, b_major, groups=None):
    """The local K-shard product summed over the K axes, plus beta*C, cast to out_dtype.
    scatter: the output dim left sharded over k (C arrives already sharded the same way), or None.
    groups: the ring's copy-engine route (_device_groups), or None."""
    acc = acc_dtype(a.dtype)
    m = a.shape[-2]
    dim = scatter if scatter is not None else -2
    if scatter is None and (strategy == "all_reduce" or m % n_k):
        part = jax.lax.psum(_product(a, b, None, alpha, acc.name, a_major, b_major), k)
        if c:
            part = part + jnp.asarray(beta, acc) * c[0].astype(acc)
        return part.astype(out_dtype)
    me = jax.lax.axis_index(k)
    if strategy in ("ring", "gather") and dim == -2:
        how = _ring if strategy == "ring" else _gather_inputs
        kw = dict(k=k, n_k=n_k, me=me, alpha=alpha, acc=acc.name, last_dtype=acc.name if c else out_dtype,
                  a_major=a_major, b_major=b_major)
        if strategy == "ring":
            kw.update(groups=groups, plain=not c)
        if scatter is None:                 # replicated result: own rows finished, then shared
            def finish(x, r0):              # x: result rows r0.. of this device's block
                if c:
                    cc = c[0]
                    if cc.ndim >= 2 and cc.shape[-2] != 1:
                        cc = jax.lax.dynamic_slice_in_dim(cc, r0, x.shape[-2], axis=cc.ndim - 2)
                    x = x + jnp.asarray(beta, acc) * cc.astype(acc)
                return x.astype(out_dtype)
            return how(a, b, **kw, finish=finish)
        own = how(a, b, **kw, finish=None)
    else:
        part = _product(a, b, None, alpha, acc.name, a_major, b_major)
        own = jax.lax.psum_scatter(part, k, scatter_dimension=part.ndim + dim, tiled=True)
    if c:
        cc = c[0]
        if scatter is None and cc.ndim >= -dim and cc.shape[dim] != 1:     # replicated C: own block
            cc = jax.lax.dynamic_slice_in_dim(cc, me * own.shape[dim], own.shape[dim], axis=cc.ndim + dim)
        own = own + jnp.asarray(beta, acc) * cc.astype(acc)
    out = own.astype(out_dtype)
    if scatter is None:
        out = jax.lax.all_gather(out, k, axis=out.ndim + dim, tiled=True)
    return out


def _product(a, b, running, alpha, out_dtype, a_major, b_major, sm_margin=0, exchange=None):
    """alpha * a @ b (+ running, the partial sum so far, through the kernel's C: no extra pass).
    exchange: (params, operands) of an exchange to run in the same custom call; the result is
    then (product, what the exchange received)."""
    margin = dict(sm_margin=sm_margin) if sm_margin else {}
    c = () if running is None else (running,)
    params = dict(alpha=alpha, beta=0.0 if running is None else 1.0, out_dtype=out_dtype, has_c=bool(c),
                  a_major=a_major, b_major=b_major, **margin)
    if exchange is None:
        return gemm_p.bind(a, b, *c, **params)
    x_params, x_operands = exchange
    return gemm_exchange_p.bind(a, b, *c, *x_operands, **params, **x_params)


def _device_groups(mesh, k: Axes) -> Optional[Tuple[Tuple[int, ...], ...]]:
    """Local device ordinals of each group along the K axes (rank order = axis_index(k)), or None
    when the copy-engine exchange cannot serve this mesh (K_RING_TRANSPORT, a device of another
    process, a platform without the exchange)."""
    if K_RING_TRANSPORT not in K_RING_TRANSPORTS:
        raise ValueError(f"xgemm.jax.sharding.K_RING_TRANSPORT={K_RING_TRANSPORT!r}: expected one of "
                         f"{K_RING_TRANSPORTS}")
    if K_RING_TRANSPORT == "nccl":
        return None
    devices = np.asarray(mesh.devices)
    flat = list(devices.flat)
    local = all(d.process_index == jax.process_index() for d in flat)
    cuda = set(_cuda_devices())                      # not ROCm: the exchange is a CUDA target
    usable = local and (all(d in cuda for d in flat) or (
        all(d.platform == "cpu" for d in flat) and jax_ffi.exchange_host_test_registered()))
    if not usable:
        if K_RING_TRANSPORT == "copy_engine":
            raise ValueError("xgemm.jax.sharding.K_RING_TRANSPORT='copy_engine' needs every device of the mesh "
                             "in this process on CUDA; set it to 'auto' or 'nccl'")
        return None
    names = list(mesh.axis_names)
    order = [i for i, name in enumerate(names) if name not in k] + [names.index(name) for name in k]
    groups = np.transpose(devices, order).reshape(-1, _axes_size(mesh, k))
    return tuple(tuple(int(d.local_hardware_id) for d in g) for g in groups)


class _Mover:
    """Moves ring blocks: ppermute at once (nccl), or queued to ride on the next product's custom
    call (copy engine). send(key, x, by): device d's x goes to device d + by; take(key): what this
    device received under that key. product(...): the next GEMM, carrying one queued send.
    A send with `into` (copy engine only) lands in rows of one result threaded through all such
    sends (self.result), so no pass assembles the result afterwards."""

    def __init__(self, k: Axes, n_k: int, groups):
        self.k, self.n_k, self.groups = k, n_k, groups
        self.queued: List[Tuple[Any, Any, int, Optional[jax_ffi.Into]]] = []
        self.received: Dict[Any, Any] = {}
        self.result = None

    def send(self, key, x, by: int, into: Optional[jax_ffi.Into] = None) -> None:
        if self.groups is None:
            self.received[key] = jax.lax.ppermute(x, self.k, [(d, (d + by) % self.n_k) for d in range(self.n_k)])
        else:
            self.queued.append((key, x, by, into))

    def _exchange(self, x, by: int, into) -> Tuple[Dict[str, Any], Tuple[Any, ...]]:
        """The exchange's params and its trailing operands (send [, the result so far])."""
        route = jax_ffi.Route(next(_channels), self.groups, tuple((r - by) % self.n_k for r in range(self.n_k)))
        dest = (self.result,) if into is not None and self.result is not None else ()
        return dict(route=route, into=into, has_dest=bool(dest)), (x,) + dest

    def _got(self, key, into, value) -> None:
        if into is not None:
            self.result = value
        self.received[key] = value

    def take(self, key):
        for i, (queued_key, x, by, into) in enumerate(self.queued):   # not carried by a product: alone
            if queued_key == key:
                del self.queued[i]
                params, operands = self._exchange(x, by, into)
                self._got(key, into, exchange_p.bind(*operands, **params))
                break
        return self.received.pop(key)

    def flush(self) -> None:
        while self.queued:
            self.take(self.queued[0][0])

    def product(self, a, b, running, alpha, out_dtype, a_major, b_major, sm_margin):
        if not self.queued:
            return _product(a, b, running, alpha, out_dtype, a_major, b_major, sm_margin)
        key, x, by, into = self.queued.pop(0)
        d, received = _product(a, b, running, alpha, out_dtype, a_major, b_major, sm_margin,
                               exchange=self._exchange(x, by, into))
        self._got(key, into, received)
        return d


def _ring(a, b, *, k, n_k, me, alpha, acc, last_dtype, a_major, b_major, finish, groups=None, plain=False):
    """The ring: row block (me + s + 1) % n at step s, its running sum from the next device fed to
    the kernel as C; after n - 1 hops device `me` holds the whole sum of block `me`, in last_dtype.
    Each block is cut into K_RING_CHUNKS row chunks, stepped chunk by chunk, so a chunk's transfer
    has a product after it that does not need it. finish None: returns the own block. Else every
    own chunk goes through finish(chunk, first row) and then to every device (n - 1 ring shifts,
    each placed into the result in place); returns the whole result. groups: the copy-engine
    route's device groups (_device_groups), or None for ppermute. plain: finish is only a cast to
    last_dtype (no C); with the copy engine and 2-D operands the pieces then land straight in the
    result's rows (jax_ffi.Into), each own chunk copied there beside its first send."""
    rows = a.shape[-2] // n_k
    chunks = K_RING_CHUNKS if rows % K_RING_CHUNKS == 0 and rows // K_RING_CHUNKS >= K_RING_MIN_ROWS else 1
    sub = rows // chunks
    # one chunk: nothing to overlap; copy engine: no NCCL kernel to leave SMs for
    margin = K_RING_SM_MARGIN if chunks > 1 and groups is None else 0
    assemble = finish is not None and plain and groups is not None and a.ndim == 2
    move = _Mover(k, n_k, groups)
    running, pieces = [None] * chunks, []
    for s in range(n_k):
        for j in range(chunks):
            part = jax.lax.dynamic_slice_in_dim(a, ((me + s + 1) % n_k) * rows + j * sub, sub, axis=-2)
            inbox = move.take(("sum", j)) if s else None
            running[j] = move.product(part, b, inbox, alpha, last_dtype if s == n_k - 1 else acc,
                                      a_major, b_major, margin)
            if s < n_k - 1:
                move.send(("sum", j), running[j], -1)
            elif assemble:
                for by in range(1, n_k):
                    move.send(("piece", j, by), running[j], by,
                              jax_ffi.Into(a.shape[-2], rows, j * sub, local=by == 1))
            elif finish is not None:          # (first row, chunk) pairs of the result
                x = finish(running[j], me * rows + j * sub)
                pieces.append((me * rows + j * sub, x))
                for by in range(1, n_k):
                    move.send(("piece", j, by), x, by)
    if finish is None:
        return running[0] if chunks == 1 else jnp.concatenate(running, axis=-2)
    if assemble:
        move.flush()
        return move.result
    pieces += [((me - by) % n_k * rows + j * sub, move.take(("piece", j, by)))
               for j in range(chunks) for by in range(1, n_k)]
    x = pieces[0][1]
    out = jnp.zeros(x.shape[:-2] + (a.shape[-2],) + x.shape[-1:], x.dtype)
    for r0, x in pieces:
        out = jax.lax.dynamic_update_slice_in_dim(out, x, r0, axis=-2)
    return out


def _gather_inputs(a, b, *, k, n_k, me, alpha, acc, last_dtype, a_major, b_major, finish):
    """This device's row block of the result from all of K, the inputs moved instead of partial
    sums: A's row blocks trade places (all-to-all: [d] = A[rows me, K shard d]) and B's K shards
    are all-gathered, bf16 both, while the local shard's product runs; each other shard's product
    then adds the running sum as its C. finish None: returns the own block; else finish(block,
    first row) all-gathered along rows (the whole result)."""
    rows, kl = a.shape[-2] // n_k, a.shape[-1]
    margin = K_RING_SM_MARGIN if n_k > 1 else 0
    lead = a.ndim - 2
    a_own = jax.lax.dynamic_slice_in_dim(a, me * rows, rows, axis=-2)
    running = _product(a_own, b, None, alpha, last_dtype if n_k == 1 else acc, a_major, b_major, margin)
    a_parts = a.reshape(a.shape[:lead] + (n_k, rows, kl))
    a_rows = jax.lax.all_to_all(a_parts, k, split_axis=lead, concat_axis=lead)
    b_all = jax.lax.all_gather(b, k, axis=b.ndim - 2)           # (..., n_k, kl, N)
    for s in range(1, n_k):
        d = (me + s) % n_k
        a_d = jax.lax.dynamic_index_in_dim(a_rows, d, axis=lead, keepdims=False)
        b_d = jax.lax.dynamic_index_in_dim(b_all, d, axis=b.ndim - 2, keepdims=False)
        running = _product(a_d, b_d, running, alpha, last_dtype if s == n_k - 1 else acc, a_major, b_major,
                           margin)
    if finish is None:
        return running
    x = finish(running, me * rows)
    return jax.lax.all_gather(x, k, axis=x.ndim - 2, tiled=True)


def _gemm_partition(alpha, beta, out_dtype, a_major, b_major, mesh, arg_shapes, result_shape):
    a, b = arg_shapes[0], arg_shapes[1]
    c = arg_shapes[2] if len(arg_shapes) > 2 else None
    a_new, b_new, c_new, out_new, k = plan_gemm(
        a.shape, b.shape, c.shape if c is not None else None, result_shape.shape,
        _spec(a.sharding, len(a.shape)), _spec(b.sharding, len(b.shape)),
        _spec(c.sharding, len(c.shape)) if c is not None else None)
    has_c = c is not None
    n_k = _axes_size(mesh, k)
    scatter = _scatter_dim(_spec(result_shape.sharding, len(result_shape.shape)), k, result_shape.shape,
                           n_k, out_new) if k else None
    if scatter is not None:
        out_new = list(out_new)
        out_new[scatter] = k
        if has_c:
            c_new = _c_dims(c.shape, result_shape.shape, out_new)
    strategy = K_REDUCTION
    if strategy not in K_REDUCTIONS:
        raise ValueError(f"xgemm.jax.sharding.K_REDUCTION={strategy!r}: expected one of {K_REDUCTIONS}")

    groups = _device_groups(mesh, k) if k and strategy == "ring" else None

    def lower_fn(a, b, *c):
        if not k:
            return gemm_p.bind(a, b, *c, alpha=alpha, beta=beta, out_dtype=out_dtype, has_c=has_c,
                               a_major=a_major, b_major=b_major)
        return _sum_k_shards(a, b, c, k=k, n_k=n_k, scatter=scatter, strategy=strategy, alpha=alpha, groups=groups,
                             beta=beta, out_dtype=out_dtype, a_major=a_major, b_major=b_major)

    arg_shardings = [_named(mesh, a_new), _named(mesh, b_new)] + ([_named(mesh, c_new)] if has_c else [])
    return mesh, lower_fn, _named(mesh, out_new), tuple(arg_shardings)


def _gemm_infer(alpha, beta, out_dtype, a_major, b_major, mesh, arg_shapes, result_shape):
    a, b = arg_shapes[0], arg_shapes[1]
    c = arg_shapes[2] if len(arg_shapes) > 2 else None
    *_, out_new, _ = plan_gemm(a.shape, b.shape, c.shape if c is not None else None, result_shape.shape,
                               _spec(a.sharding, len(a.shape)), _spec(b.sharding, len(b.shape)),
                               _spec(c.sharding, len(c.shape)) if c is not None else None)
    return _named(mesh, out_new)


def _shape(t) -> Tuple[int, ...]:
    return tuple(jax.interpreters.mlir.ir.RankedTensorType(t).shape)


def _gemm_rule(alpha, beta, out_dtype, a_major, b_major, mesh, value_types, result_types):
    """Shardy rule, e.g. 'b0 m k, b0 k n, b0 m n -> b0 m n' with k a reduction factor."""
    shapes = [_shape(t) for t in value_types]
    out = _shape(result_types[0])
    nb = len(out) - 2
    fresh = iter(f"u{i}" for i in range(64))       # own factors for broadcast (size-1) dims

    def dims(shape, tail):
        names = []
        lead = len(shape) - len(tail)
        for i in range(lead):
            j = i + (len(out) - len(shape))
            names.append(f"b{j}" if j < nb and shape[i] == out[j] else next(fresh))
        return names + list(tail)

    a, b = shapes[0], shapes[1]
    parts = [dims(a, ["m", "k"]), dims(b, ["k", "n"])]
    if len(shapes) > 2:
        c = shapes[2]
        names = []
        for i in range(len(c)):
            j = i + len(out) - len(c)
            same = c[i] == out[j]
            names.append(("m" if j == nb else "n" if j == nb + 1 else f"b{j}") if same else next(fresh))
        parts.append(names)
    out_names = [f"b{j}" for j in range(nb)] + ["m", "n"]
    rule = ", ".join(" ".join(p) for p in parts) + " -> " + " ".join(out_names)
    return rule, {"reduction_factors": ("k",)}


def _gemm_local_nc(a, b, alpha, beta, out_dtype, a_major, b_major):
    return gemm_p.bind(a, b, alpha=alpha, beta=beta, out_dtype=out_dtype, has_c=False,
                       a_major=a_major, b_major=b_major)


def _gemm_local_c(a, b, c, alpha, beta, out_dtype, a_major, b_major):
    return gemm_p.bind(a, b, c, alpha=alpha, beta=beta, out_dtype=out_dtype, has_c=True,
                       a_major=a_major, b_major=b_major)


_gemm_nc = custom_partitioning(_gemm_local_nc, static_argnums=(2, 3, 4, 5, 6))
_gemm_nc.def_partition(partition=_gemm_partition, infer_sharding_from_operands=_gemm_infer,
                       sharding_rule=_gemm_rule)
_gemm_c = custom_partitioning(_gemm_local_c, static_argnums=(3, 4, 5, 6, 7))
_gemm_c.def_partition(partition=_gemm_partition, infer_sharding_from_operands=_gemm_infer,
                      sharding_rule=_gemm_rule)


def gemm(a, b, c, *, alpha: float, beta: float, out_dtype: str, a_major: str = "row", b_major: str = "row"):
    """gemm_p.bind(...) that partitions under a sharded jit (c may be None)."""
    if c is None:
        return _gemm_nc(a, b, alpha, beta, out_dtype, a_major, b_major)
    return _gemm_c(a, b, c, alpha, beta, out_dtype, a_major, b_major)


# ---------------------------------------------------------------------------------------------
# Softmax

def _softmax_dims(axis: int, sharding: Any, shape) -> List[Axes]:
    """Every dim keeps its sharding; the reduced one too when it splits evenly (a padded shard
    would add its padding to the row's max and sum), else it is gathered."""
    dims = _spec(sharding, len(shape))
    if dims[axis] and shape[axis] % _axes_size(sharding.mesh, dims[axis]):
        dims[axis] = ()
    return dims


def _softmax_across(x, axis: int, axes: Axes):
    """Softmax along a dim sharded over `axes`: the row max and the row sum of exp cross the
    devices (pmax / psum of one value per row); x itself never moves. The same arithmetic as
    torch.softmax (an all -inf row gives NaN, as there)."""
    acc = acc_dtype(x.dtype)
    xf = x.astype(acc)
    m = jax.lax.pmax(jnp.max(xf, axis=axis, keepdims=True), axes)
    e = jnp.exp(xf - m)
    return (e / jax.lax.psum(jnp.sum(e, axis=axis, keepdims=True), axes)).astype(x.dtype)


def _softmax_partition(axis, mesh, arg_shapes, result_shape):
    (x,) = arg_shapes
    dims = _softmax_dims(axis, x.sharding, x.shape)
    if dims[axis]:
        lower_fn = lambda x: _softmax_across(x, axis, dims[axis])     # noqa: E731
    else:
        lower_fn = lambda x: softmax_p.bind(x, axis=axis)             # noqa: E731
    return mesh, lower_fn, _named(mesh, dims), (_named(mesh, dims),)


def _softmax_infer(axis, mesh, arg_shapes, result_shape):
    (x,) = arg_shapes
    return _named(mesh, _softmax_dims(axis, x.sharding, x.shape))


def _softmax_rule(axis, mesh, value_types, result_types):
    names = [f"d{i}" for i in range(len(_shape(value_types[0])))]
    spec = " ".join(names)
    return f"{spec} -> {spec}"


def _softmax_local(x, axis):
    return softmax_p.bind(x, axis=axis)


_softmax_cp = custom_partitioning(_softmax_local, static_argnums=(1,))
_softmax_cp.def_partition(partition=_softmax_partition, infer_sharding_from_operands=_softmax_infer,
                          sharding_rule=_softmax_rule)


def softmax(x, *, axis: int):
    """softmax_p.bind(x, axis=axis) that partitions under a sharded jit."""
    return _softmax_cp(x, axis)
