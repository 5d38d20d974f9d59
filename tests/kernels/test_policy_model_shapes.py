"""The policy's predicted fill on every product of benchmarks/model_shapes.py (issue 20), on CPU
tensors dressed as an H200 (tests/fake_cuda.py; the Gluon cubins taken as built).

The floor is on SM slots: the share of the slots over all waves (tiles, or split-K CTAs) that
hold work. The tile area outside the problem is not counted against a pick here: at M below the
tile (decode) no config recovers it, and those products are bound by streaming B, which needs the
SMs busy, not the tile full. explain() shows both (cute_gemm_sm90: "waves N% full (M% of SM slots
busy)"; gluon_splitk_sm90: "M% of SMs busy").

KNOWN_BELOW lists the products whose best pick today falls under the floor, with the fill it
predicts: split-K grids of the decode kernel that leave SMs idle at M <= 64, a batched product
of tiny tiles, and few output tiles over a long K on the CuTe kernel where a split that fills
the SMs was timed slower than one part-filled wave (its fixup costs ~15 k-steps;
cute_gemm_sm90_policy.SPLIT_FIXED). The list only shrinks: a product that reaches the floor must
leave it, and no other product may fall under the floor.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]

torch = pytest.importorskip("torch")

FLOOR = 0.84                 # 112 of 132 SMs: 7168 = 56 tiles of 128 in pairs
# (M, N, K, batch): predicted share of SM slots busy (2026-12-02; the CuTe long-K entries 2026-12-04)
KNOWN_BELOW = {
    (256, 64, 256, 32): 0.48,
    (64, 512, 32768, 1): 0.48,
    (1, 576, 7168, 1): 0.55, (8, 576, 7168, 1): 0.55, (64, 576, 7168, 1): 0.55,
    (64, 1536, 7168, 1): 0.73, (64, 1536, 24576, 1): 0.73,
    # 96 tiles of 128x64 (23.2 us) beat 128x192 split 4 on all 132 SMs (24.9 us), and 108 units
    # of 128x64 split 3 (300 TFLOP/s) beat 128x128 split 2 / 4 / 8 (189 / 246 / 203): gemm_tc.py
    # --sweep-set cutesplit, H200, 2026-12-04
    (512, 1536, 7168, 1): 0.73, (512, 576, 7168, 1): 0.82,
}


def _fill(plan, m: int, n: int, batch: int) -> float:
    """The pick's predicted share of SM slots busy, from the kernel's own model."""
    if plan.kernel_name == "cute_gemm_sm90":
        from xgemm.kernels import cute_gemm_sm90_policy as k90
        cfg = k90.Config.from_policy(plan.policy)
        if k90.swapped(plan.policy):
            m, n = n, m
        return k90.slot_fill(m, n, batch, cfg)
    if plan.kernel_name == "gluon_splitk_sm90":
        from xgemm.kernels import gluon_splitk_sm90 as gs
        return gs.sm_fill(m, n, gs.config_of(plan.policy, "bfloat16", "bfloat16", False))
    raise AssertionError(f"{plan.kernel_name} took a model-shape product: no fill model for it")


@pytest.fixture(scope="module")
def picks():
    import model_shapes
    from fake_cuda import Fake

    import xgemm
    from xgemm.runtime import gluon_cache
    saved = gluon_cache.available
    gluon_cache.available = lambda key, arch=None: None        # as after `xgemm build-cache`
    out = {}
    try:
        with Fake(keep=False):
            for rec in model_shapes.shapes():
                m, n, k, batch = rec["M"], rec["N"], rec["K"], rec["batch"]
                lead = () if batch == 1 else (batch,)
                dt = getattr(torch, rec["dtype"])
                plan = xgemm.explain(torch.empty(lead + (m, k), dtype=dt), torch.empty(lead + (k, n), dtype=dt))
                out[(m, n, k, batch, rec["dtype"])] = plan
    finally:
        gluon_cache.available = saved
    return out


def test_every_pick_meets_the_floor_or_is_a_known_gap(picks):
    below, recovered = [], []
    for (m, n, k, batch, dtype), plan in picks.items():
        fill = _fill(plan, m, n, batch)
        known = KNOWN_BELOW.get((m, n, k, batch))
        if fill < FLOOR and known is None:
            below.append(f"{m}x{n}x{k} batch {batch} {dtype}: {plan.kernel_name} {fill:.0%} ({plan.policy.notes})")
        if known is not None and fill >= FLOOR:
            recovered.append(f"{m}x{n}x{k} batch {batch}: now {fill:.0%}")
        if known is not None and fill < FLOOR:
            assert fill == pytest.approx(known, abs=0.005), (m, n, k, batch, fill)
    assert not below, "picks under the floor:\n" + "\n".join(below)
    assert not recovered, "these reach the floor now; take them off KNOWN_BELOW:\n" + "\n".join(recovered)


def test_explain_shows_the_predicted_fill(picks):
    for plan in picks.values():
        assert any("% of SM" in note for note in plan.policy.notes), plan.policy.notes


def test_single_m_tile_never_takes_a_2x1_cluster(picks):
    """A 2x1 cluster over one M tile leaves one CTA of every cluster idle (half the SMs)."""
    for (m, n, k, batch, _), plan in picks.items():
        if plan.kernel_name == "cute_gemm_sm90" and not any("D^T" in s for s in plan.policy.notes):
            if m <= plan.policy.tile[0]:
                assert plan.policy.cluster != (2, 1), (m, n, k, batch, plan.policy)
