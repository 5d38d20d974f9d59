"""benchmarks/fuzz.py on the CPU (torch and JAX through the embedded default): the generator, the
float64 checks and the reproducer line keep working in CI; the kernels are fuzzed on the H200."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import fuzz  # noqa: E402

from xgemm.core import epilogues  # noqa: E402


def test_cases_are_drawn_the_same_for_a_seed_and_cover_the_space():
    cases = [fuzz.draw(fuzz.Choose(s)) for s in range(400)]
    assert cases[:50] == [fuzz.draw(fuzz.Choose(s)) for s in range(50)]
    assert {c["fw"] for c in cases} == set(fuzz.FRAMEWORKS)
    assert {c["op"] for c in cases} == {"gemm", "softmax", "scaled_matmul", "quantize", "grouped"}
    grouped = [c for c in cases if c["op"] == "grouped"]
    assert {c["mode"] for c in grouped} == {"rows", "ragged_k"} and {c["fw"] for c in grouped} == set(fuzz.FRAMEWORKS)
    assert {c["sizes"] for c in grouped} == set(fuzz.GROUP_SIZES) and {c["a_major"] for c in grouped} == {"row", "col"}
    assert {c["fw"] for c in cases if c["op"] in ("scaled_matmul", "quantize")} == {"torch"}
    fp8 = [c for c in cases if c["op"] == "scaled_matmul"]
    assert {c["recipe"] for c in fp8} == {"tensor", "row", "block"} and {c["b_major"] for c in fp8} == {"col", "row"}
    assert {c["fast"] for c in fp8} == {False, True}
    assert len({c["recipe"] for c in cases if c["op"] == "quantize"}) >= 3
    gemm = [c for c in cases if c["op"] == "gemm"]
    assert any(0 in (c["m"], c["n"], c["k"]) for c in gemm) and any(c["batch"] for c in gemm)
    assert any(c["out"] for c in gemm) and any(c["c"] for c in gemm) and any(c["a_off"] for c in gemm)
    assert {c["special"] for c in cases if c["op"] == "softmax"} >= {"neg_inf_row", "nan", "pos_inf"}
    assert any(c["gated"] for c in gemm) and any(c["bias"] for c in gemm)
    assert {c["activation"] for c in gemm if not c["gated"]} >= set(epilogues.ACTIVATIONS)


def test_the_grouped_check_catches_a_wrong_result(monkeypatch):
    pytest.importorskip("torch")
    import xgemm
    monkeypatch.setattr(fuzz, "DEVICE", "cpu")
    case = dict(op="grouped", fw="torch", dtype="float32", mode="rows", t=17, k=5, n=8, groups=3, sizes="some_empty",
                api="ragged_dot", a_major="col", b_major="row", out=None)
    assert fuzz.run_case(case, 2) is None
    assert fuzz.run_case(dict(case, mode="ragged_k", api="grouped_mm", sizes="above_t"), 2) is None
    real = xgemm.ragged_dot
    monkeypatch.setattr(xgemm, "ragged_dot", lambda *a, **k: real(*a, **k) * (1 + 1e-5))
    assert "wrong" in fuzz.run_case(case, 2)


def test_the_check_catches_a_wrong_result(monkeypatch):
    torch = pytest.importorskip("torch")
    import xgemm
    monkeypatch.setattr(fuzz, "DEVICE", "cpu")
    case = dict(op="gemm", fw="torch", dtype="float32", m=5, n=7, k=3, batch=[], bcast=None, vec=None,
                a_major="row", b_major="col", a_pad=0, b_pad=1, a_off=1, b_off=0, alpha=1.0, beta=0.0,
                c=None, c_dtype=None, out=None, out_major="row")
    assert fuzz.run_case(case, 1) is None
    real = xgemm.gemm
    monkeypatch.setattr(xgemm, "gemm", lambda *a, **k: real(*a, **k) * (1 + 1e-5))
    assert "wrong" in fuzz.run_case(case, 1)
    monkeypatch.setattr(xgemm, "gemm", lambda *a, **k: torch.full_like(real(*a, **k), float("nan")))
    assert "NaN mismatch" in fuzz.run_case(case, 1)
    monkeypatch.setattr(xgemm, "gemm", real)
    gelu = dict(case, bias="float32", activation="gelu")
    assert fuzz.run_case(gelu, 1) is None
    monkeypatch.setattr(xgemm, "gemm", lambda *a, **k: real(*a, **dict(k, activation="gelu_tanh")))
    assert "wrong" in fuzz.run_case(gelu, 1)          # the tanh approximation is not the exact gelu


def test_cpu_run_and_reproducer():
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, "benchmarks/fuzz.py", "--cpu", "--cases", "30", "--seed", "3",
                          "--frameworks", "torch"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "30 cases" in out.stdout and "0 failures" in out.stdout
    case = fuzz.draw(fuzz.Choose(5), ("torch",))
    line = fuzz.reproducer(case, 5)
    assert line.startswith("python benchmarks/fuzz.py --case ") and json.loads(line.split("'")[1]) == case


def test_the_fp8_checks_catch_wrong_results(monkeypatch):
    """scaled_matmul 2% off and quantize_fp8 scales 1e-4 off are failures (the embedded default on
    the CPU passes the same cases)."""
    pytest.importorskip("torch")
    import xgemm
    monkeypatch.setattr(fuzz, "DEVICE", "cpu")
    sm = dict(op="scaled_matmul", fw="torch", dtype="float8_e4m3fn", b_dtype="float8_e5m2", m=33, n=40, k=300,
              recipe="block", b_major="col", bias="bfloat16", out="bfloat16")
    qz = dict(op="quantize", fw="torch", dtype="bfloat16", rows=17, cols=300, fp8="float8_e4m3fn",
              recipe="block_1x128", special="inf")
    assert fuzz.run_case(sm, 3) is None and fuzz.run_case(qz, 3) is None
    real_sm, real_q = xgemm.scaled_matmul, xgemm.quantize_fp8
    monkeypatch.setattr(xgemm, "scaled_matmul", lambda *a, **k: real_sm(*a, **k) * 1.02)
    monkeypatch.setattr(xgemm, "quantize_fp8", lambda *a: (lambda q, s: (q, s * 1.0001))(*real_q(*a)))
    assert "wrong" in fuzz.run_case(sm, 3) and "scale" in fuzz.run_case(qz, 3)


def test_a_sticky_cuda_fault_stops_the_worker(monkeypatch):
    """After a fault that leaves the CUDA context unusable, every later case of that process would
    fail too: the worker stops and says so, instead of counting them (5400 on 2026-12-02)."""
    whys = iter(["raised AcceleratorError: CUDA error: misaligned address", None, None])
    monkeypatch.setattr(fuzz, "run_case", lambda case, seed: next(whys))
    report = fuzz._merge([fuzz.fuzz(3, 1, ("torch",), log=lambda *a: None)])
    assert report["cases"] == 1 and len(report["failures"]) == 1 and report["context_lost"] == [1_000_003]
    whys = iter(["3 wrong, first at (0, 0)", None, None])
    assert fuzz.fuzz(3, 1, ("torch",), log=lambda *a: None)["cases"] == 3     # a wrong value: go on


def test_a_float16_result_past_its_range_may_be_inf():
    """scaled_matmul with e5m2 operands reaches past float16's range: an exact -69493 rounds to -inf."""
    import numpy as np
    ref, tol = np.array([-69492.9, 60000.0]), np.array([687.0, 687.0])
    assert fuzz._compare(fuzz._saturated(np.array([-np.inf, 60001.0]), ref, tol, "float16"), ref, tol) is None
    assert fuzz._compare(fuzz._saturated(np.array([np.inf, 60001.0]), ref, tol, "float16"), ref, tol)
    assert fuzz._compare(fuzz._saturated(np.array([-np.inf, np.inf]), ref, tol, "float16"), ref, tol)
