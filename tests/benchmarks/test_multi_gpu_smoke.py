"""The issue-6 benchmarks on CPU stand-ins for two GPUs: benchmarks/multi_gpu.py on 2 fake JAX CPU
devices (rows-, cols- and K-sharded matmul and row-sharded softmax match the single-device
reference, and no operand is all-gathered), and benchmarks/multi_gpu_torch.py with its per-device
splits on two 'cpu' devices. On a 2-GPU machine the same scripts measure per-device throughput."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _smoke(script: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--smoke"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def test_jax_sharded_script_smoke():
    pytest.importorskip("jax")
    assert _smoke("multi_gpu.py").count("| True |") == 12


def test_torch_per_device_script_smoke():
    pytest.importorskip("torch")
    assert _smoke("multi_gpu_torch.py").count("| True |") == 13
