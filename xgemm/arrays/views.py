"""ArrayView: what a kernel needs to know of one caller array (device, pointer, shape, strides,
dtype), read through DLPack or the framework's own accessors, without a copy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from xgemm import errors
from xgemm.arrays.detect import dtype_name, is_jax_tracer, require_array
from xgemm.core import layout
from xgemm.core.problem import ROW, Device, Operand
from xgemm.runtime import dlpack, driver


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


def device_of(fw: str, x: Any, name: str = "x", fn: str = "xgemm") -> Device:
    """The device an array lives on, from its DLPack device (a typed error where DLPack has none)."""
    try:
        dev_type, dev_id = x.__dlpack_device__()
    except (ValueError, RuntimeError, TypeError, BufferError) as exc:   # torch 'meta', lazy tensors, ...
        raise errors.DeviceError(f"{fn}: {name} lives on a device DLPack cannot describe ({exc}); "
                                 f"move it to the CPU or a CUDA device first") from exc
    dev_type = int(dev_type)
    if dev_type == dlpack.CPU or dev_type == dlpack.CUDA_HOST:
        return Device("cpu", 0)
    if dev_type in (dlpack.CUDA, dlpack.CUDA_MANAGED):
        return Device("cuda", int(dev_id), _cuda_arch(int(dev_id)))
    return Device(f"dlpack{dev_type}", int(dev_id))


_arch_cache: dict = {}


def _cuda_arch(index: int) -> Optional[Tuple[int, int]]:
    """Compute capability through the driver (xgemm/runtime/driver.py: no framework, no cuda-python);
    None if unavailable."""
    if index not in _arch_cache:
        try:
            _arch_cache[index] = driver.capability(index)
        except Exception:        # no driver: kernels that need an arch decline
            _arch_cache[index] = None
    return _arch_cache[index]


_torch_devices: dict = {}
_torch_dtypes: dict = {}


_new = object.__new__


def view_torch(x: Any) -> ArrayView:
    """The hot path (eager torch calls): no DLPack round trip, cached device and dtype objects.

    The ArrayView is filled through its __dict__: the frozen dataclass's __init__ sets each of
    its nine fields with object.__setattr__ (~1.9 us; this ~0.5 us). Same type, same fields."""
    dev = x.device
    device = _torch_devices.get(dev)
    if device is None:
        device = (Device("cuda", dev.index or 0, _cuda_arch(dev.index or 0)) if dev.type == "cuda"
                  else device_of("torch", x))
        _torch_devices[dev] = device
    dtype = _torch_dtypes.get(x.dtype)
    if dtype is None:
        dtype = _torch_dtypes[x.dtype] = str(x.dtype).rsplit(".", 1)[-1]
    shape, strides = tuple(x.shape), tuple(x.stride())
    if 1 in shape:
        settled = layout.settled_unit_strides(shape, strides)
        if settled is not None:
            x, strides = x.as_strided(shape, settled), settled
    v = _new(ArrayView)
    d = v.__dict__
    d["obj"] = x
    d["framework"] = "torch"
    d["device"] = device
    d["ptr"] = x.data_ptr()
    d["shape"] = shape
    d["strides"] = strides
    d["dtype"] = dtype
    d["itemsize"] = x.element_size()
    d["readonly"] = False
    return v


def view(x: Any, name: str, fn: str) -> ArrayView:
    """Describe x without copying. Raises NotAnArrayError for non-arrays."""
    fw = require_array(fn, name, x)
    if fw == "torch" and x.device.type in ("cpu", "cuda"):
        return view_torch(x)
    device = device_of(fw, x, name, fn)
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
    settled = layout.settled_unit_strides(tuple(x.shape), strides) if fw in ("numpy", "cupy") else None
    if settled is not None:
        x, strides = _restrided(fw, x, settled, itemsize), settled
    return ArrayView(x, fw, device, int(ptr), tuple(int(d) for d in x.shape), strides, dtype, int(itemsize), readonly)


def _restrided(fw: str, x: Any, strides: Tuple[int, ...], itemsize: int) -> Any:
    """x as a view of the same memory with these element strides (layout.settled_unit_strides:
    only extent-1 dims differ, so no element moves); NumPy keeps x's writeability."""
    if fw == "numpy":
        from numpy.lib.stride_tricks import as_strided
    else:
        from cupy.lib.stride_tricks import as_strided
    return as_strided(x, x.shape, tuple(s * itemsize for s in strides))


