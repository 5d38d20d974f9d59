"""gluon_splitk_sm90: D = alpha * A @ B for skinny M (M <= 64) with K split over the CTAs of a
cluster or, at decode M with few tiles, shared by a stream-K grid. This file holds the policy (tile,
split and schedule per problem, tuned with benchmarks/gemm_tc.py --sweep-set splitk) and the kernel
protocol; the kernels, their Config and their compile arguments are gluon_splitk_sm90_build.py, the
one file their cubins' cache is keyed on, so that a policy edit keeps every cubin built.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

from xgemm.core.problem import COL, ROW, Policy
from xgemm.kernels._common import sm90_half_gemm_reason
from xgemm.kernels._pointer_gemm import H200_SMS, PointerGemm, b_leading_stride, sm_count
from xgemm.kernels.gluon_splitk_sm90_build import (  # noqa: F401 -- the kernels under this kernel's name
    BM, IN_DTYPES, NAME, RED_PAD, SMEM_LIMIT, WARPS, Config, gluon_compile_args)
from xgemm.runtime import driver, gluon_cache, launch, workspace
from xgemm.runtime.calls import Param, triton_launch


# ----------------------------------------------------------------------------------------------
# The policy: tiles and split per problem
# ----------------------------------------------------------------------------------------------
# Tuned with `benchmarks/gemm_tc.py --sweep --sweep-set splitk` (every TUNE tile at every split,
# bf16, one process with cuBLAS; the tables are in docs/performance.md). What decides: every SM
# streaming B for the whole run and many bytes in flight per CTA (deep K tiles). A grid that fits
# the SMs' resident slots at once runs as one wave whatever its count, so a 96 KB tile (two CTAs
# an SM) serves N of 128 columns per SM and more without a split, where a 128 KB one ran a second
# wave. 4- and 8-CTA clusters must fit in one GPC: at one CTA per SM (over 113 KB of shared
# memory) only half as many such clusters are resident as at two CTAs per SM, so those splits
# take a tile of at most 96 KB.
TUNE = ((128, 64, 4), (128, 128, 3), (128, 128, 4), (64, 64, 6), (64, 128, 4), (64, 128, 6), (32, 128, 6),
        (64, 256, 3))
SPLITS = (1, 2, 4, 8)
TILES = {64: ((128, 4), (64, 6)), 128: ((128, 4), (64, 4))}   # bn -> ((bk, stages) for split <= 2, for 4/8)
WIDE = (128, 64, 4)       # (bn, bk, stages) of a grid with a 128-column tile for every SM: 96 KB
DECODE_M = 16             # M up to this: 128-column tiles split in two rather than 64-column ones unsplit
DEEP = (256, 3)           # (bk, stages) of a 64-column tile split in two at decode M
OVERFILL = 1.5            # decode CTAs per SM a split of 8 may reach where two fit an SM
STREAMK = (128, 64, 4)    # (bn, bk, stages) of the stream-K kernel: 96 KB, two CTAs an SM
STREAMK_NARROW = (64, 256, 3)   # ... where that tile's grid would shrink: 192 KB, one CTA an SM
STREAMK_TUNE = ((128, 64, 4), (64, 128, 4), (128, 128, 4), (64, 256, 3))
STREAMK_BELOW = 0.7       # decode M: stream-K where WIDE's tiles fill under this share of the resident slots
STREAMK_MIN_KB = 64       # ... and each tile runs this many K blocks or more (a CTA's part is long)
MIN_UNITS = 8             # (tile, K block) units a stream-K CTA runs at least, where the grid may shrink
BALANCED = 0.95           # decode M: a split of 1-2 whose CTAs fill this share of the SMs, one each, stays
DEEP_8 = (128, 4)         # (bk, stages) of 64-column tiles split 8 where the clusters fit one CTA an SM
                          # (128 KB: more of B in flight than the 96 KB tile whose second slot is idle) ...
DEEP_8_SMS = 0.8          # ... which stays where its CTAs sit on this share of the SMs or stream under
                          # 2 x MIN_PART bytes of B each
MIN_PART = 128 * 1024     # decode M: cluster CTAs streaming fewer bytes of B than this stay (stream-K's
                          # fixed cost, ~1.3 us more, does not pay)
FILL = (64, 64, 6)        # (bn, bk, stages) of 64-column tiles split to fill the resident slots, two
                          # 96 KB CTAs an SM ...
FILL_AT = 0.78            # ... where the split's CTAs fill this share of the slots,
FILL_AT_4 = 0.7           # or this share with a split of 4 or 8 (shorter parts)
CLUSTERS = {4: 62, 8: 30}  # 4- and 8-CTA clusters of two-an-SM CTAs the H200 holds at once (a cluster
                           # fits in one GPC; cuOccupancyMaxActiveClusters, docs/performance.md), per 132 SMs


def _tiles(m: int, n: int, bn: int) -> int:
    """Output tiles (= clusters launched) of a BM x bn tiling."""
    return -(-m // BM) * -(-n // bn)


def resident_per_sm(cfg: Config) -> int:
    """CTAs of this config one SM holds at once (shared memory decides; at most two)."""
    return max(1, min(2, SMEM_LIMIT // cfg.smem_bytes()))


def resident_clusters(cfg: Config, sms: int = H200_SMS) -> int:
    """Clusters of this config resident at once: a cluster must fit in one GPC, so 4- and 8-CTA
    clusters number fewer than SMs x resident / split (30, not 33, of 8 at two CTAs an SM on the
    H200; about half at one)."""
    per_sm = resident_per_sm(cfg)
    if cfg.split not in CLUSTERS:
        return sms * per_sm // cfg.split
    return CLUSTERS[cfg.split] * sms * per_sm // (2 * H200_SMS)


def sm_fill(m: int, n: int, cfg: Config, sms: int = H200_SMS) -> float:
    """The share of the SMs streaming B, averaged over the waves of resident CTAs (tiles x split):
    the CTAs of one wave run together, so a wave keeps min(1, its CTAs / SMs) of the SMs busy.
    The split exists to bring this near 1 when M is too small to give every SM a tile. A stream-K
    grid is one wave on every SM (streamk_grid; a smaller grid only below a unit per SM)."""
    if cfg.streamk:
        return 1.0
    ctas = _tiles(m, n, cfg.bn) * cfg.split
    resident = sms * resident_per_sm(cfg)
    waves = -(-ctas // resident)
    last = ctas - (waves - 1) * resident
    return (waves - 1 + min(1.0, last / sms)) / waves


def streamk_units(n: int, k: int, cfg: Config) -> int:
    """The stream-K kernel's (tile, K block) units: M <= 64 is one row of tiles."""
    return -(-n // cfg.bn) * -(-k // cfg.bk)


def streamk_grid(n: int, k: int, cfg: Config, sms: int = H200_SMS) -> int:
    """CTAs of a stream-K launch: every resident slot (a whole number of CTAs per SM, so each SM
    streams the same share), fewer per SM where a CTA would run under MIN_UNITS units."""
    units = streamk_units(n, k, cfg)
    per_sm = min(resident_per_sm(cfg), max(1, units // (MIN_UNITS * sms)))
    return max(1, min(units, sms * per_sm))


def streamk_workspace(m: int, n: int, cfg: Config, grid: int) -> Tuple[int, int]:
    """(float32 values, int32 flags) a stream-K launch needs: two M x bn slots a CTA, a flag a tile."""
    return 2 * grid * m * cfg.bn, -(-n // cfg.bn)


def _tile(bn: int, split: int) -> Tuple[int, int]:
    return TILES[bn][0 if split <= 2 else 1]


def part_bytes(k: int, cfg: Config) -> int:
    """Bytes of B (16-bit) one CTA of a cluster config streams."""
    return -(-k // cfg.split) * cfg.bn * 2


def choose(m: int, n: int, k: int, in_dtype: str, out_dtype: str, b_kmajor: bool,
           sms: int = H200_SMS) -> Config:
    """The cluster split's pick (_choose_cluster), or at decode M (<= 16) the config that keeps
    more of B in flight where that pick leaves SMs idle or streams too little per SM. In order:
    - WIDE (a 128-column tile for every SM) with tiles for under STREAMK_BELOW of the resident
      slots and K of STREAMK_MIN_KB blocks or more: stream-K. Most SMs would run one WIDE CTA:
      1 x 18432 x 7168 (144 tiles) ran 80.4 us WIDE, 67.1 stream-K, cuBLAS 63.9. With more tiles
      or shorter K the parts' sums cost more: 1 x 24576 x 1536 (192 tiles) 21.7 WIDE, 24.8.
    - A split of 1-2 whose CTAs fill BALANCED of the SMs, one each, stays: its deep tiles ran
      3-14% ahead of stream-K (1 x 4096 x 4096, 1 x 8192 x 8192, 1 x 4096 x 14336).
    - A split of 8 over 64-column tiles whose clusters fit one CTA an SM takes the 128 KB DEEP_8
      tile, and stays where its CTAs sit on DEEP_8_SMS of the SMs or stream under 2 x MIN_PART
      each: 1 x 960 x 7168 1.15x cuBLAS against 1.10x for the 96 KB tile, 1 x 832 x 12288 1.05x
      against 0.88x stream-K; 1 x 512 x 32768 (64 CTAs, 512 KB each) 0.63x, stream-K 0.88x.
    - FILL (64-column 96 KB tiles, two CTAs an SM) at the largest split whose CTAs all fit the
      resident slots, where they fill FILL_AT of them (FILL_AT_4 at a split of 4-8): 1 x 7168 x
      18432 split 2 (224 CTAs) 65.1 us, against 70.0 for the cluster pick's 112 CTAs and 70.1
      stream-K; 1 x 3584 x 8192 split 4 (224) 1.05x cuBLAS, stream-K 0.95x.
    - CTAs streaming under MIN_PART bytes of B stay (stream-K's fixed cost does not pay).
    - Else stream-K: the WIDE tile where its grid is two CTAs on every SM, else the narrow one
      (one 192 KB CTA an SM; the WIDE tile's grid would shrink to one 96 KB CTA an SM). 1 x 5120
      x 8192: 80 cluster CTAs 33.2 us, stream-K 26.2; 1 x 2048 x 8192 17.7 (split 4) against
      14.9; 1 x 1024 x 8192 11.2 (split 8) against 10.6; cuBLAS 26.0, 13.6, 10.5.
    (H200, bf16, B row-major, gemm_tc.py --sweep-set splitk; docs/performance.md, "Session 24".)"""
    cfg = _choose_cluster(m, n, k, in_dtype, out_dtype, b_kmajor, sms)
    if m > DECODE_M:
        return cfg
    tiles = _tiles(m, n, cfg.bn)
    if (cfg.bn, cfg.bk, cfg.stages, cfg.split) == (*WIDE, 1):
        if tiles >= STREAMK_BELOW * sms * resident_per_sm(cfg) or k < STREAMK_MIN_KB * cfg.bk:
            return cfg
        return _streamk_or(cfg, Config(in_dtype, out_dtype, *STREAMK, 1, b_kmajor, True), n, k, sms)
    ctas = tiles * cfg.split
    if cfg.split <= 2 and BALANCED * sms <= ctas <= sms:
        return cfg
    deep8 = Config(in_dtype, out_dtype, 64, *DEEP_8, 8, b_kmajor)
    if cfg.split == 8 and cfg.bn == 64 and tiles <= resident_clusters(deep8, sms):
        if ctas >= DEEP_8_SMS * sms or part_bytes(k, deep8) < 2 * MIN_PART:
            return deep8
        cfg = deep8
    fill = _fill_config(m, n, k, in_dtype, out_dtype, b_kmajor, sms)
    if fill is not None:
        share = _tiles(m, n, fill.bn) * fill.split / (sms * resident_per_sm(fill))
        if share >= FILL_AT or (share >= FILL_AT_4 and fill.split >= 4):
            return fill
    if part_bytes(k, cfg) < MIN_PART:
        return cfg
    wide = Config(in_dtype, out_dtype, *STREAMK, 1, b_kmajor, True)
    narrow = Config(in_dtype, out_dtype, *STREAMK_NARROW, 1, b_kmajor, True)
    full = streamk_grid(n, k, wide, sms) == sms * resident_per_sm(wide)
    return _streamk_or(cfg, wide if full else narrow, n, k, sms)


def _fill_config(m: int, n: int, k: int, in_dtype: str, out_dtype: str, b_kmajor: bool,
                 sms: int) -> Optional[Config]:
    """FILL's tiles at the largest split of 2, 4 or 8 whose CTAs all fit the resident slots (and
    the clusters of 4 or 8 their GPCs), each CTA running 4 K blocks or more; None if none does."""
    best = None
    for split in (2, 4, 8):
        cfg = Config(in_dtype, out_dtype, *FILL, split, b_kmajor)
        tiles = _tiles(m, n, cfg.bn)
        if tiles <= resident_clusters(cfg, sms) and k >= 4 * split * cfg.bk:
            best = cfg
    return best


def _streamk_or(cfg: Config, sk: Config, n: int, k: int, sms: int) -> Config:
    """sk, unless its units x grid would overflow the kernel's int32 unit arithmetic."""
    return sk if streamk_units(n, k, sk) * streamk_grid(n, k, sk, sms) < 2 ** 31 else cfg


def _choose_cluster(m: int, n: int, k: int, in_dtype: str, out_dtype: str, b_kmajor: bool,
                    sms: int = H200_SMS) -> Config:
    """A 128-column tile for every SM or more: WIDE, unsplit (two CTAs an SM: one wave up to twice
    the SMs). Else BN 64 while its tiles fit one wave, else 128; then the largest split that keeps
    tiles * split within the SMs and at least 4 K blocks per CTA. At decode M, 64-column tiles
    left unsplit become 128-column ones split in two: the same CTAs, each reading 256-byte rows of
    B over half of K (1 x 8192 x 28672: 1.02x cuBLAS against 0.95x, docs/performance.md). At decode
    M a split of 4 becomes 8 where its 8-CTA clusters fit the GPCs (resident_clusters): 1 x 1536 x 7168
    ran 0.98x cuBLAS split 8 against 0.82x split 4 (H200, gemm_tc.py --sweep-set splitk). At decode
    M a 64-column split of 2 becomes 128 columns split 8 where those CTAs are at most OVERFILL per
    SM (two resident), else 256-deep K tiles: 1 x 2560 / 3072 x 8192 ran 17.1 / 18.1 us against
    22.1 / 22.2 us, 1 x 4096 x 14336 34.3 us against 36.3, and split 8 at 1 x 4096 (256 CTAs) 50 us
    (docs/performance.md, "Session 22")."""
    if _tiles(m, n, 128) >= sms:
        return Config(in_dtype, out_dtype, *WIDE, 1, b_kmajor)
    bn = 64 if _tiles(m, n, 64) <= sms else 128
    tiles = _tiles(m, n, bn)
    split = 1
    while split < SPLITS[-1]:
        s = 2 * split
        if tiles * s > sms or k < 4 * s * _tile(bn, s)[0]:
            break
        split = s
    if m <= DECODE_M and bn == 64 and split == 1 and 2 * _tiles(m, n, 128) <= sms and k >= 8 * _tile(128, 2)[0]:
        bn, split = 128, 2
    if m <= DECODE_M and split == 4 and k >= 4 * 8 * _tile(bn, 8)[0] and tiles <= resident_clusters(
            Config(in_dtype, out_dtype, bn, *_tile(bn, 8), 8, b_kmajor), sms):
        split = 8       # the second resident CTA of each SM: decode CTAs wait on B's latency
    if m <= DECODE_M and bn == 64 and split == 2:
        wide8 = Config(in_dtype, out_dtype, 128, *_tile(128, 8), 8, b_kmajor)
        if k >= 4 * 8 * wide8.bk and _tiles(m, n, 128) * 8 <= min(OVERFILL, resident_per_sm(wide8)) * sms:
            return wide8
        if k >= 4 * 2 * DEEP[0]:
            return Config(in_dtype, out_dtype, 64, *DEEP, 2, b_kmajor)
    return Config(in_dtype, out_dtype, bn, *_tile(bn, split), split, b_kmajor)


def tune_configs(in_dtype: str, out_dtype: str, b_kmajor: bool) -> List[Config]:
    cfgs = [Config(in_dtype, out_dtype, bn, bk, st, s, b_kmajor) for bn, bk, st in TUNE for s in SPLITS]
    cfgs += [Config(in_dtype, out_dtype, bn, bk, st, 1, b_kmajor, True) for bn, bk, st in STREAMK_TUNE]
    return [c for c in cfgs if c.smem_bytes() <= SMEM_LIMIT]


def gluon_entries(arch: str = "sm_90a", tune: bool = False) -> List[str]:
    """sm_90a: {fp16, bf16} in x {same, fp32} out x B {N-major, K-major} x every (tile, split) the
    policy can pick: 14 each, 112 in all (tune=True: every TUNE tile at every split and every
    STREAMK_TUNE tile); none for other archs."""
    if arch != "sm_90a":
        return []
    keys = []
    for i in IN_DTYPES:
        for o in (i, "float32"):
            for bk in (False, True):
                if tune:
                    keys += [c.key for c in tune_configs(i, o, bk)]
                else:
                    keys += [Config(i, o, bn, *_tile(bn, s), s, bk).key for bn in TILES for s in SPLITS]
                    keys += [Config(i, o, *WIDE, 1, bk).key, Config(i, o, 64, *DEEP, 2, bk).key,
                             Config(i, o, *FILL, 2, bk).key, Config(i, o, 64, *DEEP_8, 8, bk).key,
                             Config(i, o, *STREAMK, 1, bk, True).key,
                             Config(i, o, *STREAMK_NARROW, 1, bk, True).key]
    return keys


# ----------------------------------------------------------------------------------------------
# The kernel protocol (kernels/_common.py)
# ----------------------------------------------------------------------------------------------

def cluster_capacity(cfg: Config, device: int = 0) -> int:
    """Clusters of this config the device holds at once (cuOccupancyMaxActiveClusters on the
    loaded cubin: a cluster must fit in one GPC)."""
    entry = gluon_cache.lookup(cfg.key)
    launcher = launch.get_launcher(entry.cubin, entry.meta, device)
    config = driver.launch_config(32 * WARPS, launcher.shared, cfg.split)
    config.gridDimX = cfg.split * 1024
    return driver.max_active_clusters(launcher._func, config, device)


class GluonSplitkSm90(PointerGemm):
    name = NAME
    ops = ("gemm",)
    backend = "gluon"

    def supports(self, problem) -> Optional[str]:
        why = sm90_half_gemm_reason(problem)
        if why:
            return why
        a, b, ep = problem.a, problem.b, problem.epilogue
        if ep.reads_c:
            return "beta/C epilogue is not supported"
        if ep.out_majorness != ROW or ep.out_alignment < 16:
            return "writes a row-major, 16-byte aligned result only (out= is not)"
        m, n, k = problem.m, problem.n, problem.k
        if m > BM:
            return f"M = {m} > {BM}: the tiled kernels fill the GPU there"
        sms = sm_count(problem.device.index)
        if k < 1024 and (k < 4 * WIDE[1] or _tiles(m, n, 128) < sms):
            # a 128-column tile for every SM runs unsplit (WIDE): it serves any K of 4 blocks or more
            return f"K = {k} < 1024: too little K to split (the tiled kernels serve)"
        if min(m, n, k) < 1 or max(m, n, k) >= 2 ** 31:
            return f"shape {m}x{n}x{k} out of range"
        if a.majorness != ROW or b.majorness not in (ROW, COL):
            return "A must be ROW (K-major) and B ROW or COL"
        if n % 8 or k % 8 or a.alignment < 16 or b.alignment < 16:
            return "16-byte cp.async vectors need N and K multiples of 8 and 16-byte aligned A and B"
        cfg = choose(m, n, k, a.dtype, ep.out_dtype, b.majorness == COL, sms)
        return gluon_cache.available(cfg.key)

    @staticmethod
    def _dtypes_of(problem) -> Tuple[str, str, bool]:
        i = problem.a.dtype if problem.a.dtype in IN_DTYPES else "bfloat16"
        o = problem.epilogue.out_dtype
        return i, (o if o in (i, "float32") else "float32"), problem.b.majorness == COL

    def policy(self, problem) -> Policy:
        sms = sm_count(problem.device.index)
        cfg = choose(problem.m, problem.n, problem.k, *self._dtypes_of(problem), sms=sms)
        pol = policy_of(cfg)
        if cfg.streamk:
            grid = streamk_grid(problem.n, problem.k, cfg, sms)
            note = (f"{min(1.0, grid / sms):.0%} of SMs busy: {grid} CTAs share "
                    f"{streamk_units(problem.n, problem.k, cfg)} units")
        else:
            note = f"{sm_fill(problem.m, problem.n, cfg, sms):.0%} of SMs busy"
        return dataclasses.replace(pol, notes=pol.notes + (note,))

    def candidate_policies(self, problem) -> List[Policy]:
        """Every TUNE tile at every split and every STREAMK_TUNE tile (benchmarks/gemm_tc.py
        --sweep-set splitk times them)."""
        return [policy_of(c) for c in tune_configs(*self._dtypes_of(problem))]

    # -- run / bind: PointerGemm around _resolve --------------------------------------------------
    def run(self, problem, policy, operands, out, stream) -> None:
        """Stream-K takes its workspace and flags for this stream (runtime/workspace.py); where
        they cannot be had (a graph capture before the stream's first run) the cluster split runs."""
        cfg = config_of(policy, operands[0].dtype, out.dtype, problem.b.majorness == COL)
        if not cfg.streamk:
            return super().run(problem, policy, operands, out, stream)
        launcher, grid, args = self._resolve(problem, policy, operands[0], operands[1], out)
        buffers = workspace.split_k(problem.device, stream, *streamk_workspace(problem.m, problem.n, cfg, grid))
        if buffers is None:
            cluster = _choose_cluster(problem.m, problem.n, problem.k, *self._dtypes_of(problem),
                                      sms=sm_count(problem.device.index))
            return super().run(problem, policy_of(cluster), operands, out, stream)
        launcher(grid, stream, operands[0].ptr, operands[1].ptr, out.ptr, buffers[0].ptr, buffers[1].ptr, *args)

    def bind(self, problem, policy, operands, out):
        if policy.schedule:
            return None                 # run() per call: stream-K's buffers are the stream's
        return super().bind(problem, policy, operands, out)

    def _resolve(self, problem, policy, a, b, out):
        """(launcher, clusters or CTAs, the scalar args after the three pointers, or after the
        workspace and flags of stream-K)."""
        cfg = config_of(policy, a.dtype, out.dtype, problem.b.majorness == COL)
        m, n, k = problem.m, problem.n, problem.k
        strides = (a.strides[-2], b_leading_stride(b.strides, cfg.b_kmajor), out.strides[-2])
        if a.strides[-1] != 1 or (b.strides[-2] if cfg.b_kmajor else b.strides[-1]) != 1 or out.strides[-1] != 1 \
                or any(s % 8 for s in strides) or (a.ptr | b.ptr | out.ptr) & 15:
            raise ValueError(f"{NAME}: A {a.strides}, B {b.strides}, out {out.strides} (16-byte bases "
                             f"{a.ptr & 15 == 0}/{b.ptr & 15 == 0}/{out.ptr & 15 == 0}): needs unit inner strides, "
                             f"leading strides multiples of 8 and 16-byte aligned bases")
        launcher = self._launcher(cfg, a.device.index)
        grid = streamk_grid(n, k, cfg, sm_count(a.device.index)) if cfg.streamk else _tiles(m, n, cfg.bn)
        return launcher, grid, (m, n, k, *strides, float(problem.epilogue.alpha))

    # -- jax.jit -----------------------------------------------------------------------------------
    def jax_lowering(self, problem, policy, *, portable: bool = False, sm_margin: int = 0):
        """The same cubin under jit: xgemm/ffi's handler launches it on XLA's stream (the cubin
        travels in the module, so an export keeps it)."""
        cfg = config_of(policy, problem.a.dtype, problem.epilogue.out_dtype, problem.b.majorness == COL)
        entry = gluon_cache.lookup(cfg.key)
        P = Param
        m, n, k = problem.m, problem.n, problem.k
        scalars = (P.i32(m), P.i32(n), P.i32(k), P.i64(problem.a.strides[-2]),
                   P.i64(b_leading_stride(problem.b.strides, cfg.b_kmajor)), P.i64(n),
                   P.f32(float(problem.epilogue.alpha)))
        if not cfg.streamk:
            return triton_launch(entry.cubin, entry.meta, _tiles(m, n, cfg.bn), (P.input(0), P.input(1), P.output(0),
                                                                                  *scalars))
        # stream-K: its workspace is XLA scratch, its flags zeros passed after a, b
        grid = streamk_grid(n, k, cfg, sm_count(problem.device.index) - sm_margin)
        elems, flags = streamk_workspace(m, n, cfg, grid)
        return triton_launch(entry.cubin, entry.meta, grid, (P.input(0), P.input(1), P.output(0), P.scratch(0),
                                                             P.input(2), *scalars),
                             scratch_bytes=(4 * elems,), zeroed=(flags,))

    def prebuild(self, arch: str):
        return gluon_entries(arch)


def policy_of(cfg: Config) -> Policy:
    if cfg.streamk:
        return Policy(tile=(BM, cfg.bn, cfg.bk), stages=cfg.stages, warps=WARPS, schedule="stream-k",
                      notes=("partial tiles summed through a global workspace",))
    return Policy(tile=(BM, cfg.bn, cfg.bk), stages=cfg.stages, cluster=(cfg.split, 1), warps=WARPS,
                  split_k=cfg.split, notes=("split-K over the cluster (DSMEM sum)",))


def config_of(policy: Policy, in_dtype: str, out_dtype: str, b_kmajor: bool) -> Config:
    _, bn, bk = policy.tile
    return Config(in_dtype, out_dtype, bn, bk, policy.stages, policy.split_k, b_kmajor, policy.schedule == "stream-k")


KERNEL = GluonSplitkSm90()
KERNELS = (KERNEL,)
