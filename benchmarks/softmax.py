"""Softmax bandwidth on one GPU: xgemm (gluon_softmax) vs torch.softmax, jax.nn.softmax and quack's
softmax, with the device-to-device copy of the same bytes as the roofline, all in one process.

    python benchmarks/softmax.py                      # the sweep; writes results/softmax-h200.{json,md,png}
    python benchmarks/softmax.py --tune               # also time candidate configs per row length
    python benchmarks/softmax.py --list-entries --tune   # cache entries the run needs (build them first)

Sweep: M x N with N in {256, 1024, 4096, 16384, 65536, 262144}, M sized to ~1 GiB of input (so one
call's working set is far beyond the 60 MB L2; smaller inputs rotate through enough buffers to
exceed 3x L2). GB/s counts bytes read + written once: 2 * M * N * itemsize / time.
Timing: CUDA-graph replay of 10 calls (torch stream: xgemm, torch, quack, copy), median of 7
replays over events; JAX (its own stream) by wall clock around 10 async dispatches + block, median
of 7. Every timed output (the buffers the timed calls wrote, NaN-poisoned before timing) is checked
against a float64 torch reference.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import _harness as h

ROOT = h.ROOT

SWEEP_N = [256, 1024, 4096, 16384, 65536, 262144]
GIB = 1 << 30
DT_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}

# (block_m, warps, ctas, online) candidates per BLOCK_N for --tune. online=2 is the mbarrier-exchange
# kernel: measured (H200, 2026-11-29) and the pick for BLOCK_N 32K-256K; online=3 is it in quack's
# order without the exit cluster barrier (quack's own geometry: 8 warps, 2 / 8 CTAs). The default
# cache holds the picks and their siblings, --list-entries --tune lists the rest.
TUNE = {
    256: [(64, 8, 1, 0), (32, 8, 1, 0), (16, 4, 1, 0), (8, 4, 1, 0), (4, 4, 1, 0), (4, 2, 1, 0), (2, 2, 1, 0),
          (8, 8, 1, 0)],
    1024: [(8, 8, 1, 0), (4, 4, 1, 0), (2, 2, 1, 0), (4, 2, 1, 0), (2, 4, 1, 0), (1, 4, 1, 0), (16, 8, 1, 0)],
    4096: [(8, 16, 1, 0), (4, 8, 1, 0), (8, 16, 1, 1), (4, 8, 1, 1), (2, 8, 1, 0), (2, 4, 1, 0), (1, 4, 1, 0),
           (1, 8, 1, 0)],
    16384: [(1, 16, 1, 0), (1, 16, 1, 1), (1, 8, 2, 1), (1, 4, 4, 1)],
    65536: [(1, 4, 4, 1), (1, 4, 4, 2), (1, 8, 2, 2), (1, 4, 4, 3), (1, 8, 4, 3), (1, 4, 8, 3), (1, 8, 2, 3),
            (1, 4, 2, 3), (1, 16, 2, 3)],
    262144: [(1, 4, 16, 1), (1, 4, 16, 2), (1, 8, 8, 2), (1, 4, 16, 3), (1, 8, 8, 3), (1, 8, 16, 3), (1, 16, 8, 3),
             (1, 4, 8, 3)],
}


def tune_configs(n: int, dtype: str, aligned: bool = True, shifted: bool = False):
    from xgemm.kernels import gluon_softmax as gs
    from xgemm.core.problem import Policy
    out = []
    block_n = max(gs.MIN_BLOCK_N, 1 << (n - 1).bit_length())
    for m, w, c, o in TUNE.get(block_n, []):
        pol = Policy(tile=(m, block_n), warps=w, ctas_per_row=c, cluster=(c, 1), notes=gs.ONLINE_NOTES[o])
        try:
            cfg = gs.config_from_policy(pol, dtype, dtype, aligned, shifted)
        except AssertionError:
            continue
        out.append((pol, cfg))
    return out


def aligned_rows(n: int, dtype: str) -> bool:
    """Whether the sweep's contiguous M x n rows take the aligned variant (n a multiple of 16 bytes)."""
    from xgemm.core.dtypes import ITEMSIZE
    return n * ITEMSIZE[dtype] % 16 == 0


