"""gluon_matmul_sm90, compile-only on the CPU: the sm_90a cluster matmul's PTX (wgmma fed by
multicast TMA), its cache metadata (CTAs, shared memory, the expanded TMA-descriptor params and
tensordesc_meta), the sm_100a 2-CTA tcgen05 variant, and the host-side TMA map parameters."""
from __future__ import annotations

import json
import re

import pytest

from xgemm.core.problem import Device
from xgemm.kernels import gluon_matmul_sm90 as gm

triton = pytest.importorskip("triton")
from xgemm.runtime import gluon_cache  # noqa: E402

if not gluon_cache.can_compile():
    pytest.skip(f"needs triton >= 3.8 (found {triton.__version__})", allow_module_level=True)

H_F16 = gm.pick_config("float16", "float16", b_kmajor=False)                 # B N-major
H_BF16_F32 = gm.Config("sm_90a", "bfloat16", "float32", *gm._SM90_TILES[1][:5], gm._SM90_TILES[1][5], True)
B_2CTA = gm.pick_config("bfloat16", "bfloat16", b_kmajor=False, arch="sm_100a")


@pytest.fixture(scope="module")
def built(gluon_cache_dir):
    """Each config compiled once through the cache: {cfg: (CompiledKernel, Entry)}."""
    return {cfg: (gluon_cache.compile_kernel(cfg.key, cfg.arch)[0], gluon_cache.lookup(cfg.key, cfg.arch))
            for cfg in (H_F16, H_BF16_F32, B_2CTA)}


def _ops(ptx: str):
    return set(re.findall(r"\b(wgmma\.mma_async[\w.]*|cp\.async\.bulk\.tensor[\w.:]*|tcgen05\.mma[\w.:]*)", ptx))


@pytest.mark.parametrize("cfg", [H_F16, H_BF16_F32], ids=["f16-bN", "bf16-f32-bK"])
def test_sm90_ptx_wgmma_fed_by_multicast_tma(built, cfg):
    ptx = built[cfg][0].asm["ptx"]
    ops = _ops(ptx)
    it = {"float16": "f16", "bfloat16": "bf16"}[cfg.in_dtype]
    assert any(o.startswith("wgmma.mma_async") and o.endswith(f".f32.{it}.{it}") for o in ops), ops
    loads = {o for o in ops if o.startswith("cp.async.bulk.tensor") and ".global.mbarrier" in o}
    assert any(".multicast::cluster" in o for o in loads), loads          # A: one load, both CTAs
    assert any(o.startswith("cp.async.bulk.tensor.2d.global.shared") for o in ops)   # TMA store
    assert re.search(r"\.reqnctapercluster\s+2\b", ptx)
    assert "mbarrier.arrive.shared::cluster" in ptx        # the pair's `empty` barrier, remote arrive


def test_sm90_metadata(built):
    for cfg in (H_F16, H_BF16_F32):
        ck, entry = built[cfg]
        meta = entry.meta
        assert meta["num_ctas"] == ck.metadata.num_ctas == gm.CLUSTER
        assert meta["num_warps"] == cfg.warps
        # the pipeline's buffers are all there, and it fits Hopper's 227 KB per CTA
        assert cfg.smem_bytes() <= meta["shared"] <= 227 * 1024
        assert meta["global_scratch_size"] == 0 and meta["profile_scratch_size"] == 0
        with open(entry.cubin_path[:-len(".cubin")] + ".json") as f:
            assert json.load(f) == meta                    # the cache's JSON round-trips


def test_descriptor_params_expanded(built):
    meta = built[H_F16][1].meta
    names = [p["name"] for p in meta["params"]]
    ptx = [p["ptx"] for p in meta["params"]]
    desc = ["b8[128]", "u32", "u32", "u64", "u64"]      # map by value, shape i32 x2, strides i64 x2
    assert ptx == desc * 3 + ["u32"] * 3 + ["u64", "u64"]
    assert names[:5] == ["a_desc", "a_desc.shape0", "a_desc.shape1", "a_desc.stride0", "a_desc.stride1"]
    assert names[-5:] == ["M", "N", "K", "global_scratch", "profile_scratch"]
    slots = gm.param_slots(meta["params"])
    for (off, size), p in zip(slots, meta["params"]):
        if p["ptx"] == "b8[128]":
            assert size == 128 and off % 64 == 0
    assert all(b[0] >= a[0] + a[1] for a, b in zip(slots, slots[1:]))   # no overlap


