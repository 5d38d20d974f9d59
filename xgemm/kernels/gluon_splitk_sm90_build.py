"""gluon_splitk_sm90's kernels, compiled to cubins (their cache is keyed on this file alone: the
policy and the kernel protocol live in gluon_splitk_sm90.py, whose edits keep every cubin).

D = alpha * A @ B for skinny M (M <= 64 per tile row) as a Gluon kernel whose
K is split over the CTAs of a cluster and summed through distributed shared memory, or (stream-K,
at decode M) shared evenly by a one-wave grid and summed through a global workspace; prebuilt to
cubins.

Contract
  op        out = alpha * A @ B, A (M, K), B (K, N); fp32 accumulate and fp32 split-K sum, rounded
            once to the output dtype. No beta/C, no batch.
  dtypes    A, B both float16 or both bfloat16; out float16 | bfloat16 (the inputs') | float32.
  layout    A ROW (K-major); B ROW (N-major) or COL (K-major); out ROW. Anything else declines.
  alignment cp.async 16-byte vectors: the three base pointers 16-byte aligned, N and K multiples
            of 8 and every leading stride a multiple of 8 elements (the API's Epilogue says whether
            an out= qualifies). M, N, K >= 1; tails of M and of the last N / K tile are zero-filled
            loads (cp.async src-size 0) and masked stores.
  arch      sm_90a (wgmma, clusters, distributed shared memory): built by triton >= 3.8
            (xgemm/runtime/gluon_cache.py), launched without triton (xgemm/runtime/launch.py eagerly, ffi/ under jit).
  limits    M, N, K < 2**31 (the kernel tiles any M; the policy sends it M <= 64 with K >= 1024, or
            K >= 256 where N has a 128-column tile for every SM);
            SPLIT (CTAs per cluster) in {1, 2, 4, 8}; stream-K: M <= 64, units x grid < 2**31.

Why (the shape class it serves)
  At M = 64, N = K = 8192 the GEMM is a stream of B (128 MiB) past a 1 MiB A: cuBLAS runs at
  ~3.9 TB/s. A 128 x N tile per SM wastes half of every wgmma on rows that do not exist, and with
  one 128 x 128 tile per SM only 64 SMs have work (every cute_gemm_sm90 tile ran well behind
  cuBLAS there; docs/performance.md, "Skinny and small M"). Here a 64-row tile is one warpgroup's
  wgmma (m64), and SPLIT CTAs share each output tile, each streaming 1/SPLIT of K, so N / BN * SPLIT
  CTAs keep every SM's copy engine busy without any workspace in global memory.

Design
  Grid: one cluster of SPLIT CTAs per (BM x BN) output tile (num_ctas = SPLIT, so the program id is
  the cluster id). CTA r of the cluster (%cluster_ctarank) takes K blocks [r * per, (r + 1) * per).
  Mainloop (one partition, one warpgroup): STAGES shared-memory slots filled by cp.async (16-byte
  vectors, one commit group per K block, STAGES - 1 blocks ahead); per block: wait for its group,
  fence.proxy.async (cp.async writes through the generic proxy, wgmma reads through the async
  one), CTA barrier (every thread's copies have landed and the previous wgmma has retired in every
  warp), refill the slot the previous wgmma read, then wgmma and wait for it.
  Every register tensor of the mainloop has a broadcast CGA layout: the compiler treats the
  accumulator as the same in every CTA, which is true of its shape and false of its values; it is
  only ever written to the CTA's own shared memory, never stored from registers to global memory.
  Split-K sum: each CTA stores its accumulator to a padded fp32 buffer in its shared memory;
  cluster barrier (release / acquire); CTA r then owns rows [r * BM / SPLIT, (r + 1) * BM / SPLIT)
  of the tile: a layout whose CGA bit puts dim 0 of [SPLIT, BM / SPLIT, BN] on the CTAs, so the
  result is a real cluster-distributed tensor and each CTA stores its own rows. It reads those rows
  from every CTA's buffer (mapa + ld.shared::cluster.v4.f32, inline asm), adds them in CTA order
  (a fixed order: the sum is deterministic), scales by alpha, rounds and stores. A last cluster
  barrier keeps every CTA's shared memory alive until its peers have read it.
Stream-K (xgemm_streamk_sm90, M <= 64)
  Where there are fewer tiles than resident slots (144 tiles of 128 columns against 264 slots of
  96 KB at 1 x 18432), most SMs run one CTA, whose loads in flight fall short of an SM's share of
  DRAM bandwidth. Here the N / BN tiles x K / BK blocks are one list of units, and CTA c of G
  (every resident slot, two 96 KB CTAs an SM) runs units [c * units / G, (c + 1) * units / G): the
  same mainloop, its loads running on across tile boundaries. A tile a CTA runs whole is stored
  from registers. A part of a tile goes to the CTA's slot in a float32 workspace (two M x BN slots
  a CTA: the part its range starts with, the one it ends with) as soon as it is done, and the
  mainloop runs on. At the end of its range, after a CTA barrier, one thread's acq_rel atomic a
  part counts the tile's arrivals, and the last CTA to arrive sums every part in CTA order
  (deterministic; four parts' loads in flight, in a layout of M's rows only), stores the tile and
  sets the flag back to zero. No CTA waits on another.
  Workspace and flags: per stream eagerly (runtime/workspace.py), XLA scratch and zero-filled
  flags under jit.
"""
from __future__ import annotations

