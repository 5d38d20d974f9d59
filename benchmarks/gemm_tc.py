"""fp16/bf16 tensor-core GEMM on the H200: xgemm (cute_gemm_sm90) vs cuBLAS (torch.matmul) and
quack (quack.gemm_interface.gemm, its default config, not autotuned), in one process.

    python benchmarks/gemm_tc.py                      # the acceptance shapes, bf16 + fp16
    python benchmarks/gemm_tc.py --sweep              # + every candidate config per shape (policy tuning)
    python benchmarks/gemm_tc.py --shapes 8192x8192x8192 --dtypes bfloat16 --out x.json
    python benchmarks/gemm_tc.py --out-dtype float32 --impls cublas,xgemm --sweep --sweep-set f32out
                                                      # fp32 results (the K-split partials)
    python benchmarks/gemm_tc.py --shapes 64x8192x8192 --dtypes bfloat16 --sweep --sweep-set splitk
                                                      # gluon_splitk_sm90's tiles x splits (skinny M)
    python benchmarks/gemm_tc.py --impls cublas,quack,xgemm,xgemm-scaled,sm90,sm90T
                                                      # + xgemm.gemm(alpha=1+2^-23) (the class that
                                                      # scales) and the policy's config as given /
                                                      # transposed

Timing: each implementation's call is captured in a CUDA graph (`--reps` launches back to back,
inputs rotating through enough buffer sets that their bytes exceed 2x the L2); after a short
warm-up that brings the clocks to their loaded state, the graphs of all implementations are
replayed `--trials` times, each trial in a freshly shuffled order (the H200 runs power-limited:
interleaving gives each the same clocks, shuffling varies who runs before whom), and the median
replay / reps is the time per call. An implementation that cannot be captured is timed with CUDA
events around the same loop instead (noted in meta).
Every output is checked against torch.matmul in fp32 (relative Frobenius error < 1e-2) on
random-normal inputs; `verified` records the result.

Records follow the project's results format: {"case", "shape", "dtype", "impl", "metric",
"value", "verified"} plus one {"meta": {...}}; a markdown table is printed last.
`bench(...)` is the entry point benchmarks/gemm.py can call.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (8192, 8192, 1024), (2048, 8192, 8192)]
DTYPES = ["bfloat16", "float16"]
L2_BYTES = 60 * 2 ** 20
# candidate sm90 configs for --sweep: (tile_m, tile_n, cluster_m, cluster_n, pingpong, raster_m, swizzle)
SWEEP = [
    (128, 192, 2, 1, True, False, 8), (128, 192, 2, 1, True, False, 4), (128, 192, 2, 1, True, False, 2),
    (128, 128, 2, 1, True, True, 8), (128, 128, 2, 1, True, False, 8), (128, 128, 2, 1, True, True, 16),
    (128, 256, 1, 2, False, True, 8), (128, 256, 1, 2, False, False, 8), (128, 256, 2, 1, False, False, 8),
    (256, 128, 2, 1, False, False, 8), (256, 128, 1, 2, False, True, 8), (128, 192, 1, 2, True, True, 8),
]
# --sweep-set small: candidates for few-tile problems (small M or N, or short K)
SWEEP_SMALL = [
    (128, 64, 1, 1, True, True, 1), (128, 32, 1, 1, True, True, 1), (128, 64, 1, 2, True, True, 1),
    (128, 32, 1, 2, True, True, 1), (128, 96, 1, 1, True, True, 1), (128, 64, 1, 1, False, True, 1),
    (128, 128, 1, 1, True, True, 1), (128, 128, 2, 1, True, True, 8), (128, 192, 2, 1, True, False, 8),
]
# --sweep-set raster: the large row's 128x192 2x1 pingpong in both raster orders and several
# swizzle bands (quack's sm90 default walks along M, bands of 8), with the mid row's candidates
SWEEP_RASTER = [
    (128, 192, 2, 1, True, False, 8), (128, 192, 2, 1, True, False, 16), (128, 192, 2, 1, True, True, 8),
    (128, 192, 2, 1, True, True, 4), (128, 192, 2, 1, True, True, 16), (128, 128, 2, 1, True, True, 8),
    (128, 256, 1, 2, False, True, 8),
]
# --sweep-set zero_init: the big rows' configs with accumulators overwritten by k-tile 0 (the
# default, Config.zero_init) and zero-filled per tile
SWEEP_ZERO_INIT = [cfg + (0, z) for cfg in ((128, 192, 2, 1, True, False, 8), (128, 128, 2, 1, True, True, 8))
                   for z in (True, False)]
# --sweep-set waves: the large row's 128x192 pingpong with its cluster along M (2x1, B multicast)
# or along N (1x2, A multicast), and the mid row's 128x128, on shapes whose cluster-tile counts
# fill the last wave of 66 clusters differently
SWEEP_WAVES = [
    (128, 192, 2, 1, True, False, 8), (128, 192, 1, 2, True, False, 8), (128, 192, 1, 2, True, False, 4),
    (128, 192, 1, 2, True, True, 8), (128, 128, 2, 1, True, True, 8), (128, 128, 1, 2, True, False, 8),
]
# --sweep-set swap: configs run as given and on the transposed problem D^T = B^T @ A^T (True:
# the operands' transposed views, what the policy does for row-major A and B on its wave-aware
# rows; cute_gemm_sm90.SWAP_NOTE)
SWEEP_SWAP = [((128, 192, 2, 1, True, False, 8), False), ((128, 192, 2, 1, True, False, 8), True),
              ((128, 128, 2, 1, True, True, 8), False), ((128, 128, 2, 1, True, True, 8), True),
              ((128, 192, 2, 1, True, False, 4), True), ((128, 192, 2, 1, True, False, 16), True),
              ((128, 192, 2, 1, True, True, 8), True), ((128, 192, 2, 1, True, True, 4), True),
              ((128, 192, 1, 2, True, False, 8), True), ((128, 192, 1, 2, True, True, 8), True)]
# --sweep-set f32out: candidates for fp32 results (a larger epilogue per tile)
SWEEP_F32OUT = [
    (128, 192, 2, 1, True, False, 8), (128, 128, 2, 1, True, True, 8), (128, 256, 1, 2, False, True, 8),
    (128, 256, 2, 1, False, False, 8), (256, 128, 2, 1, False, False, 8), (256, 128, 1, 2, False, True, 8),
]


def _torch():
    import torch
    return torch


def capture(fn, reps: int):
    """Warm fn up (compile/load, descriptors) and capture `reps` calls in a CUDA graph.

    Returns a zero-argument replay function and how it is timed ("graph", or "events" when the
    implementation cannot be captured: then the calls themselves run inside the timed region)."""
    torch = _torch()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            for i in range(reps):
                fn(i)
        torch.cuda.synchronize()
        return g.replay, "graph"
    except Exception as exc:   # noqa: BLE001 - fall back to events, and say so
        torch.cuda.synchronize()

        def loop():
            for i in range(reps):
                fn(i)
        return loop, f"events ({type(exc).__name__})"


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
            r = replays[j]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            r()
            end.record()
            end.synchronize()
            times[j].append(start.elapsed_time(end) / 1e3 / reps)
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


def timing_note(reps: int, trials: int) -> str:
    """How time_interleaved timed a run, for a results file's meta."""
    return (f"CUDA graph of {reps} calls, median of {trials} replays (orders: every permutation in turn "
            f"for up to {BALANCED_MAX} implementations, else shuffled per trial)")


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


