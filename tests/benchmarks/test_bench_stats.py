"""The benchmarks' statistics on CPU: benchmarks/_harness.py's median_ci (a distribution-free
confidence interval from order statistics), paired_ratio (peer time / ours, trial by trial),
trial_orders (who runs after whom) and the empty-capture guard."""
from __future__ import annotations

import importlib.util
import math
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load_harness():
    """benchmarks/_harness.py from its file (benchmarks/ is not a package; importing it pulls no
    GPU library)."""
    spec = importlib.util.spec_from_file_location("_harness", ROOT / "benchmarks" / "_harness.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_harness = _load_harness()


def _coverage(n: int, j: int) -> float:
    """P(x_(j) <= median <= x_(n+1-j)) for n draws of a continuous variable."""
    return 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2 ** n


def test_median_ci_uses_the_widest_order_statistics_that_keep_95_percent():
    # 7 trials: only the extremes cover >= 95% (98.4%); 15 trials: the 4th and 12th (96.5%)
    assert _harness.median_ci(list(range(1, 8))) == (1, 4, 7)
    assert _harness.median_ci(list(range(1, 16))) == (4, 8, 12)
    assert round(_coverage(15, 4), 3) == 0.965 and _coverage(15, 5) < 0.95
    assert _harness.median_ci([3.0, 1.0, 2.0]) == (1.0, 2.0, 3.0)      # unsorted input
    assert _harness.median_ci([5.0]) == (5.0, 5.0, 5.0)


def test_median_ci_covers_the_true_median_about_as_often_as_it_says():
    rng = random.Random(1)
    hits = 0
    for _ in range(2000):
        lo, _, hi = _harness.median_ci([rng.gauss(1.0, 0.01) for _ in range(15)])
        hits += lo <= 1.0 <= hi
    assert 0.95 <= hits / 2000 <= 0.98          # nominal 96.5%


def test_paired_ratio_is_peer_time_over_ours_per_trial():
    ours = [1.0, 2.0, 1.0, 1.0, 1.0]             # a slow trial for both (clock drop) cancels out
    peer = [1.1, 2.2, 1.1, 1.1, 1.1]
    lo, mid, hi = _harness.paired_ratio(ours, peer)
    assert math.isclose(mid, 1.1) and math.isclose(lo, 1.1) and math.isclose(hi, 1.1)
    assert _harness.paired_ratio(peer, ours)[1] < 1               # > 1 only when ours is faster


def test_trial_orders_balance_who_runs_after_whom():
    from collections import Counter
    orders = _harness.trial_orders(3, 18)
    assert all(sorted(o) == [0, 1, 2] for o in orders)
    after = Counter((o[i], o[i + 1]) for o in orders for i in range(2))
    assert set(after.values()) == {6} and len(after) == 6       # each ordered pair 6 times in 18
    assert _harness.trial_orders(3, 18) == orders                 # seeded
    many = _harness.trial_orders(9, 5)                            # a sweep: shuffled per trial
    assert len(many) == 5 and all(sorted(o) == list(range(9)) for o in many)


def test_upper_median_is_the_middle_of_the_sorted_values():
    assert _harness.upper_median([3.0, 1.0, 2.0]) == 2.0
    assert _harness.upper_median([4.0, 1.0, 3.0, 2.0]) == 3.0     # even count: the upper middle one


def test_records_markdown_lists_values_ratios_and_failures():
    md = _harness.records_markdown([dict(case="c", impl="x vs y", value=1.2345, metric="ratio", verified=True),
                             dict(case="c", impl="y", value=0.0, metric="TFLOP/s", verified=False), {"meta": {}}])
    assert "| c | x vs y | 1.234x | yes |" in md and "| c | y | 0.0 TFLOP/s | NO |" in md
    assert md.count("\n") == 4          # header, rule, two records; the meta record is not a row


def test_an_empty_capture_is_an_error_not_a_timing():
    """A capture whose calls launched on another stream than torch's is empty: torch only warns
    (the fp8 tune of 2026-12-02 timed such graphs at 3.7 us for an 8192^3 product). The harness
    raises instead; other warnings pass through."""
    import warnings

    import pytest
    with pytest.raises(_harness.EmptyGraph):
        with _harness._nonempty():
            warnings.warn("The CUDA Graph is empty. This usually means that the graph was attempted to be "
                          "captured on wrong device or stream.", UserWarning)
    with pytest.warns(UserWarning, match="something else"):
        with _harness._nonempty():
            warnings.warn("something else", UserWarning)
