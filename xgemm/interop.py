"""DLPack views of caller arrays, framework detection without imports, wrap-back, streams.

Data flows one way: caller array -> view() -> ArrayView -> (problem.py) -> kernel -> result in
the owner framework. Frameworks are recognised through sys.modules (array-api-compat's is_*_array
helpers), never imported here: an array of a framework proves that framework is already loaded.
"""
from __future__ import annotations

import ctypes
import math
import sys
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from . import errors
from .problem import COL, ROW, STRIDED, Device, Operand

FRAMEWORKS = ("numpy", "torch", "jax", "cupy")
SUPPORTED_DTYPES = ("float32", "float16", "bfloat16", "float64")

# DLPack device types (dlpack.h)
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
# DLPack dtype codes
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_COMPLEX, _DL_BOOL = 0, 1, 2, 4, 5, 6


@dataclass(frozen=True)
class ArrayView:
    """What a kernel needs to know of one array. `obj` is the framework array itself."""
    obj: Any
    framework: str                   # numpy | torch | jax | cupy | other
    device: Device
    ptr: int                         # address of element (0, ..., 0)
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]         # in elements (may be 0 or negative)
    dtype: str
    itemsize: int
    readonly: bool

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def span(self) -> Tuple[int, int]:
        """[lo, hi) byte range the view can touch; (ptr, ptr) when empty."""
        if self.size == 0:
            return self.ptr, self.ptr
        lo = hi = self.ptr
        for n, s in zip(self.shape, self.strides):
            step = (n - 1) * s * self.itemsize
            lo, hi = (lo + step, hi) if step < 0 else (lo, hi + step)
        return lo, hi + self.itemsize

    def overlaps(self, other: "ArrayView") -> bool:
        if self.device != other.device or self.size == 0 or other.size == 0:
            return False
        a_lo, a_hi = self.span()
        b_lo, b_hi = other.span()
        return a_lo < b_hi and b_lo < a_hi


# ---------------------------------------------------------------------------------------------
# Framework detection (no imports: array-api-compat's helpers look in sys.modules)

