"""CPU torch tensors dressed as one sm_90 CUDA device, every GPU launch replaced by a recorder.

Shared by tests/test_launch_args.py (a repeat call launches exactly what the planned call
launches) and benchmarks/host_cost.py (the Python cost of a repeat call, launch excluded).
What is stubbed -- and nothing else, so the Python that runs is the real hot path:
- the device: arrays.views' torch-device cache maps torch "cpu" to Device("cuda", 0, (9, 0)), and
  fastpath._torch_cuda is re-made from its own source with cuda read as cpu (same cost);
- the stream: torch.cuda.current_stream(...) and torch._C._cuda_getCurrentRawStream(...) give
  STREAM (a CPU torch has neither; their real cost is measured on the GPU host); the calling thread
  counts as bound to the device's context (driver.bind_thread's check runs, its driver calls never);
- CuTe: xgemm.runtime.cute_cache.cute(key, build) and cute_eager(key, build) return a Recorder per key in
  place of the compiled function (so nothing compiles); cute_gemm_sm90._sm_count and driver.sm_count give 132 (H200);
- Gluon: launch._driver() is xgemm.runtime.driver (real CUlaunchConfig struct) with module loading
  stubbed and cuLaunchKernelEx replaced by a recorder of what the GPU would receive: kernel
  name, grid, block, shared bytes, stream and the packed parameter block.
"""
from __future__ import annotations

import ctypes
import inspect
import types
from typing import Any, List

STREAM = 0x7F00_1234_5670     # a recognisable fake cudaStream_t
SM_COUNT = 132


class Recorder:
    """Stands in for one compiled TVM-FFI function: keeps its calls (keep=True) or the last one."""

    def __init__(self, key: Any, sink: "Fake"):
        self.key, self.sink = key, sink

    def __call__(self, *args):
        sink = self.sink
        if sink.keep:
            sink.calls.append(("cute", self.key, args))
        else:
            sink.last = args


class _Stream:
    def __init__(self, handle: int):
        self.cuda_stream = handle


