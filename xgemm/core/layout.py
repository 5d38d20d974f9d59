"""Majorness, alignment and padding of matrix operands: the one place these are decided.

Eager calls (prepare.py, on real strides and pointers) and jax.jit (jax/lowering.py, on the
layouts XLA is asked for) both classify operands and pad rows here, so the two paths agree.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

from xgemm.core.problem import COL, ROW, STRIDED, Operand

# Inside jit the pads and D's slice are XLA copies of their own, which only pay on big products
# (docs/performance.md, "Unaligned rows inside jax.jit").
PAD_MIN_FLOP = 8e9


def majorness(shape: Tuple[int, ...], strides: Tuple[int, ...]) -> str:
    """ROW, COL or STRIDED for the last two dims: the contiguous dim has unit stride and the
    other spans a whole row (column); extent-1 dims count as either."""
    rows, cols = shape[-2], shape[-1]
    rs, cs = strides[-2], strides[-1]
    row = (cols <= 1 or cs == 1) and (rows <= 1 or rs >= max(cols, 1))
    col = (rows <= 1 or rs == 1) and (cols <= 1 or cs >= max(rows, 1))
    return ROW if row else COL if col else STRIDED


def unit_stride_dim(shape: Tuple[int, ...], strides: Tuple[int, ...]) -> Optional[str]:
    """ROW if the last dim has unit stride, else COL if the second-to-last has, else None: what a
    kernel reads contiguously. Stricter than majorness(), which also asks that the other dim's
    stride spans a whole row or column; extent-1 dims count by their stride, as TVM-FFI's
    argument checks do."""
    if strides[-1] == 1:
        return ROW
    if strides[-2] == 1:
        return COL
    return None


def leading_stride(shape: Tuple[int, ...], strides: Tuple[int, ...], major: str) -> int:
    """Elements between consecutive rows (ROW) or columns (COL)."""
    rows, cols = shape[-2], shape[-1]
    if major == ROW:
        return strides[-2] if rows > 1 else max(cols, 1)
    return strides[-1] if cols > 1 else max(rows, 1)


def alignment(ptr: int, shape: Tuple[int, ...], strides: Tuple[int, ...], itemsize: int, major: str) -> int:
    """Largest power of two <= 16 dividing the base address, the leading stride and batch strides, in bytes."""
    values = [ptr]
    if major != STRIDED and len(shape) >= 2:
        values.append(leading_stride(shape, strides, major) * itemsize)
        values.extend(s * itemsize for s, d in zip(strides[:-2], shape[:-2]) if d > 1)
    align = 16
    while align > itemsize and any(val % align for val in values):
        align //= 2
    return align


def dense_operand(shape: Tuple[int, ...], dtype: str, itemsize: int, major: str) -> Operand:
    """The Operand of a dense (L,)rows x cols matrix at a 16-byte-aligned base, stored row- or
    column-major: what XLA's buffers are inside jax.jit."""
    r, c = shape[-2], shape[-1]
    strides = (c, 1) if major == ROW else (1, r)
    batch = (r * c,) if len(shape) == 3 else ()
    return Operand(shape=tuple(shape), strides=batch + strides, dtype=dtype, majorness=major,
                   alignment=alignment(0, tuple(shape), batch + strides, itemsize, major))


def settled_unit_strides(shape: Sequence[int], strides: Sequence[int]) -> Optional[Tuple[int, ...]]:
    """The strides with each extent-1 dim's replaced by the dense one (the next dim's stride times
    its extent; 1 for the last dim), or None when they are that already.

    An extent-1 dim's stride is never stepped, so frameworks leave any value there (torch's
    (8, 1).t() has strides (1, 1)). The classification above assumes the dense one, and a kernel
    that hands the real strides to TMA would refuse the view at launch (issue 22), so views
    carry the dense one (arrays/views.py restrides the array, a view of the same memory)."""
    if 1 not in shape:
        return None
    out, nxt = list(strides), 1
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == 1:
            out[i] = nxt
        nxt = out[i] * max(shape[i], 1)
    out = tuple(out)
    return None if out == tuple(strides) else out


def self_overlapping(shape: Sequence[int], strides: Sequence[Optional[int]]) -> bool:
    """Do two elements of this view share memory? The test every dense, strided, transposed or
    flipped view passes: with the dims of extent > 1 sorted by |stride|, each stride reaches past
    everything the smaller ones span. (A rare non-overlapping interleaving fails it too: reported
    as overlapping.) Strides in elements; None (not a whole number of elements) is not judged."""
    if 0 in shape or any(s is None for s in strides):
        return False
    reach = 1
    for s, n in sorted((abs(s), n) for s, n in zip(strides, shape) if n > 1):
        if s < reach:
            return True
        reach += s * (n - 1)
    return False


def collapsible(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Can these dims be folded into one (every stride the next one's stride times its extent)?"""
    dims = [(d, s) for d, s in zip(shape, strides) if d != 1]
    return all(s0 == s1 * d1 for (_, s0), (d1, s1) in zip(dims, dims[1:]))


def padded_dims(k: int, n: int, itemsize: int) -> Tuple[int, int]:
    """(K, N) of the aligned problem a GEMM with rows that are not 16-byte multiples is staged
    into (eagerly by prepare.py, inside jit by jax/lowering.py): a K or N that is not a multiple of
    16 bytes is padded to whole 32-byte sectors, since some pitches 16 bytes off a sector run
    slower (docs/performance.md, "Row pitch"); one that is stays."""
    per, sector = 16 // itemsize, 32 // itemsize
    return tuple(d if d % per == 0 else -(-d // sector) * sector for d in (k, n))


def pad_worth_it_in_jit(flops: float) -> bool:
    """Inside jit a padded product pays for its pads and slice only from PAD_MIN_FLOP."""
    return flops >= PAD_MIN_FLOP
