"""Test support: run the cuda lowering of xgemm's JAX primitives on a machine without a GPU.

`fake_gpu()` (a context manager) does three things for the calls inside it (FakeTvmGemm, a
TVM-FFI function written in Python, stands in for a CuTe kernel on the jax_tvm_ffi path):
  - registers two fake kernels at the front of the dispatch table; they accept cuda problems in
    float32 and answer `jax_lowering` with a "cubin" the fake driver understands
    (ffi/testing/fake_libcuda.cc: fake_gemm_f32, fake_softmax_f32);
  - lowers the primitives on `cpu` with the cuda rule (jax_lowering.py), aimed at the host variant of
    the native handler, which XLA:CPU calls with host buffers;
  - points the handler at the fake driver (once per process; see jax_ffi.register_host_test).
So problem building, kernel choice, Launch encoding, the custom call, the handler's attribute
decoding, DLPack description, module cache, parameter packing and launch configuration all run
for real; only the kernel body is a host loop. Use fresh jax.jit functions inside the block:
executables compiled before it keep their lowering.
"""
from __future__ import annotations

import contextlib
import sys
import types
from typing import Any, Dict, Iterator, Optional

from xgemm.core import policy
from xgemm.core.problem import COL, Policy
from xgemm.jax import ffi as jax_ffi
from xgemm.jax import lowering as jax_lowering
from xgemm.jax import primitives
from xgemm.runtime.calls import Arg, Launch, Param, TvmFfiCall

FAKE_CUBIN = b"XGEMM-FAKE-CUBIN\n" + bytes(range(256)) * 4   # binary, NULs included, like a cubin


class _Fake:
    backend = "host"

    def prebuild(self, arch: str):
        return []


class FakeGemm(_Fake):
    """fp32 GEMM through the fake driver. Exercises pointers, nulls, i32/i64/f32 params, DLPack
    dims read at run time, a scratch result, a 2-CTA cluster and > 48 KiB dynamic shared memory."""
    name = "fake_gemm"
    ops = ("gemm",)

    def supports(self, problem) -> Optional[str]:
        if problem.device.kind != "cuda":
            return "needs a CUDA device"
        if problem.a.dtype != "float32" or problem.epilogue.out_dtype != "float32":
            return "fake kernel: float32 only"
        return None

    def policy(self, problem) -> Policy:
        return Policy(tile=(1, 1, 1), cluster=(2, 1), notes=("fake: host loop",))

    def run(self, problem, policy, operands, out, stream):
        raise NotImplementedError("fake_gemm only runs inside jax.jit")

    def jax_lowering(self, problem, policy, *, portable: bool = False, sm_margin: int = 0) -> Launch:
        lead = len(problem.a.shape) == 3
        L = problem.a.shape[0] if lead else 1
        rank = 3 if lead else 2
        m, n, k = problem.m, problem.n, problem.k
        epi = problem.epilogue
        params = (
            Param.input(0), Param.input(1),
            Param.input(2) if problem.c is not None else Param.null(),
            Param.output(0),
            Param.dim("out", 0, rank - 2), Param.dim("out", 0, rank - 1),   # M, N from the buffer
            Param.i32(k), Param.i32(L),
            Param.i64(m * k if lead else 0), Param.i64(k * n if lead else 0),
            Param.i64(m * n if lead and problem.c is not None else 0),
            Param.i32(problem.a.majorness == COL), Param.i32(problem.b.majorness == COL),
            Param.f32(epi.alpha), Param.f32(epi.beta),
            Param.scratch(0),
        )
        return Launch(cubin=FAKE_CUBIN, kernel="fake_gemm_f32", grid=(2 * L, 1, 1), block=(128, 1, 1),
                      params=params, cluster=(2, 1, 1), shared_mem=64 * 1024, scratch_bytes=(256,))


class FakeSoftmax(_Fake):
    name = "fake_softmax"
    ops = ("softmax",)

    def supports(self, problem) -> Optional[str]:
        if problem.device.kind != "cuda":
            return "needs a CUDA device"
        return None if problem.x.dtype == "float32" else "fake kernel: float32 only"

    def policy(self, problem) -> Policy:
        return Policy(ctas_per_row=16, cluster=(16, 1))

    def run(self, problem, policy, operands, out, stream):
        raise NotImplementedError("fake_softmax only runs inside jax.jit")

    def jax_lowering(self, problem, policy, *, portable: bool = False, sm_margin: int = 0) -> Launch:
        return Launch(cubin=FAKE_CUBIN, kernel="fake_softmax_f32", grid=(problem.rows * 16, 1, 1),
                      block=(256, 1, 1), params=(Param.input(0), Param.output(0), Param.i32(problem.rows),
                                                 Param.i32(problem.cols), Param.null()),
                      cluster=(16, 1, 1), shared_mem=1024)


