"""The native FFI (ffi/) and the cuda lowering, tested on a machine without a GPU.

- the handler builds with g++ against jax.ffi.include_dir() in seconds and exports its symbols;
- ffi/cuda_min.h agrees with a real cuda.h (values, sizes, offsets) when one is installed;
- lowering for cuda emits the xgemm_cubin_launch_v1 custom call (no GPU needed), with the
  transposed operands of the backward pass as column-major operand layouts (no copies);
- export for (cpu, cuda) round-trips with export_disabled_safety_checks();
- end to end through XLA:CPU: the cuda rule aimed at the handler's host variant, with a fake
  driver library whose kernels run on the host (xgemm/jax_testing.py): values, module cache,
  launch configuration, parameter packing and error reporting are the handler's real code.
"""
from __future__ import annotations

import ctypes
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import xgemm.jax as xj  # noqa: E402
from xgemm.jax import ffi as jax_ffi
from xgemm.jax import testing as jax_testing  # noqa: E402


@pytest.fixture(scope="module")
def library() -> Path:
    t0 = time.perf_counter()
    path = jax_ffi.build()
    assert time.perf_counter() - t0 < 30, "the FFI build must stay fast (CI builds it on CPU)"
    return path


def test_library_builds_and_exports_the_handlers(library):
    lib = ctypes.CDLL(str(library))
    for sym in ("XgemmCubinLaunchExecute", "XgemmCubinLaunchInitialize", "XgemmCubinLaunchHost",
                "XgemmFfiSetDriverPath", "XgemmFfiModulesLoaded", "XgemmFfiLaunchCounts"):
        assert getattr(lib, sym) is not None
    lib.XgemmFfiAbiVersion.restype = ctypes.c_int64
    assert lib.XgemmFfiAbiVersion() == jax_ffi.ABI_VERSION
    nm = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True)
    if nm.returncode == 0:
        assert re.search(r"\bT XgemmCubinLaunchExecute\b", nm.stdout)
        assert "cuLaunchKernelEx" not in nm.stdout and "libcuda" not in nm.stdout   # opened at run time


def _layout_probe(header: str, prefix: str) -> str:
    """A C++ program printing the driver ABI facts the handler relies on."""
    t = "CUlaunchConfig" if prefix == "" else "XgemmCUlaunchConfig"
    a = "CUlaunchAttribute" if prefix == "" else "XgemmCUlaunchAttribute"
    e = (lambda n: n) if prefix == "" else (lambda n: n + "_")
    return f"""
#include <cstddef>
#include <cstdio>
{header}
int main() {{
  std::printf("%zu %zu %zu %zu %zu %zu\\n", sizeof({t}), offsetof({t}, sharedMemBytes), offsetof({t}, hStream),
              offsetof({t}, attrs), offsetof({t}, numAttrs), sizeof({a}));
  std::printf("%zu %d %d %d %d %d %d\\n", offsetof({a}, value), (int){e("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES")},
              (int){e("CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED")}, (int){e("CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION")},
              (int){e("CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE")}, (int){e("CU_CLUSTER_SCHEDULING_POLICY_SPREAD")},
              (int){e("CU_STREAM_CAPTURE_STATUS_NONE")});
  std::printf("%d %d\\n", (int){e("CU_STREAM_NON_BLOCKING")}, (int){e("CU_EVENT_DISABLE_TIMING")});
}}
"""


def test_cuda_min_header_matches_cuda_h(tmp_path):
    candidates = []
    try:
        import triton
        candidates.append(Path(triton.__file__).parent / "backends" / "nvidia" / "include")
    except ImportError:
        pass
    candidates += [Path("/usr/local/cuda/include")]
    inc = next((c for c in candidates if (c / "cuda.h").exists()), None)
    if inc is None:
        pytest.skip("no cuda.h on this machine to compare with")
    outputs = []
    for name, header, prefix, flags in (
            ("real", "#include <cuda.h>", "", [f"-I{inc}"]),
            ("ours", '#include "cuda_min.h"', "x", [f"-I{jax_ffi.source_dir()}"])):
        src = tmp_path / f"{name}.cc"
        src.write_text(_layout_probe(header, prefix))
        exe = tmp_path / name
        subprocess.run(["g++", "-std=c++17", *flags, "-o", str(exe), str(src)], check=True, capture_output=True)
        outputs.append(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)
    assert outputs[0] == outputs[1]


