"""cute_gemm_sm90's configs and its policy: the table of rows tuned on the H200, the wave model
that picks among a row's candidates, and the transposed run for row-major A and B.

Its own file so that re-tuning the policy does not change the kernel's source, whose hash names
the disk cache of compiled classes (xgemm/runtime/cute_cache.fingerprint): a policy edit keeps
every compiled class. What a Config means on the device is the kernel's (cute_gemm_sm90_build.py).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from xgemm.core.fp8_checks import PROMOTE_NOTE
from xgemm.core.problem import ROW, Policy


MAX_SPLIT = 8            # split-K parts a tile (Config.split)


@dataclass(frozen=True)
class Config:
    """One compiled kernel shape: what a Policy means for this kernel."""
    tile_m: int = 128
    tile_n: int = 192
    cluster_m: int = 2
    cluster_n: int = 1
    pingpong: bool = True
    raster_m: bool = True        # walk clusters along M first (within a swizzle band of N)
    swizzle: int = 8             # band width, in clusters, for L2 reuse
    stages: int = 0              # A/B pipeline depth; 0 = as many as fit in shared memory
    # a tile's first wgmmas overwrite the accumulators (ACCUMULATE off) instead of a zero fill
    # (192 register moves per thread per 128x192 tile)
    zero_init: bool = True
    # split-K: each output tile's K is cut in `split` equal runs of k-tiles, run as separate work
    # units; the last unit of a tile adds the others' float32 partial sums (left in a workspace)
    # before its epilogue (cute_gemm_sm90_build.py, Design)
    split: int = 1

    def policy(self, why: str = "", swap: bool = False) -> Policy:
        """This config as a Policy; swap: run on the transposed problem (SWAP_NOTE)."""
        notes = ("pingpong" if self.pingpong else "cooperative", f"swizzle {self.swizzle}")
        if not self.zero_init:
            notes += ("filled accumulators",)
        if swap:
            notes += (SWAP_NOTE,)
        if why:
            notes += (why,)
        return Policy(tile=(self.tile_m, self.tile_n, 64), stages=self.stages,
                      cluster=(self.cluster_m, self.cluster_n), warps=12, split_k=self.split,
                      raster="m" if self.raster_m else "n", notes=notes)

    @staticmethod
    def from_policy(policy: Policy) -> Config:
        notes = policy.notes
        swizzle = next((int(s.split()[1]) for s in notes if s.startswith("swizzle ")), 1)
        return Config(tile_m=policy.tile[0], tile_n=policy.tile[1], cluster_m=policy.cluster[0],
                      cluster_n=policy.cluster[1], pingpong="pingpong" in notes,
                      raster_m=policy.raster != "n", swizzle=swizzle, stages=policy.stages,
                      zero_init="filled accumulators" not in notes, split=policy.split_k)

    def check(self) -> None:
        """Raise ValueError for a config this kernel cannot build (before any compile)."""
        if self.pingpong:
            if self.tile_m != 128 or self.tile_n % 32 or not 32 <= self.tile_n <= 192:
                raise ValueError(f"pingpong needs tile 128 x N with N % 32 == 0, N <= 192: {self}")
        else:
            if self.tile_m not in (128, 256) or self.tile_n % 32 or not 32 <= self.tile_n <= 256:
                raise ValueError(f"cooperative needs tile (128|256) x N, N % 32 == 0, N <= 256: {self}")
            if self.tile_m * self.tile_n // 256 > 240 - 40:   # fp32 accumulators per thread
                raise ValueError(f"tile {self.tile_m}x{self.tile_n} needs too many registers")
        if (self.cluster_m, self.cluster_n) not in ((1, 1), (2, 1), (1, 2)):
            raise ValueError(f"cluster must be 1x1, 2x1 or 1x2: {self}")
        if not 1 <= self.split <= MAX_SPLIT:
            raise ValueError(f"split must be 1..{MAX_SPLIT}: {self}")


# The policy table (H200, 132 SMs). Rows are tried in order; the first whose predicate holds
# wins. Tuned with `benchmarks/gemm_tc.py --sweep` (bf16; every candidate timed in one process
# with cuBLAS and quack); what each row measured is in docs/performance.md,
# "xgemm/kernels/cute_gemm_sm90.py".
#   skinny M  M <= 3072, N and K large: pingpong 128x128, cluster 2x1 (more, fuller waves than 128x192).
#   skinny N  the mirror image (cluster along M still, raster along N); by symmetry, not timed.
#   mid       max(M, N) <= 6144: pingpong 128x128, cluster 2x1.
#   large     M, N >= 4096: pingpong 128x192, cluster 2x1, raster along N, swizzle 8; pingpong
#             hides the epilogue under the other warpgroup's mainloop, which matters at short K.
#   medium    at least 120 tiles of 128x128 (~ a wave): pingpong 128x128, cluster 2x1 (1x2 or 128x64
#             without a cluster where those fill the waves a quarter better; see below).
#   small     fewer tiles: pingpong 128x64, no cluster, so more SMs get work.
# Raster along N with swizzle 8 = bands of 8 clusters (2048 rows of A) that sweep across N, so
# the band of A stays in the 60 MB L2 while B streams past (quack's default order, too).
# The mid and large rows hold candidates, the row's tuned config first: the one whose waves are
# best filled wins (wave_efficiency; ties keep the earlier). Whole tiles at the ragged edges and
# a part-filled last wave of clusters cost as much as full ones, and the candidates ran at the
# same rate per tile, so the predicted fill decides (e.g. 4224x8192x8192 takes 128x128 1x2: 33 M
# tiles would leave half a 2x1 cluster empty). The skinny rows choose among the same candidates.
# The medium row also weighs its cluster's other orientation and the small row's tile: a 2x1
# cluster over a single M tile (decode, attention heads of 64 rows) leaves every second SM idle.
# Those alternatives are not timed on the medium row's shapes yet, so one replaces the tuned
# config only when it predicts a quarter more useful work (ROW_MARGIN), not the 2% of timed rows.
# Not modelled: rows 16- but not 128-byte aligned (5000^3) run slower for every candidate.
_MID_LARGE = (Config(128, 128, 2, 1, True, True, 8), Config(128, 128, 1, 2, True, False, 8),
              Config(128, 192, 2, 1, True, False, 8), Config(128, 192, 1, 2, True, False, 8))
POLICY_TABLE = (
    ("skinny M", lambda m, n, k, l: m <= 3072 and n >= 4096 and k >= 1024
     and _tiles(m, n, l, 128, 128) >= 264, _MID_LARGE),
    ("skinny N", lambda m, n, k, l: n <= 3072 and m >= 4096 and k >= 1024
     and _tiles(m, n, l, 128, 128) >= 264, (Config(128, 128, 2, 1, True, False, 8),) + _MID_LARGE[1:]),
    ("mid", lambda m, n, k, l: max(m, n) <= 6144 and _tiles(m, n, l, 128, 256) >= 132, _MID_LARGE),
    ("large", lambda m, n, k, l: m >= 4096 and n >= 4096,
     (_MID_LARGE[2], _MID_LARGE[3], _MID_LARGE[0], _MID_LARGE[1])),
    ("medium", lambda m, n, k, l: _tiles(m, n, l, 128, 128) >= 120,
     (Config(128, 128, 2, 1, True, True, 8), _MID_LARGE[1], Config(128, 64, 1, 1, True, True, 1))),
    ("small", lambda m, n, k, l: True,
     (Config(128, 64, 1, 1, True, True, 1),)),
)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _tiles(m: int, n: int, l: int, tm: int, tn: int) -> int:
    return _ceil_div(m, tm) * _ceil_div(n, tn) * l


# Another candidate replaces the row's tuned config only when its waves are this much fuller:
# per tile, 128x128 ran 1-3% off 128x192 in the sweep, so a smaller predicted gain is noise.
WAVE_MARGIN = 1.02
ROW_MARGIN = {"medium": 1.25}


def _grid(m: int, n: int, l: int, cfg: Config, sms: int) -> tuple[int, int, int]:
    """(tiles, SM slots per wave, waves) of this config's persistent grid; a split-K config runs
    `split` work units per tile."""
    resident = sms // (cfg.cluster_m * cfg.cluster_n)
    cluster_tiles = (_ceil_div(_ceil_div(m, cfg.tile_m), cfg.cluster_m)
                     * _ceil_div(_ceil_div(n, cfg.tile_n), cfg.cluster_n) * l)
    return (_tiles(m, n, l, cfg.tile_m, cfg.tile_n) * cfg.split, resident * cfg.cluster_m * cfg.cluster_n,
            _ceil_div(cluster_tiles * cfg.split, resident))


def k_parts(k: int, cfg: Config) -> int:
    """k-tiles (64 deep) a work unit runs: all of K, or one of `split` equal parts (the last part's
    k-tiles past K are zero fill)."""
    return _ceil_div(_ceil_div(k, 64), cfg.split)


def wave_efficiency(m: int, n: int, l: int, cfg: Config, sms: int = 132, k: int = 64) -> float:
    """The share of the tile work a persistent grid of this config does that is the problem's:
    M x N x L over every wave it runs at full width (edge tiles and the last wave count whole); for
    a split-K config, times the share of its units' k-tiles inside K."""
    _, slots, waves = _grid(m, n, l, cfg, sms)
    kt = _ceil_div(k, 64)
    return m * n * l * kt / (waves * slots * cfg.tile_m * cfg.tile_n * k_parts(k, cfg))