def test_tensordesc_meta_boxes(built):
    for cfg in (H_F16, H_BF16_F32):
        tm = built[cfg][1].meta["tensordesc_meta"]
        assert len(tm) == 3
        a, b, c = tm
        assert a["block_size"] == [cfg.bm, cfg.bk]                  # A whole (multicast) per load
        assert a["elem_size"] == 2 and c["elem_size"] == {"float32": 4}.get(cfg.out_dtype, 2)
        # boxes never exceed the swizzle width (128 B innermost): triton splits wider tiles
        for d in tm:
            assert d["block_size"][-1] * d["elem_size"] <= 128


def test_tma_params_from_meta(built):
    cfg = H_BF16_F32
    a_meta, b_meta, c_meta = built[cfg][1].meta["tensordesc_meta"]
    m, n, k = 1000, 4096, 520
    ptr = 0x7F0000000000
    # A (M, K) row-major with a padded row stride
    p = gm.tma_params(a_meta, ptr, (m, k), (k + 8, 1))
    assert p.rank == 2 and p.dims == (k, m) and p.strides == ((k + 8) * 2,)
    assert p.box == tuple(reversed(a_meta["block_size"])) and p.elem_strides == (1, 1)
    assert p.dtype == gm._TMA_DTYPE["bfloat16"] and p.swizzle == a_meta["swizzle"]
    # B K-major: the kernel addresses B^T (N, K)
    pb = gm.tma_params(b_meta, ptr, (n, k), (k, 1))
    assert pb.dims == (k, n) and pb.strides == (k * 2,)
    pc = gm.tma_params(c_meta, ptr, (m, n), (n, 1))
    assert pc.dtype == gm._TMA_DTYPE["float32"] and pc.strides == (n * 4,)
    with pytest.raises(ValueError):
        gm.tma_params(a_meta, ptr + 2, (m, k), (k, 1))           # misaligned base
    with pytest.raises(ValueError):
        gm.tma_params(a_meta, ptr, (m, k), (k + 1, 1))           # 16-byte stride rule
    with pytest.raises(ValueError):
        gm.tma_params(a_meta, ptr, (m, k), (1, m))               # not row-major


def test_sm100_two_cta_tcgen05(built):
    ck, entry = built[B_2CTA]
    ptx = ck.asm["ptx"]
    ops = _ops(ptx)
    assert any(o.startswith("tcgen05.mma") and "cta_group::2" in o for o in ops), ops
    assert any(o.startswith("cp.async.bulk.tensor") and "cta_group::2" in o for o in ops), ops
    assert re.search(r"\.reqnctapercluster\s+2\b", ptx) and ".target sm_100a" in ptx
    assert entry.meta["num_ctas"] == 2 and entry.arch == "sm_100a"


def test_entries_and_keys():
    h = gm.gluon_entries("sm_90a")
    b = gm.gluon_entries("sm_100a")
    # 2 in dtypes x 2 B majorness x (4 tiles with a 16-bit out + the 2 that fit with an fp32 out)
    assert len(h) == len(set(h)) == 24 and len(b) == 2
    for key in h + b:
        cfg = gm.Config.from_key(key)
        assert cfg.key == key and cfg.smem_bytes() <= gm.SMEM_LIMIT
    assert H_F16.key in h and B_2CTA.key in b
    assert set(gluon_cache.default_entries(["gluon_matmul_sm90"], "sm_100a")) == set(b)


def test_supports_declines_off_hopper():
    class P:  # only what supports() reads before the device check
        device = Device("cpu")
    assert gm.KERNEL.supports(P()) is not None
    assert gm.KERNEL.name == "gluon_matmul_sm90"
