"""The benchmarks' shared harness: timing, statistics, inputs, peers, output checks, results files.

Scripts run as `python benchmarks/<script>.py` from the repository root, where Python puts
benchmarks/ itself first on the module search path, so `import _harness as h` needs no setup.
Nothing here imports torch, JAX or xgemm at import time (tests/test_bench_stats.py imports it on
any CPU). xgemm comes from the environment (installed, or PYTHONPATH=$PWD for a checkout).

  CUDA graphs      capture (warm up, capture `reps` calls, event timing as the fallback),
                   replays_ms (event-timed replays), graph_of (capture only, no fallback)
  events           event_ms (one run between two CUDA events), graph_us (replays of one graph)
  wall clock       wall_interleaved / wall_median (async calls + one block or sync, order flipped
                   every round), wall_us_per_call (back-to-back eager calls, host cost)
  trials           time_interleaved (every implementation once per trial, in trial_orders),
                   trial_orders, timing_note
  statistics       median_ci, paired_ratio, upper_median
  inputs           Inputs (bf16/fp16 sets rotating through > 2x L2, with the fp32 reference),
                   fp32_input_sets, L2_BYTES
  implementations  impl_cublas, impl_quack (when importable), impl_xgemm, impl_xgemm_config,
                   sm90_call, problem; bench_gemm runs them interleaved; xla_matmul,
                   xla_matmul_f32acc, xla_softmax (XLA peers for jax.jit)
  output checks    Inputs.verify (fp32 reference), rel_err (float64 reference); time_checked (capture,
                   time and check a dict of implementations that leave their results by name)
  profiler         gpu_events (torch.profiler / CUPTI events of one step)
  results          result_path, write_json, write_text, versions
"""
from __future__ import annotations

import contextlib
import itertools
import json
import math
import random
import statistics
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GPU_TAG = "h200"                  # results/<study>-h200.*
L2_BYTES = 60 * 2 ** 20           # the H200's L2

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (8192, 8192, 1024), (2048, 8192, 8192)]
DTYPES = ["bfloat16", "float16"]


def _torch():
    import torch
    return torch


# ------------------------------------------------------------------------------------------
# CUDA graphs and CUDA events
# ------------------------------------------------------------------------------------------
def capture(fn, reps: int, warm: int = 3, graph_stream: bool = True, on_fail=None, fallback: bool = True):
    """Warm fn up (compile/load, descriptors) and capture `reps` calls in a CUDA graph.

    fn(i) is called with i = 0 .. warm-1 on a side stream first, then i = 0 .. reps-1 under
    capture (on that side stream when graph_stream, else on torch's own capture stream).
    Returns a zero-argument replay function and how it is timed ("graph", or "events" when the
    implementation cannot be captured: then the calls themselves run inside the timed region;
    on_fail(exc) is told why; fallback=False raises instead)."""
    torch = _torch()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(warm):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        with _nonempty(), torch.cuda.graph(g, **({"stream": stream} if graph_stream else {})):
            for i in range(reps):
                fn(i)
        torch.cuda.synchronize()
        return g.replay, "graph"
    except EmptyGraph:
        raise
    except Exception as exc:   # noqa: BLE001 - fall back to events, and say so
        if not fallback:
            raise
        torch.cuda.synchronize()
        if on_fail is not None:
            on_fail(exc)

        def loop():
            for i in range(reps):
                fn(i)
        return loop, f"events ({type(exc).__name__})"


def graph_of(fn, calls=20):
    """`calls` calls of fn() captured in a CUDA graph after one call on the current stream (no
    fallback)."""
    torch = _torch()
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with _nonempty(), torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return g


class EmptyGraph(RuntimeError):
    """A capture recorded no work: the calls ran on a stream other than the capturing one, so
    timing its replays would time nothing."""


