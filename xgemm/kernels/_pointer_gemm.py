"""What the GEMM kernels launched as plain-pointer cubins share (gluon_splitk_sm90, triton_gemv_sm90):
run() and bind() around the kernel's own _resolve(), the per-config launcher cache, B's leading
stride, and the SM count (the H200's where no device answers, as when lowering for cuda on a CPU).

A kernel class derives from PointerGemm and defines
    _resolve(problem, policy, a, b, out) -> (launcher, grid, the scalar args after the A, B, D pointers)
and calls self._launcher(cfg, device) there for the cubin of cfg.key.
"""
from __future__ import annotations

from typing import Dict

from xgemm.runtime import driver, gluon_cache, launch
from xgemm.runtime.roles import OUT, A, B

H200_SMS = 132


def sm_count(device: int) -> int:
    try:
        return driver.sm_count(device)
    except Exception:       # noqa: BLE001 -- lowering for cuda on a machine without one: the H200's count
        return H200_SMS


def b_leading_stride(b_strides, b_kmajor: bool) -> int:
    """B's leading stride: between its columns when K-major, between its rows when N-major."""
    return b_strides[-1] if b_kmajor else b_strides[-2]


class PointerGemm:
    def __init__(self):
        self._launchers: Dict[tuple, object] = {}

    def _launcher(self, cfg, device: int):
        """The loaded cubin of cfg.key on this device (looked up once)."""
        key = (cfg, device)
        launcher = self._launchers.get(key)
        if launcher is None:
            entry = gluon_cache.lookup(cfg.key)
            launcher = self._launchers[key] = launch.get_launcher(entry.cubin, entry.meta, device)
        return launcher

    def run(self, problem, policy, operands, out, stream) -> None:
        launcher, grid, args = self._resolve(problem, policy, operands[0], operands[1], out)
        launcher(grid, stream, operands[0].ptr, operands[1].ptr, out.ptr, *args)

    def bind(self, problem, policy, operands, out):
        """go(a, b, c, d, stream) on torch tensors laid out as the views: the launch run() makes."""
        launcher, grid, args = self._resolve(problem, policy, operands[0], operands[1], out)

        def go(a, b, c, d, stream: int) -> None:
            launcher(grid, stream, a.data_ptr(), b.data_ptr(), d.data_ptr(), *args)
        go.native = launcher.native_recipe(grid, (A, B, OUT), args)
        return go
