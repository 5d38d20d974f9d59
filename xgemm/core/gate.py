"""What the gated activation asks of a kernel (registry op "gate"), apart from its product: for a
[gate | up] pre-activation h [R, 2H], the forward y = act(gate) * up [R, H], or the backward
dh = [dy * up * act'(gate) | dy * act(gate)] [R, 2H] (core/epilogues.gate / gate_backward). The
composed gated path under torch autograd runs these (compose.py). Kept out of problem.py, which
fingerprints every compiled CuTe class."""
from __future__ import annotations

from dataclasses import dataclass

from xgemm.core.problem import Device, Operand


@dataclass(frozen=True)
class GateProblem:
    h: Operand                      # [R, 2H]: gate columns, then up columns
    gated: str                      # "swiglu" | "geglu" | "reglu" (core/epilogues.GATED)
    backward: bool                  # with dy [R, H] of h's dtype: dh [R, 2H]; else y [R, H]
    out_dtype: str
    framework: str
    device: Device

    def summary(self) -> str:
        r, h2 = self.h.shape
        what = f"d{self.gated} backward -> [{r}, {h2}]" if self.backward else f"{self.gated} -> [{r}, {h2 // 2}]"
        return f"gate {r}x{h2} {self.h.dtype} {what} {self.out_dtype} on {self.framework}:{self.device.kind}"
