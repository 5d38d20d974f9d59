"""bf16 GEMMs whose rows are not 16-byte multiples inside jax.jit: xgemm (K and N zero-padded by
XLA, then the tensor-core kernel, then a slice of D) vs jnp.matmul (XLA's dot), same process.

    python benchmarks/jax_unaligned.py [--shapes 4096x50257x4096,8191x8191x8191] [--out FILE]   (on the H200)

Timing: wall clock around 20 async calls of the jitted function and one block, median of 9
samples, xgemm's and XLA's samples interleaved (JAX runs on its own stream). Every output is
checked against jnp.matmul in float32 (relative Frobenius error < 1e-2).
"""
from __future__ import annotations

import argparse
import statistics
import sys

import jax
import jax.numpy as jnp

import _harness as h

CALLS, SAMPLES = 20, 9


def timed(f, *args) -> float:
    """One sample: a warm call, then CALLS async calls and one block, seconds per call."""
    return h.wall_median(f, *args, calls=CALLS, warmup=1, reps=1, block=jax.block_until_ready)


def main() -> int:
    import xgemm.jax as xj
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x50257x4096,8191x8191x8191,2500x2500x2500,1024x1000x999")
    ap.add_argument("--out", default=str(h.result_path("jax_unaligned")), help="JSON file ('' for none)")
    args = ap.parse_args()
    dev = jax.devices("cuda")[0]
    impls = {"xgemm": jax.jit(xj.matmul), "xla": jax.jit(h.xla_matmul)}
    records = []
    for m, n, k in (tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")):
        ka, kb = jax.random.split(jax.random.PRNGKey(0))
        a = jax.device_put(jax.random.normal(ka, (m, k), jnp.float32).astype(jnp.bfloat16), dev)
        b = jax.device_put(jax.random.normal(kb, (k, n), jnp.float32).astype(jnp.bfloat16), dev)
        ref = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32))
        times = {name: [] for name in impls}
        for _ in range(SAMPLES):
            for name, f in impls.items():
                times[name].append(timed(f, a, b))
        plan = xj.explain_gemm(a, b)
        for name, f in impls.items():
            d = f(a, b).astype(jnp.float32)
            rel = float(jnp.linalg.norm(d - ref) / jnp.linalg.norm(ref))
            sec = statistics.median(times[name])
            tf = 2 * m * n * k / sec / 1e12
            print(f"{m}x{n}x{k} {name:6s} {tf:7.1f} TFLOP/s {sec * 1e6:9.1f} us  rel {rel:.1e} "
                  f"{'ok' if rel < 1e-2 else 'WRONG'}" + (f"  {plan.kernel_name}: {'; '.join(plan.copies)}"
                                                          if name == "xgemm" else ""))
            records.append({"case": f"gemm_bf16_{m}x{n}x{k}_jit", "shape": [m, n, k], "dtype": "bfloat16",
                            "impl": name, "metric": "TFLOP/s", "value": round(tf, 1), "verified": rel < 1e-2})
    if args.out:
        meta = {"meta": {"gpu": dev.device_kind, "jax": jax.__version__, "command": " ".join(sys.argv),
                         "timing": f"wall clock of {CALLS} async jit calls + one block, median of {SAMPLES}, "
                                   "implementations interleaved"}}
        h.write_json(args.out, records + [meta])
    return 0


if __name__ == "__main__":
    sys.exit(main())
