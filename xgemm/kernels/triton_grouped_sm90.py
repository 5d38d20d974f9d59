"""triton_grouped_sm90: the grouped (ragged) GEMMs of mixture-of-experts layers, written in Triton,
persistent, with TMA descriptors made on the device per group; prebuilt to cubins like the Gluon kernels.

Contract
  op        "grouped" (xgemm/grouped.py): with `ends` the groups' end offsets (cumulative, int32,
            on the device, never read on the host)
              rows     out[t] = A[t] @ B[g(t)]: A [T, K] in row groups, B [E, K, N] -> [T, N]; rows in
                       no group (at or past ends[-1]) are written as zeros
              ragged_k out[g] = A[:, T_g] @ B[T_g, :]: A [M, T], B [T, N] -> [E, M, N]; an empty
                       group's result is zeros
            fp32 accumulate, one rounding to the output dtype. Ends past T are clamped to T, and a
            decreasing end makes an empty group (xgemm/grouped.py: unspecified rows, never a fault;
            the next group starts at the previous group's end in rows mode, at the previous offset
            in ragged_k mode).
  dtypes    A, B both float16 or both bfloat16; out the inputs' dtype or float32.
  layout    The grouped axis is never a load's contiguous dim: a group starts at any index, and a
            TMA load must start on a 16-byte boundary of its contiguous dim (on the H200 an
            M-major A with a group starting at row 1 faulted, "illegal instruction", 2026-12-02;
            Triton's interpreter asserts the same). So rows mode reads A K-major
            and B (each group's matrix) N- or K-major; ragged_k reads A M-major and B N-major (as
            a weight gradient lhs^T @ dout has them); xgemm/grouped.py copies other layouts. Out
            dense row-major. TMA: 16-byte aligned bases and leading strides (and B's group stride
            in rows mode). T, M, N, K >= 1 and < 2**31.
  arch      sm_90a cubins built by triton >= 3.8 (xgemm/runtime/gluon_cache.py), launched without
            triton (runtime/launch.py), with Triton's global scratch for the device-made descriptors.

How a tile stays inside its group
  The group sizes stay on the device, so the host cannot cut A or D at the group boundaries. The
  flattened kernel reads through descriptors made once per program, some of them "ragged"
  (triton/tools/ragged_tma.py's 4-D view with 64-bit wraparound strides, made on the device): a
  box addressed by (group start, group size, row) is clipped at the group's end, so loads past
  it read zeros and stores past it write nothing. The bases stay the caller's (aligned) pointers.
    rows     A is read plainly: a tile's rows past its group's end read the next group's rows,
             whose products land in rows the ragged store of D drops (rows are independent).
    ragged_k A and B are read ragged along the grouped (contraction) axis: zeros past the end.
  The loop over the groups (rows mode past MAX_FLAT_GROUPS) makes each group's descriptors over
  the prefix of the array that ends at the group's end instead, once per program that visits it.

Design (Triton's persistent TMA matmul, 09-persistent-matmul, over groups as 08-grouped-gemm)
  One program per SM walks the tiles, tile pid, pid + programs, ...: rows mode numbers the
  [BM, BN] tiles group after group (cdiv(rows_g, BM) x cdiv(N, BN) each, then the rows in no
  group, which store zeros); ragged_k mode has E x cdiv(M, BM) x cdiv(N, BN) tiles. Within a
  group tiles go GROUP_M tile rows at a time ("super-rows") so that the programs running together
  share B's columns in L2. K loops are triton's software pipeline (`stages` TMA loads in flight,
  async wgmma with one group outstanding); the epilogue rounds once and stores by TMA.
  The flattened kernel (Config.flat, xgemm_grouped_flat_sm90) runs one loop per program, so the
  pipeline issues the next tile's first loads under this tile's epilogue:
    rows     a loop over the tiles that Triton fuses with the K loop (tl.range(flatten=True)); each
             tile finds its group by a binary search of a per-program table of cumulative tile
             counts; up to MAX_FLAT_GROUPS groups, past which the loop over the groups serves.
    ragged_k a loop over the k-steps of the program's tiles, written flat (the fusion takes one K
             trip count, and a group's K is its size).
  Against the loop over the groups, on the H200 (2026-12-04, docs/performance.md): rows 1.7-3.4%
  faster, ragged_k 5.2%; a warp-specialized variant (Triton's Hopper partitioning) ran 2-28x slower.
"""
from __future__ import annotations

