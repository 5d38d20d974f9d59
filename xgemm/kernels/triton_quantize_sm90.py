"""triton_quantize_sm90: quantize_fp8 for the row and 1x128 recipes in one pass over x, written in
Triton and prebuilt to cubins like the Gluon kernels.

Contract
  op        q, scale = quantize_fp8(x, recipe) for recipe "row" (scale [R, 1]) and "block_1x128"
            (scale [R, ceil(C / 128)]), as core/fp8_checks.quantize computes them: amax over the
            block's finite |x|, scale = amax / fp8_max (1 where that is 0), q = clamp(x * (1 /
            scale), -fp8_max, fp8_max) rounded to nearest even, NaN kept. Bit-exact with the
            reference: its two divisions a scale are IEEE (div.rn), not the approximate ones.
  dtypes    x float32 | float16 | bfloat16; q float8_e4m3fn | float8_e5m2; scale float32.
  layout    x 2-D, its last dim contiguous, any row stride; 16-byte aligned base, cols and row
            stride multiples of 16 bytes (16-byte loads); q fresh and compact; scale fresh, M-major
            (its rows contiguous, each column's stride lds): the 1x128 recipe's scales come out
            as torch._scaled_mm and the block-scaled GEMM class read them (fp8_checks.kernel_block_scales).
  limits    cols <= 16384: a row (BLOCK_C = cols rounded up to a power of two) is held in registers.
  arch      sm_90a cubins (xgemm/runtime/gluon_cache.py), launched without triton.
  status    validated on the H200 (2026-12-02): bit-exact with the reference on every dtype pair,
            recipe and the shapes of tests/gpu/test_triton_quantize_gpu.py.

Why
  The embedded default is several framework ops (abs, max, divide, clamp, cast): 140 GB/s on the
  H200 against a copy's 4036 (2026-12-02). One pass reads x once and writes q and the scales once.
"""
from __future__ import annotations

from collections import namedtuple
from typing import List, Optional

from xgemm.core import fp8_checks
from xgemm.core.dtypes import ITEMSIZE, LONG_DTYPE, SHORT_DTYPE
from xgemm.core.problem import ROW, Policy
from xgemm.runtime import gluon_cache, launch
from xgemm.runtime.gluon_cache import parse_key

NAME = "triton_quantize_sm90"
IN_DTYPES = ("float32", "float16", "bfloat16")
OUT_DTYPES = fp8_checks.FP8_DTYPES
MAX_COLS = 16384
SEGMENT = 128                          # the 1x128 recipe's block
_OUT_SHORT = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
_OUT_LONG = {v: k for k, v in _OUT_SHORT.items()}


class Config(namedtuple("Config", "in_dtype out_dtype block_c block_m seg warps")):
    """One compiled variant: BLOCK_M rows of BLOCK_C columns a program, a scale per `seg` columns
    (seg == block_c: the row recipe)."""
    __slots__ = ()

    @property
    def key(self) -> str:
        return (f"{NAME}/{SHORT_DTYPE[self.in_dtype]}-{_OUT_SHORT[self.out_dtype]}/"
                f"c{self.block_c}-m{self.block_m}-s{self.seg}-w{self.warps}")

    @classmethod
    def from_key(cls, key: str) -> "Config":
        (i, o), f = parse_key(key, NAME)
        return cls(LONG_DTYPE[i], _OUT_LONG[o], f["c"], f["m"], f["s"], f["w"])

    def check(self) -> None:
        pow2 = lambda v: v > 0 and v & (v - 1) == 0        # noqa: E731
        assert self.in_dtype in IN_DTYPES and self.out_dtype in OUT_DTYPES, self
        assert all(pow2(v) for v in (self.block_c, self.block_m, self.warps)), self
        assert SEGMENT <= self.block_c <= MAX_COLS and self.seg in (SEGMENT, self.block_c), self


ELEMS_PER_THREAD = 16


