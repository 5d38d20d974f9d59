"""xgemm inside jax.jit: a custom call on the GPU (the embedded default, XLA's own op, on CPU).

    python examples/jax_jit.py

Shows matmul/gemm/softmax under jit, grad, vmap and explain(); prints where the call lowered to.
"""
import jax
import jax.numpy as jnp

import xgemm
import xgemm.jax as xj

key = jax.random.key(0)
x = jax.random.normal(key, (8, 512, 256), jnp.float32)            # a batch of activations
w = jax.random.normal(jax.random.fold_in(key, 1), (256, 1024), jnp.float32) / 16
bias = jnp.zeros((1024,), jnp.float32)


@jax.jit
def layer(x, w, bias):
    h = xgemm.gemm(x, w, bias, alpha=1.0, beta=1.0)   # D = x @ w + bias (the batch folds into M)
    return xgemm.softmax(h, axis=-1)


y = layer(x, w, bias)
print("layer:", y.shape, y.dtype, "rows sum to", float(y[0, 0].sum()))

# grad goes through xgemm too (dA = dD @ B^T, dB = A^T @ dD, dC = beta * dD)
loss = lambda w: jnp.sum(layer(x, w, bias) ** 2)
g = jax.jit(jax.grad(loss))(w)
print("grad:", g.shape, "matches jnp:", bool(jnp.allclose(
    g, jax.grad(lambda w: jnp.sum(jax.nn.softmax(x @ w + bias, -1) ** 2))(w), rtol=1e-4, atol=1e-6)))

# vmap folds into the kernel's batch: one call, no loop
per_example = jax.vmap(lambda xi: xj.matmul(xi, w))(x)
print("vmap:", per_example.shape)

# what ran, and why
print(xgemm.explain(x, w))
hlo = layer.lower(x, w, bias).compile().as_text()
print("lowered to:", "the xgemm FFI custom call" if "xgemm_cubin_launch" in hlo else
      "CuTe cutlass_call" if "CuteDSLRT" in hlo else f"XLA's own ops on {jax.default_backend()}")
