"""fp16/bf16 GEMMs that no GPU kernel takes as given (rows not a multiple of 16 bytes, a base
address off 16) run on 16-byte-aligned padded copies instead of the framework fallback.

CPU only: tests/fake_cuda.py dresses CPU tensors as an sm_90 device and records the launches,
so these check what the kernel would receive (shapes, strides, zero padding) and what the caller
gets back; tests/gpu/test_api_gpu.py checks the numbers on the H200.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.bindings")
from fake_cuda import Fake  # noqa: E402

import xgemm  # noqa: E402


def ints(*shape, dtype=torch.bfloat16):
    return torch.randint(-5, 6, shape).to(dtype)


def launched_tensors(fake):
    (kind, key, args), = fake.calls
    assert kind == "cute" and key[0] == "cute_gemm_sm90", key
    return [t for t in args if isinstance(t, torch.Tensor)]


def aligned(t):
    return t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ragged_k_and_n_are_padded_with_zero_k(dtype):
    """K = 999 and N = 1001 are padded to 1008 (whole 32-byte sectors), the K padding zero."""
    a, b = ints(300, 999, dtype=dtype), ints(999, 1001, dtype=dtype)
    with Fake(keep=True) as fake:
        plan = xgemm.explain(a, b)
        d = xgemm.matmul(a, b)
    assert plan.kernel_name == "cute_gemm_sm90", str(plan)
    text = str(plan)
    assert "16-byte-aligned row-major (300, 1008)" in text and "(1008, 1008)" in text, text
    assert "first 1001 columns" in text, text
    a_p, b_p, d_p = launched_tensors(fake)
    assert a_p.shape == (300, 1008) and b_p.shape == (1008, 1008) and d_p.shape == (300, 1008)
    assert all(aligned(t) for t in (a_p, b_p, d_p))
    assert torch.equal(a_p[:, :999], a) and not a_p[:, 999:].any()        # K padding adds 0
    assert torch.equal(b_p[:999, :1001], b) and not b_p[999:, :].any()
    assert d.shape == (300, 1001) and d.is_contiguous() and d.dtype == dtype


def test_only_the_operand_that_needs_it_is_copied():
    a, b = ints(256, 1000), ints(1000, 1001)          # K = 1000 rows are 16-byte multiples: A stays
    with Fake(keep=True) as fake:
        xgemm.matmul(a, b)
        plan = str(xgemm.explain(a, b))
    a_p, b_p, _ = launched_tensors(fake)
    assert a_p.data_ptr() == a.data_ptr()
    assert b_p.shape == (1000, 1008)
    assert "a: shape" not in plan and "b: shape (1000, 1001)" in plan, plan


def test_misaligned_base_address_is_copied():
    big = ints(128, 257)
    a = big[:, 1:]                                     # K = 256, rows 514 bytes apart, base + 2 bytes
    b = ints(256, 128)
    with Fake(keep=True) as fake:
        xgemm.matmul(a, b)
    a_p, b_p, _ = launched_tensors(fake)
    assert a_p.shape == (128, 256) and aligned(a_p) and torch.equal(a_p, a)
    assert b_p.data_ptr() == b.data_ptr()


def test_gemm_with_c_batched_and_out():
    a, b, c = ints(2, 64, 99), ints(99, 77), ints(2, 64, 77)
    out = torch.empty(2, 64, 77, dtype=torch.bfloat16)
    with Fake(keep=True) as fake:
        d = xgemm.gemm(a, b, c, alpha=2.0, beta=-1.0, out=out)
        plan = str(xgemm.explain(a, b, c, alpha=2.0, beta=-1.0))
    assert d is out
    a_p, b_p, d_p, c_p = launched_tensors(fake)
    assert a_p.shape == (2, 64, 112) and b_p.shape == (112, 80)
    assert c_p.shape == (2, 64, 80) and torch.equal(c_p[..., :77], c)
    assert d_p.shape == (2, 64, 80)
    assert "kernel: cute_gemm_sm90" in plan, plan


def test_vector_operand():
    a, v = ints(300, 999), ints(999)
    with Fake(keep=True):
        y = xgemm.matmul(a, v)
    assert y.shape == (300,)


def test_aligned_problems_copy_nothing():
    with Fake(keep=True):
        plan = xgemm.explain(ints(256, 512), ints(512, 1024))
    assert plan.kernel_name == "cute_gemm_sm90" and not plan.copies, str(plan)


@pytest.mark.parametrize("case", ["out", "a", "both"])
def test_extent_one_dims_reach_the_kernel_with_dense_strides(case):
    """torch's (64, 1).t() is (1, 64) with strides (1, 1): a stride never stepped, which the
    classification takes as dense (16-byte rows). The kernel gets a view with the dense stride
    (same memory) instead of refusing the real one at launch (issue 22)."""
    a = ints(64, 1, dtype=torch.float16).t() if case in ("a", "both") else ints(1, 64, dtype=torch.float16)
    b = ints(64, 64, dtype=torch.float16)
    out = torch.full((64, 1), float("nan"), dtype=torch.float16).t() if case in ("out", "both") else None
    assert a.shape == (1, 64) and (out is None or out.stride() == (1, 1))
    with Fake(keep=True) as fake:
        d = xgemm.matmul(a, b, out=out)
    tensors = launched_tensors(fake)
    for t in tensors:
        assert t.stride()[0] == t.shape[1], t.stride()        # dense row stride on the extent-1 dim
    assert tensors[0].data_ptr() == a.data_ptr()              # the caller's memory, not a copy
    assert tensors[-1].data_ptr() == (out if out is not None else d).data_ptr()
    if out is not None:
        assert d is out