@contextlib.contextmanager
def _nonempty():
    """Raise EmptyGraph where torch warns that the graph captured in the block is empty."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        if "Graph is empty" in str(w.message):
            raise EmptyGraph("the CUDA graph captured no work: the calls launch on another stream "
                             "than torch's current one")
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def event_ms(run) -> float:
    """Milliseconds of one run() between two CUDA events on the current stream."""
    torch = _torch()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def replays_ms(run, reps: int, warm: bool = True) -> list:
    """event_ms of `reps` runs, after one untimed run (warm)."""
    if warm:
        run()
        _torch().cuda.synchronize()
    return [event_ms(run) for _ in range(reps)]


def graph_us(fn, n=200):
    """Microseconds per call of fn() from n // 20 replays of a graph of 20 calls, one event pair
    around all of them (the kernel time without the host's launch cost)."""
    torch = _torch()
    fn()
    torch.cuda.synchronize()
    replay, _ = capture(lambda i: fn(), 20, warm=1, fallback=False)

    def replays():
        for _ in range(n // 20):
            replay()
    return event_ms(replays) * 1e3 / n


# ------------------------------------------------------------------------------------------
# wall clock
# ------------------------------------------------------------------------------------------
def _block_until_ready(y):
    y.block_until_ready()


def wall_interleaved(fns, *args, calls=1, warmup=2, reps=7, block=_block_until_ready, median=statistics.median):
    """Median seconds per call of each fn: `calls` async calls then one block(result) per sample,
    the fns' samples interleaved (order flipped every round), so clock and power drift weighs on
    every impl alike and the dispatch to every device and the final sync are amortized.
    block: JAX's block_until_ready (default), or e.g. `lambda _: sync()` for torch steps."""
    for fn in fns:
        for _ in range(warmup):
            block(fn(*args))
    times = [[] for _ in fns]
    for r in range(reps):
        for i in (range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))):
            t = time.perf_counter()
            y = None
            for _ in range(calls):
                y = fns[i](*args)
            block(y)
            times[i].append((time.perf_counter() - t) / calls)
    return [median(x) for x in times]


def wall_median(fn, *args, calls=1, warmup=2, reps=7, **kw):
    """wall_interleaved of one fn."""
    return wall_interleaved([fn], *args, calls=calls, warmup=warmup, reps=reps, **kw)[0]


def wall_us_per_call(fn, n=1000):
    """Wall microseconds per call of n back-to-back eager calls (one warm call, synchronized
    before and after): host cost plus whatever of the kernels does not overlap."""
    torch = _torch()
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


# ------------------------------------------------------------------------------------------
# trials and statistics
# ------------------------------------------------------------------------------------------
def time_interleaved(replays, reps: int, trials: int, warm_s: float = 0.3, seed: int = 0,
                     per_trial: bool = False):
    """Median seconds per call for each replay function, trials interleaved: every trial replays
    all implementations once, in the order trial_orders gives (every order in turn for few
    implementations, else shuffled per trial), so that each sees the same clocks and temperature
    (the H200 runs power-limited) and none always follows the same peer.
    (A rotation of one fixed order keeps every predecessor: with it, one config timed twice as two
    entries differed by ~1%, the entry after quack faster than the one after xgemm.)
    per_trial: also return every trial's seconds per call ([implementation][trial]), for ratios
    taken within a trial (paired_ratio)."""
    torch = _torch()
    t_end = time.perf_counter() + warm_s
    while time.perf_counter() < t_end:      # bring the clocks to their loaded state first
        for r in replays:
            r()
        torch.cuda.synchronize()
    times = [[] for _ in replays]
    for perm in trial_orders(len(replays), trials, seed):
        for j in perm:
            times[j].append(event_ms(replays[j]) / 1e3 / reps)
    medians = [statistics.median(t) for t in times]
    return (medians, times) if per_trial else medians


BALANCED_MAX = 4          # up to this many implementations, trials cycle through every order


def trial_orders(n: int, trials: int, seed: int = 0) -> list:
    """The order of the n implementations in each trial. A replay's time depends on the replay
    before it (clock and power state, the previous output's dirty L2: up to ~5% on ~50 us calls,
    launch_gaps.py's docstring), so for up to BALANCED_MAX implementations the trials cycle
    through all n! orders (shuffled once, seeded): over a multiple of n! trials every
    implementation runs after each other one equally often within a trial (gemm.py's three
    implementations: 6 orders, so 18 trials). More implementations (sweeps) get a fresh seeded
    shuffle per trial."""
    rng = random.Random(seed)
    if n <= BALANCED_MAX:
        perms = [list(p) for p in itertools.permutations(range(n))]
        rng.shuffle(perms)
        return [perms[t % len(perms)] for t in range(trials)]
    out = []
    for _ in range(trials):
        perm = list(range(n))
        rng.shuffle(perm)
        out.append(perm)
    return out


