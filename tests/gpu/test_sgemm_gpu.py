"""cute_sgemm on a GPU, called through its kernel protocol (KERNEL.run on ArrayViews of torch tensors):
ragged shapes, all 8 majorness combinations of A/B/D (and C), misaligned and offset views, alpha/beta
(beta = 0 with NaN in C), batched with broadcast (stride-0) batches, nested batch dims, split-K,
K = 0, every tile config; against float64 references. Inputs are integers in [-5, 5] so fp32 results
are exact; every output lives inside a NaN-filled buffer, so unwritten elements and writes outside
the output both show. Every class the cases need is compiled first, in parallel worker processes
(xgemm.runtime.cute_cache.warm), then the cases run from the disk cache.
"""
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

# XGEMM_TEST_DEVICE=cpu builds the cases on the CPU, only to list the classes they need (dry run)
DEVICE = os.environ.get("XGEMM_TEST_DEVICE", "cuda")
if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from xgemm.arrays import ArrayView  # noqa: E402
from xgemm.core.layout import unit_stride_dim
from xgemm.core.problem import COL, ROW, Device, Epilogue, GemmProblem, Operand  # noqa: E402
from xgemm.kernels import cute_sgemm as S  # noqa: E402
from xgemm.runtime import cute_cache as xcompile  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ARCH = torch.cuda.get_device_capability() if DEVICE == "cuda" else (9, 0)
DEV = Device("cuda", torch.cuda.current_device() if DEVICE == "cuda" else 0, ARCH)


# ----------------------------------------------------------------------------------------------
# building operands
# ----------------------------------------------------------------------------------------------
def view(t) -> ArrayView:
    return ArrayView(obj=t, framework="torch", device=DEV, ptr=t.data_ptr(), shape=tuple(t.shape),
                     strides=tuple(t.stride()), dtype="float32", itemsize=4, readonly=False)


def operand(t) -> Operand:
    major = unit_stride_dim(t.shape, t.stride())
    align = 16
    while align > 4 and any(v % align for v in [t.data_ptr()] + [4 * s for s in t.stride() if s != 1]):
        align //= 2
    return Operand(tuple(t.shape), tuple(t.stride()), "float32", major, align)


def matrix(rows, cols, major, batch=(), *, offset=0, pad=0, fill=None, gen=None):
    """(batch..., rows, cols) fp32 view, ROW or COL major, inside a larger buffer: `offset` elements
    into each row/column (misaligns the base when not a multiple of 4), `pad` extra elements of
    leading dimension. Values: integers in [-5, 5] (or `fill`). Returns (view, storage)."""
    inner, outer = (cols, rows) if major == ROW else (rows, cols)
    storage = torch.full(tuple(batch) + (outer, inner + offset + pad), float("nan"), device=DEVICE)
    x = storage[..., offset:offset + inner]
    if fill is None:
        x.copy_(torch.randint(-5, 6, x.shape, generator=gen, device=DEVICE).float())
    else:
        x.fill_(fill)
    if major == COL:
        x = x.transpose(-1, -2)
    return x, storage


def problem_for(a, b, c, out, alpha, beta) -> GemmProblem:
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = tuple(out.shape[:-2])
    reads = c is not None and beta != 0.0
    return GemmProblem(m=m, n=n, k=k, batch=batch, a=operand(a), b=operand(b),
                       c=operand(c) if reads else None,
                       epilogue=Epilogue(alpha=alpha, beta=beta, has_c=c is not None, out_dtype="float32"),
                       framework="torch", device=DEV)


# ----------------------------------------------------------------------------------------------
# the cases (data only, so every needed class can be compiled up front in parallel)
# ----------------------------------------------------------------------------------------------
MAJ = {"r": ROW, "c": COL}
CASES = {}


def _case(name, m, n, k, am="r", bm="r", dm="r", cm=None, alpha=1.0, beta=0.0, batch=(),
          a_off=0, b_off=0, c_off=0, d_off=0, pad=0, tile=None, split=None, b_bcast=False,
          c_bcast=False, c_nan=False, random=False):
    CASES[name] = dict(m=m, n=n, k=k, am=am, bm=bm, dm=dm, cm=cm, alpha=alpha, beta=beta, batch=batch,
                       a_off=a_off, b_off=b_off, c_off=c_off, d_off=d_off, pad=pad, tile=tile, split=split,
                       b_bcast=b_bcast, c_bcast=c_bcast, c_nan=c_nan, random=random)


