"""Fuzzing of xgemm's public entry points against float64 references (issue 22).

    python benchmarks/fuzz.py --cases 20000 --seed 1 --workers 8 [--frameworks torch,cupy,jax,jit]
    python benchmarks/fuzz.py --case '<json of one case>'          # the one-line reproducer

A case is a dict of plain values (so it prints as its own reproducer): gemm or softmax, the
framework (torch, cupy, jax eager, or jit: xgemm.jax inside jax.jit), dtype, sizes (0, 1, primes,
up to 4096), batch dims and their broadcast (a missing batch, or a stride-0 expand), row- or
column-major storage with padded leading dims and base offsets, 1-D operands, alpha/beta with C
broadcast from (N,) or (M, N), out of each allowed dtype and majorness; softmax rows that are all
-inf, hold NaN or +inf, or are large, along any axis of a strided view; for torch, FP8 too:
scaled_matmul (each recipe, e4m3 / e5m2 operands, b column- or row-major, a bias, each output
dtype, either accumulation) and quantize_fp8 (each recipe, with NaN, +-inf, zero rows, huge values);
ragged_dot / grouped_mm (rows and variable-K modes, 1-64 groups whose sizes are even, random,
partly empty, one row, all in one group, or sum below or above T). Outputs are NaN-poisoned:
out= arrays are filled with NaN, and for torch and CuPy the allocator's next block is too (a NaN
buffer of the result's size is freed just before the call). The check is against float64 of the
values the operands hold: the same shape and dtype, the same NaN positions, and errors within
fp32-accumulate bounds (|alpha| (|A| @ |B|) scaled by K and the output's epsilon).

The same generator serves tests/gpu/test_fuzz_gpu.py: draw(choose) takes a chooser, which is a
seeded random.Random here and hypothesis' data.draw there (options are listed simplest first, so
hypothesis shrinks toward small, plain cases). The runner prints cases and failures by class
(op, framework, dtype) and writes benchmarks/results/fuzz-<tag>.json with --json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from xgemm.core import epilogues

FRAMEWORKS = ("torch", "cupy", "jax", "jit")
DIMS = (1, 2, 0, 3, 8, 16, 17, 31, 64, 61, 97, 128, 127, 129, 256, 255, 509, 512, 1000, 1021, 1024,
        2048, 2053, 4096)
SMALL_DIMS = DIMS[:13]
MAX_FLOP = 2 * 2 ** 31                       # keeps a case's reference cheap
DEVICE = "cuda"                              # --cpu: torch and JAX on the CPU (checks the fuzzer itself)


class Choose:
    """A seeded chooser: pick(name, options) -> one option (the first ones more often)."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def __call__(self, name: str, options: Tuple) -> Any:
        return self.rng.choice(options)


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------
def draw(choose: Callable[[str, Tuple], Any], frameworks: Tuple[str, ...] = FRAMEWORKS) -> Dict[str, Any]:
    """One case, as a dict of plain values."""
    fw = choose("fw", tuple(frameworks))
    op = choose("op", ("gemm", "softmax"))
    dtypes = ("float16", "float32", "float64") if fw == "cupy" else ("float16", "bfloat16", "float32", "float64")
    dtype = choose("dtype", dtypes)
    if fw == "torch":
        # FP8 (torch only: DLPack carries no FP8): one torch case in four
        fp8_op = choose("fp8_op", (None, None, None, "fp8"))
        if fp8_op:
            return (_draw_scaled_matmul if op == "gemm" else _draw_quantize)(choose, dtype)
    case = (_draw_gemm if op == "gemm" else _draw_softmax)(choose, fw, dtype)
    # drawn last, so every other case stays what it was for a seed before grouped cases existed
    if choose("grouped", (False,) * 7 + (True,)):
        return _draw_grouped(choose, fw, dtype)
    return case


