"""The issue-6 benchmark (benchmarks/multi_gpu.py) on 2 fake CPU devices: values match the
single-device reference for rows-, cols- and K-sharded matmul and row-sharded softmax, and no
operand is all-gathered. On a 2-GPU machine the same script measures per-device throughput."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
ROOT = Path(__file__).resolve().parents[1]


def test_multi_device_script_smoke():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "multi_gpu.py"), "--smoke"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.count("| True |") == 10, proc.stdout
