"""The GPU's SM clock, power and throttle reasons over a stretch of a device call.

device-call.sh samples `nvidia-smi` every half second into $LOGS/smi.csv (timestamp, SM clock MHz,
power W, temperature C, active clock-event reasons as a hex mask); perf.sh's stages call this with
their start and end (Unix seconds) so that each stage's line says what clock it ran at. A power-
capped chip runs a long GEMM below its boost clock, and a stage run hotter or capped harder than
its peer's is no fair comparison (docs/development.md).

    python benchmarks/gpu/clocks.py SMI_CSV START END   ->   one line, or nothing without samples
"""
from __future__ import annotations

import datetime
import statistics
import sys

# nvidia-smi's clocks_event_reasons bits that lower the clock (GPU idle and app settings left out)
REASONS = {0x4: "sw power cap", 0x8: "hw slowdown", 0x20: "sw thermal", 0x40: "hw thermal",
           0x80: "hw power brake"}


def samples(path: str, start: float, end: float) -> list:
    rows = []
    with open(path) as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            try:
                t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
                t = t.replace(tzinfo=datetime.timezone.utc).timestamp()
                row = (t, float(parts[1]), float(parts[2]), float(parts[3]), int(parts[4], 16))
            except (ValueError, IndexError):
                continue             # a header, a "[N/A]" field, a line cut at the end
            if start <= row[0] <= end:
                rows.append(row)
    return rows


def summary(rows: list) -> str:
    if not rows:
        return ""
    busy = [r for r in rows if r[2] > 150] or rows      # the samples under load, where there are any
    clocks, power = [r[1] for r in busy], [r[2] for r in busy]
    mask = 0
    for r in busy:
        mask |= r[4]
    why = ", ".join(name for bit, name in REASONS.items() if mask & bit) or "none"
    return (f"SM clock median {statistics.median(clocks):.0f} MHz (min {min(clocks):.0f}), power median "
            f"{statistics.median(power):.0f} W (max {max(power):.0f}), max {max(r[3] for r in busy):.0f} C, "
            f"{len(busy)}/{len(rows)} samples under load; clock lowered by: {why}")


if __name__ == "__main__":
    print(summary(samples(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))))
