"""The native torch fast path (ffi/torch_fastpath.cc) on a GPU: repeat calls served in C++ give
the planned call's values, on the caller's current stream.

Each case plans once, repeats until its signature is registered natively, then makes calls that
must all be native hits (the module's hit counter says so, so a test that silently ran the
Python path fails). Results land in blocks that were just freed from a NaN-filled tensor of the
same size (the caching allocator hands the same block back; checked), so an element the kernel
did not write shows. Inputs are integers in [-5, 5]: GEMM products are exact.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import xgemm  # noqa: E402
from xgemm.torch import native as torch_native  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def native():
    mod = torch_native.load()
    assert mod is not None, torch_native.status()
    return mod


def ints(*shape, dtype=torch.float32):
    return torch.randint(-5, 6, shape, dtype=torch.float64).to(dtype).cuda()


GEMMS = [
    # id, (m, n, k), dtype, with C (alpha, beta), expected kernel
    ("sgemm-256", (256, 256, 256), torch.float32, None, "cute_sgemm"),
    ("sgemm-odd-c", (33, 65, 17), torch.float32, (2.0, -1.0), "cute_sgemm"),
    ("sm90-bf16-256", (256, 256, 256), torch.bfloat16, None, "cute_gemm_sm90"),
    ("sm90-fp16-c", (128, 192, 64), torch.float16, (1.0, 1.0), "cute_gemm_sm90"),
    # the policy's transposed run (row-major A and B on the mid row): bound with B, A swapped
    ("sm90-bf16-transposed", (3072, 2560, 1024), torch.bfloat16, None, "cute_gemm_sm90"),
    ("sm90-fp16-transposed-c", (2560, 3072, 512), torch.float16, (0.5, 2.0), "cute_gemm_sm90"),
    ("splitk-bf16", (64, 1024, 2048), torch.bfloat16, None, "gluon_splitk_sm90"),
]


def _poisoned_call(fn, shape, dtype):
    """fn() right after freeing a NaN tensor of the result's size: (result, whether it reused it)."""
    poison = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
    ptr = poison.data_ptr()
    del poison
    out = fn()
    return out, out.data_ptr() == ptr


def _native_calls(native, fn, shape, dtype, n=4):
    """Plan, repeat until registered, then n calls that must all be native hits."""
    fn()
    for _ in range(3):
        fn()
    outs, reused = [], 0
    for _ in range(n):
        before = native.stats()["hits"]
        out, r = _poisoned_call(fn, shape, dtype)
        assert native.stats()["hits"] == before + 1, "not served natively: this test would not test it"
        outs.append(out)
        reused += r
    assert reused, "no result landed in a poisoned block: unwritten elements would not show"
    return outs


@pytest.mark.parametrize("case", GEMMS, ids=[g[0] for g in GEMMS])
def test_native_gemm_repeats_are_exact(native, case):
    name, (m, n, k), dtype, epi, kernel = case
    a, b = ints(m, k, dtype=dtype), ints(k, n, dtype=dtype)
    c = ints(m, n, dtype=dtype) if epi else None
    plan = str(xgemm.explain(a, b, *([c] if epi else []), **({"alpha": epi[0], "beta": epi[1]} if epi else {})))
    assert f"kernel: {kernel}" in plan
    assert ("D^T = B^T A^T" in plan) == ("transposed" in name), plan
    if epi:
        fn = lambda: xgemm.gemm(a, b, c, alpha=epi[0], beta=epi[1])   # noqa: E731
        ref = epi[0] * (a.double() @ b.double()) + epi[1] * c.double()
    else:
        fn = lambda: xgemm.matmul(a, b)                               # noqa: E731
        ref = a.double() @ b.double()
    for out in _native_calls(native, fn, (m, n), dtype):
        assert out.shape == (m, n) and out.dtype == dtype
        torch.testing.assert_close(out.double(), ref.to(dtype).double(), rtol=0, atol=0)
    # another signature (a transposed B) is planned, not served from the entry above
    bt = b.T.contiguous().T
    before = native.stats()["hits"]
    torch.testing.assert_close(xgemm.matmul(a, bt).double(), (a.double() @ b.double()).to(dtype).double(),
                               rtol=0, atol=0)
    assert native.stats()["hits"] == before


