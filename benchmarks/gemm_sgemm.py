"""fp32 GEMM on the GPU: xgemm (cute_sgemm) vs cuBLAS (torch.matmul, TF32 off), same process.

    python benchmarks/gemm_sgemm.py [--out DIR] [--sweep] [--quick] [--shapes 128,128,128 ...]

Times kernels with CUDA graphs: one graph holds a call per input set, input sets rotate so the
working set exceeds L2 (60 MB on the H200), the median over graph replays divided by the calls is
the kernel time. Every timed xgemm output is checked against a float64 reference (`verified`).
Writes `sgemm-h200.json` (the issue's record format) and a markdown table to --out.

`--sweep` also times every candidate (tile config, split-K) of the policy table on each shape
through the kernel protocol with a forced Policy: the data the table in cute_sgemm was set from.
`run(shapes)` is the entry point the lead's benchmarks/gemm.py can call.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import _harness as h
from _harness import rel_err
from _harness import fp32_input_sets as input_sets

TARGETS = [(128, 128, 128), (1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192),
           (8192, 8192, 128), (64, 8192, 8192)]

# candidates per shape for --sweep: (config name, split-K)
EXTRA = [(256, 256, 256), (512, 512, 512), (2048, 2048, 2048), (8192, 64, 8192), (128, 4096, 4096)]

# candidates per shape for --sweep: (config name, split-K)
SWEEP = {
    (128, 128, 128): [("32x32x32", 1), ("32x32x32k2", 1), ("32x32x32k4", 1)],
    (256, 256, 256): [("32x32x32", 1), ("32x32x32k2", 1), ("32x32x32k4", 1)],
    (1024, 1024, 1024): [("128x128x32", 4), ("128x128x16", 4), ("128x128x24", 4)],
    (2048, 2048, 2048): [("128x128x24", 1), ("128x128x24s2", 1)],
    (6144, 6144, 6144): [("128x128x24", 1), ("128x128x24s2", 1)],
    (4096, 4096, 4096): [("128x128x24", 1), ("128x128x24s2", 1)],
    (4096, 4096, 1024): [("128x128x24", 1), ("128x128x24s2", 1)],
    (8192, 8192, 8192): [("128x128x32", 1), ("128x128x16", 1), ("128x128x24", 1), ("128x128x24s2", 1)],
    (8192, 8192, 128): [("64x128x16w", 1), ("128x128x16", 1), ("128x128x32", 1)],
}


def _torch():
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def graph_time_us(calls, reps: int = 10) -> float:
    """Median kernel time per call: `calls` captured once into a CUDA graph, replayed `reps` times."""
    _torch()                                # TF32 off
    run_once, _ = h.capture(lambda i: calls[i](), len(calls), warm=len(calls), graph_stream=False,
                            on_fail=lambda exc: print(f"graph capture failed ({type(exc).__name__}: {exc}); "
                                                      "timing plain launches", flush=True))
    return statistics.median([ms * 1000.0 / len(calls) for ms in h.replays_ms(run_once, reps)])


def _view(t):
    """The ArrayView the API hands a kernel for tensor t."""
    from xgemm import arrays
    return arrays.view(t, "t", "gemm_sgemm")


def _kernel_call(a, b, d, policy=None):
    """cute_sgemm through its protocol, with the policy table's choice or a forced Policy."""
    from xgemm.kernels import cute_sgemm as S
    from xgemm.core.layout import unit_stride_dim
    from xgemm.core.problem import Device, Epilogue, GemmProblem, Operand
    torch = _torch()
    dev = Device("cuda", torch.cuda.current_device(), torch.cuda.get_device_capability())
    v = _view

    def op(t):
        return Operand(tuple(t.shape), tuple(t.stride()), "float32", unit_stride_dim(t.shape, t.stride()), 16)
    prob = GemmProblem(a.shape[0], b.shape[1], a.shape[1], (), op(a), op(b), None, Epilogue(), "torch", dev)
    pol = policy or S.KERNEL.policy(prob)
    views = (v(a), v(b), None), v(d)

    def call():
        S.KERNEL.run(prob, pol, views[0], views[1], torch.cuda.current_stream().cuda_stream)
    return call, prob, pol


