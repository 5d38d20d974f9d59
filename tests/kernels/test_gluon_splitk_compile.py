"""gluon_splitk_sm90, compile-only on the CPU: the PTX of the cluster split-K kernel (wgmma fed by
cp.async, the DSMEM sum: barrier.cluster, mapa, ld.shared::cluster), its cache metadata, the
policy's split choice, what supports() declines, and that jax's cuda lowering of a skinny matmul
launches its cubin with the cluster attribute."""
from __future__ import annotations

import re

import pytest

from xgemm.core.problem import ROW, Device, Epilogue, GemmProblem, Operand
from xgemm.kernels import gluon_splitk_sm90 as sk

triton = pytest.importorskip("triton")
from xgemm.runtime import gluon_cache  # noqa: E402

if not gluon_cache.can_compile():
    pytest.skip(f"needs triton >= 3.8 (found {triton.__version__})", allow_module_level=True)

BF16_X2 = sk.Config("bfloat16", "bfloat16", 64, *sk._tile(64, 2), 2, False)     # 64x4096x4096's pick
F16_F32_X8 = sk.Config("float16", "float32", 128, *sk._tile(128, 8), 8, True)
BF16_SK = sk.Config("bfloat16", "bfloat16", *sk.STREAMK, 1, False, True)         # 1x18432x7168's pick


@pytest.fixture(scope="module")
def built(gluon_cache_dir):
    return {cfg: (gluon_cache.compile_kernel(cfg.key)[0], gluon_cache.lookup(cfg.key))
            for cfg in (BF16_X2, F16_F32_X8, BF16_SK)}


