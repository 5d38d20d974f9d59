"""FP8 recipes: the argument checks of scaled_matmul / quantize_fp8 and what each recipe means,
shared by the eager path (fp8.py), the torch op (torch/fp8_ops.py) and xgemm.jax (jax/fp8.py).

A recipe is the block of operand elements that share one scale. The checks see shapes and dtype
names only. dequantize() and quantize() are the recipes' formulas on any array-API namespace `xp`
(numpy / torch / cupy through array_api_compat, or jax.numpy), as core/epilogues.py is for the
epilogues: one definition for every framework, so the eager and JAX paths cannot drift.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence, Tuple

from xgemm import errors

FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
OUT_DTYPES = ("bfloat16", "float16", "float32")
# scaled_matmul's default call asks float32 accumulation (GemmProblem.float32_accumulation): an FP8
# product gets the classes that add each k-tile's sum into float32 registers (a use_fast_accum call
# the classes that keep the sums in the wgmma accumulator). A plan that promotes carries
# PROMOTE_NOTE: the kernel builds its class from it, and a call that wants float32 accumulation
# checks it.
PROMOTE_NOTE = "k-tile sums promoted to float32"
BLOCK = 128
QUANTIZE_RECIPES = ("tensor", "row", "col", "block_1x128", "block_128x128")
GRAD_DTYPES = (None, "float8_e5m2")
# fp8_matmul's recipe -> the quantize_fp8 recipes of a [M, K] and b [K, N]: the blocks scaled_matmul
# reads for that recipe (row-wise: a per row, b per output column)
OPERAND_RECIPES = {"tensor": ("tensor", "tensor"), "row": ("row", "col"), "block": ("block_1x128", "block_128x128")}


class MatmulRecipe(NamedTuple):
    """scaled_matmul's recipe, read from the scales' shapes: a [M, K] is scaled in blocks of
    a_block elements, b [K, N] in blocks of b_block."""
    name: str                       # "tensor", "row", "block"
    m: int
    k: int
    n: int
    a_block: Tuple[int, int]
    b_block: Tuple[int, int]


def _cdiv(x: int, y: int) -> int:
    return -(-x // y)


def fp8_dtype(fn: str, name: str, dt: str) -> str:
    if name == "dtype" and dt not in FP8_DTYPES:          # the dtype asked of quantize_fp8
        raise errors.DTypeError(f"{fn}: dtype={dt}; quantize to float8_e4m3fn (the default) or float8_e5m2")
    if dt not in FP8_DTYPES:
        raise errors.DTypeError(f"{fn}: {name} has dtype {dt}; pass float8_e4m3fn or float8_e5m2 "
                                f"(quantize it first: xgemm.quantize_fp8({name}, recipe=...))")
    return dt


def scale_dtype(fn: str, name: str, dt: str) -> str:
    if dt != "float32":
        raise errors.DTypeError(f"{fn}: {name} has dtype {dt}; scales are float32 dequantization scales "
                                f"({name}.astype('float32'))")
    return dt


def out_dtype(fn: str, out: Optional[str]) -> str:
    out = "bfloat16" if out is None else out
    if out not in OUT_DTYPES:
        raise errors.DTypeError(f"{fn}: out_dtype={out}; use one of {', '.join(OUT_DTYPES)}")
    return out


def grad_dtype(fn: str, g: Optional[str]) -> Optional[str]:
    if g not in GRAD_DTYPES:
        raise errors.DTypeError(f"{fn}: grad_dtype={g!r}; use None (the incoming gradient as is) or "
                                f"'float8_e5m2' (quantized row-wise to e5m2 before the dgrad/wgrad products)")
    return g


class Fp8MatmulPlan(NamedTuple):
    """fp8_matmul on a [M, K] and b [K, N]: how each is quantized, and the scaled_matmul recipe
    the resulting scales select."""
    a_recipe: str
    b_recipe: str
    matmul: MatmulRecipe


def fp8_matmul_plan(fn: str, recipe: str, a: Sequence[int], b: Sequence[int]) -> Fp8MatmulPlan:
    if recipe not in OPERAND_RECIPES:
        raise errors.ShapeError(f"{fn}: recipe={recipe!r}; use one of {', '.join(map(repr, OPERAND_RECIPES))}")
    matmul_recipe(fn, a, b, (), ())                    # 2-D a [M, K] and b [K, N]
    ra, rb = OPERAND_RECIPES[recipe]
    return Fp8MatmulPlan(ra, rb, matmul_recipe(fn, a, b, quantize_block(fn, ra, a)[1], quantize_block(fn, rb, b)[1]))


def fp8_matmul_dtypes(fn: str, a_dt: str, b_dt: str, out: Optional[str]) -> str:
    """fp8_matmul's operands are the high-precision tensors it quantizes; the result defaults to a's
    dtype (float32 for float64 a)."""
    for name, dt in (("a", a_dt), ("b", b_dt)):
        if dt not in ("float32", "float16", "bfloat16", "float64"):
            hint = (f"; {name} is already fp8: use xgemm.scaled_matmul with its scales" if dt in FP8_DTYPES else "")
            raise errors.DTypeError(f"{fn}: {name} has dtype {dt}; pass the float32, float16, bfloat16 or float64 "
                                    f"tensor to quantize{hint}")
    if out is None:
        out = a_dt if a_dt in OUT_DTYPES else "float32"
    return out_dtype(fn, out)


def straight_through(xp: Any, dy: Any, a_deq: Any, b_deq: Any, e5m2: Any, f32: Any,
                     device: Any = None, matmul: Any = None) -> Tuple[Any, Any, Any]:
    """float32 (da, db, dbias) of out = a_deq @ b_deq + bias, the gradients of the DEQUANTIZED
    operands (FP8 training's straight-through convention: a_deq stands for the tensor a was
    quantized from). e5m2: the namespace's float8_e5m2 dtype to quantize dy to first, row-wise, as
    an FP8 dgrad / wgrad kernel would read it (grad_dtype="float8_e5m2"), or None."""
    matmul = matmul or xp.matmul
    dy = xp.astype(dy, f32)
    if e5m2 is not None:
        row = (1, max(dy.shape[1], 1))
        q, s = quantize(xp, dy, row, (dy.shape[0], 1), e5m2, FP8_MAX["float8_e5m2"], f32, device)
        dy = dequantize(xp, q, s, row, f32, device)
    return matmul(dy, xp.permute_dims(b_deq, (1, 0))), matmul(xp.permute_dims(a_deq, (1, 0)), dy), xp.sum(dy, axis=0)


def expected_scales(m: int, k: int, n: int) -> str:
    kb, nb = _cdiv(k, BLOCK), _cdiv(n, BLOCK)
    return (f"tensor-wise: scale_a () and scale_b (); row-wise: scale_a ({m}, 1) and scale_b (1, {n}); "
            f"block-wise (1x128 x 128x128): scale_a ({m}, {kb}) and scale_b ({kb}, {nb})")


def matmul_recipe(fn: str, a: Sequence[int], b: Sequence[int], scale_a: Sequence[int],
                  scale_b: Sequence[int]) -> MatmulRecipe:
    """a [M, K], b [K, N]; the recipe the scales' shapes select (tensor-wise also takes (1,) and (1, 1))."""
    a, b, sa, sb = tuple(a), tuple(b), tuple(scale_a), tuple(scale_b)
    if len(a) != 2 or len(b) != 2:
        raise errors.ShapeError(f"{fn}: a has shape {a} and b {b}; scaled_matmul takes 2-D a [M, K] and b [K, N] "
                                f"(reshape a batch into rows, or jax.vmap over it)")
    (m, k), n = a, b[1]
    if b[0] != k:
        raise errors.ShapeError(f"{fn}: a has shape {a} and b {b}; a.shape[1] ({k}) must equal b.shape[0] ({b[0]})")
    scalar = ((), (1,), (1, 1))
    kb, nb = _cdiv(k, BLOCK), _cdiv(n, BLOCK)
    if sa in scalar and sb in scalar:
        return MatmulRecipe("tensor", m, k, n, (max(m, 1), max(k, 1)), (max(k, 1), max(n, 1)))
    if sa == (m, 1) and sb == (1, n):
        return MatmulRecipe("row", m, k, n, (1, max(k, 1)), (max(k, 1), 1))
    if sa == (m, kb) and sb == (kb, nb):
        return MatmulRecipe("block", m, k, n, (1, BLOCK), (BLOCK, BLOCK))
    raise errors.ShapeError(f"{fn}: scale_a has shape {sa} and scale_b {sb}, which match no recipe for a {a} and "
                            f"b {b}; pass {expected_scales(m, k, n)}")


