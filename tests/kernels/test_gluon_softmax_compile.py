"""gluon_softmax, compile-only on the CPU: PTX/metadata of representative variants, the on-disk
cache (round trip, miss errors), the picker's invariants, and a fresh process that reads the cache
and prepares a launch without importing triton."""
from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from xgemm.core.problem import ROW, STRIDED, Device, Operand, SoftmaxProblem
from xgemm.kernels import gluon_softmax as gs

triton = pytest.importorskip("triton")
from xgemm.runtime import gluon_cache  # noqa: E402

if not gluon_cache.can_compile():
    pytest.skip(f"needs triton >= 3.8 (found {triton.__version__})", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
TABLE65 = gs.pick_config(65536, "float32", "float32", aligned=True)        # the picker's cluster config
SHORT = gs.pick_config(256, "float32", "float32", aligned=True)            # several rows per CTA
ODD = gs.pick_config(1000, "bfloat16", "float16", aligned=False)           # unaligned, mixed dtypes
MULTI = TABLE65._replace(online=0)                                           # two cross-CTA reductions
ONLINE = TABLE65._replace(online=1)                                          # one packed exchange
MBAR = gs.mbarrier_variant(TABLE65)                                          # st.async + mbarrier exchange
QUACK = MBAR._replace(online=3)                                              # quack's order, no exit barrier
SHIFT = gs.pick_config(4095, "float16", "float16", aligned=False, shifted=True)   # odd rows, aligned bases


@pytest.fixture(scope="module")
def compiled(gluon_cache_dir):
    """Representative variants, compiled once: {cfg: (CompiledKernel, Entry)}."""
    out = {}
    for cfg in (MULTI, SHORT, ODD, ONLINE, MBAR, QUACK, SHIFT):
        ck = gluon_cache.compile_kernel(cfg.key)[0]
        entry = gluon_cache.lookup(cfg.key)          # compiles on first use into gluon_cache_dir
        out[cfg] = (ck, entry)
    return out


def _ops(ptx: str):
    return set(re.findall(r"\b(barrier\.cluster[\w.]*|mapa\.[\w:.]+|ld\.shared::cluster[\w.]*|ld\.global[\w.]*|"
                          r"st\.global[\w.]*|ex2\.approx[\w.]*)", ptx))


def test_multi_cta_ptx_has_cluster_reduction(compiled):
    ptx = compiled[MULTI][0].asm["ptx"]
    assert MULTI.ctas > 1 and not MULTI.online
    assert re.search(rf"\.reqnctapercluster\s+{MULTI.ctas}\b", ptx), "cluster size not declared"
    ops = _ops(ptx)
    assert {"barrier.cluster.arrive.aligned", "barrier.cluster.wait.aligned"} <= ops
    assert any(o.startswith("mapa.shared::cluster") for o in ops)
    assert any(o.startswith("ld.shared::cluster") for o in ops)
    # aligned fp32: 16-byte global accesses only
    assert {o for o in ops if o.startswith(("ld.global", "st.global"))} == {"ld.global.v4.b32", "st.global.v4.b32"}


def test_online_variant_exchanges_once(compiled):
    ptx = compiled[ONLINE][0].asm["ptx"]
    two = compiled[MULTI][0].asm["ptx"]
    assert ONLINE.online and ONLINE.ctas == MULTI.ctas > 1
    assert re.search(rf"\.reqnctapercluster\s+{ONLINE.ctas}\b", ptx)
    ops = _ops(ptx)
    assert {o for o in ops if o.startswith(("ld.global", "st.global"))} == {"ld.global.v4.b32", "st.global.v4.b32"}
    # (max, sum) travel packed in one 64-bit word: one remote read and half the cluster barriers
    assert "ld.shared::cluster.b64" in ops and not any(o.startswith("ld.shared::cluster.b32") for o in ops)
    assert ptx.count("barrier.cluster.wait") * 2 == two.count("barrier.cluster.wait") == 4


def _at(ptx: str, pattern: str):
    """Line numbers of the PTX instructions matching pattern (comments and debug info dropped)."""
    lines = [ln.split("//")[0] for ln in ptx.splitlines()]
    return [i for i, ln in enumerate(lines) if re.search(pattern, ln)]


def test_mbarrier_variant_exchanges_without_cluster_barrier(compiled):
    """online=2: each warp st.async's its packed (max, sum) into every CTA, each CTA waits on its own
    mbarrier; the only cluster barriers are the relaxed one after mbarrier.init (so that remote CTAs
    see the barrier initialised) and the one triton puts before every multi-CTA kernel's exit."""
    ptx = compiled[MBAR][0].asm["ptx"]
    assert MBAR.online == 2 and MBAR.ctas == ONLINE.ctas > 1
    assert re.search(rf"\.reqnctapercluster\s+{MBAR.ctas}\b", ptx), "cluster size not declared"
    ops = _ops(ptx)
    assert {o for o in ops if o.startswith(("ld.global", "st.global"))} == {"ld.global.v4.b32", "st.global.v4.b32"}
    st_async = _at(ptx, r"st\.async\.weak\.shared::cluster\.mbarrier::complete_tx::bytes\.b64\b")
    init = _at(ptx, r"mbarrier\.init\.shared")
    expect = _at(ptx, r"mbarrier\.arrive\.expect_tx\.shared")
    wait = _at(ptx, r"mbarrier\.try_wait\.parity\.shared")
    relaxed = _at(ptx, r"barrier\.cluster\.arrive\.relaxed")
    arrive = _at(ptx, r"barrier\.cluster\.arrive")
    cl_wait = _at(ptx, r"barrier\.cluster\.wait")
    st_global = _at(ptx, r"st\.global")
    ret = _at(ptx, r"\bret;")
    # one packed 8-byte store per lane (the packed pair), one mbarrier per CTA, one phase waited on
    assert len(st_async) == len(init) == len(expect) == len(wait) == 1
    # expect_tx counts every partial a CTA receives: ctas * warps of 8 bytes each
    assert re.search(rf"expect_tx\.shared::cta\.b64\s+_,\s*\[%r\d+\],\s*{MBAR.ctas * MBAR.warps * 8};",
                     ptx), "expect_tx bytes"
    # the init barrier (relaxed, after mbarrier.init) and the exit barrier only: none on the row's path
    assert len(relaxed) == 1 and init[0] < relaxed[0] < expect[0] < st_async[0] < wait[0]
    assert len(arrive) == len(cl_wait) == 2, (arrive, cl_wait)
    exit_arrive = [a for a in arrive if a not in relaxed]
    assert exit_arrive[0] > max(st_global) and ret[-1] > exit_arrive[0]
    assert not [a for a in arrive + cl_wait if st_async[0] < a < max(st_global)]
    # no remote loads (each CTA reads its own buffer) and no layout-conversion scratch: shared is
    # exactly the receive buffer plus the mbarrier
    assert not any(o.startswith("ld.shared::cluster") for o in ops)
    assert compiled[MBAR][0].metadata.shared == MBAR.block_m * MBAR.ctas * MBAR.warps * 8 + 8
    # the two-exchange kernels need a cluster barrier between the partials and the combine
    one = compiled[ONLINE][0].asm["ptx"]
    assert [w for w in _at(one, r"barrier\.cluster\.wait") if w < max(_at(one, r"st\.global"))]


def test_single_cta_variants_have_no_cluster_code(compiled):
    for cfg in (SHORT, ODD):
        ptx = compiled[cfg][0].asm["ptx"]
        assert cfg.ctas == 1
        assert "barrier.cluster" not in ptx and "mapa" not in ptx and ".reqnctapercluster" not in ptx
    short_ops = _ops(compiled[SHORT][0].asm["ptx"])
    assert "ld.global.v4.b32" in short_ops
    # unaligned variant: no vector loads (bases/strides carry no divisibility promise)
    odd_ops = _ops(compiled[ODD][0].asm["ptx"])
    assert not any(".v" in o for o in odd_ops if o.startswith(("ld.global", "st.global"))), odd_ops


def test_shift_variant_moves_whole_chunks_as_vectors(compiled):
    """Odd rows on aligned bases: every whole 16-byte chunk a thread owns is one ld/st.global.v4
    (elems_per_thread / vec of them), the partial first and last chunk of a row go element by
    element (one head and one tail element per thread), and the key keeps the old variants'."""
    assert SHIFT.shift == 1 and SHIFT.align == 1 and SHIFT.key.endswith("-o0-s1")
    assert gs.Config.from_key(SHIFT.key) == SHIFT and SHIFT._replace(shift=0).key == ODD._replace(
        in_dtype="float16", out_dtype="float16", block_n=4096, block_m=SHIFT.block_m, warps=SHIFT.warps).key
    ptx = compiled[SHIFT][0].asm["ptx"]
    count = lambda op: len(re.findall(r"\b" + re.escape(op) + r"\b", ptx))
    per_thread = SHIFT.elems_per_thread // SHIFT.vec
    assert count("ld.global.v4.b32") == per_thread and count("st.global.v4.b32") == per_thread, ptx.count("v4")
    assert count("ld.global.b16") == 2 and count("st.global.b16") == 2
    # the unaligned variant of the same config: every element a scalar access
    odd = gluon_cache.compile_kernel(SHIFT._replace(shift=0).key)[0].asm["ptx"]
    assert "v4" not in "".join(re.findall(r"\b[ls][dt]\.global[\w.]*", odd))


def test_shift_variant_only_where_one_cta_owns_a_row():
    for cols in (1, 7, 1000, 4095, 16383):
        assert gs.pick_config(cols, "bfloat16", "float32", aligned=False, shifted=True).shift == 1
        assert gs.pick_config(cols, "bfloat16", "float32", aligned=True, shifted=True).shift == 0
    for cols in (16385, 100000):                     # cluster rows keep the element-wise variant
        assert gs.pick_config(cols, "float16", "float16", aligned=False, shifted=True).shift == 0
    with pytest.raises(AssertionError):
        gs.Config("float16", "float16", 1024, 1, 4, 1, 8, 8, 0, 1).check()     # aligned and shifted


def test_metadata(compiled, gluon_cache_dir):
    for cfg, (ck, entry) in compiled.items():
        meta = entry.meta
        assert meta["key"] == cfg.key and meta["kernel"] == "gluon_softmax" and meta["arch"] == "sm_90a"
        assert meta["num_warps"] == cfg.warps and meta["num_ctas"] == cfg.ctas
        assert meta["shared"] == ck.metadata.shared
        assert meta["global_scratch_size"] == 0 and meta["profile_scratch_size"] == 0
        assert [p["name"] for p in meta["params"]] == [n for n, _ in gs.PARAMS] + ["global_scratch",
                                                                                    "profile_scratch"]
        assert [p["ptx"] for p in meta["params"]] == ["u64", "u64", "u32", "u32", "u64", "u64", "u64", "u64"]
        assert re.search(rf"\.entry\s+{meta['name']}\s*\(", ck.asm["ptx"])
        assert meta["constexprs"]["BLOCK_N"] == cfg.block_n and meta["constexprs"]["BLOCK_M"] == cfg.block_m
        assert len(meta["constexprs"]["CGA"]) == cfg.ctas.bit_length() - 1
        assert meta["triton_version"] == triton.__version__
        # triton's cubin, except online=3's: reassembled from the patched PTX
        assert (Path(entry.cubin_path).read_bytes() == ck.asm["cubin"]) == (cfg.online != 3)
        # on disk: <root>/gluon/<kernel>-<source hash>-triton<ver>/sm_90a/<entry>.{cubin,json}
        rel = Path(entry.cubin_path).relative_to(gluon_cache_dir)
        assert rel.parts[0] == "gluon"
        assert rel.parts[1] == f"gluon_softmax-{gluon_cache.source_hash('gluon_softmax')}-triton{triton.__version__}"
        assert json.loads(Path(entry.cubin_path[:-6] + ".json").read_text()) == meta


def test_cache_round_trip_and_misses(compiled, gluon_cache_dir, monkeypatch):
    gluon_cache.clear_memory()
    again = gluon_cache.lookup(MULTI.key, compile=False)     # from disk, no compile
    assert again is not None and again.meta == compiled[MULTI][1].meta and again.cubin == compiled[MULTI][1].cubin
    missing = gs.pick_config(131072, "float16", "float32", aligned=True).key
    assert gluon_cache.lookup(missing, compile=False) is None
    assert gluon_cache.lookup("not_a_kernel/x", compile=False) is None
    # no compiler: a miss is a clear error naming the fix; supports() declines with the same advice
    monkeypatch.setattr(gluon_cache, "can_compile", lambda: False)
    with pytest.raises(gluon_cache.CacheMissError, match="build-cache"):
        gluon_cache.lookup(missing)
    assert "build-cache" in gluon_cache.unavailable_reason(missing)
    assert gluon_cache.unavailable_reason(MULTI.key) is None
    # another cache root sees nothing
    monkeypatch.setenv("XGEMM_CACHE_DIR", str(gluon_cache_dir / "elsewhere"))
    gluon_cache.clear_memory()
    assert gluon_cache.lookup(MULTI.key, compile=False) is None
    gluon_cache.clear_memory()


def test_build_reuses_cached_entries(compiled, gluon_cache_dir):
    before = {cfg: os.stat(e.cubin_path).st_mtime_ns for cfg, (_, e) in compiled.items()}
    entries = gluon_cache.build(kernels=[c.key for c in compiled], jobs=1)
    assert [e.key for e in entries] == [c.key for c in compiled]
    assert {cfg: os.stat(e.cubin_path).st_mtime_ns for cfg, e in zip(compiled, entries)} == before


def test_fresh_process_reads_cache_without_triton(compiled, gluon_cache_dir):
    """A new interpreter (triton import blocked) finds the prebuilt entries, checks availability and
    builds the launch parameters, and never imports triton."""
    code = textwrap.dedent(f"""
        import sys, importlib.abc
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "triton" or name.startswith("triton."):
                    raise ImportError("triton blocked by the test")
        sys.meta_path.insert(0, Block())
        from xgemm.runtime import gluon_cache
        from xgemm.runtime import launch
        from xgemm.kernels import gluon_softmax as gs
        from xgemm.core.problem import Device, Operand, SoftmaxProblem, ROW
        assert not gluon_cache.can_compile()
        e = gluon_cache.lookup({TABLE65.key!r})
        assert e.meta["num_ctas"] == {TABLE65.ctas} and len(e.cubin) > 1000
        fmt = launch.param_format(e.meta["params"])
        op = Operand((8, 65536), (65536, 1), "float32", ROW, 16)
        p = SoftmaxProblem(8, 65536, (8, 65536), 1, op, "float32", "torch", Device("cuda", 0, (9, 0)))
        assert gs.KERNEL.supports(p) is None, gs.KERNEL.supports(p)
        op = Operand((8, 65536), (65536, 1), "float16", ROW, 16)
        p = SoftmaxProblem(8, 65536, (8, 65536), 1, op, "float16", "torch", Device("cuda", 0, (9, 0)))
        assert "build-cache" in gs.KERNEL.supports(p), gs.KERNEL.supports(p)
        try:
            gluon_cache.lookup(gs.pick_config(65536, "float16", "float16", True).key)
            raise SystemExit("expected CacheMissError")
        except gluon_cache.CacheMissError:
            pass
        assert not any(m == "triton" or m.startswith("triton.") for m in sys.modules), "triton imported"
        print("OK", fmt)
    """)
    env = dict(os.environ, XGEMM_CACHE_DIR=str(gluon_cache_dir), PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("OK <QQixxxxixxxxqqQQ"), r.stdout


def test_param_block_layout():
    from xgemm.runtime import launch
    params = [{"name": n, "type": t, "ptx": p} for n, t, p in
              [("x", "*fp32", "u64"), ("y", "*fp16", "u64"), ("r", "i32", "u32"), ("c", "i32", "u32"),
               ("xs", "i64", "u64"), ("ys", "i64", "u64"), ("global_scratch", "*i8", "u64"),
               ("profile_scratch", "*i8", "u64")]]
    fmt = launch.param_format(params)
    buf = bytearray(struct.calcsize(fmt))
    struct.pack_into(fmt, buf, 0, 0x1000, 0x2000, 7, 9, -3, 5, 0, 0)
    assert len(buf) == 64
    assert struct.unpack_from("<Q", buf, 0)[0] == 0x1000 and struct.unpack_from("<Q", buf, 8)[0] == 0x2000
    assert struct.unpack_from("<i", buf, 16)[0] == 7 and struct.unpack_from("<i", buf, 24)[0] == 9
    assert struct.unpack_from("<q", buf, 32)[0] == -3 and struct.unpack_from("<q", buf, 40)[0] == 5
    with pytest.raises(launch.LaunchError):
        launch.param_format([{"name": "t", "type": "tensordesc", "ptx": "v4"}])


# ---------------------------------------------------------------------------------------------
# Picker and protocol (no compile)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", gs.DTYPES)
def test_picker_covers_every_row_length(dtype):
    cols = 1
    while cols <= gs.MAX_COLS:
        for n in (cols, cols + 1 if cols * 2 <= gs.MAX_COLS else cols, max(1, cols - 1)):
            cfg = gs.pick_config(n, dtype, "float32", aligned=True)
            cfg.check()
            assert cfg.block_n >= n and cfg.block_n < 2 * max(n, gs.MIN_BLOCK_N)
            assert cfg.elems_per_thread <= 128, cfg        # stays in registers
            assert cfg.vec * {"float32": 4, "float16": 2, "bfloat16": 2}[dtype] == 16
            assert Config_round_trip(cfg)
        cols *= 2
    with pytest.raises(ValueError):
        gs.pick_config(gs.MAX_COLS + 1, dtype, dtype, True)


def Config_round_trip(cfg):
    return gs.Config.from_key(cfg.key) == cfg


def test_default_entries_are_distinct_and_valid():
    keys = gs.gluon_entries(siblings=False)
    shifted = [k for k in keys if k.endswith("-s1")]     # one per dtype pair and BLOCK_N <= 16384
    assert len(shifted) == 9 * (16384 .bit_length() - gs.MIN_BLOCK_N.bit_length() + 1)
    assert len(keys) == len(set(keys)) == len(shifted) + 9 * 2 * (
        gs.MAX_COLS.bit_length() - gs.MIN_BLOCK_N.bit_length() + 1)
    both = gs.gluon_entries()
    assert set(keys) < set(both) and len(both) == len(set(both)) == 2 * len(keys) - len(shifted)
    for k in both:
        cfg = gs.Config.from_key(k)
        cfg.check()
        assert cfg.elems_per_thread <= 128, k
    # the mbarrier kernel without the exit barrier (online=3) is the pick for BLOCK_N 32768 ...
    # 262144 (every dtype pair, aligned or not) and the same kernel with it (online=2) is prebuilt
    # as its sibling; 524288 (16 CTAs, 8 warps) stays online=1
    for i in gs.DTYPES:
        for o in gs.DTYPES:
            for aligned in (True, False):
                for n in (32768, 65536, 131072, 262144):
                    cfg = gs.pick_config(n, i, o, aligned)
                    assert cfg.online == 3 and cfg.key in keys, cfg
                    assert cfg.align == (cfg.vec if aligned else 1)
                    sib = gs.sibling(cfg)
                    assert sib == gs.mbarrier_variant(cfg) and sib.key in both, cfg
                    assert sib.key not in keys
                assert gs.pick_config(16384, i, o, aligned).online == 0
                assert gs.pick_config(524288, i, o, aligned).online == 1
    assert {gs.Config.from_key(k).online for k in both} == {0, 1, 2, 3}


def test_online3_meets_late_and_never_at_exit(compiled):
    """online=3: the same exchange as online=2, its expect (hence the init-publishing cluster
    barrier the compiler puts before the mbarrier's first use) after the local reduction, and the
    cached cubin assembled from PTX without the exit cluster barrier."""
    ptx = compiled[QUACK][0].asm["ptx"]             # as triton emitted it, before the patch
    expect = _at(ptx, r"mbarrier\.arrive\.expect_tx\.shared")
    relaxed = _at(ptx, r"barrier\.cluster\.arrive\.relaxed")
    shuffles = _at(ptx, r"shfl\.sync")
    st_async = _at(ptx, r"st\.async")
    assert len(expect) == len(relaxed) == 1 and shuffles and shuffles[0] < relaxed[0] < expect[0] < st_async[0]
    patched = gs.gluon_patch_ptx(QUACK.key, ptx)
    assert len(_at(ptx, r"barrier\.cluster\.arrive")) == 2 and len(_at(patched, r"barrier\.cluster\.arrive")) == 1
    assert re.search(r"barrier\.cluster\.wait\.aligned;\s*ret;", ptx)
    assert not re.search(r"barrier\.cluster\.wait\.aligned;\s*ret;", patched)
    assert gs.gluon_patch_ptx(MBAR.key, ptx) is ptx          # other configs: untouched
    # the cache's cubin is the patched one: its SASS has one cluster-barrier arrive, online=2's two
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if cuobjdump.exists():
        import subprocess
        count = {cfg: subprocess.run([str(cuobjdump), "-sass", compiled[cfg][1].cubin_path], capture_output=True,
                                     text=True, check=True).stdout.count("UCGABAR_ARV") for cfg in (MBAR, QUACK)}
        assert count == {MBAR: 2, QUACK: 1}, count
    assert gs.sibling(QUACK) == MBAR and gs.online_of_notes(gs.policy_of(QUACK).notes) == 3


def test_mbarrier_config_round_trips_and_limits():
    cfg = gs.mbarrier_variant(gs.pick_config(262144, "bfloat16", "float16", aligned=False))
    assert gs.Config.from_key(cfg.key) == cfg and cfg.key.endswith("-o2")
    pol = gs.policy_of(cfg)
    assert "mbarrier" in pol.notes
    assert gs.config_from_policy(pol, "bfloat16", "float16", aligned=False) == cfg
    assert gs.sibling(cfg).online == 1
    assert len(cfg.cga) == cfg.ctas.bit_length() - 1 and all(len(b) == 5 and b[1] for b in cfg.cga)
    # st.async needs a cluster of >= 2 CTAs; the kernel stacks no rows per cluster
    for bad in (gs.pick_config(4096, "float32", "float32", True)._replace(online=2),
                gs.pick_config(1024, "float32", "float32", True)._replace(online=2, ctas=2, block_m=8)):
        with pytest.raises(AssertionError):
            bad.check()


def _problem(rows, cols, dtype="float32", strides=None, device=Device("cuda", 0, (9, 0)), major=ROW, out=None):
    strides = strides or (cols, 1)
    op = Operand((rows, cols), strides, dtype, major, 16)
    return SoftmaxProblem(rows, cols, (rows, cols), 1, op, out or dtype, "torch", device)


def test_supports_reasons():
    k = gs.KERNEL
    assert "CUDA" in k.supports(_problem(4, 8, device=Device("cpu")))
    assert "sm_90" in k.supports(_problem(4, 8, device=Device("cuda", 0, (8, 0))))
    assert "float64" in k.supports(_problem(4, 8, dtype="float64"))
    assert "contiguous" in k.supports(_problem(4, 8, strides=(1, 4), major=STRIDED))
    assert "exceed" in k.supports(_problem(1, gs.MAX_COLS + 1))
    pol = k.policy(_problem(1024, 65536))
    assert pol.tile == (MULTI.block_m, MULTI.block_n) and pol.ctas_per_row == MULTI.ctas == pol.cluster[0]


def test_import_is_light():
    code = ("import sys; import xgemm.kernels.gluon_softmax, xgemm.runtime.gluon_cache, xgemm.runtime.launch; "
            "heavy = [m for m in ('triton', 'torch', 'jax', 'cuda.bindings.driver') if m in sys.modules]; "
            "print(heavy)")
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_run_launch_arguments(monkeypatch):
    """run() turns views into (grid, stream, x, y, rows, cols, x stride, y stride) and picks the
    aligned/unaligned variant by the actual pointers and strides (no GPU: the launcher is recorded)."""
    from xgemm.arrays import ArrayView
    calls = []

    class Rec:
        def __init__(self, aligned):
            self.aligned = aligned

        def __call__(self, *args):
            calls.append((args, self.aligned))

    k = gs.GluonSoftmax()
    monkeypatch.setattr(k, "_prepare", lambda lkey, pol, i, o, aligned, shifted, dev: k._launchers.setdefault(
        lkey, (Rec("shifted" if shifted else aligned), gs.config_from_policy(pol, i, o, aligned).block_m)))
    dev = Device("cuda", 0, (9, 0))

    def go(shape, xstrides, ystrides, xptr=4096, yptr=8192, dtype="float32"):
        rows = 1
        for d in shape[:-1]:
            rows *= d
        p = SoftmaxProblem(rows, shape[-1], shape, len(shape) - 1,
                           Operand(shape, xstrides, dtype, ROW, 16), dtype, "torch", dev)
        item = 4 if dtype == "float32" else 2
        xv = ArrayView(None, "torch", dev, xptr, shape, xstrides, dtype, item, False)
        yv = ArrayView(None, "torch", dev, yptr, shape, ystrides, dtype, item, False)
        calls.clear()
        k.run(p, k.policy(p), (xv,), yv, 77)
        return calls[-1]

    bm = gs.pick_config(1000, "float32", "float32", True).block_m
    (grid, stream, xp, yp, r, c, xs, ys), al = go((37, 1000), (1000, 1), (1000, 1))
    assert (grid, stream, xp, yp, r, c, xs, ys, al) == (-(-37 // bm), 77, 4096, 8192, 37, 1000, 1000, 1000, True)
    args, al = go((37, 1000), (1024, 1), (1000, 1))                  # padded input rows
    assert args[6:] == (1024, 1000)
    args, al = go((37, 1000), (1002, 1), (1000, 1))                  # stride not a multiple of 4
    assert args[6:] == (1002, 1000) and al is False
    args, al = go((37, 1000), (1000, 1), (1000, 1), xptr=4100)       # 4-byte offset base
    assert al is False
    args, al = go((37, 1000), (0, 1), (1000, 1))                     # broadcast rows
    assert args[6:] == (0, 1000)
    args, al = go((1, 999), (999, 1), (999, 1))                      # one row: strides unused
    assert args[4:] == (1, 999, 0, 0)
    args, al = go((3, 5, 64), (320, 64, 1), (320, 64, 1))            # batch dims collapse
    assert args[4:] == (15, 64, 64, 64)
    args, al = go((6, 1), (7, 3), (1, 1))                            # cols == 1: last stride free
    assert args[4:] == (6, 1, 7, 1)
    with pytest.raises(Exception, match="compact"):
        go((3, 5, 64), (640, 64, 1), (320, 64, 1))                   # (3, 5) rows do not collapse
    # odd rows on 16-byte bases with strides equal modulo vec take the shift variant; a misaligned
    # base or strides that differ modulo vec keep the element-wise one
    assert go((37, 1001), (1001, 1), (1001, 1))[1] == "shifted"
    assert go((1, 999), (999, 1), (999, 1))[1] == "shifted"
    assert go((37, 1001), (1001, 1), (1001, 1), xptr=4100)[1] is False
    assert go((37, 1001), (1002, 1), (1001, 1))[1] is False
    assert go((37, 1001), (1005, 1), (1001, 1))[1] == "shifted"        # 1005 - 1001 = vec (fp32)
    assert go((37, 1000), (1000, 1), (1000, 1))[1] is True
