"""Argument checks of the grouped (ragged) GEMMs, shared by the eager path (grouped.py), the torch
op (torch/grouped_ops.py) and xgemm.jax (jax/grouped.py).

They see shapes and dtype names only, never the values of group sizes or offsets: those stay on
the device, so a check here cannot synchronize with the host (or concretize a JAX tracer).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence, Tuple

from xgemm import errors
from xgemm.core import epilogues
from xgemm.core.problem import Device, Operand

INDEX_DTYPES = ("int32", "int64")
# each entry's argument names, as its errors name them
ARG_NAMES = {"ragged_dot": ("lhs", "rhs", "group_sizes"), "grouped_mm": ("x", "w", "offs")}


class GroupedShape(NamedTuple):
    """One grouped product. `ragged_k` False: rows [T, K] in groups, each times its own [K, N]
    matrix -> [T, N]. True (the variable-K product, the weight gradient): a [M, T] times b [T, N]
    with the T axis in groups -> one [M, N] per group, [E, M, N]."""
    rows: int                       # T, the grouped axis
    m: int                          # ragged_k: a's rows; else T
    k: int                          # ragged_k: T; else the contraction K
    n: int
    groups: int                     # E
    ragged_k: bool
    out: Tuple[int, ...]


def describe(s: GroupedShape) -> str:
    """The product in words: its groups, its operands' shapes and the result's."""
    what = (f"{s.groups} groups of the {s.rows} contraction indices, [{s.m}, {s.rows}] @ [{s.rows}, {s.n}]"
            if s.ragged_k else f"{s.groups} groups of the {s.rows} rows, [{s.rows}, {s.k}] @ [{s.groups}, {s.k}, {s.n}]")
    return what + " -> [" + ", ".join(map(str, s.out)) + "]"


@dataclass(frozen=True)
class GroupedProblem:
    """What a grouped kernel sees (policy.choose("grouped", ...)): the shape, A and B as operands
    (rows mode: A [T, K], B [E, K, N]; ragged_k: A [M, T], B [T, N]), the result's dtype and where
    it lives, and the activation (or gate: the result is then N / 2 wide) a kernel fuses into its
    epilogue, if asked to. The group sizes are not part of it: they stay on the device."""
    shape: GroupedShape
    a: Operand
    b: Operand
    out_dtype: str
    framework: str
    device: Device
    activation: Optional[str] = None

    @property
    def fused(self) -> bool:
        """Is an epilogue asked of the kernel (policy.choose: only kernels that fuse one serve it)?"""
        return self.activation is not None

    @property
    def out_shape(self) -> Tuple[int, ...]:
        """The result's shape: the product's, or for a gate, half as wide."""
        s = self.shape
        return (*s.out[:-1], s.out[-1] // 2) if self.activation in epilogues.GATED else s.out

    def summary(self) -> str:
        act = f" then {self.activation}" if self.activation else ""
        return (f"grouped {describe(self.shape)}{act} {self.a.dtype}->{self.out_dtype} A {self.a.majorness}/"
                f"{self.a.alignment}B, B {self.b.majorness}/{self.b.alignment}B on {self.framework}:{self.device.kind}")


def index_dtype(fn: str, name: str, dt: str) -> str:
    if dt not in INDEX_DTYPES:
        raise errors.DTypeError(f"{fn}: {name} has dtype {dt}; pass int32 or int64 {name} "
                                f"(e.g. {name}.astype('int32'))")
    return dt


def _ndim(fn: str, name: str, shape: Sequence[int], ndim: int, what: str) -> None:
    if len(shape) != ndim:
        raise errors.ShapeError(f"{fn}: {name} has shape {tuple(shape)}; it must be {ndim}-D {what}")


def ragged_dot(fn: str, lhs: Sequence[int], rhs: Sequence[int], group_sizes: Sequence[int]) -> GroupedShape:
    """lhs [T, K], rhs [E, K, N], group_sizes [E] (jax.lax.ragged_dot's shapes)."""
    _ndim(fn, "lhs", lhs, 2, "[T, K] (rows grouped contiguously by group); reshape a batch to rows, "
          "or jax.vmap over it")
    _ndim(fn, "rhs", rhs, 3, "[E, K, N] (one [K, N] matrix per group)")
    e, k, n = rhs
    if lhs[1] != k:
        raise errors.ShapeError(f"{fn}: lhs has shape {tuple(lhs)} and rhs {tuple(rhs)}; lhs.shape[1] ({lhs[1]}) "
                                f"must equal rhs.shape[1] ({k})")
    if tuple(group_sizes) != (e,):
        raise errors.ShapeError(f"{fn}: group_sizes has shape {tuple(group_sizes)}; it holds one size per group "
                                f"of rhs, so pass shape ({e},)")
    return GroupedShape(lhs[0], lhs[0], k, n, e, False, (lhs[0], n))


def grouped_mm(fn: str, x: Sequence[int], w: Sequence[int], offs: Sequence[int]) -> GroupedShape:
    """torch._grouped_mm's two grouped cases: x [T, K] with w [E, K, N] (groups of rows, offs [E]),
    or x [M, T] with w [T, N] (groups of the contraction, offs [E] -> out [E, M, N])."""
    if len(x) != 2 or len(w) not in (2, 3):
        raise errors.ShapeError(
            f"{fn}: x has shape {tuple(x)} and w {tuple(w)}; grouped_mm takes x [T, K] with w [E, K, N] (groups "
            f"of x's rows) or x [M, T] with w [T, N] (groups of the contraction, out [E, M, N]); for a batch of "
            f"equal-size groups use matmul")
    if len(offs) != 1:
        raise errors.ShapeError(f"{fn}: offs has shape {tuple(offs)}; it must be 1-D [E], each group's end offset "
                                f"(the cumulative sum of the group sizes)")
    e = offs[0]
    if len(w) == 3:
        if w[0] != e:
            raise errors.ShapeError(f"{fn}: offs has shape {tuple(offs)} and w {tuple(w)}; offs holds one end offset "
                                    f"per group of w, so pass shape ({w[0]},)")
        if x[1] != w[1]:
            raise errors.ShapeError(f"{fn}: x has shape {tuple(x)} and w {tuple(w)}; x.shape[1] ({x[1]}) must equal "
                                    f"w.shape[1] ({w[1]})")
        return GroupedShape(x[0], x[0], x[1], w[2], e, False, (x[0], w[2]))
    if x[1] != w[0]:
        raise errors.ShapeError(f"{fn}: x has shape {tuple(x)} and w {tuple(w)}; x.shape[1] ({x[1]}) must equal "
                                f"w.shape[0] ({w[0]}) (the grouped contraction)")
    return GroupedShape(x[1], x[0], x[1], w[1], e, True, (e, x[0], w[1]))


def activation(fn: str, name: object, names: Sequence[str], b_shape: Sequence[int]) -> bool:
    """A grouped product's activation: None, a plain one (epilogues.ACTIVATIONS) or a gated one
    (epilogues.GATED: B's last dim holds [gate | up], so it must be even). True where gated."""
    if name is not None and (not isinstance(name, str) or (name not in epilogues.ACTIVATIONS
                                                           and name not in epilogues.GATED)):
        raise errors.EpilogueError(f"{fn}: activation={name!r}; use one of "
                                   f"{', '.join(epilogues.ACTIVATIONS + tuple(epilogues.GATED))} or None")
    gated = name in epilogues.GATED
    if gated and b_shape[-1] % 2:
        raise errors.ShapeError(f"{fn}: activation={name!r} gates the first half of {names[1]}'s {b_shape[-1]} "
                                f"columns with the second ([gate | up]); pass {names[1]} with an even last dim")
    return gated