def _api_call(a, b, d):
    """The public entry point, forced onto cute_sgemm (falls back to the protocol if absent)."""
    try:
        import xgemm
        if "cute_sgemm" not in xgemm.core.policy.kernel_names("gemm"):
            raise ImportError("cute_sgemm not registered")
    except ImportError:
        return _kernel_call(a, b, d)[0], "protocol"

    def call():
        with xgemm.core.policy.force("cute_sgemm"):
            xgemm.matmul(a, b, out=d)
    return call, "xgemm.matmul"


def warm_classes(shapes, sweep: bool) -> None:
    """Compile every class the run needs up front, in parallel worker processes."""
    from xgemm.runtime import cute_cache as xcompile
    from xgemm.kernels import cute_sgemm as S
    torch = _torch()
    items = []
    for m, n, k in shapes:
        a, b, d = (torch.empty(m, k, device="cuda"), torch.empty(k, n, device="cuda"),
                   torch.empty(m, n, device="cuda"))
        cands = [None] + ([_policy(c, s) for c, s in SWEEP.get((m, n, k), [])] if sweep else [])
        for pol in cands:
            _, prob, pol = _kernel_call(a, b, d, pol)
            for key, _ in S.KERNEL.required(prob, pol, (_view(a), _view(b), None), _view(d)):
                items.append(("xgemm.kernels.cute_sgemm", key))
    t0 = time.perf_counter()
    n = xcompile.warm(items, jobs=min(16, os.cpu_count() or 1))
    print(f"warm: {len(set(k for _, k in items))} classes, {n} compiled in {time.perf_counter() - t0:.1f}s",
          flush=True)


def _policy(cfg_name, split):
    from xgemm.kernels import cute_sgemm as S
    return S.policy_of(cfg_name, split)


def sweep(shapes, log) -> list:
    rows = []
    for m, n, k in shapes:
        cands = SWEEP.get((m, n, k), [])
        if not cands:
            continue
        sets = input_sets(m, n, k)
        reps = 5 if m * n * k >= 4096**3 else 10
        cub = graph_time_us([lambda a=a, b=b, d=d: _torch().matmul(a, b, out=d) for a, b, d in sets], reps)
        for cfg_name, split in cands:
            calls = [_kernel_call(a, b, d, _policy(cfg_name, split))[0] for a, b, d in sets]
            try:
                t = graph_time_us(calls, reps)
                a, b, d = sets[0]
                calls[0]()
                _torch().cuda.synchronize()
                err = rel_err(d, a, b)
            except Exception as exc:  # noqa: BLE001 - report and keep sweeping
                log(f"sweep {m}x{n}x{k} {cfg_name} split {split}: FAILED {type(exc).__name__}: {exc}")
                continue
            rows.append(dict(shape=[m, n, k], config=cfg_name, split=split, us=t, cublas_us=cub,
                             ratio=cub / t, err=err))
            log(f"sweep {m}x{n}x{k:<5} {cfg_name:>13} split {split}: {t:9.1f} us  cuBLAS {cub:9.1f} us  "
                f"x{cub / t:5.2f}  err {err:.1e}")
    return rows


def run(shapes=TARGETS, log=print):
    """Time xgemm (the policy's choice, through xgemm.matmul) and cuBLAS at each shape; verified."""
    torch = _torch()
    records = []
    for m, n, k in shapes:
        sets = input_sets(m, n, k)
        reps = 5 if m * n * k >= 4096**3 else 10
        flops = 2.0 * m * n * k
        calls, how = [], "protocol"
        for a, b, d in sets:
            f, how = _api_call(a, b, d)
            calls.append(f)
        t_x = graph_time_us(calls, reps)
        a, b, d = sets[0]
        d.fill_(float("nan"))
        calls[0]()
        torch.cuda.synchronize()
        err_x = rel_err(d, a, b)
        t_c = graph_time_us([lambda a=a, b=b, d=d: torch.matmul(a, b, out=d) for a, b, d in sets], reps)
        torch.matmul(a, b, out=d)
        torch.cuda.synchronize()
        err_c = rel_err(d, a, b)
        _, prob, pol = _kernel_call(a, b, d)
        case = f"gemm_fp32_{m}x{n}x{k}"
        for impl, t, err in (("xgemm", t_x, err_x), ("cublas", t_c, err_c)):
            ok = bool(err < 1e-5)
            records.append(dict(case=case, shape=[m, n, k], dtype="float32", impl=impl, metric="us",
                                value=round(t, 3), verified=ok))
            records.append(dict(case=case, shape=[m, n, k], dtype="float32", impl=impl, metric="TFLOP/s",
                                value=round(flops / t / 1e6, 3), verified=ok))
        log(f"{case:<28} xgemm {t_x:10.1f} us ({flops / t_x / 1e6:6.2f} TF/s, err {err_x:.1e}, "
            f"{pol.summary()}, via {how})  cuBLAS {t_c:10.1f} us ({flops / t_c / 1e6:6.2f} TF/s)  "
            f"time ratio xgemm/cuBLAS {t_x / t_c:5.2f}")
        del sets
        torch.cuda.empty_cache()
    return records