def framework_of(x: Any) -> Optional[str]:
    """numpy | torch | jax | cupy | other (any __dlpack__ object) | None (not an array)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):   # first, and plain: torch.compile traces this
        return "torch"
    from array_api_compat import is_cupy_array, is_jax_array, is_numpy_array, is_torch_array
    if is_numpy_array(x):
        return "numpy" if hasattr(x, "__dlpack__") else None   # numpy scalars (np.generic) are not arrays here
    if is_torch_array(x):
        return "torch"
    if is_jax_array(x):       # jax.Array, tracers included
        return "jax"
    if is_cupy_array(x):
        return "cupy"
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return "other"
    return None


def is_jax_tracer(x: Any) -> bool:
    jax_core = sys.modules.get("jax.core")
    return jax_core is not None and isinstance(x, jax_core.Tracer)


def require_array(fn: str, name: str, x: Any) -> str:
    fw = framework_of(x)
    if fw is None:
        hint = "numpy.asarray(...)" if isinstance(x, (list, tuple, int, float, complex)) else "an array with __dlpack__"
        raise errors.NotAnArrayError(
            f"{fn}: {name} is a {type(x).__name__}, not an array; pass {hint} "
            f"(NumPy, torch, JAX or CuPy, or any object with __dlpack__)")
    return fw


def dtype_name(x: Any) -> str:
    """'float32', 'bfloat16', ... for numpy/jax/cupy dtypes (incl. ml_dtypes) and torch dtypes."""
    dt = x.dtype
    name = getattr(dt, "name", None)
    if isinstance(name, str):
        return name
    return str(dt).rsplit(".", 1)[-1]          # torch.float32 -> float32


# ---------------------------------------------------------------------------------------------
# Views

def _device_of(fw: str, x: Any, name: str = "x", fn: str = "xgemm") -> Device:
    try:
        dev_type, dev_id = x.__dlpack_device__()
    except (ValueError, RuntimeError, TypeError, BufferError) as exc:   # torch 'meta', lazy tensors, ...
        raise errors.DeviceError(f"{fn}: {name} lives on a device DLPack cannot describe ({exc}); "
                                 f"move it to the CPU or a CUDA device first") from exc
    dev_type = int(dev_type)
    if dev_type == _DL_CPU or dev_type == _DL_CUDA_HOST:
        return Device("cpu", 0)
    if dev_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        return Device("cuda", int(dev_id), _cuda_arch(int(dev_id)))
    return Device(f"dlpack{dev_type}", int(dev_id))


_arch_cache: dict = {}


def _cuda_arch(index: int) -> Optional[Tuple[int, int]]:
    """Compute capability through the driver (xgemm/driver.py: no framework, no cuda-python);
    None if unavailable."""
    if index not in _arch_cache:
        try:
            from . import driver
            _arch_cache[index] = driver.capability(index)
        except Exception:        # no driver: kernels that need an arch decline
            _arch_cache[index] = None
    return _arch_cache[index]


_torch_devices: dict = {}
_torch_dtypes: dict = {}


_new = object.__new__


def _view_torch(x: Any) -> ArrayView:
    """The hot path (eager torch calls): no DLPack round trip, cached device and dtype objects.

    The ArrayView is filled through its __dict__: the frozen dataclass's __init__ sets each of
    its nine fields with object.__setattr__ (~1.9 us; this ~0.5 us). Same type, same fields."""
    dev = x.device
    device = _torch_devices.get(dev)
    if device is None:
        device = (Device("cuda", dev.index or 0, _cuda_arch(dev.index or 0)) if dev.type == "cuda"
                  else _device_of("torch", x))
        _torch_devices[dev] = device
    dtype = _torch_dtypes.get(x.dtype)
    if dtype is None:
        dtype = _torch_dtypes[x.dtype] = str(x.dtype).rsplit(".", 1)[-1]
    v = _new(ArrayView)
    d = v.__dict__
    d["obj"] = x
    d["framework"] = "torch"
    d["device"] = device
    d["ptr"] = x.data_ptr()
    d["shape"] = tuple(x.shape)
    d["strides"] = tuple(x.stride())
    d["dtype"] = dtype
    d["itemsize"] = x.element_size()
    d["readonly"] = False
    return v


def view(x: Any, name: str, fn: str) -> ArrayView:
    """Describe x without copying. Raises NotAnArrayError for non-arrays."""
    fw = require_array(fn, name, x)
    if fw == "torch" and x.device.type in ("cpu", "cuda"):
        return _view_torch(x)
    device = _device_of(fw, x, name, fn)
    dtype = dtype_name(x)
    if fw == "numpy":
        itemsize = x.itemsize
        ptr = x.__array_interface__["data"][0]
        strides = tuple(s // itemsize if s % itemsize == 0 else None for s in x.strides)
        readonly = not x.flags.writeable
    elif fw == "torch":
        itemsize = x.element_size()
        ptr, strides, readonly = x.data_ptr(), tuple(x.stride()), False
    elif fw == "cupy":
        itemsize = x.itemsize
        ptr, readonly = x.data.ptr, False
        strides = tuple(s // itemsize if s % itemsize == 0 else None for s in x.strides)
    elif fw == "jax":
        itemsize = x.dtype.itemsize
        ptr = x.unsafe_buffer_pointer() if not is_jax_tracer(x) else 0
        strides = _row_major_strides(tuple(x.shape))
        readonly = True                      # JAX arrays are immutable
    else:
        return _view_from_capsule(x, name, fn, device)
    if None in strides:   # byte strides that are no multiple of the itemsize (numpy views of structured data)
        raise errors.ShapeError(
            f"{fn}: {name} has byte strides {x.strides} that are not multiples of its itemsize {itemsize}; "
            f"pass numpy.ascontiguousarray({name})")
    return ArrayView(x, fw, device, int(ptr), tuple(int(d) for d in x.shape), strides, dtype, int(itemsize), readonly)


def _row_major_strides(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_DTYPES = {(_DL_FLOAT, 16): "float16", (_DL_FLOAT, 32): "float32", (_DL_FLOAT, 64): "float64",
              (_DL_BFLOAT, 16): "bfloat16"}


def _view_from_capsule(x: Any, name: str, fn: str, device: Device) -> ArrayView:
    """Read a legacy (unversioned) DLPack capsule of an unknown framework; the capsule is not consumed."""
    capsule = x.__dlpack__()
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    # DLManagedTensor starts with its DLTensor
    tensor = _DLTensor.from_address(get_pointer(capsule, b"dltensor"))
    ndim = tensor.ndim
    shape = tuple(tensor.shape[i] for i in range(ndim))
    strides = tuple(tensor.strides[i] for i in range(ndim)) if tensor.strides else _row_major_strides(shape)
    key = (tensor.dtype.code, tensor.dtype.bits)
    dtype = _DL_DTYPES.get(key, f"dlpack{key}")
    return ArrayView(x, "other", device, int(tensor.data or 0) + int(tensor.byte_offset), shape, strides,
                     dtype, max(tensor.dtype.bits // 8, 1), False)


# ---------------------------------------------------------------------------------------------
# Majorness and alignment of one matrix (the last two dims)

def majorness(shape: Tuple[int, ...], strides: Tuple[int, ...]) -> str:
    rows, cols = shape[-2], shape[-1]
    rs, cs = strides[-2], strides[-1]
    row = (cols <= 1 or cs == 1) and (rows <= 1 or rs >= max(cols, 1))
    col = (rows <= 1 or rs == 1) and (cols <= 1 or cs >= max(rows, 1))
    return ROW if row else COL if col else STRIDED


def leading_stride(shape: Tuple[int, ...], strides: Tuple[int, ...], major: str) -> int:
    """Elements between consecutive rows (ROW) or columns (COL)."""
    rows, cols = shape[-2], shape[-1]
    if major == ROW:
        return strides[-2] if rows > 1 else max(cols, 1)
    return strides[-1] if cols > 1 else max(rows, 1)


def alignment(v: ArrayView, major: str) -> int:
    """Largest power of two <= 16 dividing the base address, the leading stride and batch strides, in bytes."""
    values = [v.ptr]
    if major != STRIDED and v.ndim >= 2:
        values.append(leading_stride(v.shape, v.strides, major) * v.itemsize)
        values.extend(s * v.itemsize for s, d in zip(v.strides[:-2], v.shape[:-2]) if d > 1)
    align = 16
    while align > v.itemsize and any(val % align for val in values):
        align //= 2
    return align


def operand(v: ArrayView) -> Operand:
    """The problem's Operand of a view: its majorness (ROW below 2 dims) and alignment class."""
    major = majorness(v.shape, v.strides) if v.ndim >= 2 else ROW
    return Operand(shape=v.shape, strides=v.strides, dtype=v.dtype, majorness=major, alignment=alignment(v, major))


