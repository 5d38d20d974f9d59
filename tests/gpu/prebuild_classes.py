"""Compile, on a machine without a GPU, every CuTe class tests/gpu/test_gemm_tc_gpu.py and
test_cute_epilogue_gpu.py launch, so
the H200 session that runs those tests finds them in the disk cache instead of compiling there.

    CUTE_DSL_ARCH=sm_90a python tests/gpu/prebuild_classes.py [--jobs 2] [--fuzz N] [--model-shapes]

(`python -m xgemm build-cache` prebuilds the policy's common classes; this adds the tests' forced
configs, majorness, C and batch variants, and with --fuzz the classes the first N torch cases of
benchmarks/fuzz.py reach (found by running them on CPU tensors dressed as an H200,
tests/fake_cuda.py, whose recorder stands in for every launch): a fuzz run on the GPU then spends
its time on cases, not on compiling classes on first use; with --model-shapes those of every product
of benchmarks/model_shapes.py, whose jit part launches the same classes; always those that
benchmarks/fp8.py --only tune and benchmarks/gemm_tc.py --sweep-set cutesplit time.) Then tar the cache's
current fingerprint directories and carry the tarball (docs/development.md). Not a test module: pytest does not collect it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1])]


def fuzz_items(cases: int, seed: int, workers: int) -> list:
    """(module, key) of every CuTe class the torch cases of a `fuzz.py --seed S --workers W` run
    launch (each worker's first cases / W), recorded instead of launched."""
    sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))
    import fuzz
    from fake_cuda import Fake

    import xgemm
    fuzz.DEVICE = "cpu"
    keys = set()
    per = -(-cases // workers)
    for w in range(workers):
        for i in range(per):
            case_seed = (seed * 1000 + w) * 1_000_003 + i
            case = fuzz.draw(fuzz.Choose(case_seed), fuzz.FRAMEWORKS)
            if case["fw"] != "torch":
                continue
            with Fake(keep=True) as fake:
                try:
                    _launch_case(fuzz, xgemm, case, case_seed)
                except Exception:       # noqa: BLE001 -- a recorder's garbage result may upset a later step
                    pass
            keys |= {call[1] for call in fake.calls if call[0] == "cute"}
    return [(f"xgemm.kernels.{key[0]}", key) for key in sorted(keys, key=repr)]


def model_shape_items() -> list:
    """(module, key) of every CuTe class xgemm.matmul launches on the products of
    benchmarks/model_shapes.py (all of them: its full and jit subsets), on the operands its torch part
    builds (row-major A [batch,] M x K, B [batch,] K x N, out given), recorded instead of launched."""
    sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))
    import model_shapes
    import torch
    from fake_cuda import Fake

    import xgemm
    with Fake(keep=True) as fake:
        for rec in model_shapes.shapes():
            m, n, k, batch = rec["M"], rec["N"], rec["K"], rec["batch"]
            lead = () if batch == 1 else (batch,)
            dt = getattr(torch, rec["dtype"])
            a, b = torch.empty(lead + (m, k), dtype=dt), torch.empty(lead + (k, n), dtype=dt)
            xgemm.matmul(a, b, out=torch.empty(lead + (m, n), dtype=dt))
    keys = {call[1] for call in fake.calls if call[0] == "cute"}
    return [(f"xgemm.kernels.{key[0]}", key) for key in sorted(keys, key=repr)]


def fp8_tune_items() -> list:
    """(module, key) of the promoting FP8 class at each tile width, and of the block-scaled class,
    as benchmarks/fp8.py --only tune times them."""
    sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))
    import fp8 as fp8_bench

    from xgemm.kernels import cute_gemm_sm90 as k90
    return [(k90.__name__, k90.class_key(*spec, epi)) for m, n, k in fp8_bench.SHAPES
            for _, spec, epi in fp8_bench.promote_candidates(m, n, k) + fp8_bench.block_candidates(m, n, k)]


def cutesplit_items() -> list:
    """(module, key) of the configs benchmarks/gemm_tc.py --sweep-set cutesplit forces (bf16, A, B
    and D row-major, as its torch inputs are)."""
    sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))
    import gemm_tc

    from xgemm.core.problem import ROW
    from xgemm.kernels import cute_gemm_sm90 as k90
    cfgs = [k90.Config(*c) for c in gemm_tc.SWEEP_SPLIT]
    return [(k90.__name__, k90.class_key(c, "bfloat16", "bfloat16", ROW, ROW, ROW, None, True, (False,) * 4,
                                         k90.max_clusters(k90.H200_SMS, c), "sm_90a")) for c in cfgs]


