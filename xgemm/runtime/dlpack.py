"""The DLPack C ABI (dlpack.h) in ctypes: the one Python copy (ffi/ has the C++ one).

Read by arrays/views.py (capsules of frameworks xgemm does not know) and written by
runtime/tvm_abi.py (the DLTensor* arguments of CuTe's TVM-FFI functions).
"""
import ctypes
from typing import NamedTuple, Optional, Tuple

# DLDeviceType
CPU, CUDA, CUDA_HOST, CUDA_MANAGED = 1, 2, 3, 13
# DLDataTypeCode
INT, UINT, FLOAT, BFLOAT = 0, 1, 2, 4
# dtype name -> (code, bits)
CODES = {"float32": (FLOAT, 32), "float16": (FLOAT, 16), "bfloat16": (BFLOAT, 16), "float64": (FLOAT, 64),
         "int32": (INT, 32), "int64": (INT, 64), "int8": (INT, 8), "uint8": (UINT, 8)}

# The newest ABI read here; a consumer passes it to __dlpack__(max_version=...). A versioned capsule
# of another major version has another struct layout after `version` and must not be read.
VERSION = (1, 0)
# DLManagedTensorVersioned.flags
FLAG_READ_ONLY = 1 << 0          # the consumer must not write through the tensor
FLAG_IS_COPIED = 1 << 1          # the producer exported a copy: writes would not reach the array
FLAG_IS_SUBBYTE_TYPE_PADDED = 1 << 2   # (1.1) sub-byte dtypes padded to a byte

# PyCapsule names: a consumer that takes ownership renames the capsule "used_" + name, so the
# capsule's destructor knows not to call the producer's deleter again.
LEGACY_NAME, VERSIONED_NAME = b"dltensor", b"dltensor_versioned"


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensor(ctypes.Structure):
    """The legacy (pre-1.0, unversioned) capsule's payload, named "dltensor"."""
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLManagedTensorVersioned(ctypes.Structure):
    """The DLPack >= 1.0 capsule's payload, named "dltensor_versioned"; `version` comes first in every
    major version, so it can be checked before anything else is read."""
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


# Private prototypes (not ctypes.pythonapi's shared ones, whose argtypes anyone may reset). PYFUNCTYPE
# holds the GIL and raises the Python error these set on a wrong name or a non-capsule.
_get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


class Unpacked(NamedTuple):
    tensor: DLTensor                        # lives in the capsule's memory: read it while the capsule lives
    flags: int                              # 0 for a legacy capsule (which has no flags)
    version: Optional[Tuple[int, int]]      # None for a legacy capsule


def unpack(capsule) -> Unpacked:
    """The DLTensor of a legacy or versioned capsule, without consuming it: the name is left as is,
    so when the capsule is collected its destructor calls the producer's deleter (NumPy's, torch's
    and CuPy's destructors do so for any capsule not renamed "used_..."). BufferError for a consumed
    capsule, another object, or a versioned capsule of a major version other than VERSION's."""
    try:
        name = _get_name(capsule)
    except ValueError as exc:               # not a capsule
        raise BufferError(f"__dlpack__ returned a {type(capsule).__name__}, not a DLPack capsule") from exc
    if name == VERSIONED_NAME:
        managed = DLManagedTensorVersioned.from_address(_get_pointer(capsule, name))
        major, minor = managed.version.major, managed.version.minor
        if major != VERSION[0]:
            raise BufferError(f"the capsule is DLPack {major}.{minor}; xgemm reads DLPack {VERSION[0]}.x")
        return Unpacked(managed.dl_tensor, int(managed.flags), (major, minor))
    if name == LEGACY_NAME:
        return Unpacked(DLManagedTensor.from_address(_get_pointer(capsule, name)).dl_tensor, 0, None)
    raise BufferError(f"the capsule is named {name!r}, not 'dltensor_versioned' or 'dltensor' "
                      f"(a capsule already consumed is renamed 'used_...')")
