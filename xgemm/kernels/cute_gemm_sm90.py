"""Hopper tensor-core GEMM (CuTe-DSL): D[l] = act(alpha * A[l] @ B[l] + beta * C[l] + bias).

Contract
  dtypes      A, B: float16 or bfloat16 (the same); accumulate float32; D: float16 | bfloat16 |
              float32; C (read only when beta != 0): float16 | bfloat16 | float32. Classes with FP8
              A and B (float8_e4m3fn | float8_e5m2, K-major: wgmma's only FP8 layout), with
              per-row / per-column float32 scales in the epilogue (Epi), their sums kept in the
              wgmma accumulator (xgemm.scaled_matmul(use_fast_accum=True)) or each 128-deep
              k-tile's sum promoted into float32 registers (its default call); block-wise scales
              (A 1x128, B 128x128) multiply each k-tile's sum as it is promoted (Epi.block).
  majorness   every combination: A row (K-major) or col (M-major), B row (N-major) or col
              (K-major), C and D row (N-major) or col (M-major). No operand is copied.
  alignment   TMA: every base address and every non-unit stride (the leading one and the batch
              one) a multiple of 16 bytes; ragged M, N, K need nothing else (TMA zero-fills loads
              out of bounds and clips stores).
  arch        sm_90a (wgmma + TMA + clusters); declines every other device.
  epilogue    optional, as compile-time classes (Epi): a bias vector added along N (or along M,
              for the transposed run, where the problem's N is the kernel's M), any dtype, read
              element by element (any alignment), the same for every batch; then an activation
              of core/epilogues.ACTIVATIONS, in float32 before the one rounding to D's dtype.
  limits      M, N, K >= 1; batch dims collapse into one stride (L). An operand that is the
              same for every batch (batch stride 0, e.g. weights) crosses as one 2-D matrix and
              gets a stride-0 batch mode in the kernel, so TMA never sees a zero stride.
Design: cute_gemm_sm90_build.py (the compiled classes; that file alone names their disk cache).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Tuple

from xgemm.core import fp8_checks
from xgemm.core.fp8_checks import PROMOTE_NOTE
from xgemm.core.epilogues import ACTIVATIONS, GATED
from xgemm.core.layout import unit_stride_dim
from xgemm.core.problem import COL, ROW, Policy
from xgemm.kernels._common import sm90_device_reason, xla_tensors, xla_views
# The compiled classes live in their own module, which alone names their disk cache; the policy in
# another: an edit here or there keeps every compiled class
from xgemm.kernels.cute_gemm_sm90_build import (  # noqa: F401 -- compile-class machinery under this kernel's name
    _AB_DTYPES, _FP8_DTYPES, _ITEMSIZE, _OUT_DTYPES, GROUPED_MARK, NAME, RAGGED_BIG, Epi, build, build_for_key,
    class_key, compiled, compiled_eager, max_clusters, workspace_sizes)
from xgemm.kernels.cute_gemm_sm90_policy import (
    GATE_HALF_STEP, GATED_GROUPED_CONFIGS, GROUPED_CONFIGS, POLICY_TABLE, SWAP_ROWS, Config, choose_fp8_promoted_policy,
    choose_gated_grouped_config, choose_gated_policy, choose_grouped_config, choose_policy, gate_half_fits, grouped_fill,
    swapped, unsplit)
from xgemm.kernels.cute_gemm_sm90_policy import (  # noqa: F401 -- the policy's model under this kernel's name too
    MAX_SPLIT, ROW_MARGIN, SWAP_MIN_K, SWAP_NOTE, WAVE_MARGIN, choose_config, row_of, slot_fill, wave_efficiency)
from xgemm.runtime import cute_cache, workspace
from xgemm.runtime.calls import Arg, TvmFfiCall
from xgemm.runtime.driver import sm_count
from xgemm.runtime.roles import OUT, A, B, C


def transposed(v):
    """The ArrayView of v's transpose (its last two dims exchanged); v.obj stays v's own array."""
    return dataclasses.replace(v, shape=(*v.shape[:-2], v.shape[-1], v.shape[-2]),
                               strides=(*v.strides[:-2], v.strides[-1], v.strides[-2]))


# ----------------------------------------------------------------------------------------------
# Host side: the kernel protocol
# ----------------------------------------------------------------------------------------------
def _own_batch(shape, strides) -> bool:
    """Does this (..., rows, cols) operand differ across the batch (a nonzero batch stride)?"""
    return any(d > 1 and s != 0 for d, s in zip(shape[:-2], strides[:-2]))


def _tma_why(shape, strides, itemsize, ptr=0) -> Optional[str]:
    """None if TMA can describe the view as the kernel will see it, else why not."""
    if ptr % 16:
        return "base address is not 16-byte aligned"
    major = unit_stride_dim(shape, strides)
    if major is None:
        return "neither of the last two dims is contiguous"
    lead = strides[-2] if major == ROW else strides[-1]
    if (lead * itemsize) % 16:
        return f"leading stride {lead} is not a multiple of 16 bytes"
    if _own_batch(shape, strides):
        dims = [(d, st) for d, st in zip(shape[:-2], strides[:-2]) if d > 1]
        if len(dims) > 1 and any(s0 != s1 * d1 for (_, s0), (d1, s1) in zip(dims, dims[1:])):
            return "batch dims do not collapse into one stride"
        if any(st == 0 for _, st in dims) or (dims[-1][1] * itemsize) % 16:
            return f"batch stride {dims[-1][1]} is not a nonzero multiple of 16 bytes"
    return None


def _as_kernel_arg(v, L: int, rows: int, cols: int):
    """The framework array as the kernel takes it: (L, rows, cols) when it has its own batch,
    else (rows, cols) (one matrix for every batch). Views, never copies."""
    x = v.obj
    nd = len(v.shape)
    if L > 1 and _own_batch(v.shape, v.strides):
        return x if nd == 3 else x.reshape(L, rows, cols)
    if nd == 2:
        return x
    return x[(0,) * (nd - 2)]


def _block_scales(problem) -> bool:
    """Are the problem's FP8 scales block-wise (scale_a (M, K/128), scale_b (K/128, N/128))?"""
    return problem.scales is not None and len(problem.scales[0].shape) == 2


