"""torch -> JAX -> torch through xgemm, the buffers handed over by DLPack without a copy.

    python examples/torch_jax_pipeline.py

A torch layer (xgemm.matmul writing into a preallocated `out=`), its result handed to JAX with
jax.dlpack.from_dlpack, a jitted xgemm gemm + softmax in JAX, the result handed back with
torch.from_dlpack, and a last xgemm.matmul that mixes a torch and a JAX operand. Each hand-over
compares data pointers (torch `data_ptr()`, JAX `unsafe_buffer_pointer()`) and prints whether the
buffer is shared; the values are checked against NumPy float64.

Runs on CUDA when both torch and JAX see a GPU (every hand-over of a whole tensor is then asserted zero-copy), else on
the CPU. On the CPU JAX wraps a foreign buffer only if it is 64-byte aligned, which torch's CPU
allocator gives a tensor's storage (NumPy's, behind torch.from_numpy, is 16-byte aligned) but not a
view at an offset: the last step shows such a view being copied (printed, not asserted: that
choice is JAX's). Exits non-zero on a mismatch.
"""
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # share the GPU with torch

import numpy as np

import xgemm

try:
    import jax
    import jax.numpy as jnp
    import torch

    import xgemm.jax as xj
except ImportError as e:
    print(f"skipped: needs torch and jax ({e})")
    sys.exit(0)

jax_gpu = jax.default_backend() == "gpu"
cuda = torch.cuda.is_available() and jax_gpu
dev = "cuda" if cuda else "cpu"
if torch.cuda.is_available() != jax_gpu:
    print(f"torch sees CUDA: {torch.cuda.is_available()}, JAX backend: {jax.default_backend()}; "
          "both must share one device for zero-copy, so this runs on the CPU")
print(f"device: {dev} (torch {torch.__version__}, jax {jax.__version__})")

rng = np.random.default_rng(0)
M, K, H, N, P = 64, 128, 96, 48, 32
x_np, w1_np, w2_np, w3_np = ((rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
                             for s in [(M, K), (K, H), (H, N), (N, P)])
b2_np = rng.standard_normal(N).astype(np.float32)

# float64 reference of the whole pipeline
f64 = lambda a: a.astype(np.float64)
h_ref = f64(x_np) @ f64(w1_np)
logits = h_ref @ f64(w2_np) + f64(b2_np)
p_ref = np.exp(logits - logits.max(-1, keepdims=True))
p_ref /= p_ref.sum(-1, keepdims=True)
z_ref = p_ref @ f64(w3_np)

steps = []   # (step, zero-copy?)


def handed_over(step, src_ptr, dst_ptr, must_share):
    shared = src_ptr == dst_ptr
    steps.append((step, shared))
    print(f"  {step:<48} {'zero-copy' if shared else 'COPY'}")
    if must_share:
        assert shared, f"{step}: expected the buffer to be shared, got a copy"


def check(name, got, ref, tol=2e-4):
    err = float(np.abs(np.asarray(got, np.float64) - ref).max())
    print(f"  {name:<48} max |err| vs float64 {err:.1e}")
    assert err <= tol * max(1.0, float(np.abs(ref).max())), f"{name}: error {err} above {tol}"


# 1. torch: h = x @ w1 written by xgemm into a buffer we own
# torch.tensor copies into torch's allocator (64-byte aligned); torch.from_numpy would keep NumPy's
# buffer, whose alignment is only 16 bytes, and JAX would copy it on the CPU
x, w1, w3 = (torch.tensor(v, device=dev) for v in (x_np, w1_np, w3_np))
h = torch.empty(M, H, device=dev)
r = xgemm.matmul(x, w1, out=h)
handed_over("xgemm.matmul(x, w1, out=h) wrote into h", h.data_ptr(), r.data_ptr(), must_share=True)
check("h = x @ w1 (torch)", h.cpu(), h_ref)

# 2. torch -> JAX: h and the second layer's weights, shared through DLPack
w2, b2 = torch.tensor(w2_np, device=dev), torch.tensor(b2_np, device=dev)
h_j, w2_j, b2_j = (jax.dlpack.from_dlpack(t) for t in (h, w2, b2))
for name, t, j in [("h", h, h_j), ("w2", w2, w2_j), ("b2", b2, b2_j)]:
    # on the CPU JAX wraps a buffer aligned to 64 bytes and copies any other; on CUDA it wraps all
    handed_over(f"torch -> JAX: {name}", t.data_ptr(), j.unsafe_buffer_pointer(),
                must_share=cuda or t.data_ptr() % 64 == 0)


# 3. JAX: softmax(h @ w2 + b2) under jax.jit, an XLA custom call on the GPU (XLA's ops on the CPU)
@jax.jit
def head(h, w, b):
    return xgemm.softmax(xgemm.gemm(h, w, b, beta=1.0), axis=-1)


p_j = head(h_j, w2_j, b2_j)
check("p = softmax(h @ w2 + b2) (jax.jit)", p_j, p_ref)
print(f"  ran as: {xj.explain_gemm(h_j, w2_j, b2_j, beta=1.0).kernel_name} + "
      f"{xj.explain_softmax(p_j).kernel_name}")

# 4. JAX -> torch: the jitted result, shared through DLPack
p = torch.from_dlpack(p_j)
handed_over("JAX -> torch: p", p_j.unsafe_buffer_pointer(), p.data_ptr(), must_share=True)

# 5. a torch and a JAX operand in one call: they meet through DLPack, result in torch (the first's)
w3_j = jax.dlpack.from_dlpack(w3)
handed_over("torch -> JAX: w3", w3.data_ptr(), w3_j.unsafe_buffer_pointer(), must_share=cuda or w3.data_ptr() % 64 == 0)
plan = xgemm.explain(p, w3_j)
z = xgemm.matmul(p, w3_j)
assert isinstance(z, torch.Tensor) and z.device == p.device
assert not plan.copies, plan.copies
print(f"  {'xgemm.matmul(p (torch), w3 (JAX))':<48} zero-copy ({plan.kernel_name})")
check("z = p @ w3 (torch)", z.cpu(), z_ref)

# 6. a view 16 bytes into its storage: JAX on the CPU wraps only 64-byte aligned buffers and copies
#    this one; on CUDA it may wrap it. Printed, not asserted: the choice is JAX's.
view = x.view(-1)[4:4 + 8 * K].view(8, K)
view_j = jax.dlpack.from_dlpack(view)
handed_over("torch -> JAX: a view 16 bytes into its storage", view.data_ptr(), view_j.unsafe_buffer_pointer(),
            must_share=False)
check("xgemm.matmul(view (JAX), w1 (JAX))", xgemm.matmul(view_j, jnp.asarray(w1_np)),
      f64(x_np).reshape(-1)[4:4 + 8 * K].reshape(8, K) @ f64(w1_np))

shared = sum(s for _, s in steps[:-1])
print(f"ok on {dev}: {shared}/{len(steps) - 1} buffers shared (out=, torch -> JAX, JAX -> torch); "
      f"the offset view {'shared' if steps[-1][1] else 'copied'}")