def slot_fill(m: int, n: int, l: int, cfg: Config, sms: int = 132) -> float:
    """The share of the SM slots over all waves that hold one of the problem's tiles (a cluster's
    CTAs past the edge and the last wave's empty slots count idle). wave_efficiency is this times
    the share of each tile's area inside the problem, which for M below the tile (decode) no
    config raises: there the slots decide how much of the GPU streams B."""
    tiles, slots, waves = _grid(m, n, l, cfg, sms)
    return tiles / (waves * slots)


# Split-K (Config.split) where a few output tiles run a long K: the tiles' k-tiles are cut into
# parts run as separate units, so that more SMs share them. What a pick costs is predicted as its
# waves x the k-tiles a unit runs, in k-steps of a 128 x 192 tile at the rate per area each tile
# width ran (H200: 4096 x 576 x 7168 took 90 us in three waves of 128 x 64 tiles, quack 63 us in
# one of 128 x 192, model_shapes.py; 128 x 128 ran 1-3% off 128 x 192, gemm_tc.py --sweep), plus
# SPLIT_PER_PART steps a wave for each part the last one adds and SPLIT_FIXED once (a wave's
# fixup hides under the next wave's mainloop): fitted to 72 timed configs, 128 x 64/128/192
# tiles split 1-8 on six shapes (gemm_tc.py --sweep-set cutesplit, docs/performance.md
# "Session 22"; times within 15% rms). The row's pick is replaced only by a candidate, split or
# the split tiles unsplit, predicted SPLIT_GAIN faster, each part at least SPLIT_MIN_K_TILES deep.
TILE_RATE = {64: 0.7, 96: 0.85, 128: 0.97, 160: 0.89}
SPLIT_FIXED = 14.5
SPLIT_PER_PART = 2.25
SPLIT_GAIN = 1.1
SPLIT_MIN_K_TILES = 8
_SPLIT_TILES = (Config(128, 192, 2, 1, True, True, 8), Config(128, 160, 2, 1, True, True, 8),
                Config(128, 128, 2, 1, True, True, 8))


