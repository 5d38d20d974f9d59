"""One function, written once against the array API standard, run by xgemm on NumPy, torch, CuPy and JAX.

    python examples/array_api_generic.py

`attention` asks `xgemm.array_api.namespace(q, k, v)` for its namespace: that is
`array_api_compat.array_namespace(q, k, v)` with xgemm's matmul and softmax. `mlp` takes the plain
`array_api_compat.array_namespace(x)` and calls xgemm.gemm / xgemm.matmul by name. Neither knows
which library its arrays come from; both return arrays of that library. Each runs on every
framework that imports here (torch and JAX on their GPU when they have one, CuPy only with a GPU),
`attention` under jax.jit too, and is checked against NumPy float64. Exits non-zero on a mismatch.
"""
import importlib.util
import math

import array_api_compat
import numpy as np

import xgemm


def attention(q, k, v):
    """softmax(q @ k^T / sqrt(d)) @ v for (..., T, d) arrays of any array-API library."""
    xp = xgemm.array_api.namespace(q, k, v)
    scores = xp.matmul(q, xp.matrix_transpose(k)) / math.sqrt(q.shape[-1])
    return xp.matmul(xp.softmax(scores, axis=-1), v)


def mlp(x, w1, b1, w2):
    """relu(x @ w1 + b1) @ w2: the namespace for the elementwise part, xgemm for the products."""
    xp = array_api_compat.array_namespace(x, w1, b1, w2)
    h = xgemm.gemm(x, w1, b1, beta=1.0)
    return xgemm.matmul(xp.where(h > 0, h, xp.zeros_like(h)), w2)


# float64 references
rng = np.random.default_rng(0)
B, T, D, H = 2, 16, 32, 64
q_np, k_np, v_np = (rng.standard_normal((B, T, D)).astype(np.float32) for _ in range(3))
w1_np = (rng.standard_normal((D, H)) / math.sqrt(D)).astype(np.float32)
b1_np = rng.standard_normal(H).astype(np.float32)
w2_np = (rng.standard_normal((H, D)) / math.sqrt(H)).astype(np.float32)
f64 = lambda a: a.astype(np.float64)
s = f64(q_np) @ np.swapaxes(f64(k_np), -1, -2) / math.sqrt(D)
p = np.exp(s - s.max(-1, keepdims=True))
attention_ref = (p / p.sum(-1, keepdims=True)) @ f64(v_np)
mlp_ref = np.maximum(f64(q_np) @ f64(w1_np) + f64(b1_np), 0) @ f64(w2_np)


def frameworks():
    """(name, from NumPy, to NumPy) for each framework that imports here."""
    yield "numpy", lambda a: a, np.asarray
    if importlib.util.find_spec("torch"):
        import torch
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        yield f"torch ({dev})", lambda a: torch.tensor(a, device=dev), lambda t: t.cpu().numpy()
    else:
        print("torch: skipped (not installed)")
    if importlib.util.find_spec("cupy"):
        why = "no GPU"
        try:
            import cupy
            gpus = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:      # no driver, or a CuPy built for another CUDA
            gpus, why = 0, f"{type(e).__name__}: {e}"
        if gpus:
            yield "cupy (cuda)", cupy.asarray, cupy.asnumpy
        else:
            print(f"cupy: skipped ({why})")
    else:
        print("cupy: skipped (not installed)")
    if importlib.util.find_spec("jax"):
        import jax
        import jax.numpy as jnp
        yield f"jax ({jax.default_backend()})", jnp.asarray, np.asarray
    else:
        print("jax: skipped (not installed)")


for name, to_fw, to_np in frameworks():
    q, k, v, w1, b1, w2 = (to_fw(a) for a in (q_np, k_np, v_np, w1_np, b1_np, w2_np))
    print(f"{name}: x @ w1 + b1 runs on {xgemm.explain(q, w1, b1, beta=1.0).kernel_name}")
    for label, out, ref in [("attention", attention(q, k, v), attention_ref),
                            ("mlp", mlp(q, w1, b1, w2), mlp_ref)]:
        # the result is an array of the caller's library, with the shape the math gives
        assert array_api_compat.array_namespace(out) is array_api_compat.array_namespace(q), type(out)
        assert tuple(out.shape) == ref.shape, (out.shape, ref.shape)
        err = float(np.abs(to_np(out).astype(np.float64) - ref).max())
        kind = f"{type(out).__module__.split('.')[0]}.{type(out).__name__}"
        print(f"  {label:<9} -> {kind:<20} max |err| vs float64 {err:.1e}")
        assert err < 1e-4 * max(1.0, float(np.abs(ref).max())), f"{name} {label}: error {err}"

if importlib.util.find_spec("jax"):          # the same function traced: xgemm's JAX primitives
    import jax
    import jax.numpy as jnp
    out = jax.jit(attention)(*(jnp.asarray(a) for a in (q_np, k_np, v_np)))
    err = float(np.abs(np.asarray(out, np.float64) - attention_ref).max())
    print(f"jax.jit(attention): max |err| vs float64 {err:.1e}")
    assert err < 1e-4, err
print("ok")
