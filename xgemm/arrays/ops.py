"""Operations on the caller's arrays in their own framework (already imported): compacting and
padded copies, joining another framework's array through DLPack, allocation, the current stream.
"""
from __future__ import annotations

import math
import sys
from typing import Any, Tuple

from xgemm import errors
from xgemm.arrays.detect import dtype_name, framework_of, is_jax_tracer
from xgemm.arrays.views import ArrayView, device_of, view
from xgemm.core.problem import Device


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
    if fw == "jax" and is_jax_tracer(x):
        raise errors.FrameworkError(f"{fn}: {name} is a JAX tracer (inside jax.jit/grad) but the first operand is a "
                                    f"{owner} array; pass JAX arrays for every operand inside JAX transforms")
    if (owner, fw) not in MIXING_RULES:
        raise errors.FrameworkError(
            f"{fn}: {name} is {'a DLPack producer' if fw == 'other' else 'a ' + fw + ' array'} but the result "
            f"framework (from the first operand) is {owner}; "
            f"no rule mixes {fw} into {owner}: convert {name} first, e.g. {owner}'s from_dlpack({name})")
    if owner == "numpy":             # NumPy holds host arrays only: a device array is on the wrong device
        dev = device_of(fw, x, name, fn)
        if dev.kind != "cpu":
            raise errors.DeviceError(
                f"{fn}: {name} is on {dev.kind}:{dev.index} but the first operand is a NumPy array (cpu), so the "
                f"result would be NumPy on the CPU; move {name} to the CPU first (e.g. torch: {name}.cpu(), "
                f"cupy: {name}.get()), or pass the device arrays first and convert the NumPy ones to them")
    if fw == "numpy" and owner == "torch":
        import numpy
        if any(s < 0 for s in x.strides):
            # torch.from_dlpack aborts the process (a C++ terminate) on a negative stride: a copy
            x = numpy.ascontiguousarray(x)
        if x.dtype.name in _BITS:           # NumPy's DLPack has no bfloat16 / fp8 (ml_dtypes): their bits, as views
            torch = sys.modules["torch"]
            return torch.from_numpy(x.view(_BITS[x.dtype.name])).view(getattr(torch, x.dtype.name))
    if owner == "numpy" and fw in ("torch", "jax") and dtype_name(x) in _BITS:
        import ml_dtypes
        import numpy
        if fw == "jax":
            return numpy.asarray(x)         # JAX hands NumPy these ml_dtypes itself
        bits = getattr(sys.modules["torch"], _BITS[dtype_name(x)])
        return numpy.from_dlpack(x.detach().view(bits)).view(getattr(ml_dtypes, dtype_name(x)))
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


# ml_dtypes' types NumPy cannot export through DLPack, and the integer type of their width
_BITS = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}

MIXING_RULES = frozenset({
    ("torch", "numpy"), ("cupy", "numpy"), ("jax", "numpy"), ("numpy", "torch"), ("numpy", "jax"),
    ("torch", "jax"), ("jax", "torch"), ("torch", "cupy"), ("cupy", "torch"), ("jax", "cupy"), ("cupy", "jax"),
    # any other DLPack producer joins through the owner's from_dlpack (NumPy keeps its read-only flag)
    ("numpy", "other"), ("torch", "other"), ("cupy", "other"), ("jax", "other"),
})


def empty(fw: str, shape: Tuple[int, ...], dtype: str, device: Device, like: Any) -> Any:
    """Uninitialized output in the owner framework on the owner device.

    Running out of memory (torch.OutOfMemoryError, CuPy's and NumPy's MemoryError) is an
    errors.OutOfMemoryError naming the array and the fix. The framework's exception is not chained:
    its traceback holds the frames (and arrays) of the failed call, keeping memory the caller is
    about to need."""
    try:
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
    except (MemoryError, RuntimeError) as exc:
        torch_oom = getattr(sys.modules.get("torch"), "OutOfMemoryError", MemoryError)
        if not isinstance(exc, (MemoryError, torch_oom)):
            raise
        what = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        where = f"{device.kind}:{device.index}" if device.kind != "cpu" else "host"
        err = errors.OutOfMemoryError(
            f"out of {where} memory allocating a {fw} {dtype} array of shape {tuple(shape)}{_bytes(shape, dtype)} for "
            f"the result or a staging copy ({what}); free memory (drop references to unused arrays, empty the "
            f"framework's allocator cache) or use smaller batches")
    else:
        raise AssertionError(f"no allocation route for {fw}")
    raise err


def _bytes(shape: Tuple[int, ...], dtype: str) -> str:
    """' (N bytes)' for an OOM message; empty where NumPy does not know the dtype."""
    try:
        itemsize = 2 if dtype == "bfloat16" else _np_dtype(dtype).itemsize
    except TypeError:
        return ""
    return f" ({math.prod(shape) * itemsize} bytes)"


def _np_dtype(dtype: str):
    """NumPy's dtype of a name; bfloat16 and the float8 types through ml_dtypes."""
    import numpy
    if dtype == "bfloat16" or dtype.startswith("float8"):
        import ml_dtypes
        return numpy.dtype(getattr(ml_dtypes, dtype))
    return numpy.dtype(dtype)


def framework_dtype(fw: str, name: str) -> Any:
    """The owner framework's dtype object of a dtype name (torch.bfloat16, ml_dtypes.bfloat16, ...)."""
    if fw == "torch":
        return getattr(sys.modules["torch"], name)
    return _np_dtype(name)


def namespace(fw: str) -> Any:
    """The owner framework's array-API namespace (NumPy, torch, CuPy), imported directly:
    array_api_compat.array_namespace's lru_cache makes torch.compile warn."""
    if fw == "torch":
        import array_api_compat.torch as xp
    elif fw == "cupy":
        import array_api_compat.cupy as xp
    else:
        import array_api_compat.numpy as xp
    return xp


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