FP8 = ("float8_e4m3fn", "float8_e5m2")
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def _draw_scaled_matmul(choose, dtype: str) -> Dict[str, Any]:
    """xgemm.scaled_matmul: FP8 a [M, K] and b [K, N] (b column-major, as torch._scaled_mm takes it,
    or row-major), each recipe's scales, a bias, each output dtype."""
    m, n, k = _dim(choose, "m"), _dim(choose, "n"), _dim(choose, "k")
    m, n, k = max(m, 1), max(n, 1), max(k, 1)
    while 2 * m * n * k > MAX_FLOP:
        m, n, k = max(m // 2, 1), max(n // 2, 1), max(k // 2, 1)
    return dict(op="scaled_matmul", fw="torch", dtype=choose("a_fp8", FP8), b_dtype=choose("b_fp8", FP8),
                m=m, n=n, k=k, recipe=choose("recipe", ("tensor", "row", "block")),
                b_major=choose("b_major", ("col", "row")), bias=choose("bias", (None, "float32", "bfloat16")),
                out=choose("out", ("bfloat16", "float16", "float32")), fast=choose("fast", (False, True)))


def _draw_quantize(choose, dtype: str) -> Dict[str, Any]:
    """xgemm.quantize_fp8 of a 2-D x (dtype of the case, float64 too), every recipe, both FP8
    types, with NaN, +-inf, an all-zero row and values far beyond the FP8 range."""
    rows, cols = max(_dim(choose, "rows"), 1), max(_dim(choose, "cols"), 1)
    return dict(op="quantize", fw="torch", dtype=dtype, rows=rows, cols=cols, fp8=choose("fp8", FP8),
                recipe=choose("recipe", ("row", "block_1x128", "tensor", "col", "block_128x128")),
                special=choose("special", (None, "nan", "inf", "zero_row", "huge")))


def _dim(choose, name):
    return choose(name, choose(name + "_pool", (SMALL_DIMS, DIMS)))


def _draw_gemm(choose, fw: str, dtype: str) -> Dict[str, Any]:
    m, n, k = _dim(choose, "m"), _dim(choose, "n"), _dim(choose, "k")
    batch = list(choose("batch", ((), (), (3,), (2, 2), (1,))))
    while 2 * m * n * k * max(math.prod(batch), 1) > MAX_FLOP:
        m, n, k = max(m // 2, 1), max(n // 2, 1), max(k // 2, 1)
    strided = fw in ("torch", "cupy")
    case = dict(op="gemm", fw=fw, dtype=dtype, m=m, n=n, k=k, batch=batch,
                bcast=choose("bcast", (None, "a2d", "b2d", "b_expand")) if batch else None,
                vec=None if batch else choose("vec", (None, None, "a", "b")),
                a_major=choose("a_major", ("row", "col")), b_major=choose("b_major", ("row", "col")),
                a_pad=choose("a_pad", (0, 8, 1)) if strided else 0,
                b_pad=choose("b_pad", (0, 8, 1)) if strided else 0,
                a_off=choose("a_off", (0, 8, 1)) if strided else 0,
                b_off=choose("b_off", (0, 8, 1)) if strided else 0,
                alpha=choose("alpha", (1.0, 0.5, -2.0)), beta=0.0, c=None, c_dtype=None,
                out=None, out_major="row")
    outs = (dtype, "float32") if dtype in ("float16", "bfloat16") else (dtype,)
    if choose("with_c", (False, True)):
        case.update(beta=choose("beta", (1.0, -0.5, 0.0)), c=choose("c", ("mn", "n")),
                    c_dtype=choose("c_dtype", outs))
    if fw in ("jax", "jit"):
        case["out"] = choose("out_dtype", (None,) + outs)
    elif choose("with_out", (False, True)):
        case.update(out=choose("out", outs), out_major=choose("out_major", ("row", "col")))
    # drawn last, so the fields above stay what they were for a seed before epilogues existed
    epi = choose("epilogue", (None, None, "bias", "act", "bias_act", "gated"))
    case.update(bias=None, activation=None, gated=False)
    if epi is not None and case["vec"] != "b":
        if epi == "gated" and case["n"] % 2 == 0:
            case.update(gated=True, activation=choose("gated_act", tuple(epilogues.GATED)), alpha=1.0, beta=0.0,
                        c=None, c_dtype=None)
        if epi in ("act", "bias_act"):
            case["activation"] = choose("activation", epilogues.ACTIVATIONS)
        if epi in ("bias", "bias_act") or (case["gated"] and choose("gated_bias", (False, True))):
            case["bias"] = choose("bias_dtype", outs)
    return case


GROUP_SIZES = ("even", "random", "some_empty", "below_t", "above_t", "one_rows", "all_in_one")


def _draw_grouped(choose, fw: str, dtype: str) -> Dict[str, Any]:
    """xgemm.ragged_dot / grouped_mm: rows mode (lhs [T, K] in row groups, rhs [E, K, N]) or the
    variable-K product (a [M, T] with T in groups, b [T, N] -> [E, M, N]); group sizes drawn by
    kind (run_grouped makes them from the case's seed), A and B row- or column-major."""
    t, k, n = _dim(choose, "t"), _dim(choose, "k"), _dim(choose, "n")
    groups = choose("groups", (1, 2, 3, 8, 17, 64))
    while 2 * t * k * n > MAX_FLOP // 2:
        t, k, n = max(t // 2, 1), max(k // 2, 1), max(n // 2, 1)
    outs = (None, "float32") if dtype in ("float16", "bfloat16") else (None,)
    mode = choose("mode", ("rows", "ragged_k"))
    return dict(op="grouped", fw=fw, dtype=dtype, mode=mode, t=t, k=k, n=n, groups=groups,
                sizes=choose("sizes", GROUP_SIZES),
                api=choose("api", ("ragged_dot", "grouped_mm")) if mode == "rows" else "grouped_mm",
                a_major=choose("a_major", ("row", "col")), b_major=choose("b_major", ("row", "col")),
                out=choose("out_dtype", outs))


def _draw_softmax(choose, fw: str, dtype: str) -> Dict[str, Any]:
    ndim = choose("ndim", (2, 1, 3))
    shape = [choose(f"d{i}", (1, 8, 3, 0, 64, 1000, 97, 4096, 1536, 4095, 8192, 65536)) for i in range(ndim)]
    while math.prod(shape) > 2 ** 24:
        i = shape.index(max(shape))
        shape[i] //= 4
    strided = fw in ("torch", "cupy")
    return dict(op="softmax", fw=fw, dtype=dtype, shape=shape, axis=choose("axis", tuple(range(-ndim, ndim))),
                view=choose("view", ("dense", "transposed", "every_other", "offset")) if strided else "dense",
                special=choose("special", (None, "neg_inf_row", "nan", "pos_inf", "large")),
                out=bool(choose("out", (False, True))) if strided else False)


# ---------------------------------------------------------------------------------------------
# Framework plumbing
# ---------------------------------------------------------------------------------------------
_EPS = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24, "float64": 2.0 ** -53}
_TINY = {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -133, "float32": 2.0 ** -149, "float64": 0.0}  # subnormal steps


def _round(vals: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values rounded to dtype (what the operand will hold), back in float64."""
    if dtype == "bfloat16" or dtype in FP8:
        import ml_dtypes
        return vals.astype(getattr(ml_dtypes, dtype)).astype(np.float64)
    return vals.astype(dtype).astype(np.float64)


class Fw:
    """Make device arrays of one framework with a given layout, and read them back."""

    def __init__(self, name: str):
        self.name = name
        if name == "torch":
            import torch
            self.torch = torch
        elif name == "cupy":
            import cupy
            self.cupy = cupy
        else:
            import jax
            import jax.numpy as jnp
            import xgemm.jax  # noqa: F401
            jax.config.update("jax_enable_x64", True)      # float64 cases stay float64
            self.jax, self.jnp = jax, jnp
        self._jitted: Dict[Any, Any] = {}

    # -- making arrays ---------------------------------------------------------------------
    def place(self, vals: np.ndarray, dtype: str, major: str = "row", pad: int = 0, off: int = 0,
              view: str = "dense") -> Any:
        """An array holding vals (float64, already rounded to dtype) with this storage: the last two
        dims row- or column-major with `pad` extra elements per leading row, `off` elements after a
        buffer start, other dims dense; `view`: softmax's dense / transposed / every_other / offset."""
        if self.name in ("jax", "jit"):
            return self._jax(vals, dtype, major)
        shape = vals.shape
        if view == "transposed" and vals.ndim >= 2:
            major = "col"
        if view == "offset":
            off = 3
        if view == "every_other" and vals.ndim >= 1:
            wide = np.zeros(shape[:-1] + (2 * shape[-1],))
            wide[..., ::2] = vals
            return self.place(wide, dtype, major, pad, off)[..., ::2]
        if vals.ndim >= 2:
            r, c = shape[-2], shape[-1]
            ld = (c if major == "row" else r) + pad
            inner = (ld, 1) if major == "row" else (1, ld)
            mat = max(ld * (r if major == "row" else c), 1)
            strides, step = list(inner), mat
            for d in reversed(shape[:-2]):
                strides.insert(0, step)
                step *= max(d, 1)
            size = off + step
        else:
            strides, size = [1] * vals.ndim, off + max(math.prod(shape), 1)
        return self._strided(vals, dtype, tuple(strides), off, size)

    def _strided(self, vals, dtype, strides, off, size):
        if self.name == "torch":
            t = self.torch
            buf = t.full((size,), float("nan"), dtype=getattr(t, dtype), device=DEVICE)
            x = buf.as_strided(vals.shape, strides, off)
            x.copy_(t.from_numpy(np.ascontiguousarray(vals)).to(DEVICE).to(x.dtype))
            return x
        cp = self.cupy
        buf = cp.full((size,), np.nan, dtype=dtype)
        item = buf.itemsize
        x = cp.lib.stride_tricks.as_strided(buf[off:], vals.shape, tuple(s * item for s in strides))
        x[...] = cp.asarray(vals).astype(dtype)
        return x

    def _jax(self, vals, dtype, major):
        jnp = self.jnp
        import ml_dtypes
        np_dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
        if major == "col" and vals.ndim >= 2:      # stored transposed; the case's call transposes it back
            return jnp.asarray(np.swapaxes(vals, -1, -2).astype(np_dt))
        return jnp.asarray(vals.astype(np_dt))

    def expand(self, x, shape):
        return x.expand(*shape) if self.name == "torch" else self.cupy.broadcast_to(x, shape)

    def empty_poisoned(self, shape, dtype, major="row"):
        """A NaN-filled out= array of shape, row- or column-major in its last two dims."""
        vals = np.full(shape, np.nan)
        return self.place(vals, dtype, major)

    def poison_allocator(self, nbytes: int) -> None:
        """Free a NaN-filled block of nbytes so the caching allocator's next block of that size holds NaN."""
        if nbytes <= 0 or DEVICE != "cuda":
            return
        if self.name == "torch":
            t = self.torch
            x = t.empty(nbytes // 2 + 1, dtype=t.float16, device=DEVICE)
            x.fill_(float("nan"))
            del x
        elif self.name == "cupy":
            x = self.cupy.full(nbytes // 2 + 1, np.nan, dtype=np.float16)
            del x

    def host(self, x) -> Tuple[np.ndarray, str]:
        """float64 values and dtype name of a result."""
        if self.name == "torch":
            dt = str(x.dtype).rsplit(".", 1)[-1]
            return x.detach().to("cpu", self.torch.float64).numpy(), dt
        if self.name == "cupy":
            return self.cupy.asnumpy(x).astype(np.float64), str(x.dtype)
        return np.asarray(x).astype(np.float64), str(x.dtype)

    def sync(self):
        if self.name == "torch" and DEVICE == "cuda":
            self.torch.cuda.synchronize()
        elif self.name == "cupy":
            self.cupy.cuda.Device().synchronize()

    def jitted(self, key, make):
        if key not in self._jitted:
            self._jitted[key] = self.jax.jit(make())
        return self._jitted[key]


_FWS: Dict[str, Fw] = {}


def fw_of(name: str) -> Fw:
    if name not in _FWS:
        _FWS[name] = Fw(name)
    return _FWS[name]


# ---------------------------------------------------------------------------------------------
# Running and checking one case
# ---------------------------------------------------------------------------------------------
def _values(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    return _round(rng.uniform(-1.0, 1.0, size=shape), dtype)


def _gemm_shapes(case) -> Tuple[tuple, tuple, tuple]:
    m, n, k, batch = case["m"], case["n"], case["k"], tuple(case["batch"])
    a_shape = (k,) if case["vec"] == "a" else (batch + (m, k) if case["bcast"] != "a2d" else (m, k))
    b_shape = (k,) if case["vec"] == "b" else (
        (k, n) if case["bcast"] == "b2d" else (1, k, n) if case["bcast"] == "b_expand" else batch + (k, n))
    d_shape = batch + ((m,) if case["vec"] != "a" else ()) + ((n,) if case["vec"] != "b" else ())
    if case.get("gated"):
        d_shape = d_shape[:-1] + (n // 2,)
    return a_shape, b_shape, d_shape


def run_gemm(case: Dict[str, Any], seed: int) -> Optional[str]:
    """None when the case's result is right, else what is wrong."""
    import xgemm
    f = fw_of(case["fw"])
    rng = np.random.default_rng(seed)
    dt = case["dtype"]
    a_shape, b_shape, d_shape = _gemm_shapes(case)
    A, B = _values(rng, a_shape, dt), _values(rng, b_shape, dt)
    c_shape = None if case["c"] is None else (d_shape[-1:] if case["c"] == "n" else d_shape)
    C = None if c_shape is None else _values(rng, c_shape, case["c_dtype"])
    act, gated = case.get("activation"), case.get("gated", False)
    V = None if not case.get("bias") else _values(rng, (case["n"],), case["bias"])
    epi = V is not None or act is not None
    jaxish = case["fw"] in ("jax", "jit")
    a = f.place(A, dt, case["a_major"], case["a_pad"], case["a_off"])
    b_vals = B[0] if case["bcast"] == "b_expand" and not jaxish else B
    b = f.place(b_vals, dt, case["b_major"], case["b_pad"], case["b_off"])
    if case["bcast"] == "b_expand" and not jaxish:       # a stride-0 batch dim
        b = f.expand(b[None] if f.name == "torch" else b[None, ...], tuple(case["batch"]) + b_vals.shape)
        B = np.broadcast_to(B, b.shape)
    c = None if C is None else f.place(C, case["c_dtype"])
    v = None if V is None else f.place(V, case["bias"])
    alpha, beta = case["alpha"], case["beta"]
    out_dt = case["out"] or dt
    if jaxish:
        ta = case["a_major"] == "col" and len(a_shape) >= 2
        tb = case["b_major"] == "col" and len(b_shape) >= 2

        def call(a, b, c, v):
            a = a.swapaxes(-1, -2) if ta else a
            b = b.swapaxes(-1, -2) if tb else b
            if gated:
                return xgemm.jax.gated(a, b, bias=v, activation=act, out_dtype=case["out"])
            return xgemm.jax.gemm(a, b, c, alpha=alpha, beta=beta, out_dtype=case["out"], bias=v, activation=act)
        fn = call if case["fw"] == "jax" else f.jitted(
            (ta, tb, alpha, beta, case["out"], c is None, v is None, act, gated), lambda: call)
        d = fn(a, b, c, v)
    else:
        out = None
        if case["out"] is not None:
            out = f.empty_poisoned(d_shape, case["out"], case["out_major"] if len(d_shape) >= 2 else "row")
        f.poison_allocator(math.prod(d_shape) * 4)
        if gated:
            d = xgemm.gated(a, b, bias=v, activation=act, out=out)
        elif epi:
            d = xgemm.gemm(a, b, c, alpha=alpha, beta=beta, bias=v, activation=act, out=out)
        else:
            d = xgemm.gemm(a, b, c, alpha=alpha, beta=beta, out=out)
        if out is not None and d is not out:
            return "out= given but another array returned"
    got, why = _fetch(f, d, out_dt, d_shape)
    if why:
        return why
    prod = _matmul64(A, B)
    mag = np.abs(alpha) * _matmul64(np.abs(A), np.abs(B))
    ref = alpha * prod
    if C is not None and beta != 0.0:
        ref = ref + beta * C
        mag = mag + abs(beta) * np.abs(C)
    acc_eps = _EPS["float64" if dt == "float64" else "float32"]
    if not epi:
        tol = 2 * _EPS[out_dt] * mag + 2 * max(case["k"], 1) * acc_eps * mag + _TINY[out_dt]
        return _compare(got, ref, tol)
    # the epilogue: the pre-activation's error carried through act' (and the gate's product), the
    # output's rounding, and the accumulator type's own math (exp, tanh, erf: a few ulp)
    if V is not None:
        ref = ref + V
        mag = mag + np.abs(V)
    tol_pre = 2 * max(case["k"], 1) * acc_eps * mag + 4 * acc_eps * np.abs(ref)
    y, tol = _epilogue64(ref, tol_pre, act, gated, acc_eps)
    tol = tol + (2 * _EPS[out_dt] + 8 * acc_eps) * np.abs(y) + _TINY[out_dt]
    return _compare(got, y, tol)


def _act64(x: np.ndarray, name: Optional[str]) -> np.ndarray:
    """The activations in float64, written apart from core/epilogues.py (the reference's own)."""
    if name is None:
        return x
    with np.errstate(over="ignore"):
        sig = 1.0 / (1.0 + np.exp(-x))
    return {"relu": lambda: np.maximum(x, 0), "relu2": lambda: np.maximum(x, 0) ** 2, "sigmoid": lambda: sig,
            "silu": lambda: x * sig, "gelu": lambda: 0.5 * x * (1 + np.vectorize(math.erf, otypes=[np.float64])(x / math.sqrt(2))),
            "gelu_tanh": lambda: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))}[name]()


def _epilogue64(pre: np.ndarray, tol_pre: np.ndarray, act: Optional[str], gated: bool, acc_eps: float):
    """(act(pre) or its gating, and the error bound tol_pre becomes through it). The activation's
    own math in the accumulator type errs by a few ulp of x, not of act(x): gelu's 1 + erf(x/sqrt 2)
    cancels for negative x (torch's and jax's formula alike), hence 8 ulp of |x|."""
    import array_api_compat.numpy as xp
    if not gated:
        slope = np.abs(epilogues.derivative(xp, pre, act)) + 0.05        # + a margin for relu's kink
        return _act64(pre, act), slope * tol_pre + 8 * acc_eps * np.abs(pre)
    n = pre.shape[-1] // 2
    g, u, tg, tu = pre[..., :n], pre[..., n:], tol_pre[..., :n], tol_pre[..., n:]
    ga = epilogues.GATED[act]
    slope = np.abs(epilogues.derivative(xp, g, ga)) + 0.05
    return (_act64(g, ga) * u,
            np.abs(u) * (slope * tg + 8 * acc_eps * np.abs(g)) + np.abs(_act64(g, ga)) * tu + tg * tu)


def _matmul64(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """A @ B in float64: on the GPU through torch where there is one (the workers' host BLAS gets
    one thread each, and a 4096-sized product took seconds there), else NumPy."""
    if DEVICE == "cuda":
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None and torch.cuda.is_available():
            a, b = torch.tensor(A, device="cuda"), torch.tensor(B, device="cuda")   # copies (A may be read-only)
            return torch.matmul(a, b).cpu().numpy()
    return np.matmul(A, B)


def _softmax_ref(X: np.ndarray, axis: int) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        if X.size == 0:
            return X.copy()
        e = np.exp(X - X.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)


def run_softmax(case: Dict[str, Any], seed: int) -> Optional[str]:
    import xgemm
    f = fw_of(case["fw"])
    rng = np.random.default_rng(seed)
    dt, shape, axis = case["dtype"], tuple(case["shape"]), case["axis"]
    X = rng.normal(0.0, 3.0, size=shape)
    special = case["special"]
    if special == "large":
        X = X * {"float16": 10000.0, "bfloat16": 1e30}.get(dt, 1e30) / 3
    X = _round(X, dt)
    if X.size and special in ("neg_inf_row", "nan", "pos_inf"):
        flat = np.moveaxis(X, axis, -1)             # a view: rows along the softmax axis
        row = tuple(rng.integers(0, s) for s in flat.shape[:-1])
        if special == "neg_inf_row":
            flat[row] = -np.inf
        else:
            flat[row + (int(rng.integers(0, flat.shape[-1])),)] = np.nan if special == "nan" else np.inf
    x = f.place(X, dt, view=case["view"])
    if case["fw"] == "jax":
        d = xgemm.jax.softmax(x, axis)
    elif case["fw"] == "jit":
        d = f.jitted(("softmax", axis), lambda: (lambda x: xgemm.jax.softmax(x, axis)))(x)
    else:
        out = f.empty_poisoned(shape, dt) if case["out"] else None
        f.poison_allocator(X.size * 4)
        d = xgemm.softmax(x, axis, out=out)
    got, why = _fetch(f, d, dt, shape)
    if why:
        return why
    ref = _softmax_ref(X, axis)
    tol = (2 * _EPS[dt] + (1e-12 if dt == "float64" else 4e-6)) * np.abs(ref) + _TINY[dt] + 1e-300
    return _compare(got, ref, tol)


def _fetch(f: "Fw", d: Any, dtype: str, shape: Tuple[int, ...]) -> Tuple[Optional[np.ndarray], Optional[str]]:
    """The result in float64 on the host after the device finished, or what is wrong with its dtype or shape."""
    f.sync()
    got, got_dt = f.host(d)
    if got_dt != dtype:
        return None, f"dtype {got_dt}, expected {dtype}"
    if got.shape != tuple(shape):
        return None, f"shape {got.shape}, expected {tuple(shape)}"
    return got, None


def _compare(got: np.ndarray, ref: np.ndarray, tol) -> Optional[str]:
    nan_got, nan_ref = np.isnan(got), np.isnan(ref)
    if (nan_got != nan_ref).any():
        i = np.argwhere(nan_got != nan_ref)[0]
        return f"NaN mismatch at {tuple(i)}: got {got[tuple(i)]}, expected {ref[tuple(i)]} ({int(nan_got.sum())} NaN)"
    ok = ~nan_ref
    with np.errstate(invalid="ignore"):
        err = np.where(ok & (got != ref), np.abs(got - ref), 0.0)
    bad = err > tol
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        return f"{int(bad.sum())} wrong, first at {i}: got {got[i]!r}, expected {ref[i]!r} (tol {np.broadcast_to(tol, ref.shape)[i]:.3g})"
    return None


def _scales64(rng, recipe: str, rows: int, cols: int, side: str) -> np.ndarray:
    """Dequantization scales (float32 values) of one operand for a scaled_matmul recipe, as 2-D
    arrays (tensor-wise: a 0-d array); side "a" [M, K] or "b" [K, N]."""
    if recipe == "tensor":
        shape = ()
    elif recipe == "row":
        shape = (rows, 1) if side == "a" else (1, cols)
    else:
        shape = (rows, -(-cols // 128)) if side == "a" else (-(-rows // 128), -(-cols // 128))
    return _round(rng.uniform(0.25, 4.0, size=shape), "float32")


def _expand64(s: np.ndarray, rows: int, cols: int, side: str, recipe: str) -> np.ndarray:
    if recipe != "block":
        return np.broadcast_to(s, (rows, cols)) if s.ndim else np.full((rows, cols), float(s))
    br = 1 if side == "a" else 128
    return np.repeat(np.repeat(s, br, axis=0), 128, axis=1)[:rows, :cols]


def run_scaled_matmul(case: Dict[str, Any], seed: int) -> Optional[str]:
    import torch

    import xgemm
    rng = np.random.default_rng(seed)
    m, n, k, recipe = case["m"], case["n"], case["k"], case["recipe"]
    A = _round(rng.uniform(-8.0, 8.0, size=(m, k)), case["dtype"])
    B = _round(rng.uniform(-8.0, 8.0, size=(k, n)), case["b_dtype"])
    SA, SB = _scales64(rng, recipe, m, k, "a"), _scales64(rng, recipe, k, n, "b")
    V = None if case["bias"] is None else _values(rng, (n,), case["bias"])
    dev = DEVICE
    a8 = torch.tensor(A, device=dev).to(getattr(torch, case["dtype"]))
    if case["b_major"] == "col":
        b8 = torch.tensor(B.T.copy(), device=dev).to(getattr(torch, case["b_dtype"])).t()
    else:
        b8 = torch.tensor(B, device=dev).to(getattr(torch, case["b_dtype"]))
    sa, sb = (torch.tensor(x, dtype=torch.float32, device=dev) for x in (SA, SB))
    v = None if V is None else torch.tensor(V, device=dev).to(getattr(torch, case["bias"]))
    fw_of("torch").poison_allocator(m * n * 4)
    fast = case.get("fast", False)
    d = xgemm.scaled_matmul(a8, b8, sa, sb, out_dtype=case["out"], bias=v, use_fast_accum=fast)
    got, why = _fetch(fw_of("torch"), d, case["out"], (m, n))
    if why:
        return why
    Ad, Bd = A * _expand64(SA, m, k, "a", recipe), B * _expand64(SB, k, n, "b", recipe)
    ref, mag = _matmul64(Ad, Bd), _matmul64(np.abs(Ad), np.abs(Bd))
    if V is not None:
        ref, mag = ref + V, mag + np.abs(V)
    # An FP8 wgmma keeps ~14 bits of its running sum (DeepSeek-V3 report): up to 2**-13 of the
    # magnitudes per 32-deep step. use_fast_accum keeps the whole sum there; the default call adds
    # each 128-deep k-tile's sum into float32 (at most 4 such steps, then float32 accumulation), as
    # torch._scaled_mm's default (CUTLASS's promotion interval of 4 MMAs) does
    steps = -(-k // 32) if fast else -(-min(k, 128) // 32)
    acc = steps * 2.0 ** -13 + 2 * k * _EPS["float32"]
    tol = 2 * _EPS[case["out"]] * np.abs(ref) + acc * mag + _TINY[case["out"]]
    return _compare(_saturated(got, ref, tol, case["out"]), ref, tol)


def _saturated(got: np.ndarray, ref: np.ndarray, tol, out_dt: str) -> np.ndarray:
    """got, with an inf of ref's sign taken as right where ref lies within tol of the value a
    float16 D rounds to inf from (65520: e5m2 operands reach past float16's range)."""
    if out_dt != "float16":
        return got
    edge = (np.abs(ref) + tol >= 65520.0) & np.isinf(got) & (np.sign(got) == np.sign(ref))
    return np.where(edge, ref, got)


def run_quantize(case: Dict[str, Any], seed: int) -> Optional[str]:
    """q, scale against the recipe in float64: scale = amax of the block's finite |x| / fp8_max (1
    where 0) within a float32 rounding, q = clamp(x / scale) within one FP8 rounding of it, NaN
    where x is NaN, the saturated +-fp8_max where x is +-inf."""
    import torch

    import xgemm
    rng = np.random.default_rng(seed)
    rows, cols, fp8, recipe = case["rows"], case["cols"], case["fp8"], case["recipe"]
    X = _round(rng.normal(0.0, 30.0, size=(rows, cols)), case["dtype"])
    special = case["special"]
    if special == "nan":
        X[rng.integers(rows), rng.integers(cols)] = np.nan
    elif special == "inf":
        X[rng.integers(rows), rng.integers(cols)] = np.inf if rng.integers(2) else -np.inf
    elif special == "zero_row":
        X[rng.integers(rows)] = 0.0
    elif special == "huge":
        X[rng.integers(rows), rng.integers(cols)] = _round(np.array(6e4), case["dtype"])
    x = torch.tensor(X, device=DEVICE).to(getattr(torch, case["dtype"]))
    q, s = xgemm.quantize_fp8(x, recipe, fp8)
    fw_of("torch").sync()
    br, bc = {"row": (1, cols), "col": (rows, 1), "block_1x128": (1, 128), "block_128x128": (128, 128),
              "tensor": (rows, cols)}[recipe]
    mag = np.where(np.isfinite(X), np.abs(X), 0.0)
    nr, nc = -(-rows // br), -(-cols // bc)
    padded = np.zeros((nr * br, nc * bc))
    padded[:rows, :cols] = mag
    amax = padded.reshape(nr, br, nc, bc).max(axis=(1, 3))
    scale = np.where(amax > 0, amax / FP8_MAX[fp8], 1.0)
    got_s = s.detach().to("cpu", torch.float64).numpy().reshape(nr, nc) if recipe != "tensor" else \
        np.full((1, 1), float(s))
    if not np.allclose(got_s, scale, rtol=2.0 ** -22, atol=0.0):
        i = tuple(np.argwhere(~np.isclose(got_s, scale, rtol=2.0 ** -22, atol=0.0))[0])
        return f"scale {i}: got {got_s[i]!r}, expected {scale[i]!r}"
    full = np.repeat(np.repeat(got_s, br, axis=0), bc, axis=1)[:rows, :cols]
    with np.errstate(invalid="ignore", over="ignore"):
        want = np.clip(X / full, -FP8_MAX[fp8], FP8_MAX[fp8])
    got = q.detach().to("cpu", torch.float64).numpy()
    # one FP8 rounding: half a step of its 3 (e4m3) or 2 (e5m2) mantissa bits, or its subnormal step
    step = np.maximum(np.abs(want) * 2.0 ** -(3 if fp8 == "float8_e4m3fn" else 2), 2.0 ** (-9 if fp8 == "float8_e4m3fn" else -16))
    return _compare(got, want, step)


def _group_sizes(rng: np.random.Generator, kind: str, groups: int, t: int) -> np.ndarray:
    """Non-negative sizes of one kind: summing to T (even, random, some empty, one-row groups, all
    in one group), below T (rows in no group) or above it (the last groups truncated)."""
    if kind == "even":
        sizes = np.full(groups, t // groups)
        sizes[-1] += t - sizes.sum()
    elif kind == "one_rows":
        sizes = np.minimum(np.ones(groups, int), t)
        sizes[-1] += t - sizes.sum()
    elif kind == "all_in_one":
        sizes = np.zeros(groups, int)
        sizes[rng.integers(groups)] = t
    else:
        p = rng.dirichlet(np.ones(groups))
        if kind == "some_empty":
            p[rng.random(groups) < 0.4] = 0.0
            p = p / p.sum() if p.sum() else np.full(groups, 1.0 / groups)
        total = {"below_t": t // 2, "above_t": t + t // 2 + 1}.get(kind, t)
        sizes = rng.multinomial(total, p)
    return sizes.astype(np.int64)


def run_grouped(case: Dict[str, Any], seed: int) -> Optional[str]:
    import xgemm
    f = fw_of(case["fw"])
    rng = np.random.default_rng(seed)
    dt, t, k, n, e = case["dtype"], case["t"], case["k"], case["n"], case["groups"]
    ragged_k = case["mode"] == "ragged_k"
    sizes = _group_sizes(rng, case["sizes"], e, t)
    ends = np.minimum(np.cumsum(sizes), t)
    starts = np.concatenate([[0], ends[:-1]])
    if ragged_k:                    # a [M, T] (M = k here), b [T, N] -> [E, M, N]
        A, B = _values(rng, (k, t), dt), _values(rng, (t, n), dt)
        d_shape = (e, k, n)
    else:                           # lhs [T, K], rhs [E, K, N] -> [T, N]
        A, B = _values(rng, (t, k), dt), _values(rng, (e, k, n), dt)
        d_shape = (t, n)
    out_dt = case["out"] or dt
    jaxish = case["fw"] in ("jax", "jit")
    a, b = f.place(A, dt, case["a_major"]), f.place(B, dt, case["b_major"])
    index_vals = sizes if case["api"] == "ragged_dot" else np.cumsum(sizes)
    if jaxish:
        index = f.jnp.asarray(index_vals.astype(np.int32))
        ta, tb = case["a_major"] == "col", case["b_major"] == "col"
        api, out = case["api"], case["out"]

        def call(a, b, index):
            a = a.swapaxes(-1, -2) if ta else a
            b = b.swapaxes(-1, -2) if tb else b
            if api == "ragged_dot":
                return xgemm.jax.ragged_dot(a, b, index, preferred_element_type=out)
            return xgemm.jax.grouped_mm(a, b, index, out_dtype=out)
        fn = call if case["fw"] == "jax" else f.jitted(("grouped", ta, tb, api, out), lambda: call)
        d = fn(a, b, index)
    else:
        index = _index(f, index_vals)
        f.poison_allocator(math.prod(d_shape) * 4)
        call = xgemm.ragged_dot if case["api"] == "ragged_dot" else xgemm.grouped_mm
        d = call(a, b, index, out_dtype=case["out"])
    got, why = _fetch(f, d, out_dt, d_shape)
    if why:
        return why
    ref, mag = np.zeros(d_shape), np.zeros(d_shape)
    for g in range(e):
        r0, r1 = starts[g], max(ends[g], starts[g])
        if ragged_k:
            ref[g] = _matmul64(A[:, r0:r1], B[r0:r1])
            mag[g] = _matmul64(np.abs(A[:, r0:r1]), np.abs(B[r0:r1]))
        else:
            ref[r0:r1] = _matmul64(A[r0:r1], B[g])
            mag[r0:r1] = _matmul64(np.abs(A[r0:r1]), np.abs(B[g]))
    acc_eps = _EPS["float64" if dt == "float64" else "float32"]
    tol = 2 * _EPS[out_dt] * mag + 2 * max(t if ragged_k else k, 1) * acc_eps * mag + _TINY[out_dt]
    return _compare(got, ref, tol)


def _index(f: "Fw", vals: np.ndarray) -> Any:
    """Group sizes / offsets as an int32 device array of the case's framework."""
    if f.name == "torch":
        return f.torch.tensor(vals.astype(np.int32), device=DEVICE)
    return f.cupy.asarray(vals.astype(np.int32))


def run_case(case: Dict[str, Any], seed: int = 0) -> Optional[str]:
    """None when right; else a one-line description. Exceptions are failures too."""
    runs = {"gemm": run_gemm, "softmax": run_softmax, "scaled_matmul": run_scaled_matmul, "quantize": run_quantize,
            "grouped": run_grouped}
    try:
        return runs[case["op"]](case, seed)
    except Exception as exc:        # noqa: BLE001 -- any exception from a valid call is a failure
        return f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"


# A fault that leaves the process's CUDA context unusable: every later call in this worker fails too
_STICKY = ("misaligned address", "illegal memory access", "an illegal address", "unspecified launch failure",
           "illegal instruction", "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_ILLEGAL_ADDRESS",
           "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ILLEGAL_INSTRUCTION")


def reproducer(case: Dict[str, Any], seed: int) -> str:
    return f"python benchmarks/fuzz.py --case '{json.dumps(case)}' --seed {seed}"


def klass(case: Dict[str, Any]) -> str:
    return f"{case['op']}/{case['fw']}/{case['dtype']}"


# ---------------------------------------------------------------------------------------------
# The runner
# ---------------------------------------------------------------------------------------------
def fuzz(cases: int, seed: int, frameworks: Tuple[str, ...], log=print, budget_s: float = 0.0,
         part_file: Optional[str] = None, skip: int = 0) -> Dict[str, Any]:
    """Run cases seed*1000003 + skip, skip + 1, ...; with budget_s, stop drawing new ones after that
    long; with part_file, rewrite the report there every 25 cases (a killed run keeps what it did)."""
    counts, fails, seconds = Counter(), Counter(), Counter()
    failures: List[Dict[str, Any]] = []
    lost: List[int] = []
    t0 = time.perf_counter()
    ran = 0
    for i in range(cases):
        if budget_s and time.perf_counter() - t0 > budget_s:
            break
        ran += 1
        case_seed = seed * 1_000_003 + skip + i
        case = draw(Choose(case_seed), frameworks)
        t = time.perf_counter()
        why = run_case(case, case_seed)
        seconds[klass(case)] += time.perf_counter() - t
        counts[klass(case)] += 1
        if why is not None:
            fails[klass(case)] += 1
            failures.append(dict(case=case, seed=case_seed, why=why))
            log(f"FAIL {klass(case)}: {why}\n  {reproducer(case, case_seed)}")
            if any(s in why for s in _STICKY):
                # the context is gone: later cases would fail for this one's sake (the 2026-12-02
                # run counted 5400 such failures behind one misaligned store), so the worker stops
                lost.append(case_seed)
                log(f"worker with seed {seed} stops: its CUDA context is lost after case {case_seed}")
        if part_file and (ran % 25 == 0 or why is not None):
            _write_part(part_file, ran, seed, t0, counts, seconds, fails, failures, lost)
        if lost:
            break
    report = _write_part(part_file, ran, seed, t0, counts, seconds, fails, failures, lost)
    return report


def _write_part(part_file, ran, seed, t0, counts, seconds, fails, failures, lost=()) -> Dict[str, Any]:
    report = dict(cases=ran, seed=seed, seconds=time.perf_counter() - t0, counts=dict(counts),
                  seconds_by_class=dict(seconds), failures_by_class=dict(fails), failures=failures,
                  context_lost=list(lost))
    if part_file:
        tmp = f"{part_file}.tmp"
        Path(tmp).write_text(json.dumps(report))
        os.replace(tmp, part_file)
    return report


def _merge(parts: List[Dict[str, Any]]) -> Dict[str, Any]:
    counts, fails, seconds, failures, lost = Counter(), Counter(), Counter(), [], []
    for p in parts:
        counts.update(p["counts"])
        seconds.update(p["seconds_by_class"])
        fails.update(p["failures_by_class"])
        failures += p["failures"]
        lost += p.get("context_lost", [])
    return dict(cases=sum(p["cases"] for p in parts), seeds=[p["seed"] for p in parts], context_lost=lost,
                seconds=max(p["seconds"] for p in parts), counts=dict(sorted(counts.items())),
                seconds_by_class={k: round(v, 3) for k, v in sorted(seconds.items())},
                failures_by_class=dict(sorted(fails.items())), failures=failures)


def gpu_frameworks(wanted: Tuple[str, ...]) -> Tuple[str, ...]:
    """The wanted frameworks this machine can run on a GPU (all but CuPy with --cpu)."""
    if DEVICE == "cpu":
        return tuple(n for n in wanted if n != "cupy")
    have = []
    for name in wanted:
        try:
            if name == "torch":
                import torch
                ok = torch.cuda.is_available()
            elif name == "cupy":
                import cupy
                ok = cupy.cuda.runtime.getDeviceCount() > 0
            else:
                import jax
                ok = any(d.platform == "gpu" for d in jax.devices())
        except Exception:       # noqa: BLE001 -- not importable / no device: not fuzzed here
            ok = False
        if ok:
            have.append(name)
    return tuple(have)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1, help="processes, each with its own seed")
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    p.add_argument("--case", help="run this one case (JSON), as a failure's reproducer prints it")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--cpu", action="store_true", help="torch and JAX on the CPU (checks the fuzzer, not kernels)")
    p.add_argument("--budget-s", type=float, default=0.0, help="stop drawing cases after this long (each worker)")
    p.add_argument("--skip", type=int, default=0,
                   help="each worker starts after its first SKIP cases (a later run of the same seed adds new cases)")
    p.add_argument("--merge", help="only merge the worker reports DIR/fuzz-part-*.json (after a killed run)")
    p.add_argument("--part", action="store_true", help=argparse.SUPPRESS)   # a worker: JSON on stdout
    p.add_argument("--part-file", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = "cpu" if args.cpu else DEVICE
    if args.merge:
        parts = [json.loads(f.read_text()) for f in sorted(Path(args.merge).glob("fuzz-part-*.json"))]
        return _finish(dict(_merge(parts), frameworks="(merged)"), args.json)
    if args.case:
        why = run_case(json.loads(args.case), args.seed)
        print("ok" if why is None else f"FAIL: {why}")
        return 0 if why is None else 1
    frameworks = gpu_frameworks(tuple(args.frameworks.split(",")))
    if not frameworks:
        print("no framework with a GPU here: nothing fuzzed", file=sys.stderr)
        return 2
    if args.part:
        print(json.dumps(fuzz(args.cases, args.seed, frameworks, log=lambda s: print(s, file=sys.stderr),
                              budget_s=args.budget_s, part_file=args.part_file, skip=args.skip)))
        return 0
    if args.workers > 1:
        per = -(-args.cases // args.workers)
        threads = str(max((os.cpu_count() or 1) // args.workers, 1))     # the host's BLAS, shared
        # XLA's autotuner would time every new dot of the jit cases (minutes across 12 processes)
        env = dict(os.environ, OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads, MKL_NUM_THREADS=threads,
                   XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_gpu_autotune_level=0")
        parts_dir = Path(args.json).parent if args.json else None
        if parts_dir:
            parts_dir.mkdir(parents=True, exist_ok=True)
        procs = [subprocess.Popen([sys.executable, __file__, "--part", "--cases", str(per), "--seed",
                                   str(args.seed * 1000 + w), "--frameworks", ",".join(frameworks),
                                   "--budget-s", str(args.budget_s), "--skip", str(args.skip)]
                                  + (["--cpu"] if args.cpu else [])
                                  + (["--part-file", str(parts_dir / f"fuzz-part-{w}.json")] if parts_dir else []),
                                  stdout=subprocess.PIPE, text=True, env=env) for w in range(args.workers)]
        parts = []
        for pr in procs:
            out, _ = pr.communicate()
            if pr.returncode != 0:
                print(f"worker failed (rc {pr.returncode})", file=sys.stderr)
                return 1
            parts.append(json.loads(out.strip().splitlines()[-1]))
        report = _merge(parts)
    else:
        report = _merge([fuzz(args.cases, args.seed, frameworks, budget_s=args.budget_s, skip=args.skip)])
    report["frameworks"] = list(frameworks)
    return _finish(report, args.json)


def _finish(report: Dict[str, Any], json_path: Optional[str]) -> int:
    print(f"{report['cases']} cases in {report['seconds']:.0f} s, {len(report['failures'])} failures")
    if report.get("context_lost"):
        print(f"{len(report['context_lost'])} worker(s) stopped early, their CUDA context lost after a sticky fault "
              f"(cases {', '.join(map(str, report['context_lost']))})")
    print(f"{'class':34} {'cases':>7} {'failed':>7} {'ms/case':>8}")
    for k, n in report["counts"].items():
        ms = 1000 * report["seconds_by_class"][k] / n
        print(f"{k:34} {n:7d} {report['failures_by_class'].get(k, 0):7d} {ms:8.1f}")
    for fl in report["failures"][:20]:
        print(f"FAIL {klass(fl['case'])}: {fl['why']}\n  {reproducer(fl['case'], fl['seed'])}")
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if not report["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