class Fake:
    """Context manager: `with Fake(keep=True) as f: ...; f.calls` lists every launch in order."""

    def __init__(self, keep: bool = True):
        self.keep = keep
        self.calls: List[tuple] = []
        self.last = None
        self._undo: List[tuple] = []

    # -- plumbing -----------------------------------------------------------------------------
    def _set(self, obj: Any, name: str, value: Any) -> None:
        self._undo.append((obj, name, getattr(obj, name, _MISSING)))
        setattr(obj, name, value)

    def __enter__(self) -> "Fake":
        import torch

        from xgemm import arrays
        from xgemm.core import policy
        from xgemm.core.problem import Device
        from xgemm.kernels import (cute_gemm_sm90, cute_sgemm, gluon_matmul_sm90, gluon_softmax, gluon_splitk_sm90,
                                   triton_gemv_sm90, triton_grouped_sm90)
        from xgemm.runtime import cute_cache as xcompile
        from xgemm.runtime import launch
        from xgemm.torch import fastpath

        self._caches = [arrays.views._torch_devices, launch._launchers,
                        cute_sgemm.KERNEL._plans, gluon_softmax.KERNEL._launchers, policy._plans,
                        fastpath._gemm, fastpath._softmax,
                        # each Gluon kernel's own launchers (a second Fake must not find the first's)
                        gluon_matmul_sm90.KERNEL._launchers, gluon_splitk_sm90.KERNEL._launchers,
                        triton_gemv_sm90.KERNEL._launchers, triton_grouped_sm90.KERNEL._launchers]
        self._saved = [dict(c) for c in self._caches]
        for c in self._caches[1:]:
            c.clear()
        cuda0 = Device("cuda", 0, (9, 0))
        arrays.views._torch_devices[("cpu", None)] = arrays.views._torch_devices[torch.device("cpu")] = cuda0
        src = inspect.getsource(fastpath._torch_cuda).replace('"cuda"', '"cpu"').replace(".is_cuda", ".is_cpu")
        ns: dict = {}
        exec(compile(src, "<fake_cuda>", "exec"), fastpath.__dict__, ns)
        self._set(fastpath, "_torch_cuda", ns["_torch_cuda"])

        self._set(torch.cuda, "current_stream", lambda device=None: _Stream(STREAM))
        self._set(torch._C, "_cuda_getCurrentRawStream", lambda index: STREAM)
        fns: dict = {}

        def cute(key, build):         # a dict lookup by key, as compile.cute's memory hit
            fn = fns.get(key)
            if fn is None:
                fn = fns[key] = Recorder(key, self)
            return fn
        self._set(xcompile, "cute", cute)
        self._set(xcompile, "cute_eager", cute)
        self._set(cute_gemm_sm90, "_sm_count", lambda index: SM_COUNT)
        from xgemm.runtime import driver
        self._set(driver, "sm_count", lambda index: SM_COUNT)
        self._set(launch, "_driver", lambda: self._driver)
        self._driver = self._make_driver()
        # this thread counts as bound to device 0's context: driver.bind_thread's check still runs
        self._set(driver._bound, "index", 0)
        return self

    def __exit__(self, *exc) -> None:
        for obj, name, value in reversed(self._undo):
            if value is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, value)
        for c, saved in zip(self._caches, self._saved):
            c.clear()
            c.update(saved)

    # -- the Gluon side: a driver whose module loading and launch are stubs ---------------------
    def _make_driver(self):
        from xgemm.runtime import driver as real
        fake = types.SimpleNamespace(**{k: v for k, v in vars(real).items() if k.isupper()})
        fake.launch_config, fake.check, fake.CudaError = real.launch_config, real.check, real.CudaError
        fake.load_kernel = lambda cubin, name, device, shared, cluster=1: real.LoadedKernel("module", name, 0, 0)
        # stream-ordered scratch (the grouped kernel's group table): addresses nothing reads
        fake.mem_alloc_async = lambda nbytes, stream: 0x7E00_0000_0000
        fake.mem_free_async = lambda ptr, stream: None
        fake.launcher = lambda: self._launch
        return fake

    def _launch(self, cfg_ref, func, params_addr, extra):
        cfg = cfg_ref._obj
        if not self.keep:
            self.last = (cfg, func, params_addr)
            return 0
        from xgemm.runtime import launch
        owner = next(v for v in launch._launchers.values() if v._params_addr == params_addr)
        n = len(owner.meta["params"])
        slots = (ctypes.c_void_p * n).from_address(params_addr)
        block = b"".join(ctypes.string_at(slots[i], 8) for i in range(n))
        self.calls.append(("gluon", func, (int(cfg.gridDimX), int(cfg.gridDimY), int(cfg.gridDimZ)),
                           (int(cfg.blockDimX), int(cfg.blockDimY), int(cfg.blockDimZ)),
                           int(cfg.sharedMemBytes), int(cfg.numAttrs), int(cfg.hStream), extra, block))
        return 0


_MISSING = object()


def normalize(calls: List[tuple], named: dict) -> List[tuple]:
    """Launch records with tensors and raw pointers replaced by (name, byte offset, shape,
    strides, dtype), so two calls on different buffers of the same signature compare equal.
    `named` maps a name to a tensor whose storage it names; other storages (workspaces) are
    named in order of first appearance."""
    import torch
    bases = {t.untyped_storage().data_ptr(): (name, t.untyped_storage().nbytes()) for name, t in named.items()}
    extra: dict = {}

    def where(ptr: int):
        for base, (name, nbytes) in bases.items():
            if base <= ptr < base + max(nbytes, 1):
                return name, ptr - base
        return ("?", ptr)

    def norm(v):
        if isinstance(v, torch.Tensor):
            base = v.untyped_storage().data_ptr()
            if base not in bases:
                bases[base] = (extra.setdefault(base, f"ws{len(extra)}"), v.untyped_storage().nbytes())
            return ("tensor", where(v.data_ptr()), tuple(v.shape), tuple(v.stride()), str(v.dtype))
        if isinstance(v, tuple):
            return tuple(norm(x) for x in v)
        return v

    out = []
    for call in calls:
        if call[0] == "gluon":
            block = call[-1]
            slots = [int.from_bytes(block[i:i + 8], "little") for i in range(0, len(block), 8)]
            # pointer-sized slots that point into a named buffer are named; the rest stay numbers
            out.append(call[:-1] + (tuple(where(s) if where(s)[0] != "?" else s for s in slots),))
        else:
            out.append(norm(call))
    return out


def stream_of(calls: List[tuple]) -> set:
    """Every stream handle the launches were given (CuTe: the last argument; Gluon: hStream)."""
    return {c[2][-1] if c[0] == "cute" else c[6] for c in calls}


__all__ = ["Fake", "Recorder", "normalize", "stream_of", "STREAM", "SM_COUNT"]
