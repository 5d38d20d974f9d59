"""The CuTe-DSL compile cache: memory, then disk, then compile. Shared by every CuTe kernel.

    compiled = compile.cute(key, build)

`key` is a tuple naming one compile *class* (kernel x dtypes x majorness x alignment class x
tile config x arch ...), never a shape: `build()` runs `cute.compile(..., options="--enable-tvm-ffi
--gpu-arch <arch>")` against fake tensors with symbolic dims, so one compiled function serves every
shape of its class. The key must hold the arch (use `arch_for(device)`) and only values whose
repr() is stable across processes (ints, strings, bools, None, tuples, frozen dataclasses of those).

Lookup order
1. memory: a dict in this process.
2. disk: `<root>/cute/<fingerprint>/<sha256(repr(key))>.{so,o}` where root is $XGEMM_CACHE_DIR or
   ~/.cache/xgemm, and the fingerprint hashes the cutlass-dsl and tvm-ffi versions, compile.SCHEMA,
   and the code (cache.code_text: no docstrings or comment lines) of problem.py and of the source
   file that defines `build` (an edited kernel never loads a stale object, editing one kernel
   leaves the others' objects valid, and a docs edit keeps them all). The `.so` (the exported object
   linked against the CuTe runtime) loads through tvm_ffi alone in ~ms, without importing cutlass;
   the `.o` (quack's format, `export_to_c`) is the portable fallback, loaded through
   `cutlass.cute.runtime.load_module`.
3. compile: `build()`, then export under an exclusive per-key file lock (other processes wanting
   the same key wait and load the result instead of compiling it again). With the disk cache on,
   the build runs in a child process (modules with `build_for_key`), so that a compiler abort
   becomes an errors.KernelBuildError instead of the end of the caller's process (the call then
   runs on the next kernel: core/policy.attempt). One line is logged (logger
   "xgemm.runtime.cute_cache", to stderr if nothing is configured) on every first-use compile.

Faults (runtime/cache.py): an object that does not load (truncated, foreign) is compiled again
and overwritten, with one errors.CacheWarning; a cache directory that cannot be created or
written keeps the compiled function in memory, with one warning per process.

The function returned is always the bare tvm_ffi.Function, whether it was just compiled or loaded
from disk, so callers see one calling convention: positional arguments as the exported signature
lists them (Constexpr parameters are not in it; a tensor argument given as None at compile time
stays in it and takes None).

XGEMM_CACHE=0 disables the disk side (memory only). `prebuild(jobs=N)` compiles the common classes
of every CuTe kernel ahead of time (`python -m xgemm build-cache`); `warm(items, jobs)` compiles a
given list of keys in N worker processes (modules that define `build_for_key(key)`).
"""
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from xgemm import errors
from xgemm.core import problem, registry
from xgemm.runtime import build_process, cache, driver, tvm_abi

EXPORT_NAME = "func"
# Bump when what this module hands the DSL, or how it exports and loads objects, changes: the
# disk cache's namespace hashes it (not this file, whose other edits leave compiled code alone).
SCHEMA = 1

_log = logging.getLogger("xgemm.runtime.cute_cache")
_memory: Dict[tuple, Any] = {}
_mutex = threading.RLock()
_stats = {"memory": 0, "disk": 0, "compiled": 0}
_died: Dict[tuple, str] = {}    # keys whose build process died (_built_in_child), and the error they raise


# ------------------------------------------------------------------------------------------
# arch and locations
# ------------------------------------------------------------------------------------------
def arch_for(device: Any = None) -> str:
    """CuTe-DSL arch string for a device: (9, 0) -> "sm_90a", (10, 0) -> "sm_100a", (8, 6) -> "sm_86".

    `device` may be an xgemm Device (its .arch), a (major, minor) tuple, a CUDA device index, or None
    (the current CUDA device, or $CUTE_DSL_ARCH when set: compiling needs no GPU)."""
    cc = None
    if isinstance(device, tuple):
        cc = device
    elif getattr(device, "arch", None) is not None:
        cc = device.arch
    elif device is None and os.environ.get("CUTE_DSL_ARCH"):
        return os.environ["CUTE_DSL_ARCH"]
    if cc is None:
        index = device if isinstance(device, int) else getattr(device, "index", 0) or 0
        cc = _device_capability(index)
    major, minor = int(cc[0]), int(cc[1])
    # the arch-specific ("a") targets unlock wgmma/setmaxnreg (9.0) and tcgen05 (10.x)
    suffix = "a" if major >= 9 else ""
    return f"sm_{major}{minor}{suffix}"