def needed_entries(sizes, dtypes, tune: bool):
    """The cache entries a run needs: each size's pick in the variant its rows take (an odd row
    length: the shift variant), and with --tune every candidate the same way."""
    from xgemm.kernels import gluon_softmax as gs
    keys = []
    for dt in dtypes:
        for n in sizes:
            aligned = aligned_rows(n, dt)
            keys.append(gs.pick_config(n, dt, dt, aligned, not aligned).key)
            if tune:
                keys += [cfg.key for _, cfg in tune_configs(n, dt, aligned, not aligned)]
            keys.append(gs.pick_config(4096, dt, dt, aligned=True).key)   # fresh-process probe
    keys.append(gs.pick_config(16, "float32", "float32", aligned=True).key)   # host-cost probe
    return list(dict.fromkeys(keys))


# ----------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=",".join(map(str, SWEEP_N)))
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--bytes", type=float, default=1.0, help="GiB of input per shape")
    ap.add_argument("--peers", default="torch,jax,quack")
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--list-entries", action="store_true")
    ap.add_argument("--out", default=str(h.RESULTS))
    ap.add_argument("--name", default="softmax-h200")
    ap.add_argument("--render", metavar="DIR", help="only rebuild the .md/.png in --out from DIR's JSON files")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    dtypes = [d for d in args.dtypes.split(",") if d]
    if args.render:
        render(Path(args.render), Path(args.out), args.name)
        return 0
    if args.list_entries:
        print("\n".join(needed_entries(sizes, dtypes, args.tune)))
        return 0
    Bench(args, sizes, dtypes).run()
    return 0


