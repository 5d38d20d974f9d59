"""Load prebuilt cubins and launch them with cuLaunchKernelEx (xgemm/runtime/driver.py: ctypes on libcuda),
never importing triton or cuda-python.

get_launcher(cubin, meta, device) -> Launcher, cached per (device, sha256(cubin)). `meta` is the
JSON written by gluon_cache (name, num_warps, num_ctas, shared, scratch sizes, params).

Loading: the device's primary context (the one torch, CuPy and JAX use) is retained and made
current around cuModuleLoadData; dynamic shared memory above 48 KB and a non-portable cluster
size (> 8 CTAs, e.g. 16) are opted into with cuFuncSetAttribute.

Launching: grid x = clusters * num_ctas CTAs of 32 * num_warps threads, the cluster-dimension
attribute (num_ctas, 1, 1) and a spread cluster scheduling preference (as triton's own launcher),
on the caller's stream; with programmatic dependent launch where the entry's compile options ask
for it (launch_pdl: the kernel waits for its predecessor with griddepcontrol.wait, so its launch
overlaps the previous kernel's tail). Triton kernels take two trailing pointers (global and profile scratch):
null when their size is 0, else a stream-ordered allocation of grid * num_ctas * size bytes.

Per-call cost: one struct.pack_into into a prebuilt parameter block, two field writes into a
prebuilt CUlaunchConfig, one ctypes call of cuLaunchKernelEx. Every CUDA return code is checked
and a failure raises CudaError (code, name, the call): out of memory (a scratch allocation, the
launch) is driver.CudaOutOfMemoryError, an errors.OutOfMemoryError too; a cubin the driver is too
old for is an errors.KernelUnavailableError from the load (driver.load_kernel). Nothing is cached
for a Launcher whose load failed, and a failed launch leaves its Launcher usable.
"""
from __future__ import annotations

import ctypes
import hashlib
import struct
import threading
from typing import Dict, Sequence, Tuple

from xgemm.errors import XgemmError
from xgemm.runtime import driver
from xgemm.runtime.driver import CudaError  # noqa: F401  (re-exported: launch failures raise it)

# triton signature type -> struct code; signedness matters (negative strides), which PTX's .u64 hides
_SIG_FMT = {"i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "q", "u1": "B", "u8": "B", "u16": "H",
            "u32": "I", "u64": "Q", "fp32": "f", "fp64": "d"}
# ptx param type -> struct code, when the signature type is absent (each param gets an 8-byte slot)
_PTX_FMT = {"u64": "Q", "b64": "Q", "s64": "q", "u32": "I", "b32": "I", "s32": "i", "f32": "f", "f64": "d",
            "u16": "H", "b16": "H", "s16": "h", "u8": "B", "b8": "B", "s8": "b"}
_SLOT = 8


class LaunchError(XgemmError, ValueError):
    """A launch was asked for with arguments the kernel's metadata does not accept."""


def _driver():
    """The driver API module (tests swap in a recorder here; see tests/fake_cuda.py)."""
    return driver


def param_format(params: Sequence[dict], name: str = "kernel") -> str:
    """struct format of the parameter block: one 8-byte slot per param, little-endian."""
    codes = []
    for p in params:
        sig = p.get("type", "")
        code = "Q" if sig.startswith("*") else _SIG_FMT.get(sig) or _PTX_FMT.get(p["ptx"])
        if code is None:
            raise LaunchError(f"{name}: unsupported kernel parameter type .{p['ptx']} ({p.get('name')})")
        codes.append(code + "x" * (_SLOT - struct.calcsize("<" + code)))
    return "<" + "".join(codes)


_launchers: Dict[Tuple[int, str], "Launcher"] = {}


def get_launcher(cubin: bytes, meta: dict, device: int = 0) -> "Launcher":
    """The Launcher of this cubin on this device (loaded once per process)."""
    key = (device, meta.get("cubin_sha256") or hashlib.sha256(cubin).hexdigest())
    launcher = _launchers.get(key)
    if launcher is None:       # two threads racing here load the module twice; one is kept
        launcher = _launchers.setdefault(key, Launcher(cubin, meta, device))
    return launcher