def arch_number(arch: str) -> int:
    """arch_for's string back to its number: "sm_90a" -> 90, "sm_100a" -> 100, "sm_86" -> 86;
    0 for anything that is not an sm_ target."""
    found = re.fullmatch(r"sm_(\d+)[a-z]?", arch)
    return int(found.group(1)) if found else 0


def _device_capability(index: int) -> Tuple[int, int]:
    try:
        return driver.capability(index)
    except driver.CudaError as exc:
        raise RuntimeError(f"xgemm.runtime.cute_cache.arch_for: {exc}; set CUTE_DSL_ARCH to compile without a GPU") from None


def cache_root() -> Path:
    return cache.root()


def disk_enabled() -> bool:
    return os.environ.get("XGEMM_CACHE", "1") != "0"


def _package_version(module: str, rel: str, pattern: str) -> str:
    """A package's version read from its source text: importing cutlass costs ~0.5 s, this ~0.1 ms."""
    import importlib.util
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return "absent"
    try:
        text = (Path(spec.origin).parent / rel).read_text()
    except OSError:
        return "unknown"
    match = re.search(pattern, text)
    return match.group(1) if match else "unknown"


_fingerprints: Dict[str, str] = {}


def _function_of(build: Callable) -> Callable:
    fn = build
    while hasattr(fn, "func"):              # functools.partial
        fn = fn.func
    return fn


def source_of(build: Callable) -> Optional[str]:
    """The file that defines `build` (a kernel module): its source is part of the disk key."""
    return getattr(_function_of(build), "__globals__", {}).get("__file__")


def fingerprint(source: Optional[str] = None) -> str:
    """Hash of cutlass-dsl + tvm-ffi versions, SCHEMA, problem.py and the kernel's own source file
    (the disk key's namespace: editing one kernel invalidates only that kernel's objects)."""
    tag = source or ""
    if tag not in _fingerprints:
        h = hashlib.sha256()
        h.update(b"cutlass-dsl=" + _package_version("cutlass", "__init__.py", r'__version__\s*=\s*"([^"]+)"').encode())
        h.update(b"tvm-ffi=" + _package_version("tvm_ffi", "_version.py", r"version\s*=\s*['\"]([^'\"]+)").encode())
        h.update(f"xgemm-compile-schema={SCHEMA}".encode())
        sources = [Path(problem.__file__)] + ([Path(source)] if source else [])
        for src in sources:
            data = cache.code_text_of(src).encode()
            h.update(src.name.encode() + len(data).to_bytes(8, "little") + data)
        _fingerprints[tag] = h.hexdigest()[:24]
    return _fingerprints[tag]


def cute_dir(source: Optional[str] = None) -> Path:
    return cache_root() / "cute" / fingerprint(source)


def key_hash(key: tuple) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()[:40]


# ------------------------------------------------------------------------------------------
# load / export
# ------------------------------------------------------------------------------------------
def _load_so(path: Path) -> Any:
    import tvm_ffi
    return tvm_ffi.load_module(str(path))[EXPORT_NAME]


def _load_o(path: Path) -> Any:
    import cutlass.cute as cute
    return cute.runtime.load_module(str(path), enable_tvm_ffi=True)[EXPORT_NAME]


def _link_so(obj: Path, so: Path) -> bool:
    """Link the exported object into a shared library against the CuTe runtime + tvm-ffi, so a
    later process loads it with tvm_ffi alone. Needs a C compiler driver; False when there is none."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return False
    try:
        import cutlass.cute as cute
        libs = [p for p in cute.runtime.find_runtime_libraries(enable_tvm_ffi=True) if Path(p).exists()]
    except Exception:   # noqa: BLE001 - an unlinkable object still loads through cutlass
        return False
    tmp = so.with_name(f"{so.name}.tmp.{os.getpid()}")
    rpaths = [f"-Wl,-rpath,{Path(p).parent}" for p in libs]
    try:
        res = subprocess.run([cc, "-shared", "-o", str(tmp), str(obj), *libs, *rpaths],
                             capture_output=True, timeout=120)
        if res.returncode != 0:
            _log.debug("xgemm.runtime.cute_cache: linking %s failed: %s", so, res.stderr.decode(errors="replace")[-500:])
            return False
        os.replace(tmp, so)
        return True
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        if tmp.exists():
            tmp.unlink()


def _export(compiled: Any, obj: Path, so: Path) -> None:
    tmp = obj.with_name(f"{obj.name}.tmp.{os.getpid()}")
    try:
        compiled.export_to_c(object_file_path=str(tmp), function_name=EXPORT_NAME)
        os.replace(tmp, obj)     # atomic: a killed writer never leaves a truncated object behind
    finally:
        if tmp.exists():
            tmp.unlink()
    _link_so(obj, so)


def _raw(compiled: Any) -> Any:
    """The bare tvm_ffi.Function behind a cute.compile result: the same object, with the same
    positional signature (compile-time None arguments are not parameters), as a disk load returns,
    and without the Python kwargs wrapper's per-call cost."""
    get = getattr(compiled, "__tvm_ffi_object__", None)
    raw = get() if get is not None else None
    return raw if raw is not None else compiled


