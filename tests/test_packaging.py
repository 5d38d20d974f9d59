"""A wheel of xgemm carries what it builds at run time: the native sources of ffi/ (the XLA FFI
handler, the torch fast path) as xgemm/_ffi, which native_build.source_dir() finds in an
installed (non-editable) copy."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_the_native_sources(tmp_path):
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("no setuptools to build the wheel with")
    src = tmp_path / "src"         # a copy: setuptools writes build/ beside the sources it builds
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("xgemm", "ffi"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel, = (tmp_path / "dist").glob("xgemm-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for src in ("xgemm_ffi.cc", "torch_fastpath.cc", "cuda_min.h", "foreign_abi.h", "peer_exchange.h",
                "testing/fake_libcuda.cc"):
        assert f"xgemm/_ffi/{src}" in names, sorted(n for n in names if "_ffi" in n)
    for module in ("kernels/cute_gemm_sm90.py", "core/registry.py", "arrays/views.py", "torch/ops.py", "jax/lowering.py",
                   "runtime/cute_cache.py"):
        assert f"xgemm/{module}" in names, module
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    code = "from xgemm.runtime import native_build; print(native_build.source_dir())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == tmp_path / "site" / "xgemm" / "_ffi"