class Launcher:
    """One loaded kernel function with its launch configuration and parameter block prebuilt."""

    def __init__(self, cubin: bytes, meta: dict, device: int = 0):
        d = _driver()
        self.meta = meta
        self.name: str = meta["name"]
        self.device = device
        self.num_warps = int(meta["num_warps"])
        self.num_ctas = int(meta.get("num_ctas", 1))
        self.shared = int(meta.get("shared", 0))
        params = meta["params"]
        fmt = param_format(params, self.name)
        names = [p["name"] for p in params]
        if names[-2:] != ["global_scratch", "profile_scratch"]:
            raise LaunchError(f"{self.name}: expected trailing scratch params, got {names}")
        self.param_names = names[:-2]
        self.n_args = len(params) - 2
        self._gscratch = int(meta.get("global_scratch_size", 0))
        self._gscratch_align = max(1, int(meta.get("global_scratch_align", 1)))
        self._pscratch = int(meta.get("profile_scratch_size", 0))
        self._pscratch_align = max(1, int(meta.get("profile_scratch_align", 1)))

        # Parameter block: params[i] -> slot i of buf.
        self._pack = struct.Struct(fmt).pack_into
        self._buf = ctypes.create_string_buffer(_SLOT * len(params))
        base = ctypes.addressof(self._buf)
        self._ptrs = (ctypes.c_void_p * len(params))(*[base + _SLOT * i for i in range(len(params))])
        self._params_addr = ctypes.addressof(self._ptrs)

        self._module, self._func, self.num_regs, self.local_bytes = d.load_kernel(
            cubin, self.name, device, self.shared, self.num_ctas)

        self.pdl = bool(meta.get("options", {}).get("launch_pdl", False))
        self._config = d.launch_config(32 * self.num_warps, self.shared, self.num_ctas, pdl=self.pdl)
        self._config_ref = ctypes.byref(self._config)
        self._launch = d.launcher()
        self._check = d.check
        self._lock = threading.Lock()

    def __call__(self, grid: int, stream: int, *args) -> None:
        """Launch `grid` clusters (grid * num_ctas CTAs) on `stream` with the kernel's args (no scratch)."""
        if len(args) != self.n_args:
            raise LaunchError(f"{self.name} takes {self.n_args} args {self.param_names}, got {len(args)}")
        if grid <= 0:
            return
        if self._gscratch or self._pscratch:
            return self._launch_with_scratch(grid, stream, args)
        with self._lock:        # the parameter block and config are shared; the driver copies both
            try:
                self._pack(self._buf, 0, *args, 0, 0)
            except struct.error as exc:
                raise LaunchError(f"{self.name}: bad argument for {self.param_names}: {exc}") from None
            cfg = self._config
            cfg.gridDimX = grid * self.num_ctas
            cfg.hStream = stream
            err = self._launch(self._config_ref, self._func, self._params_addr, None)
        if err:
            self._check(err, "cuLaunchKernelEx",
                        f"{self.name} grid {grid}x{self.num_ctas} block {32 * self.num_warps} shared {self.shared}")

    def native_recipe(self, grid: int, roles: Sequence[int], args: Sequence) -> "tuple | None":
        """self(grid, stream, *pointers, *args), the pointers those of the operands `roles` names,
        described for ffi/torch_fastpath.cc (xgemm/torch/native.py's "cu" recipe); None where a
        launch allocates scratch or launches nothing."""
        if self._gscratch or self._pscratch or grid <= 0 or len(roles) + len(args) != self.n_args:
            return None
        block = ctypes.create_string_buffer(len(self._buf))
        self._pack(block, 0, *([0] * len(roles)), *args, 0, 0)
        return ("cu", self._func, ctypes.addressof(self._config), grid * self.num_ctas, block.raw,
                tuple((_SLOT * i, role) for i, role in enumerate(roles)), self)

    def _launch_with_scratch(self, grid: int, stream: int, args: Sequence) -> None:
        d = _driver()
        ctas = grid * self.num_ctas
        ptrs = []
        for size, align in ((self._gscratch, self._gscratch_align), (self._pscratch, self._pscratch_align)):
            ptrs.append(d.mem_alloc_async(ctas * size + align, stream) if size else 0)
        aligned = [(p + a - 1) // a * a if p else 0
                   for p, a in zip(ptrs, (self._gscratch_align, self._pscratch_align))]
        try:
            with self._lock:
                self._pack(self._buf, 0, *args, *aligned)
                cfg = self._config
                cfg.gridDimX = ctas
                cfg.hStream = stream
                self._check(self._launch(self._config_ref, self._func, self._params_addr, None),
                            "cuLaunchKernelEx", self.name)
        finally:
            for p in ptrs:
                if p:       # stream-ordered: freed after the kernel completes
                    d.mem_free_async(p, stream)