# ------------------------------------------------------------------------------------------
# the implementations: fn(inputs) -> (call(i), note)
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


ALPHA_SCALED = 1 + 2 ** -23      # the nearest fp32 above 1: the class that scales, same result


def impl_xgemm_scaled(x: Inputs):
    """xgemm.gemm with alpha = 1 + 2^-23: the policy's kernel in its alpha-scaling class, against
    which `xgemm` (matmul, alpha 1: the class whose epilogue does not scale) is compared."""
    import xgemm

    def call(i):
        j = i % x.sets
        xgemm.gemm(x.a[j], x.b[j], alpha=ALPHA_SCALED, out=x.out("xgemm-scaled", i))
    return call, f"xgemm.gemm(alpha={ALPHA_SCALED!r})"


def _problem(a, b, d):
    """GemmProblem + ArrayViews for D = A @ B on torch CUDA tensors (the kernel protocol's inputs)."""
    from xgemm import interop
    from xgemm.problem import Epilogue, GemmProblem
    va, vb, vd = (interop.view(t, name, "gemm_tc") for t, name in ((a, "a"), (b, "b"), (d, "out")))
    prob = GemmProblem(m=a.shape[0], n=b.shape[1], k=a.shape[1], batch=(), a=interop.operand(va),
                       b=interop.operand(vb), c=None, epilogue=Epilogue(out_dtype=vd.dtype), framework="torch",
                       device=va.device)
    return prob, (va, vb, None), vd


