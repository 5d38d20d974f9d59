"""xgemm.jax on a CUDA GPU: the native FFI launches the Gluon softmax cubins inside jax.jit, the CuTe
GEMM and FP8 classes run through TVM-FFI, grads match jnp, and XLA can capture the custom call in a
CUDA graph (command buffer). Skipped without CUDA.

Needs the Gluon cubins for the shapes below in the xgemm cache (XGEMM_CACHE_DIR), built on any
machine with triton >= 3.8 (`python -m xgemm build-cache`).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import xgemm.jax as xj  # noqa: E402


def _gpu():
    try:
        return jax.devices("cuda")[0]
    except RuntimeError:
        pytest.skip("JAX has no CUDA backend here")


def _softmax64(x, axis):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("shape,axis", [((64, 4096), -1), ((8, 3, 1000), 1), ((16, 65536), -1), ((2, 262144), -1)])
def test_softmax_runs_through_the_ffi(shape, axis):
    dev = _gpu()
    x = jax.device_put(jax.random.normal(jax.random.key(0), shape, jnp.float32) * 4, dev)
    f = jax.jit(lambda x: xj.softmax(x, axis=axis))
    hlo = f.lower(x).compile().as_text()
    assert "xgemm_cubin_launch_v1" in hlo, "softmax did not lower to the native FFI custom call"
    y = f(x)
    np.testing.assert_allclose(np.asarray(y, np.float64), _softmax64(x, axis), rtol=2e-5, atol=1e-9)
    np.testing.assert_array_equal(np.asarray(xj.softmax(x, axis=axis)), np.asarray(y))   # eager: same primitive


@pytest.mark.parametrize("dtype,shape", [("float32", ((128, 128), (128, 128))), ("float32", ((3, 64, 96), (96, 80))),
                                         ("bfloat16", ((512, 256), (256, 384))), ("float16", ((2, 256, 128), (2, 128, 64))),
                                         ("bfloat16", ((3072, 1024), (1024, 2560)))])   # the transposed run
def test_gemm_runs_the_cute_kernels_through_the_ffi(dtype, shape):
    dev = _gpu()
    rng = np.random.default_rng(0)
    av, bv = (rng.integers(-5, 6, s).astype(np.float64) for s in shape)
    a = jax.device_put(jnp.asarray(av, dtype), dev)
    b = jax.device_put(jnp.asarray(bv, dtype), dev)
    f = jax.jit(lambda a, b: xj.gemm(a, b, alpha=0.5))
    hlo = f.lower(a, b).compile().as_text()
    assert "xgemm_tvm_ffi_call" in hlo or "xgemm_cubin_launch" in hlo, \
        f"gemm did not lower to the xgemm FFI ({xj.explain_gemm(a, b).kernel_name})"
    d = np.asarray(f(a, b)).astype(np.float64)
    np.testing.assert_array_equal(d, np.asarray(jnp.asarray(0.5 * (av @ bv), dtype)).astype(np.float64))


@pytest.mark.parametrize("shape", [((512, 8192), (8192, 1024)), ((7168, 4096), (4096, 576)), ((512, 32768), (32768, 512))])
def test_split_k_runs_inside_jit(shape):
    """The policy's split-K picks (few output tiles over a long K) inside jit: the workspace is XLA
    scratch, the flags a zero-filled operand the kernel leaves zero; repeated calls stay exact
    (integer values, exact float32 sums)."""
    dev = _gpu()
    rng = np.random.default_rng(1)
    av, bv = (rng.integers(-5, 6, s).astype(np.float64) for s in shape)
    a = jax.device_put(jnp.asarray(av, jnp.bfloat16), dev)
    b = jax.device_put(jnp.asarray(bv, jnp.bfloat16), dev)
    assert xj.explain_gemm(a, b).policy.split_k > 1, xj.explain_gemm(a, b)
    f = jax.jit(xj.matmul)
    assert "xgemm_tvm_ffi_call" in f.lower(a, b).compile().as_text()
    want = np.asarray(jnp.asarray(av @ bv, jnp.bfloat16)).astype(np.float64)
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(f(a, b)).astype(np.float64), want)


@pytest.mark.parametrize("shape", [((2048, 999), (999, 4097), (4097,)), ((4, 512, 999), (999, 2049), None),
                                   ((4096, 1032), (1032, 2003), (4096, 2003))])
def test_unaligned_half_gemm_runs_on_padded_arrays(shape):
    """Rows that are not 16-byte multiples (problems over core.layout.PAD_MIN_FLOP): jit pads K and N
    with zeros (explain_gemm lists it), the tensor-core kernel runs, D is the first N columns;
    exact for integer inputs."""
    dev = _gpu()
    rng = np.random.default_rng(1)
    sa, sb, sc = shape
    av, bv = rng.integers(-5, 6, sa).astype(np.float64), rng.integers(-5, 6, sb).astype(np.float64)
    cv = rng.integers(-5, 6, sc).astype(np.float64) if sc else None
    a, b = (jax.device_put(jnp.asarray(v, jnp.bfloat16), dev) for v in (av, bv))
    args = (a, b) + ((jax.device_put(jnp.asarray(cv, jnp.bfloat16), dev),) if sc else ())
    f = jax.jit(lambda *x: xj.gemm(*x, alpha=2.0, beta=-1.0) if len(x) == 3 else xj.gemm(*x, alpha=2.0))
    hlo = f.lower(*args).compile().as_text()
    assert "xgemm_tvm_ffi_call" in hlo, "the padded problem did not reach the kernel"
    ref = 2.0 * (av @ bv) - (cv if sc else 0.0)
    np.testing.assert_array_equal(np.asarray(f(*args)).astype(np.float64),
                                  np.asarray(jnp.asarray(ref, jnp.bfloat16)).astype(np.float64))
    plan = xj.explain_gemm(*args, alpha=2.0, beta=-1.0 if sc else 0.0)
    assert plan.kernel_name == "cute_gemm_sm90" and any("zero-padded" in c for c in plan.copies), str(plan)


@pytest.mark.parametrize("recipe", ["row", "block"])
def test_scaled_matmul_runs_the_fp8_class_inside_jit(recipe):
    """jit(xj.scaled_matmul) on the GPU: one TVM-FFI custom call to cute_gemm_sm90's promoting FP8
    class (row-wise scales as vectors, block-wise ones as they are), within the promoted bound (4
    wgmma steps of 2**-13 a k-tile, plus bf16's rounding) of the float64 product of the dequantized
    operands. The shape is test_cute_epilogue_gpu's BLOCK_API: ragged M (no multiple of 4: scale_a
    padded to its stride), N and K."""
    dev = _gpu()
    m, n, k = 1002, 1040, 592
    kb, nb = -(-k // 128), -(-n // 128)
    rng = np.random.default_rng(3)
    a8 = jnp.asarray(rng.standard_normal((m, k)) * 2, jnp.float8_e4m3fn)
    b8 = jnp.asarray(rng.standard_normal((k, n)) * 2, jnp.float8_e4m3fn)
    shapes = {"row": ((m, 1), (1, n)), "block": ((m, kb), (kb, nb))}[recipe]
    sa, sb = (jnp.asarray(rng.uniform(0.5, 1.5, s), jnp.float32) for s in shapes)
    args = [jax.device_put(x, dev) for x in (a8, b8, sa, sb)]
    f = jax.jit(xj.scaled_matmul)
    assert "xgemm_tvm_ffi_call" in f.lower(*args).compile().as_text()
    y = np.asarray(f(*args).astype(jnp.float32), np.float64)
    a64, b64, sa64, sb64 = (np.asarray(x.astype(jnp.float32), np.float64) for x in (a8, b8, sa, sb))
    if recipe == "block":
        sa64 = np.repeat(sa64, 128, 1)[:, :k]
        sb64 = np.repeat(np.repeat(sb64, 128, 0), 128, 1)[:k, :n]
    ad, bd = a64 * sa64, b64 * sb64
    ref, mag = ad @ bd, np.abs(ad) @ np.abs(bd)
    bound = 2.0 ** -8 * (np.abs(ref) + 1.0) + 4 * 2.0 ** -13 * mag
    assert np.isfinite(y).all() and (np.abs(y - ref) / bound).max() <= 1.0, (np.abs(y - ref) / bound).max()


def test_grads_match_jnp_on_gpu():
    dev = _gpu()
    k = jax.random.key(1)
    a = jax.device_put(jax.random.normal(k, (256, 128), jnp.float32), dev)
    b = jax.device_put(jax.random.normal(jax.random.fold_in(k, 1), (128, 512), jnp.float32), dev)
    w = jax.device_put(jax.random.normal(jax.random.fold_in(k, 2), (256, 512), jnp.float32), dev)

    def loss(mm, sm):
        return lambda a, b: jnp.sum(sm(mm(a, b) * 0.05) * w)
    got = jax.jit(jax.grad(loss(xj.matmul, lambda y: xj.softmax(y, -1)), (0, 1)))(a, b)
    want = jax.jit(jax.grad(loss(lambda a, b: jnp.matmul(a, b, precision="highest"),
                                 lambda y: jax.nn.softmax(y, -1)), (0, 1)))(a, b)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5 * float(jnp.max(jnp.abs(r))))


GRAPH_SCRIPT = r'''
import numpy as np, jax, jax.numpy as jnp
import xgemm.jax as xj
from xgemm.jax import ffi as jax_ffi
# a cold process: the first xgemm call is this jit's, so the CuTe function loads its module then
rng = np.random.default_rng(0)
q, _ = np.linalg.qr(rng.standard_normal((128, 128)))      # orthogonal: the chain keeps its norm
xm64 = rng.standard_normal((128, 128))
def mm(x, w):
    for _ in range(8):
        x = xj.matmul(x, w)
    return x
jm = jax.jit(mm)
xm, wm = jnp.asarray(xm64, jnp.float32), jnp.asarray(q, jnp.float32)
assert jax_ffi.TVM_GRAPH_TARGET in jm.lower(xm, wm).compile().as_text()
ym = np.asarray(jm(xm, wm))
np.testing.assert_allclose(ym, xm64 @ np.linalg.matrix_power(q, 8), rtol=1e-4, atol=1e-4)
x = jax.random.normal(jax.random.key(0), (256, 4096), jnp.float32)
def f(x):
    for _ in range(8):
        x = xj.softmax(x * 3.0, axis=-1)
    return x
jf = jax.jit(f)
y = np.asarray(jf(x), np.float64)
ref = np.asarray(x, np.float64)
for _ in range(8):
    ref = ref * 3.0
    ref = np.exp(ref - ref.max(-1, keepdims=True)); ref /= ref.sum(-1, keepdims=True)
np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-9)
# XLA forms command buffers from thunks (no command_buffer computation shows in the HLO), so the
# handler's own counts say what happened. XLA runs a command buffer's commands uncaptured on its
# first execution(s), then records them (again when buffer addresses change) and replays the
# graph, which repeats the kernels without calling the handler. So after a warm-up, every launch
# the handler makes for either chain must be one made under capture.
def calls(fn, n):
    for _ in range(n):
        out = fn()
        assert np.array_equal(np.asarray(out[0]), out[1])
softmax_call = lambda: (jf(x), y.astype(np.float32))
matmul_call = lambda: (jm(xm, wm), ym)
calls(softmax_call, 3); calls(matmul_call, 3)
for name, fn in (("cubin softmax chain", softmax_call), ("TVM-FFI matmul chain", matmul_call)):
    before = jax_ffi.launch_counts()
    calls(fn, 3)
    after = jax_ffi.launch_counts()
    new, captured = after[0] - before[0], after[1] - before[1]
    print("LAUNCHES", name, "in 3 calls after warm-up:", new, "of which under capture:", captured)
    assert new == captured, f"{name}: {new - captured} launches outside a CUDA graph after warm-up"
assert jax_ffi.launch_counts()[1] > 0, "no launch was ever recorded under CUDA-graph capture"
print("GRAPH OK")
'''


def test_custom_call_is_captured_in_a_cuda_graph():
    _gpu()
    root = Path(__file__).resolve().parents[2]
    flags = "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + flags).strip(),
               PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", GRAPH_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "GRAPH OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-6000:]
