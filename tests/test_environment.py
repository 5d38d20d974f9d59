"""CI installs the test and gpu extras: there, every compiler and framework the suite skips
without must be present, so that a broken install cannot turn compile-only tests into skips."""
from __future__ import annotations

import os

import pytest
from conftest import have

REQUIRED = ("numpy", "torch", "jax", "triton", "cutlass", "tvm_ffi", "cuda.bindings", "hypothesis", "flatbuffers")


@pytest.mark.skipif(os.environ.get("CI", "").lower() not in ("1", "true"), reason="only CI promises the full stack")
@pytest.mark.parametrize("module", REQUIRED)
def test_ci_has_the_whole_test_stack(module):
    assert have(module), f"{module} is missing: install with -e '.[test,gpu]' -c .ci/constraints.txt"
