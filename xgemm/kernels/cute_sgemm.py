"""cute_sgemm: fp32 SIMT GEMM in CuTe-DSL, D[l] = alpha * A[l] @ B[l] + beta * C[l].

Contract
- dtypes: A, B, C, D float32; accumulation in fp32 with FFMA (no TF32, no tensor cores).
- majorness: A row (K-major) or col (M-major); B row (N-major) or col (K-major); C and D row
  (N-major) or col (M-major), each independently; all combinations run without copying operands.
  A STRIDED operand (neither dim contiguous) is declined (the API compacts it first).
- batch: any number of batch dims (already broadcast to problem.batch); each operand keeps its
  own batch strides, 0 for a broadcast batch. Batch dims are one nested CuTe mode in the kernel.
- alignment, per operand: the "vec" class (base address 16-byte aligned, leading and batch
  strides multiples of 4 elements, and for A/B the contiguous extent a multiple of 4) gets 128-bit
  cp.async loads / 128-bit stores; anything else gets 32-bit copies. Ragged M/N/K are predicated.
- epilogue: D = alpha*acc + beta*C; beta == 0 (or no C) compiles a variant that never reads C.
- split-K: small-M/N, large-K problems split K across CTAs into an fp32 workspace; a second
  kernel reduces the splits and applies alpha/beta/C (deterministic order, no atomics).
- arch: sm_80 or newer (cp.async), compiled for the device's own arch (sm_90a on H100/H200).
  On sm_90+ the GEMM kernel uses programmatic dependent launch (griddepcontrol): it may start
  while the stream's previous kernel drains, and lets the next one start before its epilogue,
  which hides most of a small GEMM's launch gap in a chain of calls (jax.jit, CUDA graphs).
- limits: M, N, K < 2^31; grid: ceil(N/tile_n) <= 65535, batch * splits <= 65535.

Design (from CUTLASS's CuTe-DSL Ampere SGEMM example, ported to nvidia-cutlass-dsl 4.8):
multistage cp.async gmem->smem pipeline, register double buffering of smem->rmem fragments,
smem kept M/N-major so each thread reads 4 consecutive values with one 128-bit LDS; K-major
operands are transposed on the way into smem by 32-bit cp.async with 4-float padding (no bank
conflicts); the K residue is the first k-tile so the main loop needs no K predicate.

Tiles (CONFIGS): 128x128 (8x8 per thread, 256 threads) for large problems, 64x128 / 128x64
(128 threads) for skinny and short-K ones, 64x64 and 32x32 for small ones, with split-K where
there are too few tiles to fill the GPU; the policy table below says which, and why.

One compile per class (tile config x majorness x alignment x batch rank x C/no-C x index width),
never per shape: shapes are symbolic in the compiled function (see xgemm/runtime/cute_cache.py).
"""
# (no `from __future__ import annotations`: the DSL evaluates the device code's annotations)

from dataclasses import dataclass
from typing import Optional, Tuple

from xgemm import arrays
from xgemm.core.layout import unit_stride_dim
from xgemm.core.problem import COL, ROW, GemmProblem, Policy
from xgemm.kernels._common import xla_views
from xgemm.runtime import cute_cache
from xgemm.runtime.calls import Arg, TvmFfiCall
from xgemm.runtime.cute_cache import arch_number
from xgemm.runtime.driver import sm_count
from xgemm.runtime.roles import OUT, A, B, C

NAME = "cute_sgemm"
_INT32_MAX = 2**31 - 1
_GRID_YZ_MAX = 65535