# ---------------------------------------------------------------------------------------------
# Lowering for cuda on a CPU machine

def _custom_calls(text: str):
    return [line for line in text.splitlines() if "xgemm_cubin_launch_v1" in line]


def test_cuda_lowering_emits_the_custom_call():
    a = jax.ShapeDtypeStruct((4, 64, 32), jnp.float32)
    b = jax.ShapeDtypeStruct((32, 48), jnp.float32)
    x = jax.ShapeDtypeStruct((8, 5, 100), jnp.float32)
    with jax_testing.fake_kernels():
        gemm_text = jax.jit(lambda a, b: xj.gemm(a, b, alpha=2.0)).trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
        soft_text = jax.jit(lambda x: xj.softmax(x, axis=1)).trace(x).lower(lowering_platforms=("cuda",)).as_text()
        grad_text = jax.jit(jax.grad(lambda a, b: jnp.sum(xj.gemm(a, b) ** 2), (0, 1))).trace(a, b).lower(
            lowering_platforms=("cuda",)).as_text()
    (call,) = _custom_calls(gemm_text)
    assert 'kernel = "fake_gemm_f32"' in call and "cluster = dense<[2, 1, 1]>" in call and "smem = 65536" in call
    assert "tensor<256x32xf32>" in call          # B has no batch dims: the batch is folded into M
    assert "dot_general" not in gemm_text
    (call,) = _custom_calls(soft_text)
    # the reduced axis 1 minor-most in memory (an XLA layout, not a transpose op)
    assert "operand_layouts = [dense<[1, 2, 0]>" in call and "transpose" not in soft_text
    calls = _custom_calls(grad_text)
    assert len(calls) == 3                       # forward, dA, dB: all through the kernel
    assert any("dense<[0, 1]>" in c for c in calls)   # a transposed operand taken column-major


def test_cuda_lowering_falls_back_to_xla_without_a_kernel():
    # float64 has no GPU kernel: the cuda lowering is XLA's own dot (the declared fallback)
    a = jax.ShapeDtypeStruct((16, 16), jnp.float64)
    text = jax.jit(lambda a: xj.gemm(a, a)).trace(a).lower(lowering_platforms=("cuda",)).as_text()
    assert "dot_general" in text and not _custom_calls(text)


def test_cuda_lowering_goes_past_a_class_that_cannot_be_built(monkeypatch):
    """The CuTe class a bf16 product needs cannot be built (its compiler died: KernelBuildError):
    the lowering takes the next kernel of the table, here XLA's dot (the fallback) once the Gluon
    kernel declines, and the CuTe kernel declines the problem from then on."""
    from xgemm import errors
    from xgemm.core import policy
    from xgemm.kernels import gluon_matmul_sm90
    from xgemm.runtime import cute_cache
    monkeypatch.setattr(policy, "_unbuildable", {})
    monkeypatch.setattr(policy, "_plans", {})
    monkeypatch.setattr(gluon_matmul_sm90.KERNEL, "supports", lambda problem: "not in this test")
    died = []

    def dying(key, build):
        died.append(key)
        raise errors.KernelBuildError("compiling <the class> killed its build process (SIGABRT)")
    monkeypatch.setattr(cute_cache, "cute", dying)
    a = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
    b = jax.ShapeDtypeStruct((256, 384), jnp.bfloat16)
    text = jax.jit(xj.matmul).trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    assert len(died) == 2 and "dot_general" in text and "xgemm_tvm_ffi_call" not in text
    assert {name for _, name, _ in policy._unbuildable} == {"cute_gemm_sm90", "cute_mma_sm80"}
    (problem,) = {p for _, _, p in policy._unbuildable}
    assert "could not be built" in dict(policy.choose("gemm", problem).declined)["cute_gemm_sm90"]


