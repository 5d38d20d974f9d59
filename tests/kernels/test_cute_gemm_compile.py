"""cute_gemm_sm90 and cute_mma_sm80, compile-only on the CPU (--gpu-arch sm_90a): the PTX of a
few representative classes holds the instructions meant (wgmma + TMA + cluster multicast; mma.sync
m16n8k16 + ldmatrix + cp.async), and the host-side logic (supports / policy / compile class)."""
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import have

from xgemm.core.problem import COL, ROW, Device, Epilogue, GemmProblem, Operand, Policy
from xgemm.kernels import cute_gemm_sm90 as K90
from xgemm.kernels import cute_mma_sm80 as K80

ROOT = Path(__file__).resolve().parents[2]


def _have_dsl() -> bool:
    return have("cutlass")


needs_dsl = pytest.mark.skipif(not _have_dsl(), reason="needs nvidia-cutlass-dsl")


# ----------------------------------------------------------------------------------------------
# host-side logic (no compiler)
# ----------------------------------------------------------------------------------------------
def test_import_is_light():
    code = ("import sys, xgemm.kernels.cute_gemm_sm90, xgemm.kernels.cute_mma_sm80; "
            "print('cutlass' in sys.modules, 'torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.stdout.split() == ["False", "False"], res.stderr


def _op(shape, dtype="bfloat16", major=ROW, alignment=16, strides=None):
    if strides is None:
        strides = (shape[-1], 1) if major == ROW else (1, shape[-2])
        if len(shape) == 3:
            strides = (shape[-1] * shape[-2],) + strides
    return Operand(tuple(shape), tuple(strides), dtype, major, alignment)


def _problem(m, n, k, dtype="bfloat16", out_dtype=None, kind="cuda", arch=(9, 0), alpha=1.0, beta=0.0,
             a=None, b=None, c=None, batch=()):
    a = a or _op(batch + (m, k), dtype)
    b = b or _op(batch + (k, n), dtype)
    ep = Epilogue(alpha=alpha, beta=beta, has_c=c is not None, out_dtype=out_dtype or dtype)
    return GemmProblem(m, n, k, batch, a, b, c if beta != 0.0 else None, ep, "torch",
                       Device(kind, 0, arch if kind == "cuda" else None))


def test_sm90_supports():
    assert K90.KERNEL.supports(_problem(256, 256, 256)) is None
    assert K90.KERNEL.supports(_problem(64, 64, 64, kind="cpu")) == "needs a CUDA device"
    assert "sm_90" in K90.KERNEL.supports(_problem(64, 64, 64, arch=(8, 0)))
    assert "float16 or bfloat16" in K90.KERNEL.supports(_problem(64, 64, 64, dtype="float32"))
    # K = 100: A's row stride of 200 bytes is no multiple of 16 -> TMA cannot describe it
    assert "A" in K90.KERNEL.supports(_problem(64, 64, 100))
    assert "D's row stride" in K90.KERNEL.supports(_problem(64, 60, 64))
    assert "contiguous" in K90.KERNEL.supports(_problem(64, 64, 64, a=_op((64, 64), strides=(128, 2))))
    assert "aligned" in K90.KERNEL.supports(_problem(64, 64, 64, a=_op((64, 64), alignment=8)))
    # every majorness, alpha/beta with C of another dtype/majorness, and a broadcast batch operand
    c = _op((3, 64, 64), "float32", COL)
    bc = _op((3, 64, 64), strides=(0, 64, 1))
    p = _problem(64, 64, 64, a=_op((3, 64, 64), major=COL), b=bc, c=c, alpha=2.0, beta=-1.0, batch=(3,),
                 out_dtype="float32")
    assert K90.KERNEL.supports(p) is None


def test_sm90_supports_scale_vectors():
    """FP8 scales: a float32 vector of M (scale_a) / N (scale_b) values, or of one value (tensor-wise:
    the kernel clamps its indices, so the caller copies nothing); other extents, strides and dtypes
    are declined with the argument named."""
    m, n, k = 256, 384, 512
    fp8 = _problem(m, n, k, "float8_e4m3fn", "bfloat16", b=_op((k, n), "float8_e4m3fn", COL))

    def why(sa, sb):
        return K90.KERNEL.supports(dataclasses.replace(fp8, scales=(sa, sb)))
    vec = lambda size, dtype="float32", stride=1: Operand((size,), (stride,), dtype, ROW, 16)
    assert why(vec(m), vec(n)) is None and why(vec(1), vec(1)) is None and why(vec(m), vec(1)) is None
    assert "scale_a" in why(vec(2), vec(n)) and "scale_b" in why(vec(m), vec(n - 1))
    assert "scale_b" in why(vec(m), vec(n, stride=2)) and "scale_a" in why(vec(m, "bfloat16"), vec(n))


def test_sm80_supports():
    assert K80.KERNEL.supports(_problem(256, 256, 256)) is None
    assert K80.KERNEL.supports(_problem(256, 256, 256, arch=(8, 6))) is None
    assert "alpha" in K80.KERNEL.supports(_problem(64, 64, 64, alpha=2.0))
    c = _op((64, 64))
    assert "beta" in K80.KERNEL.supports(_problem(64, 64, 64, beta=0.5, c=c))
    assert K80.KERNEL.supports(_problem(64, 64, 64, beta=1.0, c=c)) is None
    assert "sm_80" in K80.KERNEL.supports(_problem(64, 64, 64, arch=(7, 5)))
    assert "16 bytes" in K80.KERNEL.supports(_problem(64, 64, 60))     # K extent 60 x 2 B


@pytest.mark.parametrize("mnkl", [(8192, 8192, 8192, 1), (4096, 4096, 4096, 1), (8192, 8192, 1024, 1),
                                  (2048, 8192, 8192, 1), (64, 8192, 8192, 1), (8192, 8192, 128, 1),
                                  (128, 128, 128, 1), (1, 8, 8, 1), (512, 512, 512, 8)])
def test_policy_is_a_valid_table_row(mnkl):
    m, n, k, l = mnkl
    pol = K90.KERNEL.policy(_problem(m, n, k, batch=(l,) if l > 1 else ()))
    cfg = K90.Config.from_policy(pol)
    cfg.check()
    assert cfg in [c for row in K90.POLICY_TABLE for c in row[2]]
    assert Policy(**{f: getattr(pol, f) for f in ("tile", "stages", "cluster", "warps", "raster", "notes")}) == pol
    assert K90.Config.from_policy(cfg.policy()) == cfg


@pytest.mark.parametrize("mnk,expect", [
    ((8192, 8192, 8192), (128, 192, 2, 1)),     # the large row's tuned config: 98.5% of its waves useful
    ((8192, 8192, 1024), (128, 192, 2, 1)),
    ((4096, 4096, 4096), (128, 128, 2, 1)),     # the mid row's
    ((4224, 8192, 8192), (128, 128, 1, 2)),     # 33 M tiles: half a 2x1 cluster empty (89% -> 100%)
    ((8192, 4224, 8192), (128, 128, 2, 1)),     # 97% -> 100%
    ((12288, 12288, 4096), (128, 192, 2, 1)),   # 99.0% vs 99.7%: inside WAVE_MARGIN, kept
    ((3000, 5000, 4096), (128, 192, 2, 1)),     # skinny M: 40 N tiles of 128 fill 87% of 8 waves
    ((2048, 8192, 8192), (128, 128, 2, 1)),     # skinny M's tuned config: 97%
])
def test_policy_picks_the_best_filled_waves(mnk, expect):
    name, cfg = K90.choose_config(*mnk, 1)
    assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.cluster_n) == expect, (name, cfg)
    assert "waves" in name and "% full" in name


