"""The GEMMs of real LLM layers on the H200: xgemm vs cuBLAS vs quack (torch, CUDA graphs) and
xgemm vs XLA inside jax.jit (issue 20). One process; JSON + PNG (+ a markdown table).

    python benchmarks/model_shapes.py --dry-run --subset smoke     # any machine (CPU): the shapes,
                                                                   # explain() on CPU tensors, FLOPs, estimate
    python benchmarks/model_shapes.py --subset core                # H200: 79 shapes, then the 24 jit shapes
    python benchmarks/model_shapes.py --subset full --budget-s 420 # H200: all 271 shapes (+ jit), within ~8 min
    python benchmarks/model_shapes.py --subset smoke --jit-subset smoke   # H200: a quick check (10 + 7)
    python benchmarks/model_shapes.py --render [--out DIR]         # any machine: PNG + table from the JSON

Writes benchmarks/results/model_shapes-h200.{json,png,md} (or into --out DIR). A run prints the
shape counts, a time forecast, one line per shape (each implementation's TFLOP/s, the ratio with its
CI, xgemm's kernel) and the summaries. --dry-run prints the forecast too (H200, warm caches: core ~35 s
+ jit ~40 s, full ~2 min + jit; compiles not included). Warm xgemm's kernel cache first (`python -m
xgemm build-cache`, or benchmarks/h200.sh's prebuild) so that compiles do not eat the budget;
--budget-s stops timing when it is spent (the rest is recorded as skipped), and the JSON is rewritten
after every shape, so a killed run keeps what it measured.

Shapes (shapes(); dims from the models' config.json, see MODELS):
  linear layers  Llama-3 8B / 70B, Mixtral 8x7B, DeepSeek-V3, Qwen2.5-72B. For a layer in -> out at
                 T tokens: fwd  M=T,  N=out, K=in   (activations x weight)
                           dgrad M=T, N=in,  K=out  (grad of the input)
                           wgrad M=in, N=out, K=T   (grad of the weight, summed over tokens)
                 fwd and dgrad at T in {1, 8, 64, 512, 4096, 16384}; wgrad at T in {512, 4096, 16384}
                 (a weight gradient over 1..64 tokens is not a training shape). Mixtral's experts run
                 as dense per-expert GEMMs with ceil(T * 2 / 8) rows (top-2 of 8, routing taken as
                 perfectly balanced); DeepSeek-V3's attention is MLA's five projections and its MLP the
                 dense one of its first layers (its 256 routed experts are not modelled).
  attention      the two batched products attention runs outside a fused kernel, QK^T (s x d @ d x s)
                 and PV (s x s @ s x d), batch x heads in {8, 32, 128}, s in {64 .. 2048}, d in {64, 128}
                 (ATTENTION_BH_S x ATTENTION_D: 20 products), as torch.matmul / xgemm.matmul on 3-D arrays.
  dtypes         bf16 everywhere; fp16 at six spot checks (FP16_SPOT_CHECKS).
  Identical (M, N, K, batch, dtype) products are timed once; each record keeps every
  (model, layer, pass, tokens) it serves in "names". Operands are row-major A and B (the harness's
  inputs), whatever layout the framework would hand over.

Subsets (deterministic rules on a product's names, nested smoke < core < full; jit < full):
  full   every product.
  core   fwd at T in {1, 4096} (decode, prefill/training), dgrad and wgrad at T = 4096, attention
         at d = 128 and s >= 512, and the fp16 spot checks: every model and layer at the two token
         counts that matter most (79).
  smoke  SMOKE: ten named products, one of each kind (decode M = 1, N = 1024 and 576, big fwd, dgrad,
         wgrad, QK^T, PV, fp16), all in core.
  jit    bf16, Llama-3 8B fwd at T in {1, 4096} and its MLP's dgrad / wgrad at 4096, DeepSeek-V3 fwd
         at 4096, core's attention products (24). --jit-subset smoke: those also in smoke.

Timing (torch): _harness's Inputs (rotating sets > 2x L2, fp32 reference) extended to a batch dim;
every implementation captured in a CUDA graph of `reps` calls (reps >= the input sets, and enough
calls for ~2 ms per replay, at most 40), replayed in time_interleaved's balanced orders (--trials 18:
each of the 6 orders of the three implementations 3 times). The ratio is xgemm against the best
peer (the faster median of the verified cuBLAS and quack), per trial (paired_ratio: > 1 means
xgemm faster) with its 95% CI. Outputs are verified after timing (relative Frobenius error < 1e-2
against fp32): a wrong xgemm output makes the shape "wrong" (no ratio; it counts against the share),
a wrong peer is left out of the best peer.
Timing (jit): one jax.jit of `sets` independent products on rotating inputs (> 2x L2), so the
dispatch of a call is shared by `sets` GEMMs; wall clock of `calls` async calls and one block per
sample, xgemm's and XLA's samples interleaved (_harness.wall_interleaved), ratio per sample pair.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import _harness as h

STUDY = "model_shapes"
TOKENS = (1, 8, 64, 512, 4096, 16384)           # forward and dgrad
WGRAD_TOKENS = (512, 4096, 16384)               # weight gradients: training batches only
TOL = 1e-2                                      # relative Frobenius error against fp32 (the harness's bar)
GOOD, FLOOR = 0.98, 0.92                        # the plot's lines; the summary's shares


# ------------------------------------------------------------------------------------------
# the models (dims from each model's config.json on the Hugging Face hub)
# ------------------------------------------------------------------------------------------
def _llama_like(hidden, heads, kv_heads, head_dim, mlp):
    """(layer, in, out) of a Llama-style block: q/k/v/o and the MLP with gate and up fused."""
    return [("q_proj", hidden, heads * head_dim), ("k_proj", hidden, kv_heads * head_dim),
            ("v_proj", hidden, kv_heads * head_dim), ("o_proj", heads * head_dim, hidden),
            ("gate_up_proj", hidden, 2 * mlp), ("down_proj", mlp, hidden)]


# model -> ([(layer, in, out)], (top_k, experts) for the layers named "expert_*", else None)
MODELS = {
    # meta-llama/Meta-Llama-3-8B: hidden_size 4096, num_attention_heads 32, num_key_value_heads 8
    # (head_dim = 4096 / 32 = 128: q 4096, k and v 1024), intermediate_size 14336
    "llama3-8b": (_llama_like(4096, 32, 8, 128, 14336), None),
    # meta-llama/Meta-Llama-3-70B: hidden_size 8192, num_attention_heads 64, num_key_value_heads 8
    # (head_dim 128: q 8192, kv 1024), intermediate_size 28672
    "llama3-70b": (_llama_like(8192, 64, 8, 128, 28672), None),
    # mistralai/Mixtral-8x7B-v0.1: hidden_size 4096, num_attention_heads 32, num_key_value_heads 8,
    # intermediate_size 14336 (each expert's w1/w3, fused here, and w2), num_local_experts 8,
    # num_experts_per_tok 2
    "mixtral-8x7b": (_llama_like(4096, 32, 8, 128, 14336)[:4] + [
        ("expert_gate_up", 4096, 2 * 14336), ("expert_down", 14336, 4096)], (2, 8)),
    # deepseek-ai/DeepSeek-V3: hidden_size 7168, q_lora_rank 1536, kv_lora_rank 512,
    # num_attention_heads 128, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128,
    # intermediate_size 18432 (the dense MLP of the first first_k_dense_replace = 3 layers)
    "deepseek-v3": ([("q_a_proj", 7168, 1536),
                     ("q_b_proj", 1536, 128 * (128 + 64)),              # 24576
                     ("kv_a_proj_with_mqa", 7168, 512 + 64),            # 576
                     ("kv_b_proj", 512, 128 * (128 + 128)),             # 32768: k_nope and v
                     ("o_proj", 128 * 128, 7168),                       # 16384 -> 7168
                     ("gate_proj", 7168, 18432), ("up_proj", 7168, 18432), ("down_proj", 18432, 7168)], None),
    # Qwen/Qwen2.5-72B: hidden_size 8192, num_attention_heads 64, num_key_value_heads 8
    # (head_dim 128: q 8192, kv 1024), intermediate_size 29568
    "qwen2.5-72b": (_llama_like(8192, 64, 8, 128, 29568), None),
}

# attention outside a fused kernel: (batch x heads, sequence) x head dim x {QK^T, PV}
ATTENTION_BH_S = ((8, 2048), (32, 256), (32, 1024), (128, 64), (128, 512))
ATTENTION_D = (64, 128)

# (model, layer, pass, tokens) whose product is also timed in fp16
FP16_SPOT_CHECKS = (("llama3-8b", "q_proj", "fwd", 1), ("llama3-8b", "gate_up_proj", "fwd", 4096),
                    ("llama3-70b", "down_proj", "dgrad", 4096), ("deepseek-v3", "kv_a_proj_with_mqa", "fwd", 4096),
                    ("llama3-8b", "down_proj", "wgrad", 4096), ("attention", "QK^T d=128 bh=32", "fwd", 1024))

# (model, layer, pass, tokens, dtype): the smoke subset, one product of each kind, all in core
SMOKE = (("llama3-8b", "q_proj", "fwd", 1, "bfloat16"),                  # decode: M = 1
         ("llama3-8b", "k_proj", "fwd", 4096, "bfloat16"),               # N = 1024
         ("deepseek-v3", "kv_a_proj_with_mqa", "fwd", 4096, "bfloat16"),  # N = 576
         ("llama3-8b", "gate_up_proj", "fwd", 4096, "bfloat16"),         # a big forward
         ("llama3-8b", "down_proj", "dgrad", 4096, "bfloat16"),
         ("llama3-70b", "o_proj", "wgrad", 4096, "bfloat16"),
         ("attention", "QK^T d=128 bh=32", "fwd", 1024, "bfloat16"),
         ("attention", "PV d=128 bh=32", "fwd", 1024, "bfloat16"),
         ("llama3-8b", "q_proj", "fwd", 1, "float16"),
         ("attention", "QK^T d=128 bh=32", "fwd", 1024, "float16"))

SHORT = {"bfloat16": "bf16", "float16": "fp16"}


def _rows(tokens: int, layer: str, moe) -> int:
    """GEMM rows of a layer at `tokens` model tokens: an expert sees ceil(tokens * top_k / experts)."""
    if moe is not None and layer.startswith("expert_"):
        top_k, experts = moe
        return max(1, math.ceil(tokens * top_k / experts))
    return tokens


def _uses():
    """Every (use, (M, N, K, batch)) before dedup, bf16, in a fixed order."""
    out = []
    for model, (layers, moe) in MODELS.items():
        for layer, d_in, d_out in layers:
            for t in TOKENS:
                rows = _rows(t, layer, moe)
                out.append(((model, layer, "fwd", t), (rows, d_out, d_in, 1)))
                out.append(((model, layer, "dgrad", t), (rows, d_in, d_out, 1)))
            for t in WGRAD_TOKENS:
                out.append(((model, layer, "wgrad", t), (d_in, d_out, _rows(t, layer, moe), 1)))
    for d in ATTENTION_D:
        for bh, s in ATTENTION_BH_S:
            out.append((("attention", f"QK^T d={d} bh={bh}", "fwd", s), (s, s, d, bh)))
            out.append((("attention", f"PV d={d} bh={bh}", "fwd", s), (s, d, s, bh)))
    return out


def case_name(m, n, k, batch, dtype) -> str:
    return f"{SHORT[dtype]}_" + (f"{batch}x" if batch > 1 else "") + f"{m}x{n}x{k}"


def _in_core(use, dtype) -> bool:
    model, layer, pass_, t = use
    if dtype == "float16":
        return True                                  # the spot checks are all core products
    if model == "attention":
        return layer.split()[1] == "d=128" and t >= 512
    return (pass_ == "fwd" and t in (1, 4096)) or (pass_ in ("dgrad", "wgrad") and t == 4096)


def _in_jit(use, dtype) -> bool:
    model, layer, pass_, t = use
    if dtype != "bfloat16":
        return False
    if model == "attention":
        return _in_core(use, dtype)
    if model == "llama3-8b":
        return (pass_ == "fwd" and t in (1, 4096)) or (
            pass_ in ("dgrad", "wgrad") and t == 4096 and layer in ("gate_up_proj", "down_proj"))
    return model == "deepseek-v3" and pass_ == "fwd" and t == 4096


def shapes() -> list:
    """The deduplicated products, as dicts: case, M, N, K, batch, dtype, flops; model, layer, pass,
    tokens of the first use; names (every use: model, layer, pass, tokens); subsets (of smoke, core,
    full, jit)."""
    by_key = {}
    uses = [(use, dims, "bfloat16") for use, dims in _uses()]
    spot = set(FP16_SPOT_CHECKS)
    uses += [(use, dims, "float16") for use, dims in _uses() if use in spot]
    for use, (m, n, k, batch), dtype in uses:
        key = (m, n, k, batch, dtype)
        if key not in by_key:
            by_key[key] = {"case": case_name(m, n, k, batch, dtype), "M": m, "N": n, "K": k, "batch": batch,
                           "dtype": dtype, "flops": 2 * batch * m * n * k, "model": use[0], "layer": use[1],
                           "pass": use[2], "tokens": use[3], "names": [], "subsets": ["full"], "_uses": []}
        by_key[key]["names"].append({"model": use[0], "layer": use[1], "pass": use[2], "tokens": use[3]})
        by_key[key]["_uses"].append(use)
    smoke = set(SMOKE)
    records = []
    for (_, _, _, _, dtype), rec in by_key.items():
        used = rec.pop("_uses")
        if any(_in_core(u, dtype) for u in used):
            rec["subsets"].append("core")
        if any(u + (dtype,) in smoke for u in used):
            rec["subsets"].append("smoke")
        if any(_in_jit(u, dtype) for u in used):
            rec["subsets"].append("jit")
        records.append(rec)
    return records


def select(records, subset: str) -> list:
    """The records of a subset ("none": no records)."""
    return [r for r in records if subset in r["subsets"]]


def label(rec) -> str:
    """The first use, readable, with how many more the product serves."""
    more = len(rec["names"]) - 1
    return f"{rec['model']} {rec['layer']} {rec['pass']} T={rec['tokens']}" + (f" (+{more})" if more else "")


# ------------------------------------------------------------------------------------------
# time estimates (reps per graph, calls per jit sample, the --dry-run forecast)
# ------------------------------------------------------------------------------------------
SUSTAINED_FLOPS = 650e12     # bf16 dense on the H200 at large shapes (gemm-h200: 650-700 TFLOP/s)
HBM_BYTES_S = 3.3e12         # what a GEMM streams from HBM (of ~4.8 TB/s peak)
FLOOR_S = 3e-6               # a small GEMM replayed in a graph (gemm-h200: 128^3 in 2-2.6 us)
FP32_REF_FLOPS = 45e12       # the fp32 reference matmul (TF32 off: cuBLAS ~50 TFLOP/s)
GRAPH_S = 2e-3               # per graph replay: events resolve it well, the H200's clocks settle
MAX_REPS = 40
SHAPE_HOST_S = 0.15          # per shape: inputs, capture of 3 graphs, explain, verify, empty_cache
JIT_SAMPLE_S = 3e-3
JIT_COMPILE_S = 1.5          # two jits (xgemm's custom call, XLA with its GEMM autotuning)


def call_s(rec) -> float:
    """A rough kernel time: compute or HBM bound, plus the small-GEMM floor."""
    m, n, k, b = rec["M"], rec["N"], rec["K"], rec["batch"]
    return max(rec["flops"] / SUSTAINED_FLOPS, 2 * b * (m * k + k * n + m * n) / HBM_BYTES_S) + FLOOR_S


def input_sets(rec) -> int:
    """As _harness.Inputs: enough sets for > 2x L2, at most 8."""
    per = rec["batch"] * (rec["M"] * rec["K"] + rec["K"] * rec["N"] + rec["M"] * rec["N"]) * 2
    return max(1, min(8, math.ceil(2 * h.L2_BYTES / per)))


def reps_for(rec) -> int:
    """Calls per graph: every input set at least once (a replay never starts on the set the last
    replay left in L2), and ~GRAPH_S of work, at most MAX_REPS."""
    return max(input_sets(rec), min(MAX_REPS, math.ceil(GRAPH_S / call_s(rec))))


def estimate_s(rec, impls: int, trials: int) -> float:
    """Forecast H200 seconds of one shape in the torch part (kernel caches warm)."""
    t, reps = call_s(rec), reps_for(rec)
    return (SHAPE_HOST_S + rec["flops"] / FP32_REF_FLOPS + impls * 4 * t        # reference, warm-up calls
            + 0.1 + impls * reps * t * (trials + 1))                                # warm loop, trials


def jit_calls_for(rec) -> int:
    return max(1, min(50, math.ceil(JIT_SAMPLE_S / (input_sets(rec) * call_s(rec)))))


def jit_estimate_s(rec, samples: int) -> float:
    per_call = input_sets(rec) * call_s(rec)
    return JIT_COMPILE_S + rec["flops"] / FP32_REF_FLOPS + 2 * (samples + 2) * jit_calls_for(rec) * per_call


# ------------------------------------------------------------------------------------------
# torch: xgemm vs cuBLAS vs quack
# ------------------------------------------------------------------------------------------
class ProductInputs(h.Inputs):
    """_harness.Inputs with a batch dim: A (batch, M, K), B (batch, K, N), outputs (batch, M, N)
    (2-D when batch == 1), rotating through > 2x L2, the fp32 reference of set 0."""

    def __init__(self, rec, seed=0):
        m, n, k, batch = rec["M"], rec["N"], rec["K"], rec["batch"]
        self.out_shape = (m, n) if batch == 1 else (batch, m, n)
        if batch == 1:
            super().__init__(m, n, k, rec["dtype"], seed)
            return
        import torch
        dt = getattr(torch, rec["dtype"])
        self.out_dtype = dt
        self.sets = input_sets(rec)
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.a = [torch.randn(batch, m, k, generator=gen, device="cuda").to(dt) for _ in range(self.sets)]
        self.b = [torch.randn(batch, k, n, generator=gen, device="cuda").to(dt) for _ in range(self.sets)]
        self.d = {}
        self.ref = torch.matmul(self.a[0].float(), self.b[0].float())

    def out(self, impl, i):
        import torch
        key = (impl, i % self.sets)
        if key not in self.d:
            self.d[key] = torch.empty(self.out_shape, dtype=self.out_dtype, device="cuda")
        return self.d[key]


MAKERS = {"xgemm": h.impl_xgemm, "cublas": h.impl_cublas, "quack": h.impl_quack}
PEERS = ("cublas", "quack")


def plan_fields(plan) -> dict:
    """What a record keeps of xgemm.explain: kernel, policy summary and notes, copies."""
    return {"kernel": plan.kernel_name, "policy": plan.policy.summary(), "policy_notes": list(plan.policy.notes),
            "copies": list(plan.copies)}


def judge(rec, impls: dict, trial_times: dict, peers) -> None:
    """Status, best peer and ratios into rec (impls: name -> result dict, with "us" and "verified")."""
    ours = impls.get("xgemm", {})
    good_peers = [p for p in peers if impls.get(p, {}).get("verified")]
    rec.update(best_peer=None, ratio=None, ratio_ci=None, ratio_of_medians=None)
    if "us" not in ours:
        rec["status"] = "failed"
    elif not ours["verified"]:
        rec["status"] = "wrong"
    elif not good_peers:
        rec["status"] = "no_peer"
    else:
        best = min(good_peers, key=lambda p: impls[p]["us"])
        lo, mid, hi = h.paired_ratio(trial_times["xgemm"], trial_times[best])
        rec.update(status="ok", best_peer=best, ratio=round(mid, 4), ratio_ci=[round(lo, 4), round(hi, 4)],
                   ratio_of_medians=round(impls[best]["us"] / ours["us"], 4))


def time_torch(rec, impl_names, trials: int, warm_s: float) -> None:
    """Time one product with every implementation; results into rec."""
    import torch

    import xgemm
    x = ProductInputs(rec)
    reps = max(x.sets, reps_for(rec))
    rec.update(reps=reps, trials=trials, input_sets=x.sets)
    rec.update(plan_fields(xgemm.explain(x.a[0], x.b[0])))
    impls, ready = {}, []
    for name in impl_names:
        try:
            call, note = MAKERS[name](x)
            replay, how = h.capture(call, reps)
            ready.append((name, replay))
            impls[name] = {"timed_by": how, "note": note if name != "xgemm" else None}
        except Exception as exc:   # noqa: BLE001 - record the failure, keep going
            torch.cuda.synchronize()
            impls[name] = {"status": "failed", "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    trial_times = {}
    if ready:
        secs, per_trial = h.time_interleaved([r[1] for r in ready], reps, trials, warm_s=warm_s, per_trial=True)
        for (name, _), sec, times in zip(ready, secs, per_trial):
            rel = x.verify(name)
            ok = rel < TOL                       # NaN fails too
            impls[name].update(status="ok" if ok else "wrong", us=round(sec * 1e6, 3),
                               tflops=round(rec["flops"] / sec / 1e12, 2), verified=ok, rel_err=float(f"{rel:.3e}"))
            trial_times[name] = times
    rec["impls"] = {k: {f: v for f, v in d.items() if v is not None} for k, d in impls.items()}
    judge(rec, rec["impls"], trial_times, PEERS)
    del x, ready
    torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------
# jax.jit: xgemm.jax.matmul vs XLA's jnp.matmul
# ------------------------------------------------------------------------------------------
def lowered_to(text: str) -> str:
    """What xgemm's jit call lowered to (the custom call targets, as benchmarks/jax_jit.py reads them)."""
    return ("ffi-cubin" if "xgemm_cubin_launch" in text else "ffi-tvm" if "xgemm_tvm_ffi_call" in text else
            "cutlass_call" if "CuteDSLRT" in text or "cutlass_call" in text else "xla")


