"""gluon_softmax: row softmax as a Gluon multi-CTA (cluster) kernel, prebuilt to cubins.

Contract
  op        y = softmax(x) over the last (reduced) dim, seen as rows x cols; fp32 math throughout
            (exp2 with a max shift, fp32 sums), output rounded once to the output dtype.
  dtypes    x in float32 | float16 | bfloat16; y in any of the three (all 9 pairs).
  layout    the operands' last dim is the reduced one (the API moves `axis` last before calling),
            contiguous (stride 1, majorness ROW); the leading dims must collapse
            to one row stride, which may be anything (0, padded, larger than cols); y has its own
            row stride. Anything else declines (the API compacts or uses the reference).
  alignment none required. When both base pointers are 16-byte aligned and cols and both row
            strides are multiples of 16 bytes / itemsize, the "aligned" variant issues 16-byte
            loads/stores; otherwise the same kernel without the divisibility hints (scalar ones),
            or, for aligned bases whose row strides are equal modulo 16 bytes / itemsize (an odd
            row length, contiguous), the shift variant (Config.shift: whole 16-byte chunks as
            vectors, the partial first and last chunk of each row element by element; BLOCK_N
            <= 16384).
  arch      sm_90 / sm_90a (Hopper), cubins built by triton >= 3.8 (xgemm/runtime/gluon_cache.py) and
            launched by xgemm/runtime/launch.py (ctypes on libcuda); triton is not needed at run time.
  limits    1 <= cols <= MAX_COLS (2**19): a row lives in registers, split across a cluster of
            up to 16 CTAs; rows <= 2**31 - 1.
  specials  as torch.softmax: a row holding NaN or +inf, or only -inf (fully masked), is NaN;
            -inf entries of a row with a finite max give exactly 0.

Design (from triton's python/tutorials/gluon/14-multicta.py multi-CTA softmax)
  One cluster of CTAS CTAs owns BLOCK_M rows; each row is held whole in registers, its columns
  split into CTAS contiguous slices by the layout's cga_layout (built on the host, a constexpr).
  x is read once and y written once: 2 * rows * cols * itemsize bytes, the device-copy floor.
  BLOCK_N is cols rounded up to a power of two (the tail is masked with -inf, which exp maps to 0);
  short rows stack BLOCK_M rows per CTA so every CTA moves 32-64 KB. Rows, cols and strides are
  runtime arguments: one cubin serves a whole config class (dtypes x BLOCK_N x alignment x config).
  Three kernels:
  - xgemm_softmax (online=0): [BLOCK_M, BLOCK_N] tile, gl.max then gl.sum along the row; each
    reduces in-warp (shuffles), across warps (shared memory) and, when CTAS > 1, across the
    cluster (distributed shared memory: mapa + ld.shared::cluster + barrier.cluster): 4 cluster
    barriers per row block.
  - xgemm_softmax_online (online=1): [BLOCK_M, CTAS, SLICE] tile; each CTA reduces its slice to
    (max, sum of exp(x - max)), packs the pair into one int64 and a single cross-CTA gl.reduce
    with the online-softmax combine finishes the row: 2 cluster barriers. Chosen for 524288.
  - xgemm_softmax_mbarrier (online=2 / 3): quack's exchange; online=3, chosen for BLOCK_N
    32768 ... 262144, is the same source in quack's order without the exit barrier (below).
    [1, CTAS, R, warps, 32 * VEC] tile (the same 16-byte accesses); each warp reduces its part to
    a packed (max, sum) with shuffles only, lane d of every warp st.async's it
    (st.async...mbarrier::complete_tx::bytes) into CTA d's buffer [1, 1, CTAS, warps] and each CTA
    waits on its own mbarrier (arrive.expect_tx of CTAS * warps * 8 bytes, try_wait), then
    combines the CTAS * warps partials in-warp. No cluster barrier between the partials and the
    combine; the cluster barriers left are the relaxed one triton inserts after mbarrier.init
    (placed after the x loads are issued, so it overlaps them) and the one it puts before the exit
    of every multi-CTA kernel. The kernel is not persistent, so both still come once per row block
    (per CTA). 3 bar.sync (triton's shared-memory hazard analysis around init / expect / st.async).
    online=3 moves the expect (and with it that init barrier) after the local reduction, and its
    cubin is assembled from PTX without the exit barrier (gluon_patch_ptx): that barrier (a
    MEMBAR.ALL.GPU + cluster arrive/wait in SASS) made every CTA wait for its 64 KB of stores to be
    acknowledged and for all its peers before leaving, so a finished CTA's slot never overlapped
    the next cluster's loads. Nothing needs it: a CTA reads no peer's shared memory and leaves only
    after every byte sent to it has landed (its own mbarrier wait).
  Tried and dropped: a persistent grid-stride variant that issued the next row block's loads
  before reducing the current one was slower at every size -- the barriers (bar.sync /
  barrier.cluster.arrive, release semantics) wait for those loads.

Config picker (pick_config) by BLOCK_N = next_pow2(max(cols, 16)); elements/thread =
BLOCK_M * BLOCK_N / (CTAS * 32 * warps), the fp32 values a thread holds (~1.3 registers each).
Picked with benchmarks/softmax.py --tune (1 GiB fp32 inputs, CUDA-graph timing, outputs verified;
each candidate's GB/s: docs/performance.md, "xgemm/kernels/gluon_softmax.py"):
    BLOCK_N        CTAS  warps  BLOCK_M           online  elems/thread
    16 ... 1024    1     4      1024 / BLOCK_N    0       8      (fp32; 16-bit: 2048 / BLOCK_N, 16)
    2048           1     8      4                 0       32
    4096           1     4      2                 0       64
    8192           1     16     2                 0       32
    16384          1     16     1                 0       32
    32768          2     4      1                 3       128
    65536          4     8      1                 3       64
    131072         8     4      1                 3       128
    262144         16    4      1                 3       128
    524288         16    8      1                 1       128           = non-portable
Why: single-CTA rows run at copy speed; short rows want many small CTAs per SM (as quack runs
them). In a cluster every row pays cluster barriers, so fewer warps (more CTAs resident per SM to
overlap them) and the one-exchange kernel win; online=2 drops the cluster barriers between the
partials and the combine, online=3 measured faster again at 64K and 256K. 2048, 8192, 32768,
131072 and 524288 take their neighbours' rule, not swept. BLOCK_N 4096 was re-picked on 16-bit
rows of 3000 and 4096 (2026-12-02, 0.5 GiB): 2 rows of 4 warps at 4120-4198 GB/s, at copy speed,
against 2881-3454 for the 8-row, 16-warp config picked on fp32.
VEC is 16 bytes / input itemsize (4 for fp32, 8 for 16-bit): one 128-bit access per chunk.
"""
from __future__ import annotations

