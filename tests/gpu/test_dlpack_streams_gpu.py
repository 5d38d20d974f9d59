"""DLPack stream handshakes between torch, CuPy and JAX on a CUDA GPU (issue 22).

xgemm launches on the owner's (first operand's) current stream and brings the other operands in
with the owner's from_dlpack, which passes that stream to the producer's __dlpack__; the producer
makes it wait for the work pending on the producer's current stream. These tests leave such work
pending on purpose: a ~50 ms spin kernel, then the write of the values, on a side stream that stays
the producer's current stream while xgemm imports the array (JAX: a slow jitted computation whose
output reuses a donated NaN buffer). The buffers held NaN before, so a missing wait shows as NaN;
inputs are small integers in fp16, so every result is exact. The other direction too: xgemm's
result, still pending on the owner's stream, read by another framework's from_dlpack.

test_without_a_handshake_the_race_is_real shows the window is real: a read on an unrelated stream
sees the old NaN (it skips, rather than fails, if the race was not observed). A test whose
producer work finished before xgemm imported the array skips after its checks: it proved nothing.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys

import numpy as np
import pytest

import xgemm
from conftest import to_f64

pytestmark = pytest.mark.gpu
# JAX preallocates 75% of the GPU on first use, leaving torch and CuPy little in this process (as
# .gpu/use-bundle does; no effect once another module has loaded JAX)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

FRAMEWORKS = ("torch", "cupy", "jax")
PAIRS = [(c, p) for c in FRAMEWORKS for p in FRAMEWORKS if c != p]
SPIN_CYCLES = 100_000_000          # ~50 ms at the H200's 1.98 GHz: far longer than an import and a launch
JAX_CHAIN, JAX_N = 24, 4096        # 24 fp32 (HIGHEST precision) 4096^3 matmuls: ~60 ms on an H200
M, N, K = 128, 128, 64             # |results| <= 5*5*64 + 5: exact in fp16
DTYPE = np.float16


def _need(fw: str):
    """The framework's module, or skip when it is missing or has no CUDA device."""
    if fw == "torch":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("torch has no CUDA device")
        return torch
    if fw == "cupy":
        cp = pytest.importorskip("cupy")
        try:
            if cp.cuda.runtime.getDeviceCount() > 0:
                return cp
        except cp.cuda.runtime.CUDARuntimeError:
            pass
        pytest.skip("CuPy has no CUDA device")
    jax = pytest.importorskip("jax")
    try:
        jax.devices("cuda")
    except RuntimeError:
        pytest.skip("JAX has no CUDA backend here")
    return jax


def _ints(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-5, 6, shape).astype(DTYPE)


def ready(fw: str, values: np.ndarray):
    """values as an fw array on GPU 0 (written on fw's current stream; sync_all() before relying on it)."""
    mod = _need(fw)
    if fw == "torch":
        return mod.from_numpy(values).to("cuda:0")
    if fw == "cupy":
        return mod.asarray(values)
    return mod.device_put(values, mod.devices("cuda")[0])


def nan_full(fw: str, shape):
    mod = _need(fw)
    if fw == "torch":
        return mod.full(shape, float("nan"), dtype=mod.float16, device="cuda:0")
    if fw == "cupy":
        return mod.full(shape, mod.nan, dtype=DTYPE)
    return mod.device_put(np.full(shape, np.nan, DTYPE), mod.devices("cuda")[0])


def sync_all() -> None:
    """Wait for all work on GPU 0 (every stream of every framework: they share the primary context)."""
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_available():
        sys.modules["torch"].cuda.synchronize(0)
    elif "cupy" in sys.modules:
        sys.modules["cupy"].cuda.runtime.deviceSynchronize()
    else:
        import jax
        jax.effects_barrier()


@functools.lru_cache(None)
def _cupy_spin():
    import cupy as cp
    return cp.RawKernel(r"""
extern "C" __global__ void xgemm_test_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}""", "xgemm_test_spin")


