"""Does a row stride that is a multiple of 16 but not of 128 bytes slow the TMA kernels down?

    python benchmarks/row_alignment.py [--shapes 5000x5000x5000,6000x6000x6000] [--out FILE]   (on the H200)

For each M x N x K, bf16 through xgemm.matmul and torch.matmul (cuBLAS) with A, B and the result
either dense (row strides K, N, N elements) or views into buffers whose rows are padded to a
multiple of 64 elements (128 bytes; cuBLAS writes its own dense result); for xgemm also only A
and B padded (ab128), only A (a128), only B (b128) or only D (d128), to tell loads from stores,
and "staged": dense operands copied into row-padded buffers inside every timed call (what a
library-side padding would cost end to end). CUDA-graph timing (20 calls per replay, median of 7
replays, implementations interleaved); every output checked against an fp32 torch.matmul.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

import _harness as h


def padded(rows, cols, pad_to, src=None):
    """(rows, cols) bf16 on the GPU whose row stride is cols rounded up to pad_to elements."""
    ld = -(-cols // pad_to) * pad_to
    buf = torch.empty(rows, ld, dtype=torch.bfloat16, device="cuda")
    view = buf[:, :cols]
    if src is not None:
        view.copy_(src)
    return view


def main() -> int:
    import xgemm
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="5000x5000x5000,5056x5056x5056,6000x6000x6000,6016x6016x6016")
    ap.add_argument("--out", default=str(h.result_path("row_alignment")), help="JSON file ('' for none)")
    args = ap.parse_args()
    records = []
    for m, n, k in (tuple(int(x) for x in v.split("x")) for v in args.shapes.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(0)
        a0 = torch.randn(m, k, generator=gen, device="cuda").bfloat16()
        b0 = torch.randn(k, n, generator=gen, device="cuda").bfloat16()
        ref = a0.float() @ b0.float()
        cases = {}
        # which rows are padded: A and/or B (the TMA loads), D (the TMA stores), all, or none
        for layout, pad_a, pad_b, pad_d in (("dense", 1, 1, 1), ("rows128", 64, 64, 64), ("ab128", 64, 64, 1),
                                            ("a128", 64, 1, 1), ("b128", 1, 64, 1), ("d128", 1, 1, 64)):
            a, b = padded(m, k, pad_a, a0), padded(k, n, pad_b, b0)
            d = padded(m, n, pad_d)
            cases[("xgemm", layout)] = (lambda a=a, b=b, d=d: xgemm.matmul(a, b, out=d), a, b)
            if pad_a == pad_b == pad_d:
                # cuBLAS takes padded A and B; torch allocates its own (dense) result
                cases[("cublas", layout)] = (lambda a=a, b=b: torch.matmul(a, b), a, b)
        a_st, b_st, d_st = padded(m, k, 64), padded(k, n, 64), padded(m, n, 1)

        def staged(a_st=a_st, b_st=b_st, d_st=d_st):
            a_st.copy_(a0)
            b_st.copy_(b0)
            return xgemm.matmul(a_st, b_st, out=d_st)
        cases[("xgemm", "staged")] = (staged, a_st, b_st)
        graphs = {key: h.graph_of(v[0]) for key, v in cases.items()}
        times = {key: [] for key in cases}
        for _ in range(7):
            for key, g in graphs.items():
                times[key].append(h.event_ms(g.replay) * 1e3 / 20)
        for (impl, layout), (fn, a, b) in cases.items():
            d = fn()
            torch.cuda.synchronize()
            err = float((d.float() - ref).norm() / ref.norm())
            us = statistics.median(times[impl, layout])
            tf = 2 * m * n * k / us / 1e6
            plan = xgemm.explain(a, b).policy.summary() if impl == "xgemm" else "torch.matmul"
            print(f"{m}x{n}x{k} {layout:8s} {impl:7s} {tf:7.1f} TFLOP/s {us:8.1f} us  rel {err:.1e} "
                  f"{'ok' if err < 1e-2 else 'WRONG'}  ld {a.stride(0)}  {plan}")
            records.append({"case": f"gemm_bf16_{m}x{n}x{k}_{layout}", "shape": [m, n, k], "dtype": "bfloat16",
                            "impl": impl, "metric": "TFLOP/s", "value": tf, "verified": err < 1e-2})
    if args.out:
        meta = {"meta": {"gpu": torch.cuda.get_device_name(), "command": " ".join(sys.argv),
                         "timing": "CUDA graph of 20 calls, median of 7 replays, implementations interleaved"}}
        h.write_json(args.out, records + [meta])
    return 0


if __name__ == "__main__":
    sys.exit(main())