@pytest.mark.parametrize("cfg", [BF16_X2, F16_F32_X8], ids=["bf16-x2-bN", "f16-f32-x8-bK"])
def test_ptx_wgmma_from_cp_async_and_a_dsmem_sum(built, cfg):
    ptx = built[cfg][0].asm["ptx"]
    it = {"float16": "f16", "bfloat16": "bf16"}[cfg.in_dtype]
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{cfg.bn}k16\.f32\.{it}\.{it}", ptx)
    assert re.search(r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 0x10", ptx)   # 16-byte vectors
    assert "cp.async.bulk" not in ptx                     # no TMA: plain pointers (the FFI needs no maps)
    assert "fence.proxy.async.shared::cta" in ptx         # cp.async (generic) -> wgmma (async proxy)
    assert re.search(rf"\.reqnctapercluster\s+{cfg.split}\b", ptx)
    assert ptx.count("barrier.cluster.arrive") >= 2       # partials ready; buffers kept alive
    assert ptx.count("mapa.shared::cluster") == cfg.split  # one window per source CTA
    wait = ptx.index("griddepcontrol.wait")                # PDL: every global access after it
    assert "cp.async" not in ptx[:wait] and "ld.global" not in ptx[:wait] and "st.global" not in ptx[:wait]
    assert "ld.shared::cluster.v4.f32" in ptx
    assert "%cluster_ctarank" in ptx


def test_streamk_ptx_one_wave_parts_through_global_memory(built):
    """The stream-K kernel: the same cp.async + wgmma mainloop, no cluster; a part left for the
    tile's last CTA is released by one acq_rel atomic a part (after a CTA barrier, past the
    mainloop) and read back past L1 (ld.global.cg: another SM wrote it)."""
    ptx = built[BF16_SK][0].asm["ptx"]
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.bf16\.bf16", ptx)
    assert re.search(r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 0x10", ptx)
    assert "reqnctapercluster" not in ptx and "mapa" not in ptx and "barrier.cluster" not in ptx
    # programmatic dependent launch: no global access before the wait for the previous kernel
    wait = ptx.index("griddepcontrol.wait")
    assert "ld.global" not in ptx[:wait] and "cp.async" not in ptx[:wait] and "st.global" not in ptx[:wait]
    assert ptx.count("griddepcontrol.launch_dependents") == 1
    assert built[BF16_SK][1].meta["options"]["launch_pdl"]
    # one atomic for the part a CTA's range starts with, one for the part it ends with, both after
    # its mainloop (none inside it: the parts are stored without waiting)
    atoms = re.findall(r"atom\.global\.[a-z0-9_.]+", ptx)
    assert atoms == ["atom.global.gpu.acq_rel.add.u32"] * 2, atoms
    assert ptx.index("atom.global") > ptx.rindex("wgmma.mma_async")
    assert ptx.count("ld.global.cg.v4.b32") >= 4          # the sum: four parts' 16-byte loads in flight
    meta = built[BF16_SK][1].meta
    assert meta["num_ctas"] == 1 and meta["shared"] <= sk.SMEM_LIMIT // 2     # two CTAs an SM
    assert [p["name"] for p in meta["params"]][:5] == ["a_ptr", "b_ptr", "d_ptr", "ws_ptr", "flag_ptr"]


def test_metadata(built):
    for cfg in (BF16_X2, F16_F32_X8):
        meta = built[cfg][1].meta
        assert meta["num_ctas"] == cfg.split and meta["num_warps"] == sk.WARPS
        assert meta["global_scratch_size"] == 0 and meta["profile_scratch_size"] == 0
        assert 0 < meta["shared"] <= 227 * 1024
        assert [p["name"] for p in meta["params"]] == ["a_ptr", "b_ptr", "d_ptr", "M", "N", "K", "lda", "ldb",
                                                       "ldd", "alpha", "global_scratch", "profile_scratch"]


def _pick(m, n, k):
    c = sk._choose_cluster(m, n, k, "bfloat16", "bfloat16", False, 132)
    return c.bn, c.bk, c.stages, c.split


def test_the_cluster_policy_fills_the_sms():
    assert _pick(64, 8192, 8192) == (64, 128, 4, 1)       # 128 tiles of 64x64: no split
    assert _pick(64, 4096, 4096) == (64, 128, 4, 2)       # 64 tiles x 2
    assert _pick(64, 2048, 8192) == (64, 64, 6, 4)        # 4-CTA clusters: the 96 KB tile
    assert _pick(64, 16384, 4096) == (128, 128, 4, 1)     # 256 tiles of 64 > 132: BN 128
    assert _pick(1, 1024, 1024) == (64, 64, 6, 4)         # split 8 would leave 2 K blocks per CTA
    # a 128-column tile for every SM or more: the 96 KB tile, two CTAs an SM, no split
    assert _pick(1, 18432, 7168) == _pick(64, 65536, 4096) == (128, 64, 4, 1)
    # decode M: 128-column tiles split in two where 64-column ones would run unsplit
    assert _pick(1, 8192, 28672) == _pick(16, 8192, 8192) == (128, 128, 4, 2)
    assert _pick(64, 8192, 28672) == (64, 128, 4, 1)
    # decode M: a split of 4 doubles where its 8-CTA clusters fit the GPCs two CTAs an SM (24 tiles
    # <= 30 clusters; 32 tiles would take two waves)
    assert _pick(1, 1536, 7168) == _pick(16, 1536, 24576) == (64, 64, 6, 8)
    assert _pick(1, 2048, 8192) == (64, 64, 6, 4)
    assert sk.resident_clusters(sk.Config("bfloat16", "bfloat16", 64, 64, 6, 8, False)) == 30
    assert sk.resident_clusters(sk.Config("bfloat16", "bfloat16", 64, 128, 4, 4, False)) == 31
    assert sk.resident_clusters(sk.Config("bfloat16", "bfloat16", 64, 64, 6, 2, False)) == 132
    assert _pick(64, 1536, 7168) == (64, 64, 6, 4) and _pick(1, 1536, 1024) == (64, 64, 6, 4)
    # decode M, 64-column tiles split in two: 128 columns split 8 where those CTAs are at most 1.5
    # an SM (20 or 24 tiles x 8), else 256-deep K tiles (32 tiles x 8 = 256 CTAs ran slower)
    assert _pick(1, 2560, 8192) == _pick(8, 3072, 8192) == (128, 64, 4, 8)
    assert _pick(1, 4096, 14336) == _pick(16, 4096, 4096) == (64, 256, 3, 2)
    assert _pick(64, 4096, 4096) == (64, 128, 4, 2) and _pick(1, 4096, 1536) == (64, 128, 4, 2)
    for cfg in sk.tune_configs("bfloat16", "bfloat16", False):
        cfg.check()
    keys = sk.gluon_entries("sm_90a")
    assert len(keys) == len(set(keys)) == 112 and not sk.gluon_entries("sm_100a")
    for i in sk.IN_DTYPES:           # every config the policy can pick is in the default build
        for m, n, k in [(64, 8192, 8192), (64, 4096, 4096), (64, 2048, 8192), (64, 16384, 4096), (1, 1024, 1024),
                        (1, 576, 7168), (1, 512, 32768),
                        (8, 1024, 65536), (1, 18432, 7168), (1, 8192, 28672), (1, 1536, 7168),
                        (1, 3072, 8192), (1, 4096, 14336), (1, 7168, 18432), (1, 1024, 8192), (1, 5120, 8192),
                        (1, 3584, 8192)]:
            assert sk.choose(m, n, k, i, "float32", True, 132).key in keys


def test_streamk_where_the_cluster_split_leaves_sms_idle():
    """At decode M the stream-K kernel replaces WIDE where its tiles fill under 70% of the
    resident slots over a long K (144 of 264 at 1 x 18432 x 7168: most SMs would run one CTA)."""
    def pick(m, n, k):
        return sk.choose(m, n, k, "bfloat16", "bfloat16", False, 132)
    for m, n, k in [(1, 18432, 7168), (16, 18432, 7168), (1, 20224, 4096), (4, 16896, 8192)]:
        cfg = pick(m, n, k)
        assert cfg.streamk and (cfg.bn, cfg.bk, cfg.stages, cfg.split) == (*sk.STREAMK, 1), (m, n, k)
    for m, n, k in [(1, 24576, 1536), (8, 28672, 8192), (1, 18432, 2048), (64, 18432, 7168),
                    (1, 8192, 28672), (16, 8192, 8192), (64, 4096, 4096), (1, 57344, 8192)]:
        assert not pick(m, n, k).streamk, (m, n, k)
    # one wave: two 96 KB CTAs an SM; fewer where a CTA would run under MIN_UNITS units
    wide = pick(1, 18432, 7168)
    assert sk.streamk_grid(18432, 7168, wide, 132) == 264 and sk.streamk_units(18432, 7168, wide) == 144 * 112
    assert sk.streamk_grid(1024, 1024, wide, 132) == 128        # 128 units: a CTA each
    assert sk.streamk_grid(2048, 4096, wide, 132) == 132        # 1024 units < 8 x 264
    assert sk.streamk_workspace(4, 18432, wide, 264) == (2 * 264 * 4 * 128, 144)
    assert sk.Config.from_key(wide.key) == wide and wide.key.endswith("-t1")
    assert sk.KERNEL.policy(_problem(1, 18432, 7168)).schedule == "stream-k"


def test_decode_keeps_more_of_b_in_flight_where_the_cluster_split_cannot():
    """Decode M past WIDE: a split of 1-2 with a CTA on (nearly) every SM stays; 64-column 96 KB
    tiles split to fill the resident slots where they fill most of them; CTAs with short parts
    stay; else stream-K, its narrow tile where the WIDE tile's grid would shrink to one CTA an SM."""
    def pick(m, n, k):
        c = sk.choose(m, n, k, "bfloat16", "bfloat16", False, 132)
        return (c.bn, c.bk, c.stages, "sk" if c.streamk else c.split)
    # balanced: 128 CTAs of one deep tile an SM
    assert pick(1, 4096, 4096) == pick(1, 4096, 14336) == (64, 256, 3, 2)
    assert pick(1, 8192, 8192) == pick(16, 8192, 8192) == (128, 128, 4, 2)
    # FILL: 112 tiles x 2 = 224 of 264 slots; 56 x 4 = 224; 48 x 4 = 192 (split 4: 70% suffices)
    assert pick(1, 7168, 18432) == pick(16, 7168, 16384) == (64, 64, 6, 2)
    assert pick(1, 3584, 8192) == pick(1, 3072, 3072) == (64, 64, 6, 4)
    assert pick(1, 6144, 8192) == (128, 64, 4, "sk")           # 96 x 2 = 192 of 264 at split 2: no
    # short parts stay (a CTA streams under MIN_PART bytes of B)
    assert pick(1, 1024, 4096) == (64, 64, 6, 8)
    assert pick(1, 1536, 7168) == (64, 64, 6, 8)               # FILL itself: 24 x 8 = 192
    # split 8 whose clusters fit one CTA an SM (<= 15 tiles): the 128 KB tile; it stays on 80% of
    # the SMs (14 tiles x 8 = 112 CTAs) or with parts under 256 KB, else stream-K
    assert pick(1, 576, 7168) == pick(1, 896, 16384) == pick(1, 832, 12288) == (64, 128, 4, 8)
    assert pick(1, 768, 16384) == pick(1, 512, 32768) == (64, 256, 3, "sk")
    # stream-K: the narrow tile where the WIDE tile's 2048 units would run on 132 CTAs
    assert pick(1, 1024, 8192) == pick(1, 2048, 8192) == pick(16, 1024, 8192) == (64, 256, 3, "sk")
    assert pick(1, 5120, 8192) == pick(1, 2560, 8192) == pick(1, 2048, 16384) == (128, 64, 4, "sk")
    # past decode M the cluster split's pick stands
    for m, n, k in [(64, 7168, 18432), (64, 2048, 8192), (32, 1024, 8192)]:
        args = (m, n, k, "bfloat16", "bfloat16", False, 132)
        assert sk.choose(*args) == sk._choose_cluster(*args), (m, n, k)


def test_sm_fill_counts_a_wave_of_resident_ctas():
    """Two 96 KB CTAs fit an SM: 144 of them run as one wave on all 132 SMs; 128 KB ones take two."""
    wide = sk._choose_cluster(1, 18432, 7168, "bfloat16", "bfloat16", False, 132)
    assert sk.resident_per_sm(wide) == 2 and sk.sm_fill(1, 18432, wide, 132) == 1.0
    deep = wide._replace(bk=128)
    assert sk.resident_per_sm(deep) == 1 and sk.sm_fill(1, 18432, deep, 132) == 144 / 264


def _problem(m, n, k, *, dtype="bfloat16", b_major=ROW, beta=0.0, batch=(), align=16):
    a = Operand((m, k), (k, 1), dtype, ROW, align)
    b = Operand((k, n), (n, 1) if b_major == ROW else (1, k), dtype, b_major, 16)
    c = Operand((m, n), (n, 1), dtype, ROW, 16) if beta else None
    return GemmProblem(m=m, n=n, k=k, batch=batch, a=a, b=b, c=c,
                       epilogue=Epilogue(beta=beta, has_c=bool(beta), out_dtype=dtype), framework="torch",
                       device=Device("cuda", 0, (9, 0)))


def test_supports_only_skinny_aligned_plain_problems(built):
    assert sk.KERNEL.supports(_problem(64, 4096, 4096)) is None
    # K < 1024 only where N gives every SM a 128-column tile (the unsplit WIDE tile), and K >= 256
    assert sk.KERNEL.supports(_problem(1, 32768, 512)) is None
    for prob, why in [(_problem(65, 8192, 8192), "M = 65"), (_problem(64, 8192, 512), "K = 512"),
                      (_problem(1, 32768, 128), "K = 128"),
                      (_problem(64, 8192, 8192, beta=1.0), "beta"), (_problem(64, 8196, 8192), "multiples of 8"),
                      (_problem(64, 8192, 8192, align=8), "aligned"), (_problem(64, 8192, 8192, batch=(2,)), "batch"),
                      (_problem(64, 8192, 8192, dtype="float32"), "dtypes")]:
        assert why in (sk.KERNEL.supports(prob) or ""), prob.summary()


def _launch_line(m, n, k):
    """The custom call jax's cuda lowering of a bf16 m x k @ k x n matmul emits."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from xgemm import jax as xj
    a = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    b = jax.ShapeDtypeStruct((k, n), jnp.bfloat16)
    text = jax.jit(lambda a, b: xj.matmul(a, b)).trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    (call,) = [line for line in text.splitlines() if "xgemm_cubin_launch_v1" in line]
    return call


def test_cuda_lowering_launches_the_cluster_cubin(built):
    call = _launch_line(64, 4096, 4096)
    assert 'kernel = "xgemm_splitk_sm90"' in call and "cluster = dense<[2, 1, 1]>" in call
    assert "grid = dense<[128, 1, 1]>" in call           # 64 tiles x 2 CTAs
    assert "block = dense<[128, 1, 1, 1]>" in call       # 128 threads; flags 1: programmatic dependent launch


def test_cuda_lowering_of_streamk_passes_scratch_and_zeroed_flags(built):
    call = _launch_line(1, 18432, 7168)
    assert 'kernel = "xgemm_streamk_sm90"' in call and "grid = dense<[264, 1, 1]>" in call
    assert "tensor<144xi32>" in call                     # the flags: a zero-filled input
    assert f"tensor<{4 * 2 * 264 * 128}xui8>" in call      # the workspace: XLA scratch


def test_api_sends_an_out_it_cannot_write_elsewhere(built):
    """xgemm.matmul(..., out=) with a column-major or misaligned out: the split-K kernel declines
    (the Epilogue says where D goes) instead of failing in run(); a plain call still takes it."""
    torch = pytest.importorskip("torch")
    from fake_cuda import Fake

    import xgemm
    from xgemm import prepare
    a = torch.randn(64, 4096).bfloat16()
    b = torch.randn(4096, 4096).bfloat16()
    col = torch.empty(4096, 64, dtype=torch.bfloat16).t()
    odd = torch.empty(64 * 4096 + 1, dtype=torch.bfloat16)[1:].view(64, 4096)     # 2-byte aligned
    with Fake(keep=True):
        assert prepare.prepare_gemm("matmul", a, b, None, 1.0, 0.0, None).plan.kernel_name == sk.NAME
        assert prepare.prepare_gemm("matmul", a, b, None, 1.0, 0.0, torch.empty(64, 4096, dtype=torch.bfloat16)
                                 ).plan.kernel_name == sk.NAME
        prep = prepare.prepare_gemm("matmul", a, b, None, 1.0, 0.0, col)
        assert prep.plan.kernel_name != sk.NAME
        assert "row-major, 16-byte aligned" in dict(prep.plan.declined)[sk.NAME]
        xgemm.matmul(a, b, out=col)                  # reaches a (recorded) launch without raising
        # a misaligned D: no kernel writes it in place; one writes an aligned temporary copied into it
        prep = prepare.prepare_gemm("matmul", a, b, None, 1.0, 0.0, odd)
        assert "row-major, 16-byte aligned" in dict(prep.plan.declined)[sk.NAME]
        assert prep.out.ptr % 16 == 0 and prep.out.ptr != odd.data_ptr()
        assert any("copied into out" in c for c in prep.plan.copies), prep.plan.copies
