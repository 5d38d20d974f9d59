"""Issue 6: xgemm.matmul and xgemm.softmax inside jax.jit with inputs sharded over every device.

    python benchmarks/multi_gpu.py --out DIR                 # on nvidia-h200-x2 (or larger)
    python benchmarks/multi_gpu.py --smoke                   # CPU, with fake devices (the CI test)
    python benchmarks/multi_gpu.py --k-reductions ring,scatter,all_reduce   # each K-sum strategy too

For each sharding (row-sharded A, column-sharded B, K-sharded with the reduction to a replicated
result, and K-sharded with the result asked for row-sharded) and for softmax (rows sharded): values
against a single-device reference, the HLO checked for no all-gather of the operands (rows / cols;
a K sum gathers its result, and tests/test_jax_sharding.py checks the operands stay sharded), and
per-device TFLOP/s (GB/s) next to jnp.matmul / jax.nn.softmax under the same
sharding and next to xgemm on one device, all in the same process. Timing: wall clock around
`block_until_ready` of a few async calls (MATMUL_CALLS, SOFTMAX_CALLS), median of repeats after
warm-up, xgemm's and XLA's repeats interleaved.
Writes multi_gpu-h200.json (the issue's record format) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import _harness as h
from _harness import wall_interleaved as interleaved, wall_median as median_s

MATMUL_CALLS, SOFTMAX_CALLS = 3, 10       # async calls per timed sample (~20 ms of work either way)


def profile(fn, args, where: str) -> str:
    """One call of fn under jax.profiler; returns a per-device timeline of the GPU ops (perfetto
    trace), to see whether the ring's transfers run under the GEMMs."""
    import glob
    import gzip
    import jax
    os.makedirs(where, exist_ok=True)
    with jax.profiler.trace(where, create_perfetto_trace=True):
        fn(*args).block_until_ready()
    files = glob.glob(os.path.join(where, "**", "*.json.gz"), recursive=True)
    if not files:
        return "no perfetto trace written"
    trace = json.loads(gzip.open(files[0]).read())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {(e.get("pid"), e.get("tid")): e["args"].get("name") for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    procs = {e.get("pid"): e["args"].get("name") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    ops = [e for e in events if e.get("ph") == "X" and "gpu" in str(procs.get(e.get("pid"), "")).lower()]
    if not ops:
        return "no GPU events in the trace (processes: %s)" % sorted(set(map(str, procs.values())))[:8]
    t0 = min(e["ts"] for e in ops)
    lines = []
    for e in sorted(ops, key=lambda e: (e.get("pid"), e["ts"])):
        lines.append(f"{procs.get(e.get('pid'))!s:.24} | {names.get((e.get('pid'), e.get('tid')))!s:.28} | "
                     f"{e['ts'] - t0:10.1f} us +{e.get('dur', 0):9.1f} | {e.get('name', '')[:70]}")
    return "\n".join(lines[:400])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(h.RESULTS))
    ap.add_argument("--smoke", action="store_true", help="small shapes on 2 fake CPU devices")
    ap.add_argument("--size", type=int, default=16384, help="M = N = K of the bf16 matmul")
    ap.add_argument("--rows", type=int, default=2 ** 15)
    ap.add_argument("--cols", type=int, default=2 ** 16)
    ap.add_argument("--k-reductions", type=lambda v: [x for x in v.split(",") if x], default=[],
                    help="K-sharded matmul: also time these jax_sharding.K_REDUCTION strategies")
    ap.add_argument("--cases", type=lambda v: v.split(","), default="rows,cols,k,k_to_rows,softmax".split(","),
                    help="which of rows,cols,k,k_to_rows,softmax to run (all by default)")
    ap.add_argument("--k-reduction", default="", help="jax_sharding.K_REDUCTION for the main K-sharded runs")
    ap.add_argument("--ring-sm-margin", type=int, default=None,
                    help="jax_sharding.K_RING_SM_MARGIN: SMs the K ring's GEMMs leave to NCCL (default: its own)")
    ap.add_argument("--ring-transport", default="", help="jax_sharding.K_RING_TRANSPORT for the main runs "
                                                         "(auto | copy_engine | nccl; default: its own)")
    ap.add_argument("--ring-transports", type=lambda v: [x for x in v.split(",") if x], default=[],
                    help="K-sharded matmul: also time the ring with these K_RING_TRANSPORTs")
    ap.add_argument("--ring-chunks", type=int, default=None, help="jax_sharding.K_RING_CHUNKS (default: its own)")
    ap.add_argument("--nccl-max-ctas", type=int, default=0,
                    help="set NCCL_MAX_CTAS / NCCL_MAX_NCHANNELS (every collective of the process, XLA's too)")
    ap.add_argument("--profile", default="", help="a folder: profile one K-sharded xgemm call there "
                                                  "and write its GPU timeline (timeline_<case>.txt)")
    args = ap.parse_args()
    if args.nccl_max_ctas:    # confine NCCL's kernels (all collectives of this process, XLA's too)
        for var in ("NCCL_MAX_CTAS", "NCCL_MAX_NCHANNELS"):
            os.environ[var] = str(args.nccl_max_ctas)
    if args.smoke:
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
        os.environ["JAX_PLATFORMS"] = "cpu"
        args.size, args.rows, args.cols = 64, 32, 256
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import xgemm
    from xgemm.jax import sharding as jax_sharding
    if args.ring_sm_margin is not None:
        jax_sharding.K_RING_SM_MARGIN = args.ring_sm_margin
    if args.k_reduction:
        jax_sharding.K_REDUCTION = args.k_reduction
    if args.ring_transport:
        jax_sharding.K_RING_TRANSPORT = args.ring_transport
    if args.ring_chunks is not None:
        jax_sharding.K_RING_CHUNKS = args.ring_chunks

    devices = jax.devices()
    n = len(devices)
    if n < 2:
        print(f"needs 2 or more devices, found {n}", file=sys.stderr)
        return 2
    mesh = Mesh(np.array(devices), ("d",))
    put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))
    one = lambda x: jax.device_put(x, devices[0])
    dtype = jnp.float32 if args.smoke else jnp.bfloat16
    records, rows = [], []

    def record(case, shape, dt, impl, metric, value, verified, **extra):
        records.append(dict(case=case, shape=list(shape), dtype=dt, impl=impl, metric=metric,
                            value=float(value), verified=bool(verified), **extra))
        rows.append(f"| {case} | {impl} | {value:9.1f} {metric} | {verified} |")

    # ---- matmul
    s = args.size
    ka, kb = jax.random.split(jax.random.PRNGKey(0))
    # integers in [-5, 5]: exact in fp32 accumulation at any K, so sharded and single-device agree exactly
    A = jax.random.randint(ka, (s, s), -5, 6).astype(dtype)
    B = jax.random.randint(kb, (s, s), -5, 6).astype(dtype)
    xg = jax.jit(lambda a, b: xgemm.matmul(a, b))
    xla = jax.jit(h.xla_matmul_f32acc)
    flops = 2.0 * s ** 3
    a1, b1 = one(A), one(B)
    # values are checked on device 0 (the arrays are GiBs: no trip through NumPy)
    same = jax.jit(lambda x, y: jnp.array_equal(x.astype(jnp.float32), y.astype(jnp.float32)))
    ref = xla(a1, b1)
    t1 = median_s(xg, a1, b1, calls=MATMUL_CALLS)
    ok1 = bool(same(xg(a1, b1), ref))
    dt = "fp32" if args.smoke else "bf16"
    record(f"matmul_{dt}_{s}^3_one_device", (s, s, s), dt, "xgemm", "TFLOP/s", flops / t1 / 1e12, ok1)
    # "k_to_rows": K-sharded operands, the result asked for row-sharded (out_shardings), so the
    # reduction is a reduce-scatter for both xgemm and XLA
    for name, sa, sb, so in (("rows", P("d", None), P(), None), ("cols", P(), P(None, "d"), None),
                             ("k", P(None, "d"), P("d", None), None),
                             ("k_to_rows", P(None, "d"), P("d", None), P("d", None))):
        if name not in args.cases:
            continue
        a, b = put(A, sa), put(B, sb)
        outs = None if so is None else NamedSharding(mesh, so)
        fx = jax.jit(lambda a, b: xgemm.matmul(a, b), out_shardings=outs)
        fj = jax.jit(h.xla_matmul_f32acc, out_shardings=outs)
        hlo = fx.lower(a, b).compile().as_text()
        gathers = hlo.count("all-gather(") if name in ("rows", "cols") else None   # K sums gather the result
        # how the K sum moved: xgemm's copy-engine exchanges vs XLA collective-permutes
        moves = {"exchanges": hlo.count("xgemm_exchange_v1"), "collective_permutes": hlo.count("collective-permute-start")
                 + hlo.count("collective-permute(")} if name.startswith("k") else {}
        if moves:
            print(f"{name}: {moves['exchanges']} exchange calls, {moves['collective_permutes']} collective-permutes")
        for impl, f, t in zip(("xgemm", "xla"), (fx, fj), interleaved([fx, fj], a, b, calls=MATMUL_CALLS)):
            okf = bool(same(one(f(a, b)), ref))
            record(f"matmul_{dt}_{s}^3_sharded_{name}_per_device", (s, s, s), dt, impl, "TFLOP/s",
                   flops / t / n / 1e12, okf, all_gathers=gathers if impl == "xgemm" else None,
                   **(moves if impl == "xgemm" else {}))
        variants = [("K_REDUCTION", v) for v in args.k_reductions] + \
            [("K_RING_TRANSPORT", v) for v in args.ring_transports]
        for knob, value in (variants if name.startswith("k") else ()):
            default = getattr(jax_sharding, knob)
            setattr(jax_sharding, knob, value)
            try:
                fr = jax.jit(lambda a, b: xgemm.matmul(a, b), out_shardings=outs)   # lowered again
                t = median_s(fr, a, b, calls=MATMUL_CALLS)
                record(f"matmul_{dt}_{s}^3_sharded_{name}_per_device_{value}", (s, s, s), dt, "xgemm",
                       "TFLOP/s", flops / t / n / 1e12, bool(same(one(fr(a, b)), ref)))
            finally:
                setattr(jax_sharding, knob, default)
        if args.profile and name.startswith("k"):
            text = profile(fx, (a, b), os.path.join(args.profile, name))
            Path(args.profile, f"timeline_{name}.txt").write_text(text)
        del a, b
    del a1, b1, ref

    # ---- softmax (fp32), rows sharded
    if "softmax" in args.cases:
        r, c = args.rows, args.cols
        X = jax.random.normal(jax.random.PRNGKey(1), (r, c), jnp.float32) * 3
        xs = jax.jit(lambda x: xgemm.softmax(x))
        js = jax.jit(h.xla_softmax)
        nbytes = 2.0 * r * c * 4
        x1 = one(X)
        close = jax.jit(lambda y, r: jnp.allclose(y, r, rtol=1e-5, atol=1e-7))
        ref = js(x1)
        t1 = median_s(xs, x1, calls=SOFTMAX_CALLS)
        record(f"softmax_fp32_{r}x{c}_one_device", (r, c), "fp32", "xgemm", "GB/s", nbytes / t1 / 1e9,
               bool(close(xs(x1), ref)))
        x = put(X, P("d", None))
        gathers = xs.lower(x).compile().as_text().count("all-gather")
        for impl, f, t in zip(("xgemm", "xla"), (xs, js), interleaved([xs, js], x, calls=SOFTMAX_CALLS)):
            ok = bool(close(one(f(x)), ref))
            record(f"softmax_fp32_{r}x{c}_sharded_rows_per_device", (r, c), "fp32", impl, "GB/s",
                   nbytes / t / n / 1e9, ok, all_gathers=gathers if impl == "xgemm" else None)

    records.append({"meta": {"date": time.strftime("%Y-%m-%d"), "devices": [str(d) for d in devices],
                             "jax": jax.__version__, "command": " ".join(sys.argv),
                             "ring_sm_margin": jax_sharding.K_RING_SM_MARGIN, "k_reduction": jax_sharding.K_REDUCTION,
                             "ring_transport": jax_sharding.K_RING_TRANSPORT, "ring_chunks": jax_sharding.K_RING_CHUNKS,
                             "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}}})
    print("| case | impl | value | verified |\n|---|---|---|---|\n" + "\n".join(rows))
    if not args.smoke:
        h.write_json(h.result_path("multi_gpu", out=args.out), records)
    bad = [x["case"] + "/" + x["impl"] for x in records if "meta" not in x and not x["verified"]]
    gathered = [x["case"] for x in records if x.get("all_gathers")]
    if bad or gathered:
        print(f"FAILED: unverified {bad}; all-gathers in {gathered}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
