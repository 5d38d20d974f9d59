"""Which framework an array belongs to, and its dtype's name, without importing any framework.

array-api-compat's is_*_array helpers look in sys.modules: an array of a framework proves that
framework is already loaded, so nothing here imports one.
"""
from __future__ import annotations

import sys
from typing import Any, Optional

from xgemm import errors

FRAMEWORKS = ("numpy", "torch", "jax", "cupy")


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
    if fw == "torch" and (x.is_nested or x.layout is not sys.modules["torch"].strided):
        kind, fix = (("a nested tensor", f"{name}.to_padded_tensor(0), or its components one by one") if x.is_nested
                     else (f"a {x.layout} tensor", f"{name}.to_dense()"))
        raise errors.NotAnArrayError(f"{fn}: {name} is {kind}; xgemm reads dense (strided) tensors: pass {fix}")
    if fw == "numpy" and type(x).__name__ == "MaskedArray":
        raise errors.NotAnArrayError(f"{fn}: {name} is a NumPy masked array, whose mask xgemm would ignore; pass "
                                     f"{name}.filled(value) or numpy.asarray({name}) to say what masked values are")
    return fw


def require_arrays(fn: str, named, optional=()) -> None:
    """require_array for each (name, value) pair (a None there is no array either), and for each
    optional pair whose value is not None."""
    for name, x in list(named) + [(n, x) for n, x in optional if x is not None]:
        require_array(fn, name, x)


def dtype_name(x: Any) -> str:
    """'float32', 'bfloat16', ... for numpy/jax/cupy dtypes (incl. ml_dtypes) and torch dtypes."""
    dt = x.dtype
    name = getattr(dt, "name", None)
    if isinstance(name, str):
        return name
    return str(dt).rsplit(".", 1)[-1]          # torch.float32 -> float32


def requested_dtype(dt: Any) -> Optional[str]:
    """The name of a dtype a caller asks for (out_dtype=...): a name, a NumPy / ml_dtypes / JAX /
    torch dtype or scalar type; None stays None."""
    if dt is None or isinstance(dt, str):
        return dt
    name = getattr(dt, "name", None)                     # numpy.dtype
    if isinstance(name, str):
        return name
    inner = getattr(dt, "dtype", None)                   # jnp.float32 and friends
    if inner is not None and isinstance(getattr(inner, "name", None), str):
        return inner.name
    if type(dt).__module__.startswith("torch"):          # torch.float32
        return str(dt).rsplit(".", 1)[-1]
    return getattr(dt, "__name__", str(dt))              # numpy.float32, ml_dtypes.bfloat16
