"""Model layers on xgemm in eager torch, each checked against torch and explained: a SwiGLU MLP
(the gated product, then a down projection with a bias and GELU-tanh) and an FP8 linear layer
(quantize_fp8, then scaled_matmul).

    python examples/model_layers.py

On an H200 with bf16 tensors, the gated product and the bias + GELU product each run as one
cute_gemm_sm90 class that writes D once, and scaled_matmul(use_fast_accum=True) runs an FP8
class (its sums kept in the tensor core's accumulator, as torch._scaled_mm's use_fast_accum).
Elsewhere each call runs the embedded default: the product, then the epilogue in torch ops.
explain() prints which. Exits non-zero on a mismatch.
"""
import sys

try:
    import torch
except ImportError:
    print("skipped: needs torch")
    sys.exit(0)

import xgemm

cuda = torch.cuda.is_available()
dev, dt = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
torch.manual_seed(0)
T, D, H = 256, 512, 1024
x = torch.randn(T, D, device=dev).to(dt)
w_gate_up = (torch.randn(D, 2 * H, device=dev) / D ** 0.5).to(dt)      # [W_gate | W_up]
w_down = (torch.randn(H, D, device=dev) / H ** 0.5).to(dt)
b_down = torch.randn(D, device=dev).to(dt)

# SwiGLU MLP: silu(x @ W_gate) * (x @ W_up), then act(h @ W_down + b)
h = xgemm.gated(x, w_gate_up, activation="swiglu")
y = xgemm.gemm(h, w_down, bias=b_down, activation="gelu_tanh")
print(xgemm.explain(x, w_gate_up, activation="swiglu", op="gated"))
print(xgemm.explain(h, w_down, bias=b_down, activation="gelu_tanh"))

pre = x.double() @ w_gate_up.double()
h_ref = torch.nn.functional.silu(pre[:, :H]) * pre[:, H:]
y_ref = torch.nn.functional.gelu(h.double() @ w_down.double() + b_down.double(), approximate="tanh")
tol = dict(rtol=2e-2, atol=2e-2) if dt == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
torch.testing.assert_close(h.double(), h_ref, **tol)
torch.testing.assert_close(y.double(), y_ref, **tol)

# FP8 linear: activations quantized per row, the weight per output column (e4m3). b goes in
# column-major (K-major), the layout FP8 tensor cores read: quantize W^T per row, then transpose.
if getattr(torch, "float8_e4m3fn", None) is not None:
    w = torch.randn(D, D, device=dev) / D ** 0.5
    a8, sa = xgemm.quantize_fp8(x.float(), "row")                      # [T, D] e4m3, [T, 1]
    wt8, swt = xgemm.quantize_fp8(w.t().contiguous(), "row")           # [N, K] e4m3, [N, 1]
    b8, sb = wt8.t(), swt.t()                                          # [K, N] column-major, [1, N]
    out = xgemm.scaled_matmul(a8, b8, sa, sb, use_fast_accum=True)     # bf16
    print(xgemm.explain(a8, b8, sa, sb, op="scaled_matmul", use_fast_accum=True))
    da, db = a8.double() * sa.double(), b8.double() * sb.double()
    ref = da @ db
    # bf16 rounding, plus what a fast-accumulating FP8 kernel may lose: 2**-13 of sum |a||b| per
    # 32-deep wgmma step (tests/gpu/test_cute_epilogue_gpu.py)
    bound = 1e-2 * (ref.abs() + 1.0) + (D // 32) * 2.0 ** -13 * (da.abs() @ db.abs())
    assert ((out.double() - ref).abs() <= bound).all(), "scaled_matmul: out of bounds"
print("ok")