# all 8 majorness combos of A/B/D: aligned (128-bit copies) and ragged (32-bit + predicates), with C
for am in "rc":
    for bm in "rc":
        for dm in "rc":
            _case(f"major_{am}{bm}{dm}_aligned", 192, 160, 96, am, bm, dm)
            _case(f"major_{am}{bm}{dm}_ragged_c", 77, 93, 61, am, bm, dm, cm="c" if dm == "r" else "r",
                  alpha=0.5, beta=-2.0)
# ragged and degenerate shapes on the default layout
for m, n, k in [(1, 1, 1), (1, 257, 3), (255, 1, 129), (129, 130, 131), (33, 65, 1000), (5, 7, 1)]:
    _case(f"shape_{m}x{n}x{k}", m, n, k, alpha=2.0, cm="r", beta=1.0)
# misaligned / offset views (base not 16-byte aligned, leading dims not multiples of 4)
_case("offset_a", 100, 64, 72, a_off=1)
_case("offset_b_col", 64, 100, 72, bm="c", b_off=3)
_case("offset_all_pad", 96, 96, 40, am="c", bm="c", dm="c", cm="r", a_off=2, b_off=1, c_off=3, d_off=1,
      pad=1, alpha=1.5, beta=0.25)
_case("aligned_padded_ld", 128, 128, 64, pad=4, cm="r", beta=1.0)
# alpha / beta; beta == 0 must not read C (C is all NaN)
_case("beta0_nan_c", 96, 80, 50, cm="r", c_nan=True, alpha=3.0, beta=0.0)
_case("beta0_nan_c_split", 64, 96, 2048, cm="c", c_nan=True, beta=0.0, split=4, tile="64x64x8")
_case("alpha0_beta1", 64, 64, 64, cm="c", alpha=0.0, beta=1.0)
_case("c_bias_row", 70, 130, 33, cm="r", c_bcast=True, beta=1.0)     # C (N,) broadcast: stride 0
# batched: own strides per operand, stride-0 broadcast of B and of C, nested batch dims
_case("batch3", 65, 66, 67, batch=(3,), cm="r", beta=1.0)
_case("batch3_bcast_b", 64, 64, 64, batch=(3,), b_bcast=True, dm="c")
_case("batch2x3_nested", 33, 40, 20, batch=(2, 3), b_bcast=True, cm="c", beta=-1.0, bm="c")
_case("batch_split", 40, 48, 1500, batch=(2,), cm="r", beta=0.5, split=3, tile="32x32x32")
# split-K (forced) and the policy's own choice on skinny / small problems
_case("split4_ragged_k", 64, 200, 1001, cm="r", alpha=0.5, beta=2.0, split=4, tile="64x64x8")
_case("split8_col_d", 50, 70, 4096, dm="c", split=8, tile="64x128x8")
_case("policy_skinny", 64, 512, 4096, cm="r", beta=1.0)
_case("policy_small", 128, 128, 128)
_case("k_zero", 40, 50, 0, cm="r", beta=2.0)
_case("k_zero_noc", 40, 50, 0)
_case("random_floats", 300, 200, 700, am="c", random=True, cm="r", beta=0.3, alpha=1.1)
# K split over thread groups inside the CTA (the tiny row): ragged K, batch, offsets, C
_case("kgroups_batch_ragged_k", 33, 40, 1000, batch=(2,), cm="r", beta=0.5, tile="32x32x32k4")
_case("kgroups_offset_all", 96, 96, 40, am="c", bm="c", dm="c", cm="r", a_off=2, b_off=1, c_off=3, d_off=1,
      pad=1, alpha=1.5, beta=0.25, tile="32x32x32k4")