def _describe(key: tuple) -> str:
    text = repr(key)
    return text if len(text) <= 160 else text[:157] + "..."


def _announce(key: tuple, where: str) -> None:
    msg = f"xgemm: compiling {_describe(key)} (first use; cached in {where})"
    if _log.hasHandlers():
        _log.info(msg)
    else:
        print(msg, file=sys.stderr, flush=True)


def _whole(path: Path) -> bool:
    """Checked before loading: dlopen of a truncated library dies of SIGBUS instead of raising."""
    if cache.elf_intact(path):
        return True
    cache.corrupt(path, "its ELF is truncated or not an object")
    return False


def _try_load(so: Path, obj: Path) -> Optional[Any]:
    """Load from disk: the .so first (no cutlass import), then the .o; None if neither loads.

    A file that exists but does not load is corrupt or foreign (truncated by a full disk, copied
    from elsewhere): warned about once; the .so is relinked from a good .o, else both are rebuilt
    and overwritten by the caller. A missing loader (ImportError) says nothing about the file."""
    if so.exists() and _whole(so):
        try:
            return _load_so(so)
        except ImportError as exc:
            _log.debug("xgemm.runtime.cute_cache: cannot load %s here (%s); trying the object file", so, exc)
        except Exception as exc:   # noqa: BLE001 - e.g. truncated, or linked elsewhere against other paths
            if "cannot open shared object file" in str(exc):     # linked on another machine (a carried
                _log.debug("xgemm.runtime.cute_cache: %s needs another machine's libraries (%s); "   # cache):
                           "relinking it from the object file", so, exc)                          # not corrupt
            else:
                cache.corrupt(so, f"{type(exc).__name__}: {exc}")
    if obj.exists() and _whole(obj):
        try:
            fn = _load_o(obj)
        except ImportError as exc:
            _log.debug("xgemm.runtime.cute_cache: cannot load %s here (%s)", obj, exc)
            return None
        except Exception as exc:   # noqa: BLE001 - a corrupt entry is a miss, not an error
            cache.corrupt(obj, f"{type(exc).__name__}: {exc}")
            return None
        _link_so(obj, so)          # next process: the fast path
        return fn
    return None


def cute(key: tuple, build: Callable[[], Any]) -> Any:
    """The compiled function for `key`: from memory, else from disk, else `build()` (then saved).

    Always the bare tvm_ffi.Function (see _raw): call it positionally with the arguments of the
    exported signature; a compile-time None argument (e.g. an absent C) is not one of them."""
    fn = _memory.get(key)
    if fn is not None:
        _stats["memory"] += 1
        return fn
    if key in _died:            # its build process died once in this process: no second child, no lock
        raise errors.KernelBuildError(_died[key])
    with _mutex:
        fn = _memory.get(key)
        if fn is not None:
            return fn
        fn = _from_disk_or_build(key, build) if disk_enabled() else None
        if fn is None:
            fn = _build_in_memory(key, build)
        _memory[key] = fn
        return fn


def _build_in_memory(key: tuple, build: Callable[[], Any]) -> Any:
    _announce(key, "memory")
    fn = _raw(build())
    _stats["compiled"] += 1
    return fn


