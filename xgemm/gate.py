"""The gated activation as an op of its own (registry "gate", core/gate.py): act(gate) * up of a
[gate | up] pre-activation, and its backward, for the composed gated path under torch autograd
(compose.py, through the torch op xgemm::gate in torch/ops.py)."""
from __future__ import annotations

from typing import Any

from xgemm import arrays, prepare
from xgemm.core import policy
from xgemm.core.gate import GateProblem


def gate(h: Any, gated: str, dy: Any = None, *, fn: str = "gate") -> Any:
    """act(gate) * up of a 2-D [gate | up] h, or with dy its backward [R, 2H], planned like any op
    (registry "gate"): the result in h's framework and dtype."""
    vh = arrays.view(h, "h", fn)
    problem = GateProblem(arrays.operand(vh), gated, dy is not None, vh.dtype, vh.framework, vh.device)
    plan = policy.choose("gate", problem)
    vdy = arrays.view(dy, "dy", fn) if dy is not None else None
    out = None                      # the embedded default returns its own result
    if plan.kernel.name != "reference":
        rows, cols = vh.shape
        out = arrays.view(arrays.empty(vh.framework, (rows, cols if dy is not None else cols // 2), vh.dtype,
                                       vh.device, h), "out", fn)
    return prepare.run(prepare.Prepared(plan, (vh, vdy), out, lambda result: result))
