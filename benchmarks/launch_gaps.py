"""Back-to-back GEMMs in one CUDA graph, on the GPU's own clock: each kernel's duration and the gap
from one kernel's end to the next one's start, for xgemm, quack and cuBLAS (torch.profiler / CUPTI).

    python benchmarks/launch_gaps.py [--shapes 8192x8192x128,8192x8192x1024] [--calls 20] [--out F]

Why: at short K quack's lead in gemm_tc.py's graph timing (time per call of 20 back-to-back calls)
was ~7% while one kernel alone under Nsight Compute differed by ~2%, so the rest lies between the
calls (launch, programmatic dependent launch overlap) or in how a call runs after another. Each
implementation's calls are captured in a graph (inputs rotating as in _harness.Inputs), replayed
once to warm up and once under the profiler; every output is checked against torch.matmul. A
negative gap means the next kernel started before the previous one ended (PDL prologue overlap).
Records: per implementation and shape, the median kernel duration and median gap (us).
"""
from __future__ import annotations

import argparse
import statistics
import sys

import _harness as h


def kernel_events(torch, replay) -> list:
    """(start, end, name), times in us, of every kernel one replay() runs, in start order."""
    ks = h.gpu_events(replay, torch.cuda.synchronize, cats=("kernel",))
    return sorted((e["ts"], e["ts"] + e.get("dur", 0), e.get("name", "")) for e in ks)


def main() -> int:
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x8192x128,8192x8192x1024")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--impls", default="cublas,quack,xgemm")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--out", default=str(h.result_path("launch_gaps")), help="JSON file ('' for none)")
    args = ap.parse_args()
    makers = h.PEERS
    records = []
    for m, n, k in (tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")):
        x = h.Inputs(m, n, k, args.dtype)
        for name in args.impls.split(","):
            call, _ = makers[name](x)
            replay, how = h.capture(call, args.calls)
            replay()
            torch.cuda.synchronize()
            ks = kernel_events(torch, replay)
            rel = x.verify(name)
            durs = [e - s for s, e, _ in ks]
            gaps = [s1 - e0 for (_, e0, _), (s1, _, _) in zip(ks, ks[1:])]
            dur, gap = statistics.median(durs), statistics.median(gaps) if gaps else float("nan")
            label = f"{m}x{n}x{k}"
            print(f"{label:16s} {name:7s} kernels {len(ks):3d}  duration {dur:8.2f} us  gap {gap:6.2f} us "
                  f"(min {min(gaps, default=float('nan')):6.2f})  per call {dur + gap:8.2f} us  rel {rel:.1e} "
                  f"{'ok' if rel < 1e-2 else 'WRONG'}  [{how}] {ks[0][2][:60] if ks else ''}")
            for metric, value in (("us", dur), ("gap_us", gap)):
                records.append({"case": f"gemm_{'bf16' if args.dtype == 'bfloat16' else 'fp16'}_{label}"
                                        + ("" if metric == "us" else "_gap"),
                                "shape": [m, n, k], "dtype": args.dtype, "impl": name, "metric": "us",
                                "value": round(value, 3), "verified": rel < 1e-2})
        del x
        torch.cuda.empty_cache()
    if args.out:
        meta = {"meta": {"gpu": torch.cuda.get_device_name(), "command": " ".join(sys.argv),
                         "timing": f"one CUDA graph of {args.calls} calls under torch.profiler (CUPTI); "
                                   "medians of kernel durations and of end-to-next-start gaps"}}
        h.write_json(args.out, records + [meta])
    return 0


if __name__ == "__main__":
    sys.exit(main())
