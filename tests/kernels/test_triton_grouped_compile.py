"""triton_grouped_sm90 on the CPU: its values under Triton's interpreter (float16; the interpreter
mishandles bfloat16) for both modes, each layout it reads and the group-size edge cases (empty groups,
one-row groups, sizes off the tile, sums below and above T, a decreasing offset); the PTX of its
cubins (wgmma fed by TMA loads through descriptors made on the device, pipelined); its entries,
policy and what supports() declines."""
from __future__ import annotations

import re
import textwrap

import pytest
from helpers import lower_ragged_dot_grad, run_interpreted

from xgemm.core.grouped_checks import GroupedProblem, GroupedShape
from xgemm.core.problem import COL, ROW, Device, Operand
from xgemm.kernels import triton_grouped_sm90 as tg

triton = pytest.importorskip("triton")
from xgemm.runtime import gluon_cache  # noqa: E402


INTERPRETED = textwrap.dedent("""
    import itertools, torch, triton
    from xgemm.kernels import triton_grouped_sm90 as tg
    kernel, flat_kernel = tg._define()
    cases = 0
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8))
    torch.manual_seed(0)

    def launch(a, b, d, ends, t, m, n, k, e, ldbe, bk, programs=3):     # the loop over the groups (rows)
        split = 1 + cases % 2         # every other case stores its tiles in two column halves
        ldb = b.stride(-1) if bk else b.stride(-2)
        kernel[(programs,)](a, b, d, ends, t, m, n, k, e, a.stride(0), ldb, ldbe, d.stride(-2),
                            BM=16, BN=16, BK=16, GROUP_M=2, B_KMAJOR=bk, EPI_SPLIT=split)

    def bounds(sizes, t, ragged_k=False):   # each group's [row0, end) as the kernel clamps the offsets
        out, row0, offs = [], 0, torch.tensor(sizes).cumsum(0).tolist()
        for g, end in enumerate(offs):
            if ragged_k:                # from the previous offset (rows mode: from the previous group's end)
                row0 = min(offs[g - 1], t) if g else 0
            end = max(min(end, t), row0)
            out.append((row0, end))
            row0 = end
        return out

    SIZES = [[0, 1, 30, 17, 40], [50, 60], [16, 0, 0, 32], [20, -5, 30]]
    # rows mode: [T, K] (K-major) in row groups times [E, K, N] (N- or K-major); rows in no group are zeros
    for bk, sizes in itertools.product([False, True], SIZES):
        t, k, n, e = 104, 40, 24, len(sizes)
        ends = torch.tensor(sizes).cumsum(0).to(torch.int32)
        a = torch.randint(-2, 3, (t, k)).half()
        b = torch.randint(-2, 3, (e, k, n)).half()
        bb = b.transpose(1, 2).contiguous().transpose(1, 2) if bk else b
        d = torch.full((t, n), float("nan")).half()
        launch(a, bb, d, ends, t, t, n, k, e, bb.stride(0), bk)
        want = torch.zeros(t, n, dtype=torch.float64)
        for g, (r0, r1) in enumerate(bounds(sizes, t)):
            want[r0:r1] = a[r0:r1].double() @ b[g].double()
        assert torch.equal(d.double(), want), (sizes, bk)
        # the flattened kernel (rows mode), its group table poisoned
        d = torch.full((t, n), float("nan")).half()
        table = torch.full((3 * 3 * (e + 1),), -7, dtype=torch.int32)
        flat_kernel[(3,)](a, bb, d, ends, table, t, t, n, k, e, a.stride(0), bb.stride(-1) if bk else bb.stride(-2),
                        bb.stride(0), d.stride(0), BM=16, BN=16, BK=16, GROUP_M=2, B_KMAJOR=bk, RAGGED_K=False)
        assert torch.equal(d.double(), want), (sizes, bk, "flat")
        cases += 1
    # ragged_k: [M, T] (M-major) @ [T, N] (N-major) with T in groups -> [E, M, N]; empty groups are zeros
    for sizes in [[0, 33, 1, 47, 0], [100], [3, 200], [20, -5, 30]]:
        t, m, n, e = 104, 24, 40, len(sizes)
        ends = torch.tensor(sizes).cumsum(0).to(torch.int32)
        a = torch.randint(-2, 3, (m, t)).half()
        b = torch.randint(-2, 3, (t, n)).half()
        want = torch.stack([a[:, r0:r1].double() @ b[r0:r1].double() for r0, r1 in bounds(sizes, t, True)])
        # the flattened kernel: one loop over the k-steps of the program's tiles, 1 to 7 programs
        for programs in (1, 3, 7):
            d = torch.full((e, m, n), float("nan")).half()
            at = a.t().contiguous().t()
            flat_kernel[(programs,)](at, b, d, ends, None, t, m, n, t, e, at.stride(1), b.stride(0), m * n, n,
                                     BM=16, BN=16, BK=16, GROUP_M=2, B_KMAJOR=False, RAGGED_K=True)
            assert torch.equal(d.double(), want), (sizes, programs, "flat")
        cases += 1
    print(f"cases {cases}")
""")


