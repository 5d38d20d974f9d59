"""triton_gemv_sm90: D = alpha * A @ B for decode (M <= 16 rows: a token, or a batch of single-token
rows, times a weight), written in Triton; prebuilt to cubins like the Gluon kernels.

Contract
  op        out = alpha * A @ B, A (M, K), B (K, N), M <= 16; fp32 accumulate, one rounding. No
            beta/C, no batch.
  dtypes    A, B both float16 or both bfloat16; out float16 | bfloat16 (the inputs') | float32.
  layout    A ROW (K-major); B ROW (N-major, JAX's x @ W) or COL (K-major, torch's x @ W.T); out
            ROW. 16-byte aligned bases; N, K and the leading strides multiples of 8 elements (16-byte
            vector loads). Tails of M and of the last N / K block are masked loads and stores.
  arch      sm_90a cubins built by triton >= 3.8 (xgemm/runtime/gluon_cache.py), launched without
            triton (runtime/launch.py eagerly, ffi/ under jit).
  status    correct on the H200 (its GPU tests pass) but slower than cuBLAS there (0.52-0.69x with
            B row-major, 0.92x column-major, 2026-12-02): supports() declines unless
            XGEMM_DECODE=1, so gluon_splitk_sm90 keeps serving decode.

Why
  A decode product streams B once (1 x 8192 x 28672 bf16: 470 MB) past a few rows of A; its time
  is B's bytes over DRAM bandwidth. gluon_splitk_sm90 runs one CTA per SM with a 64-row wgmma tile,
  and its grid of 64- or 128-column tiles leaves a part-filled last wave (224 tiles on 132 SMs at
  N = 28672: 85% of the SM slots busy, test_policy_model_shapes.py). Here every CTA streams a
  narrow BN-column strip of B over all of K (no split, so no workspace and no second pass), and
  the grid is many small CTAs (N / 32 = 896 at N = 28672), several resident per SM, so the strips
  balance over the SMs and enough loads are in flight per SM.

Design
  One program per BN-column strip; a K loop of BK blocks: A's [16, BK] block (rows past M load
  zeros) and B's [BK, BN] block, tl.dot into a [16, BN] fp32 accumulator (mma.sync m16n8k16; the
  padded rows cost tensor-core time, which is free here), software-pipelined by triton over
  `stages` blocks (cp.async). Then alpha, one rounding and a masked store of the first M rows.
"""
from __future__ import annotations

import os
from collections import namedtuple
from typing import List, Optional

from xgemm.core.dtypes import LONG_DTYPE, SHORT_DTYPE
from xgemm.core.problem import COL, ROW, Policy
from xgemm.kernels._common import sm90_half_gemm_reason
from xgemm.kernels._pointer_gemm import H200_SMS, PointerGemm, b_leading_stride, sm_count
from xgemm.runtime import gluon_cache
from xgemm.runtime.calls import Param, triton_launch
from xgemm.runtime.gluon_cache import parse_key

NAME = "triton_gemv_sm90"
IN_DTYPES = ("float16", "bfloat16")
BM = 16                 # mma.sync's m16: rows past M are zeros
MAX_M = 16
WARPS = 4
ENABLE = "XGEMM_DECODE"


class Config(namedtuple("Config", "in_dtype out_dtype bn bk stages b_kmajor")):
    """One compiled variant: BN-column strips, BK-deep K blocks, `stages` blocks in flight."""
    __slots__ = ()

    @property
    def key(self) -> str:
        return (f"{NAME}/sm_90a-{SHORT_DTYPE[self.in_dtype]}-{SHORT_DTYPE[self.out_dtype]}/"
                f"n{self.bn}-k{self.bk}-s{self.stages}-b{int(self.b_kmajor)}")

    @classmethod
    def from_key(cls, key: str) -> "Config":
        (_, i, o), f = parse_key(key, NAME)
        return cls(LONG_DTYPE[i], LONG_DTYPE[o], f["n"], f["k"], f["s"], bool(f["b"]))

    def check(self) -> None:
        if self.bn not in (16, 32, 64) or self.bk not in (64, 128, 256) or not 2 <= self.stages <= 6:
            raise ValueError(f"{self}: bn in 16/32/64, bk in 64/128/256, 2..6 stages")