def _from_disk_or_build(key: tuple, build: Callable[[], Any]) -> Optional[Any]:
    """The function from disk, else built and exported; None when the cache directory cannot be
    created (read-only, or a file in the way): the caller builds in memory."""
    directory = cute_dir(source_of(build))
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        cache.unwritable(directory, exc)
        return None
    sha = key_hash(key)
    so, obj, lock = directory / f"{sha}.so", directory / f"{sha}.o", directory / f"{sha}.lock"
    if so.exists() or obj.exists():
        with cache.FileLock(lock, exclusive=False):
            fn = _try_load(so, obj)
        if fn is not None:
            _stats["disk"] += 1
            return fn
    with cache.FileLock(lock, exclusive=True):
        fn = _try_load(so, obj)          # another process may have built it while we waited
        if fn is not None:
            _stats["disk"] += 1
            return fn
        _announce(key, str(directory))
        if _built_in_child(key, build, obj, so):
            fn = _try_load(so, obj)
            if fn is not None:
                _stats["compiled"] += 1
                return fn
        compiled = build()
        fn = _raw(compiled)
        _stats["compiled"] += 1
        try:
            _export(compiled, obj, so)
        except OSError as exc:     # read-only or full: still usable in this process
            cache.unwritable(directory, exc)
        except Exception as exc:   # noqa: BLE001 - still usable in this process
            _log.warning("xgemm.runtime.cute_cache: could not save %s to %s (%s); it will recompile next process",
                         _describe(key), directory, exc)
        if not hasattr(fn, "__chandle__"):
            # no execution engine (a machine without a GPU, e.g. lowering jax.jit for cuda): the
            # compile result has no tvm_ffi.Function; the exported object loads as one
            fn = _try_load(so, obj) or fn
        return fn


# A first-use compile runs in a child process (runtime/build_process.py: CuTe-DSL aborts the
# whole process on some builds it cannot do, and a user's process must outlive that). The child
# builds and exports under the lock the caller holds; the caller loads the result. A child that
# fails as Python leaves the build to the caller, which raises the real error (or succeeds where
# only the child's environment was at fault). XGEMM_CUTE_BUILD=inline builds in the caller
# (the children themselves and warm()'s workers do).
def _built_in_child(key: tuple, build: Callable, obj: Path, so: Path) -> bool:
    """True: a child process compiled the key and exported it to obj / so. False: build here
    (inline asked for, a build of a module without build_for_key, or a child that failed as
    Python). Raises errors.KernelBuildError where the child died of a signal."""
    module = getattr(_function_of(build), "__module__", None)
    if (os.environ.get("XGEMM_CUTE_BUILD", "child") == "inline" or module is None
            or not hasattr(sys.modules.get(module), "build_for_key")):
        return False
    done = build_process.build(module, key, str(obj), str(so), _child_env())
    if done is None:                        # no interpreter to start (an embedded Python)
        _log.debug("xgemm.runtime.cute_cache: no child process for the build; building here")
        return False
    if done.status != "died":
        if done.status == "failed":
            _log.debug("xgemm.runtime.cute_cache: the child build of %s failed; building here:\n%s",
                       _describe(key), done.log[-2000:])
        return done.status == "ok"
    tail = done.log.strip().splitlines()[-3:]
    _died[key] = (f"compiling {_describe(key)} killed its build process ({done.signal}; it said: "
                  f"{' | '.join(tail) or 'nothing'}); the calling process is unharmed, and problems that need this "
                  f"class run on the next kernel that takes them (explain() names it). Please report it with this message")
    raise errors.KernelBuildError(_died[key])


def _child_env() -> Dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])     # the directory holding the xgemm package
    env = dict(os.environ, XGEMM_CUTE_BUILD="inline")
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


_eager: Dict[tuple, Any] = {}


def cute_eager(key: tuple, build: Callable[[], Any]) -> Any:
    """The function for `key` as eager calls use it: the on-disk .so called through ctypes
    (xgemm/runtime/tvm_abi.py: no tvm_ffi import, tvm_abi.CFunction with .prepare for repeat calls),
    else what cute() returns. Same positional arguments either way. XGEMM_TVM_ABI=0 turns the
    ctypes route off."""
    fn = _eager.get(key)
    if fn is not None:
        return fn
    if disk_enabled() and os.environ.get("XGEMM_TVM_ABI", "1") != "0":
        so = cute_dir(source_of(build)) / f"{key_hash(key)}.so"
        if not so.exists():
            cute(key, build)             # compiles (or loads the .o) and links the .so when it can
        if so.exists():
            fn = tvm_abi.load(so, EXPORT_NAME) if _whole(so) else None
            obj = so.with_suffix(".o")
            if fn is None and tvm_abi._preload_runtime() is not None:
                # the runtime loads, so the file is at fault: truncated, or linked on another machine
                # (a carried cache); relinked here from its object, else rebuilt by cute() below
                cache.corrupt(so, "it does not load through ctypes")
                if obj.exists() and cache.elf_intact(obj) and _link_so(obj, so):
                    fn = tvm_abi.load(so, EXPORT_NAME)
            if fn is not None:
                _stats["disk"] += 1
    if fn is None:
        fn = cute(key, build)
    with _mutex:
        _eager[key] = fn
    return fn


