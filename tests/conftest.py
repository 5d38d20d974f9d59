"""Shared test plumbing: the gpu marker skips without CUDA; frameworks convert to float64 NumPy."""
from __future__ import annotations

import functools
import os

import numpy as np
import pytest

# float64 is a supported dtype on the embedded default; JAX needs x64 for it. Set before jax loads
# so every test in the process sees one configuration.
os.environ.setdefault("JAX_ENABLE_X64", "1")


@functools.lru_cache(None)
def cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


_exit_status = None


def pytest_sessionfinish(session, exitstatus):
    global _exit_status
    _exit_status = int(exitstatus)


def pytest_unconfigure(config):
    """End the process as soon as pytest is done when triton was imported (the Gluon compile
    tests): at interpreter shutdown its nanobind bindings print ~40 lines of 'leaked function'
    warnings (issue 22), which make a passing run look broken. Output is flushed first; the exit
    status is pytest's own."""
    import sys
    if _exit_status is not None and "triton" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status)


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@functools.lru_cache(None)
def have(module: str) -> bool:
    """Whether `module` imports here (compile-only tests skip without their compiler; see
    test_environment.py, which fails CI when a compiler the test extra promises is missing)."""
    try:
        __import__(module)
        return True
    except ImportError:
        return False


@pytest.fixture(scope="module")
def gluon_cache_dir(tmp_path_factory):
    """A fresh XGEMM_CACHE_DIR for one test module's Gluon compiles (the old one restored after;
    the in-process entry and availability memos are cleared on both sides)."""
    from xgemm.runtime import gluon_cache
    root = tmp_path_factory.mktemp("xgemm_cache")
    old = os.environ.get("XGEMM_CACHE_DIR")
    os.environ["XGEMM_CACHE_DIR"] = str(root)
    gluon_cache.clear_memory()
    try:
        yield root
    finally:
        gluon_cache.clear_memory()
        if old is None:
            os.environ.pop("XGEMM_CACHE_DIR", None)
        else:
            os.environ["XGEMM_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def tvm_echo(tmp_path_factory):
    """(CFunction, record): tests/data/tvm_abi_echo.c, a stand-in for an exported CuTe function
    that records the TVM-FFI cells it receives, built with the system C compiler."""
    import ctypes
    import shutil
    import subprocess
    from pathlib import Path

    from xgemm.runtime import tvm_abi
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    so = tmp_path_factory.mktemp("abi") / "echo.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(Path(__file__).parent / "data" / "tvm_abi_echo.c")],
                   check=True)
    lib = ctypes.CDLL(str(so))
    sym = lib["__tvm_ffi_func"]
    sym.argtypes, sym.restype = tvm_abi._SAFE_CALL, ctypes.c_int
    record = (ctypes.c_int64 * 256).in_dll(lib, "xgemm_echo")
    return tvm_abi.CFunction(sym, lib, None), record


def to_f64(x) -> np.ndarray:
    """Any framework's array -> float64 NumPy (bf16 included)."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        return x.detach().to("cpu").double().numpy()
    if mod.startswith("cupy"):
        return x.get().astype(np.float64)
    return np.asarray(x).astype(np.float64)