def choose(cols: int, in_dtype: str, out_dtype: str, recipe: str) -> Config:
    """BLOCK_C = cols rounded up to a power of two (>= 128); 16 values of x a thread: 4 warps up
    to 2048 columns (more rows a program below), 8 at 4096, 16 at 8192 and 16384 (32 a thread
    there). The launch-shape sweep is in docs/performance.md (Measurements behind the code)."""
    block_c = max(SEGMENT, 1 << (cols - 1).bit_length())
    warps = min(16, max(4, block_c // (32 * ELEMS_PER_THREAD)))
    block_m = max(1, 32 * warps * ELEMS_PER_THREAD // block_c)
    return Config(in_dtype, out_dtype, block_c, block_m, block_c if recipe == "row" else SEGMENT, warps)


# (BLOCK_C, BLOCK_M, warps) around choose()'s pick, bf16 -> e4m3 rows of 4096 and 8192: 8 to 64
# values a thread, 1 to 4 rows a program; built on request for benchmarks/fp8.py --only tune
TUNE = ((4096, 1, 4), (4096, 1, 8), (4096, 1, 16), (4096, 2, 8), (4096, 2, 16),
        (8192, 1, 8), (8192, 1, 16), (8192, 2, 16))


def tune_entries() -> List[str]:
    return [Config("bfloat16", "float8_e4m3fn", c, m, c, w).key for c, m, w in TUNE]


# ----------------------------------------------------------------------------------------------
# Triton source (imported only to compile)
# ----------------------------------------------------------------------------------------------

def _define():
    import triton
    import triton.language as tl

    @triton.jit
    def xgemm_quantize_fp8(x_ptr, q_ptr, s_ptr, R, C, ldx, n_seg, lds,
                           FMAX: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, SEG: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_C)
        rows64 = rows.to(tl.int64)
        mask = (rows < R)[:, None] & (cols < C)[None, :]
        x = tl.load(x_ptr + rows64[:, None] * ldx + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mag = tl.where((x == x) & (tl.abs(x) != float("inf")), tl.abs(x), 0.0)
        # one scale per SEG columns: [BLOCK_M, BLOCK_C / SEG, SEG], the max over the last dim
        amax = tl.max(tl.reshape(mag, (BLOCK_M, BLOCK_C // SEG, SEG)), axis=2)
        scale = tl.math.div_rn(amax, tl.full(amax.shape, FMAX, tl.float32))
        scale = tl.where(scale > 0, scale, 1.0)
        # one division a scale, a multiply a value: a division a value (~20 instructions) kept the
        # kernel at 0.80-0.83x copy, issue-bound (docs/performance.md)
        inv = tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)
        full = tl.reshape(tl.broadcast_to(inv[:, :, None], (BLOCK_M, BLOCK_C // SEG, SEG)), (BLOCK_M, BLOCK_C))
        y = tl.clamp(x * full, -FMAX, FMAX, propagate_nan=tl.PropagateNan.ALL)
        tl.store(q_ptr + rows64[:, None] * C + cols[None, :],
                 y.to(q_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)
        segs = tl.arange(0, BLOCK_C // SEG)
        tl.store(s_ptr + rows64[:, None] + segs[None, :] * lds, scale,
                 mask=(rows < R)[:, None] & (segs < n_seg)[None, :])

    return xgemm_quantize_fp8


def gluon_compile_args(key: str, arch: str):
    cfg = Config.from_key(key)
    if arch != "sm_90a":
        raise ValueError(f"{key} is built for sm_90a only, not {arch}")
    cfg.check()
    sig = {"x_ptr": f"*{SHORT_DTYPE[cfg.in_dtype]}", "q_ptr": "*fp8e4nv" if cfg.out_dtype == "float8_e4m3fn"
           else "*fp8e5", "s_ptr": "*fp32", "R": "i32", "C": "i32", "ldx": "i64", "n_seg": "i32",
           "lds": "i64"}
    constexprs = {"FMAX": fp8_checks.FP8_MAX[cfg.out_dtype], "BLOCK_M": cfg.block_m, "BLOCK_C": cfg.block_c,
                  "SEG": cfg.seg}
    sig.update({k: "constexpr" for k in constexprs})
    # 16-byte bases, cols and row stride multiples of 16 bytes of x: 16-byte loads (and the
    # masks constant over each vector). C is promised a multiple of vec only, what supports()
    # checks: q's rows are C bytes, so a thread's vec fp8 values go out as one 4- or 8-byte store
    # (promising 16 misaligned those stores for C = 8 or 1000: the H200 run of 2026-12-02)
    vec = 16 // ITEMSIZE[cfg.in_dtype]
    attrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]],
             (4,): [["tt.divisibility", vec]], (5,): [["tt.divisibility", vec]]}
    options = {"num_warps": cfg.warps, "num_stages": 1, "enable_fp_fusion": False}
    return _define(), sig, constexprs, attrs, options


def gluon_entries(arch: str = "sm_90a") -> List[str]:
    """sm_90a: x {fp32, fp16, bf16} x q {e4m3, e5m2} x BLOCK_C 128 ... 16384 x {row, 1x128}: every
    config choose() picks (96 entries); none for other archs."""
    if arch != "sm_90a":
        return []
    keys, block_c = [], SEGMENT
    while block_c <= MAX_COLS:
        for i in IN_DTYPES:
            for o in OUT_DTYPES:
                for recipe in ("row", "block_1x128"):
                    keys.append(choose(block_c, i, o, recipe).key)
        block_c *= 2
    return list(dict.fromkeys(keys))


# ----------------------------------------------------------------------------------------------
# The kernel protocol (kernels/_common.py)
# ----------------------------------------------------------------------------------------------

class TritonQuantizeSm90:
    name = NAME
    ops = ("quantize_fp8",)
    backend = "gluon"           # built and launched through the Gluon kernels' cubin cache

    def supports(self, problem) -> Optional[str]:
        dev, x = problem.device, problem.x
        if dev.kind != "cuda" or dev.arch != (9, 0):
            return "needs a Hopper GPU (sm_90)"
        if problem.recipe not in ("row", "block_1x128"):
            return f"recipe {problem.recipe!r}: one pass serves the row and 1x128 recipes only"
        if x.dtype not in IN_DTYPES or problem.out_dtype not in OUT_DTYPES:
            return f"x {x.dtype} -> {problem.out_dtype} is not one of {IN_DTYPES} -> {OUT_DTYPES}"
        rows, cols = x.shape
        if not 1 <= cols <= MAX_COLS or rows < 1 or rows >= 2 ** 31:
            return f"x {x.shape}: needs 1..{MAX_COLS} columns (a row in registers) and 1..2**31 - 1 rows"
        vec = 16 // ITEMSIZE[x.dtype]
        if x.majorness != ROW or x.alignment < 16 or cols % vec or (rows > 1 and x.strides[0] % vec):
            return "16-byte loads need a contiguous last dim, a 16-byte aligned x, cols and row stride of 16 bytes"
        return gluon_cache.available(self._config(problem).key)

    def _config(self, problem) -> Config:
        return choose(problem.x.shape[1], problem.x.dtype, problem.out_dtype, problem.recipe)

    def policy(self, problem) -> Policy:
        cfg = self._config(problem)
        return Policy(tile=(cfg.block_m, cfg.block_c), warps=cfg.warps,
                      notes=(f"one pass, a scale per {cfg.seg} columns",))

    def run(self, problem, policy, operands, out, stream) -> None:
        """operands (x, scale): scale is the float32 [R, segments] array it writes beside q (out),
        row-major for the row recipe ([R, 1]), M-major for 1x128 (its column stride lds >= R)."""
        x, scale = operands
        cfg = self._config(problem)._replace(block_m=policy.tile[0], block_c=policy.tile[1], warps=policy.warps)
        entry = gluon_cache.lookup(cfg.key)
        launcher = launch.get_launcher(entry.cubin, entry.meta, x.device.index)
        rows, cols = problem.x.shape
        launcher(-(-rows // cfg.block_m), stream, x.ptr, out.ptr, scale.ptr, rows, cols,
                 x.strides[0] if rows > 1 else cols, -(-cols // cfg.seg), scale.strides[1])

    def jax_lowering(self, problem, policy, *, portable: bool = False, sm_margin: int = 0):
        return None                 # JAX quantizes with XLA's ops (xgemm/jax/fp8.py)

    def prebuild(self, arch: str):
        return gluon_entries(arch)


KERNEL = TritonQuantizeSm90()
KERNELS = (KERNEL,)