def _host_view(t: Any):
    """A NumPy view of a tvm_ffi.Tensor that wraps a raw DLTensor* (host memory, float32)."""
    import ctypes

    import numpy as np
    span = max([(d - 1) * s for d, s in zip(t.shape, t.strides)] + [0]) + 1
    buf = (ctypes.c_float * span).from_address(t.data_ptr())
    return np.lib.stride_tricks.as_strided(np.frombuffer(buf, np.float32), t.shape, [4 * s for s in t.strides])


class FakeTvmGemm(FakeGemm):
    """fp32 GEMM as a TVM-FFI function (tvm_ffi.convert of a Python body): the CuTe kernels' path.
    B is passed as an explicit strided view (its transpose's transpose), to exercise Arg views."""
    name = "fake_tvm_gemm"
    calls = 0

    def __init__(self):
        self._fn = None

    def function(self):
        if self._fn is None:
            import tvm_ffi

            def body(a, b, d, c, alpha, beta, stream):
                type(self).calls += 1
                acc = _host_view(a).astype("float64") @ _host_view(b).astype("float64")
                out = alpha * acc + (beta * _host_view(c) if c is not None else 0.0)
                _host_view(d)[...] = out
            self._fn = tvm_ffi.convert(body)
        return self._fn

    def jax_lowering(self, problem, policy, *, portable: bool = False, sm_margin: int = 0) -> Optional[TvmFfiCall]:
        if portable:                    # a process-local handle, as a CuTe kernel's
            return None
        b = problem.b
        if len(b.shape) == 2:           # B through an explicit view: same shape and strides as its own
            b_arg = Arg.tensor("in", 1, shape=b.shape, strides=b.strides)
        else:
            b_arg = Arg.tensor("in", 1)
        c = Arg.tensor("in", 2) if problem.c is not None else Arg.none()
        return TvmFfiCall(self.function(), (Arg.tensor("in", 0), b_arg, Arg.tensor("out", 0), c,
                                            Arg.f64(problem.epilogue.alpha), Arg.f64(problem.epilogue.beta),
                                            Arg.stream()))


GEMM = FakeGemm()
TVM_GEMM = FakeTvmGemm()
SOFTMAX = FakeSoftmax()
_MODULE = "xgemm_jax_testing_fakes"


@contextlib.contextmanager
def fake_kernels(gemm: str = "launch") -> Iterator[None]:
    """Only the dispatch-table part of fake_gpu() (for cross-lowering tests).
    gemm="launch": the cubin-launch fake GEMM; gemm="tvm": the TVM-FFI one."""
    mod = types.ModuleType(_MODULE)
    mod.GEMM, mod.SOFTMAX = (GEMM if gemm == "launch" else TVM_GEMM), SOFTMAX
    sys.modules[_MODULE] = mod
    with policy.snapshot():
        policy.register("gemm", mod.GEMM.name, f"{_MODULE}:GEMM", before=policy.kernel_names("gemm")[0])
        policy.register("softmax", SOFTMAX.name, f"{_MODULE}:SOFTMAX", before=policy.kernel_names("softmax")[0])
        yield


@contextlib.contextmanager
def fake_gpu(gemm: str = "launch") -> Iterator[Any]:
    """Yields the fake driver (pass it to jax_ffi.fake_stats). gemm: as for fake_kernels()."""
    import functools

    from jax.interpreters import mlir

    fake = jax_ffi.register_host_test()
    with fake_kernels(gemm):
        targets = dict(target=jax_ffi.HOST_TEST_TARGET, tvm_target=jax_ffi.TVM_HOST_TEST_TARGET)
        mlir.register_lowering(primitives.gemm_p, functools.partial(jax_lowering.gemm_rule, **targets), platform="cpu")
        mlir.register_lowering(primitives.softmax_p, functools.partial(jax_lowering.softmax_rule, **targets),
                               platform="cpu")
        try:
            yield fake
        finally:
            mlir.register_lowering(primitives.gemm_p, primitives._gemm_reference_rule, platform="cpu")
            mlir.register_lowering(primitives.softmax_p, primitives._softmax_reference_rule, platform="cpu")


def stats(fake: Any) -> Dict[str, Any]:
    return jax_ffi.fake_stats(fake)
