"""Build the xgemm XLA FFI handler (xgemm_ffi.cc) with g++ into the xgemm cache and print its path.

    python ffi/build.py            # same as: python -m xgemm.jax.ffi

No CUDA toolkit needed: the headers are jaxlib's (jax.ffi.include_dir()) and cuda_min.h; libcuda
is opened at run time. The result is keyed on the sources, the headers and the compiler.
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from xgemm.jax import ffi as jax_ffi  # noqa: E402

t0 = time.perf_counter()
path = jax_ffi.build()
print(f"{path}  ({time.perf_counter() - t0:.1f} s)")