def _sm90_call(x: Inputs, pol, key: str, swap: bool):
    """call(i) running cute_gemm_sm90 with `pol` through its kernel protocol on input set i; swap:
    on D^T = B^T @ A^T, the transposed views (no copy)."""
    from xgemm.kernels import cute_gemm_sm90 as k90
    torch = _torch()
    preps = [_problem(x.b[j].T, x.a[j].T, x.out(key, j).T) if swap else
             _problem(x.a[j], x.b[j], x.out(key, j)) for j in range(x.sets)]

    def call(i):
        prob, ops, out = preps[i % x.sets]
        k90.KERNEL.run(prob, pol, ops, out, torch.cuda.current_stream().cuda_stream)
    return call, pol.summary()


def impl_xgemm_config(cfg, swap=False):
    """cute_gemm_sm90 with a forced config (for --sweep); swap: on the transposed problem."""
    def make(x: Inputs):
        from xgemm.kernels import cute_gemm_sm90 as k90
        return _sm90_call(x, k90.Config(*cfg).policy("sweep"), f"cfg{cfg}{'T' if swap else ''}", swap)
    return make


def impl_sm90_policy(swap):
    """cute_gemm_sm90 with the config its policy picks by shape, run as given (swap False) or on
    D^T = B^T @ A^T with the config for that (N, M, K) problem (--impls sm90 / sm90T)."""
    def make(x: Inputs):
        from xgemm.kernels import cute_gemm_sm90 as k90
        (m, k), n = x.a[0].shape, x.b[0].shape[1]
        why, cfg = k90.choose_config(n, m, k, 1) if swap else k90.choose_config(m, n, k, 1)
        return _sm90_call(x, cfg.policy(why), "sm90T" if swap else "sm90", swap)
    return make


def impl_splitk_config(cfg):
    """gluon_splitk_sm90 with a forced Config (its dtypes replaced by the run's), through its
    kernel protocol (for --sweep-set splitk)."""
    def make(x: Inputs):
        from xgemm.kernels import gluon_splitk_sm90 as sk
        torch = _torch()
        preps = [_problem(x.a[j], x.b[j], x.out(f"sk{tuple(cfg)}", j)) for j in range(x.sets)]
        prob = preps[0][0]
        pol = sk.policy_of(cfg._replace(in_dtype=prob.a.dtype, out_dtype=prob.epilogue.out_dtype))

        def call(i):
            prob, ops, out = preps[i % x.sets]
            sk.KERNEL.run(prob, pol, ops, out, torch.cuda.current_stream().cuda_stream)
        resident = sk.cluster_capacity(sk.config_of(pol, prob.a.dtype, prob.epilogue.out_dtype, False))
        return call, f"{pol.summary()}; {resident} clusters resident at once"
    return make


def sweep_entries(set_name: str):
    """[(impl name, maker, output key)] of one --sweep-set."""
    if set_name == "splitk":
        from xgemm.kernels import gluon_splitk_sm90 as sk
        return [(f"splitk[n{c.bn} k{c.bk} s{c.stages} x{c.split}]", impl_splitk_config(c), f"sk{tuple(c)}")
                for c in sk.tune_configs("bfloat16", "bfloat16", False)]
    if set_name == "swap":
        return [(_tag(c) + ("T" if t else ""), impl_xgemm_config(c, t), f"cfg{c}{'T' if t else ''}")
                for c, t in SWEEP_SWAP]
    cfgs = {"big": SWEEP, "small": SWEEP_SMALL, "f32out": SWEEP_F32OUT, "raster": SWEEP_RASTER,
            "zero_init": SWEEP_ZERO_INIT, "waves": SWEEP_WAVES}[set_name]
    return [(_tag(c), impl_xgemm_config(c), f"cfg{c}") for c in cfgs]


