"""Typed errors. Each message names the argument, the value seen, and the fix.

Every class subclasses the builtin a caller would already catch (ValueError or TypeError,
MemoryError for running out of memory), so `except ValueError` keeps working for code written
against NumPy.
"""


class XgemmError(Exception):
    """Base of every error xgemm raises on purpose."""


class NotAnArrayError(XgemmError, TypeError):
    """An operand is not an array (it has no `__dlpack__`)."""


class ShapeError(XgemmError, ValueError):
    """Shapes do not fit: inner dims, batch dims, rank, or `out`'s shape."""


class DTypeError(XgemmError, TypeError):
    """A dtype is unsupported, or operands' dtypes differ."""


class DeviceError(XgemmError, ValueError):
    """Operands (or `out`) live on different devices."""


class FrameworkError(XgemmError, TypeError):
    """Operands come from frameworks that have no declared mixing rule."""


class OutError(XgemmError, ValueError):
    """`out` is read-only, immutable, or overlaps an input."""


class AxisError(XgemmError, ValueError, IndexError):
    """`axis` is out of range (an IndexError too, like numpy.exceptions.AxisError)."""


class ScalarError(XgemmError, TypeError):
    """alpha/beta is not a real number."""


class NonFiniteScalarError(XgemmError, ValueError):
    """alpha/beta is NaN or infinite."""


class EpilogueError(XgemmError, ValueError):
    """An epilogue the call cannot have: an unknown activation, or gating asked of a plain GEMM."""


class KernelUnavailableError(XgemmError, RuntimeError):
    """A kernel was forced (policy override) but cannot serve this problem or this machine, or its
    binary cannot run here (missing from the cache, or a driver too old for it)."""


class KernelBuildError(KernelUnavailableError):
    """A kernel's compiler could not build its binary for a problem here (it died building it).
    That kernel declines the problem from then on, and the call runs on the next kernel of the
    table (policy.attempt); this reaches the caller only where no other may run it (a forced kernel)."""


class GradientError(XgemmError, RuntimeError):
    """An input requires a gradient that the call does not define; the message names the inputs
    and the differentiable call to use instead."""


class OutOfMemoryError(XgemmError, MemoryError):
    """Device (or host) memory ran out during a call: an output or staging allocation, or the
    driver's. Nothing xgemm holds is left half-made, so the next call works once memory is free."""


class CacheWarning(RuntimeWarning):
    """The kernel cache on disk could not be used as is (a corrupt entry, a read-only or full
    directory); xgemm rebuilt or kept the kernel in memory and carried on. Once per process per cause."""


__all__ = [name for name in dir() if name.endswith(("Error", "Warning"))]
