"""torch.library custom ops: xgemm under autograd and torch.compile.

`xgemm.matmul/gemm/softmax` route torch tensors here when autograd needs a graph (an input requires
grad) or when torch.compile is tracing, so that
  - torch.compile sees one opaque op with a fake (meta) implementation instead of graph-breaking on
    DLPack plumbing, and
  - backward runs through xgemm itself: dA = alpha*dD@B^T, dB = alpha*A^T@dD, dC = beta*dD (summed over
    broadcast dims), softmax dx = y*(dy - sum(dy*y)).
Imported only when a torch tensor arrives (import xgemm stays light).
"""
from __future__ import annotations

from typing import Optional

import torch

from xgemm import arrays, gate, prepare
from xgemm.core import checks


@torch.library.custom_op("xgemm::gemm", mutates_args=())
def gemm_op(a: torch.Tensor, b: torch.Tensor, c: Optional[torch.Tensor], alpha: float, beta: float,
            out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """out_dtype: float32 for fp16/bf16 operands (the composed epilogues' accumulator), else None."""
    dt = None if out_dtype is None else str(out_dtype).rsplit(".", 1)[-1]
    return prepare.run(prepare.prepare_gemm("gemm", a, b, c, alpha, beta, None, out_dtype=dt))


@gemm_op.register_fake
def _gemm_fake(a, b, c, alpha, beta, out_dtype=None):
    # fake tensors: the op's own shape checks (inside a trace they are the first to see the
    # shapes, and torch.matmul's meta check would name neither xgemm nor the fix), then the result
    shape = checks.gemm_shape("gemm", tuple(a.shape), tuple(b.shape), None if c is None else tuple(c.shape),
                              beta, c is not None)
    return a.new_empty(shape.final, dtype=out_dtype or a.dtype)


def gemm(fn: str, a: torch.Tensor, b: torch.Tensor, c: Optional[torch.Tensor], alpha: float, beta: float,
         out_dtype: Optional[str] = None) -> torch.Tensor:
    """gemm_op for a public call: its arguments are validated eagerly first (outside a trace),
    before autograd records anything."""
    if not compiling():
        prepare.prepare_gemm(fn, a, b, c, alpha, beta, None, plan_only=True, out_dtype=out_dtype)
        # b or C of another framework (NumPy, CuPy, JAX: the mixing rules prepare_gemm checked) as torch
        # tensors on the same memory: the op takes tensors only
        b = arrays.import_into("torch", b, "b", fn)
        c = None if c is None else arrays.import_into("torch", c, "c", fn)
    return gemm_op(a, b, c, alpha, beta, None if out_dtype is None else getattr(torch, out_dtype))


def _gemm_setup(ctx, inputs, output):
    a, b, c, alpha, beta = inputs[:5]
    ctx.save_for_backward(a, b)
    ctx.alpha, ctx.beta = alpha, beta
    ctx.c_shape = None if c is None else c.shape


def _unbroadcast(g: torch.Tensor, shape) -> torch.Tensor:
    """Sum g over the dims that were broadcast to reach g.shape from `shape`."""
    while g.dim() > len(shape):
        g = g.sum(0)
    for i, n in enumerate(shape):
        if n == 1 and g.shape[i] != 1:
            g = g.sum(i, keepdim=True)
    return g


def _gemm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    g = grad
    if b.dim() == 1:            # first: for vector @ vector, grad is 0-d
        g = g.unsqueeze(-1)
    if a.dim() == 1:
        g = g.unsqueeze(-2)
    g = g.to(a.dtype)
    ga = gb = gc = None
    if ctx.needs_input_grad[0]:
        ga = _unbroadcast(gemm_op(g, b2.mT, None, ctx.alpha, 0.0), a2.shape)
        ga = ga.squeeze(0) if a.dim() == 1 else ga
    if ctx.needs_input_grad[1]:
        gb = _unbroadcast(gemm_op(a2.mT, g, None, ctx.alpha, 0.0), b2.shape)
        gb = gb.squeeze(-1) if b.dim() == 1 else gb
    if ctx.c_shape is not None and ctx.needs_input_grad[2]:
        gc = _unbroadcast(grad * ctx.beta, ctx.c_shape)
    return ga, gb, gc, None, None, None


gemm_op.register_autograd(_gemm_backward, setup_context=_gemm_setup)


@torch.library.custom_op("xgemm::softmax", mutates_args=())
def softmax_op(x: torch.Tensor, axis: int) -> torch.Tensor:
    return prepare.run(prepare.prepare_softmax("softmax", x, axis, None))


@softmax_op.register_fake
def _softmax_fake(x, axis):
    return torch.empty_like(x)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.axis = inputs[1]


def _softmax_backward(ctx, dy):
    (y,) = ctx.saved_tensors
    acc = torch.float64 if y.dtype == torch.float64 else torch.float32   # as the forward's math
    ya, dya = y.to(acc), dy.to(acc)
    dx = ya * (dya - (dya * ya).sum(ctx.axis, keepdim=True))
    return dx.to(y.dtype), None


softmax_op.register_autograd(_softmax_backward, setup_context=_softmax_setup)


def compiling() -> bool:
    return torch.compiler.is_compiling()


@torch.library.custom_op("xgemm::gate", mutates_args=())
def gate_op(h: torch.Tensor, gated: str) -> torch.Tensor:
    """act(gate) * up of a 2-D [gate | up] h (xgemm/gate.py), in h's dtype."""
    return gate.gate(h, gated)


@gate_op.register_fake
def _gate_fake(h, gated):
    return h.new_empty((h.shape[0], h.shape[1] // 2))


@torch.library.custom_op("xgemm::gate_backward", mutates_args=())
def gate_backward_op(h: torch.Tensor, dy: torch.Tensor, gated: str) -> torch.Tensor:
    """[dy * up * act'(gate) | dy * act(gate)]: the gate's gradient with respect to h."""
    return gate.gate(h, gated, dy)


@gate_backward_op.register_fake
def _gate_backward_fake(h, dy, gated):
    return h.new_empty(h.shape)


def _gate_setup(ctx, inputs, output):
    ctx.gated = inputs[1]
    ctx.save_for_backward(inputs[0])


def _gate_backward(ctx, dy):
    (h,) = ctx.saved_tensors
    return gate_backward_op(h, dy.to(h.dtype).contiguous(), ctx.gated), None


gate_op.register_autograd(_gate_backward, setup_context=_gate_setup)
