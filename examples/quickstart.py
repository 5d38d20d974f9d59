"""matmul + gemm + softmax on NumPy, torch and JAX arrays, with the plan xgemm chose for each.

On a CPU machine every call runs on the embedded default (the framework's own op); on an H200
the same lines route to the CuTe-DSL and Gluon kernels. Run: python examples/quickstart.py
"""
import importlib.util

import numpy as np

import xgemm

rng = np.random.default_rng(0)
a_np = rng.standard_normal((128, 256), dtype=np.float32)
b_np = rng.standard_normal((256, 64), dtype=np.float32)
c_np = rng.standard_normal((128, 64), dtype=np.float32)


def show(label, result, reference, plan):
    err = np.abs(np.asarray(result, np.float64) - reference).max()
    print(f"{label:<28} shape {tuple(result.shape)!s:<12} max |err| vs float64 {err:.2e}")
    print("   " + str(plan).replace("\n", "\n   "))


ref_mm = a_np.astype(np.float64) @ b_np.astype(np.float64)
ref_gemm = 2.0 * ref_mm + 0.5 * c_np
x = np.log(np.abs(ref_mm) + 1.0)
ref_sm = np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)

print("== NumPy")
show("matmul", xgemm.matmul(a_np, b_np), ref_mm, xgemm.explain(a_np, b_np))
show("gemm alpha=2 beta=0.5", xgemm.gemm(a_np, b_np, c_np, alpha=2.0, beta=0.5), ref_gemm,
     xgemm.explain(a_np, b_np, c_np, alpha=2.0, beta=0.5))
xs = x.astype(np.float32)
show("softmax", xgemm.softmax(xs), ref_sm, xgemm.explain(xs))

if importlib.util.find_spec("torch"):
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"== torch ({dev})")
    a, b, c = (torch.from_numpy(v).to(dev) for v in (a_np, b_np, c_np))
    show("matmul (B transposed view)", xgemm.matmul(a, b.T.contiguous().T).cpu(), ref_mm, xgemm.explain(a, b.T.contiguous().T))
    show("gemm", xgemm.gemm(a, b, c, alpha=2.0, beta=0.5).cpu(), ref_gemm, xgemm.explain(a, b, c, alpha=2.0, beta=0.5))
    xt = torch.from_numpy(xs).to(dev)
    show("softmax", xgemm.softmax(xt).cpu(), ref_sm, xgemm.explain(xt))
else:
    print("== torch: not installed (pip install 'xgemm[torch]')")

if importlib.util.find_spec("jax"):
    import jax
    import jax.numpy as jnp
    print(f"== JAX ({jax.default_backend()})")
    a, b, c = (jnp.asarray(v) for v in (a_np, b_np, c_np))
    show("matmul", np.asarray(xgemm.matmul(a, b)), ref_mm, xgemm.explain(a, b))
    f = jax.jit(lambda a, b, c: xgemm.gemm(a, b, c, alpha=2.0, beta=0.5))
    show("gemm inside jax.jit", np.asarray(f(a, b, c)), ref_gemm, xgemm.explain(a, b, c, alpha=2.0, beta=0.5))
    xj = jnp.asarray(xs)
    show("softmax inside jax.jit", np.asarray(jax.jit(xgemm.softmax)(xj)), ref_sm, xgemm.explain(xj))
else:
    print("== JAX: not installed (pip install 'xgemm[jax]')")
