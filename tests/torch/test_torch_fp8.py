"""xgemm::scaled_matmul, the torch op: same result as the eager path, torch.compile(fullgraph=True),
and a typed refusal of inputs that require grad (no backward: torch would cast a and b's grads to fp8)."""
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


def test_inputs_requiring_grad_are_refused():
    qa, qb, sa, sb, bias = _operands()
    with pytest.raises(errors.GradientError, match="bias requires grad.*xgemm.fp8_matmul"):
        fp8_ops.scaled_matmul(qa, qb, sa, sb, bias=bias.requires_grad_())
    with pytest.raises(errors.GradientError, match="scale_a, bias require grad"):
        fp8_ops.scaled_matmul(qa, qb, sa.requires_grad_(), sb, bias=bias)
    with torch.no_grad():
        fp8_ops.scaled_matmul(qa, qb, sa, sb, bias=bias)