from collections import namedtuple
from typing import List, Optional

from xgemm.core.dtypes import LONG_DTYPE, SHORT_DTYPE
from xgemm.core.problem import COL, ROW, Policy
from xgemm.kernels._common import sm90_device_reason
from xgemm.kernels._pointer_gemm import H200_SMS, PointerGemm, sm_count
from xgemm.runtime import driver, gluon_cache
from xgemm.runtime.calls import Param, triton_launch
from xgemm.runtime.gluon_cache import parse_key

NAME = "triton_grouped_sm90"
IN_DTYPES = ("float16", "bfloat16")
GROUP_M = 8
MAX_DIM = 2 ** 31 - 1
# (BM, BN, BK, stages, warps): a 128x256 tile for a wide N (the dense GEMM's shape on Hopper:
# 3 x 48 KB of operands + the 64 KB store buffer), 128x128 for a narrow N or a float32 result.
# TUNE: more candidates for the benchmark's sweep (benchmarks/grouped.py --tune), built on request.
TILES = {"wide": (128, 256, 64, 3, 8), "narrow": (128, 128, 64, 4, 8)}
TUNE = ((128, 256, 64, 4, 8), (256, 128, 64, 3, 8), (128, 256, 32, 6, 8), (128, 128, 64, 5, 8),
        (64, 256, 64, 4, 4), (64, 256, 64, 4, 8),    # 64 rows: less of a part-filled tile per group
        (128, 256, 128, 2, 8), (128, 128, 128, 3, 8))  # 128 deep: half the k-steps of a short group
# The flattened kernel's tiles (flat), each within the 227 KB of shared memory with its store buffer.
FLAT_TUNE = ((128, 256, 64, 3, 8), (128, 256, 32, 5, 8), (128, 256, 32, 6, 8), (128, 128, 64, 4, 8),
             (128, 128, 64, 5, 8))
MAX_FLAT_GROUPS = 2 ** 16 - 1     # the tile -> group search takes 16 steps
FLAT_SCHEDULE = "flattened"     # Policy.schedule of the flat kernel
SMEM_BYTES = 227 * 1024


class Config(namedtuple("Config", "in_dtype out_dtype bm bn bk stages warps b_kmajor ragged_k flat",
                        defaults=(False,))):
    """One compiled variant: the tile, the pipeline depth, B's majorness (rows mode), the mode, and
    flat: the flattened kernel (one loop a program, descriptors made once per program), which
    serves ragged_k always and rows mode up to MAX_FLAT_GROUPS, instead of the one that walks the
    groups."""
    __slots__ = ()

    @property
    def key(self) -> str:
        return (f"{NAME}/sm_90a-{SHORT_DTYPE[self.in_dtype]}-{SHORT_DTYPE[self.out_dtype]}/"
                f"m{self.bm}-n{self.bn}-k{self.bk}-s{self.stages}-w{self.warps}-b{int(self.b_kmajor)}"
                f"-r{int(self.ragged_k)}" + ("-f1" if self.flat else ""))

    @classmethod
    def from_key(cls, key: str) -> "Config":
        (_, i, o), f = parse_key(key, NAME)
        return cls(LONG_DTYPE[i], LONG_DTYPE[o], f["m"], f["n"], f["k"], f["s"], f["w"], bool(f["b"]), bool(f["r"]),
                   bool(f.get("f", 0)))

    def check(self) -> None:
        tiles = FLAT_TUNE if self.flat else (*TILES.values(), *TUNE)
        if (self.bm, self.bn, self.bk, self.stages, self.warps) not in tiles:
            raise ValueError(f"{self}: the tile must be one of {tiles}")
        if self.ragged_k and not self.flat:
            raise ValueError(f"{self}: ragged_k runs on the flattened kernel")
        if self.ragged_k and self.b_kmajor:
            raise ValueError(f"{self}: ragged_k reads B N-major only (the grouped axis outer)")
        if self.out_dtype == "float32" and self.bn > 128:
            raise ValueError(f"{self}: a float32 result's store buffer leaves no room for a 256-wide tile")


