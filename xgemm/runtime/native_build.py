"""Build xgemm's native libraries (ffi/*.cc) with the system C++ compiler into the xgemm cache.

Two libraries use it: the XLA FFI handler (xgemm/jax/ffi.py) and the torch fast path
(xgemm/torch/native.py). Each is keyed on its sources, the compiler's version, the flags and
a fingerprint of what it is built against (header bytes, or a version string where hashing
thousands of headers at every process start would cost more than it tells), and written
under a file lock so concurrent builds (pytest -n) wait for one another.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Optional, Sequence

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


def cache_dir() -> Path:
    path = cache.root() / "ffi"
    path.mkdir(parents=True, exist_ok=True)
    return path


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
    return cache_dir() / f"{name}-{h.hexdigest()[:16]}.so"


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
        prebuilt = sorted(cache_dir().glob(f"{name}-*.so"), key=lambda p: p.stat().st_mtime)
        if prebuilt:
            return prebuilt[-1]
        raise RuntimeError(f"{what}: no C++ compiler ({compiler()}) and no prebuilt {name} in {cache_dir()}; "
                           f"install g++ or set CXX")
    if out.exists():
        return out
    import fcntl
    with open(cache_dir() / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists():
            return out
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        cmd = [compiler(), *flags, "-o", str(tmp), *(str(s) for s in sources if s.suffix == ".cc"), *link]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{what}: building {name} failed:\n{' '.join(cmd)}\n{proc.stderr[-4000:]}")
        os.replace(tmp, out)
    return out
