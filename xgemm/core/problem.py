"""Problem / Policy / Epilogue: what is to be computed, how a kernel will tile it, what it does last.

CK-Tile's split: a kernel is a Problem (shapes, dtypes, majorness, alignment, arch) + a Policy
(tile, stages, cluster, warps, raster) + an Epilogue (D = alpha*acc + beta*C, output dtype).
These are plain frozen dataclasses so they hash (compile-cache keys) and print (explain()).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

# Majorness of one matrix operand (its last two dims):
#   "row": the last dim is contiguous (stride 1)  -> for A that is K-major, for B N-major.
#   "col": the second-to-last dim is contiguous    -> for A M-major, for B K-major.
#   "strided": neither; a kernel that needs row/col gets one compacting copy.
ROW, COL, STRIDED = "row", "col", "strided"


@dataclass(frozen=True)
class Operand:
    """One matrix operand as a kernel sees it (after normalization)."""
    shape: Tuple[int, ...]          # full shape, batch dims first
    strides: Tuple[int, ...]        # in elements
    dtype: str                      # "float32" | "float16" | "bfloat16" | "float64"
    majorness: str                  # ROW | COL | STRIDED
    alignment: int                  # largest power of two (<= 16) dividing the base address and
                                    # the leading stride in bytes: 16 means 128-bit vector copies


@dataclass(frozen=True)
class Device:
    kind: str                       # "cpu" | "cuda"
    index: int = 0
    arch: Optional[Tuple[int, int]] = None   # compute capability on cuda, e.g. (9, 0)


@dataclass(frozen=True)
class Epilogue:
    """D = act(alpha * (A @ B) + beta * C + bias), written as out_dtype. beta == 0 never reads C.
    activation (core/epilogues.ACTIVATIONS) and the bias (GemmProblem.bias) are fused only by
    kernels that declare fuses_epilogue; the others never see such a problem (policy.choose)."""
    alpha: float = 1.0
    beta: float = 0.0
    has_c: bool = False
    out_dtype: str = "float32"
    # the array the kernel writes D into: a fresh compact result (ROW, 16-byte aligned), or the
    # caller's out= when the API writes it in place (any majorness but STRIDED)
    out_majorness: str = ROW
    out_alignment: int = 16
    activation: Optional[str] = None

    @property
    def reads_c(self) -> bool:
        return self.has_c and self.beta != 0.0


@dataclass(frozen=True)
class GemmProblem:
    """D[l] = alpha * A[l] @ B[l] + beta * C[l] for every batch index l (batch already broadcast)."""
    m: int
    n: int
    k: int
    batch: Tuple[int, ...]          # broadcast batch shape, () for plain 2-D
    a: Operand
    b: Operand
    c: Optional[Operand]            # None when C is absent or beta == 0
    epilogue: Epilogue
    framework: str                  # owner framework of the result: numpy|torch|jax|cupy
    device: Device
    bias: Optional[Operand] = None  # a vector of N values added to every row (fused epilogues)
    # FP8: float32 dequantization scales (xgemm/fp8.py): of D's rows and of its columns, each a
    # vector of M / N values (D = act(acc * scale_m * scale_n + bias)), or block-wise, A's
    # (M, K/128) and B's (K/128, N/128), applied to each 128-deep k-tile's sum
    scales: Optional[Tuple[Operand, Operand]] = None
    # FP8: the call asks float32 accumulation (scaled_matmul's default: each k-tile's sum added into
    # float32), not the wgmma accumulator's ~14 bits (use_fast_accum=True)
    float32_accumulation: bool = False

    @property
    def fused(self) -> bool:
        """Does the epilogue scale, add a bias or apply an activation (only kernels that fuse serve it)?"""
        return self.bias is not None or self.epilogue.activation is not None or self.scales is not None

    @property
    def batch_count(self) -> int:
        count = 1
        for d in self.batch:
            count *= d
        return count

    @property
    def dtype(self) -> str:
        return self.a.dtype

    @property
    def flops(self) -> int:
        return 2 * self.batch_count * self.m * self.n * self.k

    def summary(self) -> str:
        b = "x".join(map(str, self.batch)) + "x" if self.batch else ""
        c = f", C {self.c.majorness}" if self.c is not None else ""
        return (f"gemm {b}{self.m}x{self.n}x{self.k} {self.a.dtype}->{self.epilogue.out_dtype} "
                f"A {self.a.majorness}/{self.a.alignment}B, B {self.b.majorness}/{self.b.alignment}B{c}, "
                f"alpha={self.epilogue.alpha:g} beta={self.epilogue.beta:g}"
                + (f" + bias {self.bias.dtype}" if self.bias is not None else "")
                + (f", {self.epilogue.activation}" if self.epilogue.activation else "")
                + f" on {self.framework}:{self.device.kind}")


@dataclass(frozen=True)
class SoftmaxProblem:
    """y = softmax(x) along `axis`; seen by kernels as rows x cols with the reduced dim last."""
    rows: int                       # product of all dims but `axis`
    cols: int                       # length of the reduced dim
    shape: Tuple[int, ...]
    axis: int                       # normalized, non-negative
    x: Operand                      # majorness ROW when the reduced dim is contiguous
    out_dtype: str
    framework: str
    device: Device

    def summary(self) -> str:
        return (f"softmax {self.rows}x{self.cols} (shape {self.shape}, axis {self.axis}) "
                f"{self.x.dtype}->{self.out_dtype} reduced dim {'contiguous' if self.x.majorness == ROW else 'strided'} "
                f"on {self.framework}:{self.device.kind}")


@dataclass(frozen=True)
class Policy:
    """How a kernel covers the problem. Fields a kernel does not use stay at their defaults."""
    tile: Tuple[int, ...] = ()      # (tile_m, tile_n, tile_k) for GEMM; (rows_per_cta, block_cols) for softmax
    stages: int = 0
    cluster: Tuple[int, int] = (1, 1)
    warps: int = 0
    ctas_per_row: int = 1           # softmax: CTAs of one cluster sharing a row
    raster: str = ""                # "m" | "n" | "" : tile order for L2 reuse
    split_k: int = 1
    schedule: str = ""              # "stream-k": (tile, k-block) units shared evenly by a one-wave grid
    notes: Tuple[str, ...] = field(default=())

    def summary(self) -> str:
        parts = []
        if self.tile:
            parts.append("tile " + "x".join(map(str, self.tile)))
        if self.stages:
            parts.append(f"{self.stages} stages")
        if self.cluster != (1, 1):
            parts.append(f"cluster {self.cluster[0]}x{self.cluster[1]}")
        if self.warps:
            parts.append(f"{self.warps} warps")
        if self.ctas_per_row > 1:
            parts.append(f"{self.ctas_per_row} CTAs/row")
        if self.raster:
            parts.append(f"raster {self.raster}")
        if self.split_k > 1:
            parts.append(f"split-k {self.split_k}")
        if self.schedule:
            parts.append(self.schedule)
        parts.extend(self.notes)
        return ", ".join(parts) or "default"