def test_cuda_lowering_pads_unaligned_half_rows():
    """bf16 rows of 999 / 5001 elements (not 16-byte multiples): the cuda lowering zero-pads K and
    N to 1008 / 5008 (xgemm.api's staging rule), calls the CuTe kernel and slices D; no XLA dot.
    Below core.layout.PAD_MIN_FLOP it stays XLA's dot."""
    pytest.importorskip("cutlass")
    a = jax.ShapeDtypeStruct((2000, 999), jnp.bfloat16)
    b = jax.ShapeDtypeStruct((999, 5001), jnp.bfloat16)
    c = jax.ShapeDtypeStruct((5001,), jnp.bfloat16)
    text = jax.jit(lambda a, b, c: xj.gemm(a, b, c, alpha=2.0, beta=-1.0)).trace(a, b, c).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "dot_general" not in text
    assert "high = [0, 9]" in text and "high = [9, 7]" in text and "high = [7]" in text   # A, B, C
    (call,) = [ln for ln in text.splitlines() if "stablehlo.custom_call @xgemm_tvm_ffi_call" in ln]
    assert "tensor<2000x1008xbf16>, tensor<1008x5008xbf16>" in call
    assert "stablehlo.slice" in text and "tensor<2000x5001xbf16>" in text
    small = jax.jit(xj.matmul).trace(jax.ShapeDtypeStruct((300, 999), jnp.bfloat16),
                                     jax.ShapeDtypeStruct((999, 1001), jnp.bfloat16)).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "dot_general" in small and "stablehlo.pad" not in small


def test_export_for_cpu_and_cuda_round_trips():
    export = pytest.importorskip("jax.export")
    pytest.importorskip("flatbuffers")
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.integers(-5, 6, (6, 16)), jnp.float32)
    b = jnp.asarray(rng.integers(-5, 6, (16, 8)), jnp.float32)
    f = jax.jit(lambda a, b: xj.softmax(xj.gemm(a, b, alpha=0.125), axis=-1))
    with jax_testing.fake_kernels():
        with pytest.raises(ValueError, match="custom calls"):
            export.export(f, platforms=("cpu", "cuda"))(a, b)
        exp = export.export(f, platforms=("cpu", "cuda"),
                            disabled_checks=xj.export_disabled_safety_checks(include_cutlass=False))(a, b)
    back = export.deserialize(exp.serialize())
    assert back.platforms == ("cpu", "cuda") and _custom_calls(back.mlir_module())
    np.testing.assert_allclose(np.asarray(back.call(a, b)), np.asarray(jax.nn.softmax(0.125 * (a @ b), -1)),
                               rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# End to end through the handler on XLA:CPU with the fake driver

@pytest.fixture(scope="module")
def fake_gpu():
    with jax_testing.fake_gpu() as fake:
        yield fake


def test_handler_end_to_end_gemm(fake_gpu):
    rng = np.random.default_rng(1)
    A, B, C = (rng.integers(-5, 6, s).astype(np.float32) for s in ((3, 8, 16), (16, 12), (8, 12)))
    B3 = rng.integers(-5, 6, (3, 16, 12)).astype(np.float32)
    before = jax_testing.stats(fake_gpu)
    counted = jax_ffi.launch_counts()
    f = jax.jit(lambda a, b, c: xj.gemm(a, b, c, alpha=2.0, beta=-0.5))
    out = np.asarray(f(A, B, C))
    np.testing.assert_array_equal(out, 2 * A @ B - 0.5 * C)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a, b: xj.gemm(a, b))(A, B3)), A @ B3)  # batched
    s = jax_testing.stats(fake_gpu)
    assert s["launches"] - before["launches"] == 2
    now = jax_ffi.launch_counts()      # the handler's own count agrees; no stream, no capture
    assert (now[0] - counted[0], now[1] - counted[1]) == (2, 0)
    assert s["grid"] == (6, 1, 1) and s["block"] == (128, 1, 1) and s["cluster"] == (2, 1, 1)
    assert s["smem"] == 65536 and s["max_smem_attr"] == 65536       # > 48 KiB opted in
    assert s["loads"] <= 2        # one module load per process (softmax may add the second)
    # the backward pass: transposed operands arrive column-major, no copies, right values
    g = jax.jit(jax.grad(lambda a, b: jnp.sum(xj.gemm(a, b) ** 2), (0, 1)))(A, B)
    G = 2 * (A @ B)
    np.testing.assert_array_equal(np.asarray(g[0]), G @ B.T)
    np.testing.assert_array_equal(np.asarray(g[1]), np.einsum("lmk,lmn->kn", A, G))


