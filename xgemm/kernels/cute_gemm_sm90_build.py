"""cute_gemm_sm90's compiled classes (CuTe-DSL): the device code, build() and the compile-class
machinery (class_key, compiled). The kernel protocol, what the API sees, is cute_gemm_sm90.py.
This file alone names the disk cache of compiled classes (runtime/cute_cache.fingerprint hashes the
file that defines build), so an edit of the protocol or of the policy keeps every compiled class.

Design
  Warp-specialized persistent kernel: warpgroup 0..W-1 run wgmma + the epilogue, the last
  warpgroup is the TMA producer (one warp issues loads). A/B arrive through a multistage
  mbarrier pipeline (PipelineTmaAsync); in a 2x1 / 1x2 cluster the operand shared by the cluster
  is multicast by TMA. Two schedules:
    cooperative  both consumer warpgroups split one tile along M (tile 128xN or 256xN);
    pingpong     each consumer warpgroup owns its own 128xN tile and the two alternate, so one's
                 epilogue overlaps the other's mainloop (ordered by named barriers).
  Cluster tiles are handed out statically (each cluster takes every grid-th one) in swizzled
  bands for L2 reuse, numbered without padding (Sm90Gemm._tile_of).
  Launched with programmatic dependent launch (griddepcontrol), so a GEMM's prologue overlaps
  the previous kernel's tail in the stream.
  The epilogue walks the tile in epi subtiles: acc -> alpha*acc (+ beta*C, C fetched by TMA into
  shared memory ahead of use) -> out dtype -> stmatrix to shared memory -> TMA store. It walks
  them along D's contiguous dimension (along N for a row-major D, down M for a column-major one),
  so each two consecutive 64x32 stores fill the same 128-byte lines (docs/performance.md,
  "xgemm/kernels/cute_gemm_sm90.py": what each order measured).
  alpha == 1 (every matmul) compiles a class of its own whose epilogue skips the multiply, which
  pays where the epilogue is the critical path (short K). A bias / activation class adds, per
  accumulator element, its coordinate in the tile (an identity tensor partitioned like the
  registers), one cached load of the bias and the activation's few instructions.
  A gated class (Epi.gated) computes act(gate) * up of B = [gate | up] (N = 2H): each B tile of
  tile_n columns is gate columns [j * tile_n / 2, (j + 1) * tile_n / 2) and the same up columns, one
  TMA box over B viewed as ((tile_n / 2, 2, H / (tile_n / 2)), K) (the gate / up halves H apart),
  and its epilogue writes a D tile of tile_n / 2 columns from the two halves of the accumulator.
  A policy may run the transposed problem D^T = B^T @ A^T (+ C^T) on the operands' transposed
  views (SWAP_NOTE; what the policy does for row-major A and B on its wave-aware rows).
  Split-K (Config.split, plain products: no C, no Epi): where few output tiles run a long K, each
  tile's k-tiles are cut into `split` equal parts run as separate work units of the persistent
  grid (the last part's k-tiles past K are TMA zero fill), numbered part-major. A part other than
  the last stores its float32 accumulator to a workspace slot in the epilogue's subtile order
  (16-byte vectors) and adds one to its tile's flag (release); the last part waits for the flag to
  count the others (acquire), sets it back to 0, and adds their slots into its accumulator before
  the epilogue, a part at a time (_split_sum: loads in flight without a barrier between them;
  added subtile by subtile inside the epilogue, each subtile waited an L2 round trip per part,
  behind the previous subtile's store barrier). Every wait is on a lower-numbered unit,
  which the all-resident grid reaches first: no cycle. The flags are zero before a launch and
  after it, so launches on one stream share them (runtime/workspace.py; under jit they are a
  zero-filled operand and the workspace XLA scratch). In pingpong the partial stores and loads
  happen in the epilogue's slot, under the other warpgroup's mainloop.
  Grouped (a class of its own, the rows mode of xgemm.grouped_mm / ragged_dot): A (T, K) K-major in
  contiguous row groups, B (E, K, N), D (T, N) row-major, group g the rows [ends[g-1], ends[g]) and
  the rows past ends[E-1] a last group whose tiles store zeros. The persistent grid numbers the
  cluster tiles group after group (ceil(rows / (tile_m x cluster_m)) x cluster columns each, in
  bands of `swizzle` cluster rows that sweep across N, as dense tiles are: with M fastest, a
  tall group re-read its A for every column of tiles; docs/performance.md, session 31); each warp finds a tile's group by scanning the groups 32 at a time from the
  previous tile's (a load of two ends a lane, a prefix sum of tile counts, a ballot), so the
  sizes never leave the device. A is read plainly from the group's first row (a tile's rows past
  the group read the next group's, whose products land in rows the store drops); D is stored
  through a ragged view (quack's copy_utils, after triton/tools/ragged_tma.py): a rank-3 TMA
  tensor whose row coordinate is BIG - rows + r and whose third coordinate first + rows moves the
  base back, so TMA clips the store at the group's last row.
  A 2x1 class folds a group's last cluster row when it holds at most tile_m rows: its cluster tiles
  take one row of tiles over two columns of them (CTA r the column 2p + r), A's tile multicast to
  both CTAs and each CTA's B loaded whole, instead of a 2 x tile_m row whose second half is empty.
  Groups then cost tiles in steps of tile_m rows, as a 1x2 or unclustered class's do, at 2x1's rate
  elsewhere (docs/performance.md, session 32). Both CTAs still write each other's stages, so the
  pipeline's barriers are the same. A grouped class may fuse an activation or a gate (Epi with no
  bias or scales; each group's B is then [gate | up], viewed as the dense gated class views it);
  the rows past the last group get act(0), as composing the activation after the product does.
  Compiled once per class (config x dtypes x majorness x C or not x which operands are batched,
  see class_key); shapes and strides are symbolic (cute.sym_int / sym_int64 with 16-byte
  divisibility), so one compiled object serves every shape of its class.
Adapted from CUTLASS's CuTe-DSL Hopper examples (dense_gemm_persistent.py) and quack's GemmSm90
(pingpong schedule, epilogue C pipeline).
"""
# (no `from __future__ import annotations`: the DSL evaluates the device code's annotations)

import dataclasses
import functools
import math
from typing import Optional, Tuple

from xgemm.core import fp8_checks
from xgemm.core.dtypes import ITEMSIZE
from xgemm.core.epilogues import ACTIVATIONS
from xgemm.core.problem import COL, ROW
from xgemm.kernels.cute_gemm_sm90_policy import Config
from xgemm.runtime import cute_cache


@dataclasses.dataclass(frozen=True)
class Epi:
    """A fused epilogue class, part of the compile class (class_key):
    D = act(acc * scale_m[row] * scale_n[col] + bias[col or row]), in float32.
    scale_m / scale_n: float32 vectors over D's rows / columns (FP8's per-row scales of A and per-
    column scales of B; not with C); bias along "n" (D's columns) or "m" (its rows: the transposed
    run), of bias_dtype; then activation. promote (FP8): each k-tile's wgmma sum is added into a
    float32 register accumulator (an FP8 wgmma keeps ~14 bits of its own running sum), as
    DeepSeek-V3 and CUTLASS's non-fast-accum FP8 kernels do; in a cooperative tile the two
    warpgroups issue each k-tile's wgmmas in turn (two named barriers), so that the tensor cores
    run one warpgroup's batch while the other promotes its sum, as FlashAttention-3 orders its
    warpgroups' GEMMs around their softmax. block (FP8, with promote): the scales are block-wise,
    scale_m (M, K/128) per row of A and 128-deep k-block, scale_n (K/128, N/128) per 128x128
    block of B; the producer's TMA loads a k-tile's scales into its A/B stage, each k-tile's sum
    is multiplied by its two scales as it is promoted, and the epilogue applies none. (Promoting
    mainloops timed and removed: two wgmma accumulators in turn; warpgroup 1 one wgmma batch
    behind warpgroup 0; block scales loaded by the consumers from global memory, or staged
    through a per-thread cp.async ring; docs/performance.md.)"""
    bias: Optional[str] = None
    bias_dtype: Optional[str] = None
    activation: Optional[str] = None
    scale_m: bool = False
    scale_n: bool = False
    gated: bool = False
    promote: bool = False
    block: bool = False

    def check(self) -> None:
        assert self.bias in (None, "n", "m") and (self.bias is None) == (self.bias_dtype is None), self
        assert self.bias_dtype in (None, "float16", "bfloat16", "float32"), self
        assert self.activation in (None,) + ACTIVATIONS, self
        assert self.bias or self.activation or self.scale_m or self.scale_n, f"{self}: an empty epilogue is no class"
        # gated: B holds [gate | up] (N = 2H), D = act(gate + bias[:H]) * (up + bias[H:]), H wide
        assert not self.gated or (self.activation in ("relu", "gelu", "gelu_tanh", "silu") and self.bias != "m"
                                  and not (self.scale_m or self.scale_n)), self
        assert not self.promote or (self.scale_m and self.scale_n and not self.gated), f"{self}: promote is FP8's"
        assert not self.block or (self.promote and self.bias != "m"), f"{self}: block scales are promoted, untransposed"

NAME = "cute_gemm_sm90"
_AB_DTYPES = ("float16", "bfloat16")
_FP8_DTYPES = fp8_checks.FP8_DTYPES
_OUT_DTYPES = ("float16", "bfloat16", "float32")
_ITEMSIZE = ITEMSIZE
SMEM_BYTES = 232448          # sm_90 opt-in shared memory per block (227 KB)
# the grouped class's ragged D view (Design): a row extent no group reaches and the largest third one
RAGGED_BIG, RAGGED_MAX = 2 ** 30, 2 ** 31 - 1


