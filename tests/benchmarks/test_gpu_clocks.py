"""benchmarks/gpu/clocks.py on the CPU: the summary of a stretch of nvidia-smi samples, in the CSV
that device-call.sh's sampler writes (a header, then timestamp, SM MHz, W, C, reasons mask)."""
from __future__ import annotations

import datetime
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
import clocks

CSV = """timestamp, clocks.current.sm [MHz], power.draw [W], temperature.gpu, clocks_event_reasons.active
2026/12/07 23:00:00.000, 345, 80.10, 35, 0x0000000000000001
2026/12/07 23:00:00.500, 1980, 420.00, 45, 0x0000000000000000
2026/12/07 23:00:01.000, 1755, 699.50, 61, 0x0000000000000004
2026/12/07 23:00:01.500, 1740, [N/A], 62, 0x0000000000000004
2026/12/07 23:00:02.000, 1770, 690.00, 63, 0x0000000000000004
2026/12/07 23:00:05.000, 1980, 500.00, 50, 0x0000000000000000
"""


def _t(seconds: float) -> float:
    return datetime.datetime(2026, 12, 7, 23, tzinfo=datetime.timezone.utc).timestamp() + seconds


def test_a_stage_under_the_power_cap(tmp_path):
    path = tmp_path / "smi.csv"
    path.write_text(CSV)
    rows = clocks.samples(str(path), _t(0), _t(2))
    assert len(rows) == 4                  # the header and the "[N/A]" line are skipped; 23:00:05 is past the end
    line = clocks.summary(rows)
    assert line.startswith("SM clock median 1770 MHz (min 1755), power median 690 W (max 700)"), line
    assert "3/4 samples under load" in line and line.endswith("clock lowered by: sw power cap"), line


def test_no_samples_no_line(tmp_path):
    path = tmp_path / "smi.csv"
    path.write_text("nvidia-smi: command not found\n")
    assert clocks.summary(clocks.samples(str(path), _t(0), _t(10))) == ""