def epilogue_split(cfg: Config) -> int:
    """1: the result tile is stored from one shared buffer; 2: in two column halves through a
    buffer of half the size, where the whole one would not fit beside the operand stages."""
    operands = cfg.stages * (cfg.bm * cfg.bk + cfg.bk * cfg.bn) * 2
    result = cfg.bm * cfg.bn * (4 if cfg.out_dtype == "float32" else 2)
    return 1 if operands + result + 1024 <= SMEM_BYTES else 2


def choose(shape, in_dtype: str, out_dtype: str, b_kmajor: bool) -> Config:
    """The wide tile where N fills it (N >= 2048) and the result is 16-bit, else the narrow one;
    the flattened kernel for ragged_k, and for rows mode up to MAX_FLAT_GROUPS groups (H200,
    2026-12-04, against the loop over the groups: rows 1.7% faster on the uneven MoE case and 3.4%
    on the Zipf one, ragged_k 5.2%; docs/performance.md)."""
    wide = shape.n >= 2048 and out_dtype != "float32"
    flat = shape.ragged_k or shape.groups <= MAX_FLAT_GROUPS
    return Config(in_dtype, out_dtype, *TILES["wide" if wide else "narrow"], b_kmajor, shape.ragged_k, flat)


def needs_table(cfg: Config) -> bool:
    """The flattened kernel in rows mode reads its groups from a table (table_bytes)."""
    return cfg.flat and not cfg.ragged_k


def table_bytes(shape, grid: int) -> int:
    """The flattened rows-mode kernel's group table: per program, 3 x (E + 1) int32."""
    return grid * 3 * (shape.groups + 1) * 4