def test_values_under_the_interpreter():
    assert "cases 12" in run_interpreted(INTERPRETED)


def _problem(t=16384, k=4096, n=7168, e=8, *, ragged_k=False, a_major=ROW, b_major=COL, dtype="bfloat16",
             out="bfloat16", alignment=16, arch=(9, 0)):
    if ragged_k:
        shape = GroupedShape(t, k, t, n, e, True, (e, k, n))
        a = Operand((k, t), (t, 1) if a_major == ROW else (1, k), dtype, a_major, alignment)
        b = Operand((t, n), (n, 1) if b_major == ROW else (1, t), dtype, b_major, 16)
    else:
        shape = GroupedShape(t, t, k, n, e, False, (t, n))
        a = Operand((t, k), (k, 1) if a_major == ROW else (1, t), dtype, a_major, alignment)
        b = Operand((e, k, n), (k * n, n, 1) if b_major == ROW else (k * n, 1, k), dtype, b_major, 16)
    return GroupedProblem(shape, a, b, out, "torch", Device("cuda", 0, arch))


def test_supports_declines_what_it_cannot_run(monkeypatch):
    monkeypatch.setattr(gluon_cache, "available", lambda key, arch=None: None)
    k = tg.KERNEL
    assert k.supports(_problem()) is None
    assert k.supports(_problem(ragged_k=True, a_major=COL, b_major=ROW)) is None
    assert k.supports(_problem(out="float32")) is None
    assert "CUDA" in k.supports(GroupedProblem(_problem().shape, _problem().a, _problem().b, "bfloat16", "torch",
                                               Device("cpu")))
    assert "sm_90" in k.supports(_problem(arch=(10, 0)))
    assert "float16 or both bfloat16" in k.supports(_problem(dtype="float32", out="float32"))
    assert "output dtype" in k.supports(_problem(out="float16"))
    assert "16-byte" in k.supports(_problem(alignment=8))
    assert "16-byte multiples" in k.supports(_problem(n=7164))
    assert "every dim" in k.supports(_problem(k=0))
    assert "every dim" in k.supports(_problem(e=0))       # no groups: an empty (or all-zero) result
    strided = _problem()
    strided = GroupedProblem(strided.shape, Operand((16384, 4096), (8192, 2), "bfloat16", "strided", 16), strided.b,
                             "bfloat16", "torch", strided.device)
    assert "K- or M/N-major" in k.supports(strided)
    # the grouped axis contiguous: rows mode A M-major; ragged_k A K-major or B K-major
    assert "contiguous in A" in k.supports(_problem(a_major=COL))
    assert "contiguous in A" in k.supports(_problem(ragged_k=True, a_major=ROW, b_major=ROW))
    assert "contiguous in B" in k.supports(_problem(ragged_k=True, a_major=COL, b_major=COL))