def quantize_block(fn: str, recipe: str, shape: Sequence[int]) -> Tuple[Optional[Tuple[int, int]], Tuple[int, ...]]:
    """(block, scale shape) of quantize_fp8(x, recipe); block None: one scale for the whole tensor."""
    shape = tuple(shape)
    if recipe not in QUANTIZE_RECIPES:
        raise errors.ShapeError(f"{fn}: recipe={recipe!r}; use one of {', '.join(map(repr, QUANTIZE_RECIPES))}")
    if recipe == "tensor":
        return None, ()
    if len(shape) != 2:
        raise errors.ShapeError(f"{fn}: x has shape {shape}; recipe {recipe!r} needs a 2-D x (activations [M, K], "
                                f"weights [K, N]); use recipe='tensor' or reshape to 2-D")
    r, c = shape
    block = {"row": (1, max(c, 1)), "col": (max(r, 1), 1), "block_1x128": (1, BLOCK),
             "block_128x128": (BLOCK, BLOCK)}[recipe]
    # a row (column) scale for every row (column), also where K is 0: scaled_matmul's [M, 1] / [1, N]
    scales = {"row": (r, 1), "col": (1, c)}.get(recipe, (_cdiv(r, block[0]), _cdiv(c, block[1])))
    return block, scales


def bias(fn: str, dt: str, shape: Sequence[int], n: int) -> None:
    if tuple(shape) != (n,):
        raise errors.ShapeError(f"{fn}: bias has shape {tuple(shape)}; it adds one value per output column, so pass "
                                f"shape ({n},)")
    if dt not in ("float32", "bfloat16", "float16"):
        raise errors.DTypeError(f"{fn}: bias has dtype {dt}; pass float32, bfloat16 or float16 (added in float32)")


