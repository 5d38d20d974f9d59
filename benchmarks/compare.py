"""Two runs of the same benchmarks side by side: every record (case, dtype, impl) found in both,
with head's figure over base's (oriented so > 1 means head is better) for xgemm and its peers.
The peers' ratios show how far the host itself moved between the two runs.

    python benchmarks/compare.py BASE_DIR HEAD_DIR [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

HIGHER_IS_BETTER = {"TFLOP/s", "GB/s"}


def records(path: Path) -> dict:
    out = {}
    for r in json.loads(path.read_text()):
        if "meta" in r or "value" not in r:
            continue
        out[(r["case"], r.get("dtype"), r["impl"])] = (r["metric"], r["value"], r.get("verified", True))
    return out


def compare(base: Path, head: Path) -> list:
    rows = []
    for b in sorted(base.glob("*.json")):
        h = head / b.name
        if not h.exists():
            continue
        rb, rh = records(b), records(h)
        for key in sorted(rb.keys() & rh.keys()):
            metric, vb, okb = rb[key]
            _, vh, okh = rh[key]
            if not vb or not vh:
                continue
            ratio = vh / vb if metric in HIGHER_IS_BETTER else vb / vh
            rows.append({"file": b.name, "case": key[0], "dtype": key[1], "impl": key[2], "metric": metric,
                         "base": vb, "head": vh, "head_over_base": round(ratio, 4), "verified": okb and okh})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base", type=Path)
    ap.add_argument("head", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = compare(args.base, args.head)
    for r in rows:
        print(f"{r['file']:<22} {r['case'][:48]:<48} {r['impl']:<13} {r['metric']:<8} "
              f"base {r['base']:>10.4g}  head {r['head']:>10.4g}  head/base {r['head_over_base']:.3f}"
              + ("" if r["verified"] else "  UNVERIFIED"))
    for impl in sorted({r["impl"] for r in rows}):
        by_file = {}
        for r in rows:
            if r["impl"] == impl:
                by_file.setdefault(r["file"], []).append(r["head_over_base"])
        print(f"geomean head/base {impl:<13} " + "  ".join(
            f"{f}: {statistics.geometric_mean(v):.3f} (n={len(v)})" for f, v in sorted(by_file.items())))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
