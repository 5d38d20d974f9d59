"""FP8 GEMM, eager: NumPy (ml_dtypes), torch and CuPy arrays; JAX arrays and tracers go to xgemm.jax.fp8.

    scaled_matmul(a[M, K], b[K, N], scale_a, scale_b, *, out_dtype="bfloat16", bias=None,
                  use_fast_accum=False) -> [M, N]
    quantize_fp8(x, recipe="tensor", dtype="float8_e4m3fn") -> (x_fp8, scale)
    fp8_matmul(a[M, K], b[K, N], *, recipe="tensor", out_dtype=None, bias=None, grad_dtype=None) -> [M, N]

Scale convention (torch._scaled_mm's scale_a / scale_b): a scale is the DEQUANTIZATION scale,
float32: dequantized = fp8 value * scale. The scales' shapes select the recipe:
    tensor-wise   scale_a ()            scale_b ()                 ((1,) and (1, 1) too)
    row-wise      scale_a [M, 1]        scale_b [1, N]             (per row of a, per column of b)
    block-wise    scale_a [M, ceil(K/128)]  scale_b [ceil(K/128), ceil(N/128)]
                  (1x128 activation blocks, 128x128 weight blocks, DeepSeek-V3 style; the last K or
                  N block may be partial)
out = (a * scale_a) @ (b * scale_b) with the operands dequantized and accumulated in float32, plus
bias [N] in float32, then cast to out_dtype (bfloat16, float16 or float32). For block-wise scales
this equals scaling each 128-wide K block's partial product by scale_a[m, kb] * scale_b[kb, nb]
(what a kernel does in its mainloop). a and b are float8_e4m3fn or float8_e5m2, not necessarily
the same (e4m3 x e5m2 is allowed, as in torch._scaled_mm).

quantize_fp8 recipes and their scale shapes for x [R, C]: "tensor" () (x of any rank), "row"
[R, 1], "col" [1, C] (the weight b [K, N] per output column), "block_1x128" [R, ceil(C/128)],
"block_128x128" [ceil(R/128), ceil(C/128)]. One pass: amax over the block's finite |x|, scale =
amax / fp8_max (448 for e4m3fn, 57344 for e5m2), and 1.0 where amax is 0 (an all-zero block gives
zeros and a finite positive scale); q = clamp(x * (1 / scale), -fp8_max, fp8_max) cast to fp8. So values
beyond the range, +-inf included, saturate to +-fp8_max (the clamp TransformerEngine / DeepSeek
quantizers do: a bare cast gives NaN for e4m3fn in NumPy and JAX, saturates in torch on the CPU,
and gives inf for e5m2), and NaN stays NaN without spoiling its block's scale. The GPU kernel's
"block_1x128" scale comes out M-major (strides (1, R rounded up to 4)), as torch._scaled_mm and
the block-scaled GEMM class take it.

The embedded default dequantizes in float32 and runs one matmul; it reads any layout. A Hopper
FP8 wgmma kernel wants both operands K-major (a row-major, b column-major), and another layout
will cost it a transposing copy: explain_scaled_matmul() says which. cute_gemm_sm90's FP8 classes
take tensor- and row-wise products of K-major torch operands on the GPU when the call passes
use_fast_accum=True (prepare_kernel: the scales as vectors in the epilogue). They keep each
tile's sum in the wgmma accumulator, which an FP8 wgmma adds into with ~14 bits (the DeepSeek-V3
report; the H200 run of 2026-12-02 measured 2-5% of |ref| + 1 at K = 256-512), what
torch._scaled_mm's use_fast_accum=True does too. The default call wants float32 accumulation: it
is planned as a problem that asks it (GemmProblem.float32_accumulation), which gets the classes that add each
128-deep k-tile's sum into float32 registers (Epi.promote on cooperative 128x192 or 128x128 tiles;
the plan carries fp8_checks.PROMOTE_NOTE), validated on the H200 on 2026-12-02 (0.94-0.99x
torch._scaled_mm's default on 2026-12-05). Within a k-tile the sum keeps the wgmma's ~14 bits for at most
4 steps of 32: the numerics of torch._scaled_mm's default (CUTLASS promotes every 4 MMAs), about
4 * 2**-13 of the magnitudes, not float32's. Block-wise scales take the same promoting mainloop
with either accumulation: each k-tile's sum is multiplied by its row's scale of a and its 128x128
block's scale of b as it is added (Epi.block; validated on the H200 on 2026-12-02; 1.01-1.03x
torch._scaled_mm's block-wise path on 2026-12-05). The class loads the scales by TMA in the
layouts of fp8_checks.kernel_block_scales (scale_a M-major, as quantize_fp8's kernel writes it
and torch._scaled_mm takes it; scale_b row-major); scales in other layouts are copied into them.
Everything else runs the embedded default. quantize_fp8 is planned like any op (registry
"quantize_fp8"): triton_quantize_sm90 takes the row and 1x128 recipes of 16-byte rows on the GPU
in one pass, the embedded default the rest.
Autograd and torch.compile: torch tensors go through the torch.library ops xgemm::scaled_matmul
and xgemm::fp8_matmul (torch/fp8_ops.py), routed by the public entry (api.py).

fp8_matmul is the differentiable form, for training: it takes the high-precision a and b,
quantizes each to e4m3 with its recipe ("tensor"; "row": a per row, b per output column;
"block": a in 1x128, b in 128x128 blocks), runs scaled_matmul, and returns out_dtype (a's dtype by
default). Its gradients are those of the dequantized operands, in a's and b's dtypes
(core/fp8_checks.straight_through): the fp8 operands of scaled_matmul cannot hold them in torch,
which casts a gradient to its input's dtype.
"""
from __future__ import annotations

