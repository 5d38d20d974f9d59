"""Does XLA put xgemm's custom calls into CUDA graphs (command buffers) under the current XLA_FLAGS?

    python benchmarks/graph_probe.py                     # XLA's default flags
    XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL" python benchmarks/graph_probe.py
    XGEMM_JAX_TVM_GRAPH=1 python benchmarks/graph_probe.py   # CuTe calls through the graph-compatible target

Run it in a fresh process with no eager xgemm call first: a cold process is what a jit user has.
Two jitted chains: 20 dependent 128^3 fp32 matmuls (CuTe kernel, TVM-FFI target) and 8 softmaxes
(Gluon cubin, cubin-launch target). For each: the custom-call target in the HLO, values against
NumPy in float64, per-op wall time (median of 30 calls of the chain), and for the cubin target
the handler's launch counts (all / under capture) over those calls. One line per chain.
"""
from __future__ import annotations

import argparse
import os
import sys

from _harness import wall_median   # wall-clock median around block_until_ready


def per_op_us(fn, args, ops, reps=30):
    """Median wall time of one call of the chain over `reps` calls (after one), per op."""
    return wall_median(fn, *args, warmup=1, reps=reps) / ops * 1e6


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    import jax
    import jax.numpy as jnp
    import numpy as np

    import xgemm.jax as xj
    from xgemm.jax import ffi as jax_ffi

    flags = os.environ.get("XLA_FLAGS", "") or "(default)"
    graph_env = os.environ.get("XGEMM_JAX_TVM_GRAPH", "")
    rng = np.random.default_rng(0)
    ok_all = True

    def target_of(fn, *args):
        text = fn.lower(*args).compile().as_text()
        for t in ("xgemm_tvm_ffi_call_graph", "xgemm_tvm_ffi_call", "xgemm_cubin_launch"):
            if t in text:
                return t
        return "xla"

    # matmul chain: an orthogonal W keeps the norm, so float32 stays close to float64
    n, steps = 128, 20
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    x64 = rng.standard_normal((n, n))
    ref = x64.copy()
    for _ in range(steps):
        ref = ref @ q
    x, w = jnp.asarray(x64, jnp.float32), jnp.asarray(q, jnp.float32)

    def mm_chain(x, w):
        for _ in range(steps):
            x = xj.matmul(x, w)
        return x
    f = jax.jit(mm_chain)
    try:
        tgt = target_of(f, x, w)
        good = bool(np.allclose(np.asarray(f(x, w), np.float64), ref, rtol=1e-3, atol=1e-3))
        us = per_op_us(f, (x, w), steps)
        print(f"matmul chain  flags={flags} XGEMM_JAX_TVM_GRAPH={graph_env!r}  target={tgt}  "
              f"values={'ok' if good else 'WRONG'}  per-op {us:.2f} us")
        ok_all &= good
    except Exception as exc:          # a failed capture surfaces here: report it, go on
        print(f"matmul chain  flags={flags} XGEMM_JAX_TVM_GRAPH={graph_env!r}  FAILED: {exc!r}"[:2000])
        ok_all = False

    # softmax chain through the cubin-launch target
    s = jnp.asarray(rng.standard_normal((256, 4096)), jnp.float32)

    def sm_chain(x):
        for _ in range(8):
            x = xj.softmax(x * 3.0, axis=-1)
        return x
    g = jax.jit(sm_chain)
    r = np.asarray(s, np.float64)
    for _ in range(8):
        r = r * 3.0
        r = np.exp(r - r.max(-1, keepdims=True))
        r /= r.sum(-1, keepdims=True)
    try:
        tgt = target_of(g, s)
        good = bool(np.allclose(np.asarray(g(s), np.float64), r, rtol=1e-4, atol=1e-9))
        before = jax_ffi.launch_counts()
        us = per_op_us(g, (s,), 8)
        after = jax_ffi.launch_counts()
        print(f"softmax chain flags={flags}  target={tgt}  values={'ok' if good else 'WRONG'}  per-op {us:.2f} us  "
              f"handler launches over 31 calls: {after[0] - before[0]} ({after[1] - before[1]} under capture)")
        ok_all &= good
    except Exception as exc:
        print(f"softmax chain flags={flags}  FAILED: {exc!r}"[:2000])
        ok_all = False
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
