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
The timing, statistics, inputs and peers are benchmarks/_harness.py's (bench_gemm); this file
holds the study: its sweep sets, the xgemm variants it times, its table and CLI.
"""
from __future__ import annotations

import argparse
import datetime
import platform
import sys
from pathlib import Path

import _harness as h
from _harness import DTYPES, SHAPES, impl_xgemm_config

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
# --sweep-set long: the large row's 128x192 and the mid row's 128x128, both on the transposed problem
# (the policy's runs of row-major A and B), for the long-K and wide-N shapes where the wave model
# prefers 128x128 by a few points of predicted fill
SWEEP_LONG = [SWEEP_SWAP[1], SWEEP_SWAP[3]]
# --sweep-set cutesplit: split-K (Config.split) on the tiles the policy splits, for few output
# tiles over a long K (4096x576x7168: 96 tiles of 128x192 on 132 SMs), and the small row's 128x64
# (M <= 128: 64x4096x4096, 128x4096x14336), and 128x160 (N = 576 in four tiles: 4096x576 in one
# wave of 128 tiles, no split); config tuples with
# (stages, zero_init, split) appended
SWEEP_SPLIT = ([(128, 192, 2, 1, True, True, 8, 0, True, s) for s in (1, 2, 3, 4, 5, 6)]
               + [(128, 128, 2, 1, True, True, 8, 0, True, s) for s in (2, 4, 8)]
               + [(128, 64, 1, 1, True, True, 1, 0, True, s) for s in (1, 2, 4)]
               + [(128, 160, 2, 1, True, True, 8, 0, True, s) for s in (1, 2)])
# --sweep-set f32out: candidates for fp32 results (a larger epilogue per tile)
SWEEP_F32OUT = [
    (128, 192, 2, 1, True, False, 8), (128, 128, 2, 1, True, True, 8), (128, 256, 1, 2, False, True, 8),
    (128, 256, 2, 1, False, False, 8), (256, 128, 2, 1, False, False, 8), (256, 128, 1, 2, False, True, 8),
]


# ------------------------------------------------------------------------------------------
# the xgemm variants this study times beside _harness.PEERS: fn(inputs) -> (call(i), note)
# ------------------------------------------------------------------------------------------
ALPHA_SCALED = 1 + 2 ** -23      # the nearest fp32 above 1: the class that scales, same result


def impl_xgemm_scaled(x: h.Inputs):
    """xgemm.gemm with alpha = 1 + 2^-23: the policy's kernel in its alpha-scaling class, against
    which `xgemm` (matmul, alpha 1: the class whose epilogue does not scale) is compared."""
    import xgemm

    def call(i):
        j = i % x.sets
        xgemm.gemm(x.a[j], x.b[j], alpha=ALPHA_SCALED, out=x.out("xgemm-scaled", i))
    return call, f"xgemm.gemm(alpha={ALPHA_SCALED!r})"


def impl_sm90_policy(swap):
    """cute_gemm_sm90 with the config its policy picks by shape, run as given (swap False) or on
    D^T = B^T @ A^T with the config for that (N, M, K) problem (--impls sm90 / sm90T)."""
    def make(x: h.Inputs):
        from xgemm.kernels import cute_gemm_sm90 as k90
        (m, k), n = x.a[0].shape, x.b[0].shape[1]
        why, cfg = k90.choose_config(n, m, k, 1) if swap else k90.choose_config(m, n, k, 1)
        return h.sm90_call(x, cfg.policy(why), "sm90T" if swap else "sm90", swap)
    return make


def impl_splitk_config(cfg):
    """gluon_splitk_sm90 with a forced Config (its dtypes replaced by the run's), through its
    kernel protocol (for --sweep-set splitk)."""
    def make(x: h.Inputs):
        from xgemm.kernels import gluon_splitk_sm90 as sk
        torch = h._torch()
        preps = [h.problem(x.a[j], x.b[j], x.out(f"sk{tuple(cfg)}", j)) for j in range(x.sets)]
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
        return [(f"splitk[n{c.bn} k{c.bk} s{c.stages} {'streamk' if c.streamk else f'x{c.split}'}]",
                 impl_splitk_config(c), f"sk{tuple(c)}")
                for c in sk.tune_configs("bfloat16", "bfloat16", False)]
    if set_name in ("swap", "long"):
        return [(_tag(c) + ("T" if t else ""), impl_xgemm_config(c, t), f"cfg{c}{'T' if t else ''}")
                for c, t in (SWEEP_SWAP if set_name == "swap" else SWEEP_LONG)]
    cfgs = {"big": SWEEP, "small": SWEEP_SMALL, "f32out": SWEEP_F32OUT, "raster": SWEEP_RASTER,
            "zero_init": SWEEP_ZERO_INIT, "waves": SWEEP_WAVES, "cutesplit": SWEEP_SPLIT}[set_name]
    return [(_tag(c), impl_xgemm_config(c), f"cfg{c}") for c in cfgs]


MAKERS = {**h.PEERS, "xgemm-scaled": impl_xgemm_scaled, "sm90": impl_sm90_policy(False),
          "sm90T": impl_sm90_policy(True)}


def _tag(c):
    return (f"xgemm[{'pp' if c[4] else 'coop'} {c[0]}x{c[1]} c{c[2]}x{c[3]} "
            f"r{'m' if c[5] else 'n'} s{c[6]}{' filled' if len(c) > 8 and not c[8] else ''}"
            f"{f' split{c[9]}' if len(c) > 9 and c[9] > 1 else ''}]")


def table(records, notes=None) -> str:
    """Markdown: TFLOP/s per implementation, xgemm over the better peer (medians), and, from
    bench_gemm()'s notes, the per-trial paired ratio to quack with its 95% CI."""
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
    ap.add_argument("--sweep-set", default="big", choices=("big", "small", "f32out", "splitk", "raster", "zero_init",
                                                            "waves", "swap", "long", "cutesplit"))
    ap.add_argument("--out-dtype", default=None, help="result dtype (default: the input dtype)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--out", default=str(h.result_path("gemm_tc")))
    args = ap.parse_args(argv)
    torch = h._torch()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    dtypes = [d for d in args.dtypes.split(",") if d]
    impls = tuple(i for i in args.impls.split(",") if i)
    records, notes = [], {}
    for dtype in dtypes:
        sweep = sweep_entries(args.sweep_set) if args.sweep and dtype in args.sweep_dtypes.split(",") else ()
        r, n = h.bench_gemm(shapes, [dtype], impls, sweep, args.reps, args.trials, out_dtype=args.out_dtype,
                            makers=MAKERS)
        records += r
        notes.update(n)
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(), "sms": torch.cuda.get_device_properties(0).multi_processor_count,
            "versions": h.versions(("torch", "cutlass", "quack", "tvm_ffi")), "python": platform.python_version(),
            "command": " ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
            "timing": h.timing_note(args.reps, args.trials),
            "notes": notes}
    h.write_json(args.out, records + [{"meta": meta}])
    print(table(records, notes))
    return records


if __name__ == "__main__":
    main()
