"""Call an exported CuTe-DSL function (the TVM-FFI C ABI) through ctypes, without `import tvm_ffi`.

Why: a CuTe kernel on disk is a shared library whose entry `__tvm_ffi_<name>` has the TVM-FFI
"safe call" signature. Loading it through the tvm_ffi package costs its import, 70-145 ms (it
imports numpy, ml_dtypes and its dataclass machinery), most of a fresh process's first GEMM
(issue 3 wants <= 50 ms). The ABI itself is small and stable (tvm/ffi/c_api.h): arguments are
16-byte TVMFFIAny cells; tensors travel as DLTensor* (type index 7), floats as float64 (3),
integers as int64 (1), None as 0. ffi/xgemm_ffi.cc calls the same functions the same way from
XLA, so this is one ABI used twice. libtvm_ffi.so and the CuTe runtime are the exported library's
own dependencies (RUNPATH set when it was linked); when they do not resolve (a cache built on
another machine), `load` returns None and the caller uses the tvm_ffi package instead.

CFunction(*args) marshals each call (ArrayViews or framework arrays, float, int, None);
CFunction.prepare(*template) marshals once and returns a Prepared whose .call(ptrs, stream)
only rewrites the data pointers and the stream: the fast path of repeat calls.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from pathlib import Path
from typing import Any, List, Optional, Sequence

from xgemm import arrays
from xgemm.runtime import dlpack
from xgemm.runtime.dlpack import CPU as _KDLCPU
from xgemm.runtime.dlpack import CUDA as _KDLCUDA
from xgemm.runtime.dlpack import DLTensor

_NONE, _INT, _BOOL, _FLOAT, _OPAQUE, _DLTENSOR = 0, 1, 2, 3, 4, 7
_STATIC_OBJECT_BEGIN = 64
MAX_DIMS = 8


class _Value(ctypes.Union):
    _fields_ = [("v_int64", ctypes.c_int64), ("v_float64", ctypes.c_double), ("v_ptr", ctypes.c_uint64)]


class TVMFFIAny(ctypes.Structure):
    _fields_ = [("type_index", ctypes.c_int32), ("zero_padding", ctypes.c_uint32), ("v", _Value)]


class _ByteArray(ctypes.Structure):
    _fields_ = [("data", ctypes.c_char_p), ("size", ctypes.c_size_t)]


class _ErrorCellHead(ctypes.Structure):       # after the 24-byte TVMFFIObjectHeader
    _fields_ = [("kind", _ByteArray), ("message", _ByteArray)]


_SAFE_CALL = [ctypes.c_void_p, ctypes.POINTER(TVMFFIAny), ctypes.c_int32, ctypes.POINTER(TVMFFIAny)]
_lock = threading.Lock()
_runtime: Optional[ctypes.CDLL] = None


def _preload_runtime() -> Optional[ctypes.CDLL]:
    """libtvm_ffi.so from the installed tvm_ffi package (located without importing it), loaded
    RTLD_GLOBAL so an exported library whose RUNPATH does not resolve can still bind to it."""
    global _runtime
    if _runtime is None:
        spec = importlib.util.find_spec("tvm_ffi")
        for root in (spec.submodule_search_locations or []) if spec else []:
            path = Path(root) / "lib" / "libtvm_ffi.so"
            if path.exists():
                lib = ctypes.CDLL(str(path), mode=os.RTLD_GLOBAL)
                lib.TVMFFIObjectDecRef.argtypes, lib.TVMFFIObjectDecRef.restype = [ctypes.c_void_p], ctypes.c_int
                lib.TVMFFIErrorMoveFromRaised.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
                lib.TVMFFIErrorMoveFromRaised.restype = None
                _runtime = lib
                break
    return _runtime


def load(so_path: Path, name: str) -> Optional["CFunction"]:
    """The exported function `name` of a CuTe .so, or None when the library does not load here."""
    try:
        with _lock:
            runtime = _preload_runtime()
            if runtime is None:
                return None
            lib = ctypes.CDLL(str(so_path), mode=os.RTLD_LOCAL)
        sym = getattr(lib, f"__tvm_ffi_{name}")
    except (OSError, AttributeError):
        return None
    sym.argtypes, sym.restype = _SAFE_CALL, ctypes.c_int
    return CFunction(sym, lib, runtime)


# DLPack's type codes plus its FP8 ones (dlpack.h 1.1: kDLFloat8_e4m3fn 10, kDLFloat8_e5m2 12, as
# tvm_ffi names them), which CuTe's FP8 classes take; arrays never cross DLPack as FP8 (xgemm/fp8.py)
_CODES = {**dlpack.CODES, "float8_e4m3fn": (10, 8), "float8_e5m2": (12, 8)}


def _tensor_fields(x: Any):
    """(ptr, shape, strides, dtype name, device type, device index) of an ArrayView or array."""
    if hasattr(x, "ptr") and hasattr(x, "itemsize"):          # arrays.ArrayView
        v = x
    else:
        v = arrays.view_torch(x) if type(x).__module__ == "torch" else arrays.view(x, "operand", "xgemm")
    dev = v.device
    return (v.ptr, v.shape, v.strides, v.dtype, _KDLCUDA if dev.kind == "cuda" else _KDLCPU, dev.index or 0)


class _Marshal:
    """One call's argument cells, with DLTensor storage for every tensor argument."""

    def __init__(self, args: Sequence[Any]):
        n = len(args)
        self.anys = (TVMFFIAny * max(1, n))()
        self.tensors: List[DLTensor] = []      # these and the dims arrays stay alive with the cells
        self.dims: List[Any] = []              # that point into them
        for i, a in enumerate(args):
            cell = self.anys[i]
            if a is None:
                cell.type_index = _NONE
            elif isinstance(a, bool):
                cell.type_index, cell.v.v_int64 = _BOOL, int(a)
            elif isinstance(a, int):
                cell.type_index, cell.v.v_int64 = _INT, a
            elif isinstance(a, float):
                cell.type_index, cell.v.v_float64 = _FLOAT, a
            else:
                ptr, shape, strides, dtype, dev_type, dev_index = _tensor_fields(a)
                nd = len(shape)
                dims = (ctypes.c_int64 * max(1, 2 * nd))(*shape, *strides)
                t = DLTensor()
                t.data, t.device.device_type, t.device.device_id, t.ndim = ptr, dev_type, dev_index, nd
                code, bits = _CODES[dtype]
                t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, 1
                base = ctypes.addressof(dims)
                t.shape = ctypes.cast(base, ctypes.POINTER(ctypes.c_int64))
                t.strides = ctypes.cast(base + 8 * nd, ctypes.POINTER(ctypes.c_int64))
                self.tensors.append(t)
                self.dims.append(dims)
                cell.type_index, cell.v.v_ptr = _DLTENSOR, ctypes.addressof(t)
        self.n = n


