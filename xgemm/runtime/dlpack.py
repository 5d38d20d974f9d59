"""The DLPack C ABI (dlpack.h) in ctypes: the one Python copy (ffi/ has the C++ one).

Read by arrays/view.py (capsules of frameworks xgemm does not know) and written by
runtime/tvm_abi.py (the DLTensor* arguments of CuTe's TVM-FFI functions).
"""
import ctypes

# DLDeviceType
CPU, CUDA, CUDA_HOST, CUDA_MANAGED = 1, 2, 3, 13
# DLDataTypeCode
INT, UINT, FLOAT, BFLOAT = 0, 1, 2, 4
# dtype name -> (code, bits)
CODES = {"float32": (FLOAT, 32), "float16": (FLOAT, 16), "bfloat16": (BFLOAT, 16), "float64": (FLOAT, 64),
         "int32": (INT, 32), "int64": (INT, 64), "int8": (INT, 8), "uint8": (UINT, 8)}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]
