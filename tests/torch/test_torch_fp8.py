"""xgemm::scaled_matmul, the torch op: same result as the eager path, torch.compile(fullgraph=True),
exact gradients for the scales and the bias, and a typed refusal of fp8 a or b that require grad
(torch would cast their gradients to fp8)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from xgemm import errors, fp8  # noqa: E402
from xgemm.torch import fp8_ops  # noqa: E402


def _operands():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 260, generator=g), torch.randn(260, 130, generator=g)
    qa, sa = fp8.quantize_fp8(x, "block_1x128")
    qb, sb = fp8.quantize_fp8(w, "block_128x128", "float8_e5m2")
    return qa, qb, sa, sb, torch.randn(130, generator=g)


def test_op_matches_the_eager_path():
    qa, qb, sa, sb, bias = _operands()
    y = fp8_ops.scaled_matmul(qa, qb, sa, sb, bias=bias, out_dtype=torch.float32)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, fp8.scaled_matmul(qa, qb, sa, sb, bias=bias, out_dtype="float32"), rtol=0, atol=0)
    ref = (qa.double() * sa.double().repeat_interleave(128, 1)[:, :260]) @ \
          (qb.double() * sb.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:260, :130]) + bias.double()
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-4)
    torch.library.opcheck(fp8_ops.scaled_matmul_op, (qa, qb, sa, sb, bias, torch.bfloat16),
                          test_utils=("test_faketensor",))   # test_schema multiplies fp8 inputs itself (no CPU kernel)


def test_torch_compile_fullgraph():
    qa, qb, sa, sb, bias = _operands()
    f = torch.compile(lambda a, b, s, t, v: fp8_ops.scaled_matmul(a, b, s, t, bias=v).float().relu(),
                      fullgraph=True, backend="eager")
    torch.testing.assert_close(f(qa, qb, sa, sb, bias), fp8.scaled_matmul(qa, qb, sa, sb, bias=bias).float().relu())


def test_fp8_operands_requiring_grad_are_refused():
    qa, qb, sa, sb, bias = _operands()
    with pytest.raises(errors.GradientError, match="a requires grad.*detach a.*xgemm.fp8_matmul"):
        fp8_ops.scaled_matmul(qa.requires_grad_(), qb, sa, sb, bias=bias)
    with torch.no_grad():
        fp8_ops.scaled_matmul(qa, qb, sa, sb, bias=bias)


def test_scales_and_bias_get_their_exact_gradients():
    """d/d scale of (a * scale_a) @ (b * scale_b) + bias: the dequantized operand's gradient times
    the fp8 values, summed over each scale's block (float64 autograd of the same formula)."""
    qa, qb, sa, sb, bias = _operands()
    g = torch.randn(5, 130, generator=torch.Generator().manual_seed(1))
    ours = [x.clone().requires_grad_() for x in (sa, sb, bias)]
    (fp8_ops.scaled_matmul(qa, qb, *ours[:2], bias=ours[2], out_dtype=torch.float32) * g).sum().backward()
    ref = [x.double().requires_grad_() for x in (sa, sb, bias)]
    deq_a = qa.double() * ref[0].repeat_interleave(128, 1)[:, :260]
    deq_b = qb.double() * ref[1].repeat_interleave(128, 0).repeat_interleave(128, 1)[:260, :130]
    ((deq_a @ deq_b + ref[2]) * g.double()).sum().backward()
    for x, r in zip(ours, ref):
        assert x.grad.dtype == torch.float32 and x.grad.shape == x.shape
        torch.testing.assert_close(x.grad.double(), r.grad, rtol=1e-5, atol=1e-5 * float(r.grad.abs().max()))
