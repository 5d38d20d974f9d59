"""THE kernel list: for each op, the kernels in order of preference; the first whose supports()
accepts a problem wins, and the embedded default (reference) is last and accepts every problem.

Each name is a module of xgemm/kernels/ whose KERNELS tuple holds its kernel objects; a kernel
declares there, in one place, what the rest of the package asks of it (kernels/_common.py):
the ops it serves, supports(), policy(), run(), its JAX lowering and its prebuild classes.
Adding a kernel: its own file, and one line below. Nothing is imported until a problem asks.
"""
from __future__ import annotations

import importlib
from typing import Any, Dict, List, Tuple

TABLE: Dict[str, Tuple[str, ...]] = {
    "gemm": (
        "triton_gemv_sm90",     # decode, M <= 16: narrow strips of B over all of K (off: slower than cuBLAS so far)
        "gluon_splitk_sm90",    # skinny M (<= 64), K >= 1024 (or a wide N): K split over a cluster; declines the rest
        "cute_gemm_sm90",       # fp16/bf16 TMA + wgmma, persistent: every big problem
        "gluon_matmul_sm90",    # slower than cute_gemm_sm90 where both accept; reached when it declines
        "cute_mma_sm80",        # fp16/bf16 mma.sync
        "cute_sgemm",           # fp32 SIMT
        "reference",
    ),
    "softmax": (
        "gluon_softmax",        # rows split over a cluster of up to 16 CTAs
        "reference",
    ),
    "grouped": (
        "cute_gemm_sm90",       # its grouped class (rows mode): warp-specialized, persistent, TMA in and out
        "triton_grouped_sm90",  # the variable-K product (ragged_k), and what the CuTe class declines
        "reference",
    ),
    "gate": (
        "triton_gate_sm90",     # the gated activation and its backward, one pass each (composed path)
        "reference",
    ),
    "quantize_fp8": (
        "triton_quantize_sm90",  # row and 1x128 recipes in one pass
        "reference",
    ),
}

PACKAGE = "xgemm.kernels"


def module_name(name: str) -> str:
    return f"{PACKAGE}.{name}"


def names() -> List[str]:
    """Every registered kernel module, each once, in table order."""
    return list(dict.fromkeys(n for table in TABLE.values() for n in table))


def kernel(name: str, op: str) -> Any:
    """The kernel object of module `name` serving `op` (imports the module)."""
    module = importlib.import_module(module_name(name))
    for k in module.KERNELS:
        if op in k.ops:
            return k
    raise LookupError(f"{module_name(name)} declares no kernel serving {op!r} (its KERNELS' ops)")


def of_backend(backend: str) -> Dict[str, Any]:
    """module name -> kernel object of every registered kernel of `backend` ("cute" | "gluon" |
    "host") that imports here: what build-cache compiles and the cache packer keeps. A module of
    several kernels is named by its first, whose prebuild() covers the module's classes."""
    found = {}
    for name in names():
        try:
            module = importlib.import_module(module_name(name))
        except ImportError:
            continue
        for k in module.KERNELS:
            if k.backend == backend:
                found.setdefault(name, k)
    return found
