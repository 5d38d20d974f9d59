"""xgemm GEMM vs cuBLAS (torch.matmul) and quack, one process on the H200: JSON + table + PNG.

    python benchmarks/gemm.py                      # H200: runs both benches below, then renders
    python benchmarks/gemm.py --render             # any machine: table + PNG from results/gemm-h200.json

bf16/fp16 (tensor cores) come from _harness.bench_gemm (gemm_tc.py's timing: CUDA graphs,
interleaved replays, outputs verified), fp32 from benchmarks/gemm_sgemm.py (TF32 off, through
xgemm.matmul; this figure's fp32 half is that study's run). The PNG
shows TFLOP/s per case with the measured cuBLAS figure and the datasheet peak as lines.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import _harness as h

RESULTS = h.RESULTS
PEAK = {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0}     # H100/H200 SXM datasheet, dense
SMALL = [(128, 128, 128), (1024, 1024, 1024), (8192, 8192, 128), (64, 8192, 8192)]


def measure(out: Path, trials: int) -> None:
    import gemm_sgemm      # the fp32 study (a genuine dependency: its run() is this figure's fp32 half)
    reps = 20
    tc, notes = h.bench_gemm(shapes=h.SHAPES + SMALL, reps=reps, trials=trials)
    fp32 = gemm_sgemm.run(gemm_sgemm.TARGETS)
    meta = gemm_sgemm.meta(argparse.Namespace())
    meta["meta"]["command"] = f"python benchmarks/gemm.py --trials {trials}"
    meta["meta"]["timing_bf16_fp16"] = "gemm_tc: " + h.timing_note(reps, trials)
    # per-trial ratios (peer time / xgemm time within one trial): [CI low, median, CI high]
    meta["meta"]["paired"] = {k: v for k, v in notes.items() if k.endswith(" paired")}
    h.write_json(out / "gemm-h200.json", tc + fp32 + [meta])


def load_paired(paths) -> dict:
    """The per-trial paired ratios measure() keeps in the meta record ({} for older files)."""
    out = {}
    for p in paths:
        for r in json.loads(Path(p).read_text()):
            if "meta" in r:
                out.update(r["meta"].get("paired", {}))
    return out


def load(paths) -> list:
    records = []
    for p in paths:
        records += [r for r in json.loads(Path(p).read_text()) if "meta" not in r and r.get("metric") == "TFLOP/s"]
    return records


def render(records: list, out: Path, stem: str, sources: str, paired: dict | None = None) -> None:
    paired = paired or {}
    cases = sorted({r["case"] for r in records}, key=lambda c: (c.split("_")[1], c))
    impls = ("xgemm", "cublas", "quack")
    value = {(r["case"], r["impl"]): r for r in records}
    lines = ["| case | " + " | ".join(impls) + " | xgemm / best peer | per trial vs cuBLAS | per trial vs quack |",
             "|---|---|---|---|---|---|---|"]
    for c in cases:
        cells = [f"{value[c, i]['value']:.1f}{'' if value[c, i]['verified'] else ' (UNVERIFIED)'}"
                 if (c, i) in value else "-" for i in impls]
        peers = [value[c, i]["value"] for i in impls[1:] if (c, i) in value and value[c, i]["verified"]]
        ratio = value[c, "xgemm"]["value"] / max(peers) if peers and (c, "xgemm") in value else float("nan")
        per = [f"{p[1]:.3f} ({p[0]:.3f}-{p[2]:.3f})" if p else "-"
               for p in (paired.get(f"{c} xgemm/{peer} paired") for peer in impls[1:])]
        lines.append(f"| {c} | " + " | ".join(cells) + f" | {ratio:.3f} | " + " | ".join(per) + " |")
    h.write_text(out / f"{stem}.md",
                 "# GEMM on the H200 (TFLOP/s; each row's peers measured in the same run)\n\n"
                 f"From {sources}. `xgemm / best peer` divides medians; `per trial` is the median of the "
                 "peer's time over xgemm's within each trial (> 1: xgemm faster) with its 95% "
                 "distribution-free confidence interval (bf16/fp16 rows only).\n\n" + "\n".join(lines) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [3, 1]})
    for ax, half in zip(axes, (True, False)):
        sel = [c for c in cases if ("fp32" not in c) == half]
        xs = range(len(sel))
        for j, impl in enumerate(impls):
            ys = [value[c, impl]["value"] if (c, impl) in value else 0 for c in sel]
            ax.bar([x + 0.27 * (j - 1) for x in xs], ys, width=0.27, label=impl)
        peak = PEAK["bfloat16" if half else "float32"]
        ax.axhline(peak, color="k", ls="--", lw=1, label=f"datasheet peak {peak:g}")
        ax.set_xticks(list(xs), [c.replace("gemm_", "") for c in sel], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s")
        ax.set_title("tensor cores (bf16/fp16)" if half else "fp32 (TF32 off)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"{stem}.png", dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--render", action="store_true", help="only render the committed results/gemm-h200.json "
                    "(into --out)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--trials", type=int, default=18, help="replays per bf16/fp16 implementation (a multiple of 6 "
                    "runs each of the 3 implementations after each other one equally often)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    src = RESULTS if args.render else out
    if not args.render:
        measure(out, args.trials)
    render(load([src / "gemm-h200.json"]), out, "gemm-h200", "gemm-h200.json (one run)",
           load_paired([src / "gemm-h200.json"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