# ---------------------------------------------------------------------------------------------
# Framework operations on arrays the caller gave us (the framework is already imported)

def compact(v: ArrayView, name: str, copies: list) -> ArrayView:
    """One compacting copy into row-major order, in the owner framework; recorded for explain()."""
    x = v.obj
    if v.framework == "torch":
        y = x.contiguous()
    elif v.framework == "cupy":
        y = sys.modules["cupy"].ascontiguousarray(x)
    elif v.framework == "numpy":
        import numpy
        y = numpy.ascontiguousarray(x)
    else:
        raise errors.ShapeError(f"{name}: cannot compact a {v.framework} array with strides {v.strides}; "
                                f"pass a contiguous array")
    copies.append(f"{name}: strides {v.strides} (elements) of shape {v.shape} -> row-major copy "
                  f"({v.size * v.itemsize} bytes, {v.framework})")
    return view(y, name, "compact")


def padded_dims(k: int, n: int, itemsize: int) -> Tuple[int, int]:
    """(K, N) of the aligned problem a GEMM with rows that are not 16-byte multiples is staged
    into (xgemm.api eagerly, xgemm.jax_cuda inside jit): a K or N that is not a multiple of 16
    bytes is padded to whole 32-byte sectors; one that is stays."""
    per, sector = 16 // itemsize, 32 // itemsize
    return tuple(d if d % per == 0 else -(-d // sector) * sector for d in (k, n))


def padded_copy(v: ArrayView, shape: Tuple[int, ...], zero_rows: bool, zero_cols: bool, name: str,
                copies: list) -> ArrayView:
    """v copied into the top-left corner of a fresh row-major array of `shape` (v's leading dims,
    its last two at least v's) in the owner framework, on its current stream; the extra rows /
    columns are zero-filled where asked (else left uninitialized). Recorded for explain()."""
    x = v.obj
    rows, cols = v.shape[-2], v.shape[-1]
    buf = empty(v.framework, tuple(shape), v.dtype, v.device, x)
    buf[..., :rows, :cols] = x
    if zero_rows and shape[-2] > rows:
        buf[..., rows:, :] = 0
    if zero_cols and shape[-1] > cols:
        buf[..., :, cols:] = 0
    copies.append(f"{name}: shape {v.shape} strides {v.strides} -> 16-byte-aligned row-major {tuple(shape)} "
                  f"({'zero-padded' if zero_rows or zero_cols else 'padded'}; "
                  f"{math.prod(shape) * v.itemsize} bytes, {v.framework})")
    return view(buf, name, "pad")


def import_into(owner: str, x: Any, name: str, fn: str) -> Any:
    """Bring an operand of another framework into the owner's, zero-copy through DLPack where possible.

    Declared rules: NumPy arrays join any framework's CPU arrays; torch, CuPy and JAX exchange
    arrays on the same device through DLPack (the consumer passes its stream, per the protocol).
    JAX as owner takes a copy of NumPy input (jax arrays own their buffers).
    """
    fw = framework_of(x)
    if fw == owner:
        return x
    if (owner, fw) not in MIXING_RULES:
        raise errors.FrameworkError(
            f"{fn}: {name} is a {fw} array but the result framework (from the first operand) is {owner}; "
            f"no rule mixes {fw} into {owner}: convert {name} first, e.g. {owner}'s from_dlpack({name})")
    try:
        if owner == "numpy":
            import numpy
            return numpy.from_dlpack(x)
        if owner == "torch":
            return sys.modules["torch"].from_dlpack(x)
        if owner == "cupy":
            return sys.modules["cupy"].from_dlpack(x)
        if owner == "jax":
            jnp = sys.modules["jax.numpy"]
            return jnp.asarray(x) if fw == "numpy" else sys.modules["jax"].dlpack.from_dlpack(x)
    except (BufferError, RuntimeError, TypeError, ValueError) as exc:
        raise errors.FrameworkError(f"{fn}: {name} ({fw}) could not be shared with {owner} through DLPack: "
                                    f"{exc}; convert it yourself") from exc
    raise AssertionError(owner)


MIXING_RULES = frozenset({
    ("torch", "numpy"), ("cupy", "numpy"), ("jax", "numpy"), ("numpy", "torch"), ("numpy", "jax"),
    ("torch", "jax"), ("jax", "torch"), ("torch", "cupy"), ("cupy", "torch"), ("jax", "cupy"), ("cupy", "jax"),
})


def empty(fw: str, shape: Tuple[int, ...], dtype: str, device: Device, like: Any) -> Any:
    """Uninitialized output in the owner framework on the owner device."""
    if fw == "torch":
        torch = sys.modules["torch"]
        return torch.empty(shape, dtype=getattr(torch, dtype), device=like.device)
    if fw == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(device.index):
            return cupy.empty(shape, dtype=_np_dtype(dtype))
    if fw == "numpy":
        import numpy
        return numpy.empty(shape, dtype=_np_dtype(dtype))
    raise AssertionError(f"no allocation route for {fw}")


def _np_dtype(dtype: str):
    import numpy
    if dtype == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return numpy.dtype(dtype)


def current_stream(fw: str, device: Device) -> int:
    """The owner framework's current CUDA stream as an int handle (0 on CPU)."""
    if device.kind != "cuda":
        return 0
    if fw == "torch":
        torch = sys.modules["torch"]
        return int(torch.cuda.current_stream(device.index).cuda_stream)
    if fw == "cupy":
        return int(sys.modules["cupy"].cuda.get_current_stream().ptr)
    return 0
