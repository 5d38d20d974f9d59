"""triton_gate_sm90 on the H200: the gated activation and its backward against core/epilogues in
float64 (NaN-filled results, ragged rows, padded row strides), and xgemm.gated under torch
autograd against torch's own bf16 ops."""
from __future__ import annotations

import itertools

import pytest
from helpers import swiglu_block

torch = pytest.importorskip("torch")
import array_api_compat.torch as xp  # noqa: E402

import xgemm  # noqa: E402
from xgemm import arrays  # noqa: E402
from xgemm.core import epilogues, policy  # noqa: E402
from xgemm.core.gate import GateProblem  # noqa: E402
from xgemm.kernels import triton_gate_sm90 as tgate  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("gated,backward,dtype", list(itertools.product(
    ["swiglu", "geglu", "reglu"], [False, True], [torch.bfloat16, torch.float16])))
@pytest.mark.parametrize("rows,half,pad", [(1, 8, 0), (1000, 1032, 8), (4097, 4096, 0)])
def test_gate_kernel_matches_float64(gated, backward, dtype, rows, half, pad):
    h = (torch.randn(rows, 2 * half + pad, device="cuda") * 3).to(dtype)[:, :2 * half]
    dy = torch.randn(rows, half, device="cuda").to(dtype)
    vh = arrays.view(h, "h", "test")
    problem = GateProblem(arrays.operand(vh), gated, backward, vh.dtype, "torch", vh.device)
    plan = policy.choose("gate", problem)
    assert plan.kernel.name == tgate.NAME, plan
    out = torch.full((rows, 2 * half if backward else half), float("nan"), device="cuda", dtype=dtype)
    plan.kernel.run(problem, plan.policy, (vh, arrays.view(dy, "dy", "test") if backward else None),
                    arrays.view(out, "out", "test"), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    want = (epilogues.gate_backward(xp, h.double(), dy.double(), gated) if backward
            else epilogues.gate(xp, h.double(), gated))
    eps = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    assert not torch.isnan(out).any()
    assert ((out.double() - want).abs() <= eps * want.abs() + 1e-4 * (1 + want.abs())).all()


def test_gated_autograd_through_the_gate_op():
    g = torch.Generator(device="cuda").manual_seed(2)
    a = torch.randn(1000, 1024, device="cuda", generator=g).bfloat16().requires_grad_()
    b = (torch.randn(1024, 2 * 1536, device="cuda", generator=g) / 32).bfloat16().requires_grad_()
    dy = torch.randn(1000, 1536, device="cuda", generator=g).bfloat16()
    y = xgemm.gated(a, b, activation="swiglu")
    y.backward(dy)

    want, peer = swiglu_block(a, b, dy, torch.float64), swiglu_block(a, b, dy, torch.bfloat16)
    for got, w, p in zip((y, a.grad, b.grad), want, peer):
        assert (got.double() - w).abs().max() <= 2 * (p - w).abs().max() + 1e-3
