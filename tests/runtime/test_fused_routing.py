"""xgemm.gemm(bias=, activation=) on a (fake) H200: an eager fp16/bf16 call is planned with its
epilogue and launches one cute_gemm_sm90 Epi class (bias along N, or along the kernel's M in the
transposed run) with the bias tensor itself; under autograd, or where no kernel fuses, the product launches a plain class and the epilogue is
composed. Launches are recorded, not run (tests/fake_cuda.py); the GPU run of the Epi classes is
tests/gpu/test_cute_epilogue_gpu.py."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.bindings")
from fake_cuda import Fake  # noqa: E402

import xgemm  # noqa: E402
from xgemm.kernels import cute_gemm_sm90 as K90  # noqa: E402

BF16 = torch.bfloat16


def _cute_calls(fake):
    return [(c[1], c[2]) for c in fake.calls if c[0] == "cute"]


def _gluon_names(fake):
    return [c[1] for c in fake.calls if c[0] == "gluon"]


@pytest.mark.parametrize("mnk,swapped", [((512, 384, 256), False), ((4096, 4096, 4096), True)])
def test_fused_call_launches_the_epi_class(mnk, swapped):
    m, n, k = mnk
    a, b = torch.randn(m, k, dtype=BF16), torch.randn(k, n, dtype=BF16)
    bias = torch.randn(n, dtype=torch.float32)
    with Fake(keep=True) as fake:
        plan = xgemm.explain(a, b, bias=bias, activation="gelu_tanh")
        y = xgemm.gemm(a, b, bias=bias, activation="gelu_tanh")
    assert plan.kernel_name == "cute_gemm_sm90" and "fused into cute_gemm_sm90" in plan.epilogue, plan
    assert K90.swapped(plan.policy) == swapped
    (key, args), = _cute_calls(fake)
    assert key[-1] == K90.Epi("m" if swapped else "n", "float32", "gelu_tanh")
    # f(a, b, d, c, bias, scale_m, scale_n, alpha, beta, stream): the caller's bias, no C, no scales
    assert args[3] is None and args[4] is bias and args[5] is None and args[6] is None
    assert args[7:9] == (1.0, 0.0)
    d = args[2].swapaxes(-2, -1) if swapped else args[2]
    assert d.data_ptr() == y.data_ptr() and y.shape == (m, n) and y.dtype == BF16


def test_c_and_out_cross_with_the_epilogue():
    a, b = torch.randn(256, 128, dtype=BF16), torch.randn(128, 192, dtype=BF16)
    c, bias = torch.randn(256, 192, dtype=torch.float32), torch.randn(192, dtype=BF16)
    out = torch.empty(256, 192, dtype=torch.float32)
    with Fake(keep=True) as fake:
        r = xgemm.gemm(a, b, c, alpha=2.0, beta=0.5, bias=bias, activation="relu", out=out)
    (key, args), = _cute_calls(fake)
    assert r is out and key[-1] == K90.Epi("n", "bfloat16", "relu")
    assert args[2].data_ptr() == out.data_ptr() and args[3].data_ptr() == c.data_ptr() and args[4] is bias
    assert args[7:9] == (2.0, 0.5)


def _composed(fake, d_dtype=torch.float32):
    """One plain-class launch (the product, D of d_dtype): the epilogue ran after it."""
    (key, args), = _cute_calls(fake)
    return len(key) == 12 and args[2].dtype == d_dtype


def test_composed_under_autograd_and_where_no_kernel_fuses():
    a, b, bias = torch.randn(512, 256, dtype=BF16), torch.randn(256, 384, dtype=BF16), torch.randn(384, dtype=BF16)
    with Fake(keep=True) as fake:
        plan = xgemm.explain(a.requires_grad_(), b, bias=bias, activation="silu")
        xgemm.gemm(a, b, bias=bias, activation="silu")
    assert _composed(fake) and "composed after the product" in plan.epilogue
    # skinny M goes to gluon_splitk_sm90, which fuses nothing: the fused plan skips it
    with Fake(keep=True):
        plan = xgemm.explain(torch.randn(16, 4096, dtype=BF16), torch.randn(4096, 1024, dtype=BF16),
                             bias=torch.randn(1024, dtype=BF16), activation="relu")
    assert ("gluon_splitk_sm90", "fuses no bias / activation epilogue") in plan.declined
    # a strided bias: no Epi class reads it, so the call composes
    with Fake(keep=True) as fake:
        xgemm.gemm(a.detach(), b, bias=torch.randn(768, dtype=BF16)[::2], activation="silu")
    assert _composed(fake)


F8 = getattr(torch, "float8_e4m3fn", None)


@pytest.mark.skipif(F8 is None, reason="this torch has no float8_e4m3fn")
def test_scaled_matmul_launches_the_fp8_class():
    """use_fast_accum=True: tensor- and row-wise products of K-major operands launch
    cute_gemm_sm90's FP8 class with the scales as vectors of M and N values, or of one value (a
    tensor-wise scale, not copied); block-wise scales launch the block-scaled promoting class with either accumulation,
    the scales as they are; a row-major b runs the embedded default (no launch)."""
    a = torch.randn(256, 512).to(F8)
    b = torch.randn(384, 512).to(F8).t()                       # (K, N) column-major: K-major
    row = (torch.rand(256, 1) + 0.5, torch.rand(1, 384) + 0.5)
    tensor = (torch.tensor(0.5), torch.tensor(2.0))
    for (sa, sb), extents in ((row, (256, 384)), (tensor, (1, 1))):
        with Fake(keep=True) as fake:
            y = xgemm.scaled_matmul(a, b, sa, sb, bias=torch.randn(384), use_fast_accum=True)
        (key, args), = _cute_calls(fake)
        assert key[1] == "sm_90a" and key[3] == "float8_e4m3fn"
        assert key[-1] == K90.Epi("n", "float32", None, True, True)
        assert (tuple(args[5].shape), tuple(args[6].shape)) == ((extents[0],), (extents[1],))
        assert args[5].data_ptr() == sa.data_ptr() and args[6].data_ptr() == sb.data_ptr()
        assert args[2].data_ptr() == y.data_ptr() and y.dtype == torch.bfloat16
    # block scales as quantize_fp8 gives them (scale_a row-major, scale_b (K/128, N/128) of any
    # strides): copied into the layouts the class loads (fp8_checks.kernel_block_scales); in those
    # layouts already (scale_a M-major, scale_b's rows padded to 4 floats): passed as they are
    block = (torch.rand(256, 4) + 0.5, (torch.rand(3, 4) + 0.5).t())
    kernel_layout = (block[0].t().contiguous().t(), torch.zeros(4, 4)[:, :3].copy_(block[1]))
    for scales, copied in ((block, True), (kernel_layout, False)):
        for fast in (True, False):
            with Fake(keep=True) as fake:
                text = xgemm.explain(a, b, *scales, op="scaled_matmul", use_fast_accum=fast)
                y = xgemm.scaled_matmul(a, b, *scales, use_fast_accum=fast)
            (key, args), = _cute_calls(fake)
            assert key[2].tile_n == 128 and not key[2].pingpong
            assert key[-1] == K90.Epi(None, None, None, True, True, promote=True, block=True)
            assert args[5].stride() == (1, 256) and args[6].stride() == (4, 1) and args[2].data_ptr() == y.data_ptr()
            assert torch.equal(args[5], scales[0]) and torch.equal(args[6], scales[1])
            assert (args[5] is not scales[0] and args[6] is not scales[1]) == copied
            assert "multiplied by its block scales" in text, text
            assert ("scale_a copied M-major" in text and "scale_b copied row-major" in text) == copied, text
    for scales, fast in ((row, True), (block, True), (row, False), (block, False)):
        with Fake(keep=True) as fake:
            xgemm.scaled_matmul(a, b.contiguous(), *scales, use_fast_accum=fast)
        assert not _cute_calls(fake)


@pytest.mark.parametrize("mh", [(512, 1536), (4096, 4096)])
def test_gated_call_launches_the_gated_class(mh):
    """xgemm.gated: one gated Epi class (untransposed, B = [gate | up] whole, D half as wide) with
    the [gate | up] bias; an H that is no multiple of the tile's gate columns composes (the float32
    product, then torch's ops); under autograd the product runs in bf16, then the gate op's kernel."""
    m, h = mh
    a, b = torch.randn(m, 1024, dtype=BF16), torch.randn(1024, 2 * h, dtype=BF16)
    bias = torch.randn(2 * h, dtype=BF16)
    with Fake(keep=True) as fake:
        plan = xgemm.explain(a, b, bias=bias, activation="swiglu", op="gated")
        y = xgemm.gated(a, b, bias=bias, activation="swiglu")
    assert plan.kernel_name == "cute_gemm_sm90" and not K90.swapped(plan.policy), plan
    (key, args), = _cute_calls(fake)
    assert key[-1] == K90.Epi("n", "bfloat16", "silu", gated=True)
    assert args[1] is b and args[4] is bias and args[2].data_ptr() == y.data_ptr() and y.shape == (m, h)
    half = K90.Config.from_policy(plan.policy).tile_n // 2
    odd = torch.randn(1024, 2 * (h + 8), dtype=BF16)       # H + 8: no multiple of the tile's gate columns
    with Fake(keep=True) as fake:
        plan = xgemm.explain(a, odd, activation="geglu", op="gated")
        xgemm.gated(a, odd, activation="geglu")
    assert (h + 8) % half and "composed" in plan.epilogue and _composed(fake) and not _gluon_names(fake)
    with Fake(keep=True) as fake:
        plan = xgemm.explain(a.requires_grad_(), b, activation="swiglu", op="gated")
        xgemm.gated(a, b, activation="swiglu")
    assert "xgemm::gate" in plan.epilogue and _composed(fake, BF16)
    assert _gluon_names(fake) == ["xgemm_gate"], fake.calls


@pytest.mark.skipif(F8 is None, reason="this torch has no float8_e4m3fn")
def test_default_accumulation_runs_the_promoting_class_and_fast_accum_the_fast_one():
    """scaled_matmul's default call (float32 accumulation) launches the FP8 class that adds each
    k-tile's sum in float32 (Epi.promote) on a cooperative 128x128 tile; a use_fast_accum call of
    the same problem the class that keeps them in the wgmma accumulator. Their plans are cached
    apart (the cache keys on the accumulation asked), whichever call comes first; explain() says
    which runs."""
    from xgemm.core import policy
    a = torch.randn(256, 512).to(F8)
    b = torch.randn(384, 512).to(F8).t()
    row = (torch.rand(256, 1) + 0.5, torch.rand(1, 384) + 0.5)
    for order in ((True, False, True), (False, True, False)):
        policy.clear_plans()
        with Fake(keep=True) as fake:         # one fake device: its plans stay cached across the calls
            for fast in order:
                xgemm.scaled_matmul(a, b, *row, use_fast_accum=fast)
        for fast, (key, _) in zip(order, _cute_calls(fake)):
            if fast:
                assert key[-1] == K90.Epi(scale_m=True, scale_n=True) and key[2].pingpong
            else:
                assert key[-1] == K90.Epi(scale_m=True, scale_n=True, promote=True)
                assert key[2].tile_m == 128 and key[2].tile_n == 128 and not key[2].pingpong
    with Fake(keep=True):
        text = str(xgemm.explain(a, b, *row, op="scaled_matmul"))
        fast_text = str(xgemm.explain(a, b, *row, op="scaled_matmul", use_fast_accum=True))
    assert "runs on cute_gemm_sm90" in text and "k-tile sums added in float32" in text, text
    assert "runs on cute_gemm_sm90" in fast_text and "wgmma accumulator" in fast_text, fast_text
    policy.clear_plans()


@pytest.mark.skipif(F8 is None, reason="this torch has no float8_e4m3fn")
def test_explain_scaled_matmul_names_the_fp8_class():
    a, b = torch.randn(256, 512).to(F8), torch.randn(384, 512).to(F8).t()
    row = (torch.rand(256, 1) + 0.5, torch.rand(1, 384) + 0.5)
    tensor = (torch.tensor(0.5), torch.tensor(2.0))
    for scales in (row, tensor):
        with Fake(keep=True) as fake:
            text = str(xgemm.explain(a, b, *scales, op="scaled_matmul", use_fast_accum=True))
            default = str(xgemm.explain(a, b, *scales, op="scaled_matmul"))
        assert text.startswith("scaled_matmul 256x384x512") and "runs on cute_gemm_sm90" in text, text
        assert not fake.calls
        assert "runs on cute_gemm_sm90" in default and "k-tile sums added in float32" in default, default
    # a row-major b: no FP8 class takes it
    with Fake(keep=True):
        text = str(xgemm.explain(a, b.contiguous(), *row, op="scaled_matmul", use_fast_accum=True))
    assert "embedded default" in text and "cute_gemm_sm90" not in text
    # block-wise scales: the block-scaled class, which says how it applies them
    with Fake(keep=True):
        text = str(xgemm.explain(a, b, torch.rand(256, 4) + 0.5, torch.rand(4, 3) + 0.5, op="scaled_matmul"))
    assert "runs on cute_gemm_sm90" in text and "multiplied by its block scales" in text, text


def test_the_reference_refuses_a_fused_epilogue():
    """A fused problem planned on the reference (here: CPU tensors) is composed by xgemm.gemm; run
    as it stands, the reference refuses it rather than drop the bias and activation."""
    from xgemm import errors, prepare
    a, b, bias = torch.randn(8, 16), torch.randn(16, 24), torch.randn(24)
    prepared = prepare.prepare_gemm("test", a, b, None, 1.0, 0.0, None, bias=bias, activation="relu")
    assert prepared.plan.kernel.name == "reference"
    with pytest.raises(errors.KernelUnavailableError, match="compose the epilogue"):
        prepare.run(prepared)
    y = xgemm.gemm(a, b, bias=bias, activation="relu")
    assert torch.allclose(y, torch.relu(a @ b + bias), atol=1e-5)
