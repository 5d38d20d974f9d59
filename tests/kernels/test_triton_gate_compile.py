"""triton_gate_sm90 on the CPU: its values under Triton's interpreter (float16) against
core/epilogues' gate and gate_backward in float64, for every gated activation, both directions,
ragged rows and columns and padded row strides; the PTX of its cubins (16-byte vectors, no
spills); its entries and what supports() declines; and the composed gated path under torch
autograd (the op xgemm::gate on the CPU's reference kernel)."""
from __future__ import annotations

import re
import textwrap

import pytest
from helpers import run_interpreted, swiglu_block

from xgemm.core.gate import GateProblem
from xgemm.core.problem import COL, ROW, Device, Operand
from xgemm.kernels import triton_gate_sm90 as tgate

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")
from xgemm.runtime import gluon_cache  # noqa: E402


INTERPRETED = textwrap.dedent("""
    import itertools, torch
    import array_api_compat.torch as xp
    from xgemm.core import epilogues
    from xgemm.kernels import triton_gate_sm90 as tg
    kernel = tg._define()
    torch.manual_seed(0)
    cases = 0
    for gated, backward, (rows, half, pad) in itertools.product(
            ["swiglu", "geglu", "reglu"], [False, True], [(5, 24, 0), (9, 520, 8), (1, 8, 0)]):
        h = (torch.randn(rows, 2 * half + pad) * 3).half()[:, :2 * half]      # a padded row stride
        dy = torch.randn(rows, half).half()
        out = torch.full((rows, 2 * half if backward else half), float("nan")).half()
        grid = -(-rows // tg.BLOCK_R) * -(-half // tg.BLOCK_H)
        kernel[(grid,)](h, dy, out, rows, half, h.stride(0), dy.stride(0), out.stride(0),
                        ACT=tg.ACT_CODE[epilogues.GATED[gated]], BACKWARD=backward, BLOCK_R=tg.BLOCK_R,
                        BLOCK_H=tg.BLOCK_H)
        want = (epilogues.gate_backward(xp, h.double(), dy.double(), gated) if backward
                else epilogues.gate(xp, h.double(), gated))
        err = ((out.double() - want).abs() / (want.abs() * 2.0 ** -10 + 1e-3)).max().item()
        assert err <= 1.0, (gated, backward, rows, half, err)
        cases += 1
    print(f"cases {cases}")
""")


def test_values_under_the_interpreter():
    assert "cases 18" in run_interpreted(INTERPRETED)


def _problem(rows=8192, cols=28672, *, dtype="bfloat16", major=ROW, alignment=16, backward=False):
    h = Operand((rows, cols), (cols, 1) if major == ROW else (1, rows), dtype, major, alignment)
    return GateProblem(h, "swiglu", backward, dtype, "torch", Device("cuda", 0, (9, 0)))


def test_supports_declines_what_it_cannot_run(monkeypatch):
    monkeypatch.setattr(gluon_cache, "available", lambda key, arch=None: None)
    k = tgate.KERNEL
    assert k.supports(_problem()) is None and k.supports(_problem(backward=True)) is None
    assert "float16 or bfloat16" in k.supports(_problem(dtype="float32"))
    assert "multiple of 8" in k.supports(_problem(cols=28660))
    assert "row-major" in k.supports(_problem(major=COL))
    assert "row-major" in k.supports(_problem(alignment=8))
    keys = tgate.gluon_entries()
    assert len(keys) == len(set(keys)) == 12 and all(tgate.Config.from_key(key).key == key for key in keys)


if not gluon_cache.can_compile():
    pytest.skip(f"needs triton >= 3.8 (found {triton.__version__})", allow_module_level=True)


@pytest.mark.parametrize("backward", [False, True])
def test_ptx_vectors_and_no_spills(gluon_cache_dir, backward):
    cfg = tgate.Config("bfloat16", "geglu", backward)
    ptx = gluon_cache.compile_kernel(cfg.key)[0].asm["ptx"]
    assert re.search(r"ld\.global(\.[a-z0-9:]+)*\.v4\.b32", ptx)            # 16-byte loads of h
    assert re.search(r"st\.global(\.[a-z0-9:]+)*\.v4\.b32", ptx)            # and 16-byte stores
    assert ".local" not in ptx


def test_gated_under_autograd_runs_the_gate_op(monkeypatch):
    """Under autograd the product runs in bf16 and the gate as the op
    xgemm::gate (the reference kernel on the CPU); values and grads against float64 within the
    bf16 rounding of the product, and torch.compile(fullgraph=True) traces it."""
    import xgemm
    from xgemm import gate
    calls = []
    real = gate.gate
    monkeypatch.setattr(gate, "gate", lambda h, gated, dy=None, **kw: calls.append(dy is not None) or real(h, gated, dy))
    g = torch.Generator().manual_seed(1)
    a = torch.randn(64, 96, generator=g).bfloat16().requires_grad_()
    b = (torch.randn(96, 2 * 40, generator=g) / 8).bfloat16().requires_grad_()
    dy = torch.randn(64, 40, generator=g).bfloat16()
    y = xgemm.gated(a, b, activation="swiglu")
    y.backward(dy)
    want, peer = swiglu_block(a, b, dy, torch.float64), swiglu_block(a, b, dy, torch.bfloat16)
    for got, w, p in zip((y, a.grad, b.grad), want, peer):
        # within twice torch's own bf16 error (both round the product and the gate's inputs to bf16)
        assert (got.double() - w).abs().max() <= 2 * (p - w).abs().max() + 1e-3
    assert y.dtype == torch.bfloat16 and calls == [False, True]        # the gate op forward, then backward
    f = torch.compile(lambda a, b: xgemm.gated(a, b, activation="geglu"), fullgraph=True, backend="eager")
    torch.testing.assert_close(f(a, b).double(), xgemm.gated(a, b, activation="geglu").double())
