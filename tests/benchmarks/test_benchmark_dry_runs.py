"""The issue benchmarks' --dry-run modes on CPU: each builds its cases and shows xgemm's plan for
them without a GPU, so a script that would fail on the H200 for a Python reason fails here first."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("torch")


def _dry_run(script: str) -> str:
    out = subprocess.run([sys.executable, f"benchmarks/{script}", "--dry-run"], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_epilogue_dry_run_shows_each_epilogue_plan():
    out = _dry_run("epilogue.py")
    assert "epilogue: bias + gelu_tanh" in out and "epilogue: swiglu" in out


def test_fp8_dry_run_shows_each_recipe():
    out = _dry_run("fp8.py")
    for recipe in ("tensor-wise", "row-wise", "block-wise"):
        assert f"{recipe} scales" in out


def test_grouped_dry_run_builds_the_acceptance_groups():
    out = _dry_run("grouped.py")
    assert "uneven: E=8 T=16384" in out and "offs[-1] = 16384" in out
    assert "zipf: E=64 T=65536" in out and "4 empty" in out


def test_grouped_sizes_follow_the_issue():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import grouped
    sizes = grouped.uneven_sizes(8, 16384)
    assert sizes.sum() == 16384 and (abs(sizes - 2048) <= 1000).all()
    z = grouped.zipf_sizes(64, 65536)
    assert z.sum() == 65536 and (z[-4:] == 0).all() and z[0] > 10 * z[30]


def test_decode_dry_run_routes_decode_to_the_gemv():
    out = _dry_run("decode.py")
    assert "1x8192x28672 B row: triton_gemv_sm90" in out and "64x4096x4096 B row: gluon_splitk_sm90" in out
