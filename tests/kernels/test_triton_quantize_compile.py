"""triton_quantize_sm90 on the CPU: the PTX of its cubins (16-byte loads of x, IEEE divisions, the
round-to-nearest-even FP8 conversion, a multiply by 1 / scale a value), its entries and policy, what
supports() declines, and the
routing of xgemm.quantize_fp8 (launch recorded, tests/fake_cuda.py). Triton's interpreter rounds
FP8 wrongly (126.85 -> 64 in e4m3), so the values are checked on the H200 only
(tests/gpu/test_triton_quantize_gpu.py)."""
from __future__ import annotations

import re

import pytest

from xgemm.core.problem import ROW, Device, Operand
from xgemm.core.quantize import QuantizeProblem
from xgemm.kernels import triton_quantize_sm90 as tq

triton = pytest.importorskip("triton")
from xgemm.runtime import gluon_cache  # noqa: E402

if not gluon_cache.can_compile():
    pytest.skip(f"needs triton >= 3.8 (found {triton.__version__})", allow_module_level=True)

CFGS = [tq.choose(4096, "bfloat16", "float8_e4m3fn", "row"), tq.choose(1000, "float32", "float8_e5m2", "block_1x128")]


@pytest.fixture(scope="module")
def built(gluon_cache_dir):
    return {cfg: (gluon_cache.compile_kernel(cfg.key)[0], gluon_cache.lookup(cfg.key)) for cfg in CFGS}


@pytest.mark.parametrize("cfg", CFGS, ids=["bf16-e4m3-row", "f32-e5m2-1x128"])
def test_ptx_one_pass(built, cfg):
    ptx = built[cfg][0].asm["ptx"]
    loads = re.findall(r"\bld\.global[\w.:]*", ptx)
    assert loads and all(".v4.b32" in op for op in loads), sorted(set(loads))     # 16-byte loads of x only
    fp8 = "e4m3" if cfg.out_dtype == "float8_e4m3fn" else "e5m2"
    assert re.search(rf"cvt\.rn\.satfinite\.{fp8}x2\.f32", ptx)                   # RNE conversion
    assert "div.rn.f32" in ptx and "div.approx" not in ptx and "div.full" not in ptx   # IEEE divisions
    assert "ld.local" not in ptx and "st.local" not in ptx


def test_ptx_divides_once_a_scale(gluon_cache_dir):
    """q = x * (1 / scale): two IEEE divisions a scale (amax / fp8_max, then 1 / scale) and a
    multiply a value, not a division a value (that kept the kernel issue-bound)."""
    cfg = tq.choose(8192, "bfloat16", "float8_e4m3fn", "row")
    per_thread = cfg.block_m * cfg.block_c // (32 * cfg.warps)
    ptx = gluon_cache.compile_kernel(cfg.key)[0].asm["ptx"]
    divs, muls = len(re.findall(r"div\.rn\.f32", ptx)), len(re.findall(r"\bmul\.(rn\.)?f32", ptx))
    assert divs == 2 and muls >= per_thread, (divs, muls, per_thread)


def test_config_keys_entries_and_policy(built):
    for cfg in CFGS:
        assert tq.Config.from_key(cfg.key) == cfg
        assert built[cfg][1].meta["num_warps"] == cfg.warps
    keys = tq.gluon_entries()
    assert len(keys) == len(set(keys)) and not tq.gluon_entries("sm_100a")
    for cols in (8, 1000, 4096, 7168, 16384):
        for recipe in ("row", "block_1x128"):
            cfg = tq.choose(cols, "bfloat16", "float8_e4m3fn", recipe)
            assert cfg.key in keys and cfg.block_c >= cols and cfg.seg == (cfg.block_c if recipe == "row" else 128)
            # 16 values of x a thread (32 at 16384 columns): many programs an SM
            per_thread = cfg.block_m * cfg.block_c // (32 * cfg.warps)
            assert per_thread == (32 if cols > 8192 else tq.ELEMS_PER_THREAD), cfg


def _problem(rows, cols, *, dtype="bfloat16", recipe="row", strides=None, alignment=16):
    x = Operand((rows, cols), strides or (cols, 1), dtype, ROW, alignment)
    block = {"row": (1, cols), "block_1x128": (1, 128), "tensor": None}[recipe]
    return QuantizeProblem(x, recipe, block, (rows, 1), "float8_e4m3fn", "torch", Device("cuda", 0, (9, 0)))


def test_supports_declines_what_it_cannot_run(monkeypatch):
    monkeypatch.setattr(gluon_cache, "available", lambda key, arch=None: None)
    assert tq.KERNEL.supports(_problem(64, 4096)) is None
    assert tq.KERNEL.supports(_problem(64, 4096, recipe="block_1x128")) is None
    assert "row and 1x128" in tq.KERNEL.supports(_problem(64, 4096, recipe="tensor"))
    assert "16384" in tq.KERNEL.supports(_problem(4, 16392))
    assert tq.KERNEL.supports(_problem(127, 8, dtype="bfloat16")) is None        # cols: 16 bytes of x
    assert "16-byte" in tq.KERNEL.supports(_problem(64, 4100))
    assert "16-byte" in tq.KERNEL.supports(_problem(64, 4096, strides=(4100, 1)))
    assert "16-byte" in tq.KERNEL.supports(_problem(64, 4096, alignment=8))
    assert "float64" in tq.KERNEL.supports(_problem(64, 4096, dtype="float64"))


def test_compile_promises_only_what_supports_checks(monkeypatch):
    """C and the row stride are promised multiples of 16 bytes of x (vec elements), what
    supports() checks, not of 16: q's rows are C bytes, and a promise of 16 misaligned the q
    stores of 8- and 1000-column rows on the H200."""
    monkeypatch.setattr(gluon_cache, "available", lambda key, arch=None: None)
    for dt, vec in (("float32", 4), ("float16", 8), ("bfloat16", 8)):
        attrs = tq.gluon_compile_args(tq.choose(1024, dt, "float8_e4m3fn", "row").key, "sm_90a")[3]
        assert attrs[(4,)] == [["tt.divisibility", vec]] and attrs[(5,)] == [["tt.divisibility", vec]], attrs
        assert tq.KERNEL.supports(_problem(3, vec, dtype=dt)) is None


def test_quantize_fp8_launches_the_kernel(built):
    """On a (fake) H200: one launch of the row / 1x128 cubin, grid = rows / BLOCK_M, q and the
    scales fresh arrays of the recipe's shapes; the tensor recipe runs the embedded default (no
    launch)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("cuda.bindings")
    from fake_cuda import Fake

    import xgemm
    x = torch.randn(300, 1024, dtype=torch.bfloat16)
    for recipe, scale_shape in (("row", (300, 1)), ("block_1x128", (300, 8))):
        with Fake(keep=True) as fake:
            q, s = xgemm.quantize_fp8(x, recipe)
        launches = [c for c in fake.calls if c[0] != "cute"]
        assert len(launches) == 1, fake.calls
        cfg = tq.choose(1024, "bfloat16", "float8_e4m3fn", recipe)
        assert "xgemm_quantize_fp8" in str(launches[0]) and q.shape == x.shape and tuple(s.shape) == scale_shape
        assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and cfg.block_m >= 1
    with Fake(keep=True) as fake:
        q, s = xgemm.quantize_fp8(x, "tensor")
    assert not fake.calls and s.shape == ()