def choose(m: int, n: int, k: int, in_dtype: str, out_dtype: str, b_kmajor: bool, sms: int = H200_SMS) -> Config:
    """BN 32 while that gives at least 4 strips per SM, else 16; BK 256 for a long K (16 KB of B per
    block at BN 32), 64 for a short one. A first model, to be tuned on the H200 (issue 20)."""
    bn = 32 if -(-n // 32) >= 4 * sms else 16
    return Config(in_dtype, out_dtype, bn, 256 if k >= 1024 else 64, 4, b_kmajor)


def strips(n: int, cfg: Config) -> int:
    return -(-n // cfg.bn)


# ----------------------------------------------------------------------------------------------
# Triton source (imported only to compile, or to run under TRITON_INTERPRET in the CPU tests)
# ----------------------------------------------------------------------------------------------

def _define():
    import triton
    import triton.language as tl

    @triton.jit
    def xgemm_gemv_sm90(a_ptr, b_ptr, d_ptr, M, N, K, lda, ldb, ldd, alpha,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, B_KMAJOR: tl.constexpr):
        rn = tl.program_id(0) * BN + tl.arange(0, BN)
        rm = tl.arange(0, BM)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + rk
            a = tl.load(a_ptr + rm[:, None] * lda + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            b_mask = (kk[:, None] < K) & (rn[None, :] < N)
            if B_KMAJOR:
                b = tl.load(b_ptr + rn[None, :].to(tl.int64) * ldb + kk[:, None], mask=b_mask, other=0.0)
            else:
                b = tl.load(b_ptr + kk[:, None].to(tl.int64) * ldb + rn[None, :], mask=b_mask, other=0.0)
            acc = tl.dot(a, b, acc)
        d = (acc * alpha).to(d_ptr.dtype.element_ty)
        tl.store(d_ptr + rm[:, None] * ldd + rn[None, :], d, mask=(rm[:, None] < M) & (rn[None, :] < N))

    return xgemm_gemv_sm90


def gluon_compile_args(key: str, arch: str):
    cfg = Config.from_key(key)
    if arch != "sm_90a":
        raise ValueError(f"{key} is built for sm_90a only, not {arch}")
    cfg.check()
    it, ot = SHORT_DTYPE[cfg.in_dtype], SHORT_DTYPE[cfg.out_dtype]
    sig = {"a_ptr": f"*{it}", "b_ptr": f"*{it}", "d_ptr": f"*{ot}", "M": "i32", "N": "i32", "K": "i32",
           "lda": "i64", "ldb": "i64", "ldd": "i64", "alpha": "fp32"}
    constexprs = {"BM": BM, "BN": cfg.bn, "BK": cfg.bk, "B_KMAJOR": cfg.b_kmajor}
    sig.update({k: "constexpr" for k in constexprs})
    # 16-byte bases; N, K and the leading strides multiples of 8 elements: 16-byte vector loads (the
    # masks of the N and K tails must be constant over each 8-element vector)
    attrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]],
             (4,): [["tt.divisibility", 8]], (5,): [["tt.divisibility", 8]], (6,): [["tt.divisibility", 8]],
             (7,): [["tt.divisibility", 8]], (8,): [["tt.divisibility", 8]]}
    options = {"num_warps": WARPS, "num_stages": cfg.stages, "enable_fp_fusion": False}
    return _define(), sig, constexprs, attrs, options


def gluon_entries(arch: str = "sm_90a") -> List[str]:
    """sm_90a: {fp16, bf16} in x {same, fp32} out x B {N-major, K-major} x BN {16, 32} x BK {64, 256}
    (32 entries, every config choose() can pick); none for other archs."""
    if arch != "sm_90a":
        return []
    return [Config(i, o, bn, bk, 4, bk_major).key for i in IN_DTYPES for o in (i, "float32")
            for bk_major in (False, True) for bn in (16, 32) for bk in (64, 256)]