def host_overhead_us(n: int = 1000) -> dict:
    """Wall time of n back-to-back calls at 256^3 minus the kernel time (graph-timed)."""
    torch = _torch()
    a, b = torch.randn(256, 256, device="cuda"), torch.randn(256, 256, device="cuda")
    d = torch.empty(256, 256, device="cuda")
    out = {}
    kcall = _kernel_call(a, b, d)[0]
    api, how = _api_call(a, b, d)
    kernel_us = graph_time_us([kcall] * 20, 10)
    for name, f in (("protocol", kcall), (how, api)):
        for _ in range(20):
            f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e6 / n
        out[name] = dict(wall_us=round(wall, 2), kernel_us=round(kernel_us, 2),
                         host_overhead_us=round(max(wall - kernel_us, 0.0), 2))
    return out


def meta(args) -> dict:
    torch = _torch()
    try:
        import cutlass
        cutlass_v = cutlass.__version__
    except ImportError:
        cutlass_v = None
    return {"meta": dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                         gpu=torch.cuda.get_device_name(), torch=torch.__version__, cutlass_dsl=cutlass_v,
                         cuda=torch.version.cuda, python=platform.python_version(), tf32=False,
                         timing="CUDA graph, rotating inputs > 2x L2, median of replays",
                         command=" ".join([Path(sys.argv[0]).name] + sys.argv[1:]))}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(h.RESULTS))
    p.add_argument("--sweep", action="store_true", help="also time every policy candidate per shape")
    p.add_argument("--no-overhead", action="store_true")
    p.add_argument("--shapes", nargs="*", default=None, help="M,N,K ...")
    p.add_argument("--extra", action="store_true", help="also time the extra shapes (policy rows)")
    args = p.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes] if args.shapes else list(TARGETS)
    if args.extra:
        shapes += EXTRA
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)
    warm_classes(shapes, args.sweep)
    records = [meta(args)]
    if args.sweep:
        rows = sweep(shapes, log)
        h.write_json(h.result_path("sgemm-sweep", out=out), rows)
    records += run(shapes, log)
    if not args.no_overhead:
        oh = host_overhead_us()
        log(f"host overhead at 256^3: {json.dumps(oh)}")
        records[0]["meta"]["host_overhead_256"] = oh
    h.write_json(h.result_path("sgemm", out=out), records)
    table = ["| shape (M,N,K) | xgemm us | cuBLAS us | xgemm TFLOP/s | cuBLAS TFLOP/s | time ratio | verified |",
             "|---|---|---|---|---|---|---|"]
    by = {}
    for r in records[1:]:
        by.setdefault(r["case"], {})[(r["impl"], r["metric"])] = r
    for case, rs in by.items():
        x, c = rs[("xgemm", "us")], rs[("cublas", "us")]
        table.append(f"| {tuple(x['shape'])} | {x['value']:.1f} | {c['value']:.1f} | "
                     f"{rs[('xgemm', 'TFLOP/s')]['value']:.2f} | {rs[('cublas', 'TFLOP/s')]['value']:.2f} | "
                     f"{x['value'] / c['value']:.2f} | {x['verified']} |")
    h.write_text(h.result_path("sgemm", "md", out=out), "\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
