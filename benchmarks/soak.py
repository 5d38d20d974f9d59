"""Soak: many eager and jit calls in one process, with host and device memory sampled as they run
(issue 22: 10^6 mixed eager calls and 10^5 jit calls; memory and handles stay flat).

    python benchmarks/soak.py [--eager 1000000] [--jit 100000] [--json FILE]

Eager calls cycle through a mix: torch matmul (fp16, bf16, fp32; fast-path repeats and the padded
staging path), gemm with C and beta, out= (which skips the fast path), softmax short and long rows,
a batched matmul, the fused epilogues, scaled_matmul (both accumulations), quantize_fp8, grouped_mm
(both modes), CuPy matmul and softmax when CuPy is there. jit calls run two jitted functions, one
holding xgemm.jax.matmul, gemm and softmax, one scaled_matmul and ragged_dot. Every 10% of the calls
a sample records host RSS, open file descriptors, threads, the process's device memory in use
(cuMemGetInfo: total - free, which also counts streams and events the driver allocates), torch's
allocated bytes, and xgemm's kept fast-path signatures. The first sample after warm-up is the
baseline; a run passes when RSS grew by at most --rss-mib (default 32) and device memory and the
handle counts by nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def _host() -> dict:
    status = Path("/proc/self/status").read_text()
    field = lambda k: int(next(line.split()[1] for line in status.splitlines() if line.startswith(k)))  # noqa: E731
    return dict(rss_mib=field("VmRSS:") / 1024, threads=field("Threads:"), fds=len(os.listdir("/proc/self/fd")))


def _sample(torch, label: str, calls: int) -> dict:
    from xgemm.torch import fastpath
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return dict(label=label, calls=calls, **_host(), device_used_mib=(total - free) / 2 ** 20,
                torch_allocated_mib=torch.cuda.memory_allocated() / 2 ** 20,
                kept_gemm=fastpath.kept("gemm"), kept_softmax=fastpath.kept("softmax"))


def eager_mix(torch):
    """The eager calls, as zero-argument functions (operands made once)."""
    import xgemm
    dev = "cuda"
    r = lambda *s, dt=torch.float16: torch.randn(*s, device=dev).to(dt)  # noqa: E731
    a16, b16, abf, bbf = r(256, 512), r(512, 384), r(128, 256, dt=torch.bfloat16), r(256, 512, dt=torch.bfloat16)
    a32, b32 = r(96, 160, dt=torch.float32), r(160, 224, dt=torch.float32)
    ar, br = r(100, 999), r(999, 1001)                    # rows off 16 bytes: padded staging copies
    c, out = r(256, 384, dt=torch.float32), torch.empty(256, 384, device=dev, dtype=torch.float32)
    x1, x2 = r(512, 1000), r(8, 65536, dt=torch.float32)
    a3, b3 = r(4, 64, 128, dt=torch.bfloat16), r(4, 128, 64, dt=torch.bfloat16)
    # the model-layer kernels: fused bias + GELU and SwiGLU, the FP8 classes (both accumulations)
    # and the quantize kernel, the grouped kernel in both modes (its device-made descriptors take a
    # scratch allocation per launch)
    v = r(384, dt=torch.float16)
    x8, sx = xgemm.quantize_fp8(r(256, 512, dt=torch.bfloat16), "row")
    w8, sw = xgemm.quantize_fp8(r(384, 512, dt=torch.bfloat16), "row")
    xg, wg = r(1000, 256, dt=torch.bfloat16), r(8, 256, 384, dt=torch.bfloat16)
    offs = torch.tensor([0, 100, 400, 401, 700, 700, 900, 1000], device=dev, dtype=torch.int32)
    dyg = r(1000, 384, dt=torch.bfloat16)
    mix = [lambda: xgemm.matmul(a16, b16), lambda: xgemm.matmul(abf, bbf), lambda: xgemm.matmul(a32, b32),
           lambda: xgemm.matmul(ar, br), lambda: xgemm.gemm(a16, b16, c, beta=0.5),
           lambda: xgemm.gemm(a16, b16, out=out), lambda: xgemm.softmax(x1), lambda: xgemm.softmax(x2),
           lambda: xgemm.matmul(a3, b3),
           lambda: xgemm.gemm(a16, b16, bias=v, activation="gelu_tanh"), lambda: xgemm.gated(a16, b16),
           lambda: xgemm.scaled_matmul(x8, w8.t(), sx, sw.t()),
           lambda: xgemm.scaled_matmul(x8, w8.t(), sx, sw.t(), use_fast_accum=True),
           lambda: xgemm.quantize_fp8(abf, "row"), lambda: xgemm.grouped_mm(xg, wg, offs),
           lambda: xgemm.grouped_mm(xg.t(), dyg, offs)]
    try:
        import cupy as cp
        ca, cb, cx = cp.asarray(a16.cpu().numpy()), cp.asarray(b16.cpu().numpy()), cp.ones((64, 1000), cp.float32)
        mix += [lambda: xgemm.matmul(ca, cb), lambda: xgemm.softmax(cx)]
    except ImportError:
        pass
    return mix


def jit_fn():
    import jax
    import jax.numpy as jnp

    import xgemm.jax as xj
    a = jnp.ones((256, 512), jnp.bfloat16)
    b = jnp.ones((512, 256), jnp.bfloat16) / 512
    c = jnp.ones((256, 256), jnp.float32)
    f = jax.jit(lambda a, b, c: xj.softmax(xj.gemm(a, b, c, beta=0.5, out_dtype=jnp.float32) + xj.matmul(a, b)))
    # the model-layer custom calls: the FP8 class and the grouped kernel
    a8, sa = xj.quantize_fp8(a.astype(jnp.float32), "row")
    b8, sb = xj.quantize_fp8(b.T.astype(jnp.float32), "row")
    sizes = jnp.asarray([0, 100, 56, 100], jnp.int32)
    w = jnp.ones((4, 512, 256), jnp.bfloat16) / 512
    g = jax.jit(lambda a8, b8, sa, sb, a, w, s: (xj.scaled_matmul(a8, b8, sa, sb), xj.ragged_dot(a, w, s)))
    return lambda: (f(a, b, c), g(a8, b8.T, sa, sb.T, a, w, sizes)), jax


def run(kind: str, calls: int, torch, samples: list) -> None:
    if kind == "eager":
        mix = eager_mix(torch)
        step = lambda i: mix[i % len(mix)]()  # noqa: E731
        sync = torch.cuda.synchronize
    else:
        call, jax = jit_fn()
        step = lambda i: call()  # noqa: E731
        sync = lambda: jax.block_until_ready(call())  # noqa: E731
    every = max(calls // 10, 1)
    t0 = time.perf_counter()
    for i in range(calls):
        step(i)
        if (i + 1) % every == 0:
            sync()
            samples.append(dict(_sample(torch, kind, i + 1), seconds=round(time.perf_counter() - t0, 1)))
            s = samples[-1]
            print(f"{kind:6} {s['calls']:>8} calls {s['seconds']:>6.1f} s  rss {s['rss_mib']:.1f} MiB  "
                  f"device {s['device_used_mib']:.0f} MiB  torch {s['torch_allocated_mib']:.1f} MiB  "
                  f"fds {s['fds']}  threads {s['threads']}", flush=True)


def verdict(samples: list, rss_mib: float) -> list:
    """Growth from the first sample of each kind (after 10% of its calls) to its last."""
    out = []
    for kind in ("eager", "jit"):
        s = [x for x in samples if x["label"] == kind]
        if len(s) < 2:
            continue
        a, b = s[0], s[-1]
        growth = {k: round(b[k] - a[k], 2) for k in ("rss_mib", "device_used_mib", "torch_allocated_mib", "fds",
                                                       "threads", "kept_gemm", "kept_softmax")}
        ok = growth["rss_mib"] <= rss_mib and all(growth[k] <= 0 for k in growth if k != "rss_mib")
        out.append(dict(kind=kind, calls=b["calls"], seconds=b["seconds"], growth=growth, flat=ok))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--eager", type=int, default=1_000_000)
    p.add_argument("--jit", type=int, default=100_000)
    p.add_argument("--rss-mib", type=float, default=32.0)
    p.add_argument("--json")
    args = p.parse_args(argv)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import torch
    samples: list = []
    if args.eager:
        run("eager", args.eager, torch, samples)
    if args.jit:
        run("jit", args.jit, torch, samples)
    result = verdict(samples, args.rss_mib)
    for r in result:
        print(f"{r['kind']}: {r['calls']} calls in {r['seconds']} s, growth after warm-up {r['growth']}: "
              f"{'flat' if r['flat'] else 'NOT FLAT'}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(samples=samples, verdict=result), indent=1) + "\n")
    return 0 if result and all(r["flat"] for r in result) else 1


if __name__ == "__main__":
    sys.exit(main())