import sys
from typing import Any, NamedTuple, Optional

from xgemm import arrays, errors, prepare
from xgemm.core import fp8_checks, policy
from xgemm.core.problem import COL, ROW, Epilogue, GemmProblem, Operand
from xgemm.core.quantize import QuantizeProblem


class Checked(NamedTuple):
    owner: str
    a: Any
    b: Any
    scale_a: Any
    scale_b: Any
    bias: Any
    out_dtype: str
    recipe: fp8_checks.MatmulRecipe


def _same_framework(fn: str, owner: str, name: str, x: Any) -> Any:
    fw = arrays.require_array(fn, name, x)
    if {fw, owner} == {"numpy", "torch"}:   # the bytes cross as uint8 views (arrays/ops.import_into)
        return arrays.import_into(owner, x, name, fn)
    if fw != owner:
        # DLPack has no fp8 type code every framework reads, so other fp8 operands are not exchanged
        raise errors.FrameworkError(f"{fn}: a is a {owner} array and {name} a {fw} one; pass fp8 operands of one "
                                    f"framework (convert {name} to {owner} first)")
    return x


def _device(x: Any) -> str:
    return str(getattr(x, "device", "cpu"))


def check_scaled_matmul(a: Any, b: Any, scale_a: Any, scale_b: Any, out_dtype: Any = None, bias: Any = None, *,
                        fn: str = "scaled_matmul") -> Checked:
    owner = prepare.owner_of(fn, "a", a)
    b = _same_framework(fn, owner, "b", b)
    fp8_checks.fp8_dtype(fn, "a", arrays.dtype_name(a))
    fp8_checks.fp8_dtype(fn, "b", arrays.dtype_name(b))
    named = {"scale_a": scale_a, "scale_b": scale_b}
    if bias is not None:
        named["bias"] = bias
    for name in list(named):
        arrays.require_array(fn, name, named[name])
        named[name] = arrays.import_into(owner, named[name], name, fn)
    fp8_checks.scale_dtype(fn, "scale_a", arrays.dtype_name(named["scale_a"]))
    fp8_checks.scale_dtype(fn, "scale_b", arrays.dtype_name(named["scale_b"]))
    recipe = fp8_checks.matmul_recipe(fn, a.shape, b.shape, named["scale_a"].shape, named["scale_b"].shape)
    if bias is not None:
        fp8_checks.bias(fn, arrays.dtype_name(named["bias"]), named["bias"].shape, recipe.n)
    out = fp8_checks.out_dtype(fn, arrays.requested_dtype(out_dtype))
    where = _device(a)
    for name, x in [("b", b)] + list(named.items()):
        if _device(x) != where:
            raise errors.DeviceError(f"{fn}: a is on {where} and {name} on {_device(x)}; move {name} to {where} first")
    return Checked(owner, a, b, named["scale_a"], named["scale_b"], named.get("bias"), out, recipe)


