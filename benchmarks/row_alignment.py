"""Does a row stride that is a multiple of 16 but not of 128 bytes slow the TMA kernels down?

    python benchmarks/row_alignment.py [--sizes 5000,5056,6000,6016] [--out FILE]   (on the H200)

For each size S, bf16 S x S x S through xgemm.matmul and torch.matmul (cuBLAS) with A, B and the
result either dense (row stride S elements) or views into buffers whose rows are padded to a
multiple of 64 elements (128 bytes; cuBLAS writes its own dense result); for xgemm also only A
and B padded (ab128) or only D (d128), to tell loads from stores. CUDA-graph timing (20 calls per replay, median of 7
replays, implementations interleaved); every output checked against an fp32 torch.matmul.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def padded(rows, cols, pad_to, src=None):
    """(rows, cols) bf16 on the GPU whose row stride is cols rounded up to pad_to elements."""
    ld = -(-cols // pad_to) * pad_to
    buf = torch.empty(rows, ld, dtype=torch.bfloat16, device="cuda")
    view = buf[:, :cols]
    if src is not None:
        view.copy_(src)
    return view


def graph_of(fn, calls=20):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return g


def main() -> int:
    import xgemm
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="5000,5056,6000,6016")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    records = []
    for s in (int(v) for v in args.sizes.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(0)
        a0 = torch.randn(s, s, generator=gen, device="cuda").bfloat16()
        b0 = torch.randn(s, s, generator=gen, device="cuda").bfloat16()
        ref = a0.float() @ b0.float()
        cases = {}
        # which rows are padded: A and B (the TMA loads), D (the TMA stores), all, or none
        for layout, pad_ab, pad_d in (("dense", 1, 1), ("rows128", 64, 64), ("ab128", 64, 1), ("d128", 1, 64)):
            a, b = padded(s, s, pad_ab, a0), padded(s, s, pad_ab, b0)
            d = padded(s, s, pad_d)
            cases[("xgemm", layout)] = (lambda a=a, b=b, d=d: xgemm.matmul(a, b, out=d), a, b)
            if pad_ab == pad_d:
                # cuBLAS takes padded A and B; torch allocates its own (dense) result
                cases[("cublas", layout)] = (lambda a=a, b=b: torch.matmul(a, b), a, b)
        graphs = {k: graph_of(v[0]) for k, v in cases.items()}
        times = {k: [] for k in cases}
        for _ in range(7):
            for k, g in graphs.items():
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                g.replay()
                e1.record()
                e1.synchronize()
                times[k].append(e0.elapsed_time(e1) * 1e3 / 20)
        for (impl, layout), (fn, a, b) in cases.items():
            d = fn()
            torch.cuda.synchronize()
            err = float((d.float() - ref).norm() / ref.norm())
            us = statistics.median(times[impl, layout])
            tf = 2 * s ** 3 / us / 1e6
            plan = xgemm.explain(a, b).policy.summary() if impl == "xgemm" else "torch.matmul"
            print(f"{s:6d} {layout:8s} {impl:7s} {tf:7.1f} TFLOP/s {us:8.1f} us  rel {err:.1e} "
                  f"{'ok' if err < 1e-2 else 'WRONG'}  ld {a.stride(0)}  {plan}")
            records.append({"case": f"gemm_bf16_{s}x{s}x{s}_{layout}", "shape": [s, s, s], "dtype": "bfloat16",
                            "impl": impl, "metric": "TFLOP/s", "value": tf, "verified": err < 1e-2})
    if args.out:
        meta = {"meta": {"gpu": torch.cuda.get_device_name(), "command": " ".join(sys.argv),
                         "timing": "CUDA graph of 20 calls, median of 7 replays, implementations interleaved"}}
        Path(args.out).write_text(json.dumps(records + [meta], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
