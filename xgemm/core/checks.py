"""Argument checks shared by the eager entry points (prepare.py) and the JAX ones (jax/api.py).

They see shapes, dtype names and Python scalars only, so both paths raise the same typed error
(xgemm.errors) naming the argument, its value and the fix.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple, Optional, Sequence, Tuple

from xgemm import errors
from xgemm.core import epilogues

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16", "float64")
HALF = ("float16", "bfloat16")


def scalar(fn: str, name: str, value: Any, *, traced: bool = False) -> float:
    """alpha/beta as a finite Python float. `traced`: the value is a JAX tracer (a better hint)."""
    if traced or isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = ("it is traced by JAX; pass a Python float (close over it, or mark it static)"
                if traced else "pass a Python float such as 1.0")
        raise errors.ScalarError(f"{fn}: {name}={value!r} ({type(value).__name__}) is not a real number; {hint}")
    value = float(value)
    # comparisons, not math.isfinite: torch.compile(dynamic=True) traces alpha/beta as symbolic
    # floats, which compare (a guard) but make math.isfinite a graph break
    if value != value or abs(value) == math.inf:
        raise errors.NonFiniteScalarError(f"{fn}: {name}={value} is not finite; pass a finite float")
    return value


def dtype(fn: str, name: str, dt: str) -> str:
    if dt not in SUPPORTED_DTYPES:
        fix = ("complex is not supported (split the real and imaginary parts into real products)"
               if dt.startswith("complex") else
               f"cast it, e.g. {name}.astype('float32'), or torch: {name}.to(torch.float32)")
        raise errors.DTypeError(f"{fn}: {name} has dtype {dt}; supported are {', '.join(SUPPORTED_DTYPES)} ({fix})")
    return dt


def out_dtypes(dt: str) -> Tuple[str, ...]:
    """The result dtypes a GEMM of `dt` operands may write: its own, and float32 for fp16/bf16."""
    return (dt, "float32") if dt in HALF else (dt,)


def operand_dtypes(fn: str, names: Tuple[str, str], a: str, b: str) -> str:
    """The two operands' common dtype (one of SUPPORTED_DTYPES), named in the error as the caller names them."""
    dt = dtype(fn, names[0], a)
    if dtype(fn, names[1], b) != dt:
        raise errors.DTypeError(f"{fn}: {names[0]} is {dt} and {names[1]} is {b}; cast {names[1]} to {dt} "
                                f"({names[1]}.astype({names[0]}.dtype), or torch: {names[1]}.to({names[0]}.dtype))")
    return dt


def gemm_dtypes(fn: str, a: str, b: str, c: Optional[str]) -> str:
    """The operands' common dtype; C (when given) must be one of out_dtypes() of it."""
    dt = operand_dtypes(fn, ("a", "b"), a, b)
    if c is not None and dtype(fn, "c", c) not in out_dtypes(dt):
        raise errors.DTypeError(f"{fn}: c is {c}; with {dt} operands c must be one of {out_dtypes(dt)}")
    return dt


def out_dtype(fn: str, dt: str, out: Optional[str]) -> str:
    """The requested result dtype (None: the operands')."""
    out = dt if out is None else out
    if out not in out_dtypes(dt):
        raise errors.DTypeError(f"{fn}: out_dtype={out} with {dt} operands; use one of {', '.join(out_dtypes(dt))}")
    return out


def broadcast(fn: str, what: str, *shapes: Tuple[int, ...]) -> Tuple[int, ...]:
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for dims in zip(*[(1,) * (ndim - len(s)) + tuple(s) for s in shapes]):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise errors.ShapeError(f"{fn}: {what} {' and '.join(map(str, shapes))} do not broadcast; "
                                    f"make them equal or 1 in each dimension")
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def broadcasts_to(shape: Tuple[int, ...], target: Tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(shape[::-1], target[::-1]))


class GemmShape(NamedTuple):
    """numpy.matmul's reading of a GEMM's shapes: 1-D operands promoted, batch dims broadcast."""
    m: int
    n: int
    k: int
    batch: Tuple[int, ...]          # the broadcast batch shape
    a_vec: bool                     # a was 1-D (promoted to a row)
    b_vec: bool                     # b was 1-D (promoted to a column)
    full: Tuple[int, ...]           # the promoted result shape: batch + (m, n)
    final: Tuple[int, ...]          # the result shape the caller gets (promoted dims dropped)

    @property
    def empty(self) -> bool:
        return self.m * self.n * self.k * math.prod(self.batch) == 0


def gemm_shape(fn: str, a: Sequence[int], b: Sequence[int], c: Optional[Sequence[int]], beta: float,
               has_c: bool) -> GemmShape:
    """Check the shapes of a GEMM (c: C's shape when given) and read them as numpy.matmul does."""
    for name, shape in (("a", a), ("b", b)):
        if len(shape) < 1:
            raise errors.ShapeError(f"{fn}: {name} is 0-d (shape ()); {fn} needs at least 1 dimension; "
                                    f"multiply by a scalar instead")
    if not has_c and beta != 0.0:
        raise errors.ShapeError(f"{fn}: beta={beta:g} but c is None; pass c=... or beta=0.0")
    a_vec, b_vec = len(a) == 1, len(b) == 1
    a2 = (1,) + tuple(a) if a_vec else tuple(a)
    b2 = tuple(b) + (1,) if b_vec else tuple(b)
    if a2[-1] != b2[-2]:
        raise errors.ShapeError(f"{fn}: a has shape {tuple(a)} and b {tuple(b)}; "
                                f"a.shape[-1] ({a2[-1]}) must equal b.shape[{-1 if b_vec else -2}] ({b2[-2]})")
    batch = broadcast(fn, "batch dims", a2[:-2], b2[:-2])
    m, k, n = a2[-2], a2[-1], b2[-1]
    final = batch + ((m,) if not a_vec else ()) + ((n,) if not b_vec else ())
    if c is not None and not broadcasts_to(tuple(c), final):
        raise errors.ShapeError(f"{fn}: c has shape {tuple(c)}, which does not broadcast to the result "
                                f"shape {final}; pass c of shape {final} or one that broadcasts to it")
    return GemmShape(m, n, k, batch, a_vec, b_vec, batch + (m, n), final)