def scaled_matmul(a: Any, b: Any, scale_a: Any, scale_b: Any, *, out_dtype: Any = "bfloat16", bias: Any = None,
                  use_fast_accum: bool = False, fn: str = "scaled_matmul") -> Any:
    """(a * scale_a) @ (b * scale_b) + bias in float32, cast to out_dtype; the recipe from the scales'
    shapes (module docstring). use_fast_accum: the FP8 kernel may serve it (module docstring); JAX's
    XLA dot chooses its own accumulation. Result in a's framework."""
    if arrays.framework_of(a) == "jax":
        from xgemm.jax import fp8 as jax_fp8
        return jax_fp8.scaled_matmul(a, b, scale_a, scale_b, out_dtype=out_dtype, bias=bias, fn=fn)
    c = check_scaled_matmul(a, b, scale_a, scale_b, out_dtype, bias, fn=fn)
    prepared = prepare_kernel(c, fn, use_fast_accum)
    # None also where the FP8 class could not be built (policy.built_or_none): the embedded default
    result = None if prepared is None else policy.built_or_none(lambda: prepare.run(prepared))
    return result if result is not None else run_default(arrays.namespace(c.owner), c)


def prepare_kernel(c: Checked, fn: str = "scaled_matmul", use_fast_accum: bool = True) -> Any:
    """The Prepared call of a kernel that takes this FP8 product (tensor- or row-wise scales as
    vectors of M and N values, block-wise ones as they are; K-major torch operands on a GPU) with the
    accumulation the call allows, or None for the embedded default. Planned like any GEMM: a GemmProblem with FP8
    operands and its scales."""
    planned = _plan_kernel(c, fn, use_fast_accum)
    if planned is None or not _accumulates_as_asked(planned[0], use_fast_accum):
        return None
    plan, (va, vb, vbias) = planned
    scales = [arrays.view(x if x is not None else _fresh_scale(c, name, want), name, fn)
              for name, x, want in _kernel_scales(c)]
    result = sys.modules["torch"].empty((plan.problem.m, plan.problem.n), device=c.a.device,
                                        dtype=arrays.framework_dtype("torch", c.out_dtype))
    return prepare.Prepared(plan, (va, vb, None, vbias, *scales), arrays.view(result, "out", fn), lambda r: result)


def _accumulates_as_asked(plan: Any, use_fast_accum: bool) -> bool:
    """A plan's class keeps its sums in the wgmma accumulator unless the plan promotes them: only a
    use_fast_accum call takes that."""
    return use_fast_accum or fp8_checks.PROMOTE_NOTE in plan.policy.notes


def _kernel_scales(c: Checked) -> list:
    """[(name, scale, (shape, strides))] as the kernel reads them: a row-wise scale as the vector
    of a's rows or b's columns, block-wise ones where they are laid out as the kernel loads them
    (fp8_checks.kernel_block_scales), or None where prepare_kernel copies block scales into a fresh
    array of that (shape, strides). A tensor-wise scale is a vector of one value (the kernel clamps
    its indices), not one repeated M or N times: two copies a call fewer."""
    r = c.recipe
    if r.name == "block":
        wants = fp8_checks.kernel_block_scales(r.m, r.k, r.n)
        return [(name, x if fp8_checks.in_kernel_block_layout(
                    tuple(x.shape), x.stride(), want, x.data_ptr() % 16 == 0) else None, want)
                for x, name, want in ((c.scale_a, "scale_a", wants[0]), (c.scale_b, "scale_b", wants[1]))]
    return [(name, x.reshape(-1), ((x.numel(),), (1,))) for x, name in ((c.scale_a, "scale_a"), (c.scale_b, "scale_b"))]


def _fresh_scale(c: Checked, name: str, want: tuple) -> Any:
    """The block scale `name` as a fresh torch array of want = (shape, strides) (_kernel_scales)."""
    torch, x = sys.modules["torch"], getattr(c, name)
    (shape, strides) = want
    # a padded buffer of the transposed or row-major rows, viewed back as `shape`
    unit = strides.index(1)
    buf = torch.empty((shape[1 - unit], strides[1 - unit]), device=x.device, dtype=torch.float32)
    view = buf[:, :shape[unit]]
    view.copy_(x.t() if unit == 0 else x)
    return view.t() if unit == 0 else view


