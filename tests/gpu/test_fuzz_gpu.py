"""GPU fuzzing through hypothesis: benchmarks/fuzz.py's case generator drawn by hypothesis (which
shrinks a failure toward a small, plain case), run against float64 references with NaN-poisoned
outputs, for each framework. benchmarks/fuzz.py runs the same cases at scale (issue 22: >= 20,000
per H200 run); a failure here prints the same one-line reproducer.

FUZZ_EXAMPLES (default 100) sets the cases per framework.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fuzz  # noqa: E402

pytestmark = pytest.mark.gpu
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "100"))


@pytest.mark.parametrize("framework", fuzz.FRAMEWORKS)
@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzz(framework, data):
    if framework not in fuzz.gpu_frameworks((framework,)):
        pytest.skip(f"{framework} has no GPU here")
    case = fuzz.draw(lambda name, options: data.draw(st.sampled_from(options), label=name), (framework,))
    seed = data.draw(st.integers(0, 2 ** 31 - 1), label="seed")
    why = fuzz.run_case(case, seed)
    assert why is None, f"{why}\n{fuzz.reproducer(case, seed)}"