# ----------------------------------------------------------------------------------------------
# The kernel protocol (kernels/_common.py)
# ----------------------------------------------------------------------------------------------

class TritonGemvSm90(PointerGemm):
    name = NAME
    ops = ("gemm",)
    backend = "gluon"           # built and launched through the Gluon kernels' cubin cache

    def supports(self, problem) -> Optional[str]:
        if os.environ.get(ENABLE) != "1":
            return f"slower than cuBLAS on the H200 so far (issue 20); {ENABLE}=1 enables it"
        why = sm90_half_gemm_reason(problem)
        if why:
            return why
        a, b, ep = problem.a, problem.b, problem.epilogue
        if ep.reads_c:
            return "beta/C epilogue is not supported"
        if ep.out_majorness != ROW or ep.out_alignment < 16:
            return "writes a row-major, 16-byte aligned result only (out= is not)"
        m, n, k = problem.m, problem.n, problem.k
        if not 1 <= m <= MAX_M:
            return f"M = {m}: decode rows are 1..{MAX_M} (the tiled and split-K kernels serve more)"
        if min(n, k) < 1 or max(n, k) >= 2 ** 31:
            return f"shape {m}x{n}x{k} out of range"
        if a.majorness != ROW or b.majorness not in (ROW, COL):
            return "A must be ROW (K-major) and B ROW or COL"
        if n % 8 or k % 8 or a.alignment < 16 or b.alignment < 16:
            return "16-byte vector loads need N and K multiples of 8 and 16-byte aligned A and B"
        cfg = choose(m, n, k, a.dtype, ep.out_dtype, b.majorness == COL, sm_count(problem.device.index))
        return gluon_cache.available(cfg.key)

    def policy(self, problem) -> Policy:
        sms = sm_count(problem.device.index)
        cfg = choose(problem.m, problem.n, problem.k, problem.a.dtype, problem.epilogue.out_dtype,
                     problem.b.majorness == COL, sms)
        return Policy(tile=(BM, cfg.bn, cfg.bk), stages=cfg.stages, warps=WARPS,
                      notes=(f"{strips(problem.n, cfg)} strips of {cfg.bn} columns over all of K "
                             f"({strips(problem.n, cfg) / sms:.1f} per SM)",))

    def _config(self, problem, policy, out_dtype: str) -> Config:
        _, bn, bk = policy.tile
        return Config(problem.a.dtype, out_dtype, bn, bk, policy.stages, problem.b.majorness == COL)

    def _resolve(self, problem, policy, a, b, out):
        """(launcher, programs, the scalar args after the three pointers)."""
        cfg = self._config(problem, policy, out.dtype)
        launcher = self._launcher(cfg, a.device.index)
        lds = (a.strides[-2], b_leading_stride(b.strides, cfg.b_kmajor), out.strides[-2])
        return launcher, strips(problem.n, cfg), (problem.m, problem.n, problem.k, *lds,
                                                  float(problem.epilogue.alpha))

    def jax_lowering(self, problem, policy, *, portable: bool = False, sm_margin: int = 0):
        """The same cubin under jit, launched by xgemm/ffi's handler on XLA's stream."""
        cfg = self._config(problem, policy, problem.epilogue.out_dtype)
        entry = gluon_cache.lookup(cfg.key)
        P = Param
        m, n, k = problem.m, problem.n, problem.k
        args = (P.input(0), P.input(1), P.output(0), P.i32(m), P.i32(n), P.i32(k), P.i64(problem.a.strides[-2]),
                P.i64(b_leading_stride(problem.b.strides, cfg.b_kmajor)), P.i64(n), P.f32(float(problem.epilogue.alpha)))
        return triton_launch(entry.cubin, entry.meta, strips(n, cfg), args)

    def prebuild(self, arch: str):
        return gluon_entries(arch)


KERNEL = TritonGemvSm90()
KERNELS = (KERNEL,)
