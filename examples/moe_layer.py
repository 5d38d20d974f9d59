"""A mixture-of-experts MLP on xgemm's grouped GEMM, in torch (with autograd) and in JAX (jit and
grad), each checked against a loop of per-expert matmuls.

    python examples/moe_layer.py

Tokens are routed top-1 to E experts, sorted by expert, and each expert's rows are multiplied by
its weights in one call: xgemm.grouped_mm (torch._grouped_mm's offsets) for the up projection and
xgemm.ragged_dot (jax.lax.ragged_dot's group sizes) in JAX. The group sizes never leave the device.
On an H200 with bf16 both run triton_grouped_sm90, forward and backward (the weight gradient is
the variable-K grouped product); elsewhere the embedded default. explain() prints which. Exits
non-zero on a mismatch.
"""
import sys

import numpy as np

import xgemm

T, D, F, E = 512, 256, 512, 8            # tokens, model dim, expert hidden dim, experts


def route(logits):
    """Top-1 routing: each token's expert, the order that sorts tokens by expert, group sizes."""
    expert = logits.argmax(-1)
    return expert, np.argsort(expert, kind="stable"), np.bincount(expert, minlength=E)


rng = np.random.default_rng(0)
x_np = rng.standard_normal((T, D)).astype(np.float32)
w_np = (rng.standard_normal((E, D, F)) / D ** 0.5).astype(np.float32)
expert, order, sizes = route(rng.standard_normal((T, E)))
sizes[3] = 0                              # an expert with no tokens
keep = expert[order] != 3
order = order[keep]
rows = len(order)


def loop_reference(x, w):
    """The per-expert loop in float64: rows of x sorted by expert, each times its expert's w."""
    out, start = np.zeros((rows, F)), 0
    for e in range(E):
        out[start:start + sizes[e]] = x[order[start:start + sizes[e]]] @ w[e]
        start += sizes[e]
    return out


want = loop_reference(x_np.astype(np.float64), w_np.astype(np.float64))
failed = False

try:
    import torch
except ImportError:
    torch = None
    print("torch: skipped (not installed)")
if torch is not None:
    dev, dt = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)
    x = torch.tensor(x_np, device=dev).to(dt)[torch.tensor(order, device=dev)].requires_grad_()
    w = torch.tensor(w_np, device=dev).to(dt).requires_grad_()
    offs = torch.tensor(np.cumsum(sizes), device=dev, dtype=torch.int32)
    print(xgemm.explain(x.detach(), w.detach(), offs, op="grouped_mm"))
    y = xgemm.grouped_mm(x, w, offs)
    y.float().square().sum().backward()
    tol = 3e-2 if dt == torch.bfloat16 else 1e-4
    err = np.abs(y.detach().double().cpu().numpy() - want).max() / np.abs(want).max()
    # d/dw of sum(y^2): 2 * x_e^T @ y_e per expert (zero for the empty one)
    dw = torch.zeros(E, D, F, dtype=torch.float64, device=dev)
    start = 0
    for e in range(E):
        xe, ye = x.detach()[start:start + sizes[e]].double(), y.detach()[start:start + sizes[e]].double()
        dw[e] = 2 * xe.T @ ye
        start += sizes[e]
    gerr = ((w.grad.double() - dw).abs().max() / dw.abs().max()).item()
    print(f"torch {dt}: forward rel err {err:.1e}, weight grad rel err {gerr:.1e}")
    failed |= err > tol or gerr > tol

try:
    import jax
    import jax.numpy as jnp
except ImportError:
    jax = None
    print("jax: skipped (not installed)")
if jax is not None:
    import xgemm.jax as xj
    dt = jnp.bfloat16 if any(d.platform == "gpu" for d in jax.devices()) else jnp.float32
    xs, wj, gs = jnp.asarray(x_np[order], dt), jnp.asarray(w_np, dt), jnp.asarray(sizes, jnp.int32)
    print(xgemm.explain(xs, wj, gs, op="ragged_dot"))
    loss = jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(xj.ragged_dot(x, w, gs).astype(jnp.float32) ** 2),
                                      argnums=(0, 1)))
    value, (gx, gw) = loss(xs, wj)
    ref_value, (rx, rw) = jax.value_and_grad(
        lambda x, w: jnp.sum(jax.lax.ragged_dot(x.astype(jnp.float32), w.astype(jnp.float32), gs) ** 2),
        argnums=(0, 1))(xs, wj)
    tol = 3e-2 if dt == jnp.bfloat16 else 1e-4
    errs = [float(jnp.max(jnp.abs(a.astype(jnp.float32) - b)) / jnp.max(jnp.abs(b))) for a, b in ((gx, rx), (gw, rw))]
    verr = abs(float(value) - float(ref_value)) / abs(float(ref_value))
    print(f"jax {jnp.dtype(dt).name}: loss rel err {verr:.1e}, grad rel errs {errs[0]:.1e} {errs[1]:.1e}")
    failed |= verr > tol or max(errs) > tol

sys.exit(1 if failed else 0)