class CFunction:
    def __init__(self, sym, lib, runtime):
        self._sym, self._lib, self._runtime = sym, lib, runtime   # the libraries stay loaded

    def __call__(self, *args: Any) -> None:
        m = _Marshal(args)
        self._invoke(m.anys, m.n)

    def prepare(self, *template: Any) -> "Prepared":
        """Marshal `template` once; Prepared.call(ptrs, stream) reuses it with new data pointers
        (one per tensor argument, in order) and a new stream (the last argument, an int)."""
        return Prepared(self, _Marshal(template))

    def _invoke(self, anys, n: int) -> None:
        result = TVMFFIAny()
        self._finish(self._sym(None, anys, n, ctypes.byref(result)), result)

    def _finish(self, rc: int, result: TVMFFIAny) -> None:
        if rc != 0:
            raise self._error(rc)
        if result.type_index >= _STATIC_OBJECT_BEGIN and result.v.v_ptr:   # drop a returned object
            self._runtime.TVMFFIObjectDecRef(result.v.v_ptr)
        result.type_index = _NONE

    def _error(self, rc: int) -> Exception:
        err = ctypes.c_void_p()
        try:
            self._runtime.TVMFFIErrorMoveFromRaised(ctypes.byref(err))
        except AttributeError:
            err = ctypes.c_void_p()
        if not err.value:
            return RuntimeError(f"xgemm: CuTe function call failed ({rc})")
        head = _ErrorCellHead.from_address(err.value + 24)
        kind = ctypes.string_at(head.kind.data, head.kind.size).decode(errors="replace")
        msg = ctypes.string_at(head.message.data, head.message.size).decode(errors="replace")
        self._runtime.TVMFFIObjectDecRef(err.value)
        return error_of(kind, msg)


def error_of(kind: str, message: str) -> Exception:
    """The Python exception for a TVM-FFI error of `kind` (also raised by ffi/torch_fastpath.cc)."""
    cls = {"ValueError": ValueError, "TypeError": TypeError, "IndexError": IndexError}.get(kind, RuntimeError)
    return cls(f"{kind}: {message}")


class Prepared:
    """A marshalled call: call(ptrs, stream) rewrites the tensors' data pointers and the stream."""

    def __init__(self, fn: CFunction, m: _Marshal):
        self._fn, self._m = fn, m            # m owns the cells, tensors and dims the call points at
        self._tensors = m.tensors
        self._stream = m.anys[m.n - 1].v
        self._result = TVMFFIAny()
        self._sym, self._finish = fn._sym, fn._finish
        self._args = (None, m.anys, m.n, ctypes.byref(self._result))
        self._lock = threading.Lock()

    def go(self, roles: Sequence[int]):
        """go(a, b, c, d, stream) on torch tensors for this prepared call, whose j-th tensor
        argument is the operand roles[j] (torch_native's A, B, C, OUT): the repeat-call convention
        of kernels' bind() (xgemm/torch/fastpath.py). go.native is the same call described for
        ffi/torch_fastpath.cc (xgemm/torch/native.py's "tvm" recipe)."""
        roles = tuple(roles)
        assert len(roles) == len(self._tensors), (roles, len(self._tensors))
        call = self.call

        def go(a, b, c, d, stream):
            operands = (a, b, c, d)
            call([operands[r].data_ptr() for r in roles], stream)
        go.native = ("tvm", ctypes.cast(self._sym, ctypes.c_void_p).value, ctypes.addressof(self._m.anys),
                     self._m.n, roles, self)
        return go

    def call(self, ptrs: Sequence[int], stream: int) -> None:
        with self._lock:                     # the cells are shared: one call at a time
            for t, p in zip(self._tensors, ptrs):
                t.data = p
            self._stream.v_int64 = stream
            self._finish(self._sym(*self._args), self._result)
