"""triton_quantize_sm90 on an H200: xgemm.quantize_fp8's row and 1x128 recipes
through the kernel, bit for bit the embedded default's q and scales (core/fp8_checks.quantize in
torch ops on the same GPU), for every x dtype and both FP8 types, with NaN, +-inf, all-zero rows
and values far beyond the FP8 range; the 1x128 scales come out M-major."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                                 reason="needs a Hopper (sm_90) GPU")]

SHAPES = [(1, 128), (300, 1024), (17, 16384), (64, 7168), (5, 1000), (127, 8)]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{r}x{c}" for r, c in SHAPES])
@pytest.mark.parametrize("recipe", ["row", "block_1x128"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
def test_bit_exact_with_the_default(shape, recipe, dtype, fp8):
    import xgemm
    from xgemm import arrays
    from xgemm.core import fp8_checks
    from xgemm.kernels import triton_quantize_sm90 as tq
    rows, cols = shape
    g = torch.Generator(device="cuda").manual_seed(rows * 7 + cols)
    x = torch.randn(rows, cols, device="cuda", generator=g) * 30
    x[0, 3 % cols] = float("nan")
    if rows > 2:
        x[1, -1] = float("inf")
        x[2] = 0.0
    if rows > 4:
        x[3, 0] = -1e30 if dtype == "float32" else -6e4
        x[4, : cols // 2] = 1e-30 if dtype == "float32" else 1e-7        # tiny values: scales, not zeros
    x = x.to(getattr(torch, dtype))
    from xgemm import fp8 as xfp8
    block, scale_shape = fp8_checks.quantize_block("test", recipe, x.shape)
    plan = xfp8.prepare_quantize("test", "torch", x, recipe, block, tuple(scale_shape), fp8).plan
    assert plan.kernel.name == tq.NAME, plan.declined
    q, s = xgemm.quantize_fp8(x, recipe, fp8)
    torch.cuda.synchronize()
    xp = arrays.namespace("torch")
    q_ref, s_ref = fp8_checks.quantize(xp, x, block, scale_shape, getattr(torch, fp8), fp8_checks.FP8_MAX[fp8],
                                       torch.float32, x.device)
    assert torch.equal(s, s_ref), (s - s_ref).abs().max()
    # 1x128 scales M-major, their column stride padded to 4 floats (fp8_checks.kernel_block_scales)
    assert s.stride()[0] == 1 and (recipe == "row" or s.stride()[1] == -(-rows // 4) * 4), s.stride()
    same = q.view(torch.uint8) == q_ref.view(torch.uint8)
    assert same.all(), f"{int((~same).sum())} of {q.numel()} fp8 values differ, first at {(~same).nonzero()[0].tolist()}"
