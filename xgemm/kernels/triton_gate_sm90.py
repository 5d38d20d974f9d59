"""triton_gate_sm90: the gated activation's forward and backward as one pass each, written in Triton
and prebuilt to cubins like the Gluon kernels (registry op "gate", core/gate.py).

Contract
  op        forward  y[r, j] = act(h[r, j]) * h[r, H + j]                 h [R, 2H] -> y [R, H]
            backward dh[r, j] = dy[r, j] * h[r, H + j] * act'(h[r, j]),
                     dh[r, H + j] = dy[r, j] * act(h[r, j])               h, dy [R, H] -> dh [R, 2H]
            act: silu (swiglu), gelu (erf; geglu), relu (reglu), in float32 as core/epilogues
            writes them, one rounding to the output dtype.
  dtypes    h (and dy) float16 | bfloat16; out the same dtype.
  layout    h, dy, out row-major (the last dim contiguous), any row strides that are multiples
            of 8 elements; 16-byte aligned bases; H a multiple of 8 (16-byte vectors).
  arch      sm_90a cubins (xgemm/runtime/gluon_cache.py), launched without triton.
  status    validated on the H200 (tests/gpu/test_triton_gate_gpu.py; benchmarks/epilogue.py's
            swiglu_bwd). Reached by the composed gated path of torch fp16/bf16 operands: under
            autograd, a torch.compile trace, or where no fused kernel serves (compose.py).

Why
  Under autograd a gated product is composed: the product h, then the activation. Torch's ops
  take several passes over h and dy for the forward and the backward (silu, mul, their
  backwards, a cat); one pass each reads h (and dy) once and writes the result once.
"""
from __future__ import annotations

from collections import namedtuple
from typing import List, Optional

from xgemm.core.dtypes import LONG_DTYPE, SHORT_DTYPE
from xgemm.core.epilogues import GATED
from xgemm.core.problem import ROW, Policy
from xgemm.kernels._common import sm90_device_reason
from xgemm.runtime import gluon_cache, launch
from xgemm.runtime.gluon_cache import parse_key

NAME = "triton_gate_sm90"
DTYPES = ("float16", "bfloat16")
ACT_CODE = {"silu": 0, "gelu": 1, "relu": 2}
BLOCK_R, BLOCK_H, WARPS = 4, 512, 4            # 2048 columns of a row block a program: 16 a thread


class Config(namedtuple("Config", "dtype gated backward")):
    __slots__ = ()

    @property
    def key(self) -> str:
        return f"{NAME}/sm_90a-{SHORT_DTYPE[self.dtype]}/g{list(GATED).index(self.gated)}-b{int(self.backward)}"

    @classmethod
    def from_key(cls, key: str) -> "Config":
        (_, dt), f = parse_key(key, NAME)
        return cls(LONG_DTYPE[dt], list(GATED)[f["g"]], bool(f["b"]))