def predicted_steps(m: int, n: int, k: int, l: int, cfg: Config, sms: int = 132) -> float:
    """The modelled time of a config (above), in k-steps of a 128 x 192 tile."""
    _, _, waves = _grid(m, n, l, cfg, sms)
    rate = TILE_RATE.get(cfg.tile_n, 1.0) * cfg.tile_m / 128 if cfg.tile_m < 128 else TILE_RATE.get(cfg.tile_n, 1.0)
    steps = waves * (k_parts(k, cfg) + SPLIT_PER_PART * (cfg.split - 1)) + (SPLIT_FIXED if cfg.split > 1 else 0)
    return steps * cfg.tile_m * cfg.tile_n / (128 * 192) / rate


def _split_pick(m: int, n: int, k: int, l: int, cfg: Config, cfgs) -> Config:
    """The row's pick, or a split-K config predicted SPLIT_GAIN faster (above)."""
    kt = _ceil_div(k, 64)
    if kt < 2 * SPLIT_MIN_K_TILES:
        return cfg
    base = predicted_steps(m, n, k, l, cfg)
    best, best_steps = cfg, base / SPLIT_GAIN
    for c in tuple(cfgs) + _SPLIT_TILES:
        for split in range(1 if c in _SPLIT_TILES else 2, MAX_SPLIT + 1):
            if _ceil_div(kt, split) < SPLIT_MIN_K_TILES:
                break
            cand = dataclasses.replace(c, split=split)
            steps = predicted_steps(m, n, k, l, cand)
            if steps < best_steps:
                best, best_steps = cand, steps
    return best


