"""triton_gemv_sm90 on the CPU: its values under Triton's interpreter (float16; the interpreter
mishandles bfloat16), the PTX of its cubin (mma.sync fed by 16-byte cp.async, pipelined), its
entries and policy, and what supports() declines. It stays off the routing until the H200 runs
tests/gpu/test_triton_gemv_gpu.py (XGEMM_DECODE=1)."""
from __future__ import annotations

import re
import textwrap

import pytest
from helpers import run_interpreted

from xgemm.core.problem import COL, ROW, Device, Epilogue, GemmProblem, Operand
from xgemm.kernels import triton_gemv_sm90 as gv

triton = pytest.importorskip("triton")
from xgemm.runtime import gluon_cache  # noqa: E402


INTERPRETED = textwrap.dedent("""
    import itertools, torch, triton
    from xgemm.kernels import triton_gemv_sm90 as gv
    kernel = gv._define()
    torch.manual_seed(0)
    worst = 0.0
    for (m, n, k), kmajor, (bn, bk), alpha in itertools.product(
            [(1, 8, 8), (5, 136, 264), (16, 1000, 1032), (3, 40, 72)], [False, True], [(16, 64), (32, 256)], [1.0, -0.5]):
        a = torch.randn(m, k).half()
        b = torch.randn(k, n).half()
        bt = b.t().contiguous().t() if kmajor else b
        d = torch.full((m, n), float("nan")).half()
        ldb = bt.stride(1) if kmajor else bt.stride(0)
        kernel[(-(-n // bn),)](a, bt, d, m, n, k, a.stride(0), ldb, d.stride(0), alpha,
                               BM=gv.BM, BN=bn, BK=bk, B_KMAJOR=kmajor)
        want = alpha * (a.double() @ b.double())
        err = ((d.double() - want).abs() / (want.abs() + 1)).max().item()
        assert torch.isfinite(d).all(), (m, n, k, kmajor, bn, bk)
        worst = max(worst, err)
    print(f"worst {worst:.2e}")
    assert worst < 5e-3, worst
""")


def test_values_under_the_interpreter():
    assert "worst" in run_interpreted(INTERPRETED)


if not gluon_cache.can_compile():
    pytest.skip(f"needs triton >= 3.8 (found {triton.__version__})", allow_module_level=True)

CFGS = [gv.Config("bfloat16", "bfloat16", 32, 256, 4, False), gv.Config("float16", "float32", 16, 64, 4, True)]


@pytest.fixture(scope="module")
def built(gluon_cache_dir):
    return {cfg: (gluon_cache.compile_kernel(cfg.key)[0], gluon_cache.lookup(cfg.key)) for cfg in CFGS}


@pytest.mark.parametrize("cfg", CFGS, ids=["bf16-n32-bN", "f16-f32-n16-bK"])
def test_ptx_mma_fed_by_pipelined_cp_async(built, cfg):
    ptx = built[cfg][0].asm["ptx"]
    it = {"float16": "f16", "bfloat16": "bf16"}[cfg.in_dtype]
    assert re.search(rf"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.{it}\.{it}\.f32", ptx)
    assert re.search(r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 0x10", ptx)    # 16-byte vectors
    assert ptx.count("cp.async.commit_group") >= cfg.stages                          # blocks in flight
    assert "ld.global.b16" not in ptx                  # no scalar loads of B (the divisibility hints hold)
    assert "cp.async.bulk" not in ptx and "wgmma" not in ptx


def test_metadata_and_entries(built):
    for cfg in CFGS:
        meta = built[cfg][1].meta
        assert meta["num_ctas"] == 1 and meta["num_warps"] == gv.WARPS
        assert 0 < meta["shared"] <= 100 * 1024            # room for two or more CTAs per SM
        assert [p["name"] for p in meta["params"]][:10] == ["a_ptr", "b_ptr", "d_ptr", "M", "N", "K", "lda", "ldb",
                                                            "ldd", "alpha"]
    keys = gv.gluon_entries("sm_90a")
    assert len(keys) == len(set(keys)) == 32 and not gv.gluon_entries("sm_100a")
    for i in gv.IN_DTYPES:
        for m, n, k in [(1, 28672, 8192), (16, 8192, 8192), (1, 4096, 128), (8, 576, 7168)]:
            assert gv.choose(m, n, k, i, "float32", True).key in keys


def test_policy_gives_several_strips_per_sm():
    assert gv.choose(1, 28672, 8192, "bfloat16", "bfloat16", True).bn == 32      # 896 strips, 6.8 per SM
    assert gv.choose(16, 8192, 8192, "bfloat16", "bfloat16", False).bn == 16     # 512 strips
    assert gv.choose(1, 4096, 512, "bfloat16", "bfloat16", False).bk == 64       # a short K


def _problem(m, n, k, *, b_major=ROW, beta=0.0, dtype="bfloat16"):
    a = Operand((m, k), (k, 1), dtype, ROW, 16)
    b = Operand((k, n), (n, 1) if b_major == ROW else (1, k), dtype, b_major, 16)
    c = Operand((m, n), (n, 1), dtype, ROW, 16) if beta else None
    return GemmProblem(m=m, n=n, k=k, batch=(), a=a, b=b, c=c, framework="torch", device=Device("cuda", 0, (9, 0)),
                       epilogue=Epilogue(alpha=1.0, beta=beta, has_c=bool(beta), out_dtype=dtype))


def test_supports_is_off_until_enabled_then_declines_what_it_cannot_run(monkeypatch):
    monkeypatch.delenv(gv.ENABLE, raising=False)
    assert "slower than cuBLAS" in gv.KERNEL.supports(_problem(1, 4096, 4096))
    monkeypatch.setenv(gv.ENABLE, "1")
    monkeypatch.setattr(gluon_cache, "available", lambda key, arch=None: None)
    assert gv.KERNEL.supports(_problem(1, 4096, 4096)) is None
    assert gv.KERNEL.supports(_problem(16, 4096, 4096, b_major=COL)) is None
    assert "M = 17" in gv.KERNEL.supports(_problem(17, 4096, 4096))
    assert "multiples of 8" in gv.KERNEL.supports(_problem(1, 4100, 4096))
    assert "beta/C" in gv.KERNEL.supports(_problem(1, 4096, 4096, beta=1.0))
    assert "float16" in gv.KERNEL.supports(_problem(1, 4096, 4096, dtype="float32"))


def test_cuda_lowering_launches_its_cubin_when_enabled(built, monkeypatch):
    """jax's cuda lowering of a decode matmul: the split-K cubin while the gemv is off, the gemv's
    (one program per 16- or 32-column strip) once XGEMM_DECODE=1."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from xgemm import jax as xj
    from xgemm.core import policy
    a = jax.ShapeDtypeStruct((4, 4096), jnp.bfloat16)
    b = jax.ShapeDtypeStruct((4096, 8192), jnp.bfloat16)

    def launch_line():
        policy._plans.clear()
        text = jax.jit(lambda a, b: xj.matmul(a, b)).trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
        (call,) = [line for line in text.splitlines() if "xgemm_cubin_launch_v1" in line]
        return call
    monkeypatch.delenv(gv.ENABLE, raising=False)
    assert 'kernel = "xgemm_splitk_sm90"' in launch_line()
    monkeypatch.setenv(gv.ENABLE, "1")
    try:
        call = launch_line()
        assert 'kernel = "xgemm_gemv_sm90"' in call and "grid = dense<[512, 1, 1]>" in call   # 8192 / 16
    finally:
        policy._plans.clear()