@pytest.mark.parametrize("shape,dtype", [((64, 1024), torch.float32), ((4, 65536), torch.bfloat16),
                                         ((3, 5, 300), torch.float16)])
def test_native_softmax_repeats(native, shape, dtype):
    x = (torch.randn(shape, device="cuda") * 4).to(dtype)
    ref = torch.softmax(x.float(), -1)
    for y in _native_calls(native, lambda: xgemm.softmax(x), shape, dtype):
        assert y.shape == x.shape and y.dtype == dtype
        torch.testing.assert_close(y.float(), ref, rtol=1e-2 if dtype != torch.float32 else 1e-5,
                                   atol=2e-3 if dtype != torch.float32 else 1e-6)


def test_native_hits_run_on_the_current_stream_in_order(native):
    a, b = ints(256, 256), ints(256, 256)
    x = torch.randn(64, 1024, device="cuda")
    _native_calls(native, lambda: xgemm.matmul(a, b), (256, 256), torch.float32, n=1)
    _native_calls(native, lambda: xgemm.softmax(x), (64, 1024), torch.float32, n=1)
    assert native.stream(torch.cuda.current_device()) == torch.cuda.current_stream().cuda_stream
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    big = torch.randn(4096, 4096, device="cuda")
    with torch.cuda.stream(s):
        assert native.stream(torch.cuda.current_device()) == s.cuda_stream
        a2, b2, x2 = torch.zeros_like(a), torch.zeros_like(b), torch.zeros_like(x)
        for _ in range(8):
            big = big @ big * 1e-3                       # keeps s busy while the copies queue
        a2.copy_(a)
        b2.copy_(b)
        x2.copy_(x)
        before = native.stats()["hits"]
        d = xgemm.matmul(a2, b2)                         # native: must run on s, after the copies
        y = xgemm.softmax(x2)
        assert native.stats()["hits"] == before + 2
    s.synchronize()
    torch.testing.assert_close(d.double(), a.double() @ b.double(), rtol=0, atol=0)
    torch.testing.assert_close(y, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)


def test_autograd_and_out_are_not_served_natively(native):
    a, b = ints(128, 128), ints(128, 128)
    _native_calls(native, lambda: xgemm.matmul(a, b), (128, 128), torch.float32, n=1)
    before = native.stats()["hits"]
    ag = a.clone().requires_grad_()
    d = xgemm.matmul(ag, b)
    d.sum().backward()
    torch.testing.assert_close(ag.grad, b.sum(1)[None, :].expand(128, 128), rtol=0, atol=0)   # ones @ b.T
    out = torch.full((128, 128), float("nan"), device="cuda")
    xgemm.matmul(a, b, out=out)
    torch.testing.assert_close(out.double(), a.double() @ b.double(), rtol=0, atol=0)
    assert native.stats()["hits"] == before


def test_torch_compile_of_the_public_api_after_native_hits(native):
    """Issue 22: with the native module active (after repeat calls), torch.compile(fullgraph=True)
    of the public API on CUDA tensors failed in dynamo's guard creation ('Unexpected type module')."""
    a, b = ints(64, 128), ints(128, 32)
    for _ in range(4):                       # plan, repeat: the signature is served natively
        xgemm.softmax(xgemm.matmul(a, b))
    assert torch_native.active is not None
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: xgemm.softmax(xgemm.matmul(a, b)), fullgraph=True)
    ref = torch.softmax((a.double() @ b.double()), -1).float()
    torch.testing.assert_close(f(a, b), ref, rtol=1e-5, atol=1e-6)
