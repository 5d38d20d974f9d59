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
