"""What xgemm.quantize_fp8 asks of a kernel (registry op "quantize_fp8"): quantize x to FP8 with one
float32 scale per block (xgemm/fp8.py's module docstring has the recipes and their semantics).
Kept out of problem.py, which fingerprints every compiled CuTe class."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from xgemm.core.problem import Device, Operand


@dataclass(frozen=True)
class QuantizeProblem:
    """q, scale = quantize_fp8(x, recipe): x [rows, cols] (or any shape for "tensor"), q of out_dtype
    (float8_e4m3fn | float8_e5m2) shaped like x, scale float32 of scale_shape; block is the recipe's
    (rows, cols) block, None for one scale over the whole tensor."""
    x: Operand
    recipe: str
    block: Optional[Tuple[int, int]]
    scale_shape: Tuple[int, ...]
    out_dtype: str
    framework: str
    device: Device

    def summary(self) -> str:
        return (f"quantize_fp8 {'x'.join(map(str, self.x.shape))} {self.x.dtype}->{self.out_dtype} recipe "
                f"{self.recipe} (scale {self.scale_shape}) on {self.framework}:{self.device.kind}")