# --------------------------------------------------------------------------------------------
# Tile configurations and the policy table
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TileConfig:
    """One CTA tile: bm x bn x bk, `threads` arranged tm x tn, each owning (bm/tm) x (bn/tn)."""
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    stages: int
    warp_tiles: bool = False    # lanes of a warp as 4x8 (8x4 for M-major D) threads: fewer smem wavefronts
    k_groups: int = 1           # tm x tn thread groups that split each k-tile, summed through smem

    @property
    def threads(self) -> int:
        return self.tm * self.tn * self.k_groups

    @property
    def name(self) -> str:
        return (f"{self.bm}x{self.bn}x{self.bk}_t{self.threads}_s{self.stages}" + ("_w" if self.warp_tiles else "")
                + (f"_k{self.k_groups}" if self.k_groups > 1 else ""))

    @property
    def min_blocks(self) -> int:
        """CTAs per SM to ask ptxas for (caps registers at 128 for the 8x8-per-thread configs, so
        the C epilogue cannot cost occupancy); 0 = no cap."""
        per_thread = (self.bm // self.tm) * (self.bn // self.tn)
        return 65536 // (self.threads * 128) if per_thread >= 64 else 0

    def smem_bytes(self) -> int:
        reduce = 4 * self.bm * self.bn * self.k_groups if self.k_groups > 1 else 0
        return 4 * self.bk * self.stages * ((self.bm + 4) + (self.bn + 4)) + reduce


# Named configs. Each thread owns an (bm/tm) x (bn/tn) block made of 4x4 sub-blocks
# (4 consecutive values per dim so smem->register reads are 128-bit).
CONFIGS = {
    "128x128x8": TileConfig(128, 128, 8, 16, 16, 4),     # 8x8 per thread, 256 threads
    "128x128x16": TileConfig(128, 128, 16, 16, 16, 3),
    "128x128x16s4": TileConfig(128, 128, 16, 16, 16, 4),
    "128x128x16w": TileConfig(128, 128, 16, 16, 16, 3, True),
    "128x128x24": TileConfig(128, 128, 24, 16, 16, 3),
    "128x128x32": TileConfig(128, 128, 32, 16, 16, 3),
    "128x128x8w": TileConfig(128, 128, 8, 16, 16, 4, True),
    "128x128x24s2": TileConfig(128, 128, 24, 16, 16, 2),    # BIG_SHORT
    "128x64x8": TileConfig(128, 64, 8, 16, 8, 4),        # 8x8 per thread, 128 threads
    "128x64x16": TileConfig(128, 64, 16, 16, 8, 4),
    "128x64x16w": TileConfig(128, 64, 16, 16, 8, 4, True),
    "64x128x8": TileConfig(64, 128, 8, 8, 16, 4),
    "64x128x16": TileConfig(64, 128, 16, 8, 16, 4),
    "64x128x16w": TileConfig(64, 128, 16, 8, 16, 4, True),
    "64x64x8": TileConfig(64, 64, 8, 8, 8, 4),           # 8x8 per thread, 64 threads
    "64x64x16": TileConfig(64, 64, 16, 16, 16, 4),       # 4x4 per thread, 256 threads
    "32x64x32": TileConfig(32, 64, 32, 8, 16, 3),        # 4x4 per thread, 128 threads
    "32x32x32": TileConfig(32, 32, 32, 8, 8, 3),         # 4x4 per thread, 64 threads
    # K of every k-tile split over 2 / 4 groups of 64 threads: a tiny GEMM's latency is one
    # thread's FFMA chain (K x 16 FFMAs), which the split shortens
    "32x32x32k2": TileConfig(32, 32, 32, 8, 8, 3, k_groups=2),
    "32x32x32k4": TileConfig(32, 32, 32, 8, 8, 3, k_groups=4),
}

# The policy table. Tiles/splits measured on the H200 (benchmarks/gemm_sgemm.py --sweep; numbers
# in benchmarks/results/sgemm-sweep-h200.json and docs/performance.md). L = batch, SMs = 132 on
# the H200, "fill" = split-K S = clamp(floor(SMs * CTAs_per_SM / tiles), 1, K // 256) (at least 256 of K per split).
#
#   regime     condition (first match)                 config          split   why
#   large      tiles(128x128) * L >= 2 * SMs, K > 512   BIG             1       >= 1 wave at 2 CTAs/SM;
#                                                                               deep K tile: fewer
#                                                                               non-FFMA instructions
#              ... K <= 4096 and M*N*L <= 4096^2        BIG_SHORT       1       the same at 2 stages
#   large, short K   ... and K <= 512                   SKINNY_M        1       4 CTAs/SM overlap the
#                                                                               short main loops
#   tiny       M*N*L <= 256*256 and K <= 1024           32x32x32k4      1       latency bound: K in 1-2
#                                                                               loads, split over 4
#                                                                               groups of 64 threads
#   skinny M   M <= 64                                   SKINNY_M        fill    no M-waste; split fills
#   skinny N   N <= 64                                   SKINNY_N        fill    (mirror image)
#   mid        first of BIG, 64x64x8, 32x32x32 whose     that            fill    too few big tiles:
#              tiles * (K // 256) >= SMs (else 32x32x32)                         split K to fill the GPU
#              (BIG_SHORT for BIG where the split is 1 and the large row's BIG_SHORT condition holds)
#
# bk=24 wins over 16 (fewer non-FFMA instructions per k) and over 32 (a loop body twice as long);
# a 4th stage does not help; the tiny row's K split shortens the FFMA chain where operands sit in
# L2 (a jit chain). Each choice's figures: docs/performance.md, "xgemm/kernels/cute_sgemm.py".
BIG = "128x128x24"
# Two stages instead of three: 1-2% faster up to 4096^3, much slower at 8192^3 (hence the large
# row's size bound; docs/performance.md).
BIG_SHORT = "128x128x24s2"
TINY = "32x32x32k4"
SKINNY_M = "64x128x16w"
SKINNY_N = "128x64x16w"
_NUM_SMS_DEFAULT = 132


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def ctas_per_sm(cfg: "TileConfig") -> int:
    """Resident CTAs per SM: registers (128/thread for 8x8, ~72 for 4x4) and shared memory."""
    regs = 128 if (cfg.bm // cfg.tm) * (cfg.bn // cfg.tn) >= 64 else 80
    by_regs = 65536 // (cfg.threads * regs)
    by_smem = (228 * 1024) // (cfg.smem_bytes() + 1024)
    return max(1, min(by_regs, by_smem, 32))


def _tiles(cfg: "TileConfig", m: int, n: int, batch: int) -> int:
    return _ceil_div(m, cfg.bm) * _ceil_div(n, cfg.bn) * batch


def _fill_split(cfg: "TileConfig", m: int, n: int, k: int, batch: int, sms: int) -> int:
    tiles = _tiles(cfg, m, n, batch)
    return max(1, min(sms * ctas_per_sm(cfg) // max(tiles, 1), k // 256))


def choose_config(m: int, n: int, k: int, batch: int, num_sms: int = _NUM_SMS_DEFAULT) -> Tuple[str, int]:
    """(config name, split_k) for one problem: the table above, first matching row."""
    short = k <= 4096 and m * n * batch <= 4096 * 4096
    if _tiles(CONFIGS[BIG], m, n, batch) >= 2 * num_sms:
        return ((BIG_SHORT if short else BIG) if k > 512 else SKINNY_M), 1
    if m * n * batch <= 256 * 256 and k <= 1024:
        return TINY, 1
    if m <= 64 < n:
        return SKINNY_M, _fill_split(CONFIGS[SKINNY_M], m, n, k, batch, num_sms)
    if n <= 64 < m:
        return SKINNY_N, _fill_split(CONFIGS[SKINNY_N], m, n, k, batch, num_sms)
    for name in (BIG, "64x64x8", "32x32x32"):
        cfg = CONFIGS[name]
        if _tiles(cfg, m, n, batch) * max(1, k // 256) >= num_sms:
            break
    split = _fill_split(CONFIGS[name], m, n, k, batch, num_sms)
    return (BIG_SHORT if name == BIG and split == 1 and short else name), split


# --------------------------------------------------------------------------------------------
# Compile-class description
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OperandClass:
    """What a compiled variant assumes of one operand: majorness, vector class, batch rank."""
    major: str          # ROW | COL (last dim contiguous | second-to-last contiguous)
    vec: bool           # 16-byte class (see module docstring)
    nbatch: int         # number of batch dims


@dataclass(frozen=True)
class Variant:
    cfg: TileConfig
    a: OperandClass
    b: OperandClass
    d: OperandClass
    c: Optional[OperandClass]   # None: the variant never reads C
    idx32: bool                 # every operand's element offsets fit in int32

    def key(self) -> tuple:
        return (NAME, "gemm", self.cfg, self.a, self.b, self.d, self.c, self.idx32)


@dataclass(frozen=True)
class ReduceVariant:
    w: OperandClass
    d: OperandClass
    c: Optional[OperandClass]
    idx32: bool

    def key(self) -> tuple:
        return (NAME, "splitk_reduce", self.w, self.d, self.c, self.idx32)


def _max_offset(shape, strides) -> int:
    return sum((n - 1) * abs(s) for n, s in zip(shape, strides) if n > 0)


# --------------------------------------------------------------------------------------------
# The CuTe-DSL kernels (imported lazily: `import xgemm` must not import cutlass)
# --------------------------------------------------------------------------------------------
_dsl = None


def _build_dsl():
    """Define the CuTe-DSL classes on first use."""
    global _dsl
    if _dsl is not None:
        return _dsl

    import cutlass
    import cutlass.cute as cute
    from cutlass.memory import SmemAllocator

    Float32, Int32, Boolean = cutlass.Float32, cutlass.Int32, cutlass.Boolean

    def to_mnl(t: cute.Tensor, nbatch: int, swap: bool) -> cute.Tensor:
        """(batch..., R, C) as given by the caller -> CuTe's (R, C, L) or, swapped, (C, R, L);
        the batch dims become one nested mode L (or a unit mode when there are none)."""
        shp, std = t.layout.shape, t.layout.stride
        r, c = (nbatch + 1, nbatch) if swap else (nbatch, nbatch + 1)
        if nbatch == 0:
            lshape, lstride = 1, 0
        elif nbatch == 1:
            lshape, lstride = shp[0], std[0]
        else:
            lshape = tuple(shp[i] for i in range(nbatch))
            lstride = tuple(std[i] for i in range(nbatch))
        return cute.make_tensor(
            t.iterator, cute.make_layout((shp[r], shp[c], lshape), stride=(std[r], std[c], lstride)))

    class SGemm:
        """Compile-time configuration of one variant; __call__ is the host entry."""

        def __init__(self, v: Variant, split_mode: bool, pdl: bool = False):
            self.v = v
            self.cfg = v.cfg
            self.split_mode = split_mode
            self.pdl = pdl          # programmatic dependent launch (sm_90+)
            self.bm, self.bn, self.bk = v.cfg.bm, v.cfg.bn, v.cfg.bk
            self.threads = v.cfg.threads
            # A/B smem is M/N-major; K-major operands are transposed in flight and padded
            # by 4 floats so the 32-bit cp.async writes of one warp hit 32 distinct banks.
            self.a_kmajor = v.a.major == ROW
            self.b_kmajor = v.b.major == COL
            self.pad_a = 4 if self.a_kmajor else 0
            self.pad_b = 4 if self.b_kmajor else 0

        def _g2s_copy(self, kmajor: bool, vec: bool, mn: int):
            """Tiled cp.async for an (mn, bk) tile of an M/N-major smem buffer."""
            thr = self.threads
            if kmajor:
                # 8 threads read 32 contiguous bytes of one row (a full sector); warps stack rows.
                atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(), Float32, num_bits_per_copy=32)
                tl = cute.make_layout((thr // 8, 8), stride=(8, 1))
                vl = cute.make_layout((1, 1))
            else:
                nv = 4 if vec else 1
                along = min(mn // nv, thr)
                atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(), Float32, num_bits_per_copy=32 * nv)
                tl = cute.make_layout((along, thr // along), stride=(1, along))
                vl = cute.make_layout((nv, 1))
            return cute.make_tiled_copy_tv(atom, tl, vl)

        def _tiled_mma(self):
            tm, tn, kg = self.cfg.tm, self.cfg.tn, self.cfg.k_groups
            row_d = self.v.d.major == ROW
            if kg > 1:
                # thread = t + tm*tn*g: group g takes every kg-th k of each k-tile; the same t in
                # every group owns the same D values
                if row_d:
                    atoms = cute.make_layout((tm, tn, kg), stride=(tn, 1, tm * tn))
                else:
                    atoms = cute.make_layout((tm, tn, kg), stride=(1, tm, tm * tn))
            elif self.cfg.warp_tiles:
                # thread id = lane + 32 * warp; a warp's 32 lanes cover 4 (M) x 8 (N) threads for
                # an N-major D (8 x 4 for M-major), so one 128-bit LDS of A touches 4 (8) distinct
                # 16-byte chunks and one of B 8 (4): a single smem wavefront each
                lm, ln = (4, 8) if row_d else (8, 4)
                wm, wn = tm // lm, tn // ln
                if row_d:   # lane: n fastest; warps: n fastest
                    atoms = cute.make_layout(((lm, wm), (ln, wn), 1), stride=((ln, 32 * wn), (1, 32), 0))
                else:       # lane: m fastest; warps: m fastest
                    atoms = cute.make_layout(((lm, wm), (ln, wn), 1), stride=((1, 32), (lm, 32 * wm), 0))
            elif row_d:
                atoms = cute.make_layout((tm, tn, 1), stride=(tn, 1, 0))   # n fastest: D rows coalesce
            else:
                atoms = cute.make_layout((tm, tn, 1), stride=(1, tm, 0))
            # each thread owns 4 consecutive m (and n) values: one 128-bit LDS per 4 values
            perm_m = cute.make_layout((tm, 4), stride=(4, 1))
            perm_n = cute.make_layout((tn, 4), stride=(4, 1))
            return cute.make_tiled_mma(cute.nvgpu.MmaUniversalOp(Float32), atoms,
                                       permutation_mnk=(perm_m, perm_n, None))

        @cute.jit
        def launch(self, mA: cute.Tensor, mB: cute.Tensor, mD: cute.Tensor, mC, alpha: Float32,
                   beta: Float32, k_tiles_per_split: Int32, splits: Int32, stream):
            v = self.v
            a = to_mnl(mA, v.a.nbatch, False)           # (M, K, L)
            b = to_mnl(mB, v.b.nbatch, True)            # (K, N) -> (N, K, L)
            d = to_mnl(mD, v.d.nbatch, False)           # (M, N, Ld)
            c = None
            if cutlass.const_expr(mC is not None):
                c = to_mnl(mC, v.c.nbatch, False)
            sA_layout = cute.make_layout(
                (self.bm, self.bk, self.cfg.stages),
                stride=(1, self.bm + self.pad_a, self.bk * (self.bm + self.pad_a)))
            sB_layout = cute.make_layout(
                (self.bn, self.bk, self.cfg.stages),
                stride=(1, self.bn + self.pad_b, self.bk * (self.bn + self.pad_b)))
            copy_a = self._g2s_copy(self.a_kmajor, v.a.vec, self.bm)
            copy_b = self._g2s_copy(self.b_kmajor, v.b.vec, self.bn)
            tiled_mma = self._tiled_mma()
            m_tiles = cute.ceil_div(a.shape[0], self.bm)
            n_tiles = cute.ceil_div(b.shape[0], self.bn)
            batch = cute.size(a.shape[2])
            self.kernel(a, b, d, c, sA_layout, sB_layout, copy_a, copy_b, tiled_mma, alpha, beta,
                        k_tiles_per_split).launch(
                grid=[m_tiles, n_tiles, batch * splits], block=[self.threads, 1, 1], stream=stream,
                min_blocks_per_mp=self.cfg.min_blocks, preferred_smem_carveout=100, use_pdl=self.pdl)

        @cute.kernel
        def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mD: cute.Tensor, mC, sA_layout: cute.Layout,
                   sB_layout: cute.Layout, tiled_copy_A: cute.TiledCopy, tiled_copy_B: cute.TiledCopy,
                   tiled_mma: cute.TiledMma, alpha: Float32, beta: Float32, k_tiles_per_split: Int32):
            bM, bN, bK = self.bm, self.bn, self.bk
            tidx, _, _ = cute.arch.thread_idx()
            bidx, bidy, bidz = cute.arch.block_idx()
            M, K = mA.shape[0], mA.shape[1]
            N = mB.shape[0]
            L = cute.size(mA.shape[2])
            l = bidz % L
            split = bidz // L
            # this CTA's K window [k_lo, k_lo + k_len); whole k-tiles except the last split's end
            k_lo = split * k_tiles_per_split * bK
            k_len = cutlass.min(K - k_lo, k_tiles_per_split * bK)
            k_tile_count = cute.ceil_div(k_len, bK)
            # the first k-tile is the ragged one: shift the window start back by the residue
            residue_k = k_len - k_tile_count * bK

            mA_l = cute.domain_offset((0, k_lo), mA[None, None, l])
            mB_l = cute.domain_offset((0, k_lo), mB[None, None, l])
            gA = cute.local_tile(mA_l, (bM, bK), (bidx, None))        # (bM, bK, k)
            gB = cute.local_tile(mB_l, (bN, bK), (bidy, None))        # (bN, bK, k)
            gA = cute.domain_offset((0, residue_k, 0), gA)
            gB = cute.domain_offset((0, residue_k, 0), gB)
            # identity tensors: (m, k) coordinates relative to the window, for predicates
            cA = cute.local_tile(cute.make_identity_tensor(mA_l.shape), (bM, bK), (bidx, None))
            cB = cute.local_tile(cute.make_identity_tensor(mB_l.shape), (bN, bK), (bidy, None))
            cA = cute.domain_offset((0, residue_k, 0), cA)
            cB = cute.domain_offset((0, residue_k, 0), cB)

            smem = SmemAllocator()
            sA = smem.allocate_tensor(Float32, sA_layout, 16)
            sB = smem.allocate_tensor(Float32, sB_layout, 16)
            thr_copy_A = tiled_copy_A.get_slice(tidx)
            thr_copy_B = tiled_copy_B.get_slice(tidx)
            tAgA = thr_copy_A.partition_S(gA)
            tAsA = thr_copy_A.partition_D(sA)
            tBgB = thr_copy_B.partition_S(gB)
            tBsB = thr_copy_B.partition_D(sB)
            tAcA = thr_copy_A.partition_S(cA)
            tBcB = thr_copy_B.partition_S(cB)

            # predicates: M/N bound for every tile (k-mode stride 0), M/N and K for the residue tile
            tApA = cute.make_rmem_tensor(
                cute.make_layout((tAsA.shape[0][1], cute.size(tAsA, mode=[1]), cute.size(tAsA, mode=[2])),
                                 stride=(cute.size(tAsA, mode=[1]), 1, 0)), Boolean)
            tBpB = cute.make_rmem_tensor(
                cute.make_layout((tBsB.shape[0][1], cute.size(tBsB, mode=[1]), cute.size(tBsB, mode=[2])),
                                 stride=(cute.size(tBsB, mode=[1]), 1, 0)), Boolean)
            tApA_res = cute.make_rmem_tensor(
                cute.make_layout((tAsA.shape[0][1], cute.size(tAsA, mode=[1]), cute.size(tAsA, mode=[2])),
                                 stride=(cute.size(tAsA, mode=[1]) * cute.size(tAsA, mode=[2]),
                                         cute.size(tAsA, mode=[2]), 1)), Boolean)
            tBpB_res = cute.make_rmem_tensor(
                cute.make_layout((tBsB.shape[0][1], cute.size(tBsB, mode=[1]), cute.size(tBsB, mode=[2])),
                                 stride=(cute.size(tBsB, mode=[1]) * cute.size(tBsB, mode=[2]),
                                         cute.size(tBsB, mode=[2]), 1)), Boolean)
            for rv in cutlass.range_constexpr(tApA.shape[0]):
                for i in cutlass.range_constexpr(tApA.shape[1]):
                    tApA[rv, i, 0] = cute.elem_less(tAcA[(0, rv), i, 0, 0][0], M)
            for rv in cutlass.range_constexpr(tBpB.shape[0]):
                for i in cutlass.range_constexpr(tBpB.shape[1]):
                    tBpB[rv, i, 0] = cute.elem_less(tBcB[(0, rv), i, 0, 0][0], N)
            for rv in cutlass.range_constexpr(tApA_res.shape[0]):
                for i in cutlass.range_constexpr(tApA_res.shape[1]):
                    for kk in cutlass.range_constexpr(tApA_res.shape[2]):
                        crd = tAcA[(0, rv), i, kk, 0]
                        tApA_res[rv, i, kk] = cute.elem_less((crd[0], Int32(-1)), (M, crd[1]))
            for rv in cutlass.range_constexpr(tBpB_res.shape[0]):
                for i in cutlass.range_constexpr(tBpB_res.shape[1]):
                    for kk in cutlass.range_constexpr(tBpB_res.shape[2]):
                        crd = tBcB[(0, rv), i, kk, 0]
                        tBpB_res[rv, i, kk] = cute.elem_less((crd[0], Int32(-1)), (N, crd[1]))

            # ---- prologue: fill stages-1 smem stages. Stage 0 gets the ragged k-tile; predicated-off
            # elements are zero-filled by cp.async (src-size 0), so the K residue adds nothing.
            k_pipe_max = cute.size(tAsA, mode=[3])
            # programmatic dependent launch: this grid may start while the previous kernel in the
            # stream finishes; wait for it (and its writes) before the first global access
            if cutlass.const_expr(self.pdl):
                cute.arch.griddepcontrol_wait()
            if k_tile_count > 0:
                cute.copy(tiled_copy_A, tAgA[None, None, None, 0], tAsA[None, None, None, 0], pred=tApA_res)
                cute.copy(tiled_copy_B, tBgB[None, None, None, 0], tBsB[None, None, None, 0], pred=tBpB_res)
            cute.arch.cp_async_commit_group()
            for kt in cutlass.range_constexpr(1, k_pipe_max - 1):
                if kt < k_tile_count:
                    cute.copy(tiled_copy_A, tAgA[None, None, None, kt], tAsA[None, None, None, kt], pred=tApA)
                    cute.copy(tiled_copy_B, tBgB[None, None, None, kt], tBsB[None, None, None, kt], pred=tBpB)
                cute.arch.cp_async_commit_group()

            # ---- register fragments and accumulators
            thr_mma = tiled_mma.get_slice(tidx)
            tCsA = thr_mma.partition_A(sA)
            tCsB = thr_mma.partition_B(sB)
            tCrA = tiled_mma.make_fragment_A(tCsA[None, None, None, 0])
            tCrB = tiled_mma.make_fragment_B(tCsB[None, None, None, 0])
            gD0 = cute.local_tile(mD[None, None, bidz], (bM, bN), (bidx, bidy))
            tCgD = thr_mma.partition_C(gD0)
            tCrC = tiled_mma.make_fragment_C(tCgD)
            tCrC.fill(0.0)

            smem_pipe_read = Int32(0)
            smem_pipe_write = Int32(k_pipe_max - 1)
            k_tile_next = Int32(k_pipe_max - 1)
            tCsA_p = tCsA[None, None, None, smem_pipe_read]
            tCsB_p = tCsB[None, None, None, smem_pipe_read]
            k_block_max = cute.size(tCrA, mode=[2])
            if cutlass.const_expr(k_block_max > 1):
                cute.arch.cp_async_wait_group(k_pipe_max - 2)
                cute.arch.sync_threads()
                cute.autovec_copy(tCsA_p[None, None, 0], tCrA[None, None, 0])
                cute.autovec_copy(tCsB_p[None, None, 0], tCrB[None, None, 0])

            # ---- main loop: smem pipeline (k-tiles) x register pipeline (k-blocks)
            for _ in range(k_tile_count):
                for k_block in cutlass.range_constexpr(k_block_max):
                    if cutlass.const_expr(k_block == k_block_max - 1):
                        tCsA_p = tCsA[None, None, None, smem_pipe_read]
                        tCsB_p = tCsB[None, None, None, smem_pipe_read]
                        cute.arch.cp_async_wait_group(k_pipe_max - 2)
                        cute.arch.sync_threads()
                    k_block_next = (k_block + 1) % k_block_max
                    cute.autovec_copy(tCsA_p[None, None, k_block_next], tCrA[None, None, k_block_next])
                    cute.autovec_copy(tCsB_p[None, None, k_block_next], tCrB[None, None, k_block_next])
                    # issue the next tile's A before the FMAs and B after, to interleave
                    if cutlass.const_expr(k_block == 0):
                        if k_tile_next < k_tile_count:
                            cute.copy(tiled_copy_A, tAgA[None, None, None, k_tile_next],
                                      tAsA[None, None, None, smem_pipe_write], pred=tApA)
                    cute.gemm(tiled_mma, tCrC, tCrA[None, None, k_block], tCrB[None, None, k_block], tCrC)
                    if cutlass.const_expr(k_block == 0):
                        if k_tile_next < k_tile_count:
                            cute.copy(tiled_copy_B, tBgB[None, None, None, k_tile_next],
                                      tBsB[None, None, None, smem_pipe_write], pred=tBpB)
                        cute.arch.cp_async_commit_group()
                        k_tile_next = k_tile_next + 1
                        smem_pipe_write = smem_pipe_read
                        smem_pipe_read = smem_pipe_read + 1
                        if smem_pipe_read == k_pipe_max:
                            smem_pipe_read = Int32(0)

            cute.arch.cp_async_wait_group(0)
            # the next kernel may launch now: its CTAs take free SMs and wait for this grid to end
            if cutlass.const_expr(self.pdl):
                cute.arch.griddepcontrol_launch_dependents()

            # ---- K groups: every group's partial sums through smem; group 0 adds them and is the
            # only one to store (the others see an empty tile: residue 0)
            keep = Int32(1)
            if cutlass.const_expr(self.cfg.k_groups > 1):
                kg = self.cfg.k_groups
                T = self.cfg.tm * self.cfg.tn
                F = cute.size(tCrC)
                sRed = smem.allocate_tensor(Float32, cute.make_layout((F, T, kg), stride=(T, 1, F * T)), 16)
                t, g = tidx % T, tidx // T
                for f in cutlass.range_constexpr(F):
                    sRed[f, t, g] = tCrC[f]
                cute.arch.sync_threads()
                for gg in cutlass.range_constexpr(1, kg):
                    for f in cutlass.range_constexpr(F):
                        tCrC[f] = tCrC[f] + sRed[f, t, gg]
                keep = 1 - cutlass.min(g, 1)

            # ---- epilogue: D = alpha*acc + beta*C, 128-bit when the tile is interior
            residue_m = (M - bM * bidx) * keep
            residue_n = (N - bN * bidy) * keep
            interior = cute.elem_less((bM - 1, bN - 1), (residue_m, residue_n))
            cD = cute.make_identity_tensor((bM, bN))
            tCcD = thr_mma.partition_C(cD)
            predC = cute.make_rmem_tensor(tCrC.layout, Boolean)
            for i in cutlass.range_constexpr(cute.size(tCrC.shape)):
                predC[i] = cute.elem_less(tCcD[i], (residue_m, residue_n))
            scalar_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32)
            # Register fragments ordered like D (resp. C) in memory, so the interior tile moves
            # 4 contiguous values per instruction: (1, M, N) views permuted to (1, N, M) when
            # the operand is N-major.
            perm_d = [0, 2, 1] if cutlass.const_expr(self.v.d.major == ROW) else [0, 1, 2]
            tCgD_p = cute.make_tensor(tCgD.iterator, cute.select(tCgD.layout, mode=perm_d))
            rD_p = cute.make_rmem_tensor_like(tCgD_p, Float32)
            rD = cute.make_tensor(rD_p.iterator, cute.select(rD_p.layout, mode=perm_d))  # (1, M, N)
            acc = tCrC.load() * alpha
            if cutlass.const_expr(mC is not None):
                gC = cute.local_tile(mC[None, None, l], (bM, bN), (bidx, bidy))
                tCgC = thr_mma.partition_C(gC)
                perm_c = [0, 2, 1] if cutlass.const_expr(self.v.c.major == ROW) else [0, 1, 2]
                tCgC_p = cute.make_tensor(tCgC.iterator, cute.select(tCgC.layout, mode=perm_c))
                rC_p = cute.make_rmem_tensor_like(tCgC_p, Float32)
                rC = cute.make_tensor(rC_p.iterator, cute.select(rC_p.layout, mode=perm_c))
                rC.fill(0.0)
                if interior:
                    cute.autovec_copy(tCgC_p, rC_p)
                else:
                    cute.copy(scalar_atom, tCgC, rC, pred=predC)
                acc = acc + rC.load() * beta
            rD.store(acc)
            if interior:
                cute.autovec_copy(rD_p, tCgD_p)
            else:
                cute.copy(scalar_atom, rD, tCgD, pred=predC)

    class SplitKReduce:
        """D[m, n, l] = alpha * sum_s W[m, n, s*L + l] + beta * C[m, n, l] (fixed order)."""
        ROWS, COLS = 8, 32

        def __init__(self, v: ReduceVariant):
            self.v = v

        @cute.jit
        def launch(self, mW: cute.Tensor, mD: cute.Tensor, mC, alpha: Float32, beta: Float32,
                   splits: Int32, stream):
            v = self.v
            w = to_mnl(mW, v.w.nbatch, False)
            d = to_mnl(mD, v.d.nbatch, False)
            c = None
            if cutlass.const_expr(mC is not None):
                c = to_mnl(mC, v.c.nbatch, False)
            M, N = d.shape[0], d.shape[1]
            L = cute.size(d.shape[2])
            fast, slow = (N, M) if cutlass.const_expr(v.d.major == ROW) else (M, N)
            self.kernel(w, d, c, alpha, beta, splits).launch(
                grid=[cute.ceil_div(fast, self.COLS), cute.ceil_div(slow, self.ROWS), L],
                block=[self.ROWS * self.COLS, 1, 1], stream=stream)

        @cute.kernel
        def kernel(self, mW: cute.Tensor, mD: cute.Tensor, mC, alpha: Float32, beta: Float32, splits: Int32):
            tidx, _, _ = cute.arch.thread_idx()
            bidx, bidy, l = cute.arch.block_idx()
            M, N = mD.shape[0], mD.shape[1]
            L = cute.size(mD.shape[2])
            f = bidx * self.COLS + tidx % self.COLS     # along D's contiguous dim: coalesced
            s_ = bidy * self.ROWS + tidx // self.COLS
            m, n = (s_, f) if cutlass.const_expr(self.v.d.major == ROW) else (f, s_)
            if cute.elem_less((m, n), (M, N)):
                acc = Float32(0.0)
                for s in range(splits):
                    acc = acc + mW[m, n, s * L + l]
                out = acc * alpha
                if cutlass.const_expr(mC is not None):
                    out = out + mC[m, n, l] * beta
                mD[m, n, l] = out

    _dsl = (cutlass, cute, SGemm, SplitKReduce)
    return _dsl


# --------------------------------------------------------------------------------------------
# Fake tensors and compilation
# --------------------------------------------------------------------------------------------
def _fake_operand(cute, cutlass, oc: OperandClass, rows, cols, batch_syms, idx32: bool):
    """Fake (batch..., rows, cols) fp32 tensor with symbolic dims and strides for oc's class."""
    width = 32 if idx32 else 64
    div = 4 if oc.vec else 1
    ld = cute.sym_int(width, divisibility=div)
    bstr = tuple(cute.sym_int(width, divisibility=div) for _ in range(oc.nbatch))
    if oc.major == ROW:
        stride = bstr + (ld, 1)
    else:
        stride = bstr + (1, ld)
    shape = tuple(batch_syms[:oc.nbatch]) + (rows, cols)
    return cute.runtime.make_fake_tensor(cutlass.Float32, shape, stride=stride,
                                         assumed_align=16 if oc.vec else 4)


def _gemm_fake_args(v: Variant, split_mode: bool):
    import cutlass
    import cutlass.cute as cute
    # A/B extents along a vectorized contiguous dim must be multiples of 4 (shared symbols
    # carry that promise to every operand using that extent; TVM-FFI checks it per call).
    m_div = 4 if (v.a.vec and v.a.major == COL) else 1
    n_div = 4 if (v.b.vec and v.b.major == ROW) else 1
    k_div = 4 if ((v.a.vec and v.a.major == ROW) or (v.b.vec and v.b.major == COL)) else 1
    M = cute.sym_int(divisibility=m_div)
    N = cute.sym_int(divisibility=n_div)
    K = cute.sym_int(divisibility=k_div)
    nb = max(v.a.nbatch, v.b.nbatch, 1 if split_mode else 0)
    batch = [cute.sym_int() for _ in range(nb)]
    fa = _fake_operand(cute, cutlass, v.a, M, K, batch, v.idx32)
    fb = _fake_operand(cute, cutlass, v.b, K, N, batch, v.idx32)
    if split_mode:
        ws = cute.sym_int()         # batch * splits: its own symbol
        fd = _fake_operand(cute, cutlass, v.d, M, N, [ws], v.idx32)
    else:
        fd = _fake_operand(cute, cutlass, v.d, M, N, batch, v.idx32)
    fc = None if v.c is None else _fake_operand(cute, cutlass, v.c, M, N, batch, v.idx32)
    return fa, fb, fd, fc


def compile_gemm(v: Variant, split_mode: bool, arch: str, extra_options: str = ""):
    """cute.compile one GEMM variant against fake tensors (no GPU needed)."""
    import cutlass
    import cutlass.cute as cute
    _, _, SGemm, _ = _build_dsl()
    fa, fb, fd, fc = _gemm_fake_args(v, split_mode)
    op = SGemm(v, split_mode, pdl=arch_number(arch) >= 90)
    stream = cute.runtime.make_fake_stream()
    opts = f"--enable-tvm-ffi --gpu-arch {arch} {extra_options}".strip()
    return cute.compile(op.launch, fa, fb, fd, fc, cutlass.Float32(1.0), cutlass.Float32(0.0),
                        cutlass.Int32(1), cutlass.Int32(1), stream, options=opts)


def compile_reduce(v: ReduceVariant, arch: str, extra_options: str = ""):
    import cutlass
    import cutlass.cute as cute
    _, _, _, SplitKReduce = _build_dsl()
    M, N = cute.sym_int(), cute.sym_int()
    batch = [cute.sym_int() for _ in range(v.d.nbatch)]
    fw = _fake_operand(cute, cutlass, v.w, M, N, [cute.sym_int()], v.idx32)
    fd = _fake_operand(cute, cutlass, v.d, M, N, batch, v.idx32)
    fc = None if v.c is None else _fake_operand(cute, cutlass, v.c, M, N, batch, v.idx32)
    stream = cute.runtime.make_fake_stream()
    return cute.compile(SplitKReduce(v).launch, fw, fd, fc, cutlass.Float32(1.0), cutlass.Float32(0.0),
                        cutlass.Int32(1), stream,
                        options=f"--enable-tvm-ffi --gpu-arch {arch} {extra_options}".strip())


# --------------------------------------------------------------------------------------------
# Host side: classes of the caller's operands, the compile cache, the launch
# --------------------------------------------------------------------------------------------
def _leading(shape, strides, major: str) -> int:
    return strides[-2] if major == ROW else strides[-1]


def operand_class(shape, strides, ptr: int, need_extent: bool) -> OperandClass:
    major = unit_stride_dim(shape, strides)
    return OperandClass(major, _vec_class(shape, strides, ptr, major, need_extent), len(shape) - 2)


def _vec_class(shape, strides, ptr: int, major: str, need_extent: bool) -> bool:
    """16-byte class: base 16B aligned; every stride but the unit one a multiple of 4 elements
    (TVM-FFI checks the declared divisibility of each stride, whatever its extent); for A/B the
    contiguous extent a multiple of 4, so a 4-wide vector never straddles the edge."""
    if ptr % 16:
        return False
    contig = len(shape) - 1 if major == ROW else len(shape) - 2
    if any(s % 4 for i, s in enumerate(strides) if i != contig):
        return False
    return not (need_extent and shape[contig] % 4)


_sm_counts: dict = {}


def _num_sms(index: int) -> int:
    if index not in _sm_counts:
        try:
            count = sm_count(index)
        except Exception:  # noqa: BLE001 - no driver: the table's default machine
            count = 0
        _sm_counts[index] = int(count) or _NUM_SMS_DEFAULT
    return _sm_counts[index]


def policy_of(name: str, split: int = 1) -> Policy:
    """The Policy that names CONFIGS[name] (and a split-K factor)."""
    cfg = CONFIGS[name]
    notes = ((f"{cfg.bm // cfg.tm}x{cfg.bn // cfg.tn} per thread",) + (("warp tiles",) if cfg.warp_tiles else ())
             + ((f"K over {cfg.k_groups} thread groups",) if cfg.k_groups > 1 else ()))
    return Policy(tile=(cfg.bm, cfg.bn, cfg.bk), stages=cfg.stages, warps=cfg.threads // 32, split_k=split,
                  notes=notes)


def _config_for(policy: Policy) -> TileConfig:
    warp = "warp tiles" in policy.notes
    groups = next((int(s.split()[2]) for s in policy.notes if s.startswith("K over ")), 1)
    for cfg in CONFIGS.values():
        if ((cfg.bm, cfg.bn, cfg.bk) == tuple(policy.tile[:3]) and (not policy.stages or cfg.stages == policy.stages)
                and cfg.warp_tiles == warp and cfg.k_groups == groups):
            return cfg
    raise ValueError(f"{NAME}: no tile config {policy.tile} with {policy.stages} stages; "
                     f"known: {', '.join(CONFIGS)}")


def gemm_build(v: Variant, split_mode: bool, arch: str):
    """(compile-cache key, build) of one GEMM variant."""
    return (v.key() + (("split",) if split_mode else ()) + (arch,),
            lambda: compile_gemm(v, split_mode, arch))


def reduce_build(v: ReduceVariant, arch: str):
    return v.key() + (arch,), lambda: compile_reduce(v, arch)


def build_for_key(key: tuple):
    """The build callable for a key this module made (lets compile.warm() compile in workers)."""
    if key[1] == "gemm":
        return gemm_build(Variant(*key[2:7], key[7]), key[-2] == "split", key[-1])[1]
    if key[1] == "splitk_reduce":
        return reduce_build(ReduceVariant(*key[2:6]), key[-1])[1]
    raise KeyError(key)


def split_plan(k: int, bk: int, split: int) -> Tuple[int, int]:
    """(k-tiles per split, splits actually used): no split is left empty."""
    k_tiles = _ceil_div(k, bk)
    if split <= 1 or k_tiles <= 1:
        return max(k_tiles, 1), 1
    per = _ceil_div(k_tiles, split)
    return per, _ceil_div(k_tiles, per)


class _Launch:
    """Everything one (problem class, shapes) needs per call, resolved once."""
    __slots__ = ("gemm", "reduce", "kps", "splits", "reads_c", "ws_shape", "ws_col", "ws_cut", "arch")

    def __call__(self, a, b, c, out, alpha: float, beta: float, stream: int) -> None:
        # the compiled functions are bare tvm_ffi.Functions: every parameter positional, and a
        # variant compiled without C still takes (and ignores) None in C's place
        cobj = c.obj if self.reads_c else None
        if self.splits == 1:
            self.gemm(a.obj, b.obj, out.obj, cobj, alpha, beta, self.kps, 1, stream)
            return
        # fp32 partials (splits*L, M, N), padded to a 16-byte leading dim, ordered like D
        full = arrays.empty(out.framework, self.ws_shape, "float32", out.device, out.obj)
        w = full[:, :, : self.ws_cut]
        if self.ws_col:
            w = w.transpose(-1, -2) if out.framework == "torch" else w.swapaxes(-1, -2)
        self.gemm(a.obj, b.obj, w, None, 1.0, 0.0, self.kps, self.splits, stream)
        self.reduce(w, out.obj, cobj, alpha, beta, self.splits, stream)


class _CuteSgemm:
    name = NAME
    ops = ("gemm",)
    backend = "cute"

    def __init__(self):
        self._plans: dict = {}

    # -- protocol ---------------------------------------------------------------------------
    def supports(self, problem) -> Optional[str]:
        dev = problem.device
        if dev.kind != "cuda":
            return "needs a CUDA device"
        if dev.arch is not None and tuple(dev.arch) < (8, 0):
            return f"needs sm_80 or newer (cp.async); device is sm_{dev.arch[0]}{dev.arch[1]}"
        if not isinstance(problem, GemmProblem):
            return "not a GEMM"
        ops = [("A", problem.a), ("B", problem.b)]
        if problem.epilogue.reads_c and problem.c is not None:
            ops.append(("C", problem.c))
        for label, op in ops:
            if op.dtype != "float32":
                return f"fp32 only ({label} is {op.dtype})"
            if len(op.shape) < 2 or unit_stride_dim(op.shape, op.strides) is None:
                return f"{label} is strided (neither of its last two dims has unit stride)"
        if problem.epilogue.out_dtype != "float32":
            return f"fp32 only (output dtype {problem.epilogue.out_dtype})"
        if max(problem.m, problem.n, problem.k) > _INT32_MAX:
            return "a dimension exceeds 2^31 - 1"
        if _ceil_div(problem.n, 32) > _GRID_YZ_MAX:
            return f"N={problem.n} exceeds the grid's y limit"
        if problem.batch_count > _GRID_YZ_MAX:
            return f"batch {problem.batch_count} exceeds the grid's z limit"
        return None

    def policy(self, problem) -> Policy:
        sms = _num_sms(problem.device.index) if problem.device.kind == "cuda" else _NUM_SMS_DEFAULT
        name, split = choose_config(problem.m, problem.n, problem.k, problem.batch_count, sms)
        while split > 1 and problem.batch_count * split > _GRID_YZ_MAX:
            split //= 2
        return policy_of(name, split)

    def run(self, problem, policy: Policy, operands, out, stream) -> None:
        a, b, c = operands
        if out.size == 0:
            return None
        ep = problem.epilogue
        self._launch_for(problem, policy, a, b, c, out)(a, b, c, out, float(ep.alpha), float(ep.beta), int(stream))
        return None

    def bind(self, problem, policy: Policy, operands, out):
        """run() resolved for this exact signature (shapes, strides, dtypes, 16-byte classes):
        go(a, b, c, d, stream) on the framework arrays makes the same TVM-FFI call run() makes
        for views of them. None where run() needs views per call (split-K's workspace)."""
        a, b, c = operands
        if out.size == 0:
            return None
        launch = self._launch_for(problem, policy, a, b, c, out)
        if launch.splits != 1:
            return None
        gemm, kps = launch.gemm, launch.kps
        alpha, beta = float(problem.epilogue.alpha), float(problem.epilogue.beta)
        if hasattr(gemm, "prepare"):     # ctypes: marshalled once, data pointers + stream per call
            roles = (A, B, OUT, C) if launch.reads_c else (A, B, OUT)
            return gemm.prepare(a, b, out, c if launch.reads_c else None, alpha, beta, kps, 1, 0).go(roles)
        if launch.reads_c:
            def go(a, b, c, d, stream):
                gemm(a, b, d, c, alpha, beta, kps, 1, stream)
        else:
            def go(a, b, c, d, stream):
                gemm(a, b, d, None, alpha, beta, kps, 1, stream)
        return go

    def _launch_for(self, problem, policy: Policy, a, b, c, out) -> "_Launch":
        reads_c = c is not None and problem.epilogue.beta != 0.0
        key = (policy.tile, policy.stages, policy.split_k, problem.device,
               a.shape, a.strides, a.ptr % 16, b.shape, b.strides, b.ptr % 16,
               out.shape, out.strides, out.ptr % 16,
               (c.shape, c.strides, c.ptr % 16) if reads_c else None)
        launch = self._plans.get(key)
        if launch is None:
            launch = self._plan(problem, policy, a, b, c if reads_c else None, out)
            if len(self._plans) > 1024:
                self._plans.clear()
            self._plans[key] = launch
        return launch

    # -- resolution -------------------------------------------------------------------------
    def resolve(self, problem, policy: Policy, a, b, c, out):
        """(_Launch without its functions, [(key, build)] it needs): no compiling here."""
        cfg = _config_for(policy)
        arch = cute_cache.arch_for(problem.device)
        for label, v in (("A", a), ("B", b), ("out", out)) + ((("C", c),) if c is not None else ()):
            if v.dtype != "float32" or v.ndim < 2 or unit_stride_dim(v.shape, v.strides) is None:
                raise ValueError(f"{NAME}: {label} {v.shape} strides {v.strides} {v.dtype} is outside this "
                                 f"kernel's contract (fp32, one unit-stride dim); the API must compact it")
        m, n, k = out.shape[-2], out.shape[-1], a.shape[-1]
        oa = operand_class(a.shape, a.strides, a.ptr, need_extent=True)
        ob = operand_class(b.shape, b.strides, b.ptr, need_extent=True)
        od = operand_class(out.shape, out.strides, out.ptr, need_extent=False)
        oc = operand_class(c.shape, c.strides, c.ptr, need_extent=False) if c is not None else None
        views = [a, b, out] + ([c] if c is not None else [])
        kps, splits = split_plan(k, cfg.bk, policy.split_k)
        launch = _Launch()
        launch.kps, launch.splits, launch.reads_c, launch.arch = kps, splits, c is not None, arch
        launch.gemm = launch.reduce = None
        if splits == 1:
            idx32 = all(_max_offset(v.shape, v.strides) <= _INT32_MAX for v in views)
            return launch, [gemm_build(Variant(cfg, oa, ob, od, oc, idx32), False, arch)]
        batch = 1
        for d in out.shape[:-2]:
            batch *= d
        rows, cols = (m, n) if od.major == ROW else (n, m)
        cols_padded = _ceil_div(cols, 4) * 4
        launch.ws_shape = (splits * batch, rows, cols_padded)
        launch.ws_cut = cols
        launch.ws_col = od.major == COL
        ws_elems = splits * batch * rows * cols_padded
        idx32 = ws_elems <= _INT32_MAX and all(_max_offset(v.shape, v.strides) <= _INT32_MAX for v in views)
        ow = OperandClass(od.major, True, 1)
        return launch, [gemm_build(Variant(cfg, oa, ob, ow, None, idx32), True, arch),
                        reduce_build(ReduceVariant(ow, od, oc, idx32), arch)]

    def required(self, problem, policy: Policy, operands, out):
        """The (key, build) pairs run() would compile for these operands (for parallel warm-up)."""
        a, b, c = operands
        reads_c = c is not None and problem.epilogue.beta != 0.0
        return self.resolve(problem, policy, a, b, c if reads_c else None, out)[1]

    def jax_lowering(self, problem, policy: Policy, *, portable: bool = False, sm_margin: int = 0):
        """The compiled function, called as run() calls it. Split-K is turned off inside jit (one
        launch, no workspace): the policy's other choices stay."""
        if portable:                      # its TVM-FFI handle is process-local
            return None
        import dataclasses

        policy = dataclasses.replace(policy, split_k=1)
        ep = problem.epilogue
        a, b, c, out = xla_views(problem)
        launch, builds = self.resolve(problem, policy, a, b, c, out)
        if launch.splits != 1 or len(builds) != 1:
            return None
        fn = cute_cache.cute(*builds[0])
        args = (Arg.tensor("in", 0), Arg.tensor("in", 1), Arg.tensor("out", 0),
                Arg.tensor("in", 2) if c is not None else Arg.none(),
                Arg.f64(ep.alpha), Arg.f64(ep.beta), Arg.i64(launch.kps), Arg.i64(1), Arg.stream())
        return TvmFfiCall(fn, args)

    def prebuild(self, arch: str):
        return prebuild_classes(arch)

    def _plan(self, problem, policy: Policy, a, b, c, out) -> _Launch:
        launch, builds = self.resolve(problem, policy, a, b, c, out)
        fns = [cute_cache.cute_eager(key, build) for key, build in builds]
        launch.gemm = fns[0]
        launch.reduce = fns[1] if len(fns) > 1 else None
        return launch


KERNEL = _CuteSgemm()
KERNELS = (KERNEL,)


# --------------------------------------------------------------------------------------------
# Ahead-of-time: the classes `python -m xgemm build-cache` compiles (see runtime/cute_cache.prebuild)
# --------------------------------------------------------------------------------------------
def prebuild_classes(arch: str):
    """(key, build) for the common classes: every majorness combination of A/B/D on the big tile,
    and the torch-default layout (A, B, D row-major, 16-byte aligned) on every config the policy
    table uses, with and without C, unbatched and batched, plus split-K variants and reductions."""
    out = []
    big = CONFIGS[BIG]
    for am in (ROW, COL):
        for bm in (ROW, COL):
            for dm in (ROW, COL):
                out.append(gemm_build(Variant(big, OperandClass(am, True, 0), OperandClass(bm, True, 0),
                                              OperandClass(dm, True, 0), None, True), False, arch))
    row = lambda nb: OperandClass(ROW, True, nb)  # noqa: E731
    for name in (BIG, BIG_SHORT, SKINNY_M, SKINNY_N, "64x64x8", "32x32x32", TINY):
        cfg = CONFIGS[name]
        for nb in (0, 1):
            for c in (None, row(nb)):
                if cfg is big and nb == 0 and c is None:
                    continue
                out.append(gemm_build(Variant(cfg, row(nb), row(nb), row(nb), c, True), False, arch))
            out.append(gemm_build(Variant(cfg, row(nb), row(nb), row(1), None, True), True, arch))
    for nb in (0, 1):
        for c in (None, row(nb)):
            out.append(reduce_build(ReduceVariant(row(1), row(nb), c, True), arch))
    return out
