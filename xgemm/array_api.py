"""Array-API generic code on xgemm: a namespace whose matmul (and softmax) are xgemm's.

    xp = xgemm.array_api.namespace(a, b)      # like array_api_compat.array_namespace(a, b)
    y = xp.matmul(a, b)                        # xgemm.matmul
    z = xp.softmax(y, axis=-1)                 # not in the standard; provided for convenience
    s = xp.sum(z, axis=0)                      # everything else is the array's own namespace

Code written against the array API standard gets xgemm's kernels without knowing about them.
"""
from __future__ import annotations

from typing import Any

from xgemm import api, errors
from xgemm.arrays import detect
from xgemm.core import checks

_cache: dict = {}


class _XgemmNamespace:
    """Attribute lookups fall through to the wrapped namespace, except the ones xgemm serves."""

    def __init__(self, base: Any):
        self._base = base
        self.__name__ = f"xgemm[{getattr(base, '__name__', type(base).__name__)}]"

    def matmul(self, x1: Any, x2: Any, /) -> Any:
        """xgemm.matmul for two arrays of one floating dtype it serves; anything else (integers,
        complex, mixed dtypes, which the standard promotes) the wrapped namespace's own matmul."""
        dts = {detect.dtype_name(x) for x in (x1, x2) if hasattr(x, "dtype")}
        if len(dts) == 1 and dts <= set(checks.SUPPORTED_DTYPES):
            return api.matmul(x1, x2)
        return self._base.matmul(x1, x2)

    def __dir__(self):
        return sorted(set(dir(self._base)) | {"matmul", "softmax"})

    def softmax(self, x: Any, /, *, axis: int = -1) -> Any:
        return api.softmax(x, axis=axis)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)

    def __repr__(self) -> str:
        return f"<array namespace {self.__name__}>"


def namespace(*arrays: Any) -> Any:
    """The array-API namespace of `arrays` (array_api_compat.array_namespace) with xgemm's matmul."""
    from array_api_compat import array_namespace
    given = [(i, x) for i, x in enumerate(arrays) if x is not None and not isinstance(x, (bool, int, float, complex))]
    if not given:       # as array_api_compat, Python scalars and None name no namespace
        raise errors.NotAnArrayError("namespace: no arrays given (Python scalars and None name no namespace); "
                                     "pass the arrays your code works on")
    for i, x in given:
        detect.require_array("namespace", f"arrays[{i}]", x)
    try:
        base = array_namespace(*arrays)
    except TypeError as exc:               # arrays of two libraries: array_api_compat names them
        raise errors.FrameworkError(f"namespace: {exc}; pass arrays of one library (convert the others, e.g. "
                                    f"torch.from_dlpack / numpy.from_dlpack)") from None
    if id(base) not in _cache:
        _cache[id(base)] = (base, _XgemmNamespace(base))   # keep base alive so its id stays unique
    return _cache[id(base)][1]


__all__ = ["namespace"]
