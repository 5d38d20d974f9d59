"""Build xgemm's native libraries (ffi/*.cc) with the system C++ compiler into the xgemm cache.

Two libraries use it: the XLA FFI handler (xgemm/jax/ffi.py) and the torch fast path
(xgemm/torch/native.py). Each is keyed on its sources, the compiler's version, the flags and
a fingerprint of what it is built against (header bytes, or a version string where hashing
thousands of headers at every process start would cost more than it tells), and written
under a file lock so concurrent builds (pytest -n) wait for one another.

Faults: a cached library whose ELF is cut short (dlopen would die of SIGBUS on it) is rebuilt
and overwritten, with one CacheWarning. The compiler writes into a private temporary directory
and the result is copied into the cache, so a cache that cannot be created or written (read-only,
full) leaves the library in that private directory for this process (one warning; the next
process builds again).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, Optional, Sequence

from xgemm.runtime import cache


def source_dir() -> Path:
    """The native sources: XGEMM_FFI_SOURCE_DIR, else the copy a wheel installs (xgemm/_ffi,
    pyproject.toml), else ffi/ beside the package (a source checkout, an editable install)."""
    env = os.environ.get("XGEMM_FFI_SOURCE_DIR")
    if env:
        return Path(env)
    package = Path(__file__).resolve().parent.parent
    installed = package / "_ffi"
    return installed if (installed / "xgemm_ffi.cc").exists() else package.parent / "ffi"


_private: Optional[Path] = None          # this process's build directory when the cache has none
_placed: Dict[Path, Path] = {}            # cache path -> the private copy built where it could not be written


def cache_dir() -> Path:
    """<cache root>/ffi, created; a private temporary directory (one warning) where it cannot be."""
    path = cache.root() / "ffi"
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError as exc:
        cache.unwritable(path, exc)
        return _private_dir()


def _private_dir() -> Path:
    global _private
    if _private is None:
        _private = Path(tempfile.mkdtemp(prefix="xgemm-ffi-"))
    return _private


def compiler() -> str:
    return os.environ.get("CXX", "g++")


def library_path(sources: Sequence[Path], name: str, flags: Sequence[str], fingerprint: bytes) -> Optional[Path]:
    """Where the library of these inputs lives in the cache (it may not exist yet); None when no
    compiler answers (then the newest prebuilt `name` is the only candidate: see build)."""
    try:
        version = subprocess.run([compiler(), "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    h = hashlib.sha256(version.encode())
    h.update(" ".join(flags).encode())
    for src in sources:
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    h.update(fingerprint)
    path = cache_dir() / f"{name}-{h.hexdigest()[:16]}.so"
    return _placed.get(path, path)


def headers_fingerprint(include_dirs: Sequence[str]) -> bytes:
    """The bytes of every header under include_dirs (they pin, e.g., the jaxlib a handler is for)."""
    h = hashlib.sha256()
    for inc in include_dirs:
        for hdr in sorted(Path(inc).rglob("*.h")):
            h.update(hdr.read_bytes())
    return h.digest()


def build(sources: Sequence[Path], name: str, flags: Sequence[str], fingerprint: bytes,
          link: Sequence[str] = (), what: str = "xgemm FFI") -> Path:
    """Compile the .cc files of `sources` into cache_dir()/<name>-<key>.so unless it exists."""
    out = library_path(sources, name, tuple(flags) + tuple(link), fingerprint)
    if out is None:
        whole = (p for p in cache_dir().glob(f"{name}-*.so") if cache.elf_intact(p))
        prebuilt = sorted(whole, key=lambda p: p.stat().st_mtime)
        if prebuilt:
            return prebuilt[-1]
        raise RuntimeError(f"{what}: no C++ compiler ({compiler()}) and no prebuilt {name} in {cache_dir()}; "
                           f"install g++ or set CXX")
    if _present(out):
        return out
    with cache.FileLock(out.parent / f".{name}.lock"):
        if _present(out):
            return out
        built = Path(tempfile.mkdtemp(prefix="xgemm-ffi-")) / out.name
        cmd = [compiler(), *flags, "-o", str(built), *(str(s) for s in sources if s.suffix == ".cc"), *link]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(built.parent, ignore_errors=True)
            raise RuntimeError(f"{what}: building {name} failed:\n{' '.join(cmd)}\n{proc.stderr[-4000:]}")
        tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
        try:
            shutil.copyfile(built, tmp)
            os.replace(tmp, out)        # atomic: a reader never sees half a library
        except OSError as exc:          # read-only or full: this process uses the private copy
            if tmp.exists():
                tmp.unlink()
            cache.unwritable(out.parent, exc)
            _placed[out] = built
            return built
        shutil.rmtree(built.parent, ignore_errors=True)
    return out


def _present(out: Path) -> bool:
    """The library is in the cache and whole; one that is cut short is warned about (then rebuilt):
    the callers dlopen it, which a truncated file turns into SIGBUS, not an exception."""
    if not out.exists():
        return False
    if cache.elf_intact(out):
        return True
    cache.corrupt(out, "its ELF is truncated or not a library")
    return False