from collections import namedtuple
from typing import Dict, List, Optional, Tuple

from xgemm.core.dtypes import ITEMSIZE, LONG_DTYPE, SHORT_DTYPE
from xgemm.core.problem import ROW, Policy
from xgemm.errors import KernelUnavailableError
from xgemm.runtime import gluon_cache, launch
from xgemm.runtime.calls import Param, triton_launch
from xgemm.runtime.gluon_cache import parse_key
from xgemm.runtime.roles import OUT, A

NAME = "gluon_softmax"
MAX_COLS = 1 << 19
MIN_BLOCK_N = 16
MAX_CLUSTER = 16
DTYPES = ("float32", "float16", "bfloat16")
_SHORT, _LONG = SHORT_DTYPE, LONG_DTYPE
_ITEMSIZE = ITEMSIZE

# BLOCK_N -> (ctas, warps, block_m, online). Entries for BLOCK_N <= 2048 are computed (rows per CTA).
_TABLE: Dict[int, Tuple[int, int, int, int]] = {
    4096: (1, 4, 2, 0),
    8192: (1, 16, 2, 0),
    16384: (1, 16, 1, 0),
    32768: (2, 4, 1, 3),
    65536: (4, 8, 1, 3),
    131072: (8, 4, 1, 3),
    262144: (16, 4, 1, 3),
    524288: (16, 8, 1, 1),
}
_SHORT_ROW_ONLINE = 0