class Bench:
    def __init__(self, args, sizes, dtypes):
        import torch
        self.torch = torch
        self.args, self.sizes, self.dtypes = args, sizes, dtypes
        self.peers = [p for p in args.peers.split(",") if p]
        self.records, self.tune_records, self.notes = [], [], []
        props = torch.cuda.get_device_properties(0)
        self.gpu = props.name
        self.l2 = getattr(props, "L2_cache_size", 60 << 20)
        self.jax = self.quack = None
        if "jax" in self.peers:
            try:
                import jax
                import jax.numpy as jnp  # noqa: F401
                self.jax = jax
                self.jsoftmax = jax.jit(h.xla_softmax)
            except Exception as exc:   # report, keep going
                self.notes.append(f"jax unavailable: {exc!r}")
        if "quack" in self.peers:
            try:
                from quack.softmax import _softmax_fwd
                self.quack = _softmax_fwd
            except Exception as exc:
                self.notes.append(f"quack unavailable: {exc!r}")

    # -- timing ------------------------------------------------------------------------------
    def time_graph(self, fn, n_calls=10, reps=7):
        """Median ms per call of fn(i) captured n_calls times in one CUDA graph (events around replays)."""
        # capture unsupported: time eager launches with events
        run, how = h.capture(fn, n_calls, warm=2, graph_stream=False, on_fail=lambda exc: self.notes.append(
            f"graph capture failed ({exc!r}); eager event timing used"))
        return h.upper_median([ms / n_calls for ms in h.replays_ms(run, reps)]), how.split()[0], (run, None)

    def time_eager(self, fn, n_calls=10, reps=7):
        """Median ms per call of n_calls eager launches between events."""
        fn(0)
        self.torch.cuda.synchronize()

        def run():
            for i in range(n_calls):
                fn(i)
        return h.upper_median([ms / n_calls for ms in h.replays_ms(run, reps, warm=False)])

    def time_wall(self, fn, n_calls=10, reps=7):
        fn(0).block_until_ready()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            y = None
            for i in range(n_calls):
                y = fn(i)
            y.block_until_ready()
            times.append((time.perf_counter() - t0) * 1e3 / n_calls)
        return h.upper_median(times)

    # -- verification ------------------------------------------------------------------------
    def verify(self, y, ref, dtype):
        torch = self.torch
        atol, rtol = {"float32": (1e-9, 2e-5), "float16": (2e-7, 2e-3), "bfloat16": (1e-30, 1.6e-2)}[dtype]
        bad = 0
        worst = 0.0
        for r0 in range(0, y.shape[0], 1 << 14):      # chunks: keep the float64 temporaries small
            yd = y[r0:r0 + (1 << 14)].double()
            rd = ref[r0:r0 + (1 << 14)]
            if torch.isnan(yd).any():
                return False, float("nan")
            err = (yd - rd).abs()
            bad += int((err > atol + rtol * rd.abs()).sum())
            worst = max(worst, float(err.max()))
        return bad == 0, worst

    # -- one shape ---------------------------------------------------------------------------
    def shape(self, n, dtype):
        torch = self.torch
        from xgemm.kernels import gluon_softmax as gs
        tdt = getattr(torch, dtype)
        item = torch.tensor([], dtype=tdt).element_size()
        m = max(1, int(round(self.args.bytes * GIB / (n * item))))
        nbytes = m * n * item
        n_in = max(1, math.ceil(3 * self.l2 / nbytes))     # rotate so the working set exceeds L2
        xs = [(torch.randn(m, n, device="cuda") * 3).to(tdt) for _ in range(n_in)]
        refs = [torch.softmax(x.double(), dim=-1) for x in xs]
        case = f"softmax_{DT_SHORT[dtype]}_{m}x{n}"
        moved = 2 * nbytes
        gbps = lambda ms: moved / (ms * 1e-3) / 1e9
        results = {}

        def record(impl, ms, ok, extra=""):
            results[impl] = gbps(ms) if ms else None
            self.records.append({"case": case, "shape": [m, n], "dtype": dtype, "impl": impl, "metric": "GB/s",
                                 "value": round(gbps(ms), 1) if ms else None, "verified": bool(ok)})
            print(f"  {impl:>7}: {ms * 1e3 if ms else float('nan'):9.1f} us  {results[impl] or 0:7.0f} GB/s  "
                  f"verified={ok}{extra}", flush=True)

        def check_all(outs):
            oks, worst = [], 0.0
            for y, ref in zip(outs, refs):
                ok, w = self.verify(y, ref, dtype)
                oks.append(ok)
                worst = max(worst, w)
            return all(oks), worst

        print(f"{case}: {nbytes / GIB:.2f} GiB in, {n_in} input buffer(s)", flush=True)

        # copy roofline: the same bytes through cudaMemcpyAsync (graph and eager) and through an SM
        # elementwise kernel (torch.neg: read once, write once); the fastest is the roofline.
        outs = [torch.empty_like(x) for x in xs]
        copies = {}
        copies["memcpy-graph"], _, _ = self.time_graph(lambda i: outs[i % n_in].copy_(xs[i % n_in]))
        ok_copy = all(torch.equal(o, x) for o, x in zip(outs, xs))
        copies["memcpy-eager"] = self.time_eager(lambda i: outs[i % n_in].copy_(xs[i % n_in]))
        ok_copy = ok_copy and all(torch.equal(o, x) for o, x in zip(outs, xs))
        copies["sm-copy"], _, _ = self.time_graph(lambda i: torch.neg(xs[i % n_in], out=outs[i % n_in]))
        ok_copy = ok_copy and all(torch.equal(o, -x) for o, x in zip(outs, xs))
        best_copy = min(copies, key=copies.get)
        self.notes.append(f"{case} copy GB/s: " + ", ".join(f"{k} {gbps(v):.0f}" for k, v in copies.items()))
        record("copy", copies[best_copy], ok_copy, f"  ({best_copy}; " +
               ", ".join(f"{k} {gbps(v):.0f}" for k, v in copies.items()) + ")")
        del outs

        # xgemm through the kernel protocol
        def xgemm_runner(policy=None):
            from xgemm import arrays
            from xgemm.core.problem import ROW, Device, Operand, SoftmaxProblem
            dev = Device("cuda", 0, (9, 0))
            ys = [torch.empty_like(x) for x in xs]
            view = lambda t: arrays.view(t, "x", "softmax bench")          # noqa: E731
            p = SoftmaxProblem(m, n, (m, n), 1, Operand((m, n), (n, 1), dtype, ROW, 16), dtype, "torch", dev)
            assert gs.KERNEL.supports(p) is None, gs.KERNEL.supports(p)
            pol = policy or gs.KERNEL.policy(p)
            xv, yv = [view(x) for x in xs], [view(y) for y in ys]
            fn = lambda i: gs.KERNEL.run(p, pol, (xv[i % n_in],), yv[i % n_in],
                                         torch.cuda.current_stream().cuda_stream)
            return fn, ys, pol

        def time_xgemm(policy=None):
            fn, ys, pol = xgemm_runner(policy)
            fn(0)
            torch.cuda.synchronize()
            ms, how, (run, _) = self.time_graph(fn)
            for y in ys:
                y.fill_(float("nan"))
            run()                          # the timed launches, once more, into poisoned outputs
            torch.cuda.synchronize()
            ok, worst = check_all(ys)
            return ms, ok, worst, pol

        aligned = aligned_rows(n, dtype)
        if self.args.tune:
            best = None
            for pol, cfg in tune_configs(n, dtype, aligned, not aligned):
                ms, ok, worst, _ = time_xgemm(pol)
                self.tune_records.append({"case": case, "config": cfg.key, "block_m": cfg.block_m,
                                          "warps": cfg.warps, "ctas": cfg.ctas, "elems_per_thread":
                                          cfg.elems_per_thread, "GB/s": round(gbps(ms), 1), "verified": ok})
                print(f"    tune {cfg.key:<48} {gbps(ms):7.0f} GB/s verified={ok}", flush=True)
                if ok and (best is None or ms < best[0]):
                    best = (ms, cfg.key)
            if best:
                print(f"    best {best[1]} {gbps(best[0]):.0f} GB/s", flush=True)

        ms, ok, worst, pol = time_xgemm()
        record("xgemm", ms, ok, f"  max|err| {worst:.2e}  policy: {pol.summary()}")

        if "torch" in self.peers:
            ys = [None] * n_in

            def tfn(i):
                ys[i % n_in] = torch.softmax(xs[i % n_in], dim=-1)
            ms, _, (run, _) = self.time_graph(tfn)
            for y in ys:
                y.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            ok, worst = check_all(ys)
            record("torch", ms, ok, f"  max|err| {worst:.2e}")
            del ys

        if self.quack is not None:
            try:
                ys = [torch.empty_like(x) for x in xs]
                qfn = lambda i: self.quack(xs[i % n_in], ys[i % n_in])
                ms, _, (run, _) = self.time_graph(qfn)
                for y in ys:
                    y.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                ok, worst = check_all(ys)
                record("quack", ms, ok, f"  max|err| {worst:.2e}")
                del ys
            except Exception as exc:
                self.notes.append(f"quack failed at {case}: {exc!r}")
                print(f"  quack failed: {exc!r}", flush=True)

        if self.jax is not None:
            try:
                jax = self.jax
                jxs = [jax.dlpack.from_dlpack(x) for x in xs]       # zero-copy views of the torch inputs
                last = {}

                def jfn(i):
                    last[i % n_in] = self.jsoftmax(jxs[i % n_in])
                    return last[i % n_in]
                ms = self.time_wall(jfn)
                ys = [torch.from_dlpack(last[i]) for i in range(n_in)]
                ok, worst = check_all(ys)
                record("xla", ms, ok, f"  max|err| {worst:.2e}")
                del ys, last, jxs
            except Exception as exc:
                self.notes.append(f"jax failed at {case}: {exc!r}")
                print(f"  jax failed: {exc!r}", flush=True)

        del xs, refs
        torch.cuda.empty_cache()
        return case, m, n, results

    # -- process-level figures ---------------------------------------------------------------
    def first_call(self):
        """A fresh process with the prebuilt cache: ms from asking to a finished first softmax."""
        code = textwrap.dedent("""
            import sys, time, importlib.abc
            import torch
            x = torch.randn(4096, 4096, device="cuda"); out = torch.empty_like(x); torch.cuda.synchronize()
            # torch's own CUDA init may import triton; from here on, any new triton import fails
            pre = {m for m in sys.modules if m == "triton" or m.startswith("triton.")}
            class Block(importlib.abc.MetaPathFinder):
                def find_spec(self, name, path=None, target=None):
                    if name == "triton" or name.startswith("triton."):
                        raise ImportError("triton blocked")
            sys.meta_path.insert(0, Block())
            t0 = time.perf_counter()
            from xgemm import arrays
            from xgemm.kernels import gluon_softmax as gs
            from xgemm.core.problem import ROW, Device, Operand, SoftmaxProblem
            t_import = time.perf_counter()
            cb = "cuda.bindings.driver" in sys.modules
            dev = Device("cuda", 0, (9, 0))
            v = lambda t: arrays.view(t, "x", "softmax bench")          # noqa: E731
            p = SoftmaxProblem(4096, 4096, (4096, 4096), 1, Operand((4096, 4096), (4096, 1), "float32", ROW, 16),
                               "float32", "torch", dev)
            assert gs.KERNEL.supports(p) is None
            t_sup = time.perf_counter()
            t_cb = t_sup
            gs.KERNEL.run(p, gs.KERNEL.policy(p), (v(x),), v(out), torch.cuda.current_stream().cuda_stream)
            t_run = time.perf_counter()
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            print(f"BREAKDOWN import_xgemm={1e3*(t_import-t0):.2f}ms supports={1e3*(t_sup-t_import):.2f}ms "
                  f"cuda_bindings_preloaded={cb} first_run={1e3*(t_run-t_cb):.2f}ms "
                  f"sync={ms-1e3*(t_run-t0):.2f}ms")
            ok = bool(torch.allclose(out, torch.softmax(x, -1), rtol=1e-4, atol=1e-8))
            tri = bool({m for m in sys.modules if m == "triton" or m.startswith("triton.")} - pre)
            print(f"FIRST {ms:.3f} {ok} {tri} {bool(pre)}")
        """)
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        if r.returncode != 0 or "FIRST" not in r.stdout:
            self.notes.append(f"first-call probe failed: {r.stdout[-500:]} {r.stderr[-1500:]}")
            print(self.notes[-1], flush=True)
            return
        ms, ok, tri, pre = r.stdout.split("FIRST")[1].split()[:4]
        breakdown = r.stdout.split("BREAKDOWN")[1].split("\n")[0].strip() if "BREAKDOWN" in r.stdout else ""
        self.notes.append(f"first-call breakdown: {breakdown}")
        self.records.append({"case": "softmax_fp32_4096x4096_first_call_fresh_process", "shape": [4096, 4096],
                             "dtype": "float32", "impl": "xgemm", "metric": "us", "value": round(float(ms) * 1e3, 1),
                             "verified": ok == "True" and tri == "False"})
        self.notes.append(f"first-call probe: triton already imported by torch's CUDA init: {pre}; imported by "
                          f"xgemm: {tri}")
        print(f"fresh process, first softmax: {float(ms):.2f} ms (correct={ok}, triton imported by xgemm={tri}, "
              f"by torch={pre})", flush=True)

    def host_cost(self):
        torch = self.torch
        from xgemm.runtime import gluon_cache
        from xgemm.runtime import launch
        from xgemm.kernels import gluon_softmax as gs
        x = torch.randn(1, 16, device="cuda")
        y = torch.empty_like(x)
        cfg = gs.pick_config(16, "float32", "float32", aligned=True)
        e = gluon_cache.lookup(cfg.key)
        lau = launch.get_launcher(e.cubin, e.meta, 0)
        stream = torch.cuda.current_stream().cuda_stream
        ts = []
        for _ in range(15):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(200):
                lau(1, stream, x.data_ptr(), y.data_ptr(), 1, 16, 0, 0)
            ts.append((time.perf_counter() - t0) / 200 * 1e6)
        torch.cuda.synchronize()
        us = h.upper_median(ts)
        ok = bool(torch.allclose(y, torch.softmax(x, -1)))
        self.records.append({"case": "softmax_launcher_host_cost_per_call", "shape": [1, 16], "dtype": "float32",
                             "impl": "xgemm", "metric": "us", "value": round(us, 2), "verified": ok})
        print(f"launcher host cost: {us:.2f} us per call", flush=True)

    # -- run and write -----------------------------------------------------------------------
    def run(self):
        torch = self.torch
        for dt in self.dtypes:
            for n in self.sizes:
                self.shape(n, dt)
        self.host_cost()
        self.first_call()
        out = Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        versions = h.versions(("torch", "jax", "jaxlib", "quack", "cutlass", "cuda.bindings", "numpy"))
        meta = {"meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                         "gpu": self.gpu, "l2_bytes": self.l2, "versions": versions, "python": platform.python_version(),
                         "command": " ".join([sys.executable] + sys.argv),
                         "xgemm_cache": os.environ.get("XGEMM_CACHE_DIR", "~/.cache/xgemm"),
                         "timing": "CUDA graph of 10 calls, median of 7 replays (jax: wall clock, 10 async calls)",
                         "notes": self.notes}}
        h.write_json(out / f"{self.args.name}.json", [meta] + self.records)
        if self.tune_records:
            h.write_json(out / f"{self.args.name}-tune.json", [meta] + self.tune_records)
        md = render_markdown(self.records, self.tune_records, meta)
        h.write_text(out / f"{self.args.name}.md", md)
        render_plot(self.records, out / f"{self.args.name}.png", self.gpu, self.notes)
        print("\n" + md)