def test_policy_and_entries():
    keys = tg.gluon_entries("sm_90a")
    assert len(keys) == len(set(keys)) == 30 and not tg.gluon_entries("sm_100a")
    for p in (_problem(), _problem(n=512), _problem(out="float32"), _problem(ragged_k=True, a_major=COL, b_major=ROW),
              _problem(dtype="float16", out="float16", b_major=ROW)):
        pol = tg.KERNEL.policy(p)
        assert tg.KERNEL._config(p, pol).key in keys
    assert tg.KERNEL.policy(_problem()).tile == (128, 256, 64)
    # rows mode runs the flattened kernel up to MAX_FLAT_GROUPS groups (its search's reach), ragged_k never
    pol = tg.KERNEL.policy(_problem())
    assert pol.schedule == tg.FLAT_SCHEDULE and "fused" in pol.summary()
    assert tg.choose(_problem(e=tg.MAX_FLAT_GROUPS).shape, "bfloat16", "bfloat16", True).flat
    assert not tg.choose(_problem(e=tg.MAX_FLAT_GROUPS + 1).shape, "bfloat16", "bfloat16", True).flat
    rk = _problem(ragged_k=True, a_major=COL, b_major=ROW)         # ragged_k: flattened by hand, any E
    assert tg.KERNEL._config(rk, tg.KERNEL.policy(rk)).flat
    assert tg.choose(_problem(ragged_k=True, e=tg.MAX_FLAT_GROUPS + 1).shape, "bfloat16", "bfloat16", False).flat
    assert tg.KERNEL.policy(_problem(out="float32")).tile == (128, 128, 64)
    assert "no host read" in tg.KERNEL.policy(_problem()).summary()
    # the store buffer halves only where the whole one does not fit beside the operand stages
    wide = tg.Config("bfloat16", "bfloat16", *tg.TILES["wide"], True, False)
    assert tg.epilogue_split(wide) == 1 and tg.epilogue_split(wide._replace(stages=4)) == 2
    assert all(tg.Config.from_key(key).key == key for key in tg.tune_entries())
    # the grid: one program per SM, fewer for a problem of fewer tiles
    cfg = tg.KERNEL._config(_problem(), tg.KERNEL.policy(_problem()))
    assert tg.programs(_problem().shape, cfg, 132) == 132
    assert tg.programs(_problem(t=64, n=256, e=1).shape, cfg, 132) == 2       # 1 tile row, + 1 for the tail


if not gluon_cache.can_compile():
    pytest.skip(f"needs triton >= 3.8 (found {triton.__version__})", allow_module_level=True)

CFGS = [tg.Config("bfloat16", "bfloat16", *tg.TILES["wide"], True, False),
        tg.Config("float16", "float32", *tg.TILES["narrow"], True, False),
        tg.Config("bfloat16", "bfloat16", *tg.TILES["wide"], False, False, True),
        tg.Config("bfloat16", "bfloat16", *tg.TILES["wide"], False, True, True)]


@pytest.fixture(scope="module")
def built(gluon_cache_dir):
    return {cfg: (gluon_cache.compile_kernel(cfg.key)[0], gluon_cache.lookup(cfg.key)) for cfg in CFGS}


@pytest.mark.parametrize("cfg", CFGS[:2], ids=["bf16-rows-wide", "f16-f32-rows-narrow"])
def test_ptx_wgmma_fed_by_device_made_tma_descriptors(built, cfg):
    ptx = built[cfg][0].asm["ptx"]
    it = {"float16": "f16", "bfloat16": "bf16"}[cfg.in_dtype]
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{cfg.bn}k16\.f32\.{it}\.{it}", ptx)
    assert "cp.async.bulk.tensor.2d.shared::cta.global.mbarrier" in ptx       # TMA loads
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in ptx                # the TMA store
    assert "tensormap.replace" in ptx and "fence.proxy.tensormap" in ptx      # descriptors made on the device
    assert "wgmma.wait_group.sync.aligned 1;" in ptx                          # one wgmma group in flight
    assert ".local" not in ptx                                                # no spills
    meta = built[cfg][1].meta
    assert meta["num_warps"] == cfg.warps and meta["global_scratch_size"] > 0
    assert meta["shared"] <= 227 * 1024
    assert [p["name"] for p in meta["params"]][:13] == ["a_ptr", "b_ptr", "d_ptr", "ends_ptr", "T", "M", "N", "K", "E",
                                                        "lda", "ldb", "ldbe", "ldd"]


