"""Arguments of the xgemm.jax functions as JAX sees them: tracers and arrays."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xgemm import errors


def is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def as_jax(fn: str, name: str, x: Any) -> Any:
    """x as a JAX array (tracers as they are; NumPy and DLPack producers converted), else a typed error."""
    if isinstance(x, jax.Array) or is_tracer(x):
        return x
    if hasattr(x, "__dlpack__") or isinstance(x, np.ndarray):
        return jnp.asarray(x)
    raise errors.NotAnArrayError(f"{fn}: {name} is a {type(x).__name__}, not an array; pass a jax.Array")