@pytest.mark.parametrize("mnk", [(8192, 8192, 1024), (3000, 5000, 4096), (4096, 4096, 4096), (2048, 8192, 8192)])
def test_row_major_operands_run_transposed(mnk):
    """On the wave-aware rows, row-major A and B run as D^T = B^T @ A^T with the (N, M) config;
    any other majorness runs as given, and so do the medium and small rows."""
    m, n, k = mnk
    pol = K90.KERNEL.policy(_problem(m, n, k))
    assert K90.swapped(pol) and K90.row_of(m, n, k, 1) in K90.SWAP_ROWS
    assert K90.Config.from_policy(pol) == K90.choose_config(n, m, k, 1)[1]
    a_col = _problem(m, n, k, a=_op((m, k), major=COL))
    assert not K90.swapped(K90.KERNEL.policy(a_col))
    assert K90.Config.from_policy(K90.KERNEL.policy(a_col)) == K90.choose_config(m, n, k, 1)[1]
    for small in ((256, 8192, 8192), (128, 128, 128), (8192, 8192, 128), (8192, 8192, K90.SWAP_MIN_K - 8)):
        assert not K90.swapped(K90.KERNEL.policy(_problem(*small)))


def test_transposed_run_compiles_the_transposed_class():
    """spec() of a swapped policy: the kernel's A is B^T (N x K, M-major), its B is A^T, D is D^T
    (column-major); the compiled config is the policy's own."""
    from xgemm.arrays import ArrayView
    dev = Device("cuda", 0, (9, 0))

    def v(shape, strides, dtype="bfloat16"):
        return ArrayView(None, "torch", dev, 0, shape, strides, dtype, 2, False)
    m, n, k = 3000, 5000, 4096
    a, b, d = v((m, k), (k, 1)), v((k, n), (n, 1)), v((m, n), (n, 1), "float32")
    pol = K90.KERNEL.policy(_problem(m, n, k))
    spec = K90.KERNEL.spec(_problem(m, n, k), pol, (a, b, None), d, "sm_90a", 132)
    assert spec[:6] == (K90.Config.from_policy(pol), "bfloat16", "float32", COL, COL, COL)
    plain = K90.KERNEL.spec(_problem(m, n, k), K90.Config.from_policy(pol).policy(), (a, b, None), d, "sm_90a", 132)
    assert plain[3:6] == (ROW, ROW, ROW)
    t = K90.transposed(v((3, m, k), (m * k, k, 1)))
    assert (t.shape, t.strides) == ((3, k, m), (m * k, 1, k))


def test_prebuilt_classes_are_the_ones_the_policy_runs():
    keys = {key for key, _ in K90.prebuild_classes("sm_90a")}
    for mnk in ((8192, 8192, 8192), (4096, 4096, 4096), (256, 8192, 8192), (128, 128, 128), (8192, 8192, 128)):
        pol = K90.KERNEL.policy(_problem(*mnk))
        major = COL if K90.swapped(pol) else ROW
        cfg = K90.Config.from_policy(pol)
        spec = (cfg, "bfloat16", "bfloat16", major, major, major, None, True, (False,) * 4,   # matmul: alpha 1
                K90.max_clusters(K90.H200_SMS, cfg), "sm_90a")
        assert K90.class_key(*spec) in keys, mnk