def _sm_count(device_index: int) -> int:
    return sm_count(device_index)


def _lowering_sms(problem, sm_margin: int) -> int:
    """The SMs a class lowered for jit is compiled for: the device's, or the H200's when lowering
    without a GPU, less the sm_margin the persistent grid leaves free."""
    try:
        sms = _sm_count(problem.device.index)
    except Exception:                 # cross-lowering without a GPU: the H200's count
        sms = H200_SMS
    return max(sms - sm_margin, 1)


class _Sm90Kernel:
    name = NAME
    ops = ("gemm",)
    backend = "cute"
    fuses_epilogue = True            # bias / activation as Epi classes (policy.choose asks)

    def _fused_why(self, problem) -> Optional[str]:
        """None when the fused epilogue of a problem has a class here (checked after the rest)."""
        if _block_scales(problem):
            # TMA-loaded with each k-tile: the layouts of fp8_checks.kernel_block_scales
            wants = fp8_checks.kernel_block_scales(problem.m, problem.k, problem.n)
            for name, scale, want, major in zip(("scale_a", "scale_b"), problem.scales, wants, ("M", "row")):
                if scale.dtype != "float32" or not fp8_checks.in_kernel_block_layout(
                        scale.shape, scale.strides, want, scale.alignment >= 16):
                    return (f"{name} (shape {scale.shape}, strides {scale.strides}, {scale.dtype}) is not a "
                            f"16-byte aligned {major}-major float32 {want[0]} with its stride a multiple of 4")
        else:
            for name, vec, extent in zip(("scale_a", "scale_b"), problem.scales or (), (problem.m, problem.n)):
                # a scale per row of A / column of B, or one for all (tensor-wise: the kernel clamps
                # its indices to the vector's last)
                if vec.dtype != "float32" or vec.shape not in ((extent,), (1,)) or (vec.shape[0] > 1 and vec.strides != (1,)):
                    return f"{name} (shape {vec.shape}, {vec.dtype}) is not a contiguous float32 vector of {extent} or 1"
        gated = problem.epilogue.activation in GATED
        width = 2 * problem.n if gated else problem.n          # a gated bias covers [gate | up]
        bias = problem.bias
        if bias is not None:
            if bias.dtype not in ("float16", "bfloat16", "float32"):
                return f"bias dtype {bias.dtype} is not float16/bfloat16/float32"
            if bias.shape != (width,) or (width > 1 and bias.strides != (1,)):
                return f"bias (shape {bias.shape}, strides {bias.strides}) is not a contiguous vector of {width}"
        if problem.epilogue.activation not in (None,) + ACTIVATIONS + tuple(GATED):
            return f"activation {problem.epilogue.activation!r} has no class"
        if gated:
            ep, half = problem.epilogue, Config.from_policy(self.policy(problem)).tile_n // 2
            if problem.batch or ep.reads_c or ep.alpha != 1.0 or problem.b.shape[-1] != 2 * problem.n:
                return "a gated class takes an unbatched [gate | up] B, no C and no alpha"
            if half % GATE_HALF_STEP:
                # TMA loads each half in 128-byte swizzled rows (cute_gemm_sm90_policy.GATE_HALF_STEP)
                return f"the tile's gate half is {half} columns; a gated class needs a multiple of {GATE_HALF_STEP}"
            if problem.n % half:
                return f"H = {problem.n} is not a multiple of the tile's {half} gate columns"
        return None

    def epi(self, problem, policy: Policy) -> Optional[Epi]:
        """The Epi class of a fused problem (in the transposed run the bias runs along the kernel's
        M and the two scale vectors trade places)."""
        if not problem.fused:
            return None
        bias, scaled, act = problem.bias, problem.scales is not None, problem.epilogue.activation
        return Epi(("m" if swapped(policy) else "n") if bias is not None else None,
                   bias.dtype if bias is not None else None, GATED.get(act, act), scaled, scaled, act in GATED,
                   promote=scaled and PROMOTE_NOTE in policy.notes, block=_block_scales(problem))

    def supports(self, problem) -> Optional[str]:
        dev = problem.device
        if dev.kind != "cuda":
            return "needs a CUDA device"
        if dev.arch is None or tuple(dev.arch) != (9, 0):
            return "needs sm_90 (Hopper: wgmma + TMA)" + (
                f"; device is sm_{dev.arch[0]}{dev.arch[1]}" if dev.arch else "")
        fp8 = problem.scales is not None
        if fp8:
            if problem.a.dtype not in _FP8_DTYPES or problem.b.dtype != problem.a.dtype:
                return f"FP8 A/B must both be float8_e4m3fn or both float8_e5m2 (got {problem.a.dtype}, {problem.b.dtype})"
            if problem.a.majorness != ROW or problem.b.majorness != COL or problem.batch:
                return "FP8 wgmma reads K-major operands only: A row-major, B column-major, unbatched"
        elif problem.a.dtype not in _AB_DTYPES or problem.b.dtype != problem.a.dtype:
            return f"A/B must both be float16 or bfloat16 (got {problem.a.dtype}, {problem.b.dtype})"
        ep = problem.epilogue
        if ep.out_dtype not in _OUT_DTYPES:
            return f"output dtype {ep.out_dtype} is not float16/bfloat16/float32"
        if min(problem.m, problem.n, problem.k) < 1:
            return "empty problem (M, N or K is 0)"
        if problem.n * _ITEMSIZE[ep.out_dtype] % 16:
            # the API allocates D row-major; TMA needs its row stride in 16-byte units
            return f"N={problem.n}: D's row stride is not a multiple of 16 bytes (TMA)"
        if ep.out_alignment < 16:
            return "D (out=) is not 16-byte aligned (TMA needs 16-byte base and strides)"
        ops = [("A", problem.a), ("B", problem.b)]
        if ep.reads_c and problem.c is not None:
            if problem.c.dtype not in _OUT_DTYPES:
                return f"C dtype {problem.c.dtype} is not float16/bfloat16/float32"
            ops.append(("C", problem.c))
        for label, op in ops:
            if op.alignment < 16:
                return f"{label} is not 16-byte aligned (TMA needs 16-byte base and strides)"
            why = _tma_why(op.shape, op.strides, _ITEMSIZE[op.dtype])
            if why:
                return f"{label}: {why}"
        return self._fused_why(problem) if problem.fused else None

    def policy(self, problem) -> Policy:
        if problem.epilogue.activation in GATED:
            policy = choose_gated_policy(problem.m, problem.n, problem.k, problem.batch_count)
        elif problem.scales is not None and (problem.float32_accumulation or _block_scales(problem)):
            # block scales multiply each k-tile's sum as it is promoted, whatever accumulation is asked
            policy = choose_fp8_promoted_policy(problem.m, problem.n, problem.k, problem.batch_count)
        else:
            policy = choose_policy(problem.m, problem.n, problem.k, problem.batch_count,
                                   problem.a.majorness, problem.b.majorness)
        # the split-K classes serve the plain product (cute_gemm_sm90_build.Sm90Gemm): the gated and
        # promoting policies start from its row, which may split (128x128x8192 did, 2026-12-05)
        return unsplit(policy) if problem.fused or problem.epilogue.reads_c else policy

    def spec(self, problem, policy: Policy, operands, out, arch: str, sm_count: int) -> Tuple:
        """The compile class (build()'s arguments) a run of these operands needs (for a swapped
        policy: that of the transposed views the kernel gets)."""
        a, b, c = operands
        use_c = problem.epilogue.reads_c and c is not None
        if swapped(policy):
            a, b, c, out = transposed(b), transposed(a), transposed(c) if use_c else None, transposed(out)
        L = problem.batch_count
        own = [L > 1 and _own_batch(v.shape, v.strides) for v in (a, b)]
        batched = (own[0], own[1], L > 1, use_c and L > 1 and _own_batch(c.shape, c.strides))
        cfg = Config.from_policy(policy)
        return (cfg, a.dtype, out.dtype, unit_stride_dim(a.shape, a.strides), unit_stride_dim(b.shape, b.strides),
                unit_stride_dim(out.shape, out.strides),
                (c.dtype, unit_stride_dim(c.shape, c.strides)) if use_c else None,
                problem.epilogue.alpha == 1.0, batched, max_clusters(sm_count, cfg), arch)

    def _split_buffers(self, problem, policy: Policy, fn, stream):
        """(workspace, flags) for a split-K run on this stream, or None where the run goes unsplit:
        the buffers cannot be had (runtime/workspace.py), or the class came through the tvm_ffi
        package, which takes framework arrays only."""
        if not hasattr(fn, "prepare"):
            return None
        cfg = Config.from_policy(policy)
        m, n = (problem.n, problem.m) if swapped(policy) else (problem.m, problem.n)
        elems, flags = workspace_sizes(cfg, m, n, problem.batch_count)
        return workspace.split_k(problem.device, stream, elems, flags)

    def run(self, problem, policy: Policy, operands, out, stream) -> None:
        fn, use_c, views = self._resolve(problem, policy, operands, out)
        split = None
        if Config.from_policy(policy).split > 1:
            split = self._split_buffers(problem, policy, fn, stream)
            if split is None:
                policy = unsplit(policy)
                fn, use_c, views = self._resolve(problem, policy, operands, out)
        ep = problem.epilogue
        L = problem.batch_count
        args = [_as_kernel_arg(v, L, r, cc) for v, r, cc in views]
        if swapped(policy):
            args = [x.swapaxes(-2, -1) for x in args]
        if split is not None:            # a split-K class: f(a, b, d, workspace, flags, alpha, stream)
            fn(*args[:3], *split, float(ep.alpha), stream)
        elif problem.fused:                # an Epi class: f(a, b, d, c, bias, scale_m, scale_n, alpha, beta, stream)
            bias, scale_m, scale_n = (v.obj if v is not None else None for v in operands[3:6])
            if swapped(policy):
                scale_m, scale_n = scale_n, scale_m
            fn(*args[:3], args[3] if use_c else None, bias, scale_m, scale_n, float(ep.alpha), float(ep.beta), stream)
        elif use_c:
            fn(*args, float(ep.alpha), float(ep.beta), stream)
        else:
            fn(*args, float(ep.alpha), stream)

    def bind(self, problem, policy: Policy, operands, out):
        """run() resolved for this exact signature (shapes, strides, dtypes, 16-byte classes):
        go(a, b, c, d, stream) on the framework arrays makes the same TVM-FFI call run() makes
        for views of them. None unless every operand crosses as itself (2-D, unbatched), and for a
        fused epilogue (run() serves it)."""
        if problem.fused or Config.from_policy(policy).split > 1:
            return None                  # run() serves these per call (split-K: its buffers per stream)
        fn, use_c, views = self._resolve(problem, policy, operands, out)
        if problem.batch_count != 1 or any(len(v.shape) != 2 for v, _, _ in views):
            return None
        alpha, beta = float(problem.epilogue.alpha), float(problem.epilogue.beta)
        swap = swapped(policy)
        if hasattr(fn, "prepare"):       # ctypes: marshalled once, data pointers + stream per call
            roles = ((B, A, OUT) if swap else (A, B, OUT)) + ((C,) if use_c else ())
            return fn.prepare(*[transposed(v) if swap else v for v, _, _ in views], alpha,
                              *((beta,) if use_c else ()), 0).go(roles)
        if swap:
            return None                  # run() per call: it transposes the framework arrays
        if use_c:
            def go(a, b, c, d, stream):
                fn(a, b, d, c, alpha, beta, stream)
        else:
            def go(a, b, c, d, stream):
                fn(a, b, d, alpha, stream)
        return go

    def _resolve(self, problem, policy: Policy, operands, out):
        """(compiled function, whether C is read, [(view, rows, cols)] in argument order: the
        untransposed views, which a swapped run transposes)."""
        a, b, c = operands[:3]
        use_c = problem.epilogue.reads_c and c is not None
        m, n, k = problem.m, problem.n, problem.k
        views = [(a, m, k), (b, k, n), (out, m, n)] + ([(c, m, n)] if use_c else [])
        for v, _, _ in views:
            why = _tma_why(v.shape, v.strides, v.itemsize, v.ptr)
            if why:
                raise ValueError(f"{NAME}: operand {v.shape} strides {v.strides}: {why}")
        fn = compiled_eager(*self.spec(problem, policy, operands[:3], out, cute_cache.arch_for(problem.device),
                                       _sm_count(problem.device.index)), epi=self.epi(problem, policy))
        if swapped(policy):              # the kernel's A, B are the transposes of B, A
            views = [views[1], views[0], *views[2:]]
        return fn, use_c, views


    def jax_lowering(self, problem, policy: Policy, *, portable: bool = False, sm_margin: int = 0):
        """The compiled function, called as run() calls it, on XLA's (L,)rows x cols buffers (already
        the arrays _as_kernel_arg makes). sm_margin: SMs the persistent grid leaves free (the class
        is compiled for that many fewer)."""
        if portable:                      # its TVM-FFI handle is process-local
            return None
        a, b, c, out = xla_views(problem)
        spec = self.spec(problem, policy, (a, b, c), out, cute_cache.arch_for(problem.device),
                         _lowering_sms(problem, sm_margin))
        ep = problem.epilogue
        if problem.fused:
            # inputs a, b[, c][, bias][, scale_m, scale_n] in that order; the transposed run's fused
            # classes serve eager calls only
            if swapped(policy):
                return None
            fn = compiled(*spec, epi=self.epi(problem, policy))
            fused, i = [], 2
            for present in (c is not None, problem.bias is not None, problem.scales is not None,
                            problem.scales is not None):
                fused.append(Arg.tensor("in", i) if present else Arg.none())
                i += present
            return TvmFfiCall(fn, (Arg.tensor("in", 0), Arg.tensor("in", 1), Arg.tensor("out", 0), *fused,
                                   Arg.f64(ep.alpha), Arg.f64(ep.beta), Arg.stream()))
        fn = compiled(*spec)
        scalars = (Arg.f64(ep.alpha), Arg.f64(ep.beta)) if c is not None else (Arg.f64(ep.alpha),)
        if swapped(policy):       # D^T = B^T @ A^T (+ C^T): transposed views of the same buffers
            def t(role, i, v):
                v = transposed(v)
                return Arg.tensor(role, i, v.shape, v.strides)
            tensors = (t("in", 1, b), t("in", 0, a), t("out", 0, out)) + ((t("in", 2, c),) if c is not None else ())
        else:
            tensors = xla_tensors(c)
        cfg = Config.from_policy(policy)
        if cfg.split > 1:         # split-K (no C): its workspace is XLA scratch, its flags zeros after a, b
            m, n = (problem.n, problem.m) if swapped(policy) else (problem.m, problem.n)
            elems, flags = workspace_sizes(cfg, m, n, problem.batch_count)
            return TvmFfiCall(fn, tensors + (Arg.tensor("scratch", 0), Arg.tensor("in", 2)) + scalars + (Arg.stream(),),
                              scratch_bytes=(4 * elems,), zeroed=(flags,))
        return TvmFfiCall(fn, tensors + scalars + (Arg.stream(),))

    def prebuild(self, arch: str):
        return prebuild_classes(arch) + GROUPED.prebuild(arch)     # the module's classes (registry.of_backend)


