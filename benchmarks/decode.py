"""Decode-time GEMMs on the H200 (issue 20): the gemv kernel (triton_gemv_sm90, XGEMM_DECODE=1) and
the split-K kernel that serves decode today against cuBLAS and a copy of B, one process.

    python benchmarks/decode.py --dry-run     # any machine: the shapes and each kernel's plan
    python benchmarks/decode.py               # H200

Writes benchmarks/results/decode-h200.{json,md} (or into --out DIR).

Shapes (bf16, M x N x K): the acceptance's 1 x 8192 x 28672 (its B is 470 MB), 16 x 8192 x 8192 and
64 x 4096 x 4096 (M = 64 is split-K's alone: the gemv serves M <= 16), plus a batch of 8 single-token
rows at 8 x 28672 x 8192 and B K-major (torch's x @ W.T) at 1 x 28672 x 8192. Each is timed as
CUDA graphs of `reps` calls in time_interleaved's trials, the calls rotating through input sets
whose B's exceed twice the L2 (a decode step reads its weights from DRAM); outputs checked against
fp32. The copy
peer is B.clone() (it reads and writes B: its GB/s counts both); a decode product's GB/s counts
B's bytes once, so their ratio is the share of copy bandwidth the issue asks for (>= 0.9).
"""
from __future__ import annotations

import os
import sys

import _harness as h

SHAPES = [(1, 8192, 28672, "row"), (16, 8192, 8192, "row"), (64, 4096, 4096, "row"), (8, 28672, 8192, "row"),
          (1, 28672, 8192, "col")]


def _operands(torch, m, n, k, b_major, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, generator=gen, device="cuda").bfloat16()
    w = torch.randn(n, k, generator=gen, device="cuda").bfloat16() if b_major == "col" else None
    b = w.t() if b_major == "col" else torch.randn(k, n, generator=gen, device="cuda").bfloat16()
    return a, b


class _RefOfLastSet(dict):
    """refs for time_checked: each implementation's float32 reference of the input set its last
    call used (the calls rotate through the sets)."""
    def __init__(self, sets, last):
        super().__init__()
        self._sets, self._last = sets, last

    def __getitem__(self, name):
        a, b = self._sets[self._last[name]]
        return a.float() @ b.float()


def _forced(name, fn):
    """fn(a, b) with xgemm's routing forced onto kernel `name` (the gemv enabled for it)."""
    import xgemm
    from xgemm.core import policy

    def call(a, b):
        with xgemm.policy.force(name):
            return fn(a, b)
    policy._plans.clear()
    return call


def run_torch(args, log) -> list:
    import torch
    os.environ["XGEMM_DECODE"] = "1"
    records = []
    for m, n, k, b_major in SHAPES:
        records += _time_shape(torch, m, n, k, b_major, args, log)
        torch.cuda.empty_cache()
    return records


def _time_shape(torch, m, n, k, b_major, args, log) -> list:
    import xgemm
    bytes_b = k * n * 2
    # a weight is read from DRAM at decode, not from L2: the calls rotate through enough sets of
    # (A, B) that B's bytes exceed twice the L2 (64 x 4096 x 4096's 32 MB would stay in its 60 MB)
    sets = [_operands(torch, m, n, k, b_major, seed) for seed in range(max(1, -(-2 * h.L2_BYTES // bytes_b)))]
    a, b = sets[0]
    out, last = {}, {}
    outs = {name: torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for name in ("gemv", "splitk", "cublas")}

    def keep(name, fn):
        def call(i):
            last[name] = j = i % len(sets)
            out[name] = fn(*sets[j])
        return call
    impls = {"cuBLAS": keep("cuBLAS", lambda a, b: torch.matmul(a, b, out=outs["cublas"])),
             "xgemm split-K": keep("xgemm split-K", _forced("gluon_splitk_sm90",
                                                             lambda a, b: xgemm.matmul(a, b, out=outs["splitk"])))}
    if m <= 16:
        impls["xgemm gemv"] = keep("xgemm gemv", _forced("triton_gemv_sm90",
                                                         lambda a, b: xgemm.matmul(a, b, out=outs["gemv"])))
    case = f"{m}x{n}x{k} B {b_major}"
    records, by_name = h.time_checked(case, (m, n, k), "bfloat16", dict.fromkeys(impls, bytes_b), "GB/s", impls, out,
                                      _RefOfLastSet(sets, last), args.reps, args.trials, log)
    for ours in ("xgemm gemv", "xgemm split-K"):
        if ours in by_name:
            records += h.paired_records(case, (m, n, k), "bfloat16", ours, {p: by_name[p] for p in (ours, "cuBLAS")}, log)
    if (m, n, k, b_major) == SHAPES[0]:
        records += _copy(b.contiguous(), args, log)
    return records


def _copy(b, args, log) -> list:
    """B.clone(): the copy bandwidth a decode product's B stream is measured against."""
    out = {}
    impls = {"copy of B": lambda i: out.__setitem__("copy of B", b.clone())}
    return h.time_checked(f"copy {b.shape[0]}x{b.shape[1]}", tuple(b.shape), "bfloat16",
                          {"copy of B": 2 * b.numel() * 2}, "GB/s", impls, out, {"copy of B": b.float()},
                          args.reps, args.trials, log)[0]


def run_jax(args, log) -> list:
    return []          # the jit path launches the same cubins (tests/gpu/test_triton_gemv_gpu.py)


def dry_run(log) -> None:
    import torch

    import xgemm
    os.environ["XGEMM_DECODE"] = "1"
    sys.path.insert(0, str(h.ROOT / "tests"))
    from fake_cuda import Fake
    with Fake(keep=True):
        for m, n, k, b_major in SHAPES:
            a = torch.empty(m, k, dtype=torch.bfloat16)
            b = torch.empty(n, k, dtype=torch.bfloat16).t() if b_major == "col" else torch.empty(k, n, dtype=torch.bfloat16)
            plan = xgemm.explain(a, b)
            log(f"{m}x{n}x{k} B {b_major}: {plan.kernel_name} ({'; '.join(plan.policy.notes)})")


def main(argv=None) -> int:
    return h.run_study("decode", __doc__.split("\n\n")[0], {"torch": run_torch, "jax": run_jax}, dry_run, argv)


if __name__ == "__main__":
    sys.exit(main())