def stats() -> Dict[str, int]:
    """Counts of memory hits, disk loads and compiles in this process."""
    return dict(_stats)


def clear_memory() -> None:
    """Forget compiled functions held in this process (the disk cache stays)."""
    with _mutex:
        _memory.clear()
        _eager.clear()


# ------------------------------------------------------------------------------------------
# ahead-of-time
# ------------------------------------------------------------------------------------------
def on_disk(key: tuple, build: Optional[Callable] = None) -> bool:
    """Is the class in the disk cache (its object, or the shared library linked from it)?"""
    stem = cute_dir(source_of(build) if build else None) / key_hash(key)
    return stem.with_suffix(".o").exists() or stem.with_suffix(".so").exists()


def warm(items: Iterable[Tuple[str, tuple]], jobs: int = 0,
         progress: Optional[Callable[[str], None]] = None) -> int:
    """Compile the keys not yet on disk, in `jobs` worker processes (0: one per CPU).

    `items` are (kernel module name, key) pairs; the module must define `build_for_key(key)`.
    Workers share the per-key file locks, so concurrent warms never compile one key twice.
    Returns how many keys were missing."""
    import importlib
    import pickle
    seen, missing = set(), []
    for module, key in items:
        build = importlib.import_module(module).build_for_key(key)
        if key not in seen and (not disk_enabled() or not on_disk(key, build)):
            seen.add(key)
            missing.append((module, key))
    jobs = jobs or os.cpu_count() or 1
    if not missing:
        return 0
    if jobs <= 1 or len(missing) == 1 or not disk_enabled():
        for module, key in missing:
            cute(key, importlib.import_module(module).build_for_key(key))
        return len(missing)
    jobs = min(jobs, len(missing))
    env = _child_env()
    procs = []
    t0 = time.perf_counter()
    for w in range(jobs):
        chunk = missing[w::jobs]
        p = subprocess.Popen([sys.executable, "-c", "from xgemm.runtime.cute_cache import _warm_worker; _warm_worker()"],
                             stdin=subprocess.PIPE, env=env)
        p.stdin.write(pickle.dumps(chunk))
        p.stdin.close()
        procs.append(p)
    failed = [p.wait() for p in procs]
    if any(failed):
        raise RuntimeError(f"xgemm.runtime.cute_cache.warm: {sum(1 for f in failed if f)} of {jobs} workers failed")
    if progress is not None:
        progress(f"xgemm: compiled {len(missing)} classes in {jobs} processes, {time.perf_counter() - t0:.1f}s")
    return len(missing)


def _warm_worker() -> None:
    import importlib
    import pickle
    for module, key in pickle.loads(sys.stdin.buffer.read()):
        cute(key, importlib.import_module(module).build_for_key(key))


def prebuild(arch: Optional[str] = None, progress: Optional[Callable[[str], None]] = None,
             jobs: int = 1) -> List[tuple]:
    """Compile (or load) the common classes of every CuTe kernel into the disk cache: each one's
    prebuild(arch) -> [(key, build)], compiled in `jobs` processes when its module has
    `build_for_key`. Returns the keys done. `arch` defaults to arch_for(None)."""
    import importlib
    arch = arch or arch_for(None)
    done = []
    for name, kernel in registry.of_backend("cute").items():
        items = kernel.prebuild(arch)
        module = registry.module_name(name)
        if jobs != 1 and hasattr(importlib.import_module(module), "build_for_key"):
            warm([(module, key) for key, _ in items], jobs, progress)
            done.extend(key for key, _ in items)
            continue
        for i, (key, build) in enumerate(items):
            t0 = time.perf_counter()
            cute(key, build)
            if progress is not None:
                progress(f"[{name} {i + 1}/{len(items)}] {_describe(key)} {time.perf_counter() - t0:.2f}s")
            done.append(key)
    return done
