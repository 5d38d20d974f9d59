"""xgemm.runtime.pack (build-cache --pack): the tarball holds the cache directories of the installed
kernel sources and none of the older ones beside them."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import tarfile
from pathlib import Path

from xgemm.runtime import cute_cache as cute_compile
from xgemm.runtime import gluon_cache
from xgemm.runtime import pack as cache_pack

ROOT = Path(__file__).resolve().parents[2]


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")


def test_pack_keeps_only_the_current_sources_directories(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("XGEMM_CACHE_DIR", str(cache))
    # cute_gemm_sm90's classes are named by the file that defines its build, not by the protocol's
    sm90 = importlib.util.find_spec("xgemm.kernels.cute_gemm_sm90_build").origin
    current = cute_compile.cute_dir(sm90)
    _touch(cute_compile.cute_dir(importlib.util.find_spec("xgemm.kernels.cute_gemm_sm90").origin) / "stray.so")
    _touch(current / "a.so")
    _touch(cache / "cute" / ("0" * 24) / "old.so")                    # an older kernel source
    kernel = "gluon_softmax"
    gluon_new = gluon_cache.cache_root() / f"{kernel}-{gluon_cache.source_hash(kernel)}-triton3.9.0"
    _touch(gluon_new / "sm_90a" / "k.cubin")
    _touch(gluon_cache.cache_root() / f"{kernel}-{'0' * 16}-triton3.9.0" / "sm_90a" / "old.cubin")
    _touch(cache / "ffi" / "lib.so")                                   # built per machine: not carried
    dest = tmp_path / "out" / "pack.tar.xz"
    dirs = cache_pack.pack(str(dest))
    assert set(map(str, dirs)) == {str(current.relative_to(cache)), str(gluon_new.relative_to(cache))}
    with tarfile.open(dest) as tar:
        names = tar.getnames()
    assert f"{current.relative_to(cache)}/a.so" in names
    assert f"{gluon_new.relative_to(cache)}/sm_90a/k.cubin" in names
    assert not any("old" in n or n.startswith("ffi") for n in names), names


def test_cache_pack_import_is_light():
    code = "import sys, xgemm.runtime.pack; print(any(m in sys.modules for m in ('cutlass', 'torch', 'triton', 'jax')))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.stdout.strip() == "False", res.stderr