from collections import namedtuple

from xgemm.core.dtypes import ITEMSIZE, LONG_DTYPE, SHORT_DTYPE
from xgemm.runtime.gluon_cache import parse_key

NAME = "gluon_splitk_sm90"
IN_DTYPES = ("float16", "bfloat16")
_SHORT, _LONG = SHORT_DTYPE, LONG_DTYPE
_ITEMSIZE = ITEMSIZE
BM = 64                 # one warpgroup's wgmma m64
WARPS = 4
RED_PAD = 8             # fp32 pad per buffer row: 2-way (minimal) bank conflicts on the acc store
SMEM_LIMIT = 227 * 1024 - 1024


class Config(namedtuple("Config", "in_dtype out_dtype bn bk stages split b_kmajor streamk", defaults=(False,))):
    """One compiled variant: BN x BK tiles (BM = 64), STAGES slots, SPLIT CTAs per cluster; or,
    with streamk, the stream-K kernel (split 1): a one-wave grid sharing the (tile, K block) units
    evenly, partial tiles summed through a global workspace."""
    __slots__ = ()

    @property
    def key(self) -> str:
        return (f"{NAME}/sm_90a-{_SHORT[self.in_dtype]}-{_SHORT[self.out_dtype]}/"
                f"n{self.bn}-k{self.bk}-s{self.stages}-x{self.split}-b{int(self.b_kmajor)}"
                + ("-t1" if self.streamk else ""))

    @classmethod
    def from_key(cls, key: str) -> "Config":
        (_, i, o), f = parse_key(key, NAME)
        return cls(_LONG[i], _LONG[o], f["n"], f["k"], f["s"], f["x"], bool(f["b"]), bool(f.get("t", 0)))

    def smem_bytes(self) -> int:
        # the split-K buffer is allocated after the stage slots are dead: the compiler overlays them
        it = _ITEMSIZE[self.in_dtype]
        stages = self.stages * (BM + self.bn) * self.bk * it
        return stages if self.streamk else max(stages, BM * (self.bn + RED_PAD) * 4)

    def check(self) -> None:
        if self.split not in (1, 2, 4, 8) or self.bn not in (32, 64, 128, 256) or self.bk not in (32, 64, 128, 256):
            raise ValueError(f"{self}: split in 1/2/4/8, bn and bk in 32..256 (powers of two)")
        if self.streamk and self.split != 1:
            raise ValueError(f"{self}: the stream-K kernel runs without clusters (split 1)")
        if self.stages < 2 or self.smem_bytes() > SMEM_LIMIT:
            raise ValueError(f"{self}: needs 2+ stages and at most {SMEM_LIMIT} bytes of shared memory")