def programs(shape, cfg: Config, sms: int) -> int:
    """One program per SM, fewer where the problem has fewer tiles (an upper bound, since the group
    sizes are not known on the host: the E + 1 row segments, the groups and the rows in none, have
    at most cdiv(T, BM) + E tile rows)."""
    tiles_n = -(-shape.n // cfg.bn)
    if shape.ragged_k:
        tiles = shape.groups * -(-shape.m // cfg.bm) * tiles_n
    else:
        tiles = (-(-shape.rows // cfg.bm) + shape.groups) * tiles_n
    return max(1, min(sms, tiles))


# ----------------------------------------------------------------------------------------------
# Triton source (imported only to compile, or to run under TRITON_INTERPRET in the CPU tests)
# ----------------------------------------------------------------------------------------------

def _define():
    import triton
    import triton.language as tl

    @triton.jit
    def _super_row(local, tiles_m, tiles_n, GROUP_M: tl.constexpr):
        """(tile row, tile column) of a group's tile `local`: GROUP_M tile rows at a time."""
        width = GROUP_M * tiles_n
        first = (local // width) * GROUP_M
        rows = tl.minimum(tiles_m - first, GROUP_M)
        return first + (local % width) % rows, (local % width) // rows

    @triton.jit
    def _k_loop(a_desc, b_desc, acc, k0, k1, r, c, BK: tl.constexpr, B_KMAJOR: tl.constexpr):
        for k in range(k0, k1, BK):
            a = a_desc.load([r, k])
            if B_KMAJOR:
                b = b_desc.load([c, k]).T
            else:
                b = b_desc.load([k, c])
            acc = tl.dot(a, b, acc)
        return acc

    @triton.jit
    def _store(d_desc, acc, r, c, BN: tl.constexpr, EPI_SPLIT: tl.constexpr):
        if EPI_SPLIT == 2:
            halves = tl.permute(tl.reshape(acc, (acc.shape[0], 2, BN // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            d_desc.store([r, c], left.to(d_desc.dtype))
            d_desc.store([r, c + BN // 2], right.to(d_desc.dtype))
        else:
            d_desc.store([r, c], acc.to(d_desc.dtype))

    @triton.jit
    def xgemm_grouped_sm90(a_ptr, b_ptr, d_ptr, ends_ptr, T, M, N, K, E, lda, ldb, ldbe, ldd,
                           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                           B_KMAJOR: tl.constexpr, EPI_SPLIT: tl.constexpr):
        """Rows mode past MAX_FLAT_GROUPS: a loop over the groups, each group's descriptors made
        once per program that visits it, and the K loop inside."""
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        tiles_n = tl.cdiv(N, BN)
        # groups of A's rows, then group E: the rows in no group, stored as zeros
        first = 0           # the number of tiles of the groups before g
        row0 = 0
        tile = pid
        for g in range(0, E + 1):
            end = T
            if g < E:
                end = tl.maximum(tl.minimum(tl.load(ends_ptr + g), T), row0)
            tiles_m = tl.cdiv(end - row0, BM)
            count = tiles_m * tiles_n
            if tile < first + count:
                a_desc = tl.make_tensor_descriptor(a_ptr, [end, K], [lda, 1], [BM, BK])   # A K-major
                if B_KMAJOR:
                    b_desc = tl.make_tensor_descriptor(b_ptr + g * ldbe, [N, K], [ldb, 1], [BN, BK])
                else:
                    b_desc = tl.make_tensor_descriptor(b_ptr + g * ldbe, [K, N], [ldb, 1], [BK, BN])
                d_desc = tl.make_tensor_descriptor(d_ptr, [end, N], [ldd, 1], [BM, BN // EPI_SPLIT])
                k1 = tl.where(g < E, K, 0)   # group E multiplies nothing
                while tile < first + count:
                    tm, tn = _super_row(tile - first, tiles_m, tiles_n, GROUP_M)
                    acc = _k_loop(a_desc, b_desc, tl.zeros((BM, BN), tl.float32), 0, k1, row0 + tm * BM,
                                  tn * BN, BK, B_KMAJOR)
                    _store(d_desc, acc, row0 + tm * BM, tn * BN, BN, EPI_SPLIT)
                    tile += nprog
            first += count
            row0 = end

    @triton.jit
    def _k_span(ends_ptr, g, T):
        """ragged_k: (first index, size) of group g on the grouped axis, from the previous offset
        (clamped to [0, T], a decreasing offset giving an empty group)."""
        row0 = tl.minimum(tl.load(ends_ptr + g - 1, mask=g > 0, other=0), T)
        return row0, tl.maximum(tl.minimum(tl.load(ends_ptr + g), T), row0) - row0

    @triton.jit
    def _ragged(ptr, cols, ld, BR: tl.constexpr, BC: tl.constexpr):
        """A row-major [rows, cols] array seen through triton/tools/ragged_tma.py's descriptor,
        made on the device: [MAX, MAX, 2**30, cols] with strides [2**34 - ld, ld, ld, 1]. Block
        (2**30, off + size, 2**30 - size + r, c) then addresses row off + r (the first two dims'
        strides cancel modulo 2**64) and the box is clipped at row off + size: a store past it
        writes nothing and a load past it reads zeros."""
        wrap = tl.full((), 1, tl.int64) << 34
        return tl.make_tensor_descriptor(ptr, [0x7FFF0000, 0x7FFF0000, 0x40000000, cols],
                                         [wrap - ld, ld, ld, 1], [1, 1, BR, BC])

    @triton.jit
    def _rload(desc, off, size, r, c):
        x = desc.load([0x40000000, off + size, 0x40000000 - size + r, c])
        return tl.reshape(x, (x.shape[2], x.shape[3]))

    @triton.jit
    def _rstore(desc, off, size, r, c, x):
        desc.store([0x40000000, off + size, 0x40000000 - size + r, c], tl.reshape(x, (1, 1, x.shape[0], x.shape[1])))

    @triton.jit
    def xgemm_grouped_flat_sm90(a_ptr, b_ptr, d_ptr, ends_ptr, table_ptr, T, M, N, K, E, lda, ldb, ldbe, ldd,
                                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                                B_KMAJOR: tl.constexpr, RAGGED_K: tl.constexpr):
        """The flattened variant: one loop, its descriptors made once per program, in which the
        software pipeline issues the next tile's first loads under this tile's epilogue.
        Rows mode: a loop over the tiles that Triton's loop fusion (tl.range(flatten=True)) joins
        with the K loop. A tile finds its group by a binary search of the cumulative tile counts,
        which the program first writes to its slice of table_ptr (3 x (E + 1) int32), and stores
        its result through a ragged descriptor clipped at the group's end.
        ragged_k: the fusion takes one K trip count for every tile, and a group's K is its size, so
        the loop is written flat here: one iteration per k-step of the program's tiles (an empty
        group's tile takes one, of zeros), the tile's coordinates worked out at its first step and
        its result stored at its last. A and B are read through ragged descriptors (zeros past
        the group's end); table_ptr is unused."""
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        tiles_n = tl.cdiv(N, BN)
        if RAGGED_K:
            tiles_m = tl.cdiv(M, BM)
            per = tiles_m * tiles_n
            steps = 0
            for g in range(0, E):
                t0 = g * per
                first = t0 + (pid - t0 % nprog + nprog) % nprog     # the program's first tile of group g
                mine = tl.maximum(t0 + per - first + nprog - 1, 0) // nprog
                row0, size = _k_span(ends_ptr, g, T)
                steps += mine * tl.maximum(tl.cdiv(size, BK), 1)
            a_desc = _ragged(a_ptr, M, lda, BK, BM)             # A M-major: [T, M]
            b_desc = _ragged(b_ptr, N, ldb, BK, BN)             # B N-major: [T, N]
            d_desc = tl.make_tensor_descriptor(d_ptr, [E, M, N], [ldbe, ldd, 1], [1, BM, BN])
            tile = pid - nprog
            ks = 0
            nsteps = 0
            g = 0
            row0 = 0
            size = 0
            tm = 0
            tn = 0
            acc = tl.zeros((BM, BN), tl.float32)
            for _ in range(0, steps):
                if ks == 0:
                    tile += nprog
                    g = tile // per
                    tm, tn = _super_row(tile % per, tiles_m, tiles_n, GROUP_M)
                    row0, size = _k_span(ends_ptr, g, T)
                    nsteps = tl.maximum(tl.cdiv(size, BK), 1)
                a = _rload(a_desc, row0, size, ks * BK, tm * BM)
                b = _rload(b_desc, row0, size, ks * BK, tn * BN)
                acc = tl.dot(a.T, b, acc)
                ks += 1
                if ks == nsteps:
                    d_desc.store([g, tm * BM, tn * BN], tl.reshape(acc.to(d_desc.dtype), (1, BM, BN)))
                    acc = tl.zeros((BM, BN), tl.float32)
                    ks = 0
            return
        # segment g < E: rows [end_{g-1}, end_g) of A and D; segment E: the rows in no group, to T
        table = table_ptr + pid * 3 * (E + 1)
        row0 = 0
        total = 0
        for g in range(0, E + 1):
            end = tl.maximum(tl.minimum(tl.load(ends_ptr + g, mask=g < E, other=T), T), row0)
            total += tl.cdiv(end - row0, BM) * tiles_n
            tl.store(table + g, total)
            tl.store(table + E + 1 + g, row0)
            tl.store(table + 2 * (E + 1) + g, end)
            row0 = end
        tl.debug_barrier()          # the table's stores, before any thread's search reads them
        # A K-major [T, K], plain: a tile's rows past its group's end read the next group's rows,
        # whose products land in rows the clipped store drops (rows are independent here)
        a_desc = tl.make_tensor_descriptor(a_ptr, [T, K], [lda, 1], [BM, BK])
        d_rdesc = _ragged(d_ptr, N, ldd, BM, BN)
        if B_KMAJOR:
            b_desc = tl.make_tensor_descriptor(b_ptr, [E, N, K], [ldbe, ldb, 1], [1, BN, BK])
        else:
            b_desc = tl.make_tensor_descriptor(b_ptr, [E, K, N], [ldbe, ldb, 1], [1, BK, BN])
        for tile in tl.range(pid, total, nprog, flatten=True):
            g = 0                   # the count of segments whose cumulative tiles are <= tile
            for s in tl.static_range(15, -1, -1):
                probe = g + (1 << s) - 1
                cum = tl.load(table + tl.minimum(probe, E))
                g = tl.where((probe <= E) & (cum <= tile), g + (1 << s), g)
            first = tl.load(table + g - 1, mask=g > 0, other=0)
            row0 = tl.load(table + E + 1 + g)
            size = tl.load(table + 2 * (E + 1) + g) - row0
            tm, tn = _super_row(tile - first, tl.cdiv(size, BM), tiles_n, GROUP_M)
            # one trip count for every tile (the loop fusion takes no other): segment E's tiles read
            # A's rows at T, and B's group E, both past the end, so TMA's zero fill makes them zeros
            r = tl.where(g < E, row0 + tm * BM, T)
            acc = tl.zeros((BM, BN), tl.float32)
            for k in range(0, K, BK):
                a = a_desc.load([r, k])
                if B_KMAJOR:
                    b = tl.reshape(b_desc.load([g, tn * BN, k]), [BN, BK]).T
                else:
                    b = tl.reshape(b_desc.load([g, k, tn * BN]), [BK, BN])
                acc = tl.dot(a, b, acc)
            _rstore(d_rdesc, row0, size, tm * BM, tn * BN, acc.to(d_rdesc.dtype))

    # the kernel calls the helpers by their global names: the interpreter (TRITON_INTERPRET) looks
    # them up in this module's globals, not in this function's scope
    globals().update(_super_row=_super_row, _k_loop=_k_loop, _store=_store, _k_span=_k_span, _ragged=_ragged,
                     _rload=_rload,
                     _rstore=_rstore)
    return xgemm_grouped_sm90, xgemm_grouped_flat_sm90


def gluon_compile_args(key: str, arch: str):
    cfg = Config.from_key(key)
    if arch != "sm_90a":
        raise ValueError(f"{key} is built for sm_90a only, not {arch}")
    cfg.check()
    it, ot = SHORT_DTYPE[cfg.in_dtype], SHORT_DTYPE[cfg.out_dtype]
    sig = {"a_ptr": f"*{it}", "b_ptr": f"*{it}", "d_ptr": f"*{ot}", "ends_ptr": "*i32"}
    if cfg.flat:
        sig["table_ptr"] = "*i32"
    sig.update({"T": "i32", "M": "i32", "N": "i32", "K": "i32", "E": "i32", "lda": "i64", "ldb": "i64",
                "ldbe": "i64", "ldd": "i64"})
    constexprs = {"BM": cfg.bm, "BN": cfg.bn, "BK": cfg.bk, "GROUP_M": GROUP_M, "B_KMAJOR": cfg.b_kmajor}
    constexprs.update({"RAGGED_K": cfg.ragged_k} if cfg.flat else {"EPI_SPLIT": epilogue_split(cfg)})
    sig.update({k: "constexpr" for k in constexprs})
    # what supports() checks: 16-byte bases and strides of 8 elements (16 bytes; 4 for float32 D)
    lds = [list(sig).index(n) for n in ("lda", "ldb", "ldbe", "ldd")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(3)}
    attrs.update({(i,): [["tt.divisibility", 8]] for i in lds[:3]})
    attrs[(lds[3],)] = [["tt.divisibility", 4 if cfg.out_dtype == "float32" else 8]]
    options = {"num_warps": cfg.warps, "num_stages": cfg.stages, "enable_fp_fusion": False}
    return _define()[int(cfg.flat)], sig, constexprs, attrs, options


def tune_entries() -> List[str]:
    """The sweep's candidates for bf16: the loop over the groups at TILES and TUNE, forward with A
    K-major and B K-major (torch._grouped_mm's weights); the flattened kernel at FLAT_TUNE, forward
    with B K- and N-major and the weight gradient (ragged_k, A M-major, B N-major)."""
    keys = [Config("bfloat16", "bfloat16", *tile, True, False).key for tile in (*TILES.values(), *TUNE)]
    return keys + [Config("bfloat16", "bfloat16", *tile, bk, rk, True).key for tile in FLAT_TUNE
                   for bk, rk in ((True, False), (False, False), (False, True))]


def gluon_entries(arch: str = "sm_90a") -> List[str]:
    """sm_90a: {fp16, bf16} x {same, fp32} out x the tiles choose() picks (the wide one for 16-bit
    results only) x {rows with B N- or K-major, flattened or not (past MAX_FLAT_GROUPS), ragged_k
    flattened}: 30 entries. (tune_entries() are built only for the sweep, by docs/development.md's recipe.)"""
    if arch != "sm_90a":
        return []
    keys = []
    for i in IN_DTYPES:
        for o in (i, "float32"):
            for tile in (("narrow",) if o == "float32" else ("narrow", "wide")):
                keys += [Config(i, o, *TILES[tile], bk, rk, flat).key for bk, rk, flat in
                         ((False, False, True), (True, False, True), (False, False, False), (True, False, False),
                          (False, True, True))]
    return keys


# ----------------------------------------------------------------------------------------------
# The kernel protocol (kernels/_common.py)
# ----------------------------------------------------------------------------------------------

def _b_kmajor(problem) -> bool:
    return problem.b.majorness == COL


def _strides(problem):
    """(lda, ldb, B's group stride or D's, ldd) in elements."""
    a, b, s = problem.a, problem.b, problem.shape
    lda = a.strides[-1] if a.majorness == COL else a.strides[-2]
    ldb = b.strides[-1] if _b_kmajor(problem) else b.strides[-2]
    return lda, ldb, s.m * s.n if s.ragged_k else b.strides[0], s.n


class TritonGroupedSm90(PointerGemm):
    name = NAME
    ops = ("grouped",)
    backend = "gluon"           # built and launched through the Gluon kernels' cubin cache

    def supports(self, problem) -> Optional[str]:
        why = sm90_device_reason(problem.device)
        if why:
            return why
        a, b, s = problem.a, problem.b, problem.shape
        if a.dtype not in IN_DTYPES or b.dtype != a.dtype:
            return f"A/B dtypes {a.dtype}/{b.dtype}: needs both float16 or both bfloat16"
        if problem.out_dtype not in (a.dtype, "float32"):
            return f"output dtype {problem.out_dtype} is not {a.dtype} or float32"
        if min(s.rows, s.m, s.n, s.k, s.groups) < 1 or max(s.rows, s.m, s.n, s.k, s.groups) > MAX_DIM:
            return f"{s.m}x{s.n}x{s.k} over {s.rows} grouped indices in {s.groups} groups: every dim 1 .. 2**31-1"
        if a.majorness not in (ROW, COL) or b.majorness not in (ROW, COL):
            return f"A {a.majorness}, B {b.majorness}: TMA reads K- or M/N-major operands only"
        # the grouped axis: A's rows in rows mode; A's columns and B's rows in ragged_k mode
        along = [n for n, op, major in (("A", a, ROW if s.ragged_k else COL), ("B", b, COL if s.ragged_k else None))
                 if op.majorness == major]
        if along:
            return (f"A {a.majorness}, B {b.majorness}: the grouped axis is contiguous in {along[0]}, and a group "
                    f"can start at any index of it while a TMA load must start on a 16-byte boundary of its "
                    f"contiguous dim (xgemm.grouped copies {along[0]} to the other majorness)")
        if a.alignment < 16 or b.alignment < 16:
            return (f"A / B alignment {a.alignment} / {b.alignment} bytes: TMA needs 16-byte aligned bases, "
                    f"leading strides and group strides")
        out_item = 4 if problem.out_dtype == "float32" else 2
        if (s.n * out_item) % 16 or (s.ragged_k and (s.m * s.n * out_item) % 16):
            return f"N = {s.n}: the result's rows must be 16-byte multiples for its TMA stores"
        return gluon_cache.available(choose(s, a.dtype, problem.out_dtype, _b_kmajor(problem)).key)

    def policy(self, problem) -> Policy:
        s = problem.shape
        cfg = choose(s, problem.a.dtype, problem.out_dtype, _b_kmajor(problem))
        sms = sm_count(problem.device.index)
        what = (f"{s.groups} groups x {-(-s.m // cfg.bm)}x{-(-s.n // cfg.bn)} tiles" if s.ragged_k else
                f"the tiles of {s.groups} row groups (about {-(-s.rows // cfg.bm)}x{-(-s.n // cfg.bn)})")
        how = ("one loop over the k-steps of the program's tiles" if cfg.flat and s.ragged_k else
               "one loop over the tiles fused with the K loop, each tile's group found on the device" if cfg.flat else
               "TMA descriptors made per group on the device")
        return Policy(tile=(cfg.bm, cfg.bn, cfg.bk), stages=cfg.stages, warps=cfg.warps,
                      schedule=FLAT_SCHEDULE if cfg.flat else "",
                      notes=(f"persistent: {programs(s, cfg, sms)} programs over {what}",
                             f"{how}; no host read of the sizes"))

    def _config(self, problem, policy) -> Config:
        bm, bn, bk = policy.tile
        return Config(problem.a.dtype, problem.out_dtype, bm, bn, bk, policy.stages, policy.warps, _b_kmajor(problem),
                      problem.shape.ragged_k, policy.schedule == FLAT_SCHEDULE)

    def _args(self, problem):
        s = problem.shape
        return (s.rows, s.m, s.n, s.k, s.groups, *_strides(problem))

    def run(self, problem, policy, operands, out, stream) -> None:
        """operands: (A, B, ends) views, ends int32 and contiguous; out: the result's view. The
        flattened kernel's group table is allocated stream-ordered around its launch (a
        graph node under capture, as Triton's own scratch is)."""
        cfg = self._config(problem, policy)
        device = operands[0].device.index
        a, b, ends = operands
        grid = programs(problem.shape, cfg, sm_count(device))
        table = driver.mem_alloc_async(table_bytes(problem.shape, grid), stream) if needs_table(cfg) else 0
        try:
            self._launcher(cfg, device)(grid, stream, a.ptr, b.ptr, out.ptr, ends.ptr, *((table,) if cfg.flat else ()),
                                        *self._args(problem))
        finally:
            if table:
                driver.mem_free_async(table, stream)

    def bind(self, problem, policy, operands, out):
        return None             # no torch fast path for grouped calls (it serves gemm)

    def jax_lowering(self, problem, policy, *, portable: bool = False, sm_margin: int = 0):
        """The same cubin under jit: inputs (A, B, ends), output D, on XLA's stream."""
        cfg = self._config(problem, policy)
        entry = gluon_cache.lookup(cfg.key)
        P = Param
        scalars = self._args(problem)
        grid = programs(problem.shape, cfg, H200_SMS - sm_margin)
        table = (P.scratch(0),) if needs_table(cfg) else (P.null(),) if cfg.flat else ()
        args = (P.input(0), P.input(1), P.output(0), P.input(2), *table, *(P.i32(v) for v in scalars[:5]),
                *(P.i64(v) for v in scalars[5:]))
        return triton_launch(entry.cubin, entry.meta, grid, args,
                             scratch_bytes=(table_bytes(problem.shape, grid),) if needs_table(cfg) else ())

    def prebuild(self, arch: str):
        return gluon_entries(arch)


KERNEL = TritonGroupedSm90()
KERNELS = (KERNEL,)