@functools.lru_cache(None)
def _jax_slow_write():
    """jit(dsts, vals, big) -> vals, each written into its donated NaN buffer after a chain of big matmuls
    (jnp.where on the chain's sum, which is always true, keeps every write behind the chain)."""
    import jax
    import jax.numpy as jnp

    def slow(dsts, vals, big):
        t = jax.lax.fori_loop(0, JAX_CHAIN, lambda i, t: jnp.matmul(t, big, precision=jax.lax.Precision.HIGHEST), big)
        ok = jnp.sum(t) > -1.0          # big = 1/n everywhere: every product is big again, the sum n
        return tuple(jnp.where(ok, v, d) for v, d in zip(vals, dsts))
    return jax.jit(slow, donate_argnums=0)


@contextlib.contextmanager
def pending(fw: str, *values: np.ndarray):
    """Yields (arrays, busy): fw arrays on GPU 0 that hold NaN now and `values` once a ~50 ms spin and then
    the writes have run on a side stream. Inside the block that side stream is fw's current stream (the
    one a DLPack handshake must order after); busy() says whether its work is still running."""
    mod = _need(fw)
    if fw == "torch":
        xs = [nan_full("torch", v.shape) for v in values]
        srcs = [ready("torch", v) for v in values]
        mod.cuda.synchronize(0)
        s = mod.cuda.Stream()                      # torch's pool streams do not sync with the legacy stream
        with mod.cuda.stream(s):
            mod.cuda._sleep(SPIN_CYCLES)
            for x, src in zip(xs, srcs):
                x.copy_(src)
            yield xs, (lambda: not s.query())
    elif fw == "cupy":
        xs = [nan_full("cupy", v.shape) for v in values]
        srcs = [ready("cupy", v) for v in values]
        spin = _cupy_spin()
        spin((1,), (1,), (np.int64(0),))           # compile the spin and the copy kernel outside the window
        for src in srcs:
            mod.empty_like(src)[...] = src
        mod.cuda.runtime.deviceSynchronize()
        s = mod.cuda.Stream(non_blocking=True)
        with s:
            spin((1,), (1,), (np.int64(SPIN_CYCLES),))
            for x, src in zip(xs, srcs):
                x[...] = src
            yield xs, (lambda: not s.done)
    else:
        gpu = mod.devices("cuda")[0]
        dsts = tuple(nan_full("jax", v.shape) for v in values)
        vals = tuple(ready("jax", v) for v in values)
        big = mod.device_put(np.full((JAX_N, JAX_N), 1.0 / JAX_N, np.float32), gpu)
        slow = _jax_slow_write()
        mod.block_until_ready(slow(tuple(nan_full("jax", v.shape) for v in values), vals, big))   # compile
        mod.block_until_ready((dsts, vals, big))
        xs = list(slow(dsts, vals, big))           # async dispatch: returns while the chain runs
        yield xs, (lambda: not all(x.is_ready() for x in xs))


def read_on_side_stream(fw: str, x):
    """fw's copy of x (another framework's array): fw's from_dlpack while a fresh side stream is fw's current
    stream, then a copy on that stream, so only the DLPack handshake orders the copy after x's writes."""
    mod = _need(fw)
    if fw == "torch":
        with mod.cuda.stream(mod.cuda.Stream()):
            return mod.from_dlpack(x).clone()
    if fw == "cupy":
        with mod.cuda.Stream(non_blocking=True):
            return mod.from_dlpack(x).copy()
    import jax.numpy as jnp
    return jnp.array(mod.dlpack.from_dlpack(x), copy=True)


@contextlib.contextmanager
def current_stream(fw: str, side: bool):
    """The consumer's current stream: its default one, or a fresh side stream (xgemm launches on it)."""
    mod = _need(fw)
    if not side:
        yield
    elif fw == "torch":
        with mod.cuda.stream(mod.cuda.Stream()):
            yield
    else:
        with mod.cuda.Stream(non_blocking=True):
            yield


def exact(result, expected: np.ndarray, what: str) -> None:
    got = to_f64(result)
    assert not np.isnan(got).any(), f"{what}: NaN in the result: read before the write it must wait for landed"
    np.testing.assert_array_equal(got, expected.astype(np.float64), err_msg=what)


def _not_exercised(what: str) -> None:
    pytest.skip(f"values right, but the producer's work had finished before {what}: the race was not "
                f"exercised; raise SPIN_CYCLES / JAX_CHAIN")


CONSUMERS = [(c, p, side) for c, p in PAIRS for side in ((False, True) if c != "jax" else (False,))]


