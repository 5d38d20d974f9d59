"""Warp-level tensor-core GEMM (CuTe-DSL, mma.sync m16n8k16): D[l] = A[l] @ B[l] (+ C[l]).

Contract
  dtypes      A, B: float16 or bfloat16 (the same); accumulate float32; D: float16 | bfloat16 |
              float32; C (optional, added when beta == 1): float16 | bfloat16 | float32.
  epilogue    alpha must be 1 and beta 0 or 1 (the instruction-level contract D = A@B + C);
              anything else is declined with a reason (the sm90 kernel or SGEMM takes it).
  majorness   A row (K-major) or col (M-major), B row (N-major) or col (K-major), C and D row or
              col. A column-major D is computed as D^T = B^T A^T so stores stay coalesced.
  alignment   128-bit cp.async: A, B, D base addresses and leading strides 16-byte aligned, and
              the contiguous extent of A, B and D a multiple of 16 bytes (predication works per
              128-bit vector); C needs only element alignment (read one element at a time).
  arch        sm_80 .. sm_90 (mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}); on sm_90 only
              when forced (`xgemm.core.policy.force("cute_mma_sm80")`) or when the sm90 kernel declines.
  limits      M, N, K >= 1; batch dims collapse into one stride (stride 0 = broadcast is fine:
              cp.async has no 16-byte stride rule).
Design
  CTA tile 128x128x32, 4 warps (2x2 atoms of m16n8k16, each atom widened to 16 columns), a
  4-stage cp.async global->shared pipeline, ldmatrix shared->register double buffering,
  swizzled shared layouts, ragged M/N/K by predication (the ragged K tile is loaded first),
  threadblock rasterization for L2, and a shared-memory-staged 128-bit epilogue store.
Adapted from CUTLASS's CuTe-DSL Ampere example (examples/python/CuTeDSL/cute/ampere/kernel/
dense_gemm/tensorop_gemm.py).
"""
# (no `from __future__ import annotations`: the DSL evaluates the device code's annotations)

import functools
import math
from typing import Optional, Tuple

from xgemm.core.dtypes import ITEMSIZE
from xgemm.core.layout import unit_stride_dim
from xgemm.core.problem import ROW, Policy
from xgemm.kernels._common import xla_tensors, xla_views
from xgemm.runtime import cute_cache
from xgemm.runtime.calls import Arg, TvmFfiCall
from xgemm.runtime.cute_cache import arch_number

NAME = "cute_mma_sm80"
_AB_DTYPES = ("float16", "bfloat16")
_OUT_DTYPES = ("float16", "bfloat16", "float32")
_ITEMSIZE = ITEMSIZE
TILE = (128, 128, 32)
ATOMS = (2, 2, 1)
STAGES = 4

def compile_cached(key: Tuple, build_fn):
    """The one call site of the compile cache (memory -> disk -> build)."""
    return cute_cache.cute(key, build_fn)


