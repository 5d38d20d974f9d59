"""Building test inputs in each framework with a chosen dtype and memory layout."""
from __future__ import annotations

import os

import numpy as np

FRAMEWORKS = tuple(os.environ.get("XGEMM_TEST_FRAMEWORKS", "numpy,torch,jax").split(","))
DTYPES = ("float32", "float16", "bfloat16", "float64")
# layouts a caller can hand us: contiguous, transposed (column-major), every other column,
# offset by one row, reversed rows (negative stride: NumPy only)
LAYOUTS = ("contiguous", "transposed", "sliced", "offset", "reversed")


def np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return np.dtype(name)


def make(values: np.ndarray, framework: str, dtype: str, layout: str = "contiguous"):
    """An array equal to `values` (float64, any ndim) in `framework`/`dtype`, laid out per `layout`."""
    v = np.asarray(values, np.float64)
    if framework == "jax" or v.ndim < 2:
        layout = "contiguous"          # JAX arrays are always row-major
    if framework == "torch" and layout == "reversed":
        layout = "sliced"              # torch has no negative strides
    if layout == "transposed":
        base = np.ascontiguousarray(np.swapaxes(v, -1, -2))
    elif layout == "sliced":
        base = np.zeros(v.shape[:-1] + (2 * v.shape[-1],))
        base[..., ::2] = v
    elif layout == "offset":
        base = np.zeros(v.shape[:-2] + (v.shape[-2] + 1, v.shape[-1]))
        base[..., 1:, :] = v
    elif layout == "reversed":
        base = np.ascontiguousarray(v[..., ::-1, :])
    else:
        base = v
    arr = _to_framework(base, framework, dtype)
    if layout == "transposed":
        return arr.transpose(-1, -2) if framework == "torch" else np.swapaxes(arr, -1, -2)
    if layout == "sliced":
        return arr[..., ::2]
    if layout == "offset":
        return arr[..., 1:, :]
    if layout == "reversed":
        return arr[..., ::-1, :]
    return arr


def _to_framework(v: np.ndarray, framework: str, dtype: str):
    if framework == "numpy":
        return v.astype(np_dtype(dtype))
    if framework == "torch":
        import torch
        return torch.from_numpy(v).to(getattr(torch, dtype))
    if framework == "jax":
        import jax.numpy as jnp
        return jnp.asarray(v, dtype=np_dtype(dtype))
    raise ValueError(framework)


def rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values rounded through `dtype`, as float64."""
    return np.asarray(values, np.float64).astype(np_dtype(dtype)).astype(np.float64)


# ---------------------------------------------------------------------------------------------
# Driving one kernel through its protocol (tests/gpu): the views and operands the API would build

def hopper() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def kernel_view(t):
    """arrays.ArrayView of a torch tensor, as the API hands operands to a kernel's run()."""
    from xgemm import arrays
    return arrays.view(t, "t", "test")


def run_on_fake_devices(script: str, devices: int, timeout: int = 300, **env: str) -> str:
    """Runs `script` in a fresh Python on `devices` fake XLA:CPU devices (the flag must be set
    before jax starts, and other test modules share this process's jax) with this checkout on the
    path; asserts it exits 0 and prints ALL OK; returns its stdout."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    full = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu",
                PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]), **env)
    proc = subprocess.run([sys.executable, "-c", script], env=full, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 and "ALL OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout


def run_interpreted(script: str, timeout: int = 600) -> str:
    """Runs `script` in a fresh Python under Triton's interpreter (TRITON_INTERPRET=1, which must be
    set before triton is imported) from the checkout's root; asserts it exits 0; returns its stdout."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def swiglu_block(a, b, dy, dtype):
    """silu(gate) * up of h = a @ b ([gate | up] halves) and its grads w.r.t. a and b, in torch's own
    ops at `dtype` (float64: the reference; bf16: torch's unfused peer): [y, da, db] as float64."""
    import torch
    a_, b_ = a.detach().to(dtype).requires_grad_(), b.detach().to(dtype).requires_grad_()
    h = a_ @ b_
    half = h.shape[-1] // 2
    y = torch.nn.functional.silu(h[:, :half]) * h[:, half:]
    y.backward(dy.to(dtype))
    return [t.double() for t in (y, a_.grad, b_.grad)]


def lower_ragged_dot_grad(forced=None) -> str:
    """The cuda lowering (text) of jit(value_and_grad) of a bf16 xgemm.jax.ragged_dot loss at E=8,
    T=4096, K=1024, N=2048 (forward, dlhs, drhs), with the policy forced onto `forced` if given."""
    import contextlib

    import jax
    import jax.numpy as jnp

    from xgemm import jax as xj
    from xgemm.core import policy
    lhs = jax.ShapeDtypeStruct((4096, 1024), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((8, 1024, 2048), jnp.bfloat16)
    sizes = jax.ShapeDtypeStruct((8,), jnp.int32)

    def loss(l, r, g):
        return jnp.sum(xj.ragged_dot(l, r, g).astype(jnp.float32))
    policy.clear_plans()
    try:
        with policy.force(forced) if forced else contextlib.nullcontext():
            return jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).trace(lhs, rhs, sizes).lower(
                lowering_platforms=("cuda",)).as_text()
    finally:
        policy.clear_plans()
