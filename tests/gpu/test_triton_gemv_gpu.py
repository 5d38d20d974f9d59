"""triton_gemv_sm90 on the H200 (XGEMM_DECODE=1): decode shapes through the public API, eagerly, in
a CUDA graph and under jax.jit, against float64 references with NaN-poisoned outputs. Its
validation run: when these pass and benchmarks/decode.py shows it ahead, the gate comes off."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import xgemm  # noqa: E402
from xgemm.core import policy  # noqa: E402
from xgemm.kernels import triton_gemv_sm90 as gv  # noqa: E402

pytestmark = pytest.mark.gpu
DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@pytest.fixture(autouse=True)
def enabled(monkeypatch):
    monkeypatch.setenv(gv.ENABLE, "1")
    policy._plans.clear()
    yield
    policy._plans.clear()


def _operands(m, n, k, dtype, b_major):
    g = torch.Generator().manual_seed(m * 7 + n + k)
    a = torch.randint(-2, 3, (m, k), generator=g).to(DT[dtype]).cuda()
    b = torch.randint(-2, 3, (k, n), generator=g).to(DT[dtype])
    b = (b.t().contiguous().t() if b_major == "col" else b).cuda()
    return a, b


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("b_major", ["row", "col"])
@pytest.mark.parametrize("mnk", [(1, 28672, 8192), (16, 8192, 8192), (7, 1000, 1032), (2, 8, 8), (13, 4104, 264)],
                         ids=str)
def test_decode_matches_float64(dtype, b_major, mnk):
    m, n, k = mnk
    a, b = _operands(m, n, k, dtype, b_major)
    assert xgemm.explain(a, b).kernel_name == gv.NAME, str(xgemm.explain(a, b))
    want = a.double() @ b.double()               # integers: exact in fp32 accumulation
    out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
    got = xgemm.matmul(a, b, out=out)
    torch.cuda.synchronize()
    assert torch.equal(got.double(), want)
    y = xgemm.gemm(a, b, alpha=0.5)              # the inputs' dtype: one rounding of the exact sum
    torch.testing.assert_close(y, (0.5 * want).to(DT[dtype]), rtol=0, atol=0)


def test_decode_in_a_cuda_graph():
    a, b = _operands(4, 4096, 4096, "bfloat16", "col")
    out = torch.full((4, 4096), float("nan"), dtype=torch.float32, device="cuda")
    xgemm.matmul(a, b, out=out)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        xgemm.matmul(a, b, out=out)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.double(), a.double() @ b.double())


def test_decode_under_jit():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import numpy as np

    import xgemm.jax as xj
    a = jnp.asarray(np.random.default_rng(0).integers(-2, 3, (3, 2048)), jnp.bfloat16)
    b = jnp.asarray(np.random.default_rng(1).integers(-2, 3, (2048, 4096)), jnp.bfloat16)
    text = jax.jit(lambda a, b: xj.gemm(a, b, out_dtype=jnp.float32)).lower(a, b).as_text()
    assert "xgemm_gemv_sm90" in text
    got = jax.jit(lambda a, b: xj.gemm(a, b, out_dtype=jnp.float32))(a, b)
    np.testing.assert_array_equal(np.asarray(got, np.float64), np.asarray(a, np.float64) @ np.asarray(b, np.float64))