def choose_config(m: int, n: int, k: int, l: int) -> tuple[str, Config]:
    """(the row's name with the pick's predicted waves, the config): the row's tuned config unless
    another candidate's waves are fuller by the row's margin; split-K where it is predicted to pay."""
    for name, pred, cfgs in POLICY_TABLE:
        if pred(m, n, k, l):
            eff = [wave_efficiency(m, n, l, c) for c in cfgs]
            best = max(range(len(cfgs)), key=eff.__getitem__)               # the first of equals
            if eff[best] < ROW_MARGIN.get(name, WAVE_MARGIN) * eff[0]:
                best = 0            # within the model's error of the row's tuned config
            cfg = _split_pick(m, n, k, l, cfgs[best], cfgs)
            fill = slot_fill(m, n, l, cfg)
            waves = wave_efficiency(m, n, l, cfg, k=k)
            return f"{name}, waves {waves:.0%} full ({fill:.0%} of SM slots busy)", cfg
    raise AssertionError("the last policy row accepts every problem")


def unsplit(policy: Policy) -> Policy:
    """The policy without split-K (for a problem the split classes do not serve: C, a fused epilogue)."""
    return dataclasses.replace(policy, split_k=1)


# A policy with this note runs the transposed problem D^T = B^T @ A^T (+ C^T) on the operands'
# transposed views (no copy): the kernel's A is B^T, its B is A^T, M and N exchange, and the
# config is the one chosen for the (N, M) problem. With A and B both row-major (torch's, JAX's
# and NumPy's default) that makes the kernel's A M-major, its B K-major and D M-major, which ran
# ~1% faster than the untransposed run on nearly every shape of the wave-aware rows. The medium
# and small rows stay untransposed, and so does a K below SWAP_MIN_K, where D's stores are most
# of the work and the transposed run only ties (docs/performance.md has each shape's figures).
# Other majorness combinations are not measured and run as given.
SWAP_NOTE = "D^T = B^T A^T"
SWAP_ROWS = ("skinny M", "skinny N", "mid", "large")
SWAP_MIN_K = 512


def swapped(policy: Policy) -> bool:
    return SWAP_NOTE in policy.notes


def row_of(m: int, n: int, k: int, l: int) -> str:
    return next(name for name, pred, _ in POLICY_TABLE if pred(m, n, k, l))