def _define():
    import triton
    import triton.language as tl

    @triton.jit
    def _act(g, ACT: tl.constexpr):
        if ACT == 0:
            return g / (1.0 + tl.exp(-g))
        elif ACT == 1:
            return 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
        else:
            return tl.maximum(g, 0.0)

    @triton.jit
    def _dact(g, ACT: tl.constexpr):
        if ACT == 0:
            s = 1.0 / (1.0 + tl.exp(-g))
            return s * (1.0 + g * (1.0 - s))
        elif ACT == 1:
            return (0.5 * (1.0 + tl.math.erf(g * 0.7071067811865476))
                    + g * 0.3989422804014327 * tl.exp(-0.5 * g * g))
        else:
            return tl.where(g > 0, 1.0, 0.0)

    @triton.jit
    def xgemm_gate(h_ptr, dy_ptr, out_ptr, R, H, ldh, ldd, ldo, ACT: tl.constexpr, BACKWARD: tl.constexpr,
                   BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
        blocks_h = tl.cdiv(H, BLOCK_H)         # a 1-D grid: row blocks x column blocks
        r = (tl.program_id(0) // blocks_h) * BLOCK_R + tl.arange(0, BLOCK_R)
        c = (tl.program_id(0) % blocks_h) * BLOCK_H + tl.arange(0, BLOCK_H)
        r64 = r.to(tl.int64)[:, None]
        mask = (r < R)[:, None] & (c < H)[None, :]
        g = tl.load(h_ptr + r64 * ldh + c[None, :], mask=mask, other=0.0).to(tl.float32)
        u = tl.load(h_ptr + r64 * ldh + (H + c)[None, :], mask=mask, other=0.0).to(tl.float32)
        dt = out_ptr.dtype.element_ty
        if BACKWARD:
            dy = tl.load(dy_ptr + r64 * ldd + c[None, :], mask=mask, other=0.0).to(tl.float32)
            tl.store(out_ptr + r64 * ldo + c[None, :], (dy * u * _dact(g, ACT)).to(dt), mask=mask)
            tl.store(out_ptr + r64 * ldo + (H + c)[None, :], (dy * _act(g, ACT)).to(dt), mask=mask)
        else:
            tl.store(out_ptr + r64 * ldo + c[None, :], (_act(g, ACT) * u).to(dt), mask=mask)

    # the kernel calls the helpers by their global names: the interpreter looks them up in this
    # module's globals, not in this function's scope
    globals().update(_act=_act, _dact=_dact)
    return xgemm_gate


def gluon_compile_args(key: str, arch: str):
    cfg = Config.from_key(key)
    if arch != "sm_90a":
        raise ValueError(f"{key} is built for sm_90a only, not {arch}")
    t = SHORT_DTYPE[cfg.dtype]
    sig = {"h_ptr": f"*{t}", "dy_ptr": f"*{t}", "out_ptr": f"*{t}", "R": "i32", "H": "i32", "ldh": "i64",
           "ldd": "i64", "ldo": "i64"}
    constexprs = {"ACT": ACT_CODE[GATED[cfg.gated]], "BACKWARD": cfg.backward, "BLOCK_R": BLOCK_R, "BLOCK_H": BLOCK_H}
    sig.update({k: "constexpr" for k in constexprs})
    # what supports() checks: 16-byte bases, H and the row strides multiples of 8 elements
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(3)}
    attrs.update({(i,): [["tt.divisibility", 8]] for i in (4, 5, 6, 7)})
    options = {"num_warps": WARPS, "num_stages": 1, "enable_fp_fusion": False}
    return _define(), sig, constexprs, attrs, options


def gluon_entries(arch: str = "sm_90a") -> List[str]:
    """sm_90a: {fp16, bf16} x {swiglu, geglu, reglu} x {forward, backward}: 12 entries."""
    if arch != "sm_90a":
        return []
    return [Config(dt, g, b).key for dt in DTYPES for g in GATED for b in (False, True)]


class TritonGateSm90:
    name = NAME
    ops = ("gate",)
    backend = "gluon"

    def supports(self, problem) -> Optional[str]:
        why = sm90_device_reason(problem.device)
        if why:
            return why
        h = problem.h
        if h.dtype not in DTYPES or problem.out_dtype != h.dtype:
            return f"h {h.dtype} -> {problem.out_dtype}: float16 or bfloat16, the result of h's dtype"
        rows, cols = h.shape
        if rows < 1 or rows >= 2 ** 31 or cols < 2 or cols % 16:
            return f"h {h.shape}: 1..2**31-1 rows of 2H columns, H a multiple of 8 (16-byte vectors)"
        if h.majorness != ROW or h.alignment < 16:
            return "16-byte vectors need h row-major, 16-byte aligned, its row stride a multiple of 16 bytes"
        return gluon_cache.available(Config(h.dtype, problem.gated, problem.backward).key)

    def policy(self, problem) -> Policy:
        return Policy(tile=(BLOCK_R, BLOCK_H), warps=WARPS,
                      notes=("one pass: h" + (" and dy read once, dh" if problem.backward else " read once, y")
                             + " written once",))

    def run(self, problem, policy, operands, out, stream) -> None:
        """operands: (h, dy or None) views (dy row-major like h); out: the result's view."""
        h, dy = operands
        entry = gluon_cache.lookup(Config(problem.h.dtype, problem.gated, problem.backward).key)
        launcher = launch.get_launcher(entry.cubin, entry.meta, h.device.index)
        rows, cols = problem.h.shape
        half = cols // 2
        ld = lambda v, width: v.strides[0] if rows > 1 else width      # noqa: E731
        grid = (-(-rows // BLOCK_R)) * (-(-half // BLOCK_H))
        launcher(grid, stream, h.ptr, dy.ptr if dy is not None else h.ptr, out.ptr, rows, half, ld(h, cols),
                 ld(dy, half) if dy is not None else 0, ld(out, out.shape[1]))

    def jax_lowering(self, problem, policy, *, portable: bool = False, sm_margin: int = 0):
        return None                 # JAX composes the gate with XLA's ops (xgemm/jax)

    def prebuild(self, arch: str):
        return gluon_entries(arch)


KERNEL = TritonGateSm90()
KERNELS = (KERNEL,)
