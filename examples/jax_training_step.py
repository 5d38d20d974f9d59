"""A jitted JAX training step whose forward and backward run through xgemm.

    python examples/jax_training_step.py

Softmax regression (logits = x @ W + b through xgemm.jax.gemm, probabilities through
xgemm.jax.softmax) trained by a few SGD steps inside jax.jit: jax.grad differentiates through
xgemm's custom_vjp rules, so dX, dW and db are xgemm products too. Checks that the gradients match
the same model written with jnp / jax.nn (to fp32 rounding) and that the loss decreases. Runs on
JAX's default device (the GPU when jax sees one, where the calls are XLA custom calls); exits
non-zero on a mismatch.
"""
import sys

try:
    import jax
    import jax.numpy as jnp
except ImportError:
    print("skipped: needs jax")
    sys.exit(0)

import numpy as np

import xgemm.jax as xj

N, D, C = 256, 32, 10                    # examples, features, classes
rng = np.random.default_rng(0)          # data made in NumPy: jax.random would compile for seconds
x_np = rng.standard_normal((N, D)).astype(np.float32)
true_w = rng.standard_normal((D, C)).astype(np.float32)
labels = np.argmax(x_np @ true_w + 0.5 * rng.standard_normal((N, C)), axis=-1)
x, onehot = jnp.asarray(x_np), jnp.asarray(np.eye(C, dtype=np.float32)[labels])
params = {"w": jnp.zeros((D, C), jnp.float32), "b": jnp.zeros((C,), jnp.float32)}


def loss_xgemm(params, x, onehot):
    logits = xj.gemm(x, params["w"], params["b"], beta=1.0)      # x @ w + b, one xgemm call
    probs = xj.softmax(logits, axis=-1)
    return -jnp.mean(jnp.sum(onehot * jnp.log(probs + 1e-9), axis=-1))


def loss_jnp(params, x, onehot):
    # HIGHEST: full fp32 products on a GPU too, where XLA's default would round to TF32
    logits = jnp.matmul(x, params["w"], precision=jax.lax.Precision.HIGHEST) + params["b"]
    probs = jax.nn.softmax(logits, axis=-1)
    return -jnp.mean(jnp.sum(onehot * jnp.log(probs + 1e-9), axis=-1))


@jax.jit
def sgd_step(params, x, onehot, lr=0.5):
    loss, grads = jax.value_and_grad(loss_xgemm)(params, x, onehot)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss


# the gradients xgemm's backward gives, against jnp's, at a point where they are not trivial
probe = {"w": jnp.asarray(0.1 * true_w), "b": jnp.asarray(np.linspace(-1.0, 1.0, C, dtype=np.float32))}
g_x, g_ref = (jax.jit(jax.grad(f, argnums=(0, 1)))(probe, x, onehot) for f in (loss_xgemm, loss_jnp))
for name, a, b in [("dw", g_x[0]["w"], g_ref[0]["w"]), ("db", g_x[0]["b"], g_ref[0]["b"]), ("dx", g_x[1], g_ref[1])]:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    err, scale = np.abs(a - b).max(), np.abs(b).max()
    print(f"grad {name}: shape {tuple(a.shape)}, max |xgemm - jnp| {err:.1e} (max |grad| {scale:.1e})")
    assert err <= 1e-5 + 1e-4 * scale, f"{name}: xgemm's gradient differs from jnp's by {err}"

print(f"x @ w + b runs on: {xj.explain_gemm(x, params['w'], params['b'], beta=1.0).kernel_name}")
losses = []
for step in range(20):
    params, loss = sgd_step(params, x, onehot)
    losses.append(float(loss))
accuracy = np.mean(np.argmax(x_np @ np.asarray(params["w"]) + np.asarray(params["b"]), -1) == labels)
print(f"loss over {len(losses)} SGD steps on {jax.default_backend()}: "
      + " ".join(f"{v:.3f}" for v in losses[::4]) + f" ... {losses[-1]:.3f}; train accuracy {accuracy:.2f}")
assert np.all(np.diff(losses) < 0), f"the loss did not decrease at every step: {losses}"
assert losses[-1] < 0.6 * losses[0], f"the loss fell too little: {losses[0]:.3f} -> {losses[-1]:.3f}"
assert abs(float(loss_xgemm(params, x, onehot)) - float(loss_jnp(params, x, onehot))) < 1e-5
print("ok")
