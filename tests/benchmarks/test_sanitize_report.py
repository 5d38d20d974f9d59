"""benchmarks/sanitize_cases.py's report on synthetic compute-sanitizer logs: errors are counted by
the kernel they happened in and listed by what they say and the case they came from, unfinished runs and wrong outputs fail the run."""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import sanitize_cases as sc  # noqa: E402

CLEAN = """========= COMPUTE-SANITIZER
=== CASE cute small kernel=cute_gemm_sm90
    ok cute small: max rel err 3.6e-03
=== CASE softmax kernel=gluon_softmax
    ok softmax: max rel err 1e-06
========= ERROR SUMMARY: 0 errors
"""

DIRTY = """========= COMPUTE-SANITIZER
=== CASE cute padded staging kernel=cute_gemm_sm90
========= Uninitialized __global__ memory read of size 2 bytes
=========     at void at::native::elementwise_kernel<(int)128, (int)4>(int, T3)+0x1a0
=========     by thread (32,0,0) in block (132,0,0)
========= 
========= Invalid __global__ read of size 4 bytes
=========     at xgemm_softmax_online+0x3f0
=========     by thread (1,0,0) in block (0,0,0)
========= Program hit CUDA_ERROR_INVALID_VALUE (error 1) due to "invalid argument" on CUDA API call to cuPointerGetAttribute.
=========     Saved host backtrace up to driver entry point at error
    WRONG cute sgemm: max rel err 2.8e-05
========= ERROR SUMMARY: 3 errors
"""


def test_clean_run_passes_and_dirty_runs_are_attributed(tmp_path, capsys):
    (tmp_path / "memcheck-torch.log").write_text(CLEAN)
    assert sc.report(tmp_path) == 0
    r = sc.parse(DIRTY)
    assert r["cases"] == ["cute_gemm_sm90"] and r["wrong"] == 1 and r["summary"] == 3
    kernels = [k for _, k, _, _ in r["errors"]]
    assert {case for _, _, case, _ in r["errors"]} == {"cute padded staging"}
    assert not any(probe for *_, probe in r["errors"])
    assert kernels == ["at::native::elementwise_kernel", "xgemm_softmax_online", "API"]
    assert [sc.owner(k) for k in kernels[:2]] == ["framework", "xgemm"]
    (tmp_path / "initcheck-torch.log").write_text(DIRTY)
    (tmp_path / "racecheck-torch.log").write_text(CLEAN.replace("========= ERROR SUMMARY: 0 errors\n", ""))
    assert sc.report(tmp_path) == 1
    out = capsys.readouterr().out
    assert "xgemm:xgemm_softmax_online x1" in out and "framework:at::native::elementwise_kernel x1" in out
    assert "unfinished" in out
    assert "1 x [cute padded staging] Invalid __global__ read of size # bytes" in out


def test_cases_filter_announces_only_matching_cases(capsys):
    sc.SELECT = re.compile("config .* cluster 1x1")
    try:
        assert sc._mark("cute config 128x64 cluster 1x1 pingpong swizzle 1", "cute_gemm_sm90")
        assert not sc._mark("cute medium", "cute_gemm_sm90")
    finally:
        sc.SELECT = re.compile("")
    assert capsys.readouterr().out == "=== CASE cute config 128x64 cluster 1x1 pingpong swizzle 1 kernel=cute_gemm_sm90\n"


# memcheck on the H200 (2026-12-02): cuda-bindings' driver symbol probes at import, before any case
PROBES = """========= COMPUTE-SANITIZER
========= Program hit CUDA_ERROR_INVALID_VALUE (error 1) due to "invalid argument" on CUDA API call to cuGetProcAddress_v2.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame:  [0xd4a2] in cydriver.cpython-312-x86_64-linux-gnu.so
=========         Host Frame: detect_gpu_arch in env_manager.py:422
========= 
=== CASE cute small kernel=cute_gemm_sm90
    ok cute small: max rel err 3.6e-03
========= Program hit CUDA_ERROR_INVALID_VALUE (error 1) due to "invalid argument" on CUDA API call to cuGetProcAddress_v2.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame:  [0xd4a2] in cydriver.cpython-312-x86_64-linux-gnu.so
========= ERROR SUMMARY: 2 errors
"""


def test_driver_symbol_probes_are_listed_not_failures(tmp_path, capsys):
    r = sc.parse(PROBES)
    assert [probe for *_, probe in r["errors"]] == [True, True]
    (tmp_path / "memcheck-torch.log").write_text(PROBES)
    assert sc.report(tmp_path) == 0
    out = capsys.readouterr().out
    assert "probe: [(before the first case)] Program hit CUDA_ERROR_INVALID_VALUE" in out
    # the same call from anywhere but the binding is an error; so is one more error than probes
    (tmp_path / "memcheck-torch.log").write_text(PROBES.replace("cydriver", "libxgemm"))
    assert sc.report(tmp_path) == 1
    (tmp_path / "memcheck-torch.log").write_text(PROBES.replace("SUMMARY: 2 errors", "SUMMARY: 3 errors"))
    assert sc.report(tmp_path) == 1


def test_racecheck_summary_and_control_logs(tmp_path, capsys):
    race = CLEAN.replace("========= ERROR SUMMARY: 0 errors",
                         "========= RACECHECK SUMMARY: 20 hazards displayed (13314 errors, 0 warnings)")
    assert sc.parse(race)["summary"] == 13314
    (tmp_path / "racecheck-control.log").write_text(race)
    (tmp_path / "racecheck-torch.log").write_text(CLEAN)
    assert sc.report(tmp_path) == 0
    assert "control: the peers' kernels" in capsys.readouterr().out
    (tmp_path / "racecheck-torch.log").write_text(race)
    assert sc.report(tmp_path) == 1