def impl_quack(x: Inputs):
    from quack.gemm_interface import gemm as quack_gemm

    def call(i):
        j = i % x.sets
        quack_gemm(x.a[j], x.b[j], out=x.out("quack", i), tuned=False)
    return call, "quack.gemm_interface.gemm(tuned=False): default config"


def bench(shapes=SHAPES, dtypes=DTYPES, impls=("cublas", "quack", "xgemm"), sweep=(), reps=20,
          trials=7, log=print, out_dtype=None):
    torch = _torch()
    records, notes = [], {}
    makers = {"cublas": impl_cublas, "quack": impl_quack, "xgemm": impl_xgemm, "xgemm-scaled": impl_xgemm_scaled,
              "sm90": impl_sm90_policy(False),
              "sm90T": impl_sm90_policy(True)}
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
                records.append(dict(case=case, shape=[m, n, k], dtype=dtype, impl=name,
                                    metric="TFLOP/s", value=round(tflops, 1), verified=ok))
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


def _tag(c):
    return (f"xgemm[{'pp' if c[4] else 'coop'} {c[0]}x{c[1]} c{c[2]}x{c[3]} "
            f"r{'m' if c[5] else 'n'} s{c[6]}{' filled' if len(c) > 8 and not c[8] else ''}]")


def table(records, notes=None) -> str:
    """Markdown: TFLOP/s per implementation, xgemm over the better peer (medians), and, from
    bench()'s notes, the per-trial paired ratio to quack with its 95% CI."""
    notes = notes or {}
    cases = sorted({(r["dtype"], r["case"]) for r in records}, key=lambda t: (t[0], t[1]))
    impls = []
    for r in records:
        if r["impl"] not in impls:
            impls.append(r["impl"])
    lines = ["| case | " + " | ".join(impls) + " | xgemm / best peer | xgemm / quack per trial (95% CI) |",
             "|---|" + "---|" * (len(impls) + 2)]
    for dtype, case in cases:
        row = {r["impl"]: r for r in records if r["case"] == case}
        cells = [f"{row[i]['value']:.0f}{'' if row[i]['verified'] else ' (WRONG)'}" if i in row else "-"
                 for i in impls]
        peers = [row[i]["value"] for i in ("cublas", "quack") if i in row and row[i]["verified"]]
        ratio = (f"{row['xgemm']['value'] / max(peers):.3f}" if "xgemm" in row and peers
                 and row["xgemm"]["verified"] else "-")
        pq = notes.get(f"{case} xgemm/quack paired")
        paired = f"{pq[1]:.3f} ({pq[0]:.3f}-{pq[2]:.3f})" if pq else "-"
        lines.append(f"| {case} | " + " | ".join(cells) + f" | {ratio} | {paired} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(f"{m}x{n}x{k}" for m, n, k in SHAPES))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--impls", default="cublas,quack,xgemm")
    ap.add_argument("--sweep", action="store_true", help="also time every SWEEP config")
    ap.add_argument("--sweep-dtypes", default="bfloat16")
    ap.add_argument("--sweep-set", choices=("big", "small", "f32out", "splitk", "raster", "zero_init", "waves", "swap"), default="big")
    ap.add_argument("--out-dtype", default=None, help="result dtype (default: the input dtype)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gemm_tc-h200.json"))
    args = ap.parse_args(argv)
    torch = _torch()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    dtypes = [d for d in args.dtypes.split(",") if d]
    impls = tuple(i for i in args.impls.split(",") if i)
    records, notes = [], {}
    for dtype in dtypes:
        sweep = sweep_entries(args.sweep_set) if args.sweep and dtype in args.sweep_dtypes.split(",") else ()
        r, n = bench(shapes, [dtype], impls, sweep, args.reps, args.trials, out_dtype=args.out_dtype)
        records += r
        notes.update(n)
    versions = {}
    for mod in ("torch", "cutlass", "quack", "tvm_ffi"):
        try:
            versions[mod] = getattr(__import__(mod), "__version__", "?")
        except Exception:   # noqa: BLE001
            versions[mod] = "absent"
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(), "sms": torch.cuda.get_device_properties(0).multi_processor_count,
            "versions": versions, "python": platform.python_version(),
            "command": " ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
            "timing": timing_note(args.reps, args.trials),
            "notes": notes}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(records + [{"meta": meta}], indent=1))
    print(table(records, notes))
    return records


if __name__ == "__main__":
    main()