def kernel_block_scales(m: int, k: int, n: int) -> Tuple[Tuple[Tuple[int, int], Tuple[int, int]], ...]:
    """((shape, element strides) of scale_a, of scale_b) as the block-scaled FP8 kernel loads them
    by TMA with each k-tile (cute_gemm_sm90 Epi.block): scale_a [M, K/128] M-major (torch's
    _scaled_mm and DeepGEMM take it so too) and scale_b [K/128, N/128] row-major, each row stride
    rounded up to 4 floats (TMA strides are multiples of 16 bytes), on 16-byte aligned bases.
    Other layouts are copied into these (a few KB to MB, against the product's GB)."""
    kb, nb = _cdiv(k, BLOCK), _cdiv(n, BLOCK)
    return ((m, kb), (1, _cdiv(m, 4) * 4)), ((kb, nb), (_cdiv(nb, 4) * 4, 1))


def in_kernel_block_layout(shape: Sequence[int], strides: Sequence[int], want: Tuple, aligned: bool) -> bool:
    """Whether a block-scale array (element strides; `aligned`: a 16-byte aligned base) is laid
    out as kernel_block_scales' `want`: the same shape, unit stride on the same axis, the other
    stride a multiple of 4 floats that covers the rows. Strides of extent-1 axes count too: the
    compiled class checks every stride it declares."""
    (shape_w, strides_w) = want
    if tuple(shape) != shape_w or not aligned:
        return False
    unit = strides_w.index(1)
    other = strides[1 - unit]
    return strides[unit] == 1 and other % 4 == 0 and other >= shape_w[unit]