class _Sm90Grouped:
    """The grouped class (the rows mode of xgemm.grouped_mm / ragged_dot; cute_gemm_sm90_build's
    Design): A [T, K] K-major in row groups, B [E, K, N] N- or K-major, D [T, N] row-major, `ends`
    the groups' end rows (int32, on the device, never read on the host); rows past the last group
    are zeros. Sizes, ends past T and decreasing ends as kernels/triton_grouped_sm90.py's contract.
    An activation, or a gate over each group's [gate | up] columns (D then N / 2 wide), is fused into
    the epilogue (problem.activation, Epi); the rows past the last group are act(0)."""
    name = NAME
    ops = ("grouped",)
    backend = "cute"
    fuses_epilogue = True             # problem.activation (policy.choose asks)

    def supports(self, problem) -> Optional[str]:
        why = sm90_device_reason(problem.device)
        if why:
            return why
        a, b, s = problem.a, problem.b, problem.shape
        if s.ragged_k:
            return "the variable-K product (ragged_k) has no class here"
        if a.dtype not in _AB_DTYPES or b.dtype != a.dtype:
            return f"A/B must both be float16 or bfloat16 (got {a.dtype}, {b.dtype})"
        if problem.out_dtype not in (a.dtype, "float32"):
            return f"output dtype {problem.out_dtype} is not {a.dtype} or float32"
        if min(s.rows, s.n, s.k, s.groups) < 1 or s.rows > RAGGED_BIG:
            return f"T={s.rows}, N={s.n}, K={s.k}, E={s.groups}: each >= 1, T <= 2**30 (the ragged store's rows)"
        if a.majorness != ROW:
            return "A must be K-major (row-major): a group starts at any row, a TMA box on a 16-byte boundary"
        gated = problem.activation in GATED
        width = s.n // 2 if gated else s.n
        if width * _ITEMSIZE[problem.out_dtype] % 16:
            return f"N={width}: D's row stride is not a multiple of 16 bytes (TMA)"
        for label, op in (("A", a), ("B", b)):
            why = "not 16-byte aligned" if op.alignment < 16 else _tma_why(op.shape, op.strides, _ITEMSIZE[op.dtype])
            if why:
                return f"{label}: {why} (TMA needs 16-byte base and strides)"
        if problem.activation not in (None,) + ACTIVATIONS + tuple(GATED):
            return f"activation {problem.activation!r} has no class"
        if gated and not gate_half_fits(width, choose_gated_grouped_config(width).tile_n):
            return (f"H = {width} (the gate half of B's {s.n} columns) is not a multiple of {GATE_HALF_STEP}: no tile's "
                    f"gate half divides it")
        return None

    def policy(self, problem) -> Policy:
        s = problem.shape
        if problem.activation in GATED:
            cfg = choose_gated_grouped_config(s.n // 2)
            return cfg.policy(f"grouped, gated: tile_n {cfg.tile_n}, its gate half {cfg.tile_n // 2} columns dividing "
                              f"H = {s.n // 2}; tiles {100 * grouped_fill(s.rows, s.n, s.groups, cfg):.0f}% full at "
                              f"the mean group size; each tile's group found on the device")
        cfg = choose_grouped_config(s.rows, s.n, s.groups)
        return cfg.policy(f"grouped: tiles {100 * grouped_fill(s.rows, s.n, s.groups, cfg):.0f}% full at the "
                          f"mean group size; each tile's group found on the device")

    def _compiled(self, problem, policy: Policy, sms: int, eager: bool):
        cfg = Config.from_policy(policy)
        spec = (cfg, problem.a.dtype, problem.out_dtype, ROW, problem.b.majorness, ROW, None, True,
                (False, True, False, False), max_clusters(sms, cfg), cute_cache.arch_for(problem.device))
        return (compiled_eager if eager else compiled)(*spec, epi=grouped_epi(problem.activation), grouped=True)

    def run(self, problem, policy: Policy, operands, out, stream) -> None:
        """operands: (A, B, ends) views (ends int32, contiguous); out: D's view."""
        a, b, ends = operands
        fn = self._compiled(problem, policy, _sm_count(problem.device.index), eager=True)
        fn(a.obj, b.obj, out.obj, ends.obj, stream)

    def bind(self, problem, policy: Policy, operands, out):
        return None                       # run() serves every call

    def jax_lowering(self, problem, policy: Policy, *, portable: bool = False, sm_margin: int = 0):
        """The compiled function on XLA's (A, B, ends) and D, on XLA's stream."""
        if portable:                      # its TVM-FFI handle is process-local
            return None
        fn = self._compiled(problem, policy, _lowering_sms(problem, sm_margin), eager=False)
        return TvmFfiCall(fn, (Arg.tensor("in", 0), Arg.tensor("in", 1), Arg.tensor("out", 0), Arg.tensor("in", 2),
                               Arg.stream()))

    def prebuild(self, arch: str):
        return grouped_classes(arch, activations=(None, "swiglu"))


KERNEL = _Sm90Kernel()
GROUPED = _Sm90Grouped()
KERNELS = (KERNEL, GROUPED)


# ----------------------------------------------------------------------------------------------
# Ahead-of-time classes (`python -m xgemm build-cache`, see xgemm/runtime/cute_cache.py)
# ----------------------------------------------------------------------------------------------
H200_SMS = 132


def prebuild_classes(arch: str):
    """(key, build) for the common classes on an H200: every policy-table config as the policy
    runs it for matmul (alpha 1, no C) with A, B, D row-major (torch's default layouts; the rows
    in SWAP_ROWS also on the transposed problem, whose views are all column-major), unbatched and
    batched, in bf16 and fp16."""
    if not arch.startswith("sm_90"):
        return []
    items = []
    seen = set()
    for name, cfg, major in ((name, c, major) for name, _, cfgs in POLICY_TABLE for c in cfgs
                             for major in ((ROW, COL) if name in SWAP_ROWS else (ROW,))):
        for ab in _AB_DTYPES:
            for batched in ((False, False, False, False), (True, True, True, False)):
                spec = (cfg, ab, ab, major, major, major, None, True, batched,
                        max_clusters(H200_SMS, cfg), arch)
                if spec in seen:
                    continue
                seen.add(spec)
                items.append((class_key(*spec), functools.partial(build, *spec)))
    return items


def grouped_epi(activation: Optional[str]) -> Optional[Epi]:
    """The Epi of a grouped class fusing this activation or gate (None: the plain product)."""
    if activation is None:
        return None
    return Epi(activation=GATED.get(activation, activation), gated=activation in GATED)


def grouped_classes(arch: str, cfgs=None, activations=(None,)):
    """(key, build) of the grouped class for each config (the policy's candidates by default), in
    bf16 and fp16, D of the inputs' dtype or float32, B N- and K-major (the forward's weights and
    the backward's transposed ones), on an H200; and, for each gated activation in `activations`,
    its class at the first of GATED_GROUPED_CONFIGS (the pick wherever 64 divides H), D of the
    inputs' dtype (the forward)."""
    if not arch.startswith("sm_90"):
        return []
    items = []
    for act in activations:
        gated = act in GATED
        for cfg in (cfgs or (GATED_GROUPED_CONFIGS if gated else GROUPED_CONFIGS)[:1]):
            for ab in _AB_DTYPES:
                for out in ((ab,) if gated else (ab, "float32")):
                    for b_major in (ROW, COL):
                        key = class_key(cfg, ab, out, ROW, b_major, ROW, None, True, (False, True, False, False),
                                        max_clusters(H200_SMS, cfg), arch, grouped_epi(act), grouped=True)
                        items.append((key, build_for_key(key)))
    return items