# ----------------------------------------------------------------------------------------------
# Rendering (also from saved JSON: --render DIR)
# ----------------------------------------------------------------------------------------------

IMPLS = ["xgemm", "copy", "torch", "xla", "quack"]


def _table(records):
    """[(dtype, case, m, n, {impl: GB/s})] from the GB/s records, in sweep order."""
    rows = {}
    for r in records:
        if r.get("metric") == "GB/s":
            rows.setdefault(r["case"], (r["dtype"], r["case"], r["shape"][0], r["shape"][1], {}))[4][r["impl"]] = \
                r["value"]
    return list(rows.values())


def render_markdown(records, tune, meta):
    m = meta["meta"]
    lines = [f"# softmax on {m['gpu']} ({m['date']})", "",
             "GB/s = 2 x M x N x itemsize / time (read once + write once). `copy` = the fastest device-to-device "
             "copy of the same bytes measured in the run (an SM copy kernel, torch.neg, and cudaMemcpyAsync eager "
             "and in a CUDA graph; see notes). `xgemm/copy` is the acceptance ratio (>= 0.95), `best peer` the "
             "fastest of torch / xla (jax.nn.softmax) / quack. Every value is from outputs checked against a "
             "float64 reference.", "",
             f"Timing: {m.get('timing', '')}. Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
             f"Command: `{m['command']}`", "",
             "| dtype | M x N | " + " | ".join(IMPLS) + " | xgemm/copy | best peer | xgemm/best peer |",
             "|---|---|" + "---|" * (len(IMPLS) + 3)]
    for dt, case, mm, n, res in _table(records):
        cells = [f"{res[i]:.0f}" if res.get(i) else "-" for i in IMPLS]
        peers = {k: v for k, v in res.items() if k in ("torch", "xla", "quack") and v}
        bp = max(peers.items(), key=lambda kv: kv[1]) if peers else None
        ratio = f"{res['xgemm'] / res['copy']:.3f}" if res.get("xgemm") and res.get("copy") else "-"
        vs = f"{res['xgemm'] / bp[1]:.3f}" if bp and res.get("xgemm") else "-"
        lines.append(f"| {dt} | {mm} x {n} | " + " | ".join(cells) +
                     f" | {ratio} | {bp[0] + ' ' + format(bp[1], '.0f') if bp else '-'} | {vs} |")
    unverified = [r for r in records if not r["verified"]]
    lines += ["", f"Unverified results: {len(unverified)}" + "".join(f"\n- {r['case']} {r['impl']}" for r in unverified)]
    for r in records:
        if r["metric"] == "us":
            lines.append(f"- {r['case']}: {r['value']} us ({'ok' if r['verified'] else 'FAILED'})")
    if tune:
        lines += ["", "## Config sweep (--tune), same run", "",
                  "Each candidate (rows per CTA `m`, warps `w`, CTAs per cluster `c`, `o1` = one packed (max, sum) "
                  "exchange per row, `o0` = two cross-CTA reductions) timed like the table above; the picker's "
                  "table (kernels/gluon_softmax.py) is the fastest per row length.", "",
                  "| case | config | elems/thread | GB/s |", "|---|---|---|---|"]
        for t in tune:
            lines.append(f"| {t['case']} | `{t['config'].split('/', 2)[2]}` | {t['elems_per_thread']} | "
                         f"{t['GB/s']:.0f}{'' if t['verified'] else ' (FAILED check)'} |")
    if m.get("notes"):
        lines += ["", "Notes:"] + [f"- {n}" for n in m["notes"]]
    return "\n".join(lines) + "\n"