def _short_row(block_n: int, itemsize: int) -> Tuple[int, int]:
    """(rows per CTA, warps) for BLOCK_N <= 2048: up to 1024 columns quack's geometry, small CTAs
    of 4 warps holding two 16-byte vectors of x a thread (many resident per SM, so one CTA's tail
    overlaps the others' loads): 1024 fp32 or 2048 16-bit values. At N = 1000 the 16-bit rows ran
    at 4200-4212 GB/s with two vectors a thread and at 3979-4010 with one (2026-12-02, --tune); fp32 was
    swept at 256 and 1024. 2048 keeps 8 warps and 8192 elements (not re-swept)."""
    per_cta = 2 * 128 * (16 // itemsize)
    return (max(1, per_cta // block_n), 4) if block_n <= 1024 else (8192 // block_n, 8)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# A namedtuple, not a dataclass: module import stays ~0.2 ms (it is on the first-call path).
class Config(namedtuple("Config", "in_dtype out_dtype block_n block_m warps ctas vec align online shift",
                        defaults=(0, 0))):
    """One compiled variant: everything that is a constexpr of the kernel.

    in_dtype, out_dtype  "float32" | "float16" | "bfloat16"
    block_n  power of two >= cols           block_m  rows per cluster
    warps    per CTA                        ctas     CTAs per cluster sharing each row (pow2 <= 16)
    vec      contiguous elements per thread per access (16 bytes of input)
    align    divisibility (elements) promised for cols and row strides; 1 = none
    online   1: each CTA reduces its slice to (max, sum of exp) and one exchange of the packed pair
             finishes the row (2 cluster barriers a row instead of 4); 0: two cross-CTA reductions;
             2: every warp st.async's its packed pair into every CTA's buffer and each CTA waits on
             its own mbarrier (no cluster barrier per row; needs ctas >= 2, block_m == 1);
             3: kernel 2 as quack orders it: its mbarrier's expect (and so the cluster barrier
             that publishes the mbarrier's init) after the local reduction, and without the exit
             cluster barrier triton adds (gluon_patch_ptx): with st.async every byte a CTA
             receives has landed before it passes its own wait, so no CTA can exit under a peer
    shift    1: rows that start anywhere (cols and strides of any value) on 16-byte aligned bases,
             x and y row strides equal modulo vec: each row is read and written from the 16-byte
             chunk it starts in, whole chunks as 16-byte accesses and the partial first and last
             chunk element by element (one CTA per row block, online 0; align 1)
    """
    __slots__ = ()

    # Thread/warp split of one CTA's [block_m, block_n / ctas] slice: lanes along the row first
    # (VEC-wide 16-byte chunks), then warps along rows while there are rows (so a short row is
    # reduced by shuffles inside one warp), the remaining warps along the row.
    @property
    def cols_per_cta(self) -> int:
        return self.block_n // self.ctas

    @property
    def tpw_n(self) -> int:
        return max(1, min(32, self.cols_per_cta // self.vec))

    @property
    def tpw_m(self) -> int:
        return 32 // self.tpw_n

    @property
    def wpc_m(self) -> int:
        return max(1, min(self.warps, self.block_m // self.tpw_m))

    @property
    def wpc_n(self) -> int:
        return self.warps // self.wpc_m

    @property
    def cga(self) -> Tuple[Tuple[int, int], ...]:
        # log2(ctas) bases, each doubling the CTA's column slice: CTA r owns columns
        # [r * cols_per_cta, (r + 1) * cols_per_cta). Built on the host, passed as a constexpr.
        # The online kernel views a row as [ctas, cols_per_cta]: the CTA bits go on that dim.
        # The mbarrier kernel views it as [block_m, ctas, r, warps, 32 * vec] (CTA bits on dim 1).
        if self.online >= 2:
            return tuple((0, 1 << i, 0, 0, 0) for i in range(self.ctas.bit_length() - 1))
        if self.online:
            return tuple((0, 1 << i, 0) for i in range(self.ctas.bit_length() - 1))
        return tuple((0, 1 << i) for i in range(self.ctas.bit_length() - 1))

    @property
    def elems_per_thread(self) -> int:
        """fp32 values a thread holds (registers for the data, ~1.25 per value in practice)."""
        return self.block_m * self.block_n // (self.ctas * self.warps * 32)

    @property
    def key(self) -> str:
        """Entry key in the gluon cache, e.g. gluon_softmax/fp32-fp32/n4096-m8-w16-c1-v4-a4-o0."""
        return (f"{NAME}/{_SHORT[self.in_dtype]}-{_SHORT[self.out_dtype]}/"
                f"n{self.block_n}-m{self.block_m}-w{self.warps}-c{self.ctas}-v{self.vec}-a{self.align}"
                f"-o{self.online}" + ("-s1" if self.shift else ""))

    @classmethod
    def from_key(cls, key: str) -> "Config":
        (i, o), f = parse_key(key, NAME)
        return cls(_LONG[i], _LONG[o], f["n"], f["m"], f["w"], f["c"], f["v"], f["a"], f.get("o", 0),
                   f.get("s", 0))

    def check(self) -> None:
        pow2 = lambda v: v > 0 and v & (v - 1) == 0
        assert self.in_dtype in DTYPES and self.out_dtype in DTYPES, self
        assert all(pow2(v) for v in (self.block_n, self.block_m, self.warps, self.ctas, self.vec)), self
        assert self.ctas <= MAX_CLUSTER and self.warps <= 16 and self.cols_per_cta >= self.vec, self
        assert self.align in (1, self.vec) and self.online in (0, 1, 2, 3) and self.shift in (0, 1), self
        assert not self.shift or (self.align == 1 and self.ctas == 1 and self.online == 0), self
        if self.online >= 2:
            # one row per cluster, lanes and warps all along the row, >= 2 CTAs (st.async needs a
            # cluster) and at most 32 (lane d sends to CTA d)
            assert self.ctas >= 2 and self.block_m == 1 and self.tpw_n == 32 and self.wpc_m == 1, self
        assert self.block_m >= self.tpw_m * self.wpc_m, f"{self}: layout would replicate rows"
        assert self.cols_per_cta >= self.vec * self.tpw_n * self.wpc_n, f"{self}: layout would replicate columns"


def pick_config(cols: int, in_dtype: str, out_dtype: str, aligned: bool, shifted: bool = False) -> Config:
    """The tuned config for a row length (see the module docstring's table); shifted: the shift
    variant of an unaligned pick (only where shifts() allows it)."""
    block_n = max(MIN_BLOCK_N, _next_pow2(cols))
    vec = 16 // _ITEMSIZE[in_dtype]
    if block_n in _TABLE:
        ctas, warps, block_m, online = _TABLE[block_n]
    elif block_n < min(_TABLE):
        (block_m, warps), ctas, online = _short_row(block_n, _ITEMSIZE[in_dtype]), 1, _SHORT_ROW_ONLINE
    else:
        raise ValueError(f"{NAME}: cols={cols} exceeds MAX_COLS={MAX_COLS}")
    return _shifted(_fit(Config(in_dtype, out_dtype, block_n, block_m, warps, ctas, vec, vec if aligned else 1,
                                online)), shifted)


def _shifted(cfg: Config, shifted: bool) -> Config:
    """The shift variant of an unaligned config where it has one (one CTA per row block, the
    two-reduction kernel); the config itself otherwise."""
    return cfg._replace(shift=1) if shifted and cfg.align == 1 and cfg.ctas == 1 and cfg.online == 0 else cfg


def _fit(cfg: Config) -> Config:
    """Raise block_m to the layout's smallest row footprint, so no thread holds a duplicate."""
    max_wpc_n = max(1, cfg.cols_per_cta // (cfg.vec * cfg.tpw_n))
    need = cfg.tpw_m * max(1, cfg.warps // max_wpc_n)
    if cfg.block_m < need:
        cfg = cfg._replace(block_m=need)
    cfg.check()
    return cfg


def sibling(cfg: Config) -> Config:
    """The same config in another kernel (online <-> two-reduction, mbarrier -> online, quack's
    order -> mbarrier); both are in the cache."""
    return cfg._replace(online={0: 1, 1: 0, 2: 1, 3: 2}[cfg.online])


def mbarrier_variant(cfg: Config) -> Config:
    """The same config in the mbarrier-exchange kernel (online=2)."""
    return cfg._replace(online=2)


ONLINE_NOTES = {0: (), 1: ("online",), 2: ("online", "mbarrier"), 3: ("online", "mbarrier", "no exit barrier")}


def policy_of(cfg: Config) -> Policy:
    notes = (f"vec {cfg.vec}", f"{cfg.elems_per_thread} elems/thread") + ONLINE_NOTES[cfg.online]
    return Policy(tile=(cfg.block_m, cfg.block_n), warps=cfg.warps, ctas_per_row=cfg.ctas, cluster=(cfg.ctas, 1),
                  notes=notes)


def config_from_policy(policy: Policy, in_dtype: str, out_dtype: str, aligned: bool,
                       shifted: bool = False) -> Config:
    block_m, block_n = policy.tile
    vec = 16 // _ITEMSIZE[in_dtype]
    return _shifted(_fit(Config(in_dtype, out_dtype, block_n, block_m, policy.warps, policy.ctas_per_row, vec,
                                vec if aligned else 1, online_of_notes(policy.notes))), shifted)


def online_of_notes(notes) -> int:
    """Config.online from Policy.notes (policy_of's ONLINE_NOTES)."""
    return 3 if "no exit barrier" in notes else 2 if "mbarrier" in notes else 1 if "online" in notes else 0


# ----------------------------------------------------------------------------------------------
# The Gluon source. Defined inside a function so that importing this module never imports triton.
# ----------------------------------------------------------------------------------------------

def _define_kernels():
    """(two-reduction, online, mbarrier-exchange kernel), indexed by Config.online: the Gluon
    sources, imported only to compile."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia import hopper
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier

    @gluon.jit
    def _softmax_shifted(x_ptr, y_ptr, n_rows, n_cols, x_row_stride, y_row_stride, pid, rows, rows64, cols,
                         layout: gl.constexpr, BLOCK_M: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr):
        # Rows that start anywhere on 16-byte aligned bases (Config.shift). Offsets count from the
        # 16-byte chunk a row starts in, `shift` elements before it (the same in y: the strides are
        # equal modulo VEC). Whole chunks [h0, t0) take 16-byte accesses: their masks are constant
        # per chunk and their bases multiples of VEC. The partial first chunk [shift, VEC) and last
        # one [t0, end) go element by element in a [BLOCK_M, VEC] tile. No access leaves the row.
        row_ok = rows < n_rows
        xrow = rows64 * x_row_stride
        shift = xrow % VEC
        end = shift + n_cols
        t0 = (end // VEC) * VEC
        h0 = gl.where(shift > 0, VEC, 0)
        chunk = (cols // VEC) * VEC
        whole = row_ok[:, None] & (chunk[None, :] >= h0[:, None]) & (chunk[None, :] < t0[:, None])
        xoff = gl.multiple_of(xrow - shift, VEC)
        yoff = gl.multiple_of(rows64 * y_row_stride - shift, VEC)
        x = gl.load(x_ptr + xoff[:, None] + cols[None, :], mask=whole, other=-float("inf")).to(gl.float32)

        edge: gl.constexpr = gl.BlockedLayout([1, 1], [32 // VEC, VEC], [WARPS, 1], [1, 0])
        erows = pid * BLOCK_M + gl.arange(0, BLOCK_M, gl.SliceLayout(1, edge))
        ec = gl.arange(0, VEC, gl.SliceLayout(0, edge))
        erows64 = erows.to(gl.int64)
        exrow = erows64 * x_row_stride
        eshift = exrow % VEC
        eend = eshift + n_cols
        tc = ((eend // VEC) * VEC)[:, None] + ec[None, :]
        eok = (erows < n_rows)[:, None]
        head = eok & (eshift > 0)[:, None] & (ec[None, :] >= eshift[:, None]) & (ec[None, :] < eend[:, None])
        tail = eok & (tc >= gl.where(eshift > 0, VEC, 0)[:, None]) & (tc < eend[:, None])
        exoff = (exrow - eshift)[:, None]
        eyoff = (erows64 * y_row_stride - eshift)[:, None]
        hx = gl.load(x_ptr + exoff + ec[None, :], mask=head, other=-float("inf")).to(gl.float32)
        tx = gl.load(x_ptr + exoff + tc, mask=tail, other=-float("inf")).to(gl.float32)

        # maxnum ignores NaN here, but NaN - max = NaN poisons the row's sum: torch's NaN row.
        emax = gl.maximum(gl.max(hx, axis=1), gl.max(tx, axis=1))
        row_max = gl.maximum(gl.max(x, axis=1), gl.convert_layout(emax, gl.SliceLayout(1, layout)))
        e = gl.exp2((x - row_max[:, None]) * 1.4426950408889634)
        emax = gl.convert_layout(row_max, gl.SliceLayout(1, edge))
        he = gl.exp2((hx - emax[:, None]) * 1.4426950408889634)
        te = gl.exp2((tx - emax[:, None]) * 1.4426950408889634)
        row_sum = gl.sum(e, axis=1) + gl.convert_layout(gl.sum(he, axis=1) + gl.sum(te, axis=1),
                                                        gl.SliceLayout(1, layout))
        inv = 1.0 / row_sum
        gl.store(y_ptr + yoff[:, None] + cols[None, :], (e * inv[:, None]).to(y_ptr.dtype.element_ty), mask=whole)
        einv = gl.convert_layout(inv, gl.SliceLayout(1, edge))[:, None]
        gl.store(y_ptr + eyoff + ec[None, :], (he * einv).to(y_ptr.dtype.element_ty), mask=head)
        gl.store(y_ptr + eyoff + tc, (te * einv).to(y_ptr.dtype.element_ty), mask=tail)

    @gluon.jit
    def xgemm_softmax(x_ptr, y_ptr, n_rows, n_cols, x_row_stride, y_row_stride,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, VEC: gl.constexpr,
                      TPW_M: gl.constexpr, TPW_N: gl.constexpr, WPC_M: gl.constexpr, WPC_N: gl.constexpr,
                      CTAS: gl.constexpr, CGA: gl.constexpr, SHIFT: gl.constexpr):
        # Columns split over the cluster's CTAs by CGA; rows over threads/warps.
        layout: gl.constexpr = gl.BlockedLayout([1, VEC], [TPW_M, TPW_N], [WPC_M, WPC_N], [1, 0],
                                                cga_layout=CGA)
        # With num_ctas > 1 the program id is the cluster id (ctaid.x / num_ctas).
        pid = gl.program_id(0)
        rows = pid * BLOCK_M + gl.arange(0, BLOCK_M, gl.SliceLayout(1, layout))
        cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, layout))
        rows64 = rows.to(gl.int64)          # rows * stride can pass 2**31 elements
        if SHIFT:
            _softmax_shifted(x_ptr, y_ptr, n_rows, n_cols, x_row_stride, y_row_stride, pid, rows, rows64, cols,
                             layout, BLOCK_M, VEC, WPC_M * WPC_N)
        else:
            mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
            x = gl.load(x_ptr + (rows64 * x_row_stride)[:, None] + cols[None, :], mask=mask,
                        other=-float("inf")).to(gl.float32)
            # maxnum ignores NaN here, but NaN - max = NaN poisons the row's sum: torch's NaN row.
            row_max = gl.max(x, axis=1)
            e = gl.exp2((x - row_max[:, None]) * 1.4426950408889634)
            row_sum = gl.sum(e, axis=1)
            y = e * (1.0 / row_sum)[:, None]
            gl.store(y_ptr + (rows64 * y_row_stride)[:, None] + cols[None, :], y.to(y_ptr.dtype.element_ty),
                     mask=mask)

    @gluon.jit
    def _pack(m, s):
        # (max, sum) as one int64 (max in the high word): one cross-CTA exchange carries both
        hi = m.to(gl.int32, bitcast=True).to(gl.int64) << 32
        lo = s.to(gl.int32, bitcast=True).to(gl.uint32, bitcast=True).to(gl.int64)
        return hi | lo

    @gluon.jit
    def _unpack(p):
        m = (p >> 32).to(gl.int32).to(gl.float32, bitcast=True)
        s = p.to(gl.int32).to(gl.float32, bitcast=True)
        return m, s

    @gluon.jit
    def _online_combine(p1, p2):
        # (max, sum of exp(x - max)) pairs. A side whose max is the result keeps its sum as is, so
        # an all -inf side (sum 0) adds 0 instead of 0 * exp(-inf - -inf) = NaN; a row that is -inf
        # everywhere keeps max -inf and gets scale exp(-inf - -inf) = NaN below (torch: NaN).
        m1, s1 = _unpack(p1)
        m2, s2 = _unpack(p2)
        m = gl.maximum(m1, m2)
        a = gl.where(m1 == m, s1, s1 * gl.exp2((m1 - m) * 1.4426950408889634))
        b = gl.where(m2 == m, s2, s2 * gl.exp2((m2 - m) * 1.4426950408889634))
        return _pack(m, a + b)

    @gluon.jit
    def xgemm_softmax_online(x_ptr, y_ptr, n_rows, n_cols, x_row_stride, y_row_stride,
                             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, VEC: gl.constexpr,
                             TPW_M: gl.constexpr, TPW_N: gl.constexpr, WPC_M: gl.constexpr,
                             WPC_N: gl.constexpr, CTAS: gl.constexpr, CGA: gl.constexpr):
        # A row block is [BLOCK_M, CTAS, SLICE]; CGA puts CTA r on slice r (dim 1). Each CTA reduces
        # its slice (dim 2, no cluster traffic), then one cross-CTA reduce of packed (max, sum).
        SLICE: gl.constexpr = BLOCK_N // CTAS
        layout: gl.constexpr = gl.BlockedLayout([1, 1, VEC], [TPW_M, 1, TPW_N], [WPC_M, 1, WPC_N], [2, 1, 0],
                                                cga_layout=CGA)
        l_mc: gl.constexpr = gl.SliceLayout(2, layout)
        l_n: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, layout))
        rows = gl.program_id(0) * BLOCK_M + gl.arange(0, BLOCK_M, gl.SliceLayout(1, l_mc))
        cols = (gl.arange(0, CTAS, gl.SliceLayout(0, l_mc)) * SLICE)[None, :, None] + \
            gl.arange(0, SLICE, l_n)[None, None, :]
        mask = (rows < n_rows)[:, None, None] & (cols < n_cols)
        rows64 = rows.to(gl.int64)
        x = gl.load(x_ptr + (rows64 * x_row_stride)[:, None, None] + cols, mask=mask,
                    other=-float("inf")).to(gl.float32)
        m_loc = gl.max(x, axis=2)
        shift = gl.where(m_loc == -float("inf"), 0.0, m_loc)    # all -inf slice: sum 0, not NaN
        e = gl.exp2((x - shift[:, :, None]) * 1.4426950408889634)
        s_loc = gl.sum(e, axis=2)
        m_row, s_row = _unpack(gl.reduce(_pack(m_loc, s_loc), 1, _online_combine))
        scale = gl.exp2((m_loc - m_row[:, None]) * 1.4426950408889634) / s_row[:, None]
        gl.store(y_ptr + (rows64 * y_row_stride)[:, None, None] + cols,
                 (e * scale[:, :, None]).to(y_ptr.dtype.element_ty), mask=mask)

    @gluon.jit
    def xgemm_softmax_mbarrier(x_ptr, y_ptr, n_rows, n_cols, x_row_stride, y_row_stride,
                               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, VEC: gl.constexpr,
                               TPW_M: gl.constexpr, TPW_N: gl.constexpr, WPC_M: gl.constexpr,
                               WPC_N: gl.constexpr, CTAS: gl.constexpr, CGA: gl.constexpr,
                               CGA_SEND: gl.constexpr, CGA_BUF: gl.constexpr, LATE_EXPECT: gl.constexpr):
        # quack's exchange: every warp reduces its part of the row to a packed (max, sum) with
        # shuffles only, and lane d of each warp st.async's it into CTA d's buffer, completing
        # bytes on CTA d's mbarrier; each CTA waits on its own mbarrier, then combines all
        # CTAS * WPC_N partials in-warp. No bar.sync / barrier.cluster carries row data.
        # Row block [BLOCK_M, CTAS, R, WPC_N, 32 * VEC]: CTA c owns dim 1 = c (CGA), warp w dim 3,
        # lane l dim 4 (VEC each); column = ((c * R + r) * WPC_N + w) * 32 * VEC + l, the same
        # 16-byte accesses as the other kernels (a warp's access covers 512 contiguous bytes).
        W: gl.constexpr = WPC_N
        LW: gl.constexpr = 32 * VEC
        SLICE: gl.constexpr = BLOCK_N // CTAS
        R: gl.constexpr = SLICE // (W * LW)
        LOG2E: gl.constexpr = 1.4426950408889634
        lx: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1, VEC], [1, 1, 1, 1, 32], [1, 1, 1, W, 1], [4, 3, 2, 1, 0],
                                            cga_layout=CGA)
        l4: gl.constexpr = gl.SliceLayout(4, lx)            # [M, C, R, W]
        # [M, C, W], one partial per warp: r reduced first (in-thread), then the lanes (5 shuffles)
        lp: gl.constexpr = gl.SliceLayout(3, gl.SliceLayout(2, lx))
        l2: gl.constexpr = gl.SliceLayout(2, lp)            # [M, C]: per row and CTA
        # 1-D index layouts, sliced in the order x[None, ...] re-expands them
        rows = gl.program_id(0) * BLOCK_M + gl.arange(
            0, BLOCK_M, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, l4))))
        c_i = gl.arange(0, CTAS, gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, l4))))
        r_i = gl.arange(0, R, gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, l4))))
        w_i = gl.arange(0, W, gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, l4))))
        l_i = gl.arange(0, LW, gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, lx)))))
        cols = (c_i * SLICE)[None, :, None, None, None] + (r_i * (W * LW))[None, None, :, None, None] + \
            (w_i * LW)[None, None, None, :, None] + l_i[None, None, None, None, :]
        mask = (rows < n_rows)[:, None, None, None, None] & (cols < n_cols)
        rows64 = rows.to(gl.int64)
        # The loads go out first; the mbarrier init below (and the cluster barrier the compiler
        # adds after it, so that remote CTAs see it initialised) overlaps them.
        x = gl.load(x_ptr + (rows64 * x_row_stride)[:, None, None, None, None] + cols, mask=mask,
                    other=-float("inf")).to(gl.float32)

        # Receive buffer [CTAS (dest CTA), BLOCK_M, CTAS (source CTA), W]; CGA_BUF puts dim 0 on
        # the CTAs, so each CTA holds its [1, BLOCK_M, CTAS, W] slice. One mbarrier per CTA.
        buf_l: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[3, 2, 1, 0], cga_layout=CGA_BUF)
        buf = gl.allocate_shared_memory(gl.int64, [CTAS, BLOCK_M, CTAS, W], buf_l)
        bar = mbarrier.allocate_mbarrier()
        mbarrier.init(bar, count=1)
        # arrive.expect_tx: the phase completes once BLOCK_M * CTAS * W partials (8 B each) land.
        # The compiler's cluster barrier that publishes the init goes before this first use: late
        # (LATE_EXPECT, quack's order), the CTAs meet there only after their local reductions.
        if not LATE_EXPECT:
            mbarrier.expect(bar, BLOCK_M * CTAS * W * 8)

        m_w = gl.max(gl.max(x, axis=2), axis=3)             # [M, C, W]
        shift = gl.where(m_w == -float("inf"), 0.0, m_w)    # all -inf part: sum 0, not NaN
        e = gl.exp2((x - gl.expand_dims(gl.expand_dims(shift, 3), 2)) * LOG2E)
        s_w = gl.sum(gl.sum(e, axis=2), axis=3)
        part = _pack(m_w, s_w)

        # Send layout [CTAS (dest), BLOCK_M, CTAS (source), W]: lane d -> CTA d (lanes past CTAS
        # replicate and are predicated off by the lowering), warp w, source CTA from CGA_SEND.
        ls: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1], [CTAS, 32 // CTAS, 1, 1], [1, 1, 1, W], [0, 1, 2, 3],
                                            cga_layout=CGA_SEND)
        part = gl.convert_layout(part, gl.SliceLayout(0, ls))
        send = part[None, :, :, :] + gl.zeros([CTAS, BLOCK_M, CTAS, W], gl.int64, ls)
        if LATE_EXPECT:
            mbarrier.expect(bar, BLOCK_M * CTAS * W * 8)
        hopper.async_store(buf, send, bar)
        mbarrier.wait(bar, 0, deps=[buf])

        # Every warp reads this CTA's whole slice (warps replicate) and combines in-warp.
        TW: gl.constexpr = W if W < 32 else 32
        lr: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1], [1, 1, 32 // TW, TW], [W, 1, 1, 1], [3, 2, 1, 0],
                                            cga_layout=CGA_BUF)
        got = buf.load(lr)
        tot = gl.reduce(gl.reduce(got, 3, _online_combine), 2, _online_combine)     # [CTAS, M]
        m_row, s_row = _unpack(gl.convert_layout(gl.permute(tot, (1, 0)), l2))       # [M, C]
        scale = gl.exp2((m_w - m_row[:, :, None]) * LOG2E) / s_row[:, :, None]
        gl.store(y_ptr + (rows64 * y_row_stride)[:, None, None, None, None] + cols,
                 (e * gl.expand_dims(gl.expand_dims(scale, 3), 2)).to(y_ptr.dtype.element_ty), mask=mask)

    return xgemm_softmax, xgemm_softmax_online, xgemm_softmax_mbarrier


# The non-constexpr parameters, in order (the cubin adds two scratch pointers after them).
PARAMS = (("x_ptr", "ptr"), ("y_ptr", "ptr"), ("n_rows", "i32"), ("n_cols", "i32"),
          ("x_row_stride", "i64"), ("y_row_stride", "i64"))


def gluon_compile_args(key: str, arch: str):
    """(jit function, signature, constexprs, attrs, options) for triton.compile; used by gluon_cache."""
    cfg = Config.from_key(key)
    cfg.check()
    fn = _define_kernels()[min(cfg.online, 2)]
    sig = {"x_ptr": f"*{_SHORT[cfg.in_dtype]}", "y_ptr": f"*{_SHORT[cfg.out_dtype]}", "n_rows": "i32",
           "n_cols": "i32", "x_row_stride": "i64", "y_row_stride": "i64"}
    constexprs = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "VEC": cfg.vec, "TPW_M": cfg.tpw_m,
                  "TPW_N": cfg.tpw_n, "WPC_M": cfg.wpc_m, "WPC_N": cfg.wpc_n, "CTAS": cfg.ctas, "CGA": cfg.cga}
    if cfg.online == 0:
        constexprs["SHIFT"] = bool(cfg.shift)
    if cfg.online >= 2:
        # [dest, block_m, source, warps]: the sent tensor has the CTA bits on the source dim,
        # the receive buffer (and its loads) on the destination dim
        bits = range(cfg.ctas.bit_length() - 1)
        constexprs["CGA_SEND"] = tuple((0, 0, 1 << i, 0) for i in bits)
        constexprs["CGA_BUF"] = tuple((1 << i, 0, 0, 0) for i in bits)
        constexprs["LATE_EXPECT"] = cfg.online == 3
    sig.update({k: "constexpr" for k in constexprs})
    attrs = {}
    if cfg.shift:
        # only the bases are 16-byte aligned: the kernel rounds each row down to its chunk
        attrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
    if cfg.align > 1:
        # 16-byte aligned bases; cols and strides multiples of VEC: lets the compiler prove
        # that each thread's VEC elements are contiguous, aligned and equally masked (v4 loads).
        attrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]],
                 (3,): [["tt.divisibility", cfg.align]], (4,): [["tt.divisibility", cfg.align]],
                 (5,): [["tt.divisibility", cfg.align]]}
    options = {"num_warps": cfg.warps, "num_ctas": cfg.ctas, "enable_fp_fusion": False}
    return fn, sig, constexprs, attrs, options


def gluon_patch_ptx(key: str, ptx: str) -> str:
    """online=3: the PTX without the cluster barrier triton puts before the kernel's one `ret`
    (gluon_cache reassembles it with triton's ptxas). Other configs: unchanged."""
    if Config.from_key(key).online != 3:
        return ptx
    import re
    patched, count = re.subn(r"barrier\.cluster\.arrive\.aligned;\s*barrier\.cluster\.wait\.aligned;\s*(ret;)",
                             r"\1", ptx)
    if count != 1:
        raise RuntimeError(f"{key}: expected one exit cluster barrier before ret, found {count}")
    return patched


def gluon_entries(arch: str = "sm_90a", siblings: bool = True) -> List[str]:
    """The entry keys the AOT build makes: every dtype pair x every BLOCK_N x aligned/unaligned,
    and (siblings=True) each config in two kernels (the pick and its sibling()), so a policy may
    pick either without a compiler (the GPU tests run both), plus the shift variant of each
    single-CTA unaligned pick: 675 cubins (576 before the shift variant: ~27 MB, ~2.7 MB as
    .tar.xz)."""
    keys = []
    for i in DTYPES:
        for o in DTYPES:
            block_n = MIN_BLOCK_N
            while block_n <= MAX_COLS:
                for aligned in (True, False):
                    cfg = pick_config(block_n, i, o, aligned)
                    keys.append(cfg.key)
                    if siblings:
                        keys.append(sibling(cfg).key)
                shifted = pick_config(block_n, i, o, False, shifted=True)
                if shifted.shift:
                    keys.append(shifted.key)
                block_n *= 2
    return keys


# ----------------------------------------------------------------------------------------------
# The kernel protocol (kernels/_common.py)
# ----------------------------------------------------------------------------------------------

def _row_stride(shape, strides) -> Optional[int]:
    """The one stride (elements) between consecutive rows of shape[:-1], or None if the leading
    dims do not collapse. Size-1 dims are free; a single row gets stride 0 (never used)."""
    lead = [(n, s) for n, s in zip(shape[:-1], strides[:-1]) if n != 1]
    if not lead:
        return 0
    for (n_outer, s_outer), (n_inner, s_inner) in zip(lead, lead[1:]):
        if s_outer != s_inner * n_inner:
            return None
    return lead[-1][1]


def _rows_view(shape, strides):
    """(row stride, last-dim stride) of an operand whose last dim is the reduced one, or None."""
    if not shape:
        return 0, 1
    rs = _row_stride(shape, strides)
    if rs is None:
        return None
    return rs, (strides[-1] if shape[-1] != 1 else 1)


class GluonSoftmax:
    name = NAME
    ops = ("softmax",)
    backend = "gluon"

    def __init__(self):
        self._launchers: Dict[tuple, tuple] = {}

    # -- supports ------------------------------------------------------------------------------
    def supports(self, problem) -> Optional[str]:
        dev = problem.device
        if dev.kind != "cuda":
            return "needs a CUDA device"
        if dev.arch != (9, 0):
            return f"needs a Hopper GPU (sm_90); this device is {dev.arch}"
        x = problem.x
        if x.dtype not in DTYPES:
            return f"x dtype {x.dtype} is not one of {DTYPES}"
        if problem.out_dtype not in DTYPES:
            return f"output dtype {problem.out_dtype} is not one of {DTYPES}"
        if problem.cols > MAX_COLS:
            return f"rows of {problem.cols} exceed {MAX_COLS} (a row must fit in one cluster's registers)"
        if problem.rows >= 2 ** 31:
            return f"{problem.rows} rows exceed 2**31 - 1"
        if problem.cols > 1 and x.majorness != ROW:
            return "the reduced dim is not contiguous"
        view = _rows_view(x.shape, x.strides)
        if view is None or (problem.cols > 1 and view[1] != 1):
            return "the leading dims do not collapse to one row stride"
        if problem.rows == 0 or problem.cols == 0:
            return None
        aligned = x.alignment >= 16 and problem.cols % (16 // _ITEMSIZE[x.dtype]) == 0
        return gluon_cache.available(pick_config(problem.cols, x.dtype, problem.out_dtype, aligned).key)


    # -- policy --------------------------------------------------------------------------------
    def policy(self, problem) -> Policy:
        cfg = pick_config(max(problem.cols, 1), problem.x.dtype if problem.x.dtype in DTYPES else "float32",
                          problem.out_dtype if problem.out_dtype in DTYPES else "float32",
                          problem.x.alignment >= 16)
        return policy_of(cfg)

    # -- jax.jit -------------------------------------------------------------------------------
    def jax_lowering(self, problem, policy, *, portable: bool = False, sm_margin: int = 0):
        """Its prebuilt cubin on XLA's buffers: rows x cols with row stride cols (the lowering asks
        XLA for the reduced dim minor-most)."""
        vec = 16 // _ITEMSIZE[problem.x.dtype]
        based = problem.x.alignment >= 16                   # XLA buffers: >= 16-byte bases
        aligned = based and problem.cols % vec == 0
        cfg = self._config(policy, problem.x.dtype, problem.out_dtype, aligned, based)
        entry = gluon_cache.lookup(cfg.key)
        if entry is None:
            raise ValueError(f"{NAME}: no cache entry {cfg.key}")
        rows, cols = problem.rows, problem.cols
        args = (Param.input(0), Param.output(0), Param.i32(rows), Param.i32(cols), Param.i64(cols), Param.i64(cols))
        return triton_launch(entry.cubin, entry.meta, -(-rows // cfg.block_m), args,
                             alignment=16 if aligned or cfg.shift else 1)

    @staticmethod
    def _config(policy, in_dtype, out_dtype, aligned, shifted) -> Config:
        """The policy's config; its shift variant when shifted and that one is in the cache."""
        cfg = config_from_policy(policy, in_dtype, out_dtype, aligned, shifted)
        if cfg.shift and gluon_cache.available(cfg.key) is not None:
            cfg = cfg._replace(shift=0)
        return cfg

    def prebuild(self, arch: str):
        return gluon_entries(arch)

    # -- run -----------------------------------------------------------------------------------
    def run(self, problem, policy, operands, out, stream) -> None:
        resolved = self._resolve(problem, policy, operands[0], out)
        if resolved is not None:
            launcher, grid, xs, ys = resolved
            launcher(grid, stream, operands[0].ptr, out.ptr, problem.rows, problem.cols, xs, ys)

    def bind(self, problem, policy, operands, out):
        """run() resolved for this signature (shapes, strides, dtypes, 16-byte class):
        go(x, y, stream) on torch tensors laid out as operands[0] / out launches what run()
        would (xgemm/torch/fastpath.py's repeat calls). None for an empty problem."""
        resolved = self._resolve(problem, policy, operands[0], out)
        if resolved is None:
            return None
        launcher, grid, xs, ys = resolved
        rows, cols = problem.rows, problem.cols

        def go(x, y, stream: int) -> None:
            launcher(grid, stream, x.data_ptr(), y.data_ptr(), rows, cols, xs, ys)
        go.native = launcher.native_recipe(grid, (A, OUT), (rows, cols, xs, ys))
        return go

    def _resolve(self, problem, policy, x, out):
        """(launcher, grid, x row stride, y row stride), or None for an empty problem."""
        rows, cols = problem.rows, problem.cols
        if rows == 0 or cols == 0:
            return None
        xst, yst = x.strides, out.strides
        if len(xst) == 2 and len(yst) == 2 and (xst[1] == 1 and yst[1] == 1 or cols == 1):
            xs, ys = xst[0], yst[0]             # the API's (rows, cols) views: the common case
        else:
            xv = _rows_view(x.shape, xst)
            yv = _rows_view(out.shape, yst)
            if xv is None or yv is None or (cols > 1 and (xv[1] != 1 or yv[1] != 1)):
                raise KernelUnavailableError(
                    f"{NAME}: x (shape {x.shape}, strides {xst}) or out (shape {out.shape}, strides "
                    f"{yst}) is not rows x cols with a contiguous reduced dim; compact it first")
            xs, ys = xv[0], yv[0]
        if rows == 1:
            xs = ys = 0
        # 16-byte vectors need aligned bases and cols/strides multiples of vec (a power of two); the
        # shift variant, aligned bases and strides equal modulo vec (each row's shift is then x's)
        vec = 16 // x.itemsize
        based = not ((x.ptr | out.ptr) & 15)
        aligned = based and not ((cols | xs | ys) & (vec - 1))
        shifted = based and not aligned and not ((xs - ys) & (vec - 1))
        lkey = (policy.tile, policy.warps, policy.ctas_per_row, policy.notes, x.dtype, out.dtype, aligned,
                shifted, x.device.index)
        prepared = self._launchers.get(lkey)
        if prepared is None:
            prepared = self._prepare(lkey, policy, x.dtype, out.dtype, aligned, shifted, x.device.index)
        launcher, block_m = prepared
        return launcher, (rows + block_m - 1) // block_m, xs, ys

    def _prepare(self, lkey, policy, in_dtype, out_dtype, aligned, shifted, device_index):
        cfg = self._config(policy, in_dtype, out_dtype, aligned, shifted)
        entry = gluon_cache.lookup(cfg.key)
        if entry is None:
            raise ValueError(f"{cfg.key} names no {NAME} variant")
        prepared = (launch.get_launcher(entry.cubin, entry.meta, device_index), cfg.block_m)
        self._launchers[lkey] = prepared
        return prepared


KERNEL = GluonSoftmax()
KERNELS = (KERNEL,)