# ----------------------------------------------------------------------------------------------
# Device code (imported only when a CUDA problem reaches this kernel, or a compile-only test)
# ----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _device():
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass import Float16, Float32, Int32, const_expr
    from cutlass.cute.nvgpu import cpasync, warp, warpgroup
    from cutlass.memory import SmemAllocator
    from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait
    from cutlass.tensor_utils import LayoutEnum

    # Named barrier ids; 0 is __syncthreads.
    BAR_EPI, BAR_MMA0, BAR_EPI0 = 1, 2, 4      # BAR_MMA0 + wg, BAR_EPI0 + wg for wg in (0, 1)
    BAR_TURN0 = BAR_MMA0                       # promote's turns, cooperative only: pingpong's ids are free

    def activate(x, activation: str, fast_tanh: bool):
        """core/epilogues.apply for one float32 value, as torch.nn.functional defines it (NaN in,
        NaN out; relu(-inf) = 0). exp2 on the SFU (ex2.approx, ~2 ulp); tanh on the SFU
        (tanh.approx, ~5e-4 relative) only for a bfloat16 D, whose rounding is 8x coarser."""
        if const_expr(activation in ("relu", "relu2")):
            r = cutlass.select_(x < Float32(0.0), Float32(0.0), x)
            return r * r if const_expr(activation == "relu2") else r
        if const_expr(activation == "gelu"):
            return 0.5 * x * (1.0 + cute.math.erf(x * 0.7071067811865476))
        if const_expr(activation == "gelu_tanh"):
            t = cute.math.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x), fastmath=fast_tanh)
            return 0.5 * x * (1.0 + t)
        sig = 1.0 / (1.0 + cute.math.exp2(x * -1.4426950408889634, fastmath=True))
        if const_expr(activation == "silu"):
            return x * sig
        return sig                                        # sigmoid

    class Sm90Gemm:
        def __init__(self, cfg: Config, max_active_clusters: int, has_c: bool, unit_alpha: bool,
                     epi: Optional[Epi] = None, grouped: bool = False):
            cfg.check()
            if epi is not None:
                epi.check()
            self.cfg = cfg
            self.has_c = has_c
            self.unit_alpha = unit_alpha     # alpha == 1: the epilogue does not scale (Design)
            self.bias_mode = epi.bias if epi is not None else None
            self.activation = epi.activation if epi is not None else None
            self.block = epi is not None and epi.block
            # block scales multiply each k-tile's sum in the mainloop; the epilogue applies none
            self.scale_m = epi is not None and epi.scale_m and not self.block
            self.scale_n = epi is not None and epi.scale_n and not self.block
            self.gated = epi is not None and epi.gated
            self.promote = epi is not None and epi.promote
            # a cooperative tile's warpgroups issue their k-tiles' wgmmas in turn (Epi)
            self.turns = self.promote and not cfg.pingpong
            # the epilogue's scale vectors: a tile's values are loaded into registers as its mainloop
            # starts and put in shared memory for its epilogue (_vec_load, _vec_store)
            self.stage_vectors = self.scale_m or self.scale_n
            self.split = cfg.split
            # split-K serves the plain product: C, a fused epilogue's state and promotion stay unsplit
            assert self.split == 1 or (not has_c and epi is None), f"{cfg}: split-K with C or an Epi class"
            assert not (self.gated and (has_c or not unit_alpha)), "gated classes take no C and no alpha"
            # grouped (Design): the plain product of row groups, each tile's group found on the device
            self.grouped = grouped
            # a 2x1 grouped class folds a group's last cluster row of at most tile_m rows (Design)
            self.fold = grouped and (cfg.cluster_m, cfg.cluster_n) == (2, 1)
            # a grouped class fuses an activation, or a gate (its B [gate | up] per group), nothing else
            assert not grouped or (not has_c and self.split == 1 and (epi is None or (
                epi.bias is None and not (epi.scale_m or epi.scale_n or epi.promote)))), \
                "a grouped class is the product, then at most an activation or a gate"
            # D's tile: a gated class writes tile_n / 2 columns per B tile of tile_n
            self.d_tile_n = cfg.tile_n // 2 if self.gated else cfg.tile_n
            # the scales multiply the product only: alpha * acc + beta * C would scale C too
            assert not (has_c and (self.scale_m or self.scale_n)), "scale vectors with C"
            self.epi_ops = epi is not None
            self.max_active_clusters = max_active_clusters
            self.pingpong = cfg.pingpong
            self.cluster_shape_mnk = (cfg.cluster_m, cfg.cluster_n, 1)
            self.tile_shape_mnk = (cfg.tile_m, cfg.tile_n, 64)
            # cooperative: 2 warpgroups split M; pingpong: 1 warpgroup per tile, 2 tiles in flight
            self.atom_layout_mnk = (1, 1, 1) if cfg.pingpong else (2, 1, 1)
            self.mma_warp_groups = 2
            self.threads_per_cta = (self.mma_warp_groups + 1) * 128
            self.load_warp_id = self.mma_warp_groups * 4
            self.num_epi_threads = 128 if cfg.pingpong else 256
            self.mma_threads_per_tile = 128 if cfg.pingpong else 256
            acc_regs = cfg.tile_m * cfg.tile_n // (128 * math.prod(self.atom_layout_mnk))
            # a promoting class holds a second accumulator as large as the first: up to 96 registers
            # a thread each (cooperative 128x192), 192 of the 232 a consumer thread gets
            assert not self.promote or acc_regs <= 96, f"{cfg}: {acc_regs} accumulator registers a thread, twice"
            # a k-tile's B scales: one value where the tile lies in one 128-column block, two for a
            # 192-wide tile (its first block and its last; which one its middle 64 columns take
            # depends on the tile's parity)
            assert not self.block or 128 % cfg.tile_n == 0 or cfg.tile_n == 192, \
                f"{cfg}: tile_n {cfg.tile_n} crosses B's scale blocks"
            self.b_boxes = 2 if self.block and cfg.tile_n == 192 else 1
            # setmaxnreg budgets: 2 x 128 x mma + 128 x load <= 64K registers
            self.regs_load, self.regs_mma = (24, 240) if acc_regs >= 208 else (40, 232)
            self.num_mcast_a = cfg.cluster_n      # A tile is shared by the CTAs along N
            self.num_mcast_b = cfg.cluster_m      # B tile is shared by the CTAs along M
            # epilogue subtile: 64 rows per warpgroup, 32 columns
            self.epi_tile = (64 if cfg.pingpong else 128, 32)

        # -------------------------------------------------------------------- host-side setup
        def _stages(self, d_dtype, c_dtype):
            tm, tn, tk = self.tile_shape_mnk
            epi_elems = self.epi_tile[0] * self.epi_tile[1]
            epi_tiles = tm * tn // epi_elems
            epi_stage = min(epi_tiles, 2)
            c_stage = min(epi_tiles, 4) if c_dtype is not None else 0
            d_bytes = epi_elems * d_dtype.width // 8
            c_bytes = epi_elems * c_dtype.width // 8 if c_dtype is not None else 0
            ab_bytes = (tm * self.a_dtype.width + tn * self.b_dtype.width) * tk // 8 + self.scale_room
            reserve = 1024 + 1024 + self.vec_elems * 4       # mbarriers, alignment padding, sVec
            room = SMEM_BYTES - reserve - epi_stage * d_bytes - c_stage * c_bytes
            ab_stage = room // ab_bytes
            if self.cfg.stages:
                ab_stage = min(ab_stage, self.cfg.stages)
            ab_stage = min(ab_stage, 8)
            left = room - ab_stage * ab_bytes
            epi_stage = min(epi_stage + left // d_bytes, max(epi_tiles, 2), 4)
            assert ab_stage >= 2, f"shared memory holds only {ab_stage} A/B stages"
            return ab_stage, epi_stage, c_stage

        @cute.jit
        def launch(self, mA: cute.Tensor, mB: cute.Tensor, mD: cute.Tensor,
                   mC: Optional[cute.Tensor], mBias: Optional[cute.Tensor], mScaleM: Optional[cute.Tensor],
                   mScaleN: Optional[cute.Tensor], mWork: Optional[cute.Tensor], mFlags: Optional[cute.Tensor],
                   mEnds: Optional[cute.Tensor], alpha: Float32, beta: Float32, stream: cuda.CUstream):
            """mA (M, K, L), mB (N, K, L), mD / mC (M, N, L), in CuTe's GEMM order; mBias (N,) or
            (M,) by Epi.bias; mScaleM (M,), mScaleN (N,) float32 (Epi), or with Epi.block mScaleM
            (M, K/128) M-major and mScaleN (N/128, K/128) N/128-major (TMA-loaded). Split-K (cfg.split > 1): mWork, bytes holding float32,
            at least (split - 1) x tile_m x tile_n of them per CTA tile of the grid (workspace_sizes), and mFlags,
            int32, one per CTA tile, zero before the launch and zero again after it. Grouped: mA (T, K, 1),
            mB (N, K, E), mD (T, N, 1) row-major, mEnds (E,) int32 the groups' end rows (Design)."""
            self.a_dtype = mA.element_type
            self.b_dtype = mB.element_type
            if const_expr(self.gated):
                mB = self._gated_view(mB)
            self.d_dtype = mD.element_type
            self.c_dtype = mC.element_type if const_expr(self.has_c) else None
            self.a_layout = LayoutEnum.from_tensor(mA)
            self.b_layout = LayoutEnum.from_tensor(mB)
            self.d_layout = LayoutEnum.from_tensor(mD)
            self.c_layout = LayoutEnum.from_tensor(mC) if const_expr(self.has_c) else None
            # the epilogue walks a tile's subtiles along D's contiguous dimension, so that
            # consecutive TMA stores fill the same 128-byte lines (module docstring, Design)
            self.epi_walk_m = self.d_layout.is_m_major_c()

            self.tiled_mma = sm90_utils.make_trivial_tiled_mma(
                self.a_dtype, self.b_dtype,
                self.a_layout.sm90_mma_major_mode(), self.b_layout.sm90_mma_major_mode(),
                Float32, self.atom_layout_mnk, tiler_mn=(64, self.tile_shape_mnk[1]))
            # K tile: 4 MMA K steps, 128 bytes of a row (64 for 16-bit types, 128 for FP8)
            self.tile_shape_mnk = (*self.tile_shape_mnk[:2], cute.size(self.tiled_mma.shape_mnk, mode=[2]) * 4)
            # block scales: each accumulator register's row among the thread's rows (_register_rows),
            # and the scales a k-tile takes: A's of each of those rows, then B's
            self.reg_row, self.scale_rows = self._register_rows(self.tiled_mma) if self.block else (None, None)
            # B's scale of each register: its 64-column segment of the tile (0 where one block serves)
            self.reg_seg = self._register_segments(self.tiled_mma) if self.b_boxes == 2 else None
            # A's of each row, then B's: the one block's, or the first's, the middle's and the last's
            self.scale_values = len(self.scale_rows) + (3 if self.b_boxes == 2 else 1) if self.block else 0
            # block scales: a stage also holds A's scales of the tile's rows and a 16-byte box of
            # B's (four 128-column blocks from the tile's one, the smallest box TMA loads), two boxes
            # (the first block's and the last's) for a 192-wide tile; each box starts 128-byte
            # aligned, as TMA's shared-memory destination must
            self.scale_bytes = (self.tile_shape_mnk[0] + 4 * self.b_boxes) * 4 if self.block else 0
            self.scale_room = (self.tile_shape_mnk[0] + 32 * self.b_boxes) * 4 if self.block else 0
            # sVec: the tile's scale_m values (its rows), then its scale_n values (its columns), each
            # a whole number of slots of one value an epilogue thread
            per = self.num_epi_threads
            self.vec_slots = (-(-self.tile_shape_mnk[0] // per) if self.scale_m else 0,
                              -(-self.d_tile_n // per) if self.scale_n else 0)
            self.vec_m = self.vec_slots[0] * per
            self.vec_elems = sum(self.vec_slots) * per
            self.ab_stage, self.epi_stage, self.c_stage = self._stages(self.d_dtype, self.c_dtype)
            self.cluster_layout_mnk = cute.make_layout(self.cluster_shape_mnk)

            a_smem_staged = sm90_utils.make_smem_layout_a(
                self.a_layout, self.tile_shape_mnk, self.a_dtype, self.ab_stage)
            b_smem_staged = sm90_utils.make_smem_layout_b(
                self.b_layout, self.tile_shape_mnk, self.b_dtype, self.ab_stage)
            d_smem_staged = sm90_utils.make_smem_layout_epi(
                self.d_dtype, self.d_layout, self.epi_tile, self.epi_stage)
            c_smem_staged = None
            if const_expr(self.has_c):
                c_smem_staged = sm90_utils.make_smem_layout_epi(
                    self.c_dtype, self.c_layout, self.epi_tile, self.c_stage)

            a_smem = cute.slice_(a_smem_staged, (None, None, 0))
            b_smem = cute.slice_(b_smem_staged, (None, None, 0))
            tma_atom_a, tma_a = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp() if const_expr(self.num_mcast_a == 1)
                else cpasync.CopyBulkTensorTileG2SMulticastOp(),
                mA, a_smem, (self.tile_shape_mnk[0], self.tile_shape_mnk[2]),
                num_multicast=self.num_mcast_a)
            tma_atom_b, tma_b = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp() if const_expr(self.num_mcast_b == 1)
                else cpasync.CopyBulkTensorTileG2SMulticastOp(),
                mB, b_smem, (self.tile_shape_mnk[1], self.tile_shape_mnk[2]),
                num_multicast=self.num_mcast_b)
            # a folded tile row's operands (Design): A multicast over the cluster's two CTAs along M,
            # each CTA's B whole; a stage's bytes are the same
            tma_atom_af, tma_af, tma_atom_bf, tma_bf = None, None, None, None
            if const_expr(self.fold):
                tma_atom_af, tma_af = cpasync.make_tiled_tma_atom(
                    cpasync.CopyBulkTensorTileG2SMulticastOp(), mA, a_smem,
                    (self.tile_shape_mnk[0], self.tile_shape_mnk[2]), num_multicast=2)
                tma_atom_bf, tma_bf = cpasync.make_tiled_tma_atom(
                    cpasync.CopyBulkTensorTileG2SOp(), mB, b_smem,
                    (self.tile_shape_mnk[1], self.tile_shape_mnk[2]), num_multicast=1)
            self.tma_bytes = cute.size_in_bytes(self.a_dtype, a_smem) + cute.size_in_bytes(
                self.b_dtype, b_smem) + self.scale_bytes
            tma_atom_sa, tma_atom_sb = None, None
            if const_expr(self.block):
                # mScaleM (M, K/128) M-major, mScaleN (N/128, K/128) with N/128 contiguous
                tm = self.tile_shape_mnk[0]
                tma_atom_sa, mScaleM = cpasync.make_tiled_tma_atom(
                    cpasync.CopyBulkTensorTileG2SOp(), mScaleM, cute.make_layout((tm, 1)), (tm, 1))
                tma_atom_sb, mScaleN = cpasync.make_tiled_tma_atom(
                    cpasync.CopyBulkTensorTileG2SOp(), mScaleN, cute.make_layout((4, 1)), (4, 1))
            tiles_m = (mD.shape[0] + self.tile_shape_mnk[0] - 1) // self.tile_shape_mnk[0]
            tiles_n = (mD.shape[1] + self.d_tile_n - 1) // self.d_tile_n
            if const_expr(self.grouped):
                # each group adds at most one part-filled cluster row (the rows past the last group too)
                block = self.tile_shape_mnk[0] * self.cfg.cluster_m
                tiles_m = (mD.shape[0] + (mB.shape[2] + 1) * (block - 1)) // block * self.cfg.cluster_m
                mD = self._ragged_view(mD)
            tma_atom_d, tma_d = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), mD,
                cute.slice_(d_smem_staged, (None, None, 0)), self.epi_tile)
            tma_atom_c, tma_c = None, None
            self.c_bytes = 0
            if const_expr(self.has_c):
                c_smem = cute.slice_(c_smem_staged, (None, None, 0))
                tma_atom_c, tma_c = cpasync.make_tiled_tma_atom(
                    cpasync.CopyBulkTensorTileG2SOp(), mC, c_smem, self.epi_tile)
                self.c_bytes = cute.size_in_bytes(self.c_dtype, c_smem)

            # persistent grid: one cluster per (max active) cluster slot, cluster tiles strided
            # over it (see _tile_of)
            cluster_tiles = ((tiles_m + self.cfg.cluster_m - 1) // self.cfg.cluster_m
                             * ((tiles_n + self.cfg.cluster_n - 1) // self.cfg.cluster_n)
                             * (1 if const_expr(self.grouped) else mD.shape[2]))
            grid = (self.cfg.cluster_m, self.cfg.cluster_n,
                    cutlass.min(cluster_tiles * self.split, self.max_active_clusters))

            c_elems = cute.cosize(c_smem_staged) if const_expr(self.has_c) else 0
            scale_elems = ((self.tile_shape_mnk[0] * self.ab_stage, 32 * self.b_boxes * self.ab_stage)
                           if const_expr(self.block) else (0, 0))
            c_type = self.c_dtype if const_expr(self.has_c) else Float32

            @cute.struct
            class SharedStorage:
                ab_mbar: cute.struct.MemRange[cutlass.Int64, self.ab_stage * 2]
                c_mbar: cute.struct.MemRange[cutlass.Int64, max(self.c_stage, 1) * 2]
                sD: cute.struct.Align[
                    cute.struct.MemRange[self.d_dtype, cute.cosize(d_smem_staged)], 1024]
                sC: cute.struct.Align[cute.struct.MemRange[c_type, c_elems], 1024]
                sA: cute.struct.Align[
                    cute.struct.MemRange[self.a_dtype, cute.cosize(a_smem_staged)], 1024]
                sB: cute.struct.Align[
                    cute.struct.MemRange[self.b_dtype, cute.cosize(b_smem_staged)], 1024]
                sSA: cute.struct.Align[cute.struct.MemRange[Float32, scale_elems[0]], 128]
                sSB: cute.struct.Align[cute.struct.MemRange[Float32, scale_elems[1]], 128]
                sVec: cute.struct.Align[cute.struct.MemRange[Float32, self.vec_elems], 16]

            self.shared_storage = SharedStorage
            self.kernel(self.tiled_mma, tma_atom_a, tma_a, tma_atom_b, tma_b, tma_atom_d, tma_d,
                        tma_atom_c, tma_c, mBias, tma_atom_sa, mScaleM, tma_atom_sb, mScaleN, mWork, mFlags, mEnds,
                        tma_atom_af, tma_af, tma_atom_bf, tma_bf, alpha, beta,
                        self.cluster_layout_mnk,
                        a_smem_staged,
                        b_smem_staged, d_smem_staged, c_smem_staged).launch(
                grid=grid, block=[self.threads_per_cta, 1, 1], cluster=self.cluster_shape_mnk,
                min_blocks_per_mp=1, stream=stream, use_pdl=True)

        def _gated_view(self, mB):
            """B (2H, K, L) = [gate | up] seen as ((tile_n / 2, 2, H / (tile_n / 2)), K, L): a tile of
            tile_n along the first mode is tile_n / 2 gate columns and the same up columns."""
            half = self.cfg.tile_n // 2
            h = mB.shape[0] // 2
            s_n, s_k, s_l = mB.layout.stride
            return cute.make_tensor(mB.iterator, cute.make_layout(
                ((half, 2, h // half), mB.shape[1], mB.shape[2]),
                stride=((s_n, s_n * h, s_n * half), s_k, s_l)))

        def _ragged_view(self, mD):
            """D (T, N, 1) as the grouped class stores it (Design): (RAGGED_BIG, N, RAGGED_MAX) with the
            rows' stride on the first and third modes and the base RAGGED_BIG rows back, so that
            element (RAGGED_BIG - rows + r, n, first + rows) is D[first + r, n] and TMA clips r >= rows.
            The base lies outside D: only stores use it (a load's base must be mapped memory)."""
            s_r, s_n, _ = mD.layout.stride
            base = cute.domain_offset((-RAGGED_BIG, 0, 0), mD).iterator
            return cute.make_tensor(base, cute.make_layout((RAGGED_BIG, mD.shape[1], RAGGED_MAX), stride=(s_r, s_n, s_r)))

        def _tma_split(self, atom, rank, ctas, s, g):
            """TMA partition of a staged shared-memory tile and its global tiles: the slice that this
            CTA, `rank` of the `ctas` CTAs sharing the tile by multicast, loads."""
            return cpasync.tma_partition(atom, rank, cute.make_layout(ctas), cute.group_modes(s, 0, 2),
                                         cute.group_modes(g, 0, 2))

        def _tma_stage(self, loads, k, index, bar):
            """A pipeline stage's TMA loads: (atom, global tiles, shared stages, multicast mask) each."""
            for atom, g, s, mask in loads:
                cute.copy(atom, g[(None, k)], s[(None, index)], tma_bar_ptr=bar, mcast_mask=mask)

        def _group_rows(self, mA, first):
            """The grouped class's A tiles (bM, bK, RestM, RestK, 1) from a group's first row."""
            return cute.local_tile(cute.domain_offset((first, 0, 0), mA),
                                   cute.slice_(self.tile_shape_mnk, (None, 0, None)), (None, None, None))

        def _group_window(self, mEnds, g, gdims):
            """Lane i's group g + i: its first row, its rows and its cluster tiles (0 past the last
            group; group E is the rows after ends[E-1], whose tiles store zeros). Ends are clamped
            to [0, T] and a group starts where the previous one ends (a decreasing end: no rows)."""
            rows_total, cols = gdims
            groups = mEnds.shape[0]
            gi = g + cute.arch.lane_idx()
            first = cutlass.select_(gi > 0, cutlass.min(cutlass.max(
                mEnds[cutlass.min(cutlass.max(gi - 1, 0), groups - 1)], 0), rows_total), 0)
            end = cutlass.select_(gi < groups, cutlass.min(cutlass.max(
                mEnds[cutlass.min(gi, groups - 1)], 0), rows_total), rows_total)
            rows = cutlass.select_(gi <= groups, cutlass.max(end - first, 0), 0)
            blocks_m, folded = self._cluster_rows(rows)
            return first, rows, blocks_m * cols + folded * ((cols + 1) // 2)

        def _cluster_rows(self, rows):
            """A group's full-width cluster rows of tiles, and 1 where its last cluster row is folded
            (a 2x1 class whose last cluster row has at most tile_m rows: the two CTAs take one row of
            tiles over two columns of them, Design), else 0."""
            tm = self.tile_shape_mnk[0]
            block = tm * self.cluster_shape_mnk[0]
            blocks_m = (rows + block - 1) // block
            if const_expr(not self.fold):
                return blocks_m, 0
            folded = cutlass.select_((rows > 0) & (rows - (blocks_m - 1) * block <= tm), 1, 0)
            return blocks_m - folded, folded

        @cute.jit
        def _group_tile_of(self, work, gstate, mEnds, gdims):
            """The grouped class's _tile_of: ((m, n, group) of this CTA's tile, valid, the state for
            the next call). gstate = (g, tiles before g, g's first row, g's rows): the search starts at
            the previous tile's group, since a warp's work indices only grow (Design)."""
            g, start, first, rows = gstate
            groups = mEnds.shape[0]
            lane = cute.arch.lane_idx()
            searching = Int32(1)
            while searching == 1:
                lo, n_rows, tiles = self._group_window(mEnds, g, gdims)
                incl = tiles
                for i in cutlass.range_constexpr(5):          # inclusive prefix sum over the warp
                    up = cute.arch.shuffle_sync_up(incl, offset=1 << i, mask_and_clamp=0)
                    incl = incl + cutlass.select_(lane >= (1 << i), up, 0)
                # the groups ending at or before `work` (a prefix of the lanes; none past group E)
                passed = cute.arch.popc(cute.arch.vote_ballot_sync((start + incl <= work) & (g + lane <= groups)))
                if passed < 32:
                    searching = Int32(0)
                    start = start + cute.arch.shuffle_sync(incl - tiles, passed)
                    first = cute.arch.shuffle_sync(lo, passed)
                    rows = cute.arch.shuffle_sync(n_rows, passed)
                    g = g + passed
                else:
                    start = start + cute.arch.shuffle_sync(incl, 31)
                    g = g + 32
            blocks_m, _ = self._cluster_rows(rows)
            # within the group, bands of `swizzle` cluster rows sweep across N (the last band
            # narrower), as _tile_of's: M fastest over a tall group re-read its A for every column
            G = self.cfg.swizzle
            local = work - start
            band_tiles = G * gdims[1]
            band = local // band_tiles
            in_band = local - band * band_tiles
            width = cutlass.max(cutlass.min(blocks_m - band * G, G), 1)
            cm, cn = self.cluster_shape_mnk[0], self.cluster_shape_mnk[1]
            bidx, bidy, _ = cute.arch.block_idx()
            m = (band * G + in_band % width) * cm + bidx % cm
            n = (in_band // width) * cn + bidy % cn
            if const_expr(self.fold):
                # past the full-width rows: the folded row, a pair of tile columns per cluster tile
                pair = local - blocks_m * gdims[1]
                m = cutlass.select_(pair >= 0, blocks_m * cm, m)
                n = cutlass.select_(pair >= 0, pair * cm + bidx % cm, n)
            return (m, n, cutlass.min(g, groups - 1)), g <= groups, (g, start, first, rows)

        def _next_tile(self, work, sched, gstate, mEnds):
            """(tile, valid, gstate) of work index `work`: _tile_of, or the grouped class's search
            (sched is then (T, cluster columns))."""
            if const_expr(self.grouped):
                return self._group_tile_of(work, gstate, mEnds, sched)
            tc, valid = self._tile_of(work, sched)
            return tc, valid, gstate

        def _schedule(self, gD_mnl):
            """What _tile_of needs, computed once per thread before the tile loops: the cluster-
            tile count and the runtime divisors as FastDivmod (a multiply and a shift per use; a
            32-bit division by a runtime value is ~25 instructions with a reciprocal, and every
            consumer warp runs _tile_of once per tile, on the path to its next mainloop)."""
            G = self.cfg.swizzle
            cm, cn = self.cluster_shape_mnk[0], self.cluster_shape_mnk[1]
            ncm = (cute.size(gD_mnl, mode=[2]) + cm - 1) // cm
            ncn = (cute.size(gD_mnl, mode=[3]) + cn - 1) // cn
            per_batch = ncm * ncn
            total = per_batch * cute.size(gD_mnl, mode=[4])
            n_fast, n_slow = (ncn, ncm) if const_expr(self.cfg.raster_m) else (ncm, ncn)
            per_batch_d = cute.fast_divmod_create_divisor_v2(per_batch)
            # split-K numbers its units part-major (_split_of): the tile count divides them
            parts = (cute.fast_divmod_create_divisor_v2(total),) if const_expr(self.split > 1) else ()
            if const_expr(G == 1):
                return (total, per_batch_d, cute.fast_divmod_create_divisor_v2(n_slow), None, None) + parts
            last_band = (n_fast - 1) // G                 # bands of G along fast; the last narrower
            last_width_d = cute.fast_divmod_create_divisor_v2(n_fast - last_band * G)
            return (total, per_batch_d, cute.fast_divmod_create_divisor_v2(G * n_slow), last_width_d,
                    last_band) + parts

        def _tile_of(self, work, sched):
            """(m, n, l) tile of this CTA for cluster work index `work`, and whether it exists.

            Cluster tiles are numbered in bands of `swizzle` clusters along the fast dimension
            (M when raster_m is off: a band of A rows sweeps across N; N when it is on), the
            last band as wide as what is left. cutlass's PersistentTileSchedulerParams rounds
            the fast dimension up to whole bands instead and runs the padding as real (empty)
            tiles: 7 of 24 cluster rows at M = 4224 with bands of 8.
            """
            G = self.cfg.swizzle
            cm, cn = self.cluster_shape_mnk[0], self.cluster_shape_mnk[1]
            total, per_batch_d, slow_or_band_d, last_width_d, last_band = sched[:5]
            if const_expr(self.split > 1):
                part, work = divmod(work, sched[5])         # part-major units (_split_of)
                valid = part < self.split
            else:
                valid = work < total
            l, r = divmod(work, per_batch_d)
            if const_expr(G == 1):
                fast, slow = divmod(r, slow_or_band_d)
            else:
                band, in_band = divmod(r, slow_or_band_d)
                slow_full = in_band // G                    # a full band: G wide
                slow_last, within_last = divmod(in_band, last_width_d)
                is_last = band == last_band
                slow = Int32(cutlass.select_(is_last, slow_last, slow_full))
                within = Int32(cutlass.select_(is_last, within_last, in_band - slow_full * G))
                fast = band * G + within
            c_m, c_n = (slow, fast) if const_expr(self.cfg.raster_m) else (fast, slow)
            bidx, bidy, _ = cute.arch.block_idx()
            return (c_m * cm + bidx % cm, c_n * cn + bidy % cn, l), valid

        def _split_of(self, work, k_per, sched):
            """Split-K: (this unit's part of its tile, the tile's index, the part's first k-tile).
            Units are numbered part-major (all tiles' part 0, then part 1, ...), so a tile's last
            part, which sums the others (_split_wait), has its highest number and mostly runs a
            wave after them: a unit waits only on units numbered below it, which every CTA of the
            persistent grid (all resident) reaches first, so the waits cannot form a cycle. Each
            part is k_per k-tiles; the last part's k-tiles past K are TMA's zero fill. The tile's
            index counts CTA tiles (its cluster tile, then the CTA's rank in the cluster)."""
            part, cluster_tile = divmod(work, sched[5])
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
            return part, cluster_tile * (self.cfg.cluster_m * self.cfg.cluster_n) + rank, part * k_per

        def _acc_first(self, epi_idx, epi_tiles_mn, acc_tiles_n, size_rD):
            """The first of epilogue subtile epi_idx's size_rD accumulator fragments (tRS_rAcc): the
            subtiles are walked along D's contiguous dimension (Design), fragment (m, n) of the tile
            is the (m * N/epi_n + n)-th size_rD (a trace-time int)."""
            if self.epi_walk_m:
                return ((epi_idx % epi_tiles_mn[0]) * acc_tiles_n + epi_idx // epi_tiles_mn[0]) * size_rD
            return (epi_idx // epi_tiles_mn[1] * acc_tiles_n + epi_idx % epi_tiles_mn[1]) * size_rD

        def _work_vec(self, mWork, slot, group, thread):
            """The 16-byte vector `group` of this thread in a split-K workspace slot: (slot, group,
            thread, 4), so a warp's vectors of one group are 512 contiguous bytes; a slot holds a
            tile's float32 accumulator in the epilogue's order (groups of 4 of its subtiles' values)."""
            threads = self.mma_threads_per_tile
            slot_groups = self.tile_shape_mnk[0] * self.tile_shape_mnk[1] // (4 * threads)
            base = cute.assume(((slot * slot_groups + group) * threads + thread) * 4, divby=4)
            return cute.make_tensor(cute.recast_ptr(mWork.iterator, dtype=Float32) + base, cute.make_layout(4))

        @cute.jit
        def _split_store(self, tRS_rAcc, acc_firsts, size_rD, mWork, mFlags, tile, part, thread, barrier):
            """Split-K, a part other than the last: its accumulator into its workspace slot, in the
            order the last part's epilogue reads it (acc_firsts: each subtile's first fragment),
            then one more part counted in the tile's flag (release, after every thread's stores)."""
            vec = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128)
            quad = cute.make_rmem_tensor((4,), Float32)
            slot = tile * (self.split - 1) + part
            for e in cutlass.range_constexpr(len(acc_firsts)):
                for g in cutlass.range_constexpr(size_rD // 4):
                    for j in cutlass.range_constexpr(4):
                        quad[j] = tRS_rAcc[acc_firsts[e] + 4 * g + j]
                    cute.copy(vec, quad, self._work_vec(mWork, slot, e * (size_rD // 4) + g, thread))
            barrier.arrive_and_wait()
            if thread == 0:
                cute.arch.atomic_add(mFlags.iterator + tile, Int32(1), sem="release", scope="gpu")

        @cute.jit
        def _split_wait(self, mFlags, tile, thread, barrier):
            """Split-K, the last part: wait until the tile's flag counts every other part (acquire),
            set it back to 0 for the next launch; the epilogue then adds their slots (_split_add)."""
            if thread == 0:
                flag = mFlags.iterator + tile
                seen = cute.arch.load(flag, Int32, sem="acquire", scope="gpu")
                while seen != self.split - 1:
                    seen = cute.arch.load(flag, Int32, sem="acquire", scope="gpu")
                cute.arch.store(flag, Int32(0), sem="relaxed", scope="gpu")
            barrier.arrive_and_wait()

        @cute.jit
        def _split_sum(self, tRS_rAcc, acc_firsts, size_rD, mWork, tile, thread):
            """Split-K, the last part: every other part's slot added into the accumulator, in the
            order _split_store wrote it, before the epilogue (Design). A part's 16-byte loads issue
            together, each feeding its four adds; the parts run as a loop, not unrolled, so that
            ptxas cannot hoist the next parts' loads over the adds (unrolled, it held them all
            and spilled 151 registers at 128x192 split 4)."""
            vec = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128)
            quad = cute.make_rmem_tensor((4,), Float32)
            for p in cutlass.range(self.split - 1, unroll=1):
                for e in cutlass.range_constexpr(len(acc_firsts)):
                    for g in cutlass.range_constexpr(size_rD // 4):
                        cute.copy(vec, self._work_vec(mWork, tile * (self.split - 1) + p, e * (size_rD // 4) + g,
                                                      thread), quad)
                        for j in cutlass.range_constexpr(4):
                            tRS_rAcc[acc_firsts[e] + 4 * g + j] += quad[j]

        def _per_register(self, tiled_mma, what, of):
            """[of(coordinate) of each accumulator register], at trace time, where it is the same
            for every thread: checked on a thread of each bit of the thread index (all 256: 12 s a
            class)."""
            ident = cute.make_identity_tensor(self.tile_shape_mnk[:2])

            def values(t):
                c = tiled_mma.get_slice(t).partition_C(ident)
                return [of(c[v], c[0]) for v in range(cute.size(c))]
            out = values(0)
            n = self.mma_threads_per_tile
            for t in [2 ** b for b in range(n.bit_length() - 1)] + [n - 1]:
                assert values(t) == out, f"thread {t}: accumulator {what} {values(t)} are not {out}"
            return out

        def _register_rows(self, tiled_mma):
            """(row of each accumulator register, distinct rows), relative to a thread's first row:
            the wgmma C layout gives every thread the same offsets (two rows, 8 apart), so a thread
            loads one A scale per row it holds, not one per register."""
            offs = self._per_register(tiled_mma, "rows", lambda c, first: c[0] - first[0])
            rows = sorted(set(offs))
            return [rows.index(o) for o in offs], rows

        def _register_segments(self, tiled_mma):
            """The 64-column segment of the tile that each accumulator register lies in: a thread's
            columns lie 0-7 past thread 0's, which are multiples of 8."""
            return self._per_register(tiled_mma, "segments", lambda c, first: c[1] // 64)

        def _load_b_scales(self, tma_atom_sb, tSBg, tSBs, tc, k_tile, stage, bar):
            """The box of B's scales (four blocks) that holds the block of the tile's first column,
            and for a 192-wide tile also the one of its last column, into the stage's slots."""
            for box, col in enumerate((0, self.tile_shape_mnk[1] - 1)[:self.b_boxes]):
                blk = (tc[1] * self.tile_shape_mnk[1] + col) // 128
                cute.copy(tma_atom_sb, tSBg[(None, blk // 4, k_tile)], tSBs[(None, self.b_boxes * stage + box)],
                          tma_bar_ptr=bar)

        def _promote_scaled(self, acc_main, acc, scales):
            """acc_main += acc * (A's scale of the register's row * B's scale of its block): one FFMA
            a register."""
            rows = len(self.scale_rows)
            b_values = self.scale_values - rows
            prod = [[scales[i] * scales[rows + j] for j in range(b_values)] for i in range(rows)]
            for v, row in enumerate(self.reg_row):  # a Python loop: unrolled as the kernel is traced
                seg = self.reg_seg[v] if const_expr(self.b_boxes == 2) else 0
                acc_main[v] = acc_main[v] + acc[v] * prod[row][seg]

        def _read_block_scales(self, sSA, sSB, stage, tCcAcc, tc, out):
            """out = (A's scale of each of the thread's rows, B's scale, or for a 192-wide tile B's
            of its first, middle and last 64 columns) of the k-block in `stage`
            (the producer's TMA put them there with A and B), read after the stage's wgmmas are
            issued and before it is released. (Loaded by the consumers from global memory, the
            scales arrived after the wgmmas ended: docs/performance.md.)"""
            rows = len(self.scale_rows)
            for i, r in enumerate(self.scale_rows):
                out[i] = sSA[(tCcAcc[0][0] + r, 0, stage)]
            tn = self.tile_shape_mnk[1]
            if const_expr(self.b_boxes == 1):
                out[rows] = sSB[((tc[1] * tn // 128) % 4, 0, stage)]
            else:
                # 192 wide: columns 0-63 lie in the first block, 128-191 in the last, 64-127 in the
                # first where the tile starts on a block (even tiles), else in the last
                first = sSB[((tc[1] * tn // 128) % 4, 0, 2 * stage)]
                last = sSB[(((tc[1] * tn + tn - 1) // 128) % 4, 0, 2 * stage + 1)]
                out[rows] = first
                out[rows + 1] = Float32(cutlass.select_(tc[1] % 2 == 0, first, last))
                out[rows + 2] = last

        def _vec_load(self, mScaleM, mScaleN, tc, thread):
            """This thread's share of the tile's scale values, loaded into registers as its mainloop
            starts so that their latency passes under it (_vec_store puts them in sVec). Slot j of the
            rows holds row j * threads + thread, its index clamped to the vector (TMA drops the rows
            past D's edge). Read in the epilogue, each register's value was a global load serialized
            by the subtiles' barriers: the cooperative FP8 classes ran 4-6% slower (docs/performance.md)."""
            per = self.num_epi_threads
            rows = [mScaleM[cutlass.min(tc[0] * self.tile_shape_mnk[0] + thread + j * per, mScaleM.shape[0] - 1)]
                    for j in range(self.vec_slots[0])]
            cols = [mScaleN[cutlass.min(tc[1] * self.d_tile_n + thread + j * per, mScaleN.shape[0] - 1)]
                    for j in range(self.vec_slots[1])]
            return rows + cols

        def _vec_store(self, sVec, vals, thread, barrier):
            """The values of _vec_load into sVec for the tile's epilogue. The previous tile's last
            reads of sVec came before its epilogue's last barrier (pingpong: before the hand-over)."""
            for j, v in enumerate(vals):
                sVec[thread + j * self.num_epi_threads] = v.to(Float32)
            barrier.arrive_and_wait()

        def _epilogue_ops(self, tRS_rD, tRS_cD, vectors, tc, epi_idx, epi_tiles_mn, size_rD, up=None):
            """* the scales, + bias, then the activation (gated: times the up half's value, up =
            (accumulator fragments, first index)), on one epilogue subtile's float32 registers (Epi;
            traced inline: epi_idx, epi_tiles_mn and size_rD are Python ints)."""
            mBias, sVec = vectors
            if const_expr(self.epi_walk_m):
                sub_m, sub_n = epi_idx % epi_tiles_mn[0], epi_idx // epi_tiles_mn[0]
            else:
                sub_m, sub_n = epi_idx // epi_tiles_mn[1], epi_idx % epi_tiles_mn[1]
            row0 = tc[0] * self.tile_shape_mnk[0] + sub_m * self.epi_tile[0]
            col0 = tc[1] * self.d_tile_n + sub_n * self.epi_tile[1]

            def at(vec, i):
                # registers past D's edge hold values TMA never stores: clamp their index
                return vec[cutlass.min(i, vec.shape[0] - 1)].to(Float32)

            for v in range(size_rD):            # a Python loop: unrolled as the kernel is traced
                x = tRS_rD[v]
                coord = tRS_cD[v]
                if const_expr(self.scale_m):
                    x = x * sVec[sub_m * self.epi_tile[0] + coord[0]]
                if const_expr(self.scale_n):
                    x = x * sVec[self.vec_m + sub_n * self.epi_tile[1] + coord[1]]
                if const_expr(self.bias_mode == "n"):
                    x = x + at(mBias, col0 + coord[1])
                if const_expr(self.bias_mode == "m"):
                    x = x + at(mBias, row0 + coord[0])
                if const_expr(self.activation is not None):
                    x = activate(x, self.activation, self.d_dtype.width == 16 and self.d_dtype != Float16)
                if const_expr(self.gated):
                    u = up[0][up[1] + v]
                    if const_expr(self.bias_mode == "n"):
                        u = u + at(mBias, mBias.shape[0] // 2 + col0 + coord[1])
                    x = x * u
                tRS_rD[v] = x

        # ----------------------------------------------------------------------- the kernel
        @cute.kernel
        def kernel(self, tiled_mma: cute.TiledMma, tma_atom_a: cute.CopyAtom, mA_mkl: cute.Tensor,
                   tma_atom_b: cute.CopyAtom, mB_nkl: cute.Tensor, tma_atom_d: cute.CopyAtom,
                   mD_mnl: cute.Tensor, tma_atom_c: Optional[cute.CopyAtom],
                   mC_mnl: Optional[cute.Tensor], mBias: Optional[cute.Tensor], tma_atom_sa: Optional[cute.CopyAtom],
                   mScaleM: Optional[cute.Tensor], tma_atom_sb: Optional[cute.CopyAtom],
                   mScaleN: Optional[cute.Tensor], mWork: Optional[cute.Tensor],
                   mFlags: Optional[cute.Tensor], mEnds: Optional[cute.Tensor],
                   tma_atom_af: Optional[cute.CopyAtom], mAf_mkl: Optional[cute.Tensor],
                   tma_atom_bf: Optional[cute.CopyAtom], mBf_nkl: Optional[cute.Tensor], alpha: Float32, beta: Float32,
                   cluster_layout_mnk: cute.Layout, a_smem_staged: cute.ComposedLayout,
                   b_smem_staged: cute.ComposedLayout, d_smem_staged: cute.ComposedLayout,
                   c_smem_staged: Optional[cute.ComposedLayout]):
            tidx, _, _ = cute.arch.thread_idx()
            warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            if warp_idx == self.load_warp_id:
                cpasync.prefetch_descriptor(tma_atom_a)
                cpasync.prefetch_descriptor(tma_atom_b)
                cpasync.prefetch_descriptor(tma_atom_d)
                if const_expr(self.has_c):
                    cpasync.prefetch_descriptor(tma_atom_c)
                if const_expr(self.block):
                    cpasync.prefetch_descriptor(tma_atom_sa)
                    cpasync.prefetch_descriptor(tma_atom_sb)
                if const_expr(self.fold):
                    cpasync.prefetch_descriptor(tma_atom_af)
                    cpasync.prefetch_descriptor(tma_atom_bf)

            cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
            cluster_coord = cluster_layout_mnk.get_flat_coord(cta_rank)
            a_mcast_mask = cute.make_layout_image_mask(cluster_layout_mnk, cluster_coord, mode=1)
            b_mcast_mask = cute.make_layout_image_mask(cluster_layout_mnk, cluster_coord, mode=0)
            a_mcast_mask = a_mcast_mask if const_expr(self.num_mcast_a > 1) else 0
            b_mcast_mask = b_mcast_mask if const_expr(self.num_mcast_b > 1) else 0

            smem = SmemAllocator()
            storage = smem.allocate(self.shared_storage)

            # A/B pipeline: full = TMA bytes landed; empty = one arrive per consumer warp from
            # every CTA whose multicast writes into this CTA's buffers.
            mcast_size = self.num_mcast_a + self.num_mcast_b - 1
            ab_pipeline = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.ab_mbar.data_ptr(), num_stages=self.ab_stage,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
                consumer_group=pipeline.CooperativeGroup(
                    pipeline.Agent.Thread, mcast_size * self.mma_threads_per_tile // 32),
                tx_count=self.tma_bytes,
                cta_layout_vmnk=cute.make_layout((1, *cluster_layout_mnk.shape)),
                defer_sync=True)
            c_pipeline = None
            if const_expr(self.has_c):
                # C subtiles: the epilogue's first warp issues TMA loads ahead of use; every
                # epilogue warp releases a stage after reading it.
                c_pipeline = pipeline.PipelineTmaAsync.create(
                    barrier_storage=storage.c_mbar.data_ptr(), num_stages=self.c_stage,
                    producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
                    consumer_group=pipeline.CooperativeGroup(
                        pipeline.Agent.Thread, self.num_epi_threads // 32),
                    tx_count=self.c_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
                    defer_sync=True)
            pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mnk[:2], is_relaxed=True)

            sA = storage.sA.get_tensor(a_smem_staged.outer, swizzle=a_smem_staged.inner)
            sB = storage.sB.get_tensor(b_smem_staged.outer, swizzle=b_smem_staged.inner)
            sD = storage.sD.get_tensor(d_smem_staged.outer, swizzle=d_smem_staged.inner)
            sC = None
            if const_expr(self.has_c):
                sC = storage.sC.get_tensor(c_smem_staged.outer, swizzle=c_smem_staged.inner)

            # (bM, bK, RestM, RestK, L), (bN, bK, RestN, RestK, L), (bM, bN, RestM, RestN, L)
            gA_mkl = cute.local_tile(mA_mkl, cute.slice_(self.tile_shape_mnk, (None, 0, None)),
                                     (None, None, None))
            gB_nkl = cute.local_tile(mB_nkl, cute.slice_(self.tile_shape_mnk, (0, None, None)),
                                     (None, None, None))
            gD_mnl = None
            if const_expr(not self.grouped):
                gD_mnl = cute.local_tile(mD_mnl, (self.tile_shape_mnk[0], self.d_tile_n), (None, None, None))
            gC_mnl = None
            if const_expr(self.has_c):
                gC_mnl = cute.local_tile(mC_mnl, cute.slice_(self.tile_shape_mnk, (None, None, 0)),
                                         (None, None, None))
            a_ctas = cute.slice_(cluster_layout_mnk, (0, None, 0)).shape      # the CTAs sharing an A tile
            tAsA, tAgA = self._tma_split(tma_atom_a, cluster_coord[1], a_ctas, sA, gA_mkl)
            tBsB, tBgB = self._tma_split(tma_atom_b, cluster_coord[0],
                                         cute.slice_(cluster_layout_mnk, (None, 0, 0)).shape, sB, gB_nkl)
            tAsAf, tBsBf, tBgBf = None, None, None
            if const_expr(self.fold):
                tAsAf, _ = self._tma_split(tma_atom_af, cluster_coord[0], 2, sA, gA_mkl)
                tBsBf, tBgBf = self._tma_split(tma_atom_bf, 0, 1, sB, cute.local_tile(
                    mBf_nkl, cute.slice_(self.tile_shape_mnk, (0, None, None)), (None, None, None)))
            tSAs, tSAg, tSBs, tSBg, sSA, sSB = None, None, None, None, None, None
            if const_expr(self.block):
                sSA = storage.sSA.get_tensor(cute.make_layout((self.tile_shape_mnk[0], 1, self.ab_stage)))
                sSB = storage.sSB.get_tensor(cute.make_layout((4, 1, self.b_boxes * self.ab_stage), stride=(1, 4, 32)))
                # (tile_m, 1, RestM, K/128), (4, 1, RestN/4, K/128)
                gSA = cute.local_tile(mScaleM, (self.tile_shape_mnk[0], 1), (None, None))
                gSB = cute.local_tile(mScaleN, (4, 1), (None, None))
                tSAs, tSAg = cpasync.tma_partition(tma_atom_sa, 0, cute.make_layout(1),
                                                   cute.group_modes(sSA, 0, 2), cute.group_modes(gSA, 0, 2))
                tSBs, tSBg = cpasync.tma_partition(tma_atom_sb, 0, cute.make_layout(1),
                                                   cute.group_modes(sSB, 0, 2), cute.group_modes(gSB, 0, 2))
            k_tile_cnt = cute.size(gA_mkl, mode=[3])
            # k-tiles a work unit runs: all of K, or one split-K part of it (_split_of)
            k_per = k_tile_cnt
            if const_expr(self.split > 1):
                k_per = (k_tile_cnt + self.split - 1) // self.split
            # grouped: (T, cluster columns) for the search, and its state (g, tiles before g, first row, rows)
            gstate = (Int32(0), Int32(0), Int32(0), Int32(0))
            if const_expr(self.grouped):
                cols = (mD_mnl.shape[1] + self.d_tile_n * self.cfg.cluster_n - 1) // (self.d_tile_n * self.cfg.cluster_n)
                sched = (mA_mkl.shape[0], cols)
            else:
                sched = self._schedule(gD_mnl)

            pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mnk[:2])
            # Programmatic dependent launch: everything above (barrier init, descriptor
            # prefetch) may overlap the previous kernel's tail; no global memory is touched
            # before the previous grid has finished and flushed.
            cute.arch.griddepcontrol_wait()

            # ------------------------------------------------------------ producer warpgroup
            if warp_idx >= self.load_warp_id:
                cute.arch.setmaxregister_decrease(self.regs_load)
                if warp_idx == self.load_warp_id:
                    work = cute.arch.block_idx()[2]
                    tc, valid, gstate = self._next_tile(work, sched, gstate, mEnds)
                    prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                        self.ab_stage)
                    while valid:
                        if const_expr(self.grouped):
                            # the group's A starts at its first row (Design); tile tc[0] of it
                            _, tAgA_g = self._tma_split(tma_atom_a, cluster_coord[1], a_ctas, sA,
                                                        self._group_rows(mA_mkl, gstate[2]))
                            tAgA_k = tAgA_g[(None, tc[0], None, 0)]
                        else:
                            tAgA_k = tAgA[(None, tc[0], None, tc[2])]
                        tBgB_k = tBgB[(None, tc[1], None, tc[2])]
                        folded = False
                        tAgAf_k, tBgBf_k = None, None             # the folded row's, where the class folds
                        if const_expr(self.fold):
                            # a folded row: the cluster row's rows fit one tile (_group_tile_of)
                            folded = gstate[3] - tc[0] // 2 * 2 * self.tile_shape_mnk[0] <= self.tile_shape_mnk[0]
                            _, tAgAf_g = self._tma_split(tma_atom_af, cluster_coord[0], 2, sA,
                                                         self._group_rows(mAf_mkl, gstate[2]))
                            tAgAf_k = tAgAf_g[(None, tc[0], None, 0)]
                            tBgBf_k = tBgBf[(None, tc[1], None, tc[2])]
                        k_first = 0
                        if const_expr(self.split > 1):
                            _, _, k_first = self._split_of(work, k_per, sched)
                        for k_tile in cutlass.range(k_per, unroll=1):
                            ab_pipeline.producer_acquire(prod)
                            bar = ab_pipeline.producer_get_barrier(prod)
                            k_at = k_first + k_tile
                            loads = ((tma_atom_a, tAgA_k, tAsA, a_mcast_mask), (tma_atom_b, tBgB_k, tBsB, b_mcast_mask))
                            if const_expr(self.fold):
                                if folded:
                                    # A's half to both CTAs of the cluster (the mask of the CTAs along M)
                                    self._tma_stage(((tma_atom_af, tAgAf_k, tAsAf, b_mcast_mask),
                                                     (tma_atom_bf, tBgBf_k, tBsBf, 0)), k_at, prod.index, bar)
                                else:
                                    self._tma_stage(loads, k_at, prod.index, bar)
                            else:
                                self._tma_stage(loads, k_at, prod.index, bar)
                            if const_expr(self.block):
                                cute.copy(tma_atom_sa, tSAg[(None, tc[0], k_first + k_tile)], tSAs[(None, prod.index)],
                                          tma_bar_ptr=bar)
                                self._load_b_scales(tma_atom_sb, tSBg, tSBs, tc, k_first + k_tile, prod.index, bar)
                            ab_pipeline.producer_commit(prod)
                            prod.advance()
                        work += cute.arch.grid_dim()[2]
                        tc, valid, gstate = self._next_tile(work, sched, gstate, mEnds)
                    ab_pipeline.producer_tail(prod)

            # ------------------------------------------------------------ consumer warpgroups
            if warp_idx < self.load_warp_id:
                cute.arch.setmaxregister_increase(self.regs_mma)
                wg_idx = cute.arch.make_warp_uniform(tidx // 128)
                mma_slice = 0 if const_expr(self.pingpong) else wg_idx * 128
                epi_tidx = tidx % 128 if const_expr(self.pingpong) else tidx
                is_tma_warp = warp_idx % 4 == 0 if const_expr(self.pingpong) else warp_idx == 0
                thr_mma = tiled_mma.get_slice(mma_slice)
                tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
                tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
                acc = cute.make_rmem_tensor(
                    thr_mma.partition_shape_C(self.tile_shape_mnk[:2]), Float32)
                acc_main = None
                if const_expr(self.promote):
                    acc_main = cute.make_rmem_tensor(
                        thr_mma.partition_shape_C(self.tile_shape_mnk[:2]), Float32)
                # block scales: each accumulator register's (m, n) in the tile; the scales of the
                # k-tile being promoted (A's per row the thread holds, then B's)
                tCcAcc = None
                k_scales = None
                if const_expr(self.block):
                    # this thread's registers: thr_mma is the warpgroup's slice (A and B are shared by
                    # its 128 threads), whose C partition would give every thread thread 0's rows
                    tCcAcc = tiled_mma.get_slice(epi_tidx).partition_C(
                        cute.make_identity_tensor(self.tile_shape_mnk[:2]))
                    k_scales = cute.make_rmem_tensor((self.scale_values,), Float32)
                num_k_blocks = cute.size(tCrA, mode=[2])
                sVec = storage.sVec.get_tensor(cute.make_layout(self.vec_elems)) if const_expr(self.stage_vectors) else None

                # epilogue partitions: registers -> smem (stmatrix / st.shared), smem -> registers
                copy_atom_c = cute.make_copy_atom(
                    warp.StMatrix8x8x16bOp(self.d_layout.is_m_major_c(), 4), Float16)
                tiled_copy_c_atom = cute.make_tiled_copy_C_atom(copy_atom_c, tiled_mma)
                tiled_copy_r2s = cute.make_tiled_copy_S(
                    sm90_utils.get_smem_store_op(self.d_layout, self.d_dtype, Float32),
                    tiled_copy_c_atom)
                thr_copy_r2s = tiled_copy_r2s.get_slice(epi_tidx)
                tRS_sD = thr_copy_r2s.partition_D(sD)
                tRS_rAcc = tiled_copy_r2s.retile(acc)
                rD_shape = cute.shape(thr_copy_r2s.partition_S(sD))
                tRS_rD = cute.make_rmem_tensor(rD_shape[:3], Float32)
                tRS_rD_out = cute.make_rmem_tensor(rD_shape[:3], self.d_dtype)
                size_rD = cute.size(tRS_rD)
                # each register's (m, n) in its epilogue subtile: the bias index (Epi)
                tRS_cD = None
                if const_expr(self.epi_ops):
                    tRS_cD = thr_copy_r2s.partition_S(cute.make_identity_tensor(self.epi_tile))
                tiled_copy_s2r = None
                tSR_sC = None
                tRS_rC = None
                tSR_rC = None
                if const_expr(self.has_c):
                    if const_expr(self.c_dtype.width == 16):
                        s2r_atom = cute.make_copy_atom(
                            warp.LdMatrix8x8x16bOp(self.c_layout.is_m_major_c(), 4), self.c_dtype)
                    else:
                        s2r_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.c_dtype)
                    tiled_copy_s2r = cute.make_tiled_copy_S(s2r_atom, tiled_copy_c_atom)
                    thr_copy_s2r = tiled_copy_s2r.get_slice(epi_tidx)
                    tSR_sC = thr_copy_s2r.partition_S(sC)
                    tRS_rC = cute.make_rmem_tensor(tRS_rD.layout, self.c_dtype)
                    tSR_rC = thr_copy_s2r.retile(tRS_rC)

                epi_barrier = pipeline.NamedBarrier(barrier_id=BAR_EPI,
                                                    num_threads=self.num_epi_threads)
                store_pipeline = pipeline.PipelineTmaStore.create(
                    num_stages=self.epi_stage,
                    producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                             self.num_epi_threads))
                epi_tiles_mn = (self.tile_shape_mnk[0] // self.epi_tile[0],
                                self.d_tile_n // self.epi_tile[1])
                acc_tiles_n = self.tile_shape_mnk[1] // self.epi_tile[1]     # = epi_tiles_mn[1] unless gated
                epi_tile_num = epi_tiles_mn[0] * epi_tiles_mn[1]
                # subtile i of the walk; the accumulator fragments of subtile (m, n) are the
                # (m * N/epi_n + n)-th size_rD of tRS_rAcc
                epi_tile_layout = cute.make_layout(
                    epi_tiles_mn, stride=(1, epi_tiles_mn[0]) if const_expr(self.epi_walk_m)
                    else (epi_tiles_mn[1], 1))

                work = cute.arch.block_idx()[2]
                work_stride = cute.arch.grid_dim()[2]
                tiles_done = Int32(0)        # by this warpgroup (pingpong) or CTA: epilogue buffers
                ab_read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                       self.ab_stage)
                c_read = None
                c_write = None
                if const_expr(self.has_c):
                    c_read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                          self.c_stage)
                    c_write = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                           self.c_stage)
                if const_expr(self.pingpong):
                    if wg_idx == 0:
                        # warpgroup 0 starts first in both the mainloop and the epilogue order
                        cute.arch.barrier_arrive(barrier_id=BAR_MMA0, number_of_threads=256)
                        cute.arch.barrier_arrive(barrier_id=BAR_EPI0, number_of_threads=256)
                    else:
                        # warpgroup 1 takes every other tile: skip warpgroup 0's first one
                        ab_read.advance(k_per)
                        if const_expr(self.has_c):
                            c_read.advance(epi_tile_num)
                            c_write.advance(epi_tile_num)
                        work += work_stride
                if const_expr(self.turns):
                    if wg_idx == 1:
                        # warpgroup 0 issues the first k-tile's wgmmas (Epi: promote)
                        cute.arch.barrier_arrive(barrier_id=BAR_TURN0, number_of_threads=256)
                tc, valid, gstate = self._next_tile(work, sched, gstate, mEnds)

                while valid:
                    if const_expr(self.pingpong):
                        cute.arch.barrier(barrier_id=BAR_MMA0 + wg_idx, number_of_threads=256)
                    # ---------------------------------------------------------- mainloop
                    ab_release = ab_read.clone()
                    vec_vals = self._vec_load(mScaleM, mScaleN, tc, epi_tidx) if const_expr(self.stage_vectors) else None
                    if const_expr(self.cfg.zero_init):
                        tiled_mma.set(warpgroup.Field.ACCUMULATE, False)   # k-tile 0 overwrites
                    else:
                        acc.fill(0.0)
                        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
                    warpgroup.fence()
                    # first k-tile: issue, keep one wgmma batch in flight from here on
                    ab_pipeline.consumer_wait(ab_read)
                    if const_expr(self.turns):
                        cute.arch.barrier(barrier_id=BAR_TURN0 + wg_idx, number_of_threads=256)
                    for kb in cutlass.range_constexpr(num_k_blocks):
                        cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, ab_read.index)],
                                  tCrB[(None, None, kb, ab_read.index)], acc)
                        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
                    warpgroup.commit_group()
                    if const_expr(self.turns):
                        cute.arch.barrier_arrive(barrier_id=BAR_TURN0 + 1 - wg_idx, number_of_threads=256)
                    if const_expr(self.block):
                        self._read_block_scales(sSA, sSB, ab_read.index, tCcAcc, tc, k_scales)
                    ab_read.advance()
                    if const_expr(self.promote):
                        # every k-tile's sum goes into float32 registers: wait for it, add it,
                        # and let the next k-tile's first wgmma overwrite the accumulator
                        acc_main.fill(0.0)
                        for k_tile in cutlass.range(1, k_tile_cnt, unroll=1):
                            ab_pipeline.consumer_wait(ab_read)
                            warpgroup.wait_group(0)
                            ab_pipeline.consumer_release(ab_release)
                            ab_release.advance()
                            if const_expr(self.block):
                                self._promote_scaled(acc_main, acc, k_scales)
                            else:
                                acc_main.store(acc_main.load() + acc.load())
                            tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
                            if const_expr(self.turns):
                                # the other warpgroup's batch went in after ours: ours follows it
                                cute.arch.barrier(barrier_id=BAR_TURN0 + wg_idx, number_of_threads=256)
                            warpgroup.fence()
                            for kb in cutlass.range_constexpr(num_k_blocks):
                                cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, ab_read.index)],
                                          tCrB[(None, None, kb, ab_read.index)], acc)
                                tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
                            warpgroup.commit_group()
                            if const_expr(self.turns):
                                cute.arch.barrier_arrive(barrier_id=BAR_TURN0 + 1 - wg_idx, number_of_threads=256)
                            if const_expr(self.block):
                                self._read_block_scales(sSA, sSB, ab_read.index, tCcAcc, tc, k_scales)
                            ab_read.advance()
                    else:
                        for k_tile in cutlass.range(1, k_per, unroll=1):
                            ab_pipeline.consumer_wait(ab_read)
                            for kb in cutlass.range_constexpr(num_k_blocks):
                                cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, ab_read.index)],
                                          tCrB[(None, None, kb, ab_read.index)], acc)
                            warpgroup.commit_group()
                            warpgroup.wait_group(1)       # the previous k-tile's wgmmas are done
                            ab_pipeline.consumer_release(ab_release)
                            ab_release.advance()
                            ab_read.advance()
                    if const_expr(self.pingpong):
                        # the other warpgroup may start issuing its mainloop now
                        cute.arch.barrier_arrive(barrier_id=BAR_MMA0 + 1 - wg_idx,
                                                 number_of_threads=256)
                    warpgroup.wait_group(0)
                    ab_pipeline.consumer_release(ab_release)
                    ab_release.advance()
                    if const_expr(self.block):
                        self._promote_scaled(acc_main, acc, k_scales)
                        acc.store(acc_main.load())                    # the epilogue reads acc
                    elif const_expr(self.promote):
                        acc.store(acc.load() + acc_main.load())    # the epilogue reads acc
                    if const_expr(self.grouped):
                        if gstate[0] == mEnds.shape[0]:
                            acc.fill(0.0)              # the rows past the last group are zeros

                    # ---------------------------------------------------------- epilogue
                    if const_expr(self.pingpong):
                        cute.arch.barrier(barrier_id=BAR_EPI0 + wg_idx, number_of_threads=256)
                    if const_expr(self.stage_vectors):
                        self._vec_store(sVec, vec_vals, epi_tidx, epi_barrier)
                    writes_d = True
                    split_tile = None
                    if const_expr(self.split > 1):
                        part, split_tile, _ = self._split_of(work, k_per, sched)
                        writes_d = part == self.split - 1
                        acc_firsts = [self._acc_first(e, epi_tiles_mn, acc_tiles_n, size_rD) for e in range(epi_tile_num)]
                        if writes_d:
                            self._split_wait(mFlags, split_tile, epi_tidx, epi_barrier)
                            self._split_sum(tRS_rAcc, acc_firsts, size_rD, mWork, split_tile, epi_tidx)
                        else:
                            self._split_store(tRS_rAcc, acc_firsts, size_rD, mWork, mFlags, split_tile, part, epi_tidx,
                                              epi_barrier)
                    if writes_d:
                        if const_expr(self.grouped):
                            # the ragged view at the group's rows: stores past its last row are clipped
                            mD_g = cute.domain_offset((RAGGED_BIG - gstate[3], 0),
                                                      mD_mnl[(None, None, gstate[2] + gstate[3])])
                            gD = cute.local_tile(mD_g, (self.tile_shape_mnk[0], self.d_tile_n), (tc[0], tc[1]))
                        else:
                            gD = gD_mnl[(None, None, *tc)]
                        bSG_sD, bSG_gD = cpasync.tma_partition(
                            tma_atom_d, 0, cute.make_layout(1), cute.group_modes(sD, 0, 2),
                            cute.zipped_divide(gD, self.epi_tile))
                        bGS_sC = None
                        bGS_gC = None
                        if const_expr(self.has_c):
                            gC = gC_mnl[(None, None, *tc)]
                            bGS_sC, bGS_gC = cpasync.tma_partition(
                                tma_atom_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2),
                                cute.zipped_divide(gC, self.epi_tile))
                            for i in cutlass.range_constexpr(min(self.c_stage, epi_tile_num)):
                                if is_tma_warp:
                                    c_pipeline.producer_acquire(c_write)
                                    cute.copy(tma_atom_c,
                                              bGS_gC[(None, epi_tile_layout.get_hier_coord(i))],
                                              bGS_sC[(None, c_write.index)],
                                              tma_bar_ptr=c_pipeline.producer_get_barrier(c_write))
                                    c_pipeline.producer_commit(c_write)
                                c_write.advance()
                        num_prev = tiles_done * epi_tile_num
                        for epi_idx in cutlass.range_constexpr(epi_tile_num):
                            acc_first = self._acc_first(epi_idx, epi_tiles_mn, acc_tiles_n, size_rD)
                            for v in cutlass.range_constexpr(size_rD):
                                tRS_rD[v] = tRS_rAcc[acc_first + v]
                            if const_expr(self.has_c):
                                c_pipeline.consumer_wait(c_read)
                                cute.copy(tiled_copy_s2r, tSR_sC[(None, None, None, c_read.index)],
                                          tSR_rC)
                                # generic-proxy reads must be ordered before the TMA refill
                                cute.arch.fence_view_async_shared()
                                cute.arch.sync_warp()
                                c_pipeline.consumer_release(c_read)
                                c_read.advance()
                                if const_expr(epi_idx + self.c_stage < epi_tile_num):
                                    if is_tma_warp:
                                        c_pipeline.producer_acquire(c_write)
                                        cute.copy(tma_atom_c,
                                                  bGS_gC[(None, epi_tile_layout.get_hier_coord(
                                                      epi_idx + self.c_stage))],
                                                  bGS_sC[(None, c_write.index)],
                                                  tma_bar_ptr=c_pipeline.producer_get_barrier(c_write))
                                        c_pipeline.producer_commit(c_write)
                                    c_write.advance()
                                if const_expr(self.unit_alpha):
                                    tRS_rD.store(tRS_rD.load() + tRS_rC.load().to(Float32) * beta)
                                else:
                                    tRS_rD.store(tRS_rD.load() * alpha
                                                 + tRS_rC.load().to(Float32) * beta)
                            elif const_expr(not self.unit_alpha):
                                tRS_rD.store(tRS_rD.load() * alpha)
                            if const_expr(self.epi_ops):
                                # gated: the up half's fragments lie d_tile_n / epi_n subtiles further on
                                up = (tRS_rAcc, acc_first + epi_tiles_mn[1] * size_rD) if const_expr(self.gated) else None
                                self._epilogue_ops(tRS_rD, tRS_cD, (mBias, sVec), tc, epi_idx,
                                                   epi_tiles_mn, size_rD, up)
                            tRS_rD_out.store(tRS_rD.load().to(self.d_dtype))
                            epi_buffer = (num_prev + epi_idx) % self.epi_stage
                            cute.copy(tiled_copy_r2s, tRS_rD_out,
                                      tRS_sD[(None, None, None, epi_buffer)])
                            # st.shared / stmatrix writes must be visible to the TMA (async proxy)
                            cute.arch.fence_proxy("async.shared", space="cta")
                            epi_barrier.arrive_and_wait()
                            if is_tma_warp:
                                cute.copy(tma_atom_d, bSG_sD[(None, epi_buffer)],
                                          bSG_gD[(None, epi_tile_layout.get_hier_coord(epi_idx))])
                                store_pipeline.producer_commit()
                                store_pipeline.producer_acquire()
                            epi_barrier.arrive_and_wait()
                        if const_expr(self.split > 1):
                            tiles_done += 1   # the D stores' buffer rotation: only tiles that store

                    if const_expr(self.pingpong):
                        # both warpgroups share sD/sC: drain the stores before handing over
                        if is_tma_warp:
                            store_pipeline.producer_tail()
                        cute.arch.barrier_arrive(barrier_id=BAR_EPI0 + 1 - wg_idx,
                                                 number_of_threads=256)
                        # skip the other warpgroup's tile in the shared pipelines
                        ab_read.advance(k_per)
                        if const_expr(self.has_c):
                            c_read.advance(epi_tile_num)
                            c_write.advance(epi_tile_num)
                        work += 2 * work_stride
                    else:
                        work += work_stride
                    if const_expr(self.split == 1):
                        tiles_done += 1
                    tc, valid, gstate = self._next_tile(work, sched, gstate, mEnds)

                # the next kernel in the stream may start its prologue (it waits for our end)
                cute.arch.griddepcontrol_launch_dependents()
                if const_expr(not self.pingpong):
                    if is_tma_warp:
                        store_pipeline.producer_tail()

    # ---------------------------------------------------------------- entry points (compiled)
    # Tensors cross the FFI boundary in the caller's order: A (L, M, K) | (M, K), B (L, K, N) |
    # (K, N), D / C (L, M, N) | (M, N). They are relabelled into CuTe's (M, K, L) / (N, K, L) /
    # (M, N, L) at trace time, so the host passes framework arrays untouched. An operand that is
    # the same for every batch (the API hands it over with batch stride 0) crosses as a 2-D
    # matrix and gets a stride-0 L mode here: TMA never sees a zero stride.
    def _mk(t, order):
        return cute.make_tensor(t.iterator, cute.select(t.layout, mode=order))

    def _batch_len(d):
        return d.shape[0] if const_expr(cute.rank(d) == 3) else 1

    def _to_mkl(t, d):   # (L, X, Y) -> (X, Y, L); (X, Y) -> (X, Y, L) with stride 0 (broadcast)
        if const_expr(cute.rank(t) == 3):
            return _mk(t, [1, 2, 0])
        return cute.make_tensor(t.iterator, cute.make_layout(
            (*t.shape, _batch_len(d)), stride=(*t.layout.stride, 0)))

    def _b_to_nkl(t, d):  # (L, K, N) -> (N, K, L); (K, N) -> (N, K, L) with stride 0
        if const_expr(cute.rank(t) == 3):
            return _mk(t, [2, 1, 0])
        return cute.make_tensor(t.iterator, cute.make_layout(
            (t.shape[1], t.shape[0], _batch_len(d)),
            stride=(t.layout.stride[1], t.layout.stride[0], 0)))

    @cute.jit
    def gemm_noc(op: cutlass.Constexpr, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor,
                 alpha: Float32, stream: cuda.CUstream):
        op.launch(_to_mkl(a, d), _b_to_nkl(b, d), _to_mkl(d, d), None, None, None, None, None, None, None, alpha,
                  Float32(0.0), stream)

    @cute.jit
    def gemm_split(op: cutlass.Constexpr, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, work: cute.Tensor,
                   flags: cute.Tensor, alpha: Float32, stream: cuda.CUstream):
        op.launch(_to_mkl(a, d), _b_to_nkl(b, d), _to_mkl(d, d), None, None, None, None, work, flags, None, alpha,
                  Float32(0.0), stream)

    @cute.jit
    def gemm_c(op: cutlass.Constexpr, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor,
               c: cute.Tensor, alpha: Float32, beta: Float32, stream: cuda.CUstream):
        op.launch(_to_mkl(a, d), _b_to_nkl(b, d), _to_mkl(d, d), _to_mkl(c, d), None, None, None, None, None, None,
                  alpha, beta, stream)

    @cute.jit
    def gemm_epi(op: cutlass.Constexpr, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: Optional[cute.Tensor],
                 bias: Optional[cute.Tensor], scale_m: Optional[cute.Tensor], scale_n: Optional[cute.Tensor],
                 alpha: Float32, beta: Float32, stream: cuda.CUstream):
        # an Epi class: every optional operand in the signature, None where the class has none; block
        # scales cross as the caller's scale_b (K/128, N/128), relabelled (N/128, K/128) as B is
        if const_expr(op.block):
            scale_n = _mk(scale_n, [1, 0])
        op.launch(_to_mkl(a, d), _b_to_nkl(b, d), _to_mkl(d, d), _to_mkl(c, d) if const_expr(c is not None) else None,
                  bias, scale_m, scale_n, None, None, None, alpha, beta, stream)

    @cute.jit
    def gemm_grouped(op: cutlass.Constexpr, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, ends: cute.Tensor,
                     stream: cuda.CUstream):
        # a grouped class: A (T, K), B (E, K, N), D (T, N), ends (E,) int32
        op.launch(_to_mkl(a, d), _b_to_nkl(b, d), _to_mkl(d, d), None, None, None, None, None, None, ends,
                  Float32(1.0), Float32(0.0), stream)

    return cutlass, cute, Sm90Gemm, (gemm_noc, gemm_c, gemm_epi, gemm_split, gemm_grouped)


_CUTE_DTYPE = {"float16": "Float16", "bfloat16": "BFloat16", "float32": "Float32",
               "float8_e4m3fn": "Float8E4M3FN", "float8_e5m2": "Float8E5M2"}


def build(cfg: Config, ab: str, out: str, a_major: str, b_major: str, d_major: str,
          c: Optional[Tuple[str, str]], unit_alpha: bool, batched: Tuple[bool, bool, bool, bool],
          max_clusters: int, arch: str = "sm_90a", extra_options: str = "", *, epi: Optional[Epi] = None,
          grouped: bool = False):
    """cute.compile one kernel class against fake tensors with symbolic shapes and strides.

    Majorness words are the API's: ROW = last dim contiguous. unit_alpha: a class for alpha == 1
    whose epilogue does not scale (the alpha argument is then ignored; module docstring). `batched` says,
    for A, B, D and C, whether that operand crosses as (L, rows, cols) (else (rows, cols); D
    decides whether the problem is batched at all). ab: float16 | bfloat16, or an FP8 type
    (float8_e4m3fn | float8_e5m2; wgmma reads FP8 K-major only: A row-major, B column-major).
    epi: a fused epilogue class (Epi). Returns the TVM-FFI function f(a, b, d[, c], alpha[, beta],
    stream), or for an Epi class f(a, b, d, c, bias, scale_m, scale_n, alpha, beta, stream) with
    None for what the class lacks (Epi.block: scale_m (M, K/128) M-major and scale_n (K/128, N/128)
    row-major, 16-byte aligned, their strides multiples of 4).
    grouped: the grouped class (Design; A and D row-major, no C, batched ignored; epi at most an
    activation or a gate): f(a (T, K), b (E, K, N), d (T, N), ends (E,) int32, stream), for a gated
    epi b (E, K, 2N) = [gate | up] per group.
    """
    if _ITEMSIZE[ab] == 1 and (a_major, b_major) != (ROW, COL):
        raise ValueError(f"{NAME}: FP8 operands must be K-major (A row-major, B column-major), got {a_major}/{b_major}")
    cutlass, cute, Sm90Gemm, (gemm_noc, gemm_c, gemm_epi, gemm_split, gemm_grouped) = _device()
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    def dt(name):
        return getattr(cutlass, _CUTE_DTYPE[name])

    def fake(dtype: str, rows, cols, major: str, batch):
        """A (L, rows, cols) or (rows, cols) fake tensor; unit stride on the major side."""
        align = 16 // _ITEMSIZE[dtype]
        ld = cute.sym_int64(divisibility=align)
        inner = (ld, 1) if major == ROW else (1, ld)
        if batch is None:
            return make_fake_tensor(dt(dtype), (rows, cols), inner, assumed_align=16)
        return make_fake_tensor(dt(dtype), (batch, rows, cols),
                                (cute.sym_int64(divisibility=align), *inner), assumed_align=16)

    m, n, k = cute.sym_int(), cute.sym_int(), cute.sym_int()
    stream = make_fake_stream()
    opts = f"--enable-tvm-ffi --gpu-arch {arch} {extra_options}".strip()
    if grouped:
        assert c is None and cfg.split == 1 and (a_major, d_major) == (ROW, ROW), "grouped: no C, no split"
        e = cute.sym_int()
        ends = make_fake_tensor(cutlass.Int32, (e,), (1,), assumed_align=4)
        op = Sm90Gemm(cfg, max_clusters, False, True, epi, grouped=True)
        n_b = cute.sym_int() if epi is not None and epi.gated else n     # a gated B is [gate | up]: 2N
        return cute.compile(gemm_grouped, op, fake(ab, m, k, ROW, None), fake(ab, k, n_b, b_major, e),
                            fake(out, m, n, ROW, None), ends, stream, options=opts)
    a_b, b_b, d_b, c_b = batched
    l = cute.sym_int() if d_b else None
    gated = epi is not None and epi.gated
    n_b = cute.sym_int() if gated else n          # a gated B is [gate | up]: 2 N columns
    fa = fake(ab, m, k, a_major, l if a_b else None)
    fb = fake(ab, k, n_b, b_major, l if b_b else None)
    fd = fake(out, m, n, d_major, l)
    op = Sm90Gemm(cfg, max_clusters, c is not None, unit_alpha, epi)
    fc = fake(c[0], m, n, c[1], l if c_b else None) if c is not None else None
    if epi is not None:
        # vectors: one element per D row or column, any alignment (read element by element)
        def vec(dtype: str, extent):
            return make_fake_tensor(dt(dtype), (extent,), (1,), assumed_align=_ITEMSIZE[dtype])
        bias = vec(epi.bias_dtype, n_b if epi.bias == "n" else m) if epi.bias else None
        # scale vectors of their own extent: M / N values, or one (tensor-wise; indices clamp to the last)
        sm = vec("float32", cute.sym_int()) if epi.scale_m else None
        sn = vec("float32", cute.sym_int()) if epi.scale_n else None
        if epi.block:
            # TMA boxes (fp8_checks.kernel_block_scales): A's scales M-major, B's row-major, 16-byte
            # base and strides; A's may hold rows past M (XLA's buffers are padded, not strided)
            kb = cute.sym_int()
            sm = make_fake_tensor(dt("float32"), (cute.sym_int(), kb), (1, cute.sym_int64(divisibility=4)),
                                  assumed_align=16)
            sn = make_fake_tensor(dt("float32"), (kb, cute.sym_int()), (cute.sym_int64(divisibility=4), 1),
                                  assumed_align=16)
        return cute.compile(gemm_epi, op, fa, fb, fd, fc, bias, sm, sn, 1.0, 0.0, stream, options=opts)
    if cfg.split > 1:
        # split-K: the workspace (bytes, read as float32; XLA's scratch buffers are bytes) and the int32
        # flags (workspace_sizes), 16-byte aligned
        work = make_fake_tensor(cutlass.Uint8, (cute.sym_int(),), (1,), assumed_align=16)
        flags = make_fake_tensor(cutlass.Int32, (cute.sym_int(),), (1,), assumed_align=16)
        return cute.compile(gemm_split, op, fa, fb, fd, work, flags, 1.0, stream, options=opts)
    if c is None:
        return cute.compile(gemm_noc, op, fa, fb, fd, 1.0, stream, options=opts)
    return cute.compile(gemm_c, op, fa, fb, fd, fc, 1.0, 0.0, stream, options=opts)


def workspace_sizes(cfg: Config, m: int, n: int, l: int) -> Tuple[int, int]:
    """(float32 elements, int32 flags) a split-K launch of this config needs for an M x N x L D:
    a slot of tile_m x tile_n per CTA tile and part but the last, a flag per CTA tile (the tiles of
    whole clusters, as the persistent grid numbers them)."""
    if cfg.split == 1:
        return 0, 0
    tiles = (-(-(-(-m // cfg.tile_m)) // cfg.cluster_m) * cfg.cluster_m
             * -(-(-(-n // cfg.tile_n)) // cfg.cluster_n) * cfg.cluster_n * l)
    return tiles * (cfg.split - 1) * cfg.tile_m * cfg.tile_n, tiles


def max_clusters(sm_count: int, cfg: Config) -> int:
    # Hopper SMs come in TPC pairs inside a GPC, so every SM can host a 2-CTA cluster.
    return sm_count // (cfg.cluster_m * cfg.cluster_n)


def compile_cached(key: Tuple, build_fn):
    """The one call site of the compile cache (memory -> disk -> build)."""
    return cute_cache.cute(key, build_fn)


def class_key(cfg: Config, ab: str, out: str, a_major: str, b_major: str, d_major: str,
              c: Optional[Tuple[str, str]], unit_alpha: bool, batched: Tuple[bool, bool, bool, bool],
              max_clusters_: int, arch: str, epi: Optional[Epi] = None, grouped: bool = False) -> Tuple:
    """The compile class: everything build() specializes on, and nothing shape-dependent (a fused
    epilogue's Epi, or GROUPED_MARK for the grouped class, last, only when there is one)."""
    return (NAME, arch, cfg, ab, out, a_major, b_major, d_major, c, unit_alpha, batched, max_clusters_) + (
        (epi,) if epi is not None else ()) + ((GROUPED_MARK,) if grouped else ())


GROUPED_MARK = "grouped"     # class_key's mark of the grouped class


def _builder(spec, epi, grouped=False):
    kw = dict(([("epi", epi)] if epi is not None else []) + ([("grouped", True)] if grouped else []))
    return functools.partial(build, *spec, **kw)


def compiled(*spec, epi: Optional[Epi] = None, grouped: bool = False):
    """The compiled function for build(*spec, epi=epi, grouped=grouped) (same arguments as class_key)."""
    return compile_cached(class_key(*spec, epi, grouped), _builder(spec, epi, grouped))


def compiled_eager(*spec, epi: Optional[Epi] = None, grouped: bool = False):
    """compiled(), as eager calls take it (xgemm.runtime.cute_cache.cute_eager: ctypes, no tvm_ffi import)."""
    return cute_cache.cute_eager(class_key(*spec, epi, grouped), _builder(spec, epi, grouped))


def build_for_key(key: Tuple):
    """The build callable for a class_key (xgemm.runtime.cute_cache.warm compiles keys in worker processes)."""
    assert key[0] == NAME, key
    spec = key[2:12] + (key[1],)
    rest = key[12:]
    return _builder(spec, next((x for x in rest if isinstance(x, Epi)), None), GROUPED_MARK in rest)