def activation(fn: str, name: Any, gated: bool) -> None:
    """An epilogue's activation: one of epilogues.ACTIVATIONS (or None) for gemm, of GATED for gated."""
    allowed = tuple(epilogues.GATED) if gated else epilogues.ACTIVATIONS
    named = isinstance(name, str)          # a list or dict is no name (and not hashable)
    if (name is None and not gated) or (named and name in allowed):
        return
    other = ("; gating is xgemm.gated(a, b, activation=...)" if named and not gated and name in epilogues.GATED else
             "; a plain activation is xgemm.gemm(a, b, activation=...)"
             if named and gated and name in epilogues.ACTIVATIONS else "")
    raise errors.EpilogueError(f"{fn}: activation={name!r}; use one of {', '.join(allowed)}"
                               f"{'' if gated else ' or None'}{other}")


def bias(fn: str, dt: str, shape: Tuple[int, ...], n: int, operands: str) -> None:
    """A bias vector: N values (one per column of the product), of the operands' dtype or the
    accumulator's (float32 for fp16/bf16)."""
    if tuple(shape) != (n,):
        raise errors.ShapeError(f"{fn}: bias has shape {tuple(shape)}; it adds one value per column of the product, "
                                f"so pass shape ({n},)")
    if dtype(fn, "bias", dt) not in out_dtypes(operands):
        raise errors.DTypeError(f"{fn}: bias is {dt}; with {operands} operands use one of "
                                f"{', '.join(out_dtypes(operands))}")


def epilogue_shape(fn: str, shape: GemmShape, gated: bool, bias_dtype: Optional[str],
                   bias_shape: Optional[Tuple[int, ...]], operands: str) -> Tuple[int, ...]:
    """The result shape of a GEMM with an epilogue (gated: half the product's columns), after the
    checks the epilogue adds to gemm_shape's: a 2-D b, an even N to gate, a bias of N values."""
    if (bias_shape is not None or gated) and shape.b_vec:
        raise errors.ShapeError(f"{fn}: b is 1-D (shape ({shape.k},)); a bias or gating works on the columns "
                                f"of a 2-D b, so pass b[:, None]")
    final = shape.final
    if gated:
        if shape.n % 2:
            raise errors.ShapeError(f"{fn}: b has {shape.n} columns; a gated product needs [gate | up] halves, "
                                    f"an even number")
        final = final[:-1] + (shape.n // 2,)
    if bias_shape is not None:
        bias(fn, bias_dtype, tuple(bias_shape), shape.n, operands)
    return final


GATED_LAYOUTS = ("concat", "stacked")


def gated_layout(fn: str, layout: Any, b_shape: Tuple[int, ...], bias_shape: Optional[Tuple[int, ...]],
                 a_shape: Optional[Tuple[int, ...]] = None) -> None:
    """gated's weight layouts: "concat", b [..., K, 2H] = [gate | up]; "stacked", b [..., K, 2, H]
    (b[..., 0, :] the gate projection, b[..., 1, :] the up one; MaxText's fused wi), with a bias of
    shape (2, H). The same numbers: a contiguous stacked b reshaped to [..., K, 2H] is the concat one.
    Stacked exists for sharding: its H axis shards both halves alike."""
    if layout not in GATED_LAYOUTS:
        raise errors.ShapeError(f"{fn}: layout={layout!r}; use 'concat' (b [K, 2H] = [gate | up]) or 'stacked' "
                                f"(b [K, 2, H])")
    if layout == "stacked":
        if len(b_shape) < 3 or b_shape[-2] != 2:
            raise errors.ShapeError(f"{fn}: b has shape {tuple(b_shape)}; layout='stacked' takes b [..., K, 2, H] "
                                    f"(gate and up along the second-to-last axis)")
        if a_shape is not None and len(a_shape) >= 1 and a_shape[-1] != b_shape[-3]:
            # here, in the caller's shapes: the product sees b reshaped (concat) or sliced (JAX)
            raise errors.ShapeError(f"{fn}: a has shape {tuple(a_shape)} and b {tuple(b_shape)} (layout='stacked', "
                                    f"b [..., K, 2, H]); a.shape[-1] ({a_shape[-1]}) must equal b.shape[-3] "
                                    f"({b_shape[-3]})")
        if bias_shape is not None and tuple(bias_shape) != (2, b_shape[-1]):
            raise errors.ShapeError(f"{fn}: bias has shape {tuple(bias_shape)}; layout='stacked' takes a bias of "
                                    f"shape (2, {b_shape[-1]}) (gate's, then up's)")


def softmax_axis(fn: str, ndim: int, axis: Any) -> int:
    """`axis` normalized to [0, ndim)."""
    if ndim < 1:
        raise errors.ShapeError(f"{fn}: x is 0-d (shape ()); softmax needs at least 1 dimension")
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise errors.AxisError(f"{fn}: axis={axis!r} is not an integer; pass an int in [-{ndim}, {ndim})")
    if not -ndim <= int(axis) < ndim:
        raise errors.AxisError(f"{fn}: axis={axis} is out of range for x with {ndim} dims; "
                               f"pass an int in [-{ndim}, {ndim})")
    return int(axis) % ndim