@pytest.mark.parametrize("consumer,producer,side", CONSUMERS,
                         ids=[f"{c}<-{p}{'-side' if s else ''}" for c, p, s in CONSUMERS])
def test_operand_still_written_by_the_producer(consumer, producer, side):
    """xgemm.matmul(a, b) and xgemm.gemm(a, b, c): b and c of another framework, their writes still
    pending on its current stream; the owner's from_dlpack must make xgemm's stream wait for them."""
    _need(consumer), _need(producer)
    a_np, b_np, c_np = _ints((M, K), 0), _ints((K, N), 1), _ints((M, N), 2)
    a = ready(consumer, a_np)
    ab = a_np.astype(np.float64) @ b_np.astype(np.float64)

    def calls(b, c):
        return xgemm.matmul(a, b), xgemm.gemm(a, b, c, beta=1.0)

    with current_stream(consumer, side):
        calls(ready(producer, b_np), ready(producer, c_np))     # warm: plans, kernels, compiles
        sync_all()
        with pending(producer, b_np, c_np) as ((b, c), busy):
            d, e = calls(b, c)
            still_pending = busy()
    sync_all()
    exact(d, ab, "matmul(a, b)")
    exact(e, ab + c_np, "gemm(a, b, c)")
    if not still_pending:
        _not_exercised("xgemm imported b and c")


@pytest.mark.parametrize("owner,reader", PAIRS, ids=[f"{o}->{r}" for o, r in PAIRS])
def test_result_read_by_another_framework_while_pending(owner, reader):
    """xgemm's result (out= poisoned with NaN for torch and CuPy), its launch queued behind pending work
    on the owner's current stream, read through the reader's from_dlpack on the reader's side stream."""
    _need(owner), _need(reader)
    a_np, b_np = _ints((M, K), 3), _ints((K, N), 4)
    b = ready(owner, b_np)
    out = nan_full(owner, (M, N)) if owner != "jax" else None
    read_on_side_stream(reader, xgemm.matmul(ready(owner, a_np), b, out=out))    # warm
    if out is not None:
        out[...] = float("nan")
    sync_all()
    with pending(owner, a_np) as ((a,), busy):
        d = xgemm.matmul(a, b, out=out)                # queued behind the spin, on the owner's side stream
        y = read_on_side_stream(reader, d)
        still_pending = busy()
    sync_all()
    exact(y, a_np.astype(np.float64) @ b_np.astype(np.float64), f"{reader} reading xgemm's {owner} result")
    if not still_pending:
        _not_exercised(f"{reader} imported the result")


def _unordered_copy(fw: str, x):
    """A copy of x on a stream that does not wait for anything: what a missing handshake would read."""
    if fw == "torch":
        torch = _need("torch")
        with torch.cuda.stream(torch.cuda.Stream()):
            return x.clone()
    cp = _need("cupy")
    if fw == "jax":                                    # JAX never hands out a pending buffer itself
        mem = cp.cuda.UnownedMemory(x.unsafe_buffer_pointer(), x.size * x.dtype.itemsize, x)
        x = cp.ndarray(x.shape, x.dtype, cp.cuda.MemoryPointer(mem, 0))
    with cp.cuda.Stream(non_blocking=True):
        return x.copy()


@pytest.mark.parametrize("producer", FRAMEWORKS)
def test_without_a_handshake_the_race_is_real(producer):
    """The spin is long enough: a read on an unrelated stream, with no DLPack handshake, sees the old NaN."""
    _need(producer)
    v = _ints((M, N), 5)
    _unordered_copy(producer, ready(producer, v))      # warm: CuPy compiles its copy kernel on first use
    with pending(producer, v) as ((x,), busy):
        stale = _unordered_copy(producer, x)
        still_pending = busy()
    sync_all()
    exact(x, v.astype(np.float64), "the producer's write")
    stale = to_f64(stale)
    if np.array_equal(stale, v.astype(np.float64)):
        pytest.skip(f"race not observed (the {producer} write landed before the unordered read; still pending "
                    f"after it: {still_pending}): raise SPIN_CYCLES / JAX_CHAIN")
    if producer == "jax" and not np.isnan(stale).all():
        pytest.skip("JAX did not write into the donated NaN buffer: the stale read saw other old contents")
    assert np.isnan(stale).all(), "the unordered read saw part of the write: it raced with it"