# ----------------------------------------------------------------------------------------------
# Gluon source (imported only to compile)
# ----------------------------------------------------------------------------------------------

def _define():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    @gluon.jit
    def _load_stage(a_ptr, b_ptr, a_slot, b_slot, am, ak, bn, bk, M, N, K, lda, ldb, k0, valid,
                    B_KMAJOR: gl.constexpr):
        # one K block of A [BM, BK] and B ([BK, BN], or [BN, BK] when K-major) into a slot;
        # masked lanes (tails, or a block past this CTA's range) copy 0 bytes: zero fill
        a_mask = (am < M)[:, None] & (ak + k0 < K)[None, :] & valid
        async_copy.async_load(a_slot, a_ptr + am.to(gl.int64)[:, None] * lda + (ak + k0)[None, :], mask=a_mask)
        if B_KMAJOR:
            b_mask = (bn < N)[:, None] & (bk + k0 < K)[None, :] & valid
            async_copy.async_load(b_slot, b_ptr + bn.to(gl.int64)[:, None] * ldb + (bk + k0)[None, :], mask=b_mask)
        else:
            b_mask = (bk + k0 < K)[:, None] & (bn < N)[None, :] & valid
            async_copy.async_load(b_slot, b_ptr + (bk + k0).to(gl.int64)[:, None] * ldb + bn[None, :], mask=b_mask)

    @gluon.jit
    def xgemm_splitk_sm90(a_ptr, b_ptr, d_ptr, M, N, K, lda, ldb, ldd, alpha,
                          BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, SPLIT: gl.constexpr,
                          B_KMAJOR: gl.constexpr, A_SMEM: gl.constexpr, B_SMEM: gl.constexpr,
                          A_LOAD: gl.constexpr, B_LOAD: gl.constexpr, ACC: gl.constexpr,
                          RED_SMEM: gl.constexpr, OUT: gl.constexpr):
        BM: gl.constexpr = 64
        RB: gl.constexpr = BM // SPLIT
        PITCH: gl.constexpr = BN + 8            # RED_SMEM pads each row by 8 fp32
        dtype: gl.constexpr = a_ptr.dtype.element_ty

        tiles_m = gl.cdiv(M, BM)
        pid = gl.program_id(0)                  # the cluster: one output tile
        off_m = (pid % tiles_m) * BM
        off_n = (pid // tiles_m) * BN
        if SPLIT > 1:
            rank = gl.inline_asm("mov.u32 $0, %cluster_ctarank;", "=r", [], gl.int32, is_pure=True)
        else:
            rank = 0
        k_blocks = gl.cdiv(K, BK)
        per = gl.cdiv(k_blocks, SPLIT)
        kb0 = rank * per
        n_local = gl.maximum(gl.minimum(k_blocks - kb0, per), 0)

        a_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, BK], A_SMEM)
        if B_KMAJOR:
            b_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, BK], B_SMEM)
            bn = off_n + gl.arange(0, BN, gl.SliceLayout(1, B_LOAD))
            bk = gl.arange(0, BK, gl.SliceLayout(0, B_LOAD))
        else:
            b_smem = gl.allocate_shared_memory(dtype, [STAGES, BK, BN], B_SMEM)
            bk = gl.arange(0, BK, gl.SliceLayout(1, B_LOAD))
            bn = off_n + gl.arange(0, BN, gl.SliceLayout(0, B_LOAD))
        am = off_m + gl.arange(0, BM, gl.SliceLayout(1, A_LOAD))
        ak = gl.arange(0, BK, gl.SliceLayout(0, A_LOAD))

        gdc_wait()      # launched with PDL: the previous kernel's writes are visible from here on
        for i in gl.static_range(STAGES - 1):
            _load_stage(a_ptr, b_ptr, a_smem.index(i), b_smem.index(i), am, ak, bn, bk, M, N, K, lda, ldb,
                        (kb0 + i) * BK, i < n_local, B_KMAJOR)
            async_copy.commit_group()

        acc = gl.zeros([BM, BN], gl.float32, ACC)
        for i in range(n_local):
            s = i % STAGES
            async_copy.wait_group(STAGES - 2)   # this thread's copies of block i have landed
            fence_async_shared()
            gl.barrier()                        # everyone's have; wgmma i - 1 retired in every warp
            j = i + STAGES - 1                  # refill the slot wgmma i - 1 read
            sj = j % STAGES
            _load_stage(a_ptr, b_ptr, a_smem.index(sj), b_smem.index(sj), am, ak, bn, bk, M, N, K, lda, ldb,
                        (kb0 + j) * BK, j < n_local, B_KMAJOR)
            async_copy.commit_group()
            if B_KMAJOR:
                b_op = b_smem.index(s).permute((1, 0))
            else:
                b_op = b_smem.index(s)
            acc = warpgroup_mma(a_smem.index(s), b_op, acc, is_async=True)
            acc, _, _ = warpgroup_mma_wait(0, deps=[acc, a_smem.index(s), b_smem.index(s)])
        async_copy.wait_group(0)                # no copy may land after the CTA's exit
        gdc_launch_dependents()                 # the next kernel may start its prologue

        # split-K sum through distributed shared memory (see the module notes)
        # (the compiler may place this buffer over the drained stage slots: every warp's last
        # wgmma has retired once all pass this barrier)
        gl.barrier()
        red = gl.allocate_shared_memory(gl.float32, [BM, BN], RED_SMEM)
        red.store(acc)
        gl.barrier(cluster=True)
        rows_l: gl.constexpr = gl.SliceLayout(2, OUT)
        o_s = gl.arange(0, SPLIT, gl.SliceLayout(1, rows_l))            # the owner CTA (the CGA dim)
        o_r = gl.arange(0, RB, gl.SliceLayout(0, rows_l))
        o_c = gl.arange(0, BN, gl.SliceLayout(0, gl.SliceLayout(1, OUT)))
        row = (o_s * RB)[:, None] + o_r[None, :]                        # row within the tile
        byte_off = (row[:, :, None] * PITCH + o_c[None, None, :]) * 4
        total = gl.zeros([SPLIT, RB, BN], gl.float32, OUT)
        for src in gl.static_range(SPLIT):
            base = gl.inline_asm("mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r", [red, src], gl.int32,
                                 is_pure=False)
            part = gl.inline_asm_elementwise("ld.shared::cluster.v4.f32 {$0, $1, $2, $3}, [$4];",
                                             "=f,=f,=f,=f,r,r,r,r", [base + byte_off], dtype=gl.float32,
                                             is_pure=False, pack=4)
            total = total + part
        rows = off_m + row
        cols = off_n + o_c
        mask = (rows < M)[:, :, None] & (cols < N)[None, None, :]
        gl.store(d_ptr + rows.to(gl.int64)[:, :, None] * ldd + cols[None, None, :],
                 (total * alpha).to(d_ptr.dtype.element_ty), mask=mask)
        gl.barrier(cluster=True)                # peers are done reading this CTA's buffer

    @gluon.jit
    def _next_unit(tile, kb, kbl):
        # the (tile, K block) after (tile, kb): stepped, not divided, in the mainloop
        kb += 1
        wrap = (kb == kbl).to(gl.int32)
        return tile + wrap, kb - wrap * kbl

    @gluon.jit
    def _cta_of(unit, G, units):
        # the CTA whose range holds `unit` (CTA c runs units [c * units // G, (c + 1) * units // G))
        return ((unit + 1) * G - 1) // units

    @gluon.jit
    def _store_segment(acc, d_ptr, ws_ptr, c, G, start, tile, kbl, units, M, N, ldd, alpha, rows, cols0,
                       BN: gl.constexpr):
        # acc holds this CTA's sum over its units of `tile`: a tile it ran whole is stored; a part
        # goes to one of the CTA's two workspace slots (0: the part its range starts with, 1: the
        # one it ends with) without waiting, so the mainloop runs on (_arrive counts it at the end)
        t0 = tile * kbl
        cols = tile * BN + cols0
        if _cta_of(t0, G, units) == _cta_of(t0 + kbl - 1, G, units):
            out_mask = (rows < M)[:, None] & (cols < N)[None, :]
            gl.store(d_ptr + rows.to(gl.int64)[:, None] * ldd + cols[None, :], (acc * alpha).to(d_ptr.dtype.element_ty),
                     mask=out_mask)
        else:
            ws_mask = (rows < M)[:, None] & (cols0 < BN)[None, :]
            slot = 2 * c + (start < t0).to(gl.int32)
            gl.store(ws_ptr + slot.to(gl.int64) * M * BN + rows[:, None] * BN + cols0[None, :], acc, mask=ws_mask)

    @gluon.jit
    def _arrive(d_ptr, ws_ptr, flag_ptr, G, tile, kbl, units, M, N, ldd, alpha, BN: gl.constexpr,
                SUM: gl.constexpr):
        # after a CTA barrier (every thread's part is stored): count this CTA's part of a shared
        # tile; the last CTA to arrive sums every part in CTA order (a fixed order: the result does
        # not depend on which CTA arrives last), four parts' loads in flight at a time, 16 rows at
        # a time in a layout of M's rows only (the wgmma layout holds 64)
        t0 = tile * kbl
        first = _cta_of(t0, G, units)
        last = _cta_of(t0 + kbl - 1, G, units)
        if first != last:
            arrived = gl.atomic_add(flag_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == last - first:
                ROWS: gl.constexpr = 16
                r = gl.arange(0, ROWS, gl.SliceLayout(1, SUM))
                cc = gl.arange(0, BN, gl.SliceLayout(0, SUM))
                cols = tile * BN + cc
                for r0 in range(0, M, ROWS):
                    rows = r0 + r
                    ws_off = rows[:, None] * BN + cc[None, :]
                    mask = (rows < M)[:, None] & (cc < BN)[None, :]
                    total = gl.zeros([ROWS, BN], gl.float32, SUM)
                    for s0 in range(first, last + 1, 4):
                        for j in gl.static_range(4):
                            src = gl.minimum(s0 + j, last)          # past `last`: masked off
                            slot = 2 * src + ((src * units // G) < t0).to(gl.int32)
                            total += gl.load(ws_ptr + slot.to(gl.int64) * M * BN + ws_off, mask=mask & (s0 + j <= last),
                                             other=0.0, cache_modifier=".cg")
                    gl.store(d_ptr + rows.to(gl.int64)[:, None] * ldd + cols[None, :],
                             (total * alpha).to(d_ptr.dtype.element_ty), mask=(rows < M)[:, None] & (cols < N)[None, :])
                gl.store(flag_ptr + tile, 0)    # the flags stay zero between launches

    @gluon.jit
    def xgemm_streamk_sm90(a_ptr, b_ptr, d_ptr, ws_ptr, flag_ptr, M, N, K, lda, ldb, ldd, alpha,
                           BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, B_KMAJOR: gl.constexpr,
                           A_SMEM: gl.constexpr, B_SMEM: gl.constexpr, A_LOAD: gl.constexpr, B_LOAD: gl.constexpr,
                           ACC: gl.constexpr, SUM: gl.constexpr):
        BM: gl.constexpr = 64                   # M <= 64: one row of tiles
        dtype: gl.constexpr = a_ptr.dtype.element_ty
        G = gl.num_programs(0)
        c = gl.program_id(0)
        kbl = gl.cdiv(K, BK)
        units = gl.cdiv(N, BN) * kbl            # (tile, K block) units, tile-major
        start = c * units // G                  # the host keeps units * G < 2**31
        n_local = (c + 1) * units // G - start

        a_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, BK], A_SMEM)
        if B_KMAJOR:
            b_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, BK], B_SMEM)
            bn = gl.arange(0, BN, gl.SliceLayout(1, B_LOAD))
            bk = gl.arange(0, BK, gl.SliceLayout(0, B_LOAD))
        else:
            b_smem = gl.allocate_shared_memory(dtype, [STAGES, BK, BN], B_SMEM)
            bk = gl.arange(0, BK, gl.SliceLayout(1, B_LOAD))
            bn = gl.arange(0, BN, gl.SliceLayout(0, B_LOAD))
        am = gl.arange(0, BM, gl.SliceLayout(1, A_LOAD))
        ak = gl.arange(0, BK, gl.SliceLayout(0, A_LOAD))

        gdc_wait()                              # as in xgemm_splitk_sm90
        for i in gl.static_range(STAGES - 1):
            t = (start + i) // kbl
            _load_stage(a_ptr, b_ptr, a_smem.index(i), b_smem.index(i), am, ak, bn + t * BN, bk, M, N, K, lda, ldb,
                        (start + i - t * kbl) * BK, i < n_local, B_KMAJOR)
            async_copy.commit_group()

        rows = gl.arange(0, BM, gl.SliceLayout(1, ACC))
        cols0 = gl.arange(0, BN, gl.SliceLayout(0, ACC))
        acc = gl.zeros([BM, BN], gl.float32, ACC)
        # (tile, K block) of unit i and of unit j = i + STAGES - 1 (the refill), stepped rather than
        # divided each iteration (two integer divisions by kbl sat in the loop)
        t_first = start // kbl
        tile = t_first
        kb = start - tile * kbl
        tj = (start + STAGES - 1) // kbl
        kj = start + STAGES - 1 - tj * kbl
        for i in range(n_local):
            s = i % STAGES
            async_copy.wait_group(STAGES - 2)   # as in xgemm_splitk_sm90's mainloop
            fence_async_shared()
            gl.barrier()
            j = i + STAGES - 1                  # the loads run on across tile boundaries
            sj = j % STAGES
            _load_stage(a_ptr, b_ptr, a_smem.index(sj), b_smem.index(sj), am, ak, bn + tj * BN, bk, M, N, K, lda,
                        ldb, kj * BK, j < n_local, B_KMAJOR)
            async_copy.commit_group()
            tj, kj = _next_unit(tj, kj, kbl)
            if B_KMAJOR:
                b_op = b_smem.index(s).permute((1, 0))
            else:
                b_op = b_smem.index(s)
            # a tile's first unit in this CTA starts a fresh sum
            acc = warpgroup_mma(a_smem.index(s), b_op, acc, use_acc=(kb > 0) & (i > 0), is_async=True)
            acc, _, _ = warpgroup_mma_wait(0, deps=[acc, a_smem.index(s), b_smem.index(s)])
            if (kb == kbl - 1) | (i == n_local - 1):
                _store_segment(acc, d_ptr, ws_ptr, c, G, start, tile, kbl, units, M, N, ldd, alpha, rows, cols0, BN)
            tile, kb = _next_unit(tile, kb, kbl)
        async_copy.wait_group(0)                # no copy may land after the CTA's exit
        gdc_launch_dependents()
        # the arrivals wait for the end of the CTA's stream: a part's count and sum mid-run stalled
        # the mainloop behind an atomic's round trip and the sum's loads
        gl.barrier()                            # every thread's parts are stored before the release
        if n_local > 0:
            t_last = (start + n_local - 1) // kbl
            _arrive(d_ptr, ws_ptr, flag_ptr, G, t_first, kbl, units, M, N, ldd, alpha, BN, SUM)
            if t_last != t_first:
                _arrive(d_ptr, ws_ptr, flag_ptr, G, t_last, kbl, units, M, N, ldd, alpha, BN, SUM)

    return {"xgemm_splitk_sm90": xgemm_splitk_sm90, "xgemm_streamk_sm90": xgemm_streamk_sm90}