def time_jit(rec, samples: int, kernel_time: bool = False) -> None:
    """Time one product in jax.jit, xgemm against XLA; results into rec. kernel_time: also each
    one's GPU time inside the jitted call (kernel_time_in_jit), beside the wall clock it is judged on."""
    import jax
    import jax.numpy as jnp

    import xgemm.jax as xj
    m, n, k, batch = rec["M"], rec["N"], rec["K"], rec["batch"]
    lead = () if batch == 1 else (batch,)
    dt = getattr(jnp, rec["dtype"])
    sets = input_sets(rec)
    key = jax.random.key(0)
    a_sets = tuple(jax.random.normal(jax.random.fold_in(key, 2 * i), lead + (m, k), dt) for i in range(sets))
    b_sets = tuple(jax.random.normal(jax.random.fold_in(key, 2 * i + 1), lead + (k, n), dt) for i in range(sets))

    def products(mm):    # `sets` independent GEMMs per call: one dispatch serves them all
        return jax.jit(lambda As, Bs: tuple(mm(a, b) for a, b in zip(As, Bs)))
    fns = {"xgemm": products(xj.matmul), "xla": products(h.xla_matmul)}
    calls = jit_calls_for(rec)
    rec.update(input_sets=sets, calls=calls, samples=samples)
    rec.update(plan_fields(xj.explain_gemm(a_sets[0], b_sets[0])))
    ref = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))(a_sets[0], b_sets[0])
    ref_norm = float(jnp.linalg.norm(ref))
    impls, ready = {}, []
    for name, fn in fns.items():
        try:
            if name == "xgemm":
                rec["lowering"] = lowered_to(fn.lower(a_sets, b_sets).as_text())
            got = fn(a_sets, b_sets)[0]
            rel = float(jnp.linalg.norm(got.astype(jnp.float32) - ref)) / ref_norm
            ok = rel < TOL
            impls[name] = {"status": "ok" if ok else "wrong", "verified": ok, "rel_err": float(f"{rel:.3e}")}
            ready.append((name, fn))
        except Exception as exc:   # noqa: BLE001
            impls[name] = {"status": "failed", "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    times = {}
    if ready:
        # median=list: every sample (per jit call), paired across fns by round
        per_sample = h.wall_interleaved([f for _, f in ready], a_sets, b_sets, calls=calls, warmup=2, reps=samples,
                                        block=jax.block_until_ready, median=list)
        for (name, _), secs in zip(ready, per_sample):
            per_gemm = [s / sets for s in secs]
            sec = h.upper_median(per_gemm)
            impls[name].update(us=round(sec * 1e6, 3), tflops=round(rec["flops"] / sec / 1e12, 2))
            times[name] = per_gemm
        for name, fn in ready if kernel_time else ():
            impls[name].update(kernel_time_in_jit(fn, a_sets, b_sets))
    rec["impls"] = impls
    judge(rec, impls, times, ("xla",))


JIT_PROFILED_CALLS = 3


def kernel_time_in_jit(fn, a_sets, b_sets) -> dict:
    """What the GPU ran for JIT_PROFILED_CALLS calls of a jitted fn of len(a_sets) products, under
    torch.profiler (CUPTI sees XLA's launches too): per product, the summed kernel time
    (kernel_us), first start to last end (span_us: the gaps between kernels too), and the kernels a
    call launches, by name. Where the jit wall clock and these part, the difference is dispatch."""
    import jax
    outs = []
    try:
        events = h.gpu_events(lambda: outs.extend(fn(a_sets, b_sets) for _ in range(JIT_PROFILED_CALLS)),
                              lambda: jax.block_until_ready(outs), cats=("kernel",))
    except Exception as exc:   # noqa: BLE001 -- a diagnostic: the wall clock still judges the shape
        return {"kernel_us": None, "kernels": f"profiler failed: {type(exc).__name__}: {str(exc)[:200]}"}
    return kernel_summary(events, JIT_PROFILED_CALLS, len(a_sets))


def kernel_summary(events, calls: int, sets: int) -> dict:
    """kernel_time_in_jit's figures from the kernel events of `calls` calls of `sets` products."""
    if not events:
        return {"kernel_us": None, "kernels": "none seen (CUPTI)"}
    products = calls * sets
    span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
    names = {}
    for e in events:
        names[e["name"][:60]] = names.get(e["name"][:60], 0) + 1
    return {"kernel_us": round(sum(e["dur"] for e in events) / products, 3), "span_us": round(span / products, 3),
            "kernels": {n: c / calls for n, c in names.items()}}


# ------------------------------------------------------------------------------------------
# results: summary, JSON, PNG, markdown
# ------------------------------------------------------------------------------------------
def summarize(records, part: str) -> dict:
    """Share of shapes at ratio >= 0.98 (and >= 0.92) and the min ratio. A wrong or failed xgemm
    counts as a miss; a shape with no verified peer, or skipped, is left out of the shares."""
    rs = [r for r in records if r.get("part") == part]
    judged = [r for r in rs if r.get("status") in ("ok", "wrong", "failed")]
    ok = [r for r in judged if r["status"] == "ok"]
    count = lambda s: sum(r.get("status") == s for r in rs)
    out = {"shapes": len(rs), "judged": len(judged), "ok": len(ok)}
    out.update({status: count(status) for status in ("wrong", "failed", "no_peer", "error", "skipped")})
    if judged:
        out["share_ge_0.98"] = round(sum(r["ratio"] >= GOOD for r in ok) / len(judged), 4)
        out["share_ge_0.92"] = round(sum(r["ratio"] >= FLOOR for r in ok) / len(judged), 4)
    if ok:
        worst = min(ok, key=lambda r: r["ratio"])
        out.update(min_ratio=worst["ratio"], min_case=worst["case"], min_label=label(worst),
                   geomean_ratio=round(math.exp(sum(math.log(r["ratio"]) for r in ok) / len(ok)), 4))
    return out


def summary_line(s: dict) -> str:
    """A summarize() dict in one line."""
    if not s.get("judged"):
        return f"{s['shapes']} shapes, none judged ({s['no_peer']} without a verified peer, {s['skipped']} skipped)"
    text = (f"{s['judged']} shapes judged: {100 * s['share_ge_0.98']:.0f}% at >= {GOOD}, "
            f"{100 * s['share_ge_0.92']:.0f}% at >= {FLOOR}")
    if "min_ratio" in s:
        text += f", min {s['min_ratio']:.3f} ({s['min_case']}), geomean {s['geomean_ratio']:.3f}"
    extra = [f"{s[k]} {k}" for k in ("wrong", "failed", "no_peer", "error", "skipped") if s[k]]
    return text + (f"; {', '.join(extra)}" if extra else "")


def write_results(path: Path, meta: dict, records) -> None:
    meta = dict(meta, summary={"torch_vs_best_peer": summarize(records, "torch"),
                               "jit_vs_xla": summarize(records, "jit")})
    h.write_json(path, [{"meta": meta}] + list(records))


def load(path: Path):
    data = json.loads(Path(path).read_text())
    meta = next((r["meta"] for r in data if "meta" in r), {})
    return meta, [r for r in data if "meta" not in r]


def _kind(rec) -> str:
    return "attention" if rec["batch"] > 1 else rec["pass"]


def render(json_path: Path, out: Path) -> tuple:
    """PNG (ratio per shape, sorted, 0.98 and 0.92 lines; one panel per part) and a markdown table."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    meta, records = load(json_path)
    parts = [(p, title) for p, title in (("torch", "xgemm / best of cuBLAS, quack (CUDA graphs)"),
                                         ("jit", "xgemm / XLA inside jax.jit"))
             if any(r.get("part") == p for r in records)]
    colors = {"fwd": "tab:blue", "dgrad": "tab:orange", "wgrad": "tab:green", "attention": "tab:purple"}
    fig, axes = plt.subplots(1, max(1, len(parts)), figsize=(15, 5.5), squeeze=False,
                             width_ratios=[3, 1] if len(parts) == 2 else None)
    for ax, (part, title) in zip(axes[0], parts):
        rs = [r for r in records if r.get("part") == part]
        ok = sorted((r for r in rs if r.get("status") == "ok"), key=lambda r: r["ratio"])
        bad = [r for r in rs if r.get("status") in ("wrong", "failed")]
        ys = [r["ratio"] for r in ok]
        lo = min([FLOOR - 0.05] + [r["ratio_ci"][0] for r in ok])
        for kind, color in colors.items():
            for dtype, marker in (("bfloat16", "o"), ("float16", "s")):
                idx = [i for i, r in enumerate(ok) if _kind(r) == kind and r["dtype"] == dtype]
                if not idx:
                    continue
                err = [[ok[i]["ratio"] - ok[i]["ratio_ci"][0] for i in idx],
                       [ok[i]["ratio_ci"][1] - ok[i]["ratio"] for i in idx]]
                ax.errorbar([len(bad) + i for i in idx], [ys[i] for i in idx], yerr=err, fmt=marker, ms=4,
                            color=color, ecolor=color, elinewidth=0.8, label=f"{kind} {SHORT[dtype]}")
        if bad:
            ax.plot(range(len(bad)), [lo] * len(bad), "x", color="red", ms=8, label="wrong / failed")
        ax.axhline(GOOD, color="k", ls="--", lw=1, label=f"{GOOD}")
        ax.axhline(FLOOR, color="gray", ls=":", lw=1, label=f"{FLOOR}")
        s = summarize(records, part)
        ax.set_title(f"{title}\n{s['judged']} shapes: {100 * s.get('share_ge_0.98', 0):.0f}% >= {GOOD}, "
                     f"{100 * s.get('share_ge_0.92', 0):.0f}% >= {FLOOR}, min {s.get('min_ratio', float('nan')):.3f}"
                     + (f", {len(bad)} wrong/failed" if bad else ""), fontsize=9)
        ax.set_xlabel("shapes, sorted by ratio")
        ax.set_ylabel("ratio (> 1: xgemm faster), per-trial median, 95% CI")
        ax.set_ylim(bottom=lo - 0.02)
        if len(rs) <= 30:
            ax.set_xticks(range(len(bad) + len(ok)), [r["case"] for r in bad + ok], rotation=70, ha="right",
                          fontsize=6)
        else:                                    # too many to label: name the worst few
            ax.set_xticks([])
            for i, r in enumerate(ok[:4]):
                ax.annotate(r["case"], (len(bad) + i, r["ratio"]), fontsize=6, xytext=(6, -4 - 9 * i),
                            textcoords="offset points")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"GEMMs of LLM layers on {meta.get('gpu', 'the H200')} ({meta.get('date', '')})", fontsize=10)
    fig.tight_layout()
    png = h.result_path(STUDY, "png", out)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    md = h.write_text(h.result_path(STUDY, "md", out), markdown(meta, records))
    return png, md


def markdown(meta, records) -> str:
    lines = [f"# GEMMs of LLM layers on {meta.get('gpu', 'the H200')} ({meta.get('date', '')})", "",
             (f"`{meta.get('command', '')}`. Ratio: the peer's time over xgemm's per trial (> 1: xgemm faster), "
              "median and 95% CI, against the best verified peer."), ""]
    for part, peers in (("torch", ("xgemm", "cublas", "quack")), ("jit", ("xgemm", "xla"))):
        rs = [r for r in records if r.get("part") == part]
        if not rs:
            continue
        s = summarize(records, part)
        lines += [f"## {part}: {summary_line(s)}", "",
                  "| case | first use | uses | " + " | ".join(f"{p} us" for p in peers)
                  + " | ratio (CI) | vs | kernel | status |", "|" + "---|" * (len(peers) + 7)]
        for r in sorted(rs, key=lambda r: (r.get("ratio") is not None, r.get("ratio") or 0)):
            cells = []
            for p in peers:
                d = r.get("impls", {}).get(p, {})
                cells.append(f"{d['us']:.1f}" + ("" if d.get("verified") else " WRONG")
                             + (f" (kernels {d['kernel_us']:.1f})" if d.get("kernel_us") else "") if "us" in d
                             else d.get("status", "-"))
            ratio = f"{r['ratio']:.3f} ({r['ratio_ci'][0]:.3f}-{r['ratio_ci'][1]:.3f})" if r.get("ratio") else "-"
            lines.append(f"| {r['case']} | {label(r)} | {len(r['names'])} | " + " | ".join(cells)
                         + f" | {ratio} | {r.get('best_peer') or '-'} | {r.get('kernel', '')} | {r.get('status')} |")
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# run
# ------------------------------------------------------------------------------------------
def dry_run(torch_recs, jit_recs, args, impls) -> None:
    """The chosen shapes with explain() on CPU tensors (uninitialized: nothing is computed), FLOPs,
    and the forecast time."""
    import torch

    import xgemm
    print(f"{'#':>4} {'case':28s} {'GFLOP':>9} {'est us':>8} {'subsets':22s} {'kernel':10s} policy | first use (+more)")
    for i, rec in enumerate(torch_recs):
        lead = () if rec["batch"] == 1 else (rec["batch"],)
        dt = getattr(torch, rec["dtype"])
        a = torch.empty(lead + (rec["M"], rec["K"]), dtype=dt)
        b = torch.empty(lead + (rec["K"], rec["N"]), dtype=dt)
        plan = xgemm.explain(a, b)
        print(f"{i + 1:4d} {rec['case']:28s} {rec['flops'] / 1e9:9.2f} {call_s(rec) * 1e6:8.1f} "
              f"{','.join(rec['subsets']):22s} {plan.kernel_name:10s} {plan.policy.summary()} | {label(rec)}")
    if jit_recs:
        print(f"jax.jit part ({len(jit_recs)}):")
    for i, rec in enumerate(jit_recs):
        print(f"{i + 1:4d} {rec['case']:28s} {rec['flops'] / 1e9:9.2f} {call_s(rec) * 1e6:8.1f} "
              f"x {input_sets(rec)} per call, {jit_calls_for(rec)} calls per sample | {label(rec)}")
    forecast(torch_recs, jit_recs, args, impls)


def forecast(torch_recs, jit_recs, args, impls) -> None:
    t_torch = sum(estimate_s(r, len(impls), args.trials) for r in torch_recs)
    t_jit = sum(jit_estimate_s(r, args.jit_samples) for r in jit_recs)
    print(f"{len(torch_recs)} shapes (--subset {args.subset}), {len(jit_recs)} jit shapes (--jit-subset "
          f"{args.jit_subset}); forecast on an H200 with warm kernel caches: torch {t_torch:.0f} s, jit {t_jit:.0f} s "
          f"(+ ~10 s imports and CUDA init; compiles not included)")


def meta_of(args, impls) -> dict:
    import torch

    import xgemm
    versions = h.versions(("torch", "jax", "jaxlib", "quack", "cutlass", "triton"))
    versions["xgemm"] = xgemm.__version__
    return {"study": STUDY, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(0), "versions": versions, "python": platform.python_version(),
            "command": " ".join([sys.executable] + sys.argv), "impls": list(impls),
            "subset": args.subset, "jit_subset": args.jit_subset, "tolerance": TOL,
            "timing_torch": h.timing_note(f"~{GRAPH_S * 1e3:g} ms per replay, >= the input sets, <= {MAX_REPS}",
                                          args.trials),
            "timing_jit": f"wall clock, `calls` async jit calls of `input_sets` products + one block per sample, "
                          f"{args.jit_samples} samples, xgemm's and XLA's interleaved",
            "ratio": "peer time / xgemm time per trial (> 1: xgemm faster) against the best verified peer; "
                     "median and 95% CI (_harness.paired_ratio)",
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "xgemm_cache": os.environ.get("XGEMM_CACHE_DIR", "~/.cache/xgemm"), "notes": []}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subset", choices=("none", "smoke", "core", "full"), default="core",
                    help="the torch part's shapes (none: only the jit part)")
    ap.add_argument("--jit-subset", choices=("none", "smoke", "jit"), default="jit",
                    help="the jax.jit part's shapes (smoke: the jit shapes also in smoke)")
    ap.add_argument("--impls", default="xgemm,cublas,quack", help="torch part (quack is dropped when not importable)")
    ap.add_argument("--trials", type=int, default=18, help="replays per implementation (a multiple of 6 balances "
                    "the orders of three implementations)")
    ap.add_argument("--jit-samples", type=int, default=12, help="wall-clock samples per jit implementation")
    ap.add_argument("--jit-kernel-time", action="store_true",
                    help="also each jit implementation's GPU kernel time (torch.profiler, CUPTI; a few s a shape)")
    ap.add_argument("--budget-s", type=float, default=0, help="stop timing after this many seconds (0: no limit); "
                    "shapes not reached are recorded as skipped")
    ap.add_argument("--out", default=str(h.RESULTS), help="results folder")
    ap.add_argument("--json", default="", help="--render: the JSON to read (default: the one in --out)")
    ap.add_argument("--dry-run", action="store_true", help="list the shapes with explain() on CPU tensors, no timing")
    ap.add_argument("--render", action="store_true", help="only render the PNG and table from the JSON")
    args = ap.parse_args(argv)
    out = Path(args.out)
    json_path = h.result_path(STUDY, "json", out)
    if args.render:
        png, md = render(Path(args.json) if args.json else json_path, out)
        print(f"wrote {png} and {md}")
        return 0

    records = shapes()
    torch_recs = select(records, args.subset)
    jit_pool = select(records, "jit")
    jit_recs = [] if args.jit_subset == "none" else (
        jit_pool if args.jit_subset == "jit" else [r for r in jit_pool if "smoke" in r["subsets"]])
    impls = [i for i in args.impls.split(",") if i]
    counts = ", ".join(f"{s} {len(select(records, s))}" for s in ("smoke", "core", "full", "jit"))
    print(f"{len(records)} products in all ({counts}); this run: {len(torch_recs)} + {len(jit_recs)} jit")
    if args.dry_run:            # the forecast assumes every requested peer (quack too) runs on the H200
        dry_run(torch_recs, jit_recs, args, impls)
        return 0
    if "quack" in impls and importlib.util.find_spec("quack") is None:
        impls.remove("quack")
        print("quack is not importable: timing without it")
    # before anything starts JAX's backend: JAX shares the GPU with torch (no 75% preallocation)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    forecast(torch_recs, jit_recs, args, impls)
    return measure(torch_recs, jit_recs, args, impls, json_path, out)


def measure(torch_recs, jit_recs, args, impls, json_path: Path, out: Path) -> int:
    meta = meta_of(args, impls)
    done = []
    t0 = time.perf_counter()
    todo = [("torch", r) for r in torch_recs] + [("jit", r) for r in jit_recs]
    jit_ready = False
    for i, (part, shape) in enumerate(todo):
        rec = dict(shape, part=part)
        if args.budget_s and time.perf_counter() - t0 > args.budget_s:
            if not any(r.get("status") == "skipped" for r in done):
                print(f"--budget-s {args.budget_s:g} spent: the {len(todo) - i} shapes left are recorded as skipped")
            rec["status"] = "skipped"
            done.append(rec)
            continue
        rec["window"] = [round(time.time(), 1), None]    # Unix s: to match the GPU clock samples of a perf.sh call
        try:
            if part == "torch":
                # the clocks are up after the first shape: a short warm loop keeps them there
                time_torch(rec, impls, args.trials, warm_s=1.0 if i == 0 else 0.1)
            else:
                if not jit_ready:       # give JAX the memory torch's allocator keeps cached
                    import torch
                    torch.cuda.empty_cache()
                    jit_ready = True
                time_jit(rec, args.jit_samples, args.jit_kernel_time)
        except Exception as exc:   # noqa: BLE001 - e.g. out of memory making inputs: report, go on
            rec.update(status="error", error=f"{type(exc).__name__}: {str(exc)[:300]}")
            release_cached_memory()
        rec["window"][1] = round(time.time(), 1)
        done.append(rec)
        print(line(i, len(todo), rec, time.perf_counter() - t0), flush=True)
        write_results(json_path, meta, done)
    meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
    write_results(json_path, meta, done)
    for part in ("torch", "jit"):
        print(f"summary {part} ({'vs best of cuBLAS, quack' if part == 'torch' else 'vs XLA'}): "
              f"{summary_line(summarize(done, part))}")
    for text in jit_kernel_lines(done) if args.jit_kernel_time else ():
        print(text)
    try:
        png, md = render(json_path, out)
        print(f"wrote {json_path}, {png}, {md} ({meta['elapsed_s']} s)")
    except Exception as exc:   # noqa: BLE001 - the JSON stands; --render makes the rest anywhere
        print(f"wrote {json_path} ({meta['elapsed_s']} s); rendering failed ({exc!r}): run --render")
    return 0


def jit_kernel_lines(records) -> list:
    """Per jit shape, each implementation's wall clock beside its GPU kernel time and span (us a
    product), and xgemm's eager time where the torch part ran the shape: which of kernel, gaps or
    dispatch makes a jit ratio."""
    eager = {r["case"]: r["impls"]["xgemm"].get("us") for r in records
             if r["part"] == "torch" and "xgemm" in r.get("impls", {})}
    out = []
    for r in records:
        if r["part"] != "jit" or "impls" not in r:
            continue
        cols = [f"{name} wall {d.get('us')} kernel {d.get('kernel_us')} span {d.get('span_us')}"
                for name, d in r["impls"].items()]
        out.append(f"jit kernel time {r['case']}: " + " | ".join(cols)
                   + (f" | xgemm eager {eager[r['case']]}" if r["case"] in eager else ""))
    return out


def release_cached_memory() -> None:
    """Best effort after a failed shape: what torch's allocator holds goes back (a broken CUDA context
    raises here too; the next shapes then report their own errors)."""
    try:
        import torch
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception as exc:   # noqa: BLE001
        print(f"releasing memory after the error failed too: {exc!r}")


def line(i, total, rec, elapsed) -> str:
    """One progress line: the shape, each implementation's TFLOP/s, the ratio, xgemm's kernel."""
    impls = " ".join(f"{n} {d['tflops']:.1f}" + ("" if d.get("verified") else "(WRONG)") if "tflops" in d
                     else f"{n} {d.get('status', '?').upper()}" for n, d in rec.get("impls", {}).items())
    ratio = (f"{rec['ratio']:.3f} ({rec['ratio_ci'][0]:.3f}-{rec['ratio_ci'][1]:.3f}) vs {rec['best_peer']}"
             if rec.get("ratio") else rec.get("status", "?").upper())
    return (f"[{i + 1:3d}/{total} {elapsed:5.0f}s] {rec['part']:5s} {rec['case']:26s} {label(rec)[:48]:48s} "
            f"TFLOP/s: {impls} | {ratio} | {rec.get('kernel', '')} {rec.get('lowering', '')} "
            f"{rec.get('error', '')}")


if __name__ == "__main__":
    sys.exit(main())
