"""The bound fast path on a GPU: it launches on the caller's current stream, and stays exact.

A bound repeat call (xgemm/fastpath.py) asks torch for the raw current stream
(torch._C._cuda_getCurrentRawStream) instead of torch.cuda.current_stream(): the two must name
the same stream, on the default stream and inside `with torch.cuda.stream(s)`. Repeat calls on a
side stream, queued behind a long kernel on that stream, must read their inputs only after it:
inputs are integers in [-5, 5] (exact fp32/bf16 products), outputs compared for equality.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import xgemm  # noqa: E402
from xgemm.torch import fastpath  # noqa: E402

pytestmark = pytest.mark.gpu


def ints(*shape, dtype=torch.float32):
    g = torch.randint(-5, 6, shape, dtype=torch.float64)
    return g.to(dtype).cuda(), g


def test_raw_stream_is_torchs_current_stream():
    i = torch.cuda.current_device()
    assert torch._C._cuda_getCurrentRawStream(i) == torch.cuda.current_stream(i).cuda_stream
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        assert torch._C._cuda_getCurrentRawStream(i) == torch.cuda.current_stream(i).cuda_stream == s.cuda_stream


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bound_repeats_on_a_side_stream_are_ordered_and_exact(dtype):
    a, ga = ints(256, 256, dtype=dtype)
    b, gb = ints(256, 256, dtype=dtype)
    x = torch.randn(64, 1024, device="cuda")
    xgemm.matmul(a, b)
    xgemm.softmax(x)
    xgemm.softmax(x)                                     # softmax binds on its first repeat
    key = fastpath.gemm_key("matmul", a, b, None, 1.0, 0.0)
    assert fastpath.bound("gemm", key), "the GEMM was not bound: this test would not test it"
    assert fastpath.bound("softmax", fastpath.softmax_key(x, -1))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    big = torch.randn(4096, 4096, device="cuda")
    with torch.cuda.stream(s):
        a2 = torch.zeros_like(a)
        b2 = torch.zeros_like(b)
        x2 = torch.zeros_like(x)
        for _ in range(8):
            big = big @ big * 1e-3                       # keeps s busy while the copies queue
        a2.copy_(a)
        b2.copy_(b)
        x2.copy_(x)
        d = xgemm.matmul(a2, b2)                         # bound: must run on s, after the copies
        y = xgemm.softmax(x2)
    s.synchronize()
    torch.testing.assert_close(d.double().cpu(), (ga @ gb).to(dtype).double(), rtol=0, atol=0)
    torch.testing.assert_close(y, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