def _plan_kernel(c: Checked, fn: str, use_fast_accum: bool) -> Any:
    """(plan, (a, b, bias views)) of a kernel that takes this product, or None; allocates nothing."""
    if c.owner != "torch":
        return None
    va = arrays.view(c.a, "a", fn)
    if va.device.kind != "cuda" or c.a.ndim != 2 or c.b.ndim != 2:
        return None
    (m, k), n = c.a.shape, c.b.shape[1]
    vb = arrays.view(c.b, "b", fn)
    vbias = arrays.view(c.bias, "bias", fn) if c.bias is not None else None
    # a scale prepare_kernel makes afresh (_kernel_scales) as it will be laid out
    scales = tuple(arrays.operand(arrays.view(x, name, fn)) if x is not None
                   else Operand(want[0], want[1], "float32", ROW if want[1][-1] == 1 else COL, 16)
                   for name, x, want in _kernel_scales(c))
    problem = GemmProblem(m=m, n=n, k=k, batch=(), a=arrays.operand(va), b=arrays.operand(vb), c=None,
                          epilogue=Epilogue(out_dtype=c.out_dtype), framework="torch", device=va.device,
                          bias=arrays.operand(vbias) if vbias is not None else None, scales=scales,
                          float32_accumulation=not use_fast_accum)
    plan = policy.choose("gemm", problem)
    if plan.kernel.name == "reference":
        return None
    return plan, (va, vb, vbias)


def fp8_matmul(a: Any, b: Any, *, recipe: str = "tensor", out_dtype: Any = None, bias: Any = None,
               fn: str = "fp8_matmul") -> Any:
    """quantize_fp8 of a and b with the recipe's blocks, then scaled_matmul (module docstring). Eager
    and without gradients here: torch tensors that need them take the torch op, JAX arrays
    xgemm.jax.fp8_matmul."""
    owner = prepare.owner_of(fn, "a", a)
    if owner == "jax":
        from xgemm.jax import fp8 as jax_fp8
        return jax_fp8.fp8_matmul(a, b, recipe=recipe, out_dtype=out_dtype, bias=bias, fn=fn)
    b, bias, plan, out = check_fp8_matmul(owner, a, b, recipe, out_dtype, bias, fn=fn)
    a8, sa = quantize_fp8(a, plan.a_recipe, fn=fn)
    b8, sb = quantize_fp8(b, plan.b_recipe, fn=fn)
    return scaled_matmul(a8, b8, sa, sb, out_dtype=out, bias=bias, fn=fn)


def check_fp8_matmul(owner: str, a: Any, b: Any, recipe: str, out_dtype: Any, bias: Any, *, fn: str = "fp8_matmul"):
    """(b and bias in a's framework, the Fp8MatmulPlan, the result dtype's name) for fp8_matmul's
    eager path and its torch op."""
    arrays.require_array(fn, "b", b)
    b = arrays.import_into(owner, b, "b", fn)
    plan = fp8_checks.fp8_matmul_plan(fn, recipe, a.shape, b.shape)
    if bias is not None:
        arrays.require_array(fn, "bias", bias)
        bias = arrays.import_into(owner, bias, "bias", fn)
        fp8_checks.bias(fn, arrays.dtype_name(bias), bias.shape, plan.matmul.n)
    out = fp8_checks.fp8_matmul_dtypes(fn, arrays.dtype_name(a), arrays.dtype_name(b), arrays.requested_dtype(out_dtype))
    return b, bias, plan, out


def run_default(xp: Any, c: Checked) -> Any:
    """The embedded default: dequantize in float32, one matmul, the bias, one cast. Where an FP8
    kernel plugs in: plan an fp8 GemmProblem and run the chosen kernel."""
    f32, dev = arrays.framework_dtype(c.owner, "float32"), c.a.device
    a = fp8_checks.dequantize(xp, c.a, c.scale_a, c.recipe.a_block, f32, dev)
    b = fp8_checks.dequantize(xp, c.b, c.scale_b, c.recipe.b_block, f32, dev)
    y = xp.matmul(a, b)
    if c.bias is not None:
        y = y + xp.astype(c.bias, f32)
    return xp.astype(y, arrays.framework_dtype(c.owner, c.out_dtype))


def quantize_fp8(x: Any, recipe: str = "tensor", dtype: Any = "float8_e4m3fn", *, fn: str = "quantize_fp8"):
    """(x_fp8, scale) with x ~= x_fp8 * scale; recipes, saturation and NaN in the module docstring."""
    owner = prepare.owner_of(fn, "x", x)
    if owner == "jax":
        from xgemm.jax import fp8 as jax_fp8
        return jax_fp8.quantize_fp8(x, recipe=recipe, dtype=dtype, fn=fn)
    dt = fp8_checks.fp8_dtype(fn, "dtype", arrays.requested_dtype(dtype))
    block, scale_shape = fp8_checks.quantize_block(fn, recipe, x.shape)
    fp8_checks.quantize_source(fn, arrays.dtype_name(x))
    return prepare.run(prepare_quantize(fn, owner, x, recipe, block, tuple(scale_shape), dt))