# ----------------------------------------------------------------------------------------------
# Compile arguments (gluon_cache plug-in)
# ----------------------------------------------------------------------------------------------

def _layouts(cfg: Config):
    """(A, B shared; A, B cp.async; accumulator; split-K buffer; output; stream-K sum) layouts.
    Everything of the mainloop is broadcast over the cluster's CTAs (zero CGA bases); the output
    splits dim 0."""
    from triton.experimental.gluon import language as gl
    bits = cfg.split.bit_length() - 1
    bcast = [[0, 0] for _ in range(bits)]
    it = {"float16": gl.float16, "bfloat16": gl.bfloat16}[cfg.in_dtype]

    def load(cols: int):     # cp.async of a 16-bit tile: 8-element (16-byte) vectors along cols
        tpc = min(32, cols // 8)
        return gl.BlockedLayout([1, 8], [32 // tpc, tpc], [WARPS, 1], [1, 0], cga_layout=bcast)

    b_block = [cfg.bn, cfg.bk] if cfg.b_kmajor else [cfg.bk, cfg.bn]
    a_smem = gl.NVMMASharedLayout.get_default_for([BM, cfg.bk], it, cga_layout=bcast)
    b_smem = gl.NVMMASharedLayout.get_default_for(b_block, it, cga_layout=bcast)
    acc = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, cfg.bn, 16],
                                    cga_layout=bcast)
    red = gl.PaddedSharedLayout.with_identity_for([[cfg.bn, RED_PAD]], [BM, cfg.bn], [1, 0], cga_layout=bcast)
    # [SPLIT, BM / SPLIT, BN]: CTA bits on dim 0; 4 consecutive fp32 per thread (one v4 load)
    tpc = min(32, cfg.bn // 4)
    out = gl.BlockedLayout([1, 1, 4], [1, 32 // tpc, tpc], [1, WARPS, 1], [2, 1, 0],
                           cga_layout=[[1 << i, 0, 0] for i in range(bits)])
    # the stream-K last CTA's sum of a tile's parts: [16, BN] rows, 4 consecutive fp32 a thread
    total = gl.BlockedLayout([1, 4], [32 // tpc, tpc], [WARPS, 1], [1, 0])
    return a_smem, b_smem, load(cfg.bk), load(b_block[1]), acc, red, out, total


def gluon_compile_args(key: str, arch: str):
    cfg = Config.from_key(key)
    if arch != "sm_90a":
        raise ValueError(f"{key} is built for sm_90a only, not {arch}")
    cfg.check()
    a_smem, b_smem, a_load, b_load, acc, red, out, total = _layouts(cfg)
    it = f"*{_SHORT[cfg.in_dtype]}"
    sig = {"a_ptr": it, "b_ptr": it, "d_ptr": f"*{_SHORT[cfg.out_dtype]}"}
    if cfg.streamk:
        sig.update({"ws_ptr": "*fp32", "flag_ptr": "*i32"})
    sig.update({"M": "i32", "N": "i32", "K": "i32", "lda": "i64", "ldb": "i64", "ldd": "i64", "alpha": "fp32"})
    constexprs = {"BN": cfg.bn, "BK": cfg.bk, "STAGES": cfg.stages, "SPLIT": cfg.split,
                  "B_KMAJOR": cfg.b_kmajor, "A_SMEM": a_smem, "B_SMEM": b_smem, "A_LOAD": a_load,
                  "B_LOAD": b_load, "ACC": acc, "RED_SMEM": red, "OUT": out}
    if cfg.streamk:
        for name in ("SPLIT", "RED_SMEM", "OUT"):
            del constexprs[name]
        constexprs["SUM"] = total
    sig.update({k: "constexpr" for k in constexprs})
    # 16-byte bases; N, K and the leading strides multiples of 8 elements: 16-byte cp.async vectors
    # (the masks of N and K tails must be constant over each 8-element vector)
    names = list(sig)
    attrs = {(names.index(p),): [["tt.divisibility", 16]] for p in ("a_ptr", "b_ptr", "d_ptr", "ws_ptr", "flag_ptr")
             if p in sig}
    attrs.update({(names.index(p),): [["tt.divisibility", 8]] for p in ("N", "K", "lda", "ldb", "ldd")})
    # launch_pdl: launched with programmatic dependent launch (runtime/launch.py reads it here)
    options = {"num_warps": WARPS, "num_ctas": cfg.split, "enable_fp_fusion": False, "launch_pdl": True}
    kernel = "xgemm_streamk_sm90" if cfg.streamk else "xgemm_splitk_sm90"
    return _define()[kernel], sig, constexprs, attrs, options