@pytest.mark.parametrize("mnk,split", [
    ((512, 1024, 8192), 4),       # 32 tiles of 128x128 over 132 SMs: one wave of a quarter of K
    ((512, 512, 32768), 8),
    ((4096, 576, 7168), 1),       # one wave of 96 128x192 tiles: each split timed slower (session 22)
    ((128, 4096, 14336), 2),
    ((8192, 8192, 8192), 1),      # enough tiles: no split
    ((4096, 4096, 4096), 1),
    ((4096, 576, 512), 1),        # K too short for parts of SPLIT_MIN_K_TILES
])
def test_policy_splits_k_where_few_tiles_run_a_long_k(mnk, split):
    name, cfg = K90.choose_config(*mnk, 1)
    assert cfg.split == split, (name, cfg)
    pol = K90.KERNEL.policy(_problem(*mnk))
    assert pol.split_k == split and K90.Config.from_policy(pol).split == split
    if split > 1:
        # no split class takes C or a fused epilogue: those run unsplit
        c = _op(mnk[:2])
        assert K90.KERNEL.policy(_problem(*mnk, beta=1.0, c=c)).split_k == 1
        # nor the gated or the promoting FP8 classes (the H200 run of 2026-12-05: scaled_matmul at
        # 128x128x8192 asked a split class with an Epi and failed its build's assertion)
        m, n, k = mnk
        plain = _problem(*mnk)
        kb, nb = -(-k // 128), -(-n // 128)
        for fused in (dataclasses.replace(plain, epilogue=dataclasses.replace(plain.epilogue, activation="swiglu")),
                      dataclasses.replace(plain, scales=(_op((m, 1), "float32"), _op((1, n), "float32")),
                                          float32_accumulation=True),
                      dataclasses.replace(plain, scales=(_op((m, kb), "float32"), _op((kb, nb), "float32")))):
            pol = K90.KERNEL.policy(fused)
            assert pol.split_k == 1 and K90.Config.from_policy(pol).split == 1, pol
        assert 0.9 < K90.wave_efficiency(mnk[0], mnk[1], 1, cfg, k=mnk[2]) <= 1.0


def test_split_k_workspace_sizes():
    cfg = K90.Config(128, 192, 2, 1, True, True, 8, split=4)
    # 32 x 3 tiles (M tiles rounded to whole 2x1 clusters), 3 slots of 128x192 each but the last part
    assert K90.workspace_sizes(cfg, 4096, 576, 1) == (96 * 3 * 128 * 192, 96)
    assert K90.workspace_sizes(cfg, 4000, 577, 2) == (2 * 32 * 4 * 3 * 128 * 192, 2 * 32 * 4)
    assert K90.workspace_sizes(K90.Config(128, 192, 2, 1, True, True, 8), 4096, 576, 1) == (0, 0)
    with pytest.raises(ValueError, match="split"):
        K90.Config(split=K90.MAX_SPLIT + 1).check()


def test_wave_efficiency_counts_edge_tiles_and_the_last_wave():
    cfg = K90.Config(128, 192, 2, 1, True, False, 8)
    # 8192^2: 32 x 43 cluster tiles of 256x192 = 1376 over 66 clusters = 21 waves
    assert K90.wave_efficiency(8192, 8192, 1, cfg) == pytest.approx(8192 * 8192 / (21 * 66 * 256 * 192))
    assert K90.wave_efficiency(256 * 66, 192, 1, cfg) == 1.0        # exactly one full wave
    assert K90.wave_efficiency(256 * 66 + 1, 192, 1, cfg) < 0.51    # one more row: a second wave


def test_config_check():
    with pytest.raises(ValueError):
        K90.Config(128, 256, 2, 1, True).check()          # pingpong accumulators would spill
    with pytest.raises(ValueError):
        K90.Config(128, 128, 2, 2, False).check()         # 2x2 cluster not offered
    K90.Config(256, 128, 1, 2, False).check()


def test_compile_class_ignores_shape():
    """Two shapes of one class map to one compiled function (symbolic dims)."""
    pol = K90.Config().policy()

    class V:      # minimal ArrayView stand-in
        def __init__(self, shape, dtype="bfloat16"):
            self.shape, self.dtype = shape, dtype
            self.strides = (shape[-1], 1)
    specs = []
    for m, n, k in ((300, 264, 200), (8192, 8192, 8192)):
        p = _problem(m, n, k)
        specs.append(K90.KERNEL.spec(p, pol, (V((m, k)), V((k, n)), None), V((m, n)), "sm_90a", 132))
    assert specs[0] == specs[1]
    key = K90.class_key(*specs[0])
    assert key[:2] == ("cute_gemm_sm90", "sm_90a")
    # build_for_key inverts class_key (xgemm.runtime.cute_cache.warm rebuilds a key in a worker process)
    assert K90.build_for_key(key).args == specs[0]
    k80 = K80.class_key("float16", "float32", ROW, COL, ROW, ("float32", COL), True, "sm_86")
    assert K80.build_for_key(k80).args == ("float16", "float32", ROW, COL, ROW, ("float32", COL), True, "sm_86")


# ----------------------------------------------------------------------------------------------
# compile-only: PTX of representative classes (shared across tests)
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    if not _have_dsl():
        pytest.skip("needs nvidia-cutlass-dsl")
    dump = tmp_path_factory.mktemp("ptx")
    nob = (False, False, False, False)
    builds = {
        # the big-problem default: pingpong 128x192, 2x1 cluster (B multicast), torch layouts
        "pp_2x1": lambda o: K90.build(K90.Config(128, 192, 2, 1, True, True, 8), "bfloat16", "bfloat16", ROW, ROW,
                                      ROW, None, False, nob, 66, "sm_90a", o),
        # the same for alpha == 1 (matmul): the epilogue does not scale
        "pp_2x1_unit": lambda o: K90.build(K90.Config(128, 192, 2, 1, True, True, 8), "bfloat16", "bfloat16", ROW,
                                           ROW, ROW, None, True, nob, 66, "sm_90a", o),
        # cooperative 256x128, 1x2 cluster (A multicast), every operand column-major, fp32 D,
        # a bf16 C read through TMA, batched with A broadcast over the batch
        "coop_1x2_c": lambda o: K90.build(K90.Config(256, 128, 1, 2, False, False, 4), "float16", "float32", COL,
                                          COL, COL, ("bfloat16", ROW), False, (False, True, True, True), 66,
                                          "sm_90a", o),
        # fused epilogues (K90.Epi): bias along N + gelu_tanh on the default config; bias along M
        # (the transposed run's) + exact gelu with a C and an fp32 D on the cooperative one
        "pp_bias_gelu_tanh": lambda o: K90.build(K90.Config(128, 192, 2, 1, True, True, 8), "bfloat16", "bfloat16",
                                                 ROW, ROW, ROW, None, True, nob, 66, "sm_90a", o,
                                                 epi=K90.Epi("n", "bfloat16", "gelu_tanh")),
        "coop_bias_m_gelu_c": lambda o: K90.build(K90.Config(256, 128, 1, 2, False, False, 4), "float16", "float32",
                                                  COL, COL, COL, ("bfloat16", ROW), False, nob, 66, "sm_90a", o,
                                                  epi=K90.Epi("m", "float32", "gelu")),
        # FP8 (K-major A and B): tensor scales through alpha; per-row / per-column scales (Epi)
        "pp_fp8": lambda o: K90.build(K90.Config(128, 192, 2, 1, True, True, 8), "float8_e4m3fn", "bfloat16", ROW,
                                      COL, ROW, None, False, nob, 66, "sm_90a", o),
        "pp_fp8_rowwise": lambda o: K90.build(K90.Config(128, 128, 1, 1, True, True, 8), "float8_e5m2", "float32",
                                              ROW, COL, ROW, None, False, nob, 132, "sm_90a", o,
                                              epi=K90.Epi(scale_m=True, scale_n=True)),
        # the same, its k-tile sums promoted into float32 registers (cooperative 128x128: 64
        # accumulator registers a thread, twice)
        "coop_fp8_promote": lambda o: K90.build(K90.Config(128, 128, 2, 1, False, True, 8), "float8_e4m3fn",
                                                "bfloat16", ROW, COL, ROW, None, True, nob, 66, "sm_90a", o,
                                                epi=K90.Epi(scale_m=True, scale_n=True, promote=True)),
        # block-wise scales (1x128 A, 128x128 B): each k-tile's sum scaled as it is promoted
        "coop_fp8_block": lambda o: K90.build(K90.Config(128, 128, 2, 1, False, True, 8), "float8_e4m3fn",
                                              "bfloat16", ROW, COL, ROW, None, True, nob, 66, "sm_90a", o,
                                              epi=K90.Epi(scale_m=True, scale_n=True, promote=True, block=True)),
        # the same on 128x192 tiles: two blocks of B's scales a tile
        "coop_fp8_block192": lambda o: K90.build(K90.Config(128, 192, 2, 1, False, True, 8), "float8_e4m3fn",
                                                 "bfloat16", ROW, COL, ROW, None, True, nob, 66, "sm_90a", o,
                                                 epi=K90.Epi(scale_m=True, scale_n=True, promote=True, block=True)),
        # gated (SwiGLU): B = [gate | up] through a 4-D TMA view, D half as wide
        "pp_gated_silu": lambda o: K90.build(K90.Config(128, 128, 2, 1, True, True, 8), "bfloat16", "bfloat16", ROW,
                                             ROW, ROW, None, True, nob, 66, "sm_90a", o,
                                             epi=K90.Epi("n", "bfloat16", "silu", gated=True)),
        # split-K: 4 parts a tile (pingpong 128x192) and 2 (cooperative 128x128), their float32 sums
        # through a workspace and per-tile flags
        "pp_split4": lambda o: K90.build(K90.Config(128, 192, 2, 1, True, True, 8, split=4), "bfloat16", "bfloat16",
                                         ROW, ROW, ROW, None, True, nob, 66, "sm_90a", o),
        "coop_split2": lambda o: K90.build(K90.Config(128, 128, 1, 1, False, True, 1, split=2), "float16", "float32",
                                           COL, COL, ROW, None, False, nob, 132, "sm_90a", o),
        "pp_relu": lambda o: K90.build(K90.Config(128, 128, 1, 1, True, True, 8), "bfloat16", "float16", ROW, ROW,
                                       ROW, None, True, nob, 132, "sm_90a", o, epi=K90.Epi(activation="relu")),
        # the grouped class (rows mode of grouped_mm): B K-major, as torch._grouped_mm's weights
        "pp_grouped": lambda o: K90.build(K90.Config(128, 192, 2, 1, True, False, 8), "bfloat16", "bfloat16", ROW,
                                          COL, ROW, None, True, (False, True, False, False), 66, "sm_90a", o,
                                          grouped=True),
        # the same fusing a gate (SwiGLU over each group's [gate | up] columns), at the cooperative
        # 128x256 gated candidate
        "coop_grouped_gated": lambda o: K90.build(K90.GATED_GROUPED_CONFIGS[1], "bfloat16", "bfloat16", ROW, COL, ROW,
                                                  None, True, (False, True, False, False), 66, "sm_90a", o,
                                                  epi=K90.Epi(activation="silu", gated=True), grouped=True),
        "mma_sm80": lambda o: K80.build("bfloat16", "bfloat16", ROW, ROW, ROW, None, False, "sm_90a", o),
        "mma_sm80_c": lambda o: K80.build("float16", "float32", COL, COL, COL, ("float16", ROW), True, "sm_90a", o),
    }
    classes = {}
    for name, build in builds.items():
        # a folder a class: the cubin (its SASS, test_sm90_classes_keep_the_wgmma_pipeline) beside the PTX
        (dump / name).mkdir()
        fn = build(f"--keep-ptx --keep-cubin --dump-dir={dump / name}")
        (cubin,) = (dump / name).glob("*.cubin")
        classes[name] = (fn, fn.__ptx__, cubin)
    return classes


def _count(text, pattern):
    return len(re.findall(pattern, text))


def _wgmma_waits(cubin) -> tuple:
    """(wgmmas, wgmmas that wait alone) in a cubin's SASS (cuobjdump, shipped with triton). ptxas
    keeps a batch of wgmmas in flight (only a batch's last one carries `gsb0`, one wait after it)
    unless it runs short of registers for the pipeline: it then serializes every wgmma of the
    kernel (ptxas -v's C7511), each carrying gsb0 with a WARPGROUP.DEPBAR after it. That cost a
    third of a grouped class's rate on an H100 (docs/performance.md, session 35) and shows nowhere
    but in the SASS: the kernel stays correct."""
    knobs = pytest.importorskip("triton.knobs")
    sass = subprocess.run([knobs.nvidia.cuobjdump.path, "-sass", str(cubin)], capture_output=True, text=True,
                          timeout=60, check=True).stdout
    gmmas = re.findall(r"\b[HQ]GMMA\.[^;]*;", sass)
    return len(gmmas), sum("gsb0" in g for g in gmmas)


@needs_dsl
def test_ptx_sm90_pingpong_multicast(ptx):
    text = ptx["pp_2x1"][1]
    assert _count(text, r"wgmma\.mma_async\.sync\.aligned\.m64n192k16\.f32\.bf16\.bf16") >= 8
    assert _count(text, r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global[^;]*multicast::cluster") >= 1
    assert _count(text, r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta") >= 1     # TMA store of D
    assert "setmaxnreg.inc" in text and "setmaxnreg.dec" in text
    assert _count(text, r"mbarrier\.try_wait") >= 1
    assert "ld.local" not in text and "st.local" not in text      # accumulators stay in registers


@needs_dsl
def test_ptx_sm90_unit_alpha_does_not_scale(ptx):
    """alpha == 1 compiles a class whose epilogue has no multiply (a 128x192 tile: 192 per thread);
    the general class scales every accumulator."""
    general, unit = ptx["pp_2x1"][1], ptx["pp_2x1_unit"][1]
    assert _count(general, r"\bmul(\.rn)?(\.ftz)?\.f32\b") >= 96
    assert _count(unit, r"\bmul(\.rn)?(\.ftz)?\.f32\b") == 0
    assert _count(unit, r"wgmma\.mma_async") == _count(general, r"wgmma\.mma_async")


@needs_dsl
def test_ptx_sm90_fused_epilogues(ptx):
    """Epi classes: every accumulator passes through the activation (one tanh.approx each for a
    bf16 D: 128x192 / 128 threads = 192), the bias is one load per distinct column (or row) a
    thread holds, the main loop is the plain class's, nothing spills."""
    plain, fused = ptx["pp_2x1_unit"][1], ptx["pp_bias_gelu_tanh"][1]
    assert _count(fused, r"tanh\.approx\.f32") == 192 and _count(plain, r"tanh\.approx") == 0
    assert _count(fused, r"ld\.global[\w.]*\.b16") == 96 and _count(plain, r"ld\.global") == 0
    assert _count(fused, r"wgmma\.mma_async") == _count(plain, r"wgmma\.mma_async")
    coop = ptx["coop_bias_m_gelu_c"][1]
    # exact GELU for an fp32 D: erf from ex2 (no tanh.approx); bias rows: 256x128 / 256 threads
    # hold 64 values in 16 distinct rows
    assert _count(coop, r"tanh\.approx") == 0 and _count(coop, r"ex2\.approx") >= 64
    assert _count(coop, r"ld\.global[\w.]*\.b32") == 16
    relu = ptx["pp_relu"][1]
    # relu as a select on x < 0, so NaN stays NaN (max.f32 would turn it into 0)
    assert _count(relu, r"selp\.f32") == 128 and _count(relu, r"\bmax\.f32") == 0
    for name in ("pp_bias_gelu_tanh", "coop_bias_m_gelu_c", "pp_relu"):
        assert "ld.local" not in ptx[name][1] and "st.local" not in ptx[name][1], name


@needs_dsl
def test_ptx_sm90_fp8(ptx):
    """FP8 classes: wgmma on e4m3 / e5m2 with a 128-wide K tile (k32 instructions, 4 a tile), the
    same TMA pipeline; per-row / per-column scales are global loads of the float32 vectors."""
    fp8, rowwise = ptx["pp_fp8"][1], ptx["pp_fp8_rowwise"][1]
    assert _count(fp8, r"wgmma\.mma_async\.sync\.aligned\.m64n192k32\.f32\.e4m3\.e4m3") >= 8
    assert _count(rowwise, r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e5m2\.e5m2") >= 8
    assert _count(fp8, r"ld\.global") == 0 and _count(rowwise, r"ld\.global[\w.]*\.b32") > 0
    for text in (fp8, rowwise):
        assert _count(text, r"cp\.async\.bulk\.tensor") >= 2 and "ld.local" not in text and "st.local" not in text
    with pytest.raises(ValueError, match="K-major"):
        K90.build(K90.Config(), "float8_e4m3fn", "bfloat16", ROW, ROW, ROW, None, True, (False,) * 4, 66)


@needs_dsl
def test_ptx_sm90_fp8_promote(ptx):
    """A promoting FP8 class waits for each k-tile's wgmmas (wait_group 0 in the mainloop, where the
    fast class keeps one batch in flight: wait_group 1) and adds the accumulator into float32
    registers: 64 adds a k-tile for a 128x128 cooperative tile, and no spills. Its two warpgroups
    issue their k-tiles' wgmmas in turn: in the k-loop each waits on its own named barrier before
    its batch and arrives on the other's after the commit; warpgroup 1 gives the first turn once."""
    promote, fast = ptx["coop_fp8_promote"][1], ptx["pp_fp8_rowwise"][1]
    assert _count(promote, r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e4m3\.e4m3") >= 4
    assert _count(promote, r"wgmma\.wait_group\.sync\.aligned\s+1;") == 0
    assert _count(fast, r"wgmma\.wait_group\.sync\.aligned\s+1;") >= 1
    assert _count(promote, r"\badd\.(rn\.)?f32\b") >= 2 * 64           # the loop's and the final one
    assert "ld.local" not in promote and "st.local" not in promote
    loop = promote[promote.rindex('.pragma "nounroll"'):]
    turn = re.search(r"bar\.sync\s+%r\d+, 256;", loop)
    issue, commit = loop.index("wgmma.mma_async"), loop.index("wgmma.commit_group")
    handed = re.search(r"bar\.arrive\s+%r\d+, 256;", loop)
    assert turn and handed and turn.start() < issue < commit < handed.start(), "the k-loop does not take turns"
    assert _count(promote, r"bar\.arrive\s+2, 256;") == 1
    with pytest.raises(AssertionError, match="accumulator registers"):
        K90.build(K90.Config(128, 192, 2, 1, True, True, 8), "float8_e4m3fn", "bfloat16", ROW, COL, ROW, None,
                  True, (False,) * 4, 66, epi=K90.Epi(scale_m=True, scale_n=True, promote=True))


@needs_dsl
@pytest.mark.parametrize("name", ["coop_fp8_promote", "pp_fp8_rowwise"])
def test_ptx_sm90_scale_vectors_load_under_the_mainloop(ptx, name):
    """The per-row / per-column scales: each epilogue thread loads one row's and one column's value
    (128-row, 128-column tiles) before the tile's first wgmma, stores them to shared memory once the
    mainloop's last wgmmas are waited for, and the epilogue reads them there (ld.shared), never
    from global memory: a load a register there stood behind the subtiles' barriers."""
    text = ptx[name][1]
    loads = [m.start() for m in re.finditer(r"\bld\.global", text)]
    stores = [m.start() for m in re.finditer(r"\bst\.shared\.b32\b", text)]
    assert len(loads) == 2 and max(loads) < text.index("wgmma.mma_async"), loads
    assert len(stores) == 2 and min(stores) > text.rindex("wgmma.wait_group"), stores
    tma_store = text.index("cp.async.bulk.tensor.2d.global.shared")
    assert max(stores) < text.index("ld.shared.b32", max(stores)) < tma_store


@needs_dsl
def test_promoting_classes_keep_their_accumulators_in_registers(tmp_path):
    """The promoting FP8 class on cooperative 128x192 tiles (96 accumulator registers a thread,
    twice: choose_fp8_promoted_policy's width where its waves are full enough), and the block-scaled class on
    128x128 and 128x192, assemble with no stack and no local memory (cuobjdump, shipped with triton);
    128x224 would hold more than the class allows."""
    import subprocess
    knobs = pytest.importorskip("triton.knobs")
    tool = knobs.nvidia.cuobjdump.path
    epi = K90.Epi(scale_m=True, scale_n=True, promote=True)
    for i, (cfg, e) in enumerate(((K90.Config(128, 192, 2, 1, False, True, 8), epi),
                                  (K90.Config(128, 128, 2, 1, False, True, 8), dataclasses.replace(epi, block=True)),
                                  (K90.Config(128, 192, 2, 1, False, True, 8), dataclasses.replace(epi, block=True)))):
        out = tmp_path / f"class{i}"
        out.mkdir()
        K90.build(cfg, "float8_e4m3fn", "bfloat16", ROW, COL, ROW, None, True,
                  (False,) * 4, 66, "sm_90a", f"--keep-cubin --dump-dir={out}", epi=e)
        (cubin,) = out.glob("*.cubin")
        usage = subprocess.run([tool, "--dump-resource-usage", str(cubin)], capture_output=True, text=True,
                               timeout=60).stdout
        assert re.search(r"STACK:0 .*LOCAL:0", usage), (cfg, e, usage)
    with pytest.raises(AssertionError, match="accumulator registers"):
        K90.build(K90.Config(128, 224, 2, 1, False, True, 8), "float8_e4m3fn", "bfloat16", ROW, COL, ROW, None,
                  True, (False,) * 4, 66, epi=epi)


@needs_dsl
def test_ptx_sm90_fp8_block_scales(ptx):
    """A block-scaled class multiplies each k-tile's sum by its scales as it promotes it (an fma a
    register, in the loop and after it) and the epilogue applies none. The producer's TMA loads a
    k-tile's scales into its stage beside A and B (two more 2-D tensor loads); a thread's 64
    registers share two rows of A and one block of B: three shared-memory reads and two products
    a k-tile, after the k-tile's wgmmas are issued, and no global loads at all (loaded by the
    consumers from global memory, the scales arrived after the wgmmas ended: the class ran at
    0.79-0.81x torch's block-wise path on the H200, docs/performance.md)."""
    block, promote = ptx["coop_fp8_block"][1], ptx["coop_fp8_promote"][1]
    assert _count(block, r"\bfma\.rn\.f32\b") == 2 * 64 and _count(block, r"\bmul\.(rn\.)?f32\b") == 2 * 2
    # the promoting class loads its scale vectors (at each tile's start), the block-scaled one none
    assert _count(block, r"\bld\.global") == 0 < _count(promote, r"\bld\.global")
    tma_load = r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global"
    assert _count(block, tma_load) == _count(promote, tma_load) + 2
    assert _count(block, r"wgmma\.wait_group\.sync\.aligned\s+1;") == 0
    assert "ld.local" not in block and "st.local" not in block
    loop = block[block.rindex('.pragma "nounroll"'):]
    waits = loop.index("wgmma.wait_group.sync.aligned")
    commit = loop.index("wgmma.commit_group", waits)
    scale_read = r"\bld\.shared\.(b32|f32)\b"
    assert _count(loop[:commit], scale_read) == 0 and _count(loop[commit:], scale_read) == 3
    with pytest.raises(AssertionError, match="block scales"):
        K90.Epi(scale_m=True, scale_n=True, block=True).check()
    with pytest.raises(AssertionError, match="crosses B's scale blocks"):
        K90.build(K90.Config(128, 96, 1, 1, False, True, 8), "float8_e4m3fn", "bfloat16", ROW, COL, ROW, None,
                  True, (False,) * 4, 66, epi=K90.Epi(scale_m=True, scale_n=True, promote=True, block=True))


@needs_dsl
def test_ptx_sm90_fp8_block_scales_on_192_wide_tiles(ptx):
    """A 128x192 block-scaled tile spans two 128-column blocks of B: the producer loads a second
    box of B's scales a k-tile (the last column's block), a k-tile reads four scales from shared
    memory (two rows of A, B's first and last block) and selects the middle 64 columns' by the
    tile's parity (selp); a product per row and segment (three), an fma per register (96), still
    no global loads."""
    wide, block = ptx["coop_fp8_block192"][1], ptx["coop_fp8_block"][1]
    assert _count(wide, r"\bfma\.rn\.f32\b") == 2 * 96 and _count(wide, r"\bmul\.(rn\.)?f32\b") == 2 * 2 * 3
    tma_load = r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global"
    assert _count(wide, tma_load) == _count(block, tma_load) + 1
    assert _count(wide, r"\bld\.global") == 0 and "ld.local" not in wide and "st.local" not in wide
    loop = wide[wide.rindex('.pragma "nounroll"'):]
    commit = loop.index("wgmma.commit_group", loop.index("wgmma.wait_group.sync.aligned"))
    assert _count(loop[commit:], r"\bld\.shared\.(b32|f32)\b") == 4
    assert _count(loop, r"\bselp\.(b32|f32)\b") > _count(block[block.rindex('.pragma "nounroll"'):], r"\bselp\.(b32|f32)\b")


@needs_dsl
@pytest.mark.parametrize("name,regs,parts", [("pp_split4", 192, 4), ("coop_split2", 64, 2)])
def test_ptx_sm90_split_k(ptx, name, regs, parts):
    """Split-K (Sm90Gemm._split_store, _split_sum): a part other than the last stores its accumulator as 16-byte
    vectors (regs / 4 of them) and counts itself in its tile's flag with a release add at gpu scope;
    the last part spins on an acquire load of the flag until it counts parts - 1, sets it back to 0,
    and adds the other parts' sums into its accumulator before its epilogue, a loop over the parts
    whose body loads one slot (regs / 4 vectors; unrolled, ptxas hoisted every part's loads and
    spilled); the accumulators stay in registers. Without a split none of it is there."""
    text = ptx[name][1]
    assert _count(text, r"st\.global\.v4\.b32") == regs // 4
    assert _count(text, r"ld\.global\.v4\.b32") == regs // 4
    assert _count(text, r"atom\.global\.release(\.gpu)?\.add\.u32") == 1
    assert _count(text, r"ld\.acquire\.gpu\.global\.b32") >= 1
    assert re.search(rf"setp\.(ne|eq)\.b32\s+%p\d+, %r\d+, {parts - 1};", text)
    assert _count(text, r"st\.relaxed\.gpu\.global\.b32") == 1
    assert "ld.local" not in text and "st.local" not in text
    plain = ptx["pp_2x1_unit"][1]
    assert "ld.acquire" not in plain and "atom.global" not in plain and "st.global.v4" not in plain


@needs_dsl
def test_ptx_sm90_gated(ptx):
    """A gated class loads B's gate and up halves as one 4-D TMA box per stage (the plain class: 2-D),
    runs the plain class's MMAs, and computes one activation per D element (128 x 64 D tile / 128
    threads: 64 ex2 for silu), with the gate's and the up's bias."""
    plain, gated = ptx["pp_2x1_unit"][1], ptx["pp_gated_silu"][1]
    assert _count(gated, r"cp\.async\.bulk\.tensor\.4d\.shared::cluster\.global") >= 1
    assert _count(plain, r"cp\.async\.bulk\.tensor\.4d") == 0
    assert _count(gated, r"ex2\.approx") == 64
    assert _count(gated, r"wgmma\.mma_async\.sync\.aligned\.m64n128k16") >= 4
    assert _count(gated, r"ld\.global") > 0 and "ld.local" not in gated and "st.local" not in gated


def test_fused_epilogue_class_keys():
    """An Epi is the last element of its class key (plain classes keep their keys), build_for_key
    inverts it, and Epi.check refuses what the kernel does not serve."""
    spec = (K90.Config(), "bfloat16", "bfloat16", ROW, ROW, ROW, None, True, (False,) * 4, 66, "sm_90a")
    epi = K90.Epi("n", "float32", "silu")
    plain, fused = K90.class_key(*spec), K90.class_key(*spec, epi)
    assert fused[:-1] == plain and fused[-1] == epi
    assert K90.build_for_key(fused).args == spec and K90.build_for_key(fused).keywords == {"epi": epi}
    assert K90.build_for_key(plain).args == spec and not K90.build_for_key(plain).keywords
    assert K90.Epi(scale_m=True).check() is None and K90.Epi(scale_n=True).check() is None
    for bad in (K90.Epi(), K90.Epi("k", "float32"), K90.Epi("n"), K90.Epi(activation="tanh"),
                K90.Epi("n", "float64"), K90.Epi(activation="sigmoid", gated=True),
                K90.Epi("m", "float32", "silu", gated=True), K90.Epi(activation="silu", scale_m=True, gated=True)):
        with pytest.raises(AssertionError):
            bad.check()
    core = __import__("xgemm.core.epilogues", fromlist=["x"])
    assert set(K90.ACTIVATIONS) == set(core.ACTIVATIONS) and K90.GATED == core.GATED


@needs_dsl
def test_ptx_sm90_cooperative_with_c(ptx):
    text = ptx["coop_1x2_c"][1]
    assert _count(text, r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.f16\.f16") >= 8
    assert _count(text, r"multicast::cluster") >= 1                      # A shared along N
    # C arrives by TMA into shared memory (a non-multicast load besides the multicast one)
    assert _count(text, r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global\.tile\.mbarrier[^;]*"
                        r"bytes(\.L2::cache_hint)?\s") >= 1 or \
        _count(text, r"cp\.async\.bulk\.tensor\.\dd\.shared::cta\.global") >= 1
    assert "ld.local" not in text and "st.local" not in text


@needs_dsl
def test_ptx_sm80(ptx):
    text = ptx["mma_sm80"][1]
    assert _count(text, r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32") >= 32
    assert _count(text, r"ldmatrix\.sync\.aligned") >= 2
    assert _count(text, r"cp\.async\.c[ag]\.shared\.global[^;]*, 16") >= 1
    assert "wgmma" not in text
    text_c = ptx["mma_sm80_c"][1]
    assert _count(text_c, r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32") >= 32
    assert _count(text_c, r"ld\.global") >= 1                           # C is read


@needs_dsl
def test_no_c_variant_takes_no_c(ptx, tmp_path):
    """beta == 0 compiles a signature without C, so C cannot be read; the C variant names it.
    (Exported and reloaded, as the disk cache does, then called with CPU tensors: the TVM-FFI
    wrapper rejects them with a message that spells out the signature.)"""
    torch = pytest.importorskip("torch")
    import cutlass.cute as cute
    x = torch.zeros(8, 8)
    for name, has_c in (("pp_2x1", False), ("coop_1x2_c", True), ("mma_sm80", False), ("mma_sm80_c", True)):
        obj = tmp_path / f"{name}.o"
        ptx[name][0].export_to_c(object_file_path=str(obj), function_name="f")
        fn = cute.runtime.load_module(str(obj), enable_tvm_ffi=True)["f"]
        with pytest.raises(Exception) as info:
            fn(x, x, x, 0)
        assert ("c: Tensor" in str(info.value)) == has_c, str(info.value)


def test_sm_margin_shrinks_the_persistent_grid(monkeypatch):
    """jax_sharding's ring asks for SMs left free: the class compiled for that many fewer SMs
    (132 - 8 = 124 SMs: 62 2x1 clusters instead of 66)."""
    pytest.importorskip("jax")
    seen = []
    monkeypatch.setattr(K90, "compiled", lambda *spec: seen.append(spec) or (lambda *a: None))
    p, pol = _problem(8192, 8192, 8192), K90.Config().policy()
    for margin in (0, 8):
        K90.KERNEL.jax_lowering(p, pol, sm_margin=margin)
    assert seen[0][:-2] == seen[1][:-2] and (seen[0][-2], seen[1][-2]) == (66, 62)


def test_gated_policy_tiles_divide_h():
    """A gated product is never transposed and takes a tile whose gate half divides H and is whole
    128-byte rows (a 64-wide tile's 32 gate columns faulted on the H200; building a 128x192 tile's
    96-column half aborted the process on an H100): the benchmark's H = 14336 (8192 x 2*14336 x
    4096) takes a 128-wide tile, and so does 4096 x 2*4608 x 512, whose plain row is 128x192."""
    for m in (1, 333, 1000, 4096, 8192, 16384):
        for h in (576, 1536, 3072, 4096, 4608, 6144, 9216, 14336):
            for k in (136, 512, 4096):
                pol = K90.choose_gated_policy(m, h, k, 1)
                half = K90.Config.from_policy(pol).tile_n // 2
                assert not K90.swapped(pol) and half % K90.GATE_HALF_STEP == 0 and h % half == 0, (m, h, k, pol)
    assert K90.Config.from_policy(K90.choose_gated_policy(8192, 14336, 4096, 1)).tile_n == 128
    assert K90.choose_config(4096, 2 * 4608, 512, 1)[1].tile_n == 192
    assert K90.Config.from_policy(K90.choose_gated_policy(4096, 4608, 512, 1)).tile_n == 128


@needs_dsl
def test_sm90_classes_keep_the_wgmma_pipeline(ptx):
    """Every sm90 class of the fixture issues its k-tile's wgmmas as one batch: at most one wgmma in
    four waits (a 64-wide k-tile is 4 k-steps of 16, times the tile's wgmmas along M)."""
    for name, (_, _, cubin) in ptx.items():
        if name.startswith("mma_sm80"):
            continue
        gmmas, alone = _wgmma_waits(cubin)
        assert gmmas >= 4 and alone * 4 <= gmmas, (name, gmmas, alone)


@needs_dsl
@pytest.mark.parametrize("cfg", K90.GROUPED_CONFIGS[1:], ids=lambda c: f"{c.tile_m}x{c.tile_n}_{c.cluster_m}x{c.cluster_n}")
def test_grouped_candidates_keep_the_wgmma_pipeline(cfg, tmp_path):
    """The other grouped candidates (the first is the fixture's pp_grouped) as grouped.py times them,
    bf16 with B K-major. Adding a second, 64-wide wgmma path for a last tile column (not on main)
    left 128x128 2x1 with every wgmma serialized and the others not (docs/performance.md, session 35)."""
    K90.build(cfg, "bfloat16", "bfloat16", ROW, COL, ROW, None, True, (False, True, False, False), 66, "sm_90a",
              f"--keep-cubin --dump-dir={tmp_path}", grouped=True)
    (cubin,) = tmp_path.glob("*.cubin")
    gmmas, alone = _wgmma_waits(cubin)
    assert gmmas >= 4 and alone * 4 <= gmmas, (gmmas, alone)


@needs_dsl
def test_ptx_sm90_grouped_class(ptx):
    """The grouped class: each of the four places that takes a next tile (the producer's first and
    next, the consumers' first and next) scans the groups' ends a warp at a time (two loads a lane,
    a 5-step prefix sum by shfl.up, a ballot and its popc); D is stored through the rank-3 ragged
    view, A and B loaded through rank-3 TMA with B multicast over the 2x1 cluster, and a folded row's
    loads beside them (A multicast, each CTA's B whole); no local memory."""
    text = ptx["pp_grouped"][1]
    loads = {(op[21], "multicast" in op) for op in re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::\S+", text)}
    assert loads == {("2", False), ("2", True), ("3", False), ("3", True)}, loads   # (rank, multicast)
    assert _count(text, r"vote\.sync\.ballot\.b32") == 4 and _count(text, r"\bpopc\.b32") == 4
    assert _count(text, r"shfl\.sync\.up\.b32") == 4 * 5
    assert _count(text, r"ld\.global[.a-z0-9]*\.[bsu]32") == 4 * 2
    stores = re.findall(r"cp\.async\.bulk\.tensor\.(\d)d\.global\.shared::cta", text)
    assert stores and set(stores) == {"3"}
    assert _count(text, r"cp\.async\.bulk\.tensor\.3d\.shared::cluster\.global[^;]*multicast::cluster") >= 1
    assert _count(text, r"wgmma\.mma_async\.sync\.aligned\.m64n192k16\.f32\.bf16\.bf16") >= 8
    assert "ld.local" not in text and "st.local" not in text
    # the dense classes take none of it
    assert "vote.sync.ballot" not in ptx["pp_2x1_unit"][1]


@needs_dsl
def test_ptx_sm90_grouped_gated_class(ptx):
    """The grouped class fusing a gate: the same group search, each group's B [gate | up] loaded as
    one 5-D TMA box (the gated view over (N, K, E)), multicast and, for a folded row, whole; D
    stored through the ragged view at half the tile's width; one ex2 per D value (silu's sigmoid:
    a 128x256 cooperative tile's 128 gate and up values a thread make 64); no local memory."""
    text = ptx["coop_grouped_gated"][1]
    loads = {(op[21], "multicast" in op) for op in re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::\S+", text)}
    assert loads == {("2", False), ("2", True), ("5", False), ("5", True)}, loads
    assert _count(text, r"vote\.sync\.ballot\.b32") == 4 and _count(text, r"\bpopc\.b32") == 4
    stores = re.findall(r"cp\.async\.bulk\.tensor\.(\d)d\.global\.shared::cta", text)
    assert stores and set(stores) == {"3"}
    assert _count(text, r"ex2\.approx") == 64
    assert _count(text, r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16") >= 4
    assert "ld.local" not in text and "st.local" not in text


@needs_dsl
def test_every_gated_tile_the_policies_pick_compiles_for_both_b_layouts():
    """The gated classes the policies can pick, dense (tile_n 128 and 256) and grouped (each of
    GATED_GROUPED_CONFIGS), built for a row-major and a column-major [gate | up] B, in a child
    process: CuTe-DSL aborts the whole process on a TMA atom it cannot build (a 128x192 tile's
    96-column gate half with a row-major B did, on an H100), which would take the test runner down."""
    code = """
import sys
from xgemm.kernels import cute_gemm_sm90 as K90
from xgemm.core.problem import COL, ROW
epi = K90.Epi(activation="silu", gated=True)
dense = [K90.Config(128, 128, 2, 1, True, False, 8), K90.Config(128, 256, 2, 1, False, False, 8)]
for b_major in (ROW, COL):
    for cfg in dense:
        K90.build(cfg, "bfloat16", "bfloat16", ROW, b_major, ROW, None, True, (False, False, False, False), 66,
                  "sm_90a", epi=epi)
        print("dense", cfg.tile_n, b_major, flush=True)
    for cfg in K90.GATED_GROUPED_CONFIGS:
        K90.build(cfg, "bfloat16", "bfloat16", ROW, b_major, ROW, None, True, (False, True, False, False), 66,
                  "sm_90a", epi=epi, grouped=True)
        print("grouped", cfg.tile_n, b_major, flush=True)
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "CUTE_DSL_ARCH": "sm_90a"})
    built = [ln for ln in run.stdout.splitlines() if ln.startswith(("dense", "grouped"))]
    assert run.returncode == 0, (run.returncode, built, run.stderr[-2000:])
    assert len(built) == 2 * (2 + len(K90.GATED_GROUPED_CONFIGS)), built
    # the policies pick no other gated tile width
    widths = {K90.Config.from_policy(K90.choose_gated_policy(m, h, 4096, 1)).tile_n
              for m in (1, 1000, 4096, 16384) for h in range(64, 30000, 64)}
    assert widths <= {128, 256} and {c.tile_n for c in K90.GATED_GROUPED_CONFIGS} <= {128, 256}


@needs_dsl
def test_a_class_the_compiler_aborts_on_is_a_typed_error(monkeypatch, tmp_path):
    """The class CuTe-DSL aborts on (a 128x192 gated tile with a row-major B: a 96-column gate half,
    which no policy picks now), asked of the compile cache: the build's child process dies, and the
    caller gets errors.KernelBuildError instead of dying with it."""
    from xgemm import errors
    from xgemm.kernels import cute_gemm_sm90_build as B
    from xgemm.runtime import cute_cache
    monkeypatch.setenv("XGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    monkeypatch.delenv("XGEMM_CACHE", raising=False)
    monkeypatch.delenv("XGEMM_CUTE_BUILD", raising=False)
    monkeypatch.setattr(cute_cache, "_memory", {})
    with pytest.raises(errors.KernelBuildError, match="SIGABRT"):
        B.compiled(K90.Config(128, 192, 2, 1, True, False, 8), "bfloat16", "bfloat16", ROW, ROW, ROW, None, True,
                   (False, False, False, False), 66, "sm_90a", epi=K90.Epi(activation="silu", gated=True))
