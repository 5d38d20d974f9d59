"""gluon_matmul_sm90 on an H200, through its kernel protocol (KERNEL.run on ArrayViews built from
torch CUDA tensors). Integer inputs in [-5, 5] (exact in fp16/bf16, exact fp32 sums): the float64
reference is exact and the only error allowed is the final rounding to the output dtype. Outputs
are NaN-poisoned before every launch. Needs the prebuilt cubins (python -m xgemm build-cache)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from helpers import hopper, kernel_view  # noqa: E402

from xgemm import arrays  # noqa: E402
from xgemm.core.problem import COL, ROW, Device, Epilogue, GemmProblem  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not hopper(), reason="needs a Hopper (sm_90) GPU")]

TORCH_DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
REL = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -22}
CASES = [  # (M, N, K, in dtype, out dtype, B layout)
    (1, 8, 8, "bfloat16", "bfloat16", "row"),
    (333, 200, 136, "bfloat16", "bfloat16", "row"),
    (1025, 520, 264, "float16", "float16", "row"),
    (2100, 2056, 1032, "bfloat16", "bfloat16", "row"),    # several waves: the persistent loop
    (300, 264, 200, "bfloat16", "float32", "row"),
    (296, 264, 200, "float16", "float32", "col"),
    (512, 1024, 4096, "bfloat16", "bfloat16", "col"),     # long K: many pipeline wraps
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:3])) + f"-{c[3]}-{c[4]}-b{c[5]}")
def test_exact(case):
    from xgemm.kernels.gluon_matmul_sm90 import KERNEL
    m, n, k, dt, odt, lb = case
    dev = Device("cuda", torch.cuda.current_device(), torch.cuda.get_device_capability())
    g = torch.Generator().manual_seed(m * 31 + n)
    a64 = torch.randint(-5, 6, (m, k), generator=g).double()
    b64 = torch.randint(-5, 6, (k, n), generator=g).double()
    a = a64.to(TORCH_DT[dt]).cuda()
    b = (b64.t().contiguous().to(TORCH_DT[dt]).cuda().t() if lb == "col" else b64.to(TORCH_DT[dt]).cuda())
    out = torch.full((m, n), float("nan"), dtype=TORCH_DT[odt], device="cuda")
    va, vb, vo = kernel_view(a), kernel_view(b), kernel_view(out)
    prob = GemmProblem(m=m, n=n, k=k, batch=(), a=arrays.operand(va), b=arrays.operand(vb), c=None,
                       epilogue=Epilogue(out_dtype=odt), framework="torch", device=dev)
    assert prob.b.majorness == (COL if lb == "col" else ROW)
    reason = KERNEL.supports(prob)
    assert reason is None, reason
    KERNEL.run(prob, KERNEL.policy(prob), (va, vb, None), vo, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    ref = a64 @ b64
    got = out.double().cpu()
    assert not torch.isnan(got).any(), "tiles left unwritten"
    err = ((got - ref).abs() / ref.abs().clamp_min(1.0)).max().item()
    assert err <= REL[odt], err