def median_ci(values, level: float = 0.95):
    """(low, median, high): the median and a distribution-free confidence interval for it, the
    order statistics x_(j) and x_(n+1-j) with the largest j whose binomial tail P(Bin(n, 1/2) < j)
    is at most (1 - level) / 2 (7 trials: the extremes, 98.4%; 15: the 4th and 12th, 96.5%)."""
    xs = sorted(values)
    n = len(xs)
    tail, j = 0.0, 0
    while j < n // 2:
        nxt = tail + math.comb(n, j) / 2 ** n
        if nxt > (1 - level) / 2:
            break
        tail, j = nxt, j + 1
    j = max(j, 1)
    return xs[j - 1], statistics.median(xs), xs[n - j]


def paired_ratio(ours, peer):
    """median_ci of peer time / our time, trial by trial (the two ran within one trial, so clock
    and temperature drift between trials cancels): > 1 means ours is faster."""
    return median_ci([p / o for o, p in zip(ours, peer)])


def upper_median(xs):
    """The middle value of the sorted xs (the upper of the two middle ones for an even count)."""
    xs = sorted(xs)
    return xs[len(xs) // 2]


def timing_note(reps: int, trials: int) -> str:
    """How time_interleaved timed a run, for a results file's meta."""
    return (f"CUDA graph of {reps} calls, median of {trials} replays (orders: every permutation in turn "
            f"for up to {BALANCED_MAX} implementations, else shuffled per trial)")


# ------------------------------------------------------------------------------------------
# inputs and output checks
# ------------------------------------------------------------------------------------------
class Inputs:
    """Rotating sets of random-normal A (M, K) row-major, B (K, N) row-major and outputs."""

    def __init__(self, m, n, k, dtype, seed=0, out_dtype=None):
        torch = _torch()
        dt = getattr(torch, dtype)
        self.out_dtype = getattr(torch, out_dtype) if out_dtype else dt
        per = (m * k + k * n + m * n) * 2
        self.sets = max(1, min(8, math.ceil(2 * L2_BYTES / per)))
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.a = [torch.randn(m, k, generator=gen, device="cuda").to(dt) for _ in range(self.sets)]
        self.b = [torch.randn(k, n, generator=gen, device="cuda").to(dt) for _ in range(self.sets)]
        self.d = {}
        self.ref = torch.matmul(self.a[0].float(), self.b[0].float())

    def out(self, impl, i):
        torch = _torch()
        key = (impl, i % self.sets)
        if key not in self.d:
            self.d[key] = torch.empty(self.a[0].shape[0], self.b[0].shape[1], dtype=self.out_dtype,
                                      device="cuda")
        return self.d[key]

    def verify(self, impl) -> float:
        torch = _torch()
        got = self.d[(impl, 0)].float()
        return float(torch.linalg.norm(got - self.ref) / torch.linalg.norm(self.ref))


def fp32_input_sets(m, n, k, count=None):
    """[(A, B, D)] fp32 random-normal sets, as many as make the working set > 2x L2 (at most 512)."""
    torch = _torch()
    per_set = 4 * (m * k + k * n + m * n)
    count = count or max(1, min(512, math.ceil(2 * L2_BYTES / per_set)))
    sets = []
    for _ in range(count):
        a = torch.randn(m, k, device="cuda")
        b = torch.randn(k, n, device="cuda")
        d = torch.empty(m, n, device="cuda")
        sets.append((a, b, d))
    return sets


def rel_err(d, a, b) -> float:
    """Relative Frobenius error of d against A @ B in float64."""
    torch = _torch()
    ref = torch.matmul(a.double(), b.double())
    return float((d.double() - ref).norm() / ref.norm())


# ------------------------------------------------------------------------------------------
# implementations: fn(inputs) -> (call(i), note)
# ------------------------------------------------------------------------------------------
def impl_cublas(x: Inputs):
    torch = _torch()

    if x.out_dtype != x.a[0].dtype:        # cuBLAS with an fp32 result (torch.mm's out_dtype)
        def call(i):            # the result is torch's own allocation (the graph's, when captured)
            j = i % x.sets
            x.d[("cublas", j)] = torch.mm(x.a[j], x.b[j], out_dtype=x.out_dtype)
        return call, "torch.mm(out_dtype=float32)"

    def call(i):
        j = i % x.sets
        torch.matmul(x.a[j], x.b[j], out=x.out("cublas", i))
    return call, "torch.matmul"


def impl_xgemm(x: Inputs, name: str = "xgemm"):
    """xgemm.matmul: the dispatch table's pick (`name` keys its output buffers)."""
    import xgemm

    def call(i):
        j = i % x.sets
        xgemm.matmul(x.a[j], x.b[j], out=x.out(name, i))
    plan = xgemm.explain(x.a[0], x.b[0])
    return call, str(plan).replace("\n", " | ")


def impl_quack(x: Inputs):
    """quack's default GEMM (raises ImportError where quack is not installed: bench_gemm records
    the implementation as failed and goes on)."""
    from quack.gemm_interface import gemm as quack_gemm

    def call(i):
        j = i % x.sets
        quack_gemm(x.a[j], x.b[j], out=x.out("quack", i), tuned=False)
    return call, "quack.gemm_interface.gemm(tuned=False): default config"


def problem(a, b, d):
    """GemmProblem + ArrayViews for D = A @ B on torch CUDA tensors (the kernel protocol's inputs)."""
    from xgemm import arrays
    from xgemm.core.problem import Epilogue, GemmProblem
    va, vb, vd = (arrays.view(t, name, "gemm_tc") for t, name in ((a, "a"), (b, "b"), (d, "out")))
    prob = GemmProblem(m=a.shape[0], n=b.shape[1], k=a.shape[1], batch=(), a=arrays.operand(va),
                       b=arrays.operand(vb), c=None, epilogue=Epilogue(out_dtype=vd.dtype), framework="torch",
                       device=va.device)
    return prob, (va, vb, None), vd


def sm90_call(x: Inputs, pol, key: str, swap: bool):
    """call(i) running cute_gemm_sm90 with `pol` through its kernel protocol on input set i; swap:
    on D^T = B^T @ A^T, the transposed views (no copy)."""
    from xgemm.kernels import cute_gemm_sm90 as k90
    torch = _torch()
    preps = [problem(x.b[j].T, x.a[j].T, x.out(key, j).T) if swap else
             problem(x.a[j], x.b[j], x.out(key, j)) for j in range(x.sets)]

    def call(i):
        prob, ops, out = preps[i % x.sets]
        k90.KERNEL.run(prob, pol, ops, out, torch.cuda.current_stream().cuda_stream)
    return call, pol.summary()


def impl_xgemm_config(cfg, swap=False):
    """cute_gemm_sm90 with a forced config (gemm_tc.py --sweep, one_gemm.py --config); swap: on
    the transposed problem. Its outputs are keyed f"cfg{cfg}" (+ "T")."""
    def make(x: Inputs):
        from xgemm.kernels import cute_gemm_sm90 as k90
        return sm90_call(x, k90.Config(*cfg).policy("sweep"), f"cfg{cfg}{'T' if swap else ''}", swap)
    return make


PEERS = {"cublas": impl_cublas, "quack": impl_quack, "xgemm": impl_xgemm}


def bench_gemm(shapes=SHAPES, dtypes=DTYPES, impls=("cublas", "quack", "xgemm"), sweep=(), reps=20,
               trials=7, log=print, out_dtype=None, makers=None):
    """Time each implementation (`makers`: name -> fn(Inputs) -> (call, note); PEERS by default)
    and the sweep entries [(name, maker, output key)] at every shape and dtype: CUDA graphs of
    `reps` calls replayed in time_interleaved's trials, outputs verified, xgemm's per-trial ratio
    to cublas and quack. Returns (records, notes)."""
    torch = _torch()
    records, notes = [], {}
    makers = PEERS if makers is None else makers
    for dtype in dtypes:
        for (m, n, k) in shapes:
            x = Inputs(m, n, k, dtype, out_dtype=out_dtype)
            case = f"gemm_{'bf16' if dtype == 'bfloat16' else 'fp16'}_{m}x{n}x{k}" + \
                (f"_{out_dtype}_out" if out_dtype else "")
            todo = [(name, makers[name], name) for name in impls]
            todo += list(sweep)
            ready = []
            for name, make, out_key in todo:
                try:
                    call, note = make(x)
                    replay, how = capture(call, reps)
                    ready.append((name, replay, how, note, out_key))
                except Exception as exc:   # noqa: BLE001 - record the failure, keep going
                    torch.cuda.synchronize()
                    log(f"{case} {name}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
                    records.append(dict(case=case, shape=[m, n, k], dtype=dtype, impl=name,
                                        metric="TFLOP/s", value=0.0, verified=False))
            secs, per_trial = time_interleaved([r[1] for r in ready], reps, trials, per_trial=True)
            trial_times = {r[0]: t for r, t in zip(ready, per_trial)}
            for (name, _, how, note, out_key), sec in zip(ready, secs):
                rel = x.verify(out_key)
                ok = rel < 1e-2
                tflops = 2 * m * n * k / sec / 1e12
                notes[f"{case} {name}"] = f"{note}; timed by {how}; rel err {rel:.2e}"
                # us as well: at decode sizes a TFLOP/s rounded to 0.1 moves in 2-3% steps
                records.append(dict(case=case, shape=[m, n, k], dtype=dtype, impl=name,
                                    metric="TFLOP/s", value=round(tflops, 1), verified=ok, us=round(sec * 1e6, 3)))
                log(f"{case:28s} {name:44s} {tflops:7.1f} TFLOP/s  {sec * 1e6:9.1f} us  "
                    f"rel {rel:.1e} {'ok' if ok else 'WRONG'}  [{how}]")
            for peer in ("cublas", "quack"):
                if "xgemm" in trial_times and peer in trial_times:
                    lo, mid, hi = paired_ratio(trial_times["xgemm"], trial_times[peer])
                    notes[f"{case} xgemm/{peer} paired"] = [round(lo, 4), round(mid, 4), round(hi, 4)]
                    log(f"{case:28s} xgemm vs {peer:6s}: {mid:.3f}x per trial (95% CI {lo:.3f}-{hi:.3f})")
            del x, ready
            torch.cuda.empty_cache()
    return records, notes


def time_checked(case, shape, dtype, work, unit, impls, outputs, refs, reps, trials, log=print):
    """Capture each impls[name](i) (which leaves its result in outputs[name]) in a CUDA graph of
    `reps` calls, time them in time_interleaved's trials, and check every output against refs[name]
    (relative Frobenius error < 1e-2). work: FLOPs (unit "TFLOP/s") or bytes ("GB/s"), one figure
    or {name: figure}.
    An implementation that fails to run is recorded as failed, the rest go on. Returns (records,
    {name: per-trial seconds}) for paired_ratio."""
    torch = _torch()
    ready, records = [], []
    for name, call in impls.items():
        try:
            replay, how = capture(call, reps)
            ready.append((name, replay, how))
        except Exception as exc:    # noqa: BLE001 -- a peer that cannot run is recorded, not fatal
            torch.cuda.synchronize()
            log(f"{case} {name}: FAILED {type(exc).__name__}: {str(exc)[:200]}")
            records.append(dict(case=case, shape=list(shape), dtype=dtype, impl=name, metric=unit, value=0.0,
                                verified=False))
    secs, per_trial = time_interleaved([r[1] for r in ready], reps, trials, per_trial=True)
    for (name, _, how), sec in zip(ready, secs):
        ref = refs[name]
        rel = float(torch.linalg.norm(outputs[name].float() - ref) / torch.linalg.norm(ref))
        ok = rel < 1e-2
        value = (work[name] if isinstance(work, dict) else work) / sec / (1e12 if unit == "TFLOP/s" else 1e9)
        records.append(dict(case=case, shape=list(shape), dtype=dtype, impl=name, metric=unit, value=round(value, 1),
                            verified=ok, us=round(sec * 1e6, 1), rel_err=rel, timed_by=how))
        log(f"{case:18s} {name:32s} {value:8.1f} {unit}  {sec * 1e6:9.1f} us  rel {rel:.1e} "
            f"{'ok' if ok else 'WRONG'}")
    return records, {r[0]: t for r, t in zip(ready, per_trial)}


def paired_records(case, shape, dtype, ours, by_name, log=print) -> list:
    """Ratio records of `ours` against every other implementation of time_checked's per-trial
    times (paired_ratio: > 1 means ours is faster), with their 95% CIs."""
    recs = []
    for peer, times in by_name.items():
        if peer != ours and ours in by_name:
            lo, mid, hi = paired_ratio(by_name[ours], times)
            recs.append(dict(case=case, shape=list(shape), dtype=dtype, impl=f"{ours} vs {peer}", metric="ratio",
                             value=round(mid, 3), ci=[round(lo, 3), round(hi, 3)], verified=True))
            log(f"{case:18s} {ours} vs {peer}: {mid:.3f}x per trial (95% CI {lo:.3f}-{hi:.3f})")
    return recs


# XLA peers (inside jax.jit)
def xla_matmul(a, b):
    """XLA's dot (jnp.matmul)."""
    import jax.numpy as jnp
    return jnp.matmul(a, b)


def xla_matmul_f32acc(a, b):
    """XLA's dot accumulating in fp32, cast back to the operands' dtype."""
    import jax.numpy as jnp
    return jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(a.dtype)


def xla_softmax(x, axis=-1):
    """jax.nn.softmax."""
    import jax
    return jax.nn.softmax(x, axis=axis)


# ------------------------------------------------------------------------------------------
# profiler
# ------------------------------------------------------------------------------------------
def gpu_events(step, sync, cats=("kernel", "gpu_memcpy", "gpu_memset")) -> list:
    """The GPU operations of one step() under torch.profiler (CUPTI): its chrome-trace events
    ({"ts", "dur", "name", "args": {"device", "stream", ...}}, times in us) of the given cats."""
    import os
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        sync()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.load(open(path))["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in cats]


# ------------------------------------------------------------------------------------------
# results files
# ------------------------------------------------------------------------------------------
def result_path(study: str, ext: str = "json", out=None) -> Path:
    """benchmarks/results/<study>-h200.<ext> (or the same name in the folder `out`)."""
    return Path(out if out else RESULTS) / f"{study}-{GPU_TAG}.{ext}"


def write_json(path, data) -> Path:
    """data as indented JSON (the results format: records plus one {"meta": ...}) at path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path


def records_markdown(records) -> str:
    """A markdown table of result records: case, implementation, value with its unit (or the
    ratio), verified."""
    rows = ["| case | implementation | value | verified |", "|---|---|---|---|"]
    for r in records:
        if "meta" in r:
            continue
        val = f"{r['value']:.3f}x" if r["metric"] == "ratio" else f"{r['value']:.1f} {r['metric']}"
        rows.append(f"| {r['case']} | {r['impl']} | {val} | {'yes' if r['verified'] else 'NO'} |")
    return "\n".join(rows) + "\n"


def run_study(study: str, description: str, parts: dict, dry_run, argv=None, opt_in=()) -> int:
    """The command line the issue benchmarks share: --dry-run (dry_run(print), any machine), or
    each of parts {"torch": fn, "jax": fn} (fn(args, log) -> records; --only one of them; the parts
    named in opt_in run only when --only names them), then <study>-h200.{json,md} in --out and the
    table printed. Exit 1 when an output was wrong."""
    import argparse
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--dry-run", action="store_true", help="the cases and xgemm's plans, no GPU")
    ap.add_argument("--only", choices=tuple(parts))
    ap.add_argument("--reps", type=int, default=5, help="calls per CUDA graph")
    ap.add_argument("--trials", type=int, default=12, help="replays per implementation")
    ap.add_argument("--jax-reps", type=int, default=9, help="wall-clock samples per jit implementation")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    if args.dry_run:
        dry_run(print)
        return 0
    records = []
    for name, part in parts.items():
        if args.only == name or (args.only is None and name not in opt_in):
            records += part(args, print)
    meta = dict(timing=timing_note(args.reps, args.trials), versions=versions(("torch", "jax", "xgemm", "quack")))
    write_json(result_path(study, out=args.out), records + [{"meta": meta}])
    table = records_markdown(records)
    write_text(result_path(study, "md", out=args.out), table)
    print(table)
    return 0 if all(r["verified"] for r in records) else 1


def write_text(path, text: str) -> Path:
    """A markdown table (or any text) at path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def versions(mods) -> dict:
    """{module: __version__} for a results file's meta ("?" without one, "absent" if not importable)."""
    out = {}
    for mod in mods:
        try:
            out[mod] = getattr(__import__(mod, fromlist=["__version__"]), "__version__", "?")
        except Exception:   # noqa: BLE001
            out[mod] = "absent"
    return out