def test_handler_end_to_end_softmax_and_vmap(fake_gpu):
    rng = np.random.default_rng(2)
    X = rng.standard_normal((5, 7, 9)).astype(np.float32)
    y = jax.jit(lambda x: xj.softmax(x, 1))(X)
    e = np.exp(X - X.max(1, keepdims=True))
    np.testing.assert_allclose(np.asarray(y), e / e.sum(1, keepdims=True), rtol=1e-6)
    s = jax_testing.stats(fake_gpu)
    assert s["cluster"] == (16, 1, 1) and s["non_portable_cluster"] == 1 and s["grid"] == (5 * 9 * 16, 1, 1)
    A, B = rng.integers(-5, 6, (4, 2, 3, 8)).astype(np.float32), rng.integers(-5, 6, (8, 5)).astype(np.float32)
    v = jax.jit(jax.vmap(jax.vmap(lambda a: xj.gemm(a, B))))(A)
    np.testing.assert_array_equal(np.asarray(v), A @ B)
    assert jax_testing.stats(fake_gpu)["grid"] == (2, 1, 1)     # one launch, everything folded into M


def test_handler_reports_driver_errors(fake_gpu):
    bad = jax_ffi.Launch(cubin=b"not a cubin", kernel="fake_softmax_f32", grid=(1, 1, 1), block=(32, 1, 1),
                         params=(jax_ffi.Param.input(0), jax_ffi.Param.output(0), jax_ffi.Param.i32(1),
                                 jax_ffi.Param.i32(4)))
    x = jnp.ones((1, 4), jnp.float32)
    f = jax.jit(lambda x: jax_ffi.call(bad, [x], [jax.ShapeDtypeStruct((1, 4), jnp.float32)],
                                       target=jax_ffi.HOST_TEST_TARGET)[0])
    with pytest.raises(Exception, match="INVALID_IMAGE"):
        np.asarray(f(x))
    wrong = jax_ffi.Launch(cubin=jax_testing.FAKE_CUBIN, kernel="fake_softmax_f32", grid=(1, 1, 1), block=(32, 1, 1),
                           params=(jax_ffi.Param.input(0), jax_ffi.Param.output(0), jax_ffi.Param.i32(1),
                                   jax_ffi.Param.i32(4)))
    attrs = jax_ffi.attributes(wrong, [x], [x], [None], [None])
    attrs["buffers"] = attrs["buffers"].copy()
    attrs["buffers"][0] = 12                     # claim float64: the handler checks the real dtype
    g = jax.jit(lambda x: jax.ffi.ffi_call(jax_ffi.HOST_TEST_TARGET, jax.ShapeDtypeStruct((1, 4), jnp.float32))(x, **attrs))
    with pytest.raises(Exception, match="was built for dtype 12"):
        np.asarray(g(x))


# ---------------------------------------------------------------------------------------------
# The TVM-FFI target (CuTe kernels' path), end to end with a Python-bodied TVM-FFI function

@pytest.fixture(scope="module")
def fake_gpu_tvm():
    pytest.importorskip("tvm_ffi")
    with jax_testing.fake_gpu(gemm="tvm") as fake:
        yield fake


def test_tvm_ffi_call_end_to_end(fake_gpu_tvm):
    rng = np.random.default_rng(3)
    A, B, C = (rng.integers(-5, 6, s).astype(np.float32) for s in ((3, 8, 16), (16, 12), (12,)))
    before = jax_testing.FakeTvmGemm.calls
    f = jax.jit(lambda a, b, c: xj.gemm(a, b, c, alpha=2.0, beta=0.5))
    text = f.lower(A, B, C).as_text()
    assert jax_ffi.TVM_HOST_TEST_TARGET in text
    np.testing.assert_array_equal(np.asarray(f(A, B, C)), 2 * A @ B + 0.5 * C)
    g = jax.jit(jax.grad(lambda a, b: jnp.sum(xj.gemm(a, b) ** 2), (0, 1)))(A, B)   # col-major operands
    G = 2 * (A @ B)
    np.testing.assert_array_equal(np.asarray(g[0]), G @ B.T)
    np.testing.assert_array_equal(np.asarray(g[1]), np.einsum("lmk,lmn->kn", A, G))
    assert jax_testing.FakeTvmGemm.calls - before == 4


