"""The disk cache's directories the installed sources use, packed into one tarball to carry.

`python -m xgemm build-cache --pack FILE` writes FILE (.tar.xz) with, relative to the cache root
($XGEMM_CACHE_DIR or ~/.cache/xgemm): cute/<fingerprint> of each prebuilt CuTe kernel (the
fingerprint covers the file that defines its build, so every edit of it starts a new directory) and each Gluon
kernel's <kernel>-<source hash>-triton<version> directories. Directories of older sources stay
on disk but out of the tarball: a cache used across many kernel edits holds hundreds of MB, and a
GPU session carries 64 MiB. Extract it with `tar -xJf FILE -C DIR` and set XGEMM_CACHE_DIR=DIR.
Nothing here imports a compiler or a framework.
"""
from __future__ import annotations

import importlib.util
import tarfile
from pathlib import Path
from typing import List

from xgemm.core import registry
from xgemm.runtime import cache, cute_cache, gluon_cache


def current_dirs() -> List[Path]:
    """The existing cache directories of the installed kernel sources, relative to the cache root."""
    root = cache.root()
    dirs = []
    for name in registry.of_backend("cute"):
        # the directory is named by the file that defines the kernel's build (cute_gemm_sm90 keeps
        # it in cute_gemm_sm90_build.py), else by the kernel module's own file
        module = importlib.import_module(registry.module_name(name))
        build = getattr(module, "build", None)
        dirs.append(cute_cache.cute_dir(cute_cache.source_of(build) if build is not None else module.__file__))
    gluon_root = gluon_cache.cache_root()
    for kernel in registry.of_backend("gluon"):
        try:
            stem = f"{kernel}-{gluon_cache.source_hash(kernel)}-triton"
        except gluon_cache.KernelUnavailableError:
            continue
        dirs += sorted(gluon_root.glob(stem + "*"))
    return [d.relative_to(root) for d in dirs if d.is_dir()]


def pack(dest: str) -> List[Path]:
    """Write dest (.tar.xz) with current_dirs(); returns them."""
    root = cache.root()
    dirs = current_dirs()
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:xz") as tar:
        for d in dirs:
            tar.add(root / d, arcname=str(d), filter=_no_locks)
    return dirs


def _no_locks(info: tarfile.TarInfo):
    """The build locks beside cache entries (runtime/cache.py) stay behind."""
    return None if info.name.endswith(".lock") else info