_case("kgroups_random", 128, 128, 128, random=True, tile="32x32x32k2")
# every tile config on a ragged, mixed-layout problem
for cname in S.CONFIGS:
    _case(f"config_{cname}", 150, 170, 90, am="c", bm="r", dm="r", cm="r", beta=1.0, tile=cname)
    _case(f"config_{cname}_kmajor", 150, 170, 90, am="r", bm="c", dm="c", tile=cname)


def build_case(spec, gen):
    m, n, k, batch = spec["m"], spec["n"], spec["k"], spec["batch"]
    a, _ = matrix(m, k, MAJ[spec["am"]], batch, offset=spec["a_off"], pad=spec["pad"], gen=gen)
    bb = batch[1:] if spec["b_bcast"] and batch else batch
    b, _ = matrix(k, n, MAJ[spec["bm"]], bb, offset=spec["b_off"], pad=spec["pad"], gen=gen)
    if spec["b_bcast"] and batch:
        b = b.unsqueeze(0).expand(tuple(batch) + tuple(b.shape[-2:]))     # stride 0 over batch[0]
    if spec["random"]:
        a.copy_(torch.randn(a.shape, generator=gen, device=DEVICE))
        b.copy_(torch.randn(b.shape, generator=gen, device=DEVICE))
    c = None
    if spec["cm"] is not None:
        if spec["c_bcast"]:
            row, _ = matrix(1, n, ROW, (), gen=gen)
            c = row.expand(m, n)
        else:
            c, _ = matrix(m, n, MAJ[spec["cm"]], batch, offset=spec["c_off"], pad=spec["pad"],
                          fill=float("nan") if spec["c_nan"] else None, gen=gen)
    out, out_storage = matrix(m, n, MAJ[spec["dm"]], batch, offset=spec["d_off"], pad=spec["pad"],
                              fill=float("nan"))
    prob = problem_for(a, b, c, out, spec["alpha"], spec["beta"])
    if spec["tile"] is not None:
        pol = S.policy_of(spec["tile"], spec["split"] or 1)
    else:
        pol = S.KERNEL.policy(prob)
    return dict(a=a, b=b, c=c, out=out, out_storage=out_storage, problem=prob, policy=pol)


def required_items(cases):
    items = []
    for cs in cases.values():
        ops = (view(cs["a"]), view(cs["b"]), view(cs["c"]) if cs["c"] is not None else None)
        for key, _ in S.KERNEL.required(cs["problem"], cs["policy"], ops, view(cs["out"])):
            items.append(("xgemm.kernels.cute_sgemm", key))
    return items


def build_all():
    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(1234)
    return {name: build_case(spec, gen) for name, spec in CASES.items()}


@pytest.fixture(scope="module")
def built():
    cases = build_all()
    items = required_items(cases)
    t0 = time.perf_counter()
    n = xcompile.warm(items, jobs=min(16, os.cpu_count() or 1))
    print(f"\nwarm: {len(set(k for _, k in items))} classes, {n} compiled, {time.perf_counter() - t0:.1f}s")
    return cases


def reference(a, b, c, alpha, beta):
    d = torch.matmul(a.double(), b.double()) * alpha
    if c is not None and beta != 0.0:
        d = d + beta * c.double()
    return d