def _row_major_strides(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


_DL_DTYPES = {code: name for name, code in dlpack.CODES.items() if name.startswith(("float", "bfloat"))}


def _view_from_capsule(x: Any, name: str, fn: str, device: Device) -> ArrayView:
    """Describe an array of a framework xgemm does not know through its DLPack capsule: a versioned
    (DLPack >= 1.0) one when the producer offers it, whose flags say whether the array is read-only,
    else a legacy one (read-only unknown: taken as writeable, as before 1.0). The capsule is not
    consumed: the view reads x's memory in place, and x (the view's obj) keeps it alive."""
    # Calls owned by an unknown framework launch on the legacy default stream (arrays.current_stream
    # gives 0 for them), so the producer must order its pending work before that stream: DLPack's 1,
    # passed explicitly since a producer's own default may be -1, no synchronization (torch 2.13's).
    kw = {"stream": 1} if device.kind == "cuda" else {}
    try:
        try:
            capsule = x.__dlpack__(max_version=dlpack.VERSION, **kw)
        except TypeError:                   # a producer older than DLPack 1.0 has no max_version
            capsule = x.__dlpack__(**kw)
        unpacked = dlpack.unpack(capsule)
    except (BufferError, TypeError, ValueError, RuntimeError) as exc:
        raise errors.FrameworkError(
            f"{fn}: {name} ({type(x).__name__}) could not be read through DLPack: {exc}; pass a NumPy, "
            f"torch, CuPy or JAX array (e.g. numpy.from_dlpack({name}) or torch.from_dlpack({name}))") from exc
    if unpacked.flags & dlpack.FLAG_IS_COPIED:
        # the copy lives only as long as the capsule, and writes to it would not reach x
        raise errors.FrameworkError(
            f"{fn}: {name}'s producer ({type(x).__name__}) exported a copy through DLPack (flag IS_COPIED), "
            f"but xgemm reads and writes arrays in place; pass an array whose memory it shares, or a "
            f"NumPy, torch, CuPy or JAX array")
    tensor = unpacked.tensor                # lives in the capsule: read it all before the capsule goes
    ndim = tensor.ndim
    shape = tuple(tensor.shape[i] for i in range(ndim))
    strides = tuple(tensor.strides[i] for i in range(ndim)) if tensor.strides else _row_major_strides(shape)
    key = (tensor.dtype.code, tensor.dtype.bits)
    # lanes > 1 is a vector dtype (e.g. float32x4): an unknown name, which the dtype checks refuse
    dtype = _DL_DTYPES.get(key, f"dlpack{key}") if tensor.dtype.lanes == 1 else f"dlpack{key}x{tensor.dtype.lanes}"
    ptr = int(tensor.data or 0) + int(tensor.byte_offset)
    readonly = bool(unpacked.flags & dlpack.FLAG_READ_ONLY)
    itemsize = max(tensor.dtype.bits // 8, 1)
    del tensor, unpacked, capsule           # the producer's deleter runs now (the capsule was not consumed)
    return ArrayView(x, "other", device, ptr, shape, strides, dtype, itemsize, readonly)


def alignment(v: ArrayView, major: str) -> int:
    """Largest power of two <= 16 dividing the view's base address, leading stride and batch strides, in bytes."""
    return layout.alignment(v.ptr, v.shape, v.strides, v.itemsize, major)


def operand(v: ArrayView) -> Operand:
    """The problem's Operand of a view: its majorness (ROW below 2 dims) and alignment class."""
    major = layout.majorness(v.shape, v.strides) if v.ndim >= 2 else ROW
    return Operand(shape=v.shape, strides=v.strides, dtype=v.dtype, majorness=major, alignment=alignment(v, major))