def test_tvm_ffi_errors_surface(fake_gpu_tvm):
    import tvm_ffi

    def body(x, y, stream):
        raise ValueError("kernel refused this tensor")
    tc = jax_ffi.TvmFfiCall(tvm_ffi.convert(body), (jax_ffi.Arg.tensor("in", 0), jax_ffi.Arg.tensor("out", 0),
                                                    jax_ffi.Arg.stream()))
    x = jnp.ones((2, 4), jnp.float32)
    f = jax.jit(lambda x: jax_ffi.call_tvm_ffi(tc, [x], [jax.ShapeDtypeStruct(x.shape, x.dtype)],
                                               target=jax_ffi.TVM_HOST_TEST_TARGET)[0])
    with pytest.raises(Exception, match="kernel refused this tensor"):
        np.asarray(f(x))
    attrs = jax_ffi.tvm_attributes(tc, [x], [x], [None], [None])
    attrs["token"] = attrs["token"] + 1          # a handle from "another process" is refused, not called
    g = jax.jit(lambda x: jax.ffi.ffi_call(jax_ffi.TVM_HOST_TEST_TARGET, jax.ShapeDtypeStruct(x.shape, x.dtype))(
        x, **attrs))
    with pytest.raises(Exception, match="another process"):
        np.asarray(g(x))


def test_tvm_ffi_zeroed_and_scratch_buffers(fake_gpu_tvm):
    """TvmFfiCall.zeroed: int32 buffers of zeros passed after the call's own inputs (split-K's
    flags); scratch_bytes: uninitialised byte buffers (its workspace). Both reach the function
    with their shapes and dtypes, and neither shows among the results. (The host test handler's
    tensors are not readable from Python; the H200 tests check the values.)"""
    import tvm_ffi
    seen = []

    def body(x, flags, work, y, stream):
        seen.extend((tuple(t.shape), str(t.dtype)) for t in (x, flags, work, y))
    tc = jax_ffi.TvmFfiCall(tvm_ffi.convert(body), (jax_ffi.Arg.tensor("in", 0), jax_ffi.Arg.tensor("in", 1),
                                                    jax_ffi.Arg.tensor("scratch", 0), jax_ffi.Arg.tensor("out", 0),
                                                    jax_ffi.Arg.stream()), scratch_bytes=(96,), zeroed=(5,))
    x = jnp.ones((2, 4), jnp.float32)
    outs = jax.jit(lambda x: jax_ffi.call_tvm_ffi(tc, [x], [jax.ShapeDtypeStruct(x.shape, x.dtype)],
                                                  target=jax_ffi.TVM_HOST_TEST_TARGET))(x)
    jax.block_until_ready(outs)
    assert len(outs) == 1 and outs[0].shape == (2, 4)
    assert seen == [((2, 4), "float32"), ((5,), "int32"), ((96,), "uint8"), ((2, 4), "float32")], seen


def test_tvm_ffi_path_is_kept_out_of_exports():
    export = pytest.importorskip("jax.export")
    pytest.importorskip("tvm_ffi")
    a = jax.ShapeDtypeStruct((64, 32), jnp.float32)
    b = jax.ShapeDtypeStruct((32, 16), jnp.float32)
    f = jax.jit(lambda a, b: xj.gemm(a, b))
    with jax_testing.fake_kernels(gemm="tvm"):
        lowered = f.trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
        exp = export.export(f, platforms=("cuda",), disabled_checks=xj.export_disabled_safety_checks(False))(a, b)
    # jit: the CuTe function through the handler, by default its CUDA-graph-compatible registration
    assert jax_ffi.TVM_GRAPH_TARGET in lowered and jax_ffi.default_tvm_target() == jax_ffi.TVM_GRAPH_TARGET
    module = exp.mlir_module()
    assert "xgemm_tvm_ffi_call" not in module and "dot_general" in module   # export: portable XLA op