def test_cuda_lowering_launches_the_kernel_forward_and_backward(gluon_cache_dir):
    """jax's cuda lowering of ragged_dot and of its grad: three launches of the grouped cubins (the
    forward and dlhs, with rhs^T asked for column-major, a bitcast of rhs; drhs in ragged_k mode
    with lhs^T likewise), each after the cumsum of the sizes, and no XLA ragged dot left."""
    pytest.importorskip("jax")
    text = lower_ragged_dot_grad(forced=tg.NAME)     # the rows mode's default is the CuTe grouped class
    calls = [line for line in text.splitlines() if "xgemm_cubin_launch_v1" in line]
    assert len(calls) == 3 and all('kernel = "xgemm_grouped_flat_sm90"' in c for c in calls), calls
    assert not re.search(r"(chlo|stablehlo|mhlo)\.ragged", text)             # XLA's ragged dot is gone



def test_jax_explain_names_the_kernel_on_a_hopper_gpu(monkeypatch):
    """xgemm.explain of JAX arrays says what the jit lowering runs: the grouped kernel when the
    arrays live on a (here: pretended) Hopper GPU, XLA's ragged dot on the CPU."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import xgemm
    from xgemm.core import policy
    from xgemm.jax import grouped as jg
    monkeypatch.setattr(gluon_cache, "available", lambda key, arch=None: None)
    x, w = jnp.zeros((512, 256), jnp.bfloat16), jnp.zeros((4, 256, 384), jnp.bfloat16)
    gs = jnp.asarray([100, 0, 300, 112], jnp.int32)
    policy.clear_plans()
    assert "jax.lax.ragged_dot on cpu" in xgemm.explain(x, w, gs, op="ragged_dot")
    monkeypatch.setattr(jg, "_on_gpu", lambda x: True)
    try:
        text = jg.explain("ragged_dot", x, w, gs)
        with policy.force(tg.NAME):
            forced = jg.explain("ragged_dot", x, w, gs)
    finally:
        policy.clear_plans()
    assert "kernel: cute_gemm_sm90" in text and "inside jax.jit" in text, text
    assert "kernel: triton_grouped_sm90" in forced, forced


def test_ptx_of_the_flattened_kernel(built):
    """The flattened rows-mode cubin: one fused loop (the K loop's TMA loads and wgmmas, the
    epilogue's clipped 4-D store behind a branch), B through a 3-D descriptor, no spills."""
    cfg = CFGS[2]
    compiled, entry = built[cfg]
    ptx = compiled.asm["ptx"]
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16", ptx)
    assert "cp.async.bulk.tensor.2d.shared::cta.global.mbarrier" in ptx       # A
    assert "cp.async.bulk.tensor.3d.shared::cta.global.mbarrier" in ptx       # B [E, K, N]
    assert "cp.async.bulk.tensor.4d.global.shared::cta" in ptx                # the ragged store
    assert ".local" not in ptx
    assert "scf.if" in compiled.asm["ttgir"]          # the fused loop's epilogue branch
    assert [p["name"] for p in entry.meta["params"]][:5] == ["a_ptr", "b_ptr", "d_ptr", "ends_ptr", "table_ptr"]
    assert entry.meta["shared"] <= 227 * 1024


def test_ptx_of_the_flattened_weight_gradient(built):
    """ragged_k flattened by hand: A and B through ragged 4-D descriptors (zeros past the group),
    the result through a 3-D one, the loads pipelined (more than one copy of each in the PTX)."""
    compiled, entry = built[CFGS[3]]
    ptx = compiled.asm["ptx"]
    assert ptx.count("cp.async.bulk.tensor.4d.shared::cta.global.mbarrier") >= 4
    assert "cp.async.bulk.tensor.3d.global.shared::cta" in ptx
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16", ptx)
    assert ".local" not in ptx and entry.meta["shared"] <= 227 * 1024
