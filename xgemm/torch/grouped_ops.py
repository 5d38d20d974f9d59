"""torch.library op xgemm::grouped_mm: grouped GEMM under autograd and torch.compile.

    grouped_mm_op(x[T, K], w[E, K, N], offs[E]) -> [T, N]       groups of x's rows
    grouped_mm_op(x[M, T], w[T, N], offs[E]) -> [E, M, N]       groups of the contraction (dW)

offs are torch._grouped_mm's: each group's end offset, cumulative, int32 or int64, on x's device
(never read on the host). The real implementation is xgemm/grouped.py's eager path (the embedded
default now, a grouped kernel later); the fake one propagates shapes, so torch.compile(fullgraph=True)
sees one opaque op. Backward, both cases through the op itself (so double backward works too):
    rows:     dx = op(dy, w^T, offs)            dw = op(x^T, dy, offs)      -> [E, K, N], zeros for empty groups
    contract: dx = op(w, dy^T, offs)^T          dw = op(x^T, dy, offs)
offs gets no gradient. ragged_dot() / grouped_mm() below are the entries the public API calls for
tensors that need this op (an input requires grad, or a torch.compile trace): they check the
arguments eagerly first, so errors are xgemm's typed ones before autograd records anything.
Imported only when a torch tensor arrives (import xgemm stays light).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from xgemm import arrays, grouped
from xgemm.core import grouped_checks


@torch.library.custom_op("xgemm::grouped_mm", mutates_args=())
def grouped_mm_op(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                  out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return grouped.grouped_mm(x, w, offs, out_dtype=out_dtype)


@grouped_mm_op.register_fake
def _grouped_mm_fake(x, w, offs, out_dtype=None):
    dt = x.dtype if out_dtype is None else out_dtype
    if w.dim() == 3:
        return x.new_empty((x.shape[0], w.shape[2]), dtype=dt)
    return x.new_empty((offs.shape[0], x.shape[0], w.shape[1]), dtype=dt)


def _setup(ctx, inputs, output):
    x, w, offs = inputs[:3]
    ctx.save_for_backward(x, w, offs)


def _backward(ctx, dy):
    x, w, offs = ctx.saved_tensors
    dy = dy.to(x.dtype)              # the kernel's input dtype; accumulation is float32 again
    dx = dw = None
    if w.dim() == 3:
        if ctx.needs_input_grad[0]:
            dx = grouped_mm_op(dy, w.mT, offs)
        if ctx.needs_input_grad[1]:
            dw = grouped_mm_op(x.mT, dy, offs)
    else:
        if ctx.needs_input_grad[0]:
            dx = grouped_mm_op(w, dy.mT, offs).mT
        if ctx.needs_input_grad[1]:
            dw = grouped_mm_op(x.mT, dy, offs)
    return dx, dw, None, None


grouped_mm_op.register_autograd(_backward, setup_context=_setup)


def _torch_dtype(name: Optional[str]) -> Optional[torch.dtype]:
    return None if name is None else getattr(torch, name)


def ragged_dot(lhs: Any, rhs: Any, group_sizes: Any, *, out_dtype: Any = None) -> torch.Tensor:
    """xgemm.grouped.ragged_dot through the op: offs = cumsum(group_sizes), on the device."""
    if compiling():                  # checked at run time, inside the op; the trace sees torch's ops
        # the shapes and the sizes' dtype first, in ragged_dot's own names (the op sees grouped_mm's offs)
        grouped_checks.ragged_dot("ragged_dot", tuple(lhs.shape), tuple(rhs.shape), tuple(group_sizes.shape))
        if group_sizes.dtype not in (torch.int32, torch.int64):
            grouped_checks.index_dtype("ragged_dot", "group_sizes", str(group_sizes.dtype).rsplit(".", 1)[-1])
        return grouped_mm_op(lhs, rhs, torch.cumsum(group_sizes, 0), _torch_dtype(arrays.requested_dtype(out_dtype)))
    c = grouped.check_ragged_dot(lhs, rhs, group_sizes, out_dtype)
    return grouped_mm_op(c.a, c.b, torch.cumsum(c.index, 0), _torch_dtype(c.out_dtype))


def grouped_mm(x: Any, w: Any, offs: Any, *, out_dtype: Any = None) -> torch.Tensor:
    """xgemm.grouped.grouped_mm through the op."""
    if compiling():
        return grouped_mm_op(x, w, offs, _torch_dtype(arrays.requested_dtype(out_dtype)))
    c = grouped.check_grouped_mm(x, w, offs, out_dtype)
    return grouped_mm_op(c.a, c.b, c.index, _torch_dtype(c.out_dtype))


def compiling() -> bool:
    return torch.compiler.is_compiling()