# A gated tile's gate half must be a whole number of 64-column (128-byte) rows: TMA loads each
# half of a row-major [gate | up] B in 128-byte swizzled rows, and CuTe-DSL aborts the process
# building a 96-column half's TMA atom (128x192; an H100 run of 2026-12-07, dense and grouped)
GATE_HALF_STEP = 64


def gate_half_fits(h: int, tile_n: int) -> bool:
    """A gated tile of tile_n columns serves H: its gate half divides H and is whole 128-byte rows."""
    half = tile_n // 2
    return half % GATE_HALF_STEP == 0 and h % half == 0


def choose_gated_policy(m: int, h: int, k: int, l: int) -> Policy:
    """The policy of a gated product act(A @ gate) * (A @ up), B = [gate | up] with 2H columns: never
    transposed (its epilogue pairs B's columns), tiled as the plain product over 2H columns, with a
    tile whose gate half (tile_n / 2 columns) divides H and is a multiple of GATE_HALF_STEP, else
    128 wide (the kernel declines an H that 64 does not divide). Never narrower than 128: a 64-wide tile's gate
    half is 32 columns, 64 bytes of a row-major B, less than the 128-byte swizzled row its TMA box
    fills (the H200 run of 2026-12-02: an illegal address at 1000 x 1536 x 264, tile 128 x 64)."""
    why, cfg = choose_config(m, 2 * h, k, l)
    if cfg.tile_n < 128:
        cfg = dataclasses.replace(cfg, tile_n=128)
        why += "; tile_n 128: a gated tile's gate half fills a 128-byte row"
    elif cfg.tile_n != 128 and not gate_half_fits(h, cfg.tile_n):
        cfg = dataclasses.replace(cfg, tile_n=128)
        why += f"; tile_n 128: a gate half of whole 128-byte rows dividing H = {h}"
    return cfg.policy(why)


def choose_fp8_promoted_policy(m: int, n: int, k: int, l: int) -> Policy:
    """An FP8 class that promotes its k-tile sums holds two float32 accumulators: cooperative
    tiles 128 rows tall, the cluster, raster and swizzle of the plain product's row. 128x192 (96
    registers each a thread) unless its waves are emptier than 128x128's by the wave margin: its
    warpgroups' wgmmas in turn ran 1-3% faster than 128x128 at the benchmark shapes (H200,
    docs/performance.md); with block scales (two blocks of B's scales a 192-wide tile) 5-8% on an
    H100."""
    why, cfg = choose_config(m, n, k, l)
    cfg = dataclasses.replace(cfg, tile_m=128, tile_n=128, pingpong=False)
    wide = dataclasses.replace(cfg, tile_n=192)
    if wave_efficiency(m, n, l, wide) * WAVE_MARGIN >= wave_efficiency(m, n, l, cfg):
        cfg = wide
    pol = cfg.policy(why + f"; cooperative 128x{cfg.tile_n}: two float32 accumulators")
    return dataclasses.replace(pol, notes=pol.notes + (PROMOTE_NOTE,))


def choose_policy(m: int, n: int, k: int, l: int, a_major: str, b_major: str) -> Policy:
    """The policy for D = A @ B given the operands' majorness (ROW: last dim contiguous)."""
    if a_major == ROW and b_major == ROW and k >= SWAP_MIN_K and row_of(m, n, k, l) in SWAP_ROWS:
        why, cfg = choose_config(n, m, k, l)
        return cfg.policy(why, swap=True)
    why, cfg = choose_config(m, n, k, l)
    return cfg.policy(why)


