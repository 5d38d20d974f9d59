"""xgemm's Gluon cluster matmul (gluon_matmul_sm90, called through its kernel protocol) vs cuBLAS
(torch.matmul), quack and the CuTe kernel (xgemm.matmul's pick) at the big GEMM shapes, bf16, on
the H200, in one process: which of the two xgemm kernels the dispatch table should prefer.

    python benchmarks/gemm_gluon.py [--shapes 8192x8192x8192] [--dtypes bfloat16] [--out x.json]

Timing and verification as benchmarks/gemm_tc.py (benchmarks/_harness.py's): CUDA graphs of
--reps calls over rotating input sets (> 2x L2), replayed round-robin --trials times, median;
outputs checked against an fp32 torch.matmul (relative Frobenius error < 1e-2 -> verified).
Needs the prebuilt cubins (python -m xgemm build-cache --arch sm_90a, XGEMM_CACHE_DIR)."""
from __future__ import annotations

import argparse
import datetime
import platform
import sys
from pathlib import Path

import _harness as h


def impl_gluon(x: "h.Inputs", pol=None, name: str = "xgemm"):
    from xgemm.kernels import gluon_matmul_sm90 as gm
    torch = h._torch()
    preps = [h.problem(x.a[j], x.b[j], x.out(name, j)) for j in range(x.sets)]
    pol = pol or gm.KERNEL.policy(preps[0][0])
    reason = gm.KERNEL.supports(preps[0][0])
    if reason:
        raise RuntimeError(f"gluon_matmul_sm90 declines: {reason}")

    def call(i):
        prob, ops, out = preps[i % x.sets]
        gm.KERNEL.run(prob, pol, ops, out, torch.cuda.current_stream().cuda_stream)
    return call, pol.summary()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join("x".join(map(str, t)) for t in h.SHAPES))
    ap.add_argument("--dtypes", default="bfloat16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--all-configs", action="store_true", help="also time every other built tile config")
    ap.add_argument("--out", default=str(h.result_path("gemm_gluon")))
    args = ap.parse_args(argv)
    torch = h._torch()
    records, notes = [], {}
    for dtype in args.dtypes.split(","):
        for s in args.shapes.split(","):
            m, n, k = (int(v) for v in s.split("x"))
            x = h.Inputs(m, n, k, dtype)
            impls = {"cublas": h.impl_cublas(x), "quack": h.impl_quack(x), "xgemm": impl_gluon(x),
                     "xgemm:cute_gemm_sm90": h.impl_xgemm(x, "xgemm:cute_gemm_sm90")}   # the table's pick
            if args.all_configs:    # every built tile config, as "xgemm:<policy summary>"
                from xgemm.kernels import gluon_matmul_sm90 as gm
                prob = h.problem(x.a[0], x.b[0], x.out("xgemm", 0))[0]
                for pol in gm.KERNEL.candidate_policies(prob)[1:]:
                    impls[f"xgemm:{pol.summary()}"] = impl_gluon(x, pol, f"xgemm:{pol.summary()}")
            replays, names = [], []
            for name, (call, note) in impls.items():
                rep, how = h.capture(call, args.reps)
                replays.append(rep)
                names.append(name)
                notes[f"{name} {dtype} {s}"] = f"{note}; {how}"
            secs = h.time_interleaved(replays, args.reps, args.trials)
            tag = {"bfloat16": "bf16", "float16": "fp16"}[dtype]
            for name, t in zip(names, secs):
                err = x.verify(name)
                records.append({"case": f"gemm_{tag}_{m}x{n}x{k}", "shape": [m, n, k], "dtype": dtype,
                                "impl": name, "metric": "TFLOP/s", "value": 2 * m * n * k / t / 1e12,
                                "verified": bool(err < 1e-2)})
                notes[f"{name} {dtype} {s} rel_err"] = err
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "gpu": torch.cuda.get_device_name(),
            "versions": {"torch": torch.__version__}, "python": platform.python_version(),
            "command": " ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
            "timing": f"CUDA graph of {args.reps} calls, median of {args.trials} replays", "notes": notes}
    h.write_json(args.out, records + [{"meta": meta}])
    for r in records:
        print(f"{r['case']:28s} {r['impl']:8s} {r['value']:8.1f} TFLOP/s  verified={r['verified']}")
    return records


if __name__ == "__main__":
    main()
