"""What every kernel declares, and helpers the kernel files share.

A kernel is an object listed in its module's KERNELS tuple (the registry, core/registry.py,
names the module). It declares, in its own file:
    name: str                      as force()/XGEMM_KERNEL/explain() spell it
    ops: Tuple[str, ...]           the ops it serves ("gemm", "softmax")
    backend: str                   "cute" | "gluon" | "host": which cache prebuilds its classes
    supports(problem) -> None | str          None accepts; a string is the reason it declines
    policy(problem) -> Policy                tile/stages/cluster/... for this problem
    run(problem, policy, operands, out, stream) -> None
    jax_lowering(problem, policy, *, portable=False, sm_margin=0)
        -> runtime.calls.Launch | runtime.calls.TvmFfiCall | None
        what jax.jit runs for the problem (jax/lowering.py emits it as an XLA custom call); None
        runs XLA's own op. `portable` (jax.export): a process-local TVM-FFI handle must not be
        returned. `sm_margin`: SMs a persistent grid leaves free for a collective beside it.
        The buffers it names are XLA's dense arrays, see xla_views().
    prebuild(arch) -> list                   its classes to build ahead of time: (key, build)
        pairs for a CuTe kernel (runtime/cute_cache.py), entry keys for a Gluon one
        (runtime/gluon_cache.py), [] for the host default
and optionally
    bind(problem, policy, operands, out) -> go | None
        run() resolved for one signature, for the torch fast path's repeat calls.
Kernels import nothing from xgemm.torch or xgemm.jax: those wings call these hooks.
"""
from __future__ import annotations

from typing import Optional, Tuple

from xgemm.arrays.views import ArrayView
from xgemm.core import layout
from xgemm.core.dtypes import ITEMSIZE
from xgemm.core.problem import ROW, GemmProblem, Operand
from xgemm.runtime.calls import Arg

HOOKS = ("name", "ops", "backend", "supports", "policy", "run", "jax_lowering", "prebuild")


def sm90_device_reason(dev) -> Optional[str]:
    """None on a CUDA sm_90 device, else why a Hopper kernel declines."""
    if dev.kind != "cuda":
        return "needs a CUDA device"
    if dev.arch != (9, 0):
        return f"needs a Hopper GPU (sm_90); this device is {dev.arch}"
    return None


def sm90_half_gemm_reason(problem: GemmProblem) -> Optional[str]:
    """What every Hopper fp16/bf16 GEMM kernel without batches checks first: a CUDA sm_90 device,
    no batch dims, A and B both float16 or both bfloat16, a result of their dtype or float32.
    None when all hold (the kernel then checks its own limits), else the reason it declines."""
    why = sm90_device_reason(problem.device)
    if why:
        return why
    if problem.batch:
        return "batched problems are not supported"
    a, b = problem.a, problem.b
    if a.dtype not in ("float16", "bfloat16") or b.dtype != a.dtype:
        return f"A/B dtypes {a.dtype}/{b.dtype}: needs both float16 or both bfloat16"
    if problem.epilogue.out_dtype not in (a.dtype, "float32"):
        return f"output dtype {problem.epilogue.out_dtype} is not {a.dtype} or float32"
    return None




def xla_views(problem: GemmProblem) -> Tuple[ArrayView, ArrayView, Optional[ArrayView], ArrayView]:
    """ArrayViews (no data) of a, b, c, d as the native handler describes XLA's buffers inside jit:
    dense (L,)rows x cols arrays at 16-byte (or better) aligned bases."""
    ep = problem.epilogue

    def view(op: Operand) -> ArrayView:
        return ArrayView(None, "jax", problem.device, 0, tuple(op.shape), tuple(op.strides), op.dtype,
                         ITEMSIZE[op.dtype], False)
    c = view(problem.c) if problem.c is not None and ep.reads_c else None
    out_shape = problem.a.shape[:-2] + (problem.m, problem.n)
    out = view(layout.dense_operand(out_shape, ep.out_dtype, ITEMSIZE[ep.out_dtype], ROW))
    return view(problem.a), view(problem.b), c, out


def xla_tensors(c) -> Tuple[Arg, ...]:
    """The TVM-FFI tensor arguments (a, b, d[, c]) of XLA's buffers (inputs a, b[, c]; output d)."""
    tensors = (Arg.tensor("in", 0), Arg.tensor("in", 1), Arg.tensor("out", 0))
    return tensors + ((Arg.tensor("in", 2),) if c is not None else ())
