"""The test command's own output stays clean: a run that compiles Gluon kernels (triton imported)
ends without the 'nanobind: leaked ...' lines triton's bindings print at interpreter exit
(issue 22), and keeps pytest's exit status."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import have

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.compile
def test_a_gluon_compile_run_ends_without_leak_warnings():
    if not have("triton"):
        pytest.skip("triton (the gpu extra) is not installed")
    test = "tests/kernels/test_gluon_matmul_compile.py::test_sm90_metadata"     # its compile leaks at exit
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "1 passed" in out.stdout
    assert "leaked" not in out.stdout + out.stderr, (out.stdout + out.stderr)[-3000:]