def kernel_needs(recipe: MatmulRecipe, a_k_major: bool, b_k_major: bool) -> str:
    """What a Hopper FP8 wgmma kernel will need of these operands (both K-major): the text explain() shows.
    The embedded default (dequantize, then one matmul) reads any layout and copies nothing."""
    copies = [f"{name}: a transposing copy to K-major ({size} bytes)"
              for name, ok, size in (("a", a_k_major, recipe.m * recipe.k), ("b", b_k_major, recipe.k * recipe.n))
              if not ok]
    return (f"scaled_matmul {recipe.m}x{recipe.n}x{recipe.k}, {recipe.name}-wise scales; runs on the embedded "
            f"default (float32 dequantize + matmul, no copy); an FP8 wgmma kernel needs a and b K-major: "
            + ("; ".join(copies) if copies else "no copy"))


# ---------------------------------------------------------------------------------------------
# The recipes' formulas on an array-API namespace (dequantized = fp8 value * scale)

def _expand(xp: Any, s: Any, shape: Tuple[int, int], block: Tuple[int, int], device: Any) -> Any:
    """A scale per block -> one per element (broadcastable to `shape`)."""
    for axis in (0, 1):
        if s.shape[axis] not in (1, shape[axis]):
            idx = xp.arange(shape[axis], device=device) // block[axis]
            s = xp.take(s, idx, axis=axis)
    return s


def dequantize(xp: Any, q: Any, scale: Any, block: Tuple[int, int], acc: Any, device: Any = None) -> Any:
    """q (fp8, 2-D) times its per-block scale, in `acc`."""
    x, s = xp.astype(q, acc), xp.astype(scale, acc)
    if s.ndim < 2 or s.shape == (1, 1):
        return x * xp.reshape(s, ())
    return x * _expand(xp, s, tuple(x.shape), block, device)


def quantize(xp: Any, x: Any, block: Optional[Tuple[int, int]], scale_shape: Tuple[int, ...], dtype: Any,
             fmax: float, f32: Any, device: Any = None) -> Tuple[Any, Any]:
    """(q, scale): scale = amax / fmax per block (amax over the finite |x|; 1 where that is 0), q = x * (1 /
    scale) clamped to [-fmax, fmax] then cast (so +-inf saturate and NaN stays NaN). A multiply by the
    reciprocal, as torchao's and TransformerEngine's quantizers do: one division a block, not one a value.
    block and scale_shape as quantize_block gives them; an empty x has scales of 1 (nothing to scale)."""
    if any(d == 0 for d in x.shape):
        return xp.astype(x, dtype), xp.ones(tuple(scale_shape), dtype=f32, device=device)
    x = xp.astype(x, f32)
    mag = xp.where(xp.isfinite(x), xp.abs(x), xp.zeros((), dtype=f32, device=device))
    if block is None:
        amax = xp.max(mag) if mag.ndim else mag
    else:
        (r, c), (br, bc) = mag.shape, block
        rp, cp = -r % br, -c % bc
        if rp:
            mag = xp.concat([mag, xp.zeros((rp, c), dtype=f32, device=device)], axis=0)
        if cp:
            mag = xp.concat([mag, xp.zeros((r + rp, cp), dtype=f32, device=device)], axis=1)
        amax = xp.max(xp.reshape(mag, ((r + rp) // br, br, (c + cp) // bc, bc)), axis=(1, 3))
    # fmax as an array: torch divides by a Python scalar as a multiply by its rounded reciprocal,
    # one ulp off the IEEE quotient that the quantize kernel computes
    scale = amax / xp.asarray(fmax, dtype=f32, device=device)
    scale = xp.where(scale > 0, scale, xp.ones((), dtype=f32, device=device))   # all zeros (or underflow)
    inv = xp.ones((), dtype=f32, device=device) / scale
    full = inv if block is None else _expand(xp, inv, tuple(x.shape), block, device)
    q = xp.clip(x * full, -fmax, fmax)
    return xp.astype(q, dtype), scale


def quantize_source(fn: str, dt: str) -> str:
    """What quantize_fp8 takes: a float32, float16, bfloat16 or float64 array."""
    if dt not in ("float32", "float16", "bfloat16", "float64"):
        raise errors.DTypeError(f"{fn}: x has dtype {dt}; quantize a float32, float16, bfloat16 or float64 array")
    return dt