def prepare_quantize(fn: str, owner: str, x: Any, recipe: str, block: Any, scale_shape: tuple, dt: str) -> Any:
    """quantize_fp8 planned like any op (registry "quantize_fp8"): a one-pass kernel on the GPU for
    the row and 1x128 recipes (triton_quantize_sm90), else
    the embedded default (core/fp8_checks.quantize in the owner's ops)."""
    vx = arrays.view(x, "x", fn)
    problem = QuantizeProblem(arrays.operand(vx), recipe, block, scale_shape, dt, owner, vx.device)
    plan = policy.choose("quantize_fp8", problem)
    if plan.kernel.name == "reference":
        return prepare.Prepared(plan, (vx, None), None, lambda r: r)
    q = arrays.empty(owner, tuple(x.shape), dt, vx.device, x)
    if recipe == "block_1x128":
        # M-major, as the block-scaled GEMM class and torch._scaled_mm read it: no copy there
        (shape, strides), _ = fp8_checks.kernel_block_scales(scale_shape[0], x.shape[1], 1)
        scale = arrays.empty(owner, (shape[1], strides[1]), "float32", vx.device, x)[:, :shape[0]].T
    else:
        scale = arrays.empty(owner, scale_shape, "float32", vx.device, x)
    return prepare.Prepared(plan, (vx, arrays.view(scale, "scale", fn)), arrays.view(q, "q", fn),
                            lambda r: (q, scale))


def explain_scaled_matmul(a: Any, b: Any, scale_a: Any, scale_b: Any, *, use_fast_accum: bool = False,
                          fn: str = "explain") -> str:
    """Where scaled_matmul runs, and what copies an FP8 wgmma kernel would need (K-major a and b)."""
    if arrays.framework_of(a) == "jax":
        from xgemm.jax import fp8 as jax_fp8
        return jax_fp8.explain_scaled_matmul(a, b, scale_a, scale_b, fn=fn)
    c = check_scaled_matmul(a, b, scale_a, scale_b, fn=fn)
    asked = _kernel_words(c, fn, use_fast_accum)
    if asked:
        return f"scaled_matmul {c.recipe.m}x{c.recipe.n}x{c.recipe.k}, {c.recipe.name}-wise scales; runs on {asked}"
    fast = _kernel_words(c, fn, True) if not use_fast_accum else None
    text = fp8_checks.kernel_needs(c.recipe, _unit_stride(c.a, 1), _unit_stride(c.b, 0))
    return text + (f"; with use_fast_accum=True it runs on {fast}" if fast else "")


def _kernel_words(c: Checked, fn: str, use_fast_accum: bool) -> Optional[str]:
    """The kernel a call with this accumulation runs, in words, or None for the embedded default."""
    planned = _plan_kernel(c, fn, use_fast_accum)
    if planned is None or not _accumulates_as_asked(planned[0], use_fast_accum):
        return None
    plan = planned[0]
    if c.recipe.name == "block":
        copied = [f"{name} copied {'M' if want[1][0] == 1 else 'row'}-major, its stride padded to 4 floats"
                  for name, x, want in _kernel_scales(c) if x is None]
        return (f"{plan.kernel.name} ({plan.policy.summary()}), each k-tile's sum multiplied by its block "
                f"scales and added in float32" + "".join(f"; {text}" for text in copied))
    promoted = fp8_checks.PROMOTE_NOTE in plan.policy.notes
    return (f"{plan.kernel.name} ({plan.policy.summary()}), the scales applied in its epilogue, "
            + ("its k-tile sums added in float32" if promoted else "its sums kept in the wgmma accumulator"))


def _unit_stride(x: Any, axis: int) -> bool:
    """Whether `axis` is x's contiguous one (element strides; NumPy's are in bytes)."""
    if x.shape[axis] <= 1:
        return True
    strides = x.stride() if callable(getattr(x, "stride", None)) else tuple(s // x.itemsize for s in x.strides)
    return strides[axis] == 1
