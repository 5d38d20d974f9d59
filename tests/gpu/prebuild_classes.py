"""Compile, on a machine without a GPU, every CuTe class tests/gpu/test_gemm_tc_gpu.py launches, so
the H200 session that runs those tests finds them in the disk cache instead of compiling there.

    CUTE_DSL_ARCH=sm_90a python tests/gpu/prebuild_classes.py [--jobs 2]

(`python -m xgemm build-cache` prebuilds the policy's common classes; this adds the tests' forced
configs, majorness, C and batch variants.) Then tar the cache's current fingerprint directories
and carry the tarball (docs/development.md). Not a test module: pytest does not collect it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1])]


def main() -> int:
    import test_gemm_tc_gpu as T

    from xgemm.kernels.cute_gemm_sm90 import H200_SMS
    from xgemm.runtime import cute_cache as xcompile
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    items = []
    for mod, case, pol in T.cases_for_prebuild():
        d = T.build_case(case, device="cpu")
        prob = d["problem"]
        pol = pol or mod.KERNEL.policy(prob)
        sms = (H200_SMS,) if mod.NAME == "cute_gemm_sm90" else ()     # sm80's spec takes none
        spec = mod.KERNEL.spec(prob, pol, d["views"], d["vout"], "sm_90a", *sms)
        items.append((mod.__name__, mod.class_key(*spec)))
    built = xcompile.warm(items, jobs=args.jobs, progress=None)
    print(f"{len(items)} launches, {len(set(k for _, k in items))} classes, {built} compiled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
