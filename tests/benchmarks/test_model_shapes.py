"""benchmarks/model_shapes.py on the CPU: the shape list (models, dims, token counts, dedup, subsets),
the --dry-run listing in a subprocess, and --render of a synthetic results file. The timing itself
runs on the H200."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import model_shapes as ms

RECORDS = ms.shapes()


def product(model, layer, pass_, tokens, dtype="bfloat16"):
    """The record serving one use, as (M, N, K, batch)."""
    hits = [r for r in RECORDS if r["dtype"] == dtype and
            {"model": model, "layer": layer, "pass": pass_, "tokens": tokens} in r["names"]]
    assert len(hits) == 1, (model, layer, pass_, tokens, dtype)
    r = hits[0]
    return r["M"], r["N"], r["K"], r["batch"]


def test_every_model_is_there_with_its_config_dims():
    assert {n["model"] for r in RECORDS for n in r["names"]} == set(ms.MODELS) | {"attention"}
    # fwd: tokens x in -> out (M=T, N=out, K=in)
    assert product("llama3-8b", "q_proj", "fwd", 4096) == (4096, 4096, 4096, 1)
    assert product("llama3-8b", "k_proj", "fwd", 4096) == (4096, 1024, 4096, 1)
    assert product("llama3-8b", "gate_up_proj", "fwd", 4096) == (4096, 2 * 14336, 4096, 1)
    assert product("llama3-8b", "down_proj", "fwd", 4096) == (4096, 4096, 14336, 1)
    assert product("llama3-70b", "v_proj", "fwd", 512) == (512, 1024, 8192, 1)
    assert product("llama3-70b", "gate_up_proj", "fwd", 64) == (64, 2 * 28672, 8192, 1)
    assert product("llama3-70b", "down_proj", "fwd", 8) == (8, 8192, 28672, 1)
    assert product("qwen2.5-72b", "q_proj", "fwd", 1) == (1, 8192, 8192, 1)
    assert product("qwen2.5-72b", "k_proj", "fwd", 1) == (1, 1024, 8192, 1)
    assert product("qwen2.5-72b", "down_proj", "fwd", 16384) == (16384, 8192, 29568, 1)
    assert product("mixtral-8x7b", "k_proj", "fwd", 4096) == (4096, 1024, 4096, 1)
    # experts: ceil(T * 2 / 8) rows each (top-2 of 8, balanced)
    assert product("mixtral-8x7b", "expert_gate_up", "fwd", 4096) == (1024, 2 * 14336, 4096, 1)
    assert product("mixtral-8x7b", "expert_down", "fwd", 1) == (1, 4096, 14336, 1)
    assert product("mixtral-8x7b", "expert_down", "wgrad", 512) == (14336, 4096, 128, 1)
    ds = {layer: product("deepseek-v3", layer, "fwd", 4096)[1:3] for layer, _, _ in ms.MODELS["deepseek-v3"][0]}
    assert ds == {"q_a_proj": (1536, 7168), "q_b_proj": (24576, 1536), "kv_a_proj_with_mqa": (576, 7168),
                  "kv_b_proj": (32768, 512), "o_proj": (7168, 16384), "gate_proj": (18432, 7168),
                  "up_proj": (18432, 7168), "down_proj": (7168, 18432)}


def test_dgrad_and_wgrad_conventions():
    # dgrad: tokens x out -> in (M=T, N=in, K=out); wgrad: in x out over tokens (M=in, N=out, K=T)
    assert product("deepseek-v3", "kv_a_proj_with_mqa", "dgrad", 64) == (64, 7168, 576, 1)
    assert product("deepseek-v3", "kv_a_proj_with_mqa", "wgrad", 16384) == (7168, 576, 16384, 1)
    assert product("llama3-8b", "gate_up_proj", "dgrad", 512) == (512, 4096, 28672, 1)
    assert product("llama3-8b", "gate_up_proj", "wgrad", 512) == (4096, 28672, 512, 1)


def test_token_counts_per_pass():
    tokens = {}
    for r in RECORDS:
        for n in r["names"]:
            if n["model"] != "attention":
                tokens.setdefault(n["pass"], set()).add(n["tokens"])
    assert tokens == {"fwd": {1, 8, 64, 512, 4096, 16384}, "dgrad": {1, 8, 64, 512, 4096, 16384},
                      "wgrad": {512, 4096, 16384}}


def test_attention_products_are_batched_qk_and_pv():
    att = [r for r in RECORDS if r["batch"] > 1 and r["dtype"] == "bfloat16"]
    assert 16 <= len(att) <= 24 and {r["batch"] for r in att} == {8, 32, 128}
    assert {r["M"] for r in att} >= {64, 2048} and {min(r["N"], r["K"]) for r in att} == {64, 128}
    assert product("attention", "QK^T d=128 bh=32", "fwd", 1024) == (1024, 1024, 128, 32)    # s x d @ d x s
    assert product("attention", "PV d=64 bh=8", "fwd", 2048) == (2048, 64, 2048, 8)         # s x s @ s x d


def test_dedup_keeps_every_name_and_fp16_spot_checks():
    keys = [(r["M"], r["N"], r["K"], r["batch"], r["dtype"]) for r in RECORDS]
    assert len(keys) == len(set(keys))
    names = [(n["model"], n["layer"], n["pass"], n["tokens"], r["dtype"]) for r in RECORDS for n in r["names"]]
    assert len(names) == len(set(names)) == len(ms._uses()) + len(ms.FP16_SPOT_CHECKS)
    # 4096^3 serves Llama-3 8B's q and o projections (fwd, dgrad, wgrad at 4096) and Mixtral's
    square = next(r for r in RECORDS if r["case"] == "bf16_4096x4096x4096")
    served = {(n["model"], n["layer"], n["pass"]) for n in square["names"]}
    assert {("llama3-8b", "q_proj", "fwd"), ("llama3-8b", "o_proj", "dgrad"), ("llama3-8b", "q_proj", "wgrad"),
            ("mixtral-8x7b", "o_proj", "fwd")} <= served
    assert (square["model"], square["layer"], square["pass"], square["tokens"]) == ("llama3-8b", "q_proj", "fwd", 4096)
    fp16 = [r for r in RECORDS if r["dtype"] == "float16"]
    assert len(fp16) == len(ms.FP16_SPOT_CHECKS) and all(r["flops"] == 2 * r["batch"] * r["M"] * r["N"] * r["K"]
                                                          for r in RECORDS)


def test_subsets_are_nested_and_sized():
    sets = {s: {r["case"] for r in ms.select(RECORDS, s)} for s in ("smoke", "core", "full", "jit")}
    assert sets["smoke"] < sets["core"] < sets["full"] and sets["jit"] < sets["full"]
    assert len(sets["smoke"]) == len(ms.SMOKE) == 10
    assert 70 <= len(sets["core"]) <= 90 and 20 <= len(sets["jit"]) <= 30
    assert sets["full"] == {r["case"] for r in RECORDS}
    assert ms.shapes() == RECORDS                                     # deterministic
    # smoke covers decode, batched and fp16 products
    smoke = ms.select(RECORDS, "smoke")
    assert any(r["M"] == 1 for r in smoke) and any(r["batch"] > 1 for r in smoke)
    assert any(r["dtype"] == "float16" for r in smoke) and any(r["pass"] == "wgrad" for r in smoke)


def test_the_full_sweep_forecast_fits_the_budget():
    full = ms.select(RECORDS, "full")
    jit = ms.select(RECORDS, "jit")
    total = sum(ms.estimate_s(r, 3, 18) for r in full) + sum(ms.jit_estimate_s(r, 12) for r in jit)
    assert total < 8 * 60 * 0.6              # a margin for what the forecast leaves out (compiles, imports)
    assert all(ms.reps_for(r) >= ms.input_sets(r) for r in full)


def test_dry_run_lists_the_smoke_shapes():
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, "benchmarks/model_shapes.py", "--dry-run", "--subset", "smoke"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"{len(RECORDS)} products in all (smoke 10," in out.stdout
    for r in ms.select(RECORDS, "smoke"):
        line = next(ln for ln in out.stdout.splitlines() if f" {r['case']} " in ln)
        assert "reference" in line and f"{r['flops'] / 1e9:.2f}" in line
    assert "10 shapes (--subset smoke)" in out.stdout and "forecast" in out.stdout


def _synthetic(tmp_path: Path) -> Path:
    recs = ms.select(RECORDS, "smoke")[:4]
    rows = []
    for i, r in enumerate(recs):
        rows.append(dict(r, part="torch", status="ok", best_peer="cublas", ratio=0.95 + 0.03 * i,
                         ratio_ci=[0.94 + 0.03 * i, 0.96 + 0.03 * i], kernel="cute_gemm_sm90",
                         impls={"xgemm": {"us": 10.0, "tflops": 1.0, "verified": True},
                                "cublas": {"us": 10.5, "tflops": 0.9, "verified": True}}))
    rows.append(dict(recs[0], part="torch", status="wrong", ratio=None, ratio_ci=None, best_peer=None,
                     impls={"xgemm": {"us": 9.0, "tflops": 1.1, "verified": False}}))
    rows.append(dict(recs[1], part="jit", status="ok", best_peer="xla", ratio=1.02, ratio_ci=[1.0, 1.04],
                     impls={"xgemm": {"us": 5.0, "verified": True}, "xla": {"us": 5.1, "verified": True}}))
    path = tmp_path / "model_shapes-h200.json"
    path.write_text(json.dumps([{"meta": {"gpu": "NVIDIA H200", "date": "2026-12-01", "command": "synthetic"}}]
                               + rows))
    return path


def test_summary_counts_a_wrong_output_as_a_miss(tmp_path):
    _, records = ms.load(_synthetic(tmp_path))
    s = ms.summarize(records, "torch")
    assert s["judged"] == 5 and s["ok"] == 4 and s["wrong"] == 1
    assert s["share_ge_0.98"] == pytest.approx(3 / 5) and s["min_ratio"] == pytest.approx(0.95)
    assert ms.summarize(records, "jit")["share_ge_0.98"] == 1.0


def test_render_writes_a_png_from_json(tmp_path):
    pytest.importorskip("matplotlib")
    _synthetic(tmp_path)
    assert ms.main(["--render", "--out", str(tmp_path)]) == 0
    png = tmp_path / "model_shapes-h200.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "| bf16_1x4096x4096 |" in (tmp_path / "model_shapes-h200.md").read_text()



def test_kernel_summary_reads_the_jit_calls_kernels():
    """--jit-kernel-time: per product, the summed kernel time, the span from the first start to the
    last end, and each kernel's launches a call (3 calls of 2 products, a GEMM and a memset each)."""
    events = []
    for call in range(3):
        for p in range(2):
            t = 100.0 * (2 * call + p)
            events += [{"ts": t, "dur": 40.0, "name": "xgemm_gemm"}, {"ts": t + 41, "dur": 2.0, "name": "memset"}]
    got = ms.kernel_summary(events, 3, 2)
    assert got["kernel_us"] == pytest.approx(42.0) and got["span_us"] == pytest.approx((500 + 43) / 6)
    assert got["kernels"] == {"xgemm_gemm": 2.0, "memset": 2.0}
    assert ms.kernel_summary([], 3, 2)["kernel_us"] is None


def test_jit_kernel_lines_put_wall_kernel_and_eager_side_by_side():
    recs = [{"part": "torch", "case": "bf16_1x4096x4096", "impls": {"xgemm": {"us": 12.6}}},
            {"part": "jit", "case": "bf16_1x4096x4096",
             "impls": {"xgemm": {"us": 23.3, "kernel_us": 12.9, "span_us": 21.0},
                       "xla": {"us": 19.2, "kernel_us": 13.5, "span_us": 14.1}}},
            {"part": "jit", "case": "bf16_8x8x8", "status": "skipped"}]
    (line,) = ms.jit_kernel_lines(recs)
    assert line == ("jit kernel time bf16_1x4096x4096: xgemm wall 23.3 kernel 12.9 span 21.0 | "
                    "xla wall 19.2 kernel 13.5 span 14.1 | xgemm eager 12.6")
