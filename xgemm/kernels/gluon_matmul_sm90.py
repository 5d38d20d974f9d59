"""gluon_matmul_sm90: D = A @ B as a Hopper 2-CTA cluster Gluon matmul (wgmma + multicast TMA),
prebuilt to cubins; plus its sm_100a counterpart (2-CTA tcgen05), compile-only.

Contract
  op        out = A @ B, A (M, K), B (K, N); fp32 accumulate, rounded once to the output dtype.
            No alpha/beta/C epilogue (problem.epilogue must be the plain one), no batch.
  dtypes    A, B both float16 or both bfloat16; out float16 | bfloat16 (same as the inputs) | float32.
  layout    A ROW (K-major); B ROW (N-major) or COL (K-major); out ROW. Anything else declines.
  alignment TMA: the three base pointers 16-byte aligned, every row stride a multiple of 16 bytes
            (K and N multiples of 8; fp32 out: N multiple of 4), M, N, K >= 1. Tails of M, N, K are
            handled by TMA's out-of-bounds zero fill (loads) and clipping (stores).
  arch      sm_90a (Hopper): built by triton >= 3.8 (xgemm/runtime/gluon_cache.py), launched by this
            module through xgemm/runtime/driver.py (ctypes on libcuda; no triton at run time).
            sm_100a: the 2-CTA tcgen05 variant compiles (gluon_entries("sm_100a")); nothing runs it.
  limits    M, N, K < 2**31; one output tile per cluster iteration, persistent grid of at most
            (#SMs / 2) clusters.

Design (from triton's python/tutorials/gluon: 05-wgmma, 07-persistence, 14-multicta)
  A cluster of 2 CTAs owns a [BM, 2 * BN] output tile; CTA r computes columns [r*BN, (r+1)*BN).
  The accumulator's cga_layout is ((0, 1),): split along N. So both CTAs need the same A tile:
  A's shared layout has cga_layout ((0, 0),) (broadcast) and the A load is one TMA multicast
  (.multicast::cluster) issued by the lead CTA into both CTAs' shared memory: A is read from L2
  once per cluster. B's layout ((0, 1),) gives each CTA its own half.
  Pipeline: STAGES shared-memory slots, per slot a `ready` mbarrier (per CTA: TMA bytes landed)
  and an `empty` mbarrier shared by the pair (two_ctas=True: it lives in the lead CTA, both CTAs
  arrive, count 2): the lead must not multicast into a slot its peer is still reading. One
  partition, no warp specialization: each K step waits `ready`, issues an async wgmma, waits for
  the previous wgmma (num_outstanding=1), releases that one's slot, then refills it STAGES-1
  steps ahead. Phases are counted across tiles (the pipeline drains only at a tile's end).
  Persistent: grid = min(#clusters of tiles, #SMs / 2); cluster c walks tiles c, c + grid, ...
  in grouped ("super-row") order, GROUP_M tile rows at a time, so concurrently running clusters
  share A rows and B columns in L2.
  Epilogue: registers -> shared (NVMMA layout) -> TMA store (clips the tails).

TMA descriptors without triton (what launch.py's cubins need)
  triton lowers a Gluon tensor-descriptor argument to five kernel parameters: a 128-byte
  CUtensorMap passed by value (`.param .align 64 .b8 p[128]`, a __grid_constant__), then the
  global shape as i32 per dim and the strides as i64 per dim (both outermost first). The map is
  what triton's driver.c fillTMADescriptorTiled builds: cuTensorMapEncodeTiled(dtype, rank 2,
  base, dims innermost first, byte strides of the outer dims, box = tensordesc_meta block_size
  reversed, element strides 1, no interleave, swizzle from the meta, L2 promotion 128B, no OOB
  NaN fill). `tma_params` computes those arguments in pure Python from the compiled kernel's
  tensordesc_meta (recorded in the cache JSON); `encode_tma` calls
  cuTensorMapEncodeTiled through xgemm/runtime/driver.py (needs the driver) and returns the 128 bytes; `_Launcher` packs them in
  64-byte-aligned slots and launches with cuLaunchKernelEx + the cluster attribute.
  Verified on the H200 (tests/gpu/test_gluon_matmul_gpu.py: exact integer products, ragged
  M/N/K, B N- and K-major, fp32 out), including that tensordesc_meta's box is the per-CTA box for
  the split and broadcast cga layouts.
Dispatch: registered after cute_gemm_sm90 (core/registry.py). Same-process timings decide the order
  (benchmarks/gemm_gluon.py times both with cuBLAS and quack); the CuTe kernel also serves
  alpha/beta/C, batches and small-tile shapes, so it stays first where they tie.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from collections import namedtuple
from typing import Dict, List, Optional, Tuple

from xgemm.core import layout
from xgemm.core.dtypes import ITEMSIZE, LONG_DTYPE, SHORT_DTYPE
from xgemm.core.problem import COL, ROW, Policy
from xgemm.kernels._common import sm90_half_gemm_reason
from xgemm.runtime import driver, gluon_cache
from xgemm.runtime.gluon_cache import parse_key

NAME = "gluon_matmul_sm90"
IN_DTYPES = ("float16", "bfloat16")
_SHORT, _LONG = SHORT_DTYPE, LONG_DTYPE
_ITEMSIZE = ITEMSIZE
# CUtensorMapDataType (host enum values, cuda.h)
_TMA_DTYPE = {"float16": 6, "bfloat16": 9, "float32": 7}    # host CUtensorMapDataType, for tests
_TMA_SWIZZLE_BYTES = {0: 0, 1: 32, 2: 64, 3: 128}     # tensordesc_meta "swizzle" -> bytes
CLUSTER = 2


class Config(namedtuple("Config", "arch in_dtype out_dtype bm bn bk stages warps group_m b_kmajor")):
    """One compiled variant. bn is the per-CTA N extent (the cluster tile is bm x 2*bn on sm_90a;
    on sm_100a the cluster tile is 2*bm x bn, split along M as tcgen05's 2-CTA mode requires)."""
    __slots__ = ()

    @property
    def key(self) -> str:
        return (f"{NAME}/{self.arch}-{_SHORT[self.in_dtype]}-{_SHORT[self.out_dtype]}/"
                f"m{self.bm}-n{self.bn}-k{self.bk}-s{self.stages}-w{self.warps}-g{self.group_m}-b{int(self.b_kmajor)}")

    @classmethod
    def from_key(cls, key: str) -> "Config":
        (arch, i, o), f = parse_key(key, NAME)
        return cls(arch, _LONG[i], _LONG[o], f["m"], f["n"], f["k"], f["s"], f["w"], f["g"], bool(f["b"]))

    @property
    def cluster_tile(self) -> Tuple[int, int]:
        return (self.bm, CLUSTER * self.bn) if self.arch == "sm_90a" else (CLUSTER * self.bm, self.bn)

    def smem_bytes(self) -> int:
        it = _ITEMSIZE[self.in_dtype]
        return self.stages * (self.bm + self.bn) * self.bk * it + self.bm * self.bn * _ITEMSIZE[self.out_dtype]


# Tile configs, the default first (the first that fits shared memory for the output dtype).
# Per-CTA 128x256 with 3 stages and 2 warpgroups (cluster tile 128x512, A multicast) measured
# fastest at bf16 8192^3 (benchmarks/gemm_gluon.py --all-configs; figures in docs/performance.md).
# An fp32 output's 128 KB epilogue tile leaves no room for the 128x256 tile's stages: there the
# 128x128 one-warpgroup tile is the default.
_SM90_TILES = ((128, 256, 64, 3, 8, 8),      # bm, bn, bk, stages, warps, group_m
               (128, 128, 64, 4, 4, 8),      # one warpgroup, 128x128 fp32 accumulator (128 regs)
               (128, 128, 64, 4, 8, 8),      # two warpgroups, 64 rows each: half the registers
               (128, 128, 64, 6, 8, 8))      # deeper pipeline (224 KB with a 16-bit output)
_SM100_TILES = ((128, 256, 64, 3, 4, 8),)    # 2-CTA tcgen05: cluster tile 256 x 256
SMEM_LIMIT = 227 * 1024 - 1024               # the opt-in maximum, less room for the mbarriers


def configs(in_dtype: str, out_dtype: str, b_kmajor: bool, arch: str = "sm_90a") -> List[Config]:
    """Every tile config built for this dtype pair and B majorness (those that fit shared memory)."""
    tiles = _SM90_TILES if arch == "sm_90a" else _SM100_TILES
    cfgs = [Config(arch, in_dtype, out_dtype, *t[:5], t[5], bool(b_kmajor)) for t in tiles]
    return [c for c in cfgs if c.smem_bytes() <= SMEM_LIMIT]


def pick_config(in_dtype: str, out_dtype: str, b_kmajor: bool, arch: str = "sm_90a") -> Config:
    return configs(in_dtype, out_dtype, b_kmajor, arch)[0]


# ----------------------------------------------------------------------------------------------
# Gluon sources (imported only to compile)
# ----------------------------------------------------------------------------------------------

def _define_sm90():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    @gluon.jit
    def _tile_coords(t, num_m, num_n, GROUP_M: gl.constexpr):
        # grouped order: GROUP_M tile rows advance together along N (L2 reuse of A rows and B cols)
        per_group = GROUP_M * num_n
        first_m = (t // per_group) * GROUP_M
        rows = gl.minimum(num_m - first_m, GROUP_M)
        return first_m + (t % per_group) % rows, (t % per_group) // rows

    @gluon.jit
    def xgemm_matmul_sm90(a_desc, b_desc, c_desc, M, N, K,
                          STAGES: gl.constexpr, GROUP_M: gl.constexpr, B_KMAJOR: gl.constexpr,
                          ACC_LAYOUT: gl.constexpr):
        BM: gl.constexpr = c_desc.block_shape[0]
        BN2: gl.constexpr = c_desc.block_shape[1]          # cluster tile N (both CTAs)
        BK: gl.constexpr = a_desc.block_shape[1]
        dtype: gl.constexpr = a_desc.dtype

        a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_shape, a_desc.layout)
        b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_shape, b_desc.layout)
        c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_shape, c_desc.layout)
        ready = mbarrier.allocate_mbarrier(batch=STAGES)
        # in the lead CTA, both CTAs arrive: the multicast of A may overwrite a slot only when
        # both have finished their wgmma on it
        empty = mbarrier.allocate_mbarrier(batch=STAGES, two_ctas=True)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)

        num_m = gl.cdiv(M, BM)
        num_n = gl.cdiv(N, BN2)
        k_tiles = gl.cdiv(K, BK)
        nbytes: gl.constexpr = a_desc.nbytes_per_cta + b_desc.nbytes_per_cta

        prod = 0            # slots filled / consumed, counted across tiles (index and phase)
        cons = 0
        for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
            pid_m, pid_n = _tile_coords(t, num_m, num_n, GROUP_M)
            off_m = pid_m * BM
            off_n = pid_n * BN2
            # prologue: STAGES - 1 slabs in flight
            for kk in gl.static_range(STAGES - 1):
                if kk < k_tiles:
                    s = prod % STAGES
                    # fresh barrier: parity 1 passes at once (its "previous phase" is complete)
                    mbarrier.wait(empty.index(s), ((prod // STAGES) & 1) ^ 1)
                    mbarrier.expect(ready.index(s), nbytes)
                    tma.async_load(a_desc, [off_m, kk * BK], ready.index(s), a_bufs.index(s), multicast=True)
                    if B_KMAJOR:
                        tma.async_load(b_desc, [off_n, kk * BK], ready.index(s), b_bufs.index(s), multicast=True)
                    else:
                        tma.async_load(b_desc, [kk * BK, off_n], ready.index(s), b_bufs.index(s), multicast=True)
                    prod += 1
            acc = gl.zeros([BM, BN2], gl.float32, ACC_LAYOUT)
            prev = 0
            for k in range(k_tiles):
                s = cons % STAGES
                mbarrier.wait(ready.index(s), (cons // STAGES) & 1)
                if B_KMAJOR:
                    b_op = b_bufs.index(s).permute((1, 0))
                else:
                    b_op = b_bufs.index(s)
                acc = warpgroup_mma(a_bufs.index(s), b_op, acc, is_async=True)
                acc, _, _ = warpgroup_mma_wait(1, deps=[acc, a_bufs.index(s), b_bufs.index(s)])
                if k > 0:       # the previous wgmma has finished: its slot is free for the pair
                    mbarrier.arrive(empty.index(prev))
                prev = s
                cons += 1
                kn = k + STAGES - 1
                if kn < k_tiles:
                    sp = prod % STAGES
                    mbarrier.wait(empty.index(sp), ((prod // STAGES) & 1) ^ 1)
                    mbarrier.expect(ready.index(sp), nbytes)
                    tma.async_load(a_desc, [off_m, kn * BK], ready.index(sp), a_bufs.index(sp), multicast=True)
                    if B_KMAJOR:
                        tma.async_load(b_desc, [off_n, kn * BK], ready.index(sp), b_bufs.index(sp),
                                       multicast=True)
                    else:
                        tma.async_load(b_desc, [kn * BK, off_n], ready.index(sp), b_bufs.index(sp),
                                       multicast=True)
                    prod += 1
            acc = warpgroup_mma_wait(0, deps=[acc])
            if k_tiles > 0:
                mbarrier.arrive(empty.index(prev))
            tma.store_wait(0)               # the previous tile's store has read c_smem
            c_smem.store(acc.to(c_desc.dtype))
            fence_async_shared()
            tma.async_store(c_desc, [off_m, off_n], c_smem)
        tma.store_wait(0)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))
            mbarrier.invalidate(empty.index(i))

    return xgemm_matmul_sm90


def _define_sm100():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.blackwell import (
        allocate_tensor_memory,
        tcgen05_commit,
        tcgen05_mma,
        tcgen05_mma_barrier_count,
    )
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

    @gluon.jit
    def xgemm_matmul_sm100_2cta(a_desc, b_desc, c_desc, M, N, K,
                                STAGES: gl.constexpr, GROUP_M: gl.constexpr, B_KMAJOR: gl.constexpr,
                                TMEM_LAYOUT: gl.constexpr):
        # 2-CTA tcgen05 (14-multicta.py): the pair computes a [2*BM, BN] tile, A split along M,
        # B along N, one MMA issued by the lead CTA reading both CTAs' shared memory.
        BM2: gl.constexpr = c_desc.block_shape[0]
        BN: gl.constexpr = c_desc.block_shape[1]
        BK: gl.constexpr = a_desc.block_shape[1]
        dtype: gl.constexpr = a_desc.dtype
        a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_shape, a_desc.layout)
        b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_shape, b_desc.layout)
        c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_shape, c_desc.layout)
        acc_tmem = allocate_tensor_memory(gl.float32, [BM2, BN], TMEM_LAYOUT)
        ready = mbarrier.allocate_mbarrier(batch=STAGES, two_ctas=True)
        empty = mbarrier.allocate_mbarrier(batch=STAGES)
        done = mbarrier.allocate_mbarrier()
        count: gl.constexpr = tcgen05_mma_barrier_count([a_bufs.index(0), b_bufs.index(0)], multicast=True,
                                                        two_ctas=True)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=count)
        mbarrier.init(done, count=count)
        nbytes: gl.constexpr = a_desc.nbytes_per_cta + b_desc.nbytes_per_cta

        num_m = gl.cdiv(M, BM2)
        num_n = gl.cdiv(N, BN)
        k_tiles = gl.cdiv(K, BK)
        prod = 0
        cons = 0
        tiles_done = 0
        for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
            per_group = GROUP_M * num_n
            first_m = (t // per_group) * GROUP_M
            rows = gl.minimum(num_m - first_m, GROUP_M)
            off_m = (first_m + (t % per_group) % rows) * BM2
            off_n = ((t % per_group) // rows) * BN
            for kk in gl.static_range(STAGES - 1):
                if kk < k_tiles:
                    s = prod % STAGES
                    mbarrier.wait(empty.index(s), ((prod // STAGES) & 1) ^ 1)
                    mbarrier.expect(ready.index(s), nbytes)
                    tma.async_load(a_desc, [off_m, kk * BK], ready.index(s), a_bufs.index(s), multicast=True)
                    if B_KMAJOR:
                        tma.async_load(b_desc, [off_n, kk * BK], ready.index(s), b_bufs.index(s), multicast=True)
                    else:
                        tma.async_load(b_desc, [kk * BK, off_n], ready.index(s), b_bufs.index(s), multicast=True)
                    prod += 1
            use_acc = False
            for k in range(k_tiles):
                s = cons % STAGES
                mbarrier.wait(ready.index(s), (cons // STAGES) & 1)
                if B_KMAJOR:
                    b_op = b_bufs.index(s).permute((1, 0))
                else:
                    b_op = b_bufs.index(s)
                tcgen05_mma(a_bufs.index(s), b_op, acc_tmem, use_acc=use_acc, multicast=True,
                            mbarriers=[empty.index(s)])
                use_acc = True
                cons += 1
                kn = k + STAGES - 1
                if kn < k_tiles:
                    sp = prod % STAGES
                    mbarrier.wait(empty.index(sp), ((prod // STAGES) & 1) ^ 1)
                    mbarrier.expect(ready.index(sp), nbytes)
                    tma.async_load(a_desc, [off_m, kn * BK], ready.index(sp), a_bufs.index(sp), multicast=True)
                    if B_KMAJOR:
                        tma.async_load(b_desc, [off_n, kn * BK], ready.index(sp), b_bufs.index(sp),
                                       multicast=True)
                    else:
                        tma.async_load(b_desc, [kn * BK, off_n], ready.index(sp), b_bufs.index(sp),
                                       multicast=True)
                    prod += 1
            tcgen05_commit(done, descs=[a_bufs.index(0), b_bufs.index(0)])
            mbarrier.wait(done, tiles_done & 1)
            tiles_done += 1
            tma.store_wait(0)
            c_smem.store(acc_tmem.load().to(c_desc.dtype))
            fence_async_shared()
            tma.async_store(c_desc, [off_m, off_n], c_smem)
        tma.store_wait(0)

    return xgemm_matmul_sm100_2cta


# ----------------------------------------------------------------------------------------------
# Compile arguments (gluon_cache plug-in)
# ----------------------------------------------------------------------------------------------

def _layouts(cfg: Config):
    """(a, b, c shared layouts with their block shapes, the constexpr accumulator layout)."""
    from triton.experimental.gluon import language as gl
    gdt = {"float16": gl.float16, "bfloat16": gl.bfloat16, "float32": gl.float32}
    it, ot = gdt[cfg.in_dtype], gdt[cfg.out_dtype]
    if cfg.arch == "sm_90a":
        c_cga, a_cga, b_cga = [[0, 1]], [[0, 0]], ([[1, 0]] if cfg.b_kmajor else [[0, 1]])
        c_block = [cfg.bm, CLUSTER * cfg.bn]
        a_block = [cfg.bm, cfg.bk]
        b_block = [CLUSTER * cfg.bn, cfg.bk] if cfg.b_kmajor else [cfg.bk, CLUSTER * cfg.bn]
        wg = cfg.warps // 4
        acc = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * wg, 1],
                                        instr_shape=[16, cfg.bn, 16], cga_layout=c_cga)
    else:
        from triton.experimental.gluon.language.nvidia.blackwell import TensorMemoryLayout
        c_cga, a_cga, b_cga = [[1, 0]], [[1, 0]], ([[1, 0]] if cfg.b_kmajor else [[0, 1]])
        c_block = [CLUSTER * cfg.bm, cfg.bn]
        a_block = [CLUSTER * cfg.bm, cfg.bk]
        b_block = [cfg.bn, cfg.bk] if cfg.b_kmajor else [cfg.bk, cfg.bn]
        acc = TensorMemoryLayout(block=(cfg.bm, cfg.bn), col_stride=1, cga_layout=c_cga, two_ctas=True)
    a_l = gl.NVMMASharedLayout.get_default_for(a_block, it, cga_layout=a_cga)
    b_l = gl.NVMMASharedLayout.get_default_for(b_block, it, cga_layout=b_cga)
    c_l = gl.NVMMASharedLayout.get_default_for(c_block, ot, cga_layout=c_cga)
    return (a_l, a_block), (b_l, b_block), (c_l, c_block), acc


def _desc_type(dtype: str, block, layout) -> str:
    # the signature string triton mangles a host TensorDescriptor to (gluon/nvidia/hopper.py)
    return f"tensordesc<{_SHORT[dtype]}[{','.join(map(str, block))}],{layout!r}>"


def gluon_compile_args(key: str, arch: str):
    cfg = Config.from_key(key)
    if cfg.arch != arch:
        raise ValueError(f"{key} is built for {cfg.arch}, not {arch}")
    (a_l, a_b), (b_l, b_b), (c_l, c_b), acc = _layouts(cfg)
    sig = {"a_desc": _desc_type(cfg.in_dtype, a_b, a_l), "b_desc": _desc_type(cfg.in_dtype, b_b, b_l),
           "c_desc": _desc_type(cfg.out_dtype, c_b, c_l), "M": "i32", "N": "i32", "K": "i32"}
    if arch == "sm_90a":
        fn = _define_sm90()
        constexprs = {"STAGES": cfg.stages, "GROUP_M": cfg.group_m, "B_KMAJOR": cfg.b_kmajor, "ACC_LAYOUT": acc}
    else:
        fn = _define_sm100()
        constexprs = {"STAGES": cfg.stages, "GROUP_M": cfg.group_m, "B_KMAJOR": cfg.b_kmajor, "TMEM_LAYOUT": acc}
    sig.update({k: "constexpr" for k in constexprs})
    options = {"num_warps": cfg.warps, "num_ctas": CLUSTER, "enable_fp_fusion": False}
    return fn, sig, constexprs, {}, options


def gluon_entries(arch: str = "sm_90a") -> List[str]:
    """sm_90a: {fp16, bf16} in x {same, fp32} out x B {N-major, K-major} x 2 tile configs = 16;
    sm_100a: {fp16, bf16} -> same, B N-major, one tile (compile-only reach) = 2."""
    keys = []
    if arch == "sm_90a":
        for i in IN_DTYPES:
            for o in (i, "float32"):
                for bk in (False, True):
                    keys += [c.key for c in configs(i, o, bk, arch)]
    elif arch == "sm_100a":
        for i in IN_DTYPES:
            keys.append(pick_config(i, i, False, arch).key)
    return keys


# ----------------------------------------------------------------------------------------------
# TMA descriptors and launching without triton
# ----------------------------------------------------------------------------------------------

TmaParams = namedtuple("TmaParams", "dtype rank dims strides box elem_strides swizzle")


def tma_params(meta: dict, ptr: int, shape, strides) -> TmaParams:
    """The cuTensorMapEncodeTiled arguments for a row-major 2-D view (shape, element strides,
    strides[-1] == 1) from a compiled kernel's tensordesc_meta entry -- what triton's driver.c
    fillTMADescriptorTiled computes. dims/box/strides are innermost first; strides are the
    outer dims' byte strides (rank - 1 of them)."""
    if strides[-1] != 1:
        raise ValueError(f"TMA needs a contiguous innermost dim, got strides {strides}")
    es = int(meta["elem_size"])
    rank = len(shape)
    if rank != len(meta["block_size"]):
        raise ValueError(f"rank {rank} != descriptor rank {len(meta['block_size'])}")
    dims = tuple(int(d) for d in reversed(shape))
    byte_strides = tuple(int(s) * es for s in reversed(strides[:-1]))
    if ptr % 16 or any(b % 16 for b in byte_strides):
        raise ValueError(f"TMA needs a 16-byte aligned base and 16-byte multiple strides ({ptr:#x}, {byte_strides})")
    box = tuple(int(b) for b in reversed(meta["block_size"]))
    et = int(meta["elem_type"])
    host_dtype = {8: 10, 9: 8, 10: 9}.get(et, et)   # device enum -> host enum (driver.py TMA_DTYPE_DEVICE_TO_HOST)
    return TmaParams(host_dtype, rank, dims, byte_strides, box, (1,) * rank, int(meta["swizzle"]))


def encode_tma(p: TmaParams, ptr: int) -> bytes:
    """The 128-byte CUtensorMap (cuTensorMapEncodeTiled through xgemm/runtime/driver.py; needs the driver)."""
    return driver.tensor_map_encode_tiled(p.dtype, ptr, p.dims, p.strides, p.box, p.elem_strides, p.swizzle,
                                          str(p))


# Parameter block layout of one tensor descriptor: 128-byte map (64-byte aligned), 2 x i32 shape,
# 2 x i64 strides. Each kernel param gets its own slot; the driver copies by the cubin's layout.
def param_slots(params: List[dict]) -> List[Tuple[int, int]]:
    """(offset, size) in a parameter buffer for each kernel param (maps 64-aligned, 128 bytes)."""
    out, off = [], 0
    for p in params:
        size, align = (128, 64) if p["ptx"] == "b8[128]" else (8, 8)
        off = (off + align - 1) // align * align
        out.append((off, size))
        off += size
    return out


class _Launcher:
    """A loaded cubin whose params include TMA maps: cuLaunchKernelEx with the cluster attribute.
    (launch.Launcher packs 8-byte slots only; this one adds 128-byte by-value maps.)"""

    def __init__(self, cubin: bytes, meta: dict, device: int):
        self.meta, self.name, self.device = meta, meta["name"], device
        self.num_ctas = int(meta["num_ctas"])
        self.shared = int(meta["shared"])
        if meta.get("global_scratch_size") or meta.get("profile_scratch_size"):
            raise RuntimeError(f"{self.name}: scratch memory is not supported by this launcher")
        self.slots = param_slots(meta["params"])
        total = self.slots[-1][0] + self.slots[-1][1]
        self._buf = ctypes.create_string_buffer(total + 64)
        base = (ctypes.addressof(self._buf) + 63) // 64 * 64      # maps need 64-byte alignment
        self._base = base
        self._ptrs = (ctypes.c_void_p * len(self.slots))(*[base + o for o, _ in self.slots])
        self._module, self._func = driver.load_kernel(cubin, self.name, device, self.shared, self.num_ctas)[:2]
        self._config = driver.launch_config(32 * int(meta["num_warps"]), self.shared, self.num_ctas, spread=False)
        self._config_ref = ctypes.byref(self._config)
        self._launch, self._check = driver.launcher(), driver.check
        self._lock = threading.Lock()

    def __call__(self, clusters: int, stream: int, values: List) -> None:
        """values: one per param (bytes of 128 for a map, int otherwise; scratch pointers included)."""
        with self._lock:
            for (off, size), p, v in zip(self.slots, self.meta["params"], values):
                if size == 128:
                    ctypes.memmove(self._base + off, v, 128)
                else:
                    code = {"i32": "<i", "i64": "<q"}.get(p["type"], "<Q")
                    struct.pack_into(code, (ctypes.c_char * 8).from_address(self._base + off), 0, v)
            cfg = self._config
            cfg.gridDimX = clusters * self.num_ctas
            cfg.hStream = stream
            self._check(self._launch(self._config_ref, self._func, ctypes.addressof(self._ptrs), None),
                        "cuLaunchKernelEx", self.name)


# ----------------------------------------------------------------------------------------------
# The kernel protocol (kernels/_common.py)
# ----------------------------------------------------------------------------------------------

class GluonMatmulSm90:
    name = NAME
    ops = ("gemm",)
    backend = "gluon"

    def __init__(self):
        self._launchers: Dict[tuple, tuple] = {}

    def supports(self, problem) -> Optional[str]:
        why = sm90_half_gemm_reason(problem)
        if why:
            return why
        a, b = problem.a, problem.b
        if getattr(problem, "c", None) is not None or not _plain_epilogue(problem):
            return "alpha/beta/C epilogue is not supported"
        if problem.epilogue.out_majorness != ROW or problem.epilogue.out_alignment < 16:
            return "writes a row-major, 16-byte aligned result only (out= is not)"
        if a.majorness != ROW or b.majorness not in (ROW, COL):
            return "A must be ROW (K-major) and B ROW or COL"
        m, n, k = problem.m, problem.n, problem.k
        if min(m, n, k) < 1 or max(m, n, k) >= 2 ** 31:
            return f"shape {m}x{n}x{k} out of range"
        if k % 8 or n % 8:
            return "TMA needs K and N multiples of 8 (16-byte rows)"
        for label, op in (("A", a), ("B", b)):
            if op.alignment < 16:       # a view's base or row stride (e.g. x[:, 1:]), not just K, N
                return f"{label} is not 16-byte aligned (TMA needs 16-byte base and row stride)"
        cfg = pick_config(a.dtype, problem.epilogue.out_dtype, b.majorness == COL)
        return gluon_cache.available(cfg.key)

    def policy(self, problem) -> Policy:
        return self.policy_of(pick_config(*self._dtypes_of(problem)))

    @staticmethod
    def _dtypes_of(problem) -> Tuple[str, str, bool]:
        return (problem.a.dtype if problem.a.dtype in IN_DTYPES else "bfloat16",
                problem.epilogue.out_dtype if problem.epilogue.out_dtype in ("float16", "bfloat16", "float32") else "float32",
                problem.b.majorness == COL)

    def candidate_policies(self, problem) -> List[Policy]:
        """The policy of every built tile config for this problem (benchmarks/gemm_gluon.py times them)."""
        return [self.policy_of(c) for c in configs(*self._dtypes_of(problem))]

    @staticmethod
    def policy_of(cfg: Config) -> Policy:
        return Policy(tile=(cfg.bm, CLUSTER * cfg.bn, cfg.bk), warps=cfg.warps, stages=cfg.stages,
                      cluster=(1, CLUSTER), notes=("multicast A", f"group_m {cfg.group_m}"))

    def _config_of(self, policy, in_dtype, out_dtype, b_kmajor) -> Config:
        bm, bn2, bk = policy.tile
        group_m = next((int(n.split()[1]) for n in policy.notes if n.startswith("group_m")), 8)
        return Config("sm_90a", in_dtype, out_dtype, bm, bn2 // CLUSTER, bk, policy.stages, policy.warps,
                      group_m, b_kmajor)

    def run(self, problem, policy, operands, out, stream) -> None:
        a, b = operands[0], operands[1]
        m, n, k = problem.m, problem.n, problem.k
        b_kmajor = b.strides[-1] != 1 or (b.shape[-1] == 1 and b.strides[-2] == 1)
        cfg = self._config_of(policy, a.dtype, out.dtype, b_kmajor)
        launcher, metas, sms = self._prepare(cfg, a.device.index)
        # row-major 2-D views of the three operands, as the kernel's descriptors address them. A
        # dim of extent 1 may carry any stride (torch's (8, 1).t() has strides (1, 1) and counts as
        # contiguous): its descriptor stride is never stepped, so it is the dense one (issue 22).
        lead = layout.leading_stride
        a_shape, a_str = (m, k), (lead(a.shape, a.strides, ROW), 1)
        b_shape, b_str = ((n, k), (lead(b.shape, b.strides, COL), 1)) if b_kmajor else \
            ((k, n), (lead(b.shape, b.strides, ROW), 1))
        c_shape, c_str = (m, n), (lead(out.shape, out.strides, ROW), 1)
        vals = []
        for (ptr, shape, st), meta in zip(((a.ptr, a_shape, a_str), (b.ptr, b_shape, b_str),
                                           (out.ptr, c_shape, c_str)), metas):
            vals += [encode_tma(tma_params(meta, ptr, shape, st), ptr), *shape, *st]
        vals += [m, n, k, 0, 0]                     # M, N, K, global/profile scratch (size 0)
        bm, bn2 = cfg.cluster_tile
        tiles = -(-m // bm) * -(-n // bn2)
        launcher(min(tiles, max(1, sms // CLUSTER)), stream, vals)

    def _prepare(self, cfg: Config, device: int):
        key = (cfg, device)
        hit = self._launchers.get(key)
        if hit is None:
            entry = gluon_cache.lookup(cfg.key)
            metas = entry.meta["tensordesc_meta"]
            sms = driver.sm_count(device)
            hit = (_Launcher(entry.cubin, entry.meta, device), metas, sms)
            self._launchers[key] = hit
        return hit


    def jax_lowering(self, problem, policy, *, portable: bool = False, sm_margin: int = 0):
        """None: no launch of this kernel inside jit yet (its TMA descriptors are encoded on the
        host per call), so jax.jit runs XLA's dot where this kernel would be chosen."""
        return None

    def prebuild(self, arch: str):
        return gluon_entries(arch)


def _plain_epilogue(problem) -> bool:
    ep = getattr(problem, "epilogue", None)
    if ep is None:
        return True
    alpha, beta = getattr(ep, "alpha", 1.0), getattr(ep, "beta", 0.0)
    return alpha == 1.0 and beta == 0.0


KERNEL = GluonMatmulSm90()
KERNELS = (KERNEL,)