@functools.lru_cache(maxsize=None)
def _device():
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Int32, const_expr
    from cutlass.memory import SmemAllocator
    from cutlass.tensor_utils import LayoutEnum

    class TensorOpGemm:
        def __init__(self, has_c: bool):
            self.has_c = has_c
            self.cta_tiler = TILE
            self.num_stages = STAGES
            self.atom_layout_mnk = ATOMS
            self.num_threads = math.prod(ATOMS) * 32
            self.bM, self.bN, self.bK = TILE
            self.mma_inst_shape = (16, 8, 16)

        @cute.jit
        def launch(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor,
                   mCin: Optional[cute.Tensor], stream: cuda.CUstream):
            """mA (M, K, L), mB (N, K, L), mC = D (M, N, L), mCin = C (M, N, L) or None."""
            atom_layout_mnk = self.atom_layout_mnk
            # M-major D: compute D^T = B^T A^T so the accumulator rows follow D's contiguous dim.
            if const_expr(LayoutEnum.from_tensor(mC) == LayoutEnum.COL_MAJOR):
                mA, mB = mB, mA
                mC = cute.make_tensor(mC.iterator, cute.select(mC.layout, mode=[1, 0, 2]))
                if const_expr(self.has_c):
                    mCin = cute.make_tensor(mCin.iterator, cute.select(mCin.layout, mode=[1, 0, 2]))
                atom_layout_mnk = (atom_layout_mnk[1], atom_layout_mnk[0], atom_layout_mnk[2])
            self.c_dtype = mC.element_type
            self.a_major_mode = LayoutEnum.from_tensor(mA)
            self.b_major_mode = LayoutEnum.from_tensor(mB)
            self.c_major_mode = LayoutEnum.from_tensor(mC)

            ab_copy_bits = 128
            sA_layout, sA_swizzle = self._make_smem_layout_AB(
                mA.element_type, self.a_major_mode, ab_copy_bits,
                (self.cta_tiler[0], self.cta_tiler[2], self.num_stages))
            sB_layout, sB_swizzle = self._make_smem_layout_AB(
                mB.element_type, self.b_major_mode, ab_copy_bits,
                (self.cta_tiler[1], self.cta_tiler[2], self.num_stages))
            sC_layout = self._make_smem_layout_C(
                mC.element_type, self.c_major_mode, ab_copy_bits,
                (self.cta_tiler[0], self.cta_tiler[1]))

            atom_async_copy = cute.make_copy_atom(
                cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL),
                mA.element_type, num_bits_per_copy=ab_copy_bits)
            tiled_copy_A = self._make_gmem_tiled_copy_AB(
                atom_async_copy, mA.element_type, self.a_major_mode, ab_copy_bits)
            tiled_copy_B = self._make_gmem_tiled_copy_AB(
                atom_async_copy, mB.element_type, self.b_major_mode, ab_copy_bits)
            c_copy_bits = 128
            atom_sync_copy = cute.make_copy_atom(
                cute.nvgpu.CopyUniversalOp(), mC.element_type, num_bits_per_copy=c_copy_bits)
            tiled_copy_C = self._make_gmem_tiled_copy_AB(
                atom_sync_copy, mC.element_type, self.c_major_mode, c_copy_bits, self.bN)

            op = cute.nvgpu.warp.MmaF16BF16Op(mA.element_type, Float32, self.mma_inst_shape)
            # widen each atom to 16 columns so ldmatrix moves 4 matrices at a time
            permutation_mnk = (atom_layout_mnk[0] * self.mma_inst_shape[0],
                               atom_layout_mnk[1] * self.mma_inst_shape[1] * 2,
                               atom_layout_mnk[2] * self.mma_inst_shape[2])
            tiled_mma = cute.make_tiled_mma(op, cute.make_layout(atom_layout_mnk),
                                            permutation_mnk=permutation_mnk)

            grid_dim = cute.ceil_div(mC.shape, (self.bM, self.bN, 1))
            # rasterize in bands of `raster_factor` tile columns for L2 reuse
            raster_factor = 1
            grid_dim_n = cute.size(grid_dim[1])
            if grid_dim_n > 5:
                raster_factor = 8
            elif grid_dim_n > 2:
                raster_factor = 4
            elif grid_dim_n > 1:
                raster_factor = 2
            remap = (cute.size(grid_dim[0]) * raster_factor,
                     (cute.size(grid_dim[1]) + raster_factor - 1) // raster_factor,
                     cute.size(grid_dim[2]))
            self.kernel(mA, mB, mC, mCin, sA_layout, sA_swizzle, sB_layout, sB_swizzle, sC_layout,
                        tiled_copy_A, tiled_copy_B, tiled_copy_C, tiled_mma, raster_factor).launch(
                grid=remap, block=[self.num_threads, 1, 1], stream=stream)

        @cute.kernel
        def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor,
                   mCin: Optional[cute.Tensor], sA_layout: cute.Layout, sA_swizzle: cute.Swizzle,
                   sB_layout: cute.Layout, sB_swizzle: cute.Swizzle, sC_layout: cute.ComposedLayout,
                   tiled_copy_A: cute.TiledCopy, tiled_copy_B: cute.TiledCopy,
                   tiled_copy_C: cute.TiledCopy, tiled_mma: cute.TiledMma,
                   rasterization_factor: Int32):
            tidx, _, _ = cute.arch.thread_idx()
            bidx, bidy, bidz = cute.arch.block_idx()
            grid_dim = cute.ceil_div(mC.shape, (self.bM, self.bN, 1))
            offset_tile_x = bidx // rasterization_factor
            offset_tile_y = (bidx % rasterization_factor) + (bidy * rasterization_factor)
            if grid_dim[0] <= offset_tile_x or grid_dim[1] <= offset_tile_y:
                pass   # a padding CTA of the rasterized grid
            else:
                tiler_coord = (offset_tile_x, offset_tile_y, None)
                gA = cute.local_tile(mA[None, None, bidz], tiler=self.cta_tiler,
                                     coord=tiler_coord, proj=(1, None, 1))
                gB = cute.local_tile(mB[None, None, bidz], tiler=self.cta_tiler,
                                     coord=tiler_coord, proj=(None, 1, 1))
                gC = cute.local_tile(mC[None, None, bidz], tiler=self.cta_tiler,
                                     coord=tiler_coord, proj=(1, 1, None))
                # The ragged K tile goes first: shift gA/gB by the (negative) residue so the
                # mainloop never tests K bounds.
                residual_k = cute.size(mA, mode=[1]) - Int32(self.bK) * cute.size(gA, mode=[2])
                gA = cute.domain_offset((0, residual_k, 0), gA)
                gB = cute.domain_offset((0, residual_k, 0), gB)
                gA = cute.make_tensor(gA.iterator.align(16), gA.layout)
                gB = cute.make_tensor(gB.iterator.align(16), gB.layout)
                mcA = cute.make_identity_tensor(mA.layout.shape)
                mcB = cute.make_identity_tensor(mB.layout.shape)
                cA = cute.local_tile(mcA[None, None, bidz], tiler=self.cta_tiler,
                                     coord=tiler_coord, proj=(1, None, 1))
                cB = cute.local_tile(mcB[None, None, bidz], tiler=self.cta_tiler,
                                     coord=tiler_coord, proj=(None, 1, 1))
                cA = cute.domain_offset((0, residual_k, 0), cA)
                cB = cute.domain_offset((0, residual_k, 0), cB)

                @cute.struct
                class SharedStorageAB:
                    a: cute.struct.Align[
                        cute.struct.MemRange[mA.element_type, cute.cosize(sA_layout)], 16]
                    b: cute.struct.Align[
                        cute.struct.MemRange[mB.element_type, cute.cosize(sB_layout)], 16]

                @cute.struct
                class SharedStorageC:
                    c: cute.struct.Align[
                        cute.struct.MemRange[mC.element_type, cute.cosize(sC_layout)], 16]

                # the epilogue's D tile reuses the A/B buffers
                smem = SmemAllocator()
                storage = smem.allocate(
                    max(SharedStorageAB.size_in_bytes(), SharedStorageC.size_in_bytes()),
                    byte_alignment=16)
                sA = SharedStorageAB(storage).a.get_tensor(sA_layout, swizzle=sA_swizzle)
                sB = SharedStorageAB(storage).b.get_tensor(sB_layout, swizzle=sB_swizzle)
                sC = SharedStorageC(storage).c.get_tensor(sC_layout)

                thr_copy_A = tiled_copy_A.get_slice(tidx)
                thr_copy_B = tiled_copy_B.get_slice(tidx)
                thr_copy_C = tiled_copy_C.get_slice(tidx)
                tAgA = thr_copy_A.partition_S(gA)
                tAsA = thr_copy_A.partition_D(sA)
                tBgB = thr_copy_B.partition_S(gB)
                tBsB = thr_copy_B.partition_D(sB)
                tCsC_epilogue = thr_copy_C.partition_S(sC)
                tCgC_epilogue = thr_copy_C.partition_D(gC)
                tAcA = thr_copy_A.partition_S(cA)
                tBcB = thr_copy_B.partition_S(cB)

                # M/N predicates per 128-bit vector (K is handled by the residue shift)
                tApA = cute.make_rmem_tensor(
                    cute.make_layout((tAgA.shape[0][1], cute.size(tAgA, mode=[1]),
                                      cute.size(tAgA, mode=[2])),
                                     stride=(cute.size(tAgA, mode=[1]), 1, 0)), cutlass.Boolean)
                tBpB = cute.make_rmem_tensor(
                    cute.make_layout((tBsB.shape[0][1], cute.size(tBsB, mode=[1]),
                                      cute.size(tBsB, mode=[2])),
                                     stride=(cute.size(tBsB, mode=[1]), 1, 0)), cutlass.Boolean)
                for rest_v in range(tApA.shape[0]):
                    for m in range(tApA.shape[1]):
                        tApA[rest_v, m, 0] = cute.elem_less(tAcA[(0, rest_v), m, 0, 0][0],
                                                            mA.shape[0])
                for rest_v in range(tBpB.shape[0]):
                    for n in range(tBpB.shape[1]):
                        tBpB[rest_v, n, 0] = cute.elem_less(tBcB[(0, rest_v), n, 0, 0][0],
                                                            mB.shape[0])

                # prologue: zero the stages (predicated-off vectors stay zero), then prefetch
                tAsA.fill(0)
                tBsB.fill(0)
                cute.arch.sync_threads()
                num_smem_stages = cute.size(tAsA, mode=[3])
                k_tile_count = cute.size(tAgA, mode=[3])
                k_tile_index = Int32(0)
                for k in range(tApA.shape[2]):
                    if cute.elem_less(Int32(-1), tAcA[0, 0, k, 0][1]):
                        cute.copy(tiled_copy_A, tAgA[None, None, k, k_tile_index],
                                  tAsA[None, None, k, 0], pred=tApA[None, None, k])
                for k in range(tBpB.shape[2]):
                    if cute.elem_less(Int32(-1), tBcB[0, 0, k, 0][1]):
                        cute.copy(tiled_copy_B, tBgB[None, None, k, k_tile_index],
                                  tBsB[None, None, k, 0], pred=tBpB[None, None, k])
                k_tile_index = k_tile_index + 1
                cute.arch.cp_async_commit_group()
                for k_tile in range(1, num_smem_stages - 1):
                    if k_tile == k_tile_count:
                        tApA.fill(0)
                        tBpB.fill(0)
                    cute.copy(tiled_copy_A, tAgA[None, None, None, k_tile_index],
                              tAsA[None, None, None, k_tile], pred=tApA)
                    cute.copy(tiled_copy_B, tBgB[None, None, None, k_tile_index],
                              tBsB[None, None, None, k_tile], pred=tBpB)
                    k_tile_index = k_tile_index + 1
                    cute.arch.cp_async_commit_group()

                thr_mma = tiled_mma.get_slice(tidx)
                tCsA = thr_mma.partition_A(sA)
                tCsB = thr_mma.partition_B(sB)
                tCsC = thr_mma.partition_C(sC)
                tCgC = thr_mma.partition_C(gC)
                tCrA = tiled_mma.make_fragment_A(tCsA[None, None, None, 0])
                tCrB = tiled_mma.make_fragment_B(tCsB[None, None, None, 0])
                tCrC = tiled_mma.make_fragment_C(tCgC)
                tCrC.fill(0.0)

                atom_copy_s2r_A = cute.make_copy_atom(
                    cute.nvgpu.warp.LdMatrix8x8x16bOp(
                        self.a_major_mode != LayoutEnum.ROW_MAJOR, 4), mA.element_type)
                atom_copy_s2r_B = cute.make_copy_atom(
                    cute.nvgpu.warp.LdMatrix8x8x16bOp(
                        self.b_major_mode != LayoutEnum.ROW_MAJOR, 4), mB.element_type)
                tiled_copy_s2r_A = cute.make_tiled_copy_A(atom_copy_s2r_A, tiled_mma)
                tiled_copy_s2r_B = cute.make_tiled_copy_B(atom_copy_s2r_B, tiled_mma)
                thr_copy_ldmatrix_A = tiled_copy_s2r_A.get_slice(tidx)
                thr_copy_ldmatrix_B = tiled_copy_s2r_B.get_slice(tidx)
                tCsA_copy_view = thr_copy_ldmatrix_A.partition_S(sA)
                tCrA_copy_view = thr_copy_ldmatrix_A.retile(tCrA)
                tCsB_copy_view = thr_copy_ldmatrix_B.partition_S(sB)
                tCrB_copy_view = thr_copy_ldmatrix_B.retile(tCrB)

                smem_pipe_read = 0
                smem_pipe_write = num_smem_stages - 1
                tCsA_p = tCsA_copy_view[None, None, None, smem_pipe_read]
                tCsB_p = tCsB_copy_view[None, None, None, smem_pipe_read]
                num_k_block = cute.size(tCrA, mode=[2])
                if num_k_block > 1:
                    cute.arch.cp_async_wait_group(num_smem_stages - 2)
                    cute.arch.sync_threads()
                    cute.copy(tiled_copy_s2r_A, tCsA_p[None, None, 0], tCrA_copy_view[None, None, 0])
                    cute.copy(tiled_copy_s2r_B, tCsB_p[None, None, 0], tCrB_copy_view[None, None, 0])

                # mainloop: smem pipeline (cp.async, stages-1 tiles in flight) interleaved with a
                # register pipeline (ldmatrix of k-block b+1 while mma.sync runs k-block b)
                for k_tile in range(k_tile_count):
                    for k_block in cutlass.range(num_k_block, unroll_full=True):
                        if k_block == num_k_block - 1:
                            tCsA_p = tCsA_copy_view[None, None, None, smem_pipe_read]
                            tCsB_p = tCsB_copy_view[None, None, None, smem_pipe_read]
                            cute.arch.cp_async_wait_group(num_smem_stages - 2)
                            cute.arch.sync_threads()
                        k_block_next = (k_block + 1) % num_k_block
                        cute.copy(tiled_copy_s2r_A, tCsA_p[None, None, k_block_next],
                                  tCrA_copy_view[None, None, k_block_next])
                        cute.copy(tiled_copy_s2r_B, tCsB_p[None, None, k_block_next],
                                  tCrB_copy_view[None, None, k_block_next])
                        if k_block == 0:
                            if k_tile + num_smem_stages - 1 < k_tile_count:
                                cute.copy(tiled_copy_A, tAgA[None, None, None, k_tile_index],
                                          tAsA[None, None, None, smem_pipe_write], pred=tApA)
                            if k_tile + num_smem_stages - 1 < k_tile_count:
                                cute.copy(tiled_copy_B, tBgB[None, None, None, k_tile_index],
                                          tBsB[None, None, None, smem_pipe_write], pred=tBpB)
                            k_tile_index = k_tile_index + 1
                            cute.arch.cp_async_commit_group()
                            smem_pipe_write = smem_pipe_read
                            smem_pipe_read = smem_pipe_read + 1
                            if smem_pipe_read == num_smem_stages:
                                smem_pipe_read = 0
                        cute.gemm(tiled_mma, tCrC, tCrA[None, None, k_block],
                                  tCrB[None, None, k_block], tCrC)

                cute.arch.cp_async_wait_group(0)
                cute.arch.sync_threads()

                # epilogue: + C (beta == 1), element-wise and bounds-checked in the
                # accumulator's own layout; D via shared memory in 128-bit rows.
                if const_expr(self.has_c):
                    gCin = cute.local_tile(mCin[None, None, bidz], tiler=self.cta_tiler,
                                           coord=tiler_coord, proj=(1, 1, None))
                    tCgCin = thr_mma.partition_C(gCin)
                    mcCin = cute.make_identity_tensor(mC.layout.shape)
                    cCin = cute.local_tile(mcCin[None, None, bidz], tiler=self.cta_tiler,
                                           coord=tiler_coord, proj=(1, 1, None))
                    tCcCin = thr_mma.partition_C(cCin)
                    for i in cutlass.range(cute.size(tCrC), unroll_full=True):
                        crd = tCcCin[i]
                        if cute.elem_less(crd[0], mC.shape[0]):
                            if cute.elem_less(crd[1], mC.shape[1]):
                                tCrC[i] = tCrC[i] + tCgCin[i].to(Float32)
                tCrD = cute.make_fragment_like(tCrC, self.c_dtype)
                tCrD[None] = tCrC.load().to(self.c_dtype)
                cute.autovec_copy(tCrD, tCsC)
                ceilM, ceilN, _ = cute.ceil_div(mC.shape, (self.bM, self.bN, 1))
                mcC = cute.make_identity_tensor((cute.size(ceilM) * self.cta_tiler[0],
                                                 cute.size(ceilN) * self.cta_tiler[1], 1))
                cC = cute.local_tile(mcC[None, None, bidz], tiler=self.cta_tiler,
                                     coord=tiler_coord, proj=(1, 1, None))
                tCcC = thr_copy_C.partition_S(cC)
                tCrC_epilogue = cute.make_fragment_like(tCsC_epilogue)
                cute.arch.sync_threads()
                cute.autovec_copy(tCsC_epilogue, tCrC_epilogue)
                tCpC = cute.make_rmem_tensor(
                    cute.make_layout((tCgC_epilogue.shape[0][1], cute.size(tCgC_epilogue, mode=[1]),
                                      cute.size(tCgC_epilogue, mode=[2])),
                                     stride=(cute.size(tCgC_epilogue, mode=[1]), 1, 0)),
                    cutlass.Boolean)
                for rest_v in range(tCpC.shape[0]):
                    for m in range(tCpC.shape[1]):
                        tCpC[rest_v, m, 0] = cute.elem_less(tCcC[(0, rest_v), m, 0][0],
                                                            mC.shape[0])
                for rest_v in range(tCpC.shape[0]):
                    for n in range(tCpC.shape[2]):
                        if cute.elem_less(tCcC[(0, rest_v), 0, n][1], mC.shape[1]):
                            cute.copy(tiled_copy_C, tCrC_epilogue[None, None, n],
                                      tCgC_epilogue[None, None, n], pred=tCpC[None, None, n])
            return

        def _make_smem_layout_AB(self, dtype, major_mode, copy_bits, smem_tiler):
            major_mode_size = (smem_tiler[1] if major_mode == LayoutEnum.ROW_MAJOR
                               else smem_tiler[0])
            major_mode_size = min(major_mode_size, 128 * 8 // dtype.width)
            swizzle_bits = min(int(math.log2(major_mode_size * dtype.width // copy_bits)), 3)
            base_bits = int(math.log2(copy_bits // 8))
            shift_bits = int(math.log2(copy_bits // dtype.width))
            swizzle = cute.make_swizzle(swizzle_bits, base_bits, shift_bits)
            outer = (cute.make_layout((8, major_mode_size), stride=(major_mode_size, 1))
                     if major_mode == LayoutEnum.ROW_MAJOR
                     else cute.make_layout((major_mode_size, 8), stride=(1, major_mode_size)))
            return cute.tile_to_shape(outer, smem_tiler, (0, 1, 2)), swizzle

        def _make_smem_layout_C(self, dtype, major_mode, copy_bits, smem_tiler):
            major_mode_size = (smem_tiler[1] if major_mode == LayoutEnum.ROW_MAJOR
                               else smem_tiler[0])
            swizzle_bits = min(int(math.log2(major_mode_size * dtype.width // copy_bits)), 3)
            outer = (cute.make_layout((8, major_mode_size), stride=(major_mode_size, 1))
                     if major_mode == LayoutEnum.ROW_MAJOR
                     else cute.make_layout((major_mode_size, 8), stride=(1, major_mode_size)))
            atom = cute.make_composed_layout(cute.make_swizzle(swizzle_bits, 3, 4), 0, outer)
            if major_mode == LayoutEnum.COL_MAJOR:
                atom = cute.make_composed_layout(cute.make_swizzle(0, 3, 4), 0, outer)
            return cute.tile_to_shape(atom, smem_tiler, (0, 1))

        def _make_gmem_tiled_copy_AB(self, atom_copy, dtype, major_mode, copy_bits, row_len=None):
            """Threads along the contiguous dim of a (rows, row_len) tile, 128 bits each."""
            copy_elems = copy_bits // dtype.width
            row_len = self.bK if row_len is None else row_len
            shape_dim_1 = row_len // copy_elems
            thread_layout = cute.make_layout((self.num_threads // shape_dim_1, shape_dim_1),
                                             stride=(shape_dim_1, 1))
            if major_mode != LayoutEnum.ROW_MAJOR:
                shape_dim_0 = self.bM // copy_elems
                thread_layout = cute.make_layout((shape_dim_0, self.num_threads // shape_dim_0),
                                                 stride=(1, shape_dim_0))
            value_layout = (cute.make_layout((1, copy_elems))
                            if major_mode == LayoutEnum.ROW_MAJOR
                            else cute.make_layout((copy_elems, 1)))
            return cute.make_tiled_copy_tv(atom_copy, thread_layout, value_layout)

    def _mk(t, order):
        return cute.make_tensor(t.iterator, cute.select(t.layout, mode=order))

    def _to_mkl(t):      # (L, X, Y) -> (X, Y, L); (X, Y) -> (X, Y, 1)
        if const_expr(cute.rank(t) == 3):
            return _mk(t, [1, 2, 0])
        return cute.make_tensor(t.iterator, cute.make_layout(
            (*t.shape, 1), stride=(*t.layout.stride, 0)))

    def _b_to_nkl(t):    # (L, K, N) -> (N, K, L); (K, N) -> (N, K, 1)
        if const_expr(cute.rank(t) == 3):
            return _mk(t, [2, 1, 0])
        return cute.make_tensor(t.iterator, cute.make_layout(
            (t.shape[1], t.shape[0], 1), stride=(t.layout.stride[1], t.layout.stride[0], 0)))

    @cute.jit
    def gemm_noc(op: cutlass.Constexpr, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor,
                 stream: cuda.CUstream):
        op.launch(_to_mkl(a), _b_to_nkl(b), _to_mkl(d), None, stream)

    @cute.jit
    def gemm_c(op: cutlass.Constexpr, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor,
               c: cute.Tensor, stream: cuda.CUstream):
        op.launch(_to_mkl(a), _b_to_nkl(b), _to_mkl(d), _to_mkl(c), stream)

    return cutlass, cute, TensorOpGemm, gemm_noc, gemm_c


_CUTE_DTYPE = {"float16": "Float16", "bfloat16": "BFloat16", "float32": "Float32"}


def build(ab: str, out: str, a_major: str, b_major: str, d_major: str,
          c: Optional[Tuple[str, str]], batched: bool, arch: str = "sm_90a",
          extra_options: str = ""):
    """cute.compile one kernel class against fake tensors with symbolic shapes and strides.

    Returns the TVM-FFI function f(a, b, d[, c], stream).
    """
    cutlass, cute, TensorOpGemm, gemm_noc, gemm_c = _device()
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    def dt(name):
        return getattr(cutlass, _CUTE_DTYPE[name])

    def fake(dtype: str, rows, cols, major: str, batch, vec: bool):
        """(L, rows, cols) or (rows, cols); `vec`: 128-bit vector alignment is promised."""
        align = 16 // _ITEMSIZE[dtype] if vec else 1
        ld = cute.sym_int64(divisibility=align)
        inner = (ld, 1) if major == ROW else (1, ld)
        base_align = 16 if vec else _ITEMSIZE[dtype]
        if batch is None:
            return make_fake_tensor(dt(dtype), (rows, cols), inner, assumed_align=base_align)
        return make_fake_tensor(dt(dtype), (batch, rows, cols),
                                (cute.sym_int64(divisibility=align), *inner),
                                assumed_align=base_align)

    m, n, k = cute.sym_int(), cute.sym_int(), cute.sym_int()
    l = cute.sym_int() if batched else None
    fa = fake(ab, m, k, a_major, l, True)
    fb = fake(ab, k, n, b_major, l, True)
    fd = fake(out, m, n, d_major, l, True)
    op = TensorOpGemm(c is not None)
    stream = make_fake_stream()
    opts = f"--enable-tvm-ffi --gpu-arch {arch} {extra_options}".strip()
    if c is None:
        return cute.compile(gemm_noc, op, fa, fb, fd, stream, options=opts)
    fc = fake(c[0], m, n, c[1], l, False)
    return cute.compile(gemm_c, op, fa, fb, fd, fc, stream, options=opts)


def _vec_ok(shape, strides, itemsize, ptr) -> Optional[str]:
    """None if 128-bit vectors along the contiguous dim are aligned and never straddle an edge."""
    if ptr % 16:
        return "base address is not 16-byte aligned"
    major = unit_stride_dim(shape, strides)
    if major is None:
        return "neither of the last two dims is contiguous"
    lead = strides[-2] if major == ROW else strides[-1]
    extent = shape[-1] if major == ROW else shape[-2]
    if (lead * itemsize) % 16:
        return f"leading stride {lead} is not a multiple of 16 bytes"
    if (extent * itemsize) % 16:
        return f"contiguous extent {extent} is not a multiple of 16 bytes"
    for d, s in zip(shape[:-2], strides[:-2]):
        if d > 1 and (s * itemsize) % 16:
            return f"batch stride {s} is not a multiple of 16 bytes"
    return None


def _flat_batch(shape, strides) -> Optional[Tuple[int, int]]:
    dims = [(d, s) for d, s in zip(shape[:-2], strides[:-2]) if d != 1]
    if not dims:
        return 1, 0
    for (d0, s0), (d1, s1) in zip(dims, dims[1:]):
        if s0 != s1 * d1:
            return None
    return math.prod(d for d, _ in dims), dims[-1][1]


def _matrix_view(v, L: int, rows: int, cols: int):
    x = v.obj
    nd = len(v.shape)
    if L == 1:
        if nd == 2:
            return x
        return x.reshape(rows, cols) if _flat_batch(v.shape, v.strides) else x[(0,) * (nd - 2)]
    if nd == 3:
        return x
    return x.reshape(L, rows, cols)


class _Sm80Kernel:
    name = NAME
    ops = ("gemm",)
    backend = "cute"

    def supports(self, problem) -> Optional[str]:
        dev = problem.device
        if dev.kind != "cuda":
            return "needs a CUDA device"
        if dev.arch is None or not (8, 0) <= tuple(dev.arch) <= (9, 0):
            return "needs sm_80 .. sm_90 (mma.sync m16n8k16)"
        if problem.a.dtype not in _AB_DTYPES or problem.b.dtype != problem.a.dtype:
            return f"A/B must both be float16 or bfloat16 (got {problem.a.dtype}, {problem.b.dtype})"
        if problem.epilogue.out_dtype not in _OUT_DTYPES:
            return f"output dtype {problem.epilogue.out_dtype} is not float16/bfloat16/float32"
        ep = problem.epilogue
        if ep.alpha != 1.0:
            return f"alpha={ep.alpha:g}: mma.sync path computes D = A@B + C only (alpha must be 1)"
        if ep.reads_c and ep.beta != 1.0:
            return f"beta={ep.beta:g}: mma.sync path adds C with beta 0 or 1 only"
        if min(problem.m, problem.n, problem.k) < 1:
            return "empty problem (M, N or K is 0)"
        if ep.out_alignment < 16:
            return "D (out=) is not 16-byte aligned (128-bit vector stores)"
        for label, op in (("A", problem.a), ("B", problem.b)):
            why = _vec_ok(op.shape, op.strides, _ITEMSIZE[op.dtype], 0)
            if why or op.alignment < 16:
                return f"{label}: {why or 'not 16-byte aligned'} (cp.async moves 128-bit vectors)"
            if _flat_batch(op.shape, op.strides) is None:
                return f"{label}: batch dims do not collapse into one stride"
        if ep.reads_c and problem.c is not None:
            if problem.c.dtype not in _OUT_DTYPES:
                return f"C dtype {problem.c.dtype} is not float16/bfloat16/float32"
            if unit_stride_dim(problem.c.shape, problem.c.strides) is None:
                return "C is strided"
            if _flat_batch(problem.c.shape, problem.c.strides) is None:
                return "C: batch dims do not collapse into one stride"
        if problem.n * _ITEMSIZE[ep.out_dtype] % 16:
            # the API allocates D row-major: its rows must hold whole 128-bit vectors
            return f"N={problem.n}: D rows of {ep.out_dtype} are not a multiple of 16 bytes"
        return None

    def policy(self, problem) -> Policy:
        return Policy(tile=TILE, stages=STAGES, warps=math.prod(ATOMS), raster="n",
                      notes=("mma.sync m16n8k16", "cp.async 4-stage"))

    def spec(self, problem, policy: Policy, operands, out, arch: str, sm_count: int = 0) -> Tuple:
        """The compile class (build()'s arguments) a run of these operands needs."""
        a, b, c = operands
        use_c = problem.epilogue.reads_c and c is not None
        return (a.dtype, out.dtype, unit_stride_dim(a.shape, a.strides), unit_stride_dim(b.shape, b.strides),
                unit_stride_dim(out.shape, out.strides),
                (c.dtype, unit_stride_dim(c.shape, c.strides)) if use_c else None,
                problem.batch_count > 1, arch)

    def run(self, problem, policy: Policy, operands, out, stream) -> None:
        a, b, c = operands
        for v in (a, b, out):
            why = _vec_ok(v.shape, v.strides, v.itemsize, v.ptr)
            if why:
                raise ValueError(f"{NAME}: operand {v.shape} strides {v.strides}: {why}")
        use_c = problem.epilogue.reads_c and c is not None
        spec = self.spec(problem, policy, operands, out, cute_cache.arch_for(problem.device))
        fn = cute_cache.cute_eager(class_key(*spec), functools.partial(build, *spec))
        L, m, n, k = problem.batch_count, problem.m, problem.n, problem.k
        args = [_matrix_view(a, L, m, k), _matrix_view(b, L, k, n), _matrix_view(out, L, m, n)]
        if use_c:
            args.append(_matrix_view(c, L, m, n))
        fn(*args, stream)

    def jax_lowering(self, problem, policy: Policy, *, portable: bool = False, sm_margin: int = 0):
        """The compiled function, called as run() calls it: fn(a, b, d[, c], stream)."""
        if portable:                      # its TVM-FFI handle is process-local
            return None
        a, b, c, out = xla_views(problem)
        fn = compiled(*self.spec(problem, policy, (a, b, c), out, cute_cache.arch_for(problem.device)))
        return TvmFfiCall(fn, xla_tensors(c) + (Arg.stream(),))

    def prebuild(self, arch: str):
        return prebuild_classes(arch)


def class_key(ab: str, out: str, a_major: str, b_major: str, d_major: str,
              c: Optional[Tuple[str, str]], batched: bool, arch: str) -> Tuple:
    """The compile class: everything build() specializes on, and nothing shape-dependent."""
    return (NAME, arch, TILE, STAGES, ab, out, a_major, b_major, d_major, c, batched)


def compiled(*spec):
    """The compiled function for build(*spec) (same arguments as class_key)."""
    return compile_cached(class_key(*spec), functools.partial(build, *spec))


def build_for_key(key: Tuple):
    """The build callable for a class_key (xgemm.runtime.cute_cache.warm compiles keys in worker processes)."""
    assert key[0] == NAME and key[2] == TILE and key[3] == STAGES, key
    return functools.partial(build, *key[4:], key[1])


KERNEL = _Sm80Kernel()
KERNELS = (KERNEL,)


def prebuild_classes(arch: str):
    """(key, build) for the common classes: A, B, D row-major without C, bf16 and fp16,
    unbatched and batched."""
    if arch_number(arch) // 10 not in (8, 9):
        return []
    items = []
    for ab in _AB_DTYPES:
        for batched in (False, True):
            spec = (ab, ab, ROW, ROW, ROW, None, batched, arch)
            items.append((class_key(*spec), functools.partial(build, *spec)))
    return items
