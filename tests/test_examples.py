"""Every examples/*.py runs to the end (exit status 0) in a fresh interpreter.

The examples check their own results (against NumPy float64, eager torch or jnp) and exit non-zero
on a mismatch; each picks CUDA when it is there, so the same files run on the H200. An example
that imports a framework unconditionally (at the top level, outside a try) is skipped when that
framework is missing; the others skip what is absent themselves.

Each takes 5-20 s on two CPU cores, mostly imports and compiles on one core, so the selected
examples start together, two at a time, when the first of these tests runs (one at a time per
worker under pytest-xdist, which spreads them already).
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def _needs(path: Path) -> list:
    """Frameworks the example imports at the top level, outside a try (so it cannot run without)."""
    found = re.findall(r"^(?:import|from) (torch|jax|cupy)\b", path.read_text(), re.MULTILINE)
    return sorted(set(found))


def test_there_are_examples():
    assert len(EXAMPLES) >= 6, EXAMPLES


def _missing(path: Path) -> list:
    return [m for m in _needs(path) if importlib.util.find_spec(m) is None]


def _run(path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("JAX_ENABLE_X64", None)   # conftest turns x64 on for the tests; run as a user would
    return subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def started(request):
    """The selected, runnable examples, started two at a time (torch.compile's, the slowest, first)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        yield None
        return
    chosen = [item.callspec.params["path"] for item in request.session.items
              if getattr(item, "originalname", None) == "test_example_runs"]
    chosen = sorted((p for p in chosen if not _missing(p)), key=lambda p: "torch.compile(" not in p.read_text())
    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        yield {p: pool.submit(_run, p) for p in chosen}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path, started):
    missing = _missing(path)
    if missing:
        pytest.skip(f"{path.name} needs {', '.join(missing)}")
    proc = started[path].result() if started and path in started else _run(path)
    assert proc.returncode == 0, (f"{path.name} exited {proc.returncode}\n"
                                  f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
    assert proc.stdout.strip(), f"{path.name} printed nothing"