def _launch_case(fuzz, xgemm, case, seed):
    """The xgemm call of a fuzz case (fuzz.run_gemm / run_softmax without their checks)."""
    import numpy as np
    f = fuzz.fw_of("torch")
    if case["op"] == "quantize":
        return                                  # a Gluon cubin: build-cache makes every one
    if case["op"] == "scaled_matmul":
        _launch_scaled_matmul(fuzz, f.torch, case, seed)
        return
    if case["op"] == "softmax":
        x = f.place(np.zeros(case["shape"]), case["dtype"], view=case["view"])
        xgemm.softmax(x, case["axis"])
        return
    a_shape, b_shape, d_shape = fuzz._gemm_shapes(case)
    a = f.place(np.zeros(a_shape), case["dtype"], case["a_major"], case["a_pad"], case["a_off"])
    b_vals = np.zeros(b_shape[1:] if case["bcast"] == "b_expand" else b_shape)
    b = f.place(b_vals, case["dtype"], case["b_major"], case["b_pad"], case["b_off"])
    if case["bcast"] == "b_expand":
        b = f.expand(b[None], tuple(case["batch"]) + b_vals.shape)
    c = None
    if case["c"] is not None:
        c = f.place(np.zeros(d_shape[-1:] if case["c"] == "n" else d_shape), case["c_dtype"])
    out = None if case["out"] is None else f.empty_poisoned(d_shape, case["out"], case["out_major"]
                                                             if len(d_shape) >= 2 else "row")
    v = None if not case.get("bias") else f.place(np.zeros((case["n"],)), case["bias"])
    if case.get("gated"):
        xgemm.gated(a, b, bias=v, activation=case["activation"], out=out)
    else:
        xgemm.gemm(a, b, c, alpha=case["alpha"], beta=case["beta"], bias=v, activation=case.get("activation"),
                   out=out)


def _launch_scaled_matmul(fuzz, torch, case, seed):
    """A fuzz scaled_matmul case's kernel call, when a kernel takes it (the embedded default would
    compute on the CPU for real: skipped)."""
    from xgemm import fp8, prepare
    m, n, k, recipe = case["m"], case["n"], case["k"], case["recipe"]
    a8 = torch.zeros(m, k).to(getattr(torch, case["dtype"]))
    b8 = torch.zeros(n, k).to(getattr(torch, case["b_dtype"]))
    b8 = b8.t() if case["b_major"] == "col" else b8.t().contiguous()
    rng = __import__("numpy").random.default_rng(seed)
    sa, sb = (torch.tensor(fuzz._scales64(rng, recipe, r, c, side), dtype=torch.float32)
              for r, c, side in ((m, k, "a"), (k, n, "b")))
    v = None if case["bias"] is None else torch.zeros(n).to(getattr(torch, case["bias"]))
    prepared = fp8.prepare_kernel(fp8.check_scaled_matmul(a8, b8, sa, sb, case["out"], v),
                                  use_fast_accum=case.get("fast", False))
    if prepared is not None:
        prepare.run(prepared)


def main() -> int:
    import test_cute_epilogue_gpu
    import test_gemm_tc_gpu as T

    from xgemm.kernels.cute_gemm_sm90 import H200_SMS
    from xgemm.runtime import cute_cache as xcompile
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--fuzz", type=int, default=0, help="also the classes of this many torch fuzz cases")
    ap.add_argument("--seed", type=int, default=1, help="the fuzz run's --seed (its workers' seeds follow)")
    ap.add_argument("--workers", type=int, default=14, help="the fuzz run's --workers")
    ap.add_argument("--model-shapes", action="store_true",
                    help="also the classes of every benchmarks/model_shapes.py product")
    args = ap.parse_args()
    items = fuzz_items(args.fuzz, args.seed, args.workers) if args.fuzz else []
    items += test_cute_epilogue_gpu.epilogue_items() + test_cute_epilogue_gpu.api_items()
    if args.model_shapes:
        items += model_shape_items()
    items += fp8_tune_items() + cutesplit_items()
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