def render_plot(records, path, gpu, notes=None):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        if notes is not None:
            notes.append(f"no plot: {exc!r}")
        return
    table = _table(records)
    dtypes = list(dict.fromkeys(t[0] for t in table))
    fig, ax = plt.subplots(figsize=(8, 5))
    for dt in dtypes:
        rows = [t for t in table if t[0] == dt]
        ns = [t[3] for t in rows]
        for impl, style in (("copy", "k--"), ("xgemm", "o-"), ("torch", "s-"), ("xla", "^-"), ("quack", "d-")):
            vals = [t[4].get(impl) for t in rows]
            if any(vals):
                label = ("device copy (roofline)" if impl == "copy" else impl) if len(dtypes) == 1 else \
                    f"{impl} ({DT_SHORT[dt]})"
                ax.plot([n for n, v in zip(ns, vals) if v], [v for v in vals if v], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("row length N (M x N = ~1 GiB of input)")
    ax.set_ylabel("GB/s (read + write)")
    ax.set_title(f"softmax, {gpu}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def render(src: Path, out: Path, name: str):
    data = json.loads((src / f"{name}.json").read_text())
    tune_path = src / f"{name}-tune.json"
    tune = json.loads(tune_path.read_text())[1:] if tune_path.exists() else []
    meta, records = data[0], data[1:]
    out.mkdir(parents=True, exist_ok=True)
    h.write_text(out / f"{name}.md", render_markdown(records, tune, meta))
    render_plot(records, out / f"{name}.png", meta["meta"]["gpu"])


if __name__ == "__main__":
    sys.exit(main())