@pytest.mark.parametrize("name", list(CASES))
def test_case(built, name):
    cs, spec = built[name], CASES[name]
    a, b, c, out = cs["a"], cs["b"], cs["c"], cs["out"]
    assert S.KERNEL.supports(cs["problem"]) is None, S.KERNEL.supports(cs["problem"])
    ops = (view(a), view(b), view(c) if c is not None else None)
    S.KERNEL.run(cs["problem"], cs["policy"], ops, view(out), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    ref = reference(a, b, c, spec["alpha"], spec["beta"])
    got = out.double()
    assert torch.isfinite(got).all(), f"unwritten (NaN) outputs: {(~torch.isfinite(got)).sum().item()}"
    if spec["random"]:
        err = (got - ref).norm() / ref.norm()
        assert err < 1e-5, f"relative error {err:.2e}"
    else:
        bad = (got != ref).sum().item()
        assert bad == 0, f"{bad} of {got.numel()} elements differ; max |diff| {(got - ref).abs().max().item()}"
    # nothing written outside the output view: the rest of its buffer is still NaN
    storage = cs["out_storage"]
    marks = torch.zeros_like(storage, dtype=torch.bool)
    region = marks[..., spec["d_off"]:spec["d_off"] + (spec["n"] if spec["dm"] == "r" else spec["m"])]
    region.fill_(True)
    assert torch.isnan(storage[~marks]).all(), "the kernel wrote outside the output"


def test_policy_table_covers_targets():
    """Every shape of the acceptance list gets a config the table names, split only when skinny."""
    for m, n, k in [(128, 128, 128), (1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192),
                    (8192, 8192, 128), (64, 8192, 8192)]:
        name, split = S.choose_config(m, n, k, 1)
        assert name in S.CONFIGS and split >= 1
        if m * n >= 4096 * 4096:
            assert split == 1


def test_public_api_routes_fp32_here():
    """xgemm.gemm on fp32 CUDA tensors reaches this kernel (forced) and is exact on integer data."""
    xgemm = pytest.importorskip("xgemm")
    if "cute_sgemm" not in xgemm.core.policy.kernel_names("gemm"):
        pytest.skip("cute_sgemm is not registered in the dispatch table")
    g = torch.Generator(device="cuda")
    g.manual_seed(7)
    a = torch.randint(-5, 6, (3, 70, 90), generator=g, device="cuda").float()
    b = torch.randint(-5, 6, (90, 50), generator=g, device="cuda").float()
    c = torch.randint(-5, 6, (70, 50), generator=g, device="cuda").float()
    with xgemm.core.policy.force("cute_sgemm"):
        d = xgemm.gemm(a, b, c, alpha=2.0, beta=-1.0)
    torch.cuda.synchronize()
    ref = 2.0 * torch.matmul(a.double(), b.double()) - c.double()
    assert torch.equal(d.double(), ref)


def test_new_process_loads_from_disk(built, tmp_path):
    """A second process pays no compile for a class this session has seen, and its first call is fast."""
    script = textwrap.dedent(f"""
        import sys, time, json
        sys.path.insert(0, {str(ROOT)!r})
        import torch
        a = torch.randint(-5, 6, (192, 96), device="cuda").float()
        b = torch.randint(-5, 6, (96, 160), device="cuda").float()
        out = torch.full((192, 160), float("nan"), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        from xgemm.runtime import cute_cache as xc
        from xgemm.arrays import ArrayView
        from xgemm.kernels import cute_sgemm as S
        from xgemm.core.problem import Device, Epilogue, GemmProblem, Operand, ROW
        t1 = time.perf_counter()
        dev = Device("cuda", 0, torch.cuda.get_device_capability())
        v = lambda t: ArrayView(t, "torch", dev, t.data_ptr(), tuple(t.shape), tuple(t.stride()), "float32", 4, False)
        op = lambda t: Operand(tuple(t.shape), tuple(t.stride()), "float32", ROW, 16)
        p = GemmProblem(192, 160, 96, (), op(a), op(b), None, Epilogue(), "torch", dev)
        pol = S.KERNEL.policy(p)
        import tvm_ffi                              # the loader's own import, timed apart
        t15 = time.perf_counter()
        for key, build in S.KERNEL.required(p, pol, (v(a), v(b), None), v(out)):
            xc.cute(key, build)                      # the disk load (tvm_ffi import + .so)
        t2 = time.perf_counter()
        S.KERNEL.run(p, pol, (v(a), v(b), None), v(out), torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        ok = torch.equal(out, a @ b)
        print(json.dumps(dict(first_call_s=t3 - t0, import_s=t1 - t0, tvm_ffi_import_s=t15 - t1,
                              load_s=t2 - t15, launch_s=t3 - t2,
                              stats=xc.stats(), ok=ok, cutlass_imported="cutlass" in sys.modules)))
    """)
    # the same class as case major_rrr_aligned (192x160x96 row-major, 16-byte aligned)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ))
    assert res.returncode == 0, res.stderr[-3000:]
    import json
    info = json.loads(res.stdout.strip().splitlines()[-1])
    print("\nnew process:", info)
    assert info["ok"]
    assert info["stats"]["compiled"] == 0 and info["stats"]["disk"] >= 1
    assert info["first_call_s"] < 1.0
