"""xgemm inside jax.jit on one GPU: custom-call overhead, bf16 GEMM throughput, softmax bandwidth.

    python benchmarks/jax_jit.py                 # writes benchmarks/results/jax-h200.{json,md}
    python benchmarks/jax_jit.py --quick         # smaller softmax, fewer repeats (smoke run)
    python benchmarks/jax_jit.py --prebuild [--carry DIR]   # on any machine (no GPU): lower every
        case of this benchmark and of tests/test_jax_gpu.py for cuda, which compiles the Gluon cubins
        and CuTe objects they need into $XGEMM_CACHE_DIR; --carry copies just those files (plus the
        CuTe and FFI caches) into DIR, a cache dir small enough to take to the GPU machine

Cases (issue 5's acceptance), every peer in the same process:
  chain   100 dependent 128x128x128 fp32 matmuls (x <- x @ W) in one jax.jit, per-op time:
          xgemm (xgemm.jax.matmul) vs XLA (jnp.matmul). Kernel-only time of the same kernels: a
          CUDA graph of 100 chained calls on the torch stream (xgemm's eager path on torch tensors,
          which the dispatch table sends to the same kernel, and torch.matmul = cuBLAS). The
          overhead rows are chain per-op minus graph per-op (bar: xgemm <= 2 us).
  gemm    bf16 8192^3 in jit: xgemm vs jnp.matmul (bar: >= 1.0x), and torch.matmul (cuBLAS, graph).
  softmax fp32 M x 65536 (~1 GiB in) in jit: xgemm vs jax.nn.softmax (bar: >= 1.3x) and the
          device copy of the same bytes (the faster of torch copy_ and torch.neg, graphs; bar: >= 0.95x),
          plus torch.softmax. The jit rows are wall clock over --softmax-calls (40) async calls and
          one block: with 10, the dispatch of the first call and the final sync (shared by the
          sample) cost the same kernel ~3% (H200: 3951 vs 4080 GB/s; that run's jax_softmax40-h200.json is in
          git history).
  grad    jax.grad through xgemm matmul and softmax in jit vs jnp (fp32 tolerance), timed.
  cmdbuf  the chain again in a fresh process with XLA command buffers (CUDA graphs) for custom calls
          ("_cmdbuf" cases; --no-cmdbuf skips it): XLA_FLAGS += CMDBUF_FLAGS (custom calls may be
          captured under XLA's default flags too; these name the command types and graph size).
JAX timing: wall clock around N async dispatches + one block, median of 7 (JAX runs on its own
stream); the bf16 gemm runs 20 dispatches per sample, 21 samples, xgemm's interleaved with XLA's. Torch timing: CUDA-graph replay, events, median of 7. Every timed output is checked
(verified=false marks a mismatch). meta.lowering says what each xgemm jit case lowered to:
"ffi-cubin" (ffi/ handler launching a Gluon cubin), "ffi-tvm" (ffi/ handler calling the CuTe
kernel's TVM-FFI function), "cutlass_call" (CuTe through cutlass.jax) or "xla" (XLA's own op).
XLA flags are taken from the environment and recorded (e.g. command buffers / CUDA graphs).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import _harness as h


class Bench:
    def __init__(self, args):
        import jax
        import jax.numpy as jnp
        import numpy as np
        import torch
        self.jax, self.jnp, self.np, self.torch = jax, jnp, np, torch
        self.args = args
        self.records, self.notes, self.lowering, self.kernels = [], [], {}, {}
        self.reps = 3 if args.quick else 7
        self.post = None

    # -- timing ------------------------------------------------------------------------------
    def wall(self, fn, *args, calls=10):
        """Median seconds per call of a jitted fn: `calls` async dispatches then one block."""
        return self.walls([fn], *args, calls=calls)[0]

    def walls(self, fns, *args, calls=10, reps=None):
        """Median seconds per call of each jitted fn (`calls` async dispatches then one block per
        sample), the fns' samples interleaved (order flipped every round), so clock and power
        drift over the measurement weighs on each alike."""
        return h.wall_interleaved(fns, *args, calls=calls, warmup=1, reps=reps or self.reps,
                                  block=self.jax.block_until_ready, median=h.upper_median)

    def graph(self, body, calls=1):
        """Median seconds per call of body() (which makes `calls` launches) replayed as a CUDA graph."""
        replay, _ = h.capture(lambda i: body(), 1, warm=2, graph_stream=False, fallback=False)
        return h.upper_median([ms * 1e-3 / calls for ms in h.replays_ms(replay, self.reps)])

    def record(self, case, shape, dtype, impl, metric, value, verified):
        self.records.append({"case": case, "shape": list(shape), "dtype": dtype, "impl": impl, "metric": metric,
                             "value": round(float(value), 4), "verified": bool(verified)})

    def lowered_to(self, case, fn, *args):
        text = fn.lower(*args).compile().as_text()
        how = ("ffi-cubin" if "xgemm_cubin_launch" in text else
               "ffi-tvm" if "xgemm_tvm_ffi_call" in text else
               "cutlass_call" if "CuteDSLRT" in text or "cutlass_call" in text else "xla")
        self.lowering[case] = how
        return how

    # -- cases -------------------------------------------------------------------------------
    def chain(self):
        jax, jnp, np = self.jax, self.jnp, self.np
        import xgemm.jax as xj
        n, steps, sfx = 128, 100, self.args.suffix
        rng = np.random.default_rng(0)
        q, _ = np.linalg.qr(rng.standard_normal((n, n)))     # orthogonal: the chain keeps its norm
        w64, x64 = q, rng.standard_normal((n, n))
        ref = x64.copy()
        for _ in range(steps):
            ref = ref @ w64
        ok = lambda y: bool(np.allclose(np.asarray(y, np.float64), ref, rtol=1e-3, atol=1e-3))
        shape = [n, n, n]
        # Kernel-only first (CUDA graphs of the eager calls on the torch stream), then the jit chains.
        graphs = {}
        try:
            graphs = self._chain_graphs(n, steps, w64, x64, ok, shape)
        except Exception as exc:             # no usable torch CUDA: the jit rows still stand
            self.notes.append(f"chain kernel-only graphs: {exc!r}")

        w, x = jnp.asarray(w64, jnp.float32), jnp.asarray(x64, jnp.float32)

        def chain_of(mm):
            def f(x, w):
                for _ in range(steps):
                    x = mm(x, w)
                return x
            return jax.jit(f)
        ours = chain_of(xj.matmul)
        xla = chain_of(lambda a, b: jnp.matmul(a, b, precision="highest"))
        case = f"chain100_matmul_fp32_128x128x128{sfx}"
        self.lowered_to(case, ours, x, w)
        self.kernels[case] = xj.explain_gemm(x, w).kernel_name
        t_ours, t_xla = self.wall(ours, x, w) / steps, self.wall(xla, x, w) / steps
        ok_ours, ok_xla = ok(ours(x, w)), ok(xla(x, w))
        self.record(case, shape, "fp32", "xgemm", "us", t_ours * 1e6, ok_ours)
        self.record(case, shape, "fp32", "xla", "us", t_xla * 1e6, ok_xla)
        for impl, t_jit, good_jit, peer in (("xgemm", t_ours, ok_ours, "xgemm"), ("xla", t_xla, ok_xla, "cublas")):
            if peer in graphs:
                t, good = graphs[peer]
                self.record(f"jit_overhead_matmul_fp32_128x128x128{sfx}", shape, "fp32", impl, "us",
                            (t_jit - t) * 1e6, good and good_jit)

    def _chain_graphs(self, n, steps, w64, x64, ok, shape):
        """Kernel-only: the same chain as CUDA graphs on the torch stream -> {impl: (s per op, ok)}."""
        import xgemm
        torch = self.torch
        tw = torch.tensor(w64, dtype=torch.float32, device="cuda")
        x0 = torch.tensor(x64, dtype=torch.float32, device="cuda")
        bufs = [x0.clone(), torch.empty(n, n, device="cuda")]

        def run(mm):
            def body():
                for i in range(steps):
                    mm(bufs[i % 2], tw, bufs[(i + 1) % 2])
            return body
        gcase = f"graph100_matmul_fp32_128x128x128{self.args.suffix}"
        results = {}
        for impl, mm in (("xgemm", lambda a, b, out: xgemm.matmul(a, b, out=out)),
                         ("cublas", lambda a, b, out: torch.matmul(a, b, out=out))):
            try:
                bufs[0].copy_(x0)
                t = self.graph(run(mm), calls=steps)
                bufs[0].copy_(x0)
                run(mm)()                     # once more from the start: the values to check
                torch.cuda.synchronize()
                good = ok(bufs[steps % 2].cpu().numpy())
                self.record(gcase, shape, "fp32", impl, "us", t * 1e6, good)
                results[impl] = (t, good)
            except Exception as exc:          # report and go on: the other cases still run
                self.notes.append(f"{gcase} {impl}: {exc!r}")
        self.kernels[gcase] = xgemm.explain(bufs[0], tw).kernel_name
        return results

    def gemm(self):
        jax, jnp, np, torch = self.jax, self.jnp, self.np, self.torch
        import xgemm.jax as xj
        n = 4096 if self.args.quick else 8192
        key = jax.random.key(0)
        a = jax.random.normal(key, (n, n), jnp.bfloat16)
        b = jax.random.normal(jax.random.fold_in(key, 1), (n, n), jnp.bfloat16)
        ours = jax.jit(lambda a, b: xj.matmul(a, b))
        xla = jax.jit(h.xla_matmul)
        case = f"gemm_bf16_{n}x{n}x{n}"
        self.lowered_to(case, ours, a, b)
        self.kernels[case] = xj.explain_gemm(a, b).kernel_name
        ref = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))(a, b)
        scale = float(jnp.max(jnp.abs(ref)))

        def ok(d):
            err = float(jnp.max(jnp.abs(d.astype(jnp.float32) - ref)))
            return err <= 1e-2 * scale
        flops = 2.0 * n ** 3
        # steady state: 20 calls (~30 ms) per repeat, 3x the repeats, xgemm's and XLA's interleaved
        times = self.walls([ours, xla], a, b, calls=20, reps=3 * self.reps)
        for impl, fn, t in zip(("xgemm", "xla"), (ours, xla), times):
            self.record(case, [n, n, n], "bf16", impl, "TFLOP/s", flops / t / 1e12, ok(fn(a, b)))
        ta = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        tb = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        tc = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        # the same steady state as the jit timing above: 20 calls per graph replay
        t = self.graph(lambda: [torch.matmul(ta, tb, out=tc) for _ in range(20)], calls=20)
        good = bool(torch.allclose(tc.float(), ta.float() @ tb.float(), rtol=2e-2, atol=2e-2 * n ** 0.5))
        self.record(case, [n, n, n], "bf16", "cublas", "TFLOP/s", flops / t / 1e12, good)

    def softmax(self):
        jax, jnp, np, torch = self.jax, self.jnp, self.np, self.torch
        import xgemm
        import xgemm.jax as xj
        n = 65536
        m = 512 if self.args.quick else 4096            # 4096 x 65536 fp32: 1 GiB in, 1 GiB out
        x = jax.random.normal(jax.random.key(2), (m, n), jnp.float32) * 3
        ours = jax.jit(lambda x: xj.softmax(x, axis=-1))
        xla = jax.jit(h.xla_softmax)
        case = f"softmax_fp32_{m}x{n}"
        self.lowered_to(case, ours, x)
        self.kernels[case] = xj.explain_softmax(x).kernel_name
        ref = jax.jit(lambda x: jax.nn.softmax(x.astype(jnp.float32), axis=-1))(x)   # f32 reference on device
        # float64 spot check of a few rows on the host, for the reference itself
        rows = np.asarray(x[:4], np.float64)
        e = np.exp(rows - rows.max(-1, keepdims=True))
        assert np.allclose(np.asarray(ref[:4], np.float64), e / e.sum(-1, keepdims=True), rtol=1e-4, atol=1e-9)

        def ok(y):
            return float(jnp.max(jnp.abs(y - ref))) <= 2e-6 and not bool(jnp.isnan(y).any())
        nbytes = 2.0 * m * n * 4
        for impl, fn in (("xgemm", ours), ("xla", xla)):
            t = self.wall(fn, x, calls=self.args.softmax_calls)
            self.record(case, [m, n], "fp32", impl, "GB/s", nbytes / t / 1e9, ok(fn(x)))
        tx = torch.randn(m, n, device="cuda") * 3
        ty = torch.empty_like(tx)
        tref = torch.softmax(tx.double(), dim=-1)
        held = [None]
        copies = {}                   # the copy roofline: the faster of the copy engine and an SM kernel
        for impl, body in (("torch", lambda: held.__setitem__(0, torch.softmax(tx, -1))),
                           ("copy-memcpy", lambda: held.__setitem__(0, ty.copy_(tx))),
                           ("copy-sm", lambda: held.__setitem__(0, torch.neg(tx, out=ty))),
                           ("xgemm_eager", lambda: held.__setitem__(0, xgemm.softmax(tx, axis=-1)))):
            try:
                ty.fill_(float("nan"))
                t = self.graph(body)          # the graph's last outputs are what is checked below
                torch.cuda.synchronize()
                y = held[0]
                if impl.startswith("copy"):
                    copies[impl] = (t, bool(torch.equal(y, tx if impl == "copy-memcpy" else -tx)))
                    continue
                good = bool(((y.double() - tref).abs() <= 1e-9 + 2e-5 * tref.abs()).all())
                if impl == "xgemm_eager":     # kernel-only time of the same cubin (jit overhead = the difference)
                    self.record(f"graph_{case}", [m, n], "fp32", "xgemm", "GB/s", nbytes / t / 1e9, good)
                else:
                    self.record(case, [m, n], "fp32", impl, "GB/s", nbytes / t / 1e9, good)
            except Exception as exc:
                self.notes.append(f"{case} {impl}: {exc!r}")
        if copies:
            best = min(copies, key=lambda k: copies[k][0])
            self.record(case, [m, n], "fp32", "copy", "GB/s", nbytes / copies[best][0] / 1e9, copies[best][1])
            self.notes.append(f"{case} copy GB/s: " + ", ".join(
                f"{k[5:]} {nbytes / v[0] / 1e9:.0f}" for k, v in copies.items()) + f" (copy = {best[5:]})")

    def grads(self):
        jax, jnp, np = self.jax, self.jnp, self.np
        import xgemm.jax as xj
        key = jax.random.key(3)
        a = jax.random.normal(key, (512, 256), jnp.float32)
        b = jax.random.normal(jax.random.fold_in(key, 1), (256, 384), jnp.float32)
        w = jax.random.normal(jax.random.fold_in(key, 2), (512, 384), jnp.float32)

        def loss(mm, sm):
            return lambda a, b: jnp.sum(sm(mm(a, b) * 0.05) * w)
        ours = jax.jit(jax.grad(loss(xj.matmul, lambda y: xj.softmax(y, -1)), (0, 1)))
        ref = jax.jit(jax.grad(loss(lambda a, b: jnp.matmul(a, b, precision="highest"),
                                    lambda y: jax.nn.softmax(y, -1)), (0, 1)))
        case = "grad_matmul_softmax_fp32_512x384x256"
        self.lowered_to(case, ours, a, b)
        got, want = ours(a, b), ref(a, b)
        good = all(float(jnp.max(jnp.abs(g - r))) <= 1e-4 * float(jnp.max(jnp.abs(r))) + 1e-6
                   for g, r in zip(got, want))
        self.record(case, [512, 384, 256], "fp32", "xgemm", "us", self.wall(ours, a, b) * 1e6, good)
        self.record(case, [512, 384, 256], "fp32", "xla", "us", self.wall(ref, a, b) * 1e6, True)

    # -- run ---------------------------------------------------------------------------------
    def run(self):
        jax, torch = self.jax, self.torch
        steps = [getattr(self, name) for name in self.args.only.split(",") if name]
        if getattr(self, "post", None):
            steps.append(self.post)
        for step in steps:
            try:
                step()
            except Exception as exc:
                import traceback
                traceback.print_exc()
                self.notes.append(f"{step.__name__} failed: {exc!r}")
        versions = h.versions(("jax", "jaxlib", "torch", "cutlass", "triton", "numpy"))
        import xgemm
        versions["xgemm"] = xgemm.__version__
        dev = jax.devices()[0]
        meta = {"meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                         "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
                         "jax_device": str(dev),
                         "versions": versions, "python": platform.python_version(),
                         "command": " ".join([sys.executable] + sys.argv),
                         "xla_flags": os.environ.get("XLA_FLAGS", ""),
                         "xgemm_cache": os.environ.get("XGEMM_CACHE_DIR", "~/.cache/xgemm"),
                         "lowering": self.lowering, "kernels": self.kernels,
                         "timing": "jax: wall clock, N async calls + block, median of 7; torch: CUDA graph, "
                                   "events, median of 7",
                         "notes": self.notes}}
        out = Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        h.write_json(out / f"{self.args.name}.json", [meta] + self.records)
        md = self.markdown(meta)
        h.write_text(out / f"{self.args.name}.md", md)
        print("\n" + md)

    def markdown(self, meta):
        m = meta["meta"]
        lines = [f"# xgemm in jax.jit on {m['gpu']} ({m['date']})", "",
                 f"`{m['command']}`  XLA_FLAGS=`{m['xla_flags']}`", "",
                 "| case | impl | value | metric | verified | lowered to / kernel |", "|---|---|---|---|---|---|"]
        for r in self.records:
            how = self.lowering.get(r["case"], "") if r["impl"] == "xgemm" else ""
            kern = self.kernels.get(r["case"], "") if r["impl"] == "xgemm" else ""
            lines.append(f"| {r['case']} | {r['impl']} | {r['value']:.2f} | {r['metric']} | {r['verified']} | "
                         f"{how} {kern} |")
        if m["notes"]:
            lines += ["", "Notes:"] + [f"- {n}" for n in m["notes"]]
        return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(h.RESULTS))
    ap.add_argument("--name", default="jax-h200")
    ap.add_argument("--quick", action="store_true", help="smaller shapes and fewer repeats (smoke run)")
    ap.add_argument("--only", default="chain,gemm,softmax,grads", help="cases to run (comma-separated)")
    ap.add_argument("--softmax-calls", type=int, default=40,
                    help="async jit calls per timed softmax sample (the start and the final block are shared)")
    ap.add_argument("--suffix", default="", help=argparse.SUPPRESS)
    ap.add_argument("--sgemm-tiny", default="",
                    help="the cute_sgemm config of the policy's tiny row for this run (e.g. 32x32x32 or "
                         "32x32x32k4): A/B the 128^3 chain in two runs on one machine")
    ap.add_argument("--prebuild", action="store_true", help="compile the kernels the GPU run needs, then exit")
    ap.add_argument("--carry", default="", help="with --prebuild: copy what the GPU run needs into this cache dir")
    ap.add_argument("--no-cmdbuf", action="store_true",
                    help="skip the second chain run with XLA command buffers (CUDA graphs) for custom calls")
    args = ap.parse_args(argv)
    if args.prebuild:
        prebuild(args.carry)
        return 0
    if args.sgemm_tiny:               # before anything is planned or lowered
        from xgemm.kernels import cute_sgemm
        if args.sgemm_tiny not in cute_sgemm.CONFIGS:
            ap.error(f"--sgemm-tiny: one of {', '.join(cute_sgemm.CONFIGS)}")
        cute_sgemm.TINY = args.sgemm_tiny
    bench = Bench(args)
    if not args.no_cmdbuf and "chain" in args.only and not args.suffix:
        bench.post = lambda: cmdbuf_variant(bench, args)
    bench.run()
    return 0


def prebuild(carry: str = "") -> None:
    """Cross-lower (cuda) the jitted functions of this benchmark and of tests/gpu/test_jax_gpu.py (keep
    the shapes in sync), forward and backward: that compiles every kernel they use into the cache."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import shutil

    import jax
    import jax.numpy as jnp
    import xgemm.jax as xj
    from xgemm.runtime import gluon_cache
    used = []
    lookup = gluon_cache.lookup

    def recording_lookup(key, *a, **kw):
        entry = lookup(key, *a, **kw)
        if entry is not None:
            used.append(entry)
        return entry
    gluon_cache.lookup = recording_lookup
    S = jax.ShapeDtypeStruct
    f32, bf16, f16 = jnp.float32, jnp.bfloat16, jnp.float16
    soft = [((4096, 65536), -1), ((512, 65536), -1), ((64, 4096), -1), ((8, 3, 1000), 1), ((16, 65536), -1),
            ((2, 262144), -1), ((256, 4096), -1)]
    gemm = [((128, 128), (128, 128), f32), ((3, 64, 96), (96, 80), f32), ((512, 256), (256, 384), bf16),
            ((2, 256, 128), (2, 128, 64), f16), ((8192, 8192), (8192, 8192), bf16), ((4096, 4096), (4096, 4096), bf16)]
    softmax_on = lambda axis: (lambda x: xj.softmax(x, axis=axis))
    jobs = [(softmax_on(axis), [S(shape, f32)]) for shape, axis in soft]
    jobs += [(lambda a, b: xj.gemm(a, b, alpha=0.5), [S(sa, dt), S(sb, dt)]) for sa, sb, dt in gemm]
    for (m, n, k) in ((512, 384, 256), (256, 512, 128)):          # the grad cases: forward + backward
        loss = lambda a, b, w: jnp.sum(xj.softmax(xj.matmul(a, b) * 0.05, -1) * w)
        jobs.append((jax.grad(loss, (0, 1)), [S((m, k), f32), S((k, n), f32), S((m, n), f32)]))
    for i, (fn, avals) in enumerate(jobs):
        t0 = time.perf_counter()
        text = jax.jit(fn).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
        how = "ffi-cubin" if "xgemm_cubin_launch" in text else "ffi-tvm" if "xgemm_tvm_ffi_call" in text else "xla"
        print(f"[{i + 1}/{len(jobs)}] {[tuple(a.shape) for a in avals]} -> {how} ({time.perf_counter() - t0:.1f}s)",
              flush=True)
    gluon_cache.lookup = lookup
    if carry:
        src_root = gluon_cache.cache_root().parent
        dst_root = Path(carry)
        for entry in {e.cubin_path: e for e in used}.values():
            for path in (Path(entry.cubin_path), Path(entry.cubin_path[:-len(".cubin")] + ".json")):
                dst = dst_root / path.relative_to(src_root)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dst)
        for sub in ("cute", "ffi"):
            if (src_root / sub).is_dir():
                shutil.copytree(src_root / sub, dst_root / sub, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("*.lock", ".*.lock"))
        size = sum(f.stat().st_size for f in dst_root.rglob("*") if f.is_file())
        print(f"carry dir {dst_root}: {size / 2**20:.1f} MiB ({len(used)} Gluon lookups)")


CMDBUF_FLAGS = "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"


def cmdbuf_variant(bench, args):
    """The chain again in a fresh process with CMDBUF_FLAGS (XLA command buffers, i.e. CUDA graphs,
    named for custom calls, min graph size 1); cases get '_cmdbuf'."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + CMDBUF_FLAGS).strip())
        cmd = [sys.executable, __file__, "--only", "chain", "--suffix", "_cmdbuf", "--out", tmp, "--name", "v",
               "--no-cmdbuf"] + (["--quick"] if args.quick else []) + (
                  ["--sgemm-tiny", args.sgemm_tiny] if args.sgemm_tiny else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        path = Path(tmp) / "v.json"
        if proc.returncode != 0 or not path.exists():
            bench.notes.append(f"cmdbuf variant failed: {proc.stderr[-1500:]}")
            return
        data = json.loads(path.read_text())
        sub = data[0]["meta"]
        bench.records.extend(data[1:])
        bench.lowering.update(sub["lowering"])
        bench.kernels.update(sub["kernels"])
        bench.notes.extend(f"[cmdbuf run, XLA_FLAGS={sub['xla_flags']}] {n}" for n in sub["notes"])


if __name__ == "__main__":
    sys.exit(main())