# The grouped class (cute_gemm_sm90_build's Design: the rows mode of grouped_mm / ragged_dot). The
# first candidate ran best on both of issue 23's cases (H100, 2026-12-06, benchmarks/grouped.py:
# docs/performance.md), and the sizes stay on the device, so what a pick can know is the mean
# group size T / E. At that size each group's last row of tiles is part-filled (a 2x1 class folds
# a last cluster row of at most tile_m rows, so its groups cost rows in steps of tile_m as a 1x2
# class's do); another candidate replaces the first only where its tiles are fuller by
# GROUPED_MARGIN, not for the few percent the fill moves between candidates on the timed cases,
# where the fuller 128x128 tiles ran slower. The last, cooperative 128x256 2x1 (as full as 128x128 on
# both cases), ran within 2% of the first on an H100, either side (session 39).
GROUPED_CONFIGS = (Config(128, 192, 2, 1, True, False, 8), Config(128, 192, 1, 2, True, False, 8),
                   Config(128, 128, 2, 1, True, False, 8), Config(128, 128, 1, 2, True, False, 8),
                   Config(128, 256, 1, 2, False, False, 8), Config(256, 128, 2, 1, False, False, 8),
                   Config(128, 256, 2, 1, False, False, 8))


def group_tiles(rows: int, n: int, cfg: Config) -> int:
    """The CTA tiles the grouped class runs for one group of `rows` rows: its cluster rows of tiles
    across N, a 2x1 class's last cluster row of at most tile_m rows folded into one row of tiles
    (the build's _group_window and _cluster_rows)."""
    if rows <= 0:
        return 0
    cols = _ceil_div(n, cfg.tile_n * cfg.cluster_n)
    block = cfg.tile_m * cfg.cluster_m
    blocks_m = _ceil_div(rows, block)
    folded = int((cfg.cluster_m, cfg.cluster_n) == (2, 1) and rows - (blocks_m - 1) * block <= cfg.tile_m)
    return ((blocks_m - folded) * cols + folded * _ceil_div(cols, 2)) * cfg.cluster_m * cfg.cluster_n


def grouped_fill(rows: int, n: int, groups: int, cfg: Config) -> float:
    """The share of the grouped class's tile area that is the problem's, groups at the mean size."""
    mean = max(rows / groups, 1.0)
    return mean * n / (group_tiles(int(math.ceil(mean)), n, cfg) * cfg.tile_m * cfg.tile_n)


def grouped_fill_of(sizes, n: int, cfg: Config) -> float:
    """The same at known group sizes (benchmarks, explain-style diagnostics; a pick never knows them)."""
    tiles = sum(group_tiles(int(s), n, cfg) for s in sizes)
    return sum(int(s) for s in sizes) * n / max(tiles * cfg.tile_m * cfg.tile_n, 1)


GROUPED_MARGIN = 1.25

# The gated grouped class (an expert's [gate | up] projection, the gate fused into the epilogue):
# a tile's gate half (tile_n / 2 columns) must divide H and be a whole number of 128-byte rows
# (GATE_HALF_STEP: no 128x192). The first that divides H serves: pingpong 128x128 2x1 ran 1.045x
# the cooperative 128x256 2x1 at the uneven case's swiglu (H = 3584, torch's K-major weights;
# an H100, 2026-12-07), and serves any H that is a multiple of 64.
GATED_GROUPED_CONFIGS = (GROUPED_CONFIGS[2], Config(128, 256, 2, 1, False, False, 8))


def choose_gated_grouped_config(h: int, cfgs=GATED_GROUPED_CONFIGS) -> Config:
    """The first config whose gate half fits H (gate_half_fits; the first one where none does: the
    kernel then declines)."""
    return next((c for c in cfgs if gate_half_fits(h, c.tile_n)), cfgs[0])


def choose_grouped_config(rows: int, n: int, groups: int, cfgs=GROUPED_CONFIGS) -> Config:
    best = cfgs[0]
    for cfg in cfgs[1:]:
        if grouped_fill(rows, n, groups, cfg) > GROUPED_MARGIN * grouped_fill(rows, n, groups, best):
            best = cfg
    return best
