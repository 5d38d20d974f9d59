"""The native torch fast path (ffi/torch_fastpath.cc): repeat eager torch calls served in C++.

Why: a repeat call through the Python fast path (xgemm/torch/fastpath.py) costs about twice the host
time of a native torch op -- a Python allocation and a ctypes launch; issue 3's bar is <= 8 us
per call. The C++ module does what a native torch op does: at::empty, then one launch on
torch's current stream.

What it serves: the signatures xgemm/torch/fastpath.py keeps whose kernel's bound launch describes
itself (`go.native`, a recipe made by tvm_abi.Prepared or launch.Launcher):
    ("tvm", function address, cells address, cell count, roles, owner)
    ("cu", CUfunction, CUlaunchConfig address, CTAs, parameter block, ((offset, role), ...), owner)
roles name which operand each tensor argument / pointer slot is (A, B, C, OUT below); the owner
keeps the function's library or module loaded. Everything else misses and plans in Python.

When: the library is built with g++ against the installed torch (15-25 s, once per torch build
and source; cached beside the FFI handler in ~/.cache/xgemm/ffi). start() -- called by the
fast path at the first repeat of a bound CUDA call -- loads a cached library at once, or builds
it on a background thread while the Python fast path serves (one line on stderr, or logger
"xgemm.native", says so); `load()` builds and loads now (tests, benchmarks; `python -m xgemm
build-cache` builds it). XGEMM_NATIVE=0 turns it off. Before it is used, the stream it would
launch on is checked against torch.cuda.current_stream.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any, Optional, Sequence

from xgemm.runtime.roles import OUT, A, B, C  # noqa: F401  (the recipes' operand roles, for callers)

OPS = {"matmul": 0, "gemm": 1, "softmax": 2}
NAME = "xgemm_torch_fastpath"

_lock = threading.Lock()
_state = "idle"                    # idle | building | ready | failed | off
_module: Any = None
active: Any = None                 # the loaded, checked module once ready: the eager entry points ask it first


def compiling() -> bool:           # torch.compiler.is_compiling once the module is active
    return False
_error: Optional[str] = None
_log = logging.getLogger("xgemm.native")


def _say(msg: str) -> None:
    """One line, as xgemm.runtime.cute_cache announces a first-use compile: to the logger if configured."""
    if _log.hasHandlers():
        _log.info(msg)
    else:
        print(msg, file=sys.stderr, flush=True)


def status() -> dict:
    """{'state', 'error', 'entries', 'hits'}: what the benchmarks record."""
    stats = _module.stats() if _module is not None else {}
    return {"state": _state, "error": _error, **stats}


def _sources():
    from xgemm.runtime import native_build  # lazy: the build machinery loads at the first repeat call, not with xgemm
    src = native_build.source_dir()
    return [src / "torch_fastpath.cc", src / "cuda_min.h", src / "foreign_abi.h"]


def _flags_and_link():
    import sysconfig

    import torch

    from xgemm.runtime import native_build  # lazy: as in _sources()
    root = os.path.dirname(torch.__file__)
    lib = os.path.join(root, "lib")
    includes = [sysconfig.get_paths()["include"], os.path.join(root, "include"),
                os.path.join(root, "include", "torch", "csrc", "api", "include"), str(native_build.source_dir())]
    flags = ["-std=c++17", "-O2", "-fPIC", "-shared", "-w",
             f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", *(f"-I{d}" for d in includes)]
    link = [f"-L{lib}", "-ltorch_python", "-ltorch", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{lib}", "-ldl"]
    fingerprint = f"{torch.__version__} {torch.version.git_version} {sys.version}".encode()
    return flags, link, fingerprint


def library_path(build: bool):
    """The library for the installed torch: built if `build`, else only if already cached (or None)."""
    from xgemm.runtime import native_build  # lazy: as in _sources()
    flags, link, fingerprint = _flags_and_link()
    if build:
        return native_build.build(_sources(), NAME, flags, fingerprint, link, what="xgemm torch fast path")
    path = native_build.library_path(_sources(), NAME, tuple(flags) + tuple(link), fingerprint)
    return path if path is not None and path.exists() else None


def _import(path) -> Any:
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_file_location(NAME, str(path), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _cuda_error(call: str, code: int, detail: str) -> Exception:
    from xgemm.runtime import driver  # lazy: only the loaded module's error path needs it, not import xgemm
    return driver.CudaError(call, code, driver.error_name(code), detail)


def _tvm_error(kind: str, message: str) -> Exception:
    from xgemm.runtime import tvm_abi  # lazy: as in _cuda_error
    return tvm_abi.error_of(kind, message)


def configure(driver_path: str = "libcuda.so.1", allow_cpu: bool = False, test_stream: int = 0) -> None:
    """The driver library and, for tests, CPU tensors standing for one CUDA device on test_stream."""
    _module.configure(_cuda_error, _tvm_error, driver_path, allow_cpu, test_stream)


def _activate(mod: Any) -> None:
    """Check the module's stream against torch's, then hand it to the fast path."""
    global _module, _state, active, compiling
    import torch
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        ours, theirs = mod.stream(index), torch.cuda.current_stream(index).cuda_stream
        if ours != theirs:
            raise RuntimeError(f"stream check failed: native {ours:#x}, torch {theirs:#x}")
    _module = mod
    configure()
    compiling = torch.compiler.is_compiling
    active = mod
    _state = "ready"


def _load_now(build: bool) -> bool:
    global _state, _error
    try:
        path = library_path(build)
        if path is None:
            return False
        _activate(_import(path))
        return True
    except Exception as exc:       # noqa: BLE001 - the Python fast path keeps serving
        _state, _error = "failed", f"{type(exc).__name__}: {exc}"
        _say(f"xgemm: native torch fast path unavailable ({_error}); the Python fast path serves")
        return True


def load() -> Any:
    """Build (if needed) and load the module now, XGEMM_NATIVE=0 or not; returns it, or None
    (status()['error'] says why)."""
    global _state
    with _lock:
        if _state in ("idle", "building", "off"):
            _state = "building"
            _load_now(build=True)
    return _module


def start() -> None:
    """Called at the first repeat of a bound CUDA torch call: load a cached library now, or build
    one on a background thread; nothing once started, without CUDA, or when XGEMM_NATIVE=0."""
    global _state
    if _state != "idle":
        return
    with _lock:
        if _state != "idle":
            return
        if os.environ.get("XGEMM_NATIVE", "1") == "0":
            _state = "off"
            return
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            return                 # nothing to serve (CPU tests dress CPU tensors as CUDA)
        _state = "building"
        if _load_now(build=False):
            return
    _say("xgemm: building the native torch fast path in the background (once per torch build)")
    threading.Thread(target=load, name="xgemm-native-build", daemon=True).start()


def register(op: str, forced: Optional[str], s0: Any, s1: Any, a: Any, b: Any, c: Any, result: Any,
             recipe: Sequence) -> bool:
    """Register a bound launch for (op, forced, s0, s1, a, b, c); False when not served natively."""
    if _module is None or recipe is None:
        return False
    kind, *rest = recipe
    head = (OPS[op], forced, s0, s1, a, b, c, result, rest[-1])
    try:
        if kind == "tvm":
            fn, cells, n, roles, _ = rest
            _module.store_tvm(*head, fn, cells, n, tuple(roles))
        else:
            func, config, ctas, params, slots, _ = rest
            _module.store_cu(*head, func, config, ctas, params, tuple(slots))
    except (ValueError, TypeError, OverflowError):
        return False               # a call shape it does not serve: the Python fast path does
    return True
