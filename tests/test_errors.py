"""Every bad input gets a typed error that names the argument, the value seen and the fix."""
from __future__ import annotations

import numpy as np
import pytest

import xgemm
from xgemm import errors

A = np.ones((3, 4), np.float32)
B = np.ones((4, 5), np.float32)


def raises(exc, *words):
    """pytest.raises that also checks the message mentions each word."""
    class _Ctx:
        def __enter__(self):
            self.ctx = pytest.raises(exc)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *a):
            ok = self.ctx.__exit__(*a)
            for w in words:
                assert w in str(self.info.value), f"{w!r} not in {self.info.value}"
            return ok
    return _Ctx()


def test_non_array_input():
    with raises(errors.NotAnArrayError, "a is a list", "numpy.asarray"):
        xgemm.matmul([[1.0]], B)
    with raises(TypeError, "b is a str"):
        xgemm.matmul(A, "B")
    with raises(errors.NotAnArrayError, "x is a float"):
        xgemm.softmax(1.0)


@pytest.mark.parametrize("call", [
    lambda: xgemm.gemm(A, B.tolist(), activation="relu"),
    lambda: xgemm.gemm(A, B, bias=[0.0] * 5, activation="relu"),
    lambda: xgemm.gemm(A, B, bias=1.0),
    lambda: xgemm.gemm(A, B, [0.0] * 5, beta=1.0, activation="silu"),
    lambda: xgemm.gemm(A, None, activation="relu"),
    lambda: xgemm.gated(A, np.ones((4, 6), np.float32).tolist()),
    lambda: xgemm.gated(A, np.ones((4, 2, 3), np.float32).tolist(), layout="stacked"),
    lambda: xgemm.gated(A, np.ones((4, 2, 3), np.float32), bias=[0.0] * 6, layout="stacked"),
    lambda: xgemm.ragged_dot(A, np.ones((2, 4, 6), np.float32).tolist(), np.array([1, 2]), activation="relu"),
    lambda: xgemm.grouped_mm(A, np.ones((2, 4, 6), np.float32), [1, 3], activation="swiglu"),
])
def test_non_array_operand_of_an_epilogue_call(call):
    """The bias / activation / gated / grouped-activation paths check for arrays as matmul does
    (they raised AttributeError from a list's missing .dtype or .shape)."""
    with raises(errors.NotAnArrayError, "not an array"):
        call()


def test_non_array_operand_of_a_jax_epilogue_call():
    jnp = pytest.importorskip("jax.numpy")
    with raises(errors.NotAnArrayError, "bias is a list"):
        xgemm.gemm(jnp.ones((3, 4)), jnp.ones((4, 6)), bias=[0.0] * 6, activation="relu")


def test_mismatched_inner_dims():
    with raises(errors.ShapeError, "a has shape (3, 4) and b (5, 6)", "must equal"):
        xgemm.matmul(A, np.ones((5, 6), np.float32))


def test_incompatible_batch_dims():
    with raises(ValueError, "batch dims", "(2,) and (3,)", "broadcast"):
        xgemm.matmul(np.ones((2, 3, 4), np.float32), np.ones((3, 4, 5), np.float32))


def test_rank_zero():
    with raises(errors.ShapeError, "a is 0-d"):
        xgemm.matmul(np.ones((), np.float32), B)
    with raises(errors.ShapeError, "x is 0-d"):
        xgemm.softmax(np.ones((), np.float32))


def test_unsupported_and_mismatched_dtypes():
    with raises(errors.DTypeError, "a has dtype int32", "astype"):
        xgemm.matmul(A.astype(np.int32), B)
    with raises(errors.DTypeError, "a is float32 and b is float16", "cast b"):
        xgemm.matmul(A, B.astype(np.float16))
    with raises(errors.DTypeError, "x has dtype complex64"):
        xgemm.softmax(np.ones(3, np.complex64))
    with raises(errors.DTypeError, "c is float16"):
        xgemm.gemm(A, B, np.ones((3, 5), np.float16), beta=1.0)


def test_c_shape_and_beta_without_c():
    with raises(errors.ShapeError, "c has shape (4, 5)", "(3, 5)"):
        xgemm.gemm(A, B, np.ones((4, 5), np.float32), beta=1.0)
    with raises(errors.ShapeError, "beta=2 but c is None"):
        xgemm.gemm(A, B, beta=2.0)


@pytest.mark.parametrize("bad", ["2", None, 1j, [1.0], True])
def test_alpha_beta_types(bad):
    with raises(errors.ScalarError, "alpha="):
        xgemm.gemm(A, B, alpha=bad)
    with raises(TypeError, "beta="):
        xgemm.gemm(A, B, np.ones((3, 5), np.float32), beta=bad)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -np.inf])
def test_alpha_beta_non_finite(bad):
    with raises(errors.NonFiniteScalarError, "not finite"):
        xgemm.gemm(A, B, alpha=bad)
    with raises(ValueError, "beta="):
        xgemm.gemm(A, B, np.ones((3, 5), np.float32), beta=bad)


def test_axis_out_of_range_and_not_int():
    with raises(errors.AxisError, "axis=2 is out of range", "[-2, 2)"):
        xgemm.softmax(A, axis=2)
    with raises(IndexError, "axis=-3"):
        xgemm.softmax(A, axis=-3)
    with raises(errors.AxisError, "not an integer"):
        xgemm.softmax(A, axis=1.0)


def test_out_wrong_shape_dtype_readonly_alias():
    with raises(errors.ShapeError, "out has shape (5, 3)", "(3, 5)"):
        xgemm.matmul(A, B, out=np.empty((5, 3), np.float32))
    with raises(errors.DTypeError, "out has dtype float64"):
        xgemm.matmul(A, B, out=np.empty((3, 5), np.float64))
    ro = np.empty((3, 5), np.float32)
    ro.flags.writeable = False
    with raises(errors.OutError, "read-only"):
        xgemm.matmul(A, B, out=ro)
    x = np.ones((4, 4), np.float32)
    with raises(errors.OutError, "shares memory"):
        xgemm.matmul(x, x, out=x)
    with raises(errors.OutError, "shares memory"):
        xgemm.softmax(x, out=x)
    with raises(errors.OutError, "shares memory"):
        xgemm.matmul(np.ones((2, 2), np.float32), x[:2, :], out=x[1:3, :])   # partial overlap with b
    xgemm.matmul(np.ones((2, 2), np.float32), x[:2, :], out=x[2:, :])           # adjacent, no overlap: fine

def test_out_of_other_framework_and_jax_out():
    torch = pytest.importorskip("torch")
    with raises(errors.FrameworkError, "out is a torch array", "numpy"):
        xgemm.matmul(A, B, out=torch.empty(3, 5))
    jnp = pytest.importorskip("jax.numpy")
    with raises(errors.OutError, "immutable"):
        xgemm.matmul(A, B, out=jnp.empty((3, 5), jnp.float32))


def test_mixed_frameworks_without_rule():
    class Foreign:          # a DLPack producer of an unknown framework
        def __init__(self, x):
            self.x = x
            self.shape, self.dtype = x.shape, x.dtype

        def __dlpack__(self, **kw):
            return self.x.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.x.__dlpack_device__()

    np.testing.assert_array_equal(xgemm.matmul(A, Foreign(B)), A @ B)     # joins through numpy.from_dlpack
    with raises(errors.FrameworkError, "a is a Foreign", "pass a NumPy, torch, CuPy or JAX array first"):
        xgemm.matmul(Foreign(A), B)


def test_mixed_devices():
    from dataclasses import replace

    from xgemm import arrays, prepare
    from xgemm.core.problem import Device
    cpu = arrays.view(A, "a", "t")
    gpu = replace(arrays.view(B, "b", "t"), device=Device("cuda", 0, (9, 0)))
    with raises(errors.DeviceError, "a is on cpu and b on cuda:0", "move b"):
        prepare.same_device("matmul", [("a", cpu), ("b", gpu)])


def test_device_dlpack_cannot_describe():
    torch = pytest.importorskip("torch")
    with raises(errors.DeviceError, "b lives on a device DLPack cannot describe"):
        xgemm.matmul(torch.ones(3, 4), torch.empty(4, 5, device="meta"))


def test_forced_kernel_that_declines_raises():
    with raises(errors.KernelUnavailableError, "cute_sgemm"):
        with xgemm.core.policy.force("cute_sgemm"):
            xgemm.matmul(A, B)
    with raises(errors.KernelUnavailableError, "not one of"):
        with xgemm.core.policy.force("no_such_kernel"):
            xgemm.matmul(A, B)


def test_errors_are_builtin_subclasses():
    assert issubclass(errors.ShapeError, ValueError)
    assert issubclass(errors.DTypeError, TypeError)
    assert issubclass(errors.AxisError, IndexError)


def test_numpy_first_operand_with_a_device_array(monkeypatch):
    """Issue 22: NumPy joined by a CUDA tensor got FrameworkError ("Unsupported device in DLTensor")
    from numpy.from_dlpack; it is a DeviceError naming both devices and the fix. A stand-in for a
    CUDA tensor (torch's mixing rule, a CUDA DLPack device) keeps this a CPU test; the real one
    is in tests/gpu/test_api_gpu.py."""
    from xgemm.arrays import ops

    class CudaStandIn:
        shape, dtype = (4, 5), np.dtype(np.float32)

        def __dlpack__(self, stream=None):
            raise AssertionError("a device array must not be imported into NumPy")

        def __dlpack_device__(self):
            return (2, 0)                    # kDLCUDA, device 0
    monkeypatch.setattr(ops, "framework_of", lambda x: "torch" if isinstance(x, CudaStandIn) else "numpy")
    with raises(errors.DeviceError, "b is on cuda:0", "first operand is a NumPy array (cpu)", "move b to the CPU"):
        ops.import_into("numpy", CudaStandIn(), "b", "matmul")


def test_sparse_nested_and_masked_arrays():
    torch = pytest.importorskip("torch")
    a = torch.ones(3, 4)
    with raises(errors.NotAnArrayError, "b is a torch.sparse_coo tensor", "b.to_dense()"):
        xgemm.matmul(a, torch.ones(4, 5).to_sparse())
    with raises(errors.NotAnArrayError, "x is a torch.sparse_csr tensor"):
        xgemm.softmax(a.to_sparse_csr())
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # torch's prototype-stage warning
        nested = torch.nested.nested_tensor([torch.ones(2, 4), torch.ones(3, 4)])
    with raises(errors.NotAnArrayError, "a is a nested tensor", "to_padded_tensor"):
        xgemm.matmul(nested, torch.ones(4, 5))
    with raises(errors.NotAnArrayError, "a is a NumPy masked array", "a.filled(value)"):
        xgemm.matmul(np.ma.masked_array(A, mask=A == 0), B)


def test_activation_that_is_not_a_name():
    for call in (lambda: xgemm.gemm(A, B, activation=["relu"]), lambda: xgemm.gated(A, np.ones((4, 6), np.float32),
                                                                                     activation={"swiglu": 1}),
                 lambda: xgemm.ragged_dot(A, np.ones((2, 4, 6), np.float32), np.array([1, 2]), activation=["relu"])):
        with raises(errors.EpilogueError, "activation="):
            call()


def test_explain_of_a_softmax_with_gemm_arguments():
    with raises(errors.ShapeError, "activation given, which softmax does not take"):
        xgemm.explain(A, activation="relu")
    with raises(errors.ShapeError, "alpha given, which ragged_dot does not take"):
        xgemm.explain(A, np.ones((2, 4, 5), np.float32), np.array([1, 2]), op="ragged_dot", alpha=2.0)
    with raises(errors.ShapeError, "use_fast_accum given, which gemm does not take"):
        xgemm.explain(A, B, B[:3], use_fast_accum=True)
    assert xgemm.explain(A).op == "softmax"


def test_explain_of_an_unknown_op():
    with raises(errors.ShapeError, "op='foo' is not an op it explains", "'ragged_dot'"):
        xgemm.explain(A, B, op="foo")
    with raises(errors.ShapeError, "got 1 arrays with op='matmul'"):
        xgemm.explain(A, op="matmul")


def test_torch_out_whose_elements_share_memory():
    torch = pytest.importorskip("torch")
    a = torch.ones(4, 4)
    with raises(errors.OutError, "share memory", "dense out"):
        xgemm.matmul(a, a, out=torch.zeros(4).expand(4, 4))
    with raises(errors.OutError, "share memory"):
        xgemm.softmax(a, out=torch.zeros(4).expand(4, 4))
    empty = torch.empty_strided((4, 0), (0, 1))                # no elements: nothing shared (the fuzzer's case)
    assert xgemm.matmul(a, torch.ones(4, 0), out=empty) is empty


def test_numpy_out_whose_elements_share_memory():
    from numpy.lib.stride_tricks import as_strided, sliding_window_view
    z = np.zeros(5, np.float32)
    with raises(errors.OutError, "share memory"):                    # every row the same 5 floats
        xgemm.matmul(np.ones((4, 6), np.float32), np.ones((6, 5), np.float32), out=as_strided(z, (4, 5), (0, 4)))
    window = sliding_window_view(np.zeros(8, np.float32), 5, writeable=True)    # rows overlapping by 4
    with raises(errors.OutError, "share memory"):
        xgemm.softmax(np.ones((4, 5), np.float32), out=window)
    for ok in (np.zeros((4, 5), np.float32).T.T, np.zeros((5, 4), np.float32).T, np.flip(np.zeros((4, 5), np.float32), 0)):
        assert xgemm.matmul(np.ones((4, 6), np.float32), np.ones((6, 5), np.float32), out=ok) is ok
        assert np.all(ok == 6.0)


def test_a_jax_tracer_beside_a_numpy_first_operand_on_every_path():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    a8, sa = xgemm.quantize_fp8(A, "tensor")
    b8, sb = xgemm.quantize_fp8(B, "tensor")
    for call, arg in ((lambda v: xgemm.gemm(A, B, bias=v, activation="relu"), jnp.ones(5, jnp.float32)),
                      (lambda b: xgemm.fp8_matmul(A, b), jnp.ones((4, 5), jnp.float32)),
                      (lambda s: xgemm.scaled_matmul(a8, b8, s, sb), jnp.float32(1))):
        with raises(errors.FrameworkError, "is a JAX tracer", "pass JAX arrays"):
            jax.jit(call)(arg)


def test_out_that_requires_grad():
    torch = pytest.importorskip("torch")
    a, b = torch.ones(3, 4), torch.ones(4, 5)
    with raises(errors.OutError, "out requires grad", "out.detach()"):
        xgemm.matmul(a, b, out=torch.zeros(3, 5, requires_grad=True))
    with raises(errors.OutError, "out requires grad"):
        xgemm.softmax(a, out=torch.zeros(3, 4, requires_grad=True))
    with torch.no_grad():
        out = torch.zeros(3, 5, requires_grad=True)
        assert xgemm.matmul(a, b, out=out) is out and float(out[0, 0]) == 4.0


def test_jax_out_dtype_that_is_no_dtype():
    jnp = pytest.importorskip("jax.numpy")
    import xgemm.jax as xj
    with raises(errors.DTypeError, "out_dtype=float99"):
        xj.gemm(jnp.ones((2, 3)), jnp.ones((3, 4)), out_dtype="float99")


def test_inference_tensor_out_outside_inference_mode():
    """torch refuses in-place writes to inference tensors outside inference mode; so does out= on
    every device (a GPU kernel would have written it silently)."""
    torch = pytest.importorskip("torch")
    with torch.inference_mode():
        out = torch.empty(3, 5)
    a, b = torch.ones(3, 4), torch.ones(4, 5)
    with raises(errors.OutError, "inference tensor", "out.clone()"):
        xgemm.matmul(a, b, out=out)
    with torch.inference_mode():
        assert xgemm.matmul(a, b, out=out) is out
    assert torch.equal(out, torch.full((3, 5), 4.0))


def test_stacked_gated_shape_errors_give_the_callers_shapes():
    jnp = pytest.importorskip("jax.numpy")
    for a, b in ((A, np.ones((3, 2, 3), np.float32)), (jnp.ones((3, 4)), jnp.ones((3, 2, 3)))):
        with raises(errors.ShapeError, "b (3, 2, 3)", "b.shape[-3] (3)"):
            xgemm.gated(a, b, layout="stacked")


def test_explain_names_the_copy_of_a_numpy_operand_into_jax():
    jnp = pytest.importorskip("jax.numpy")
    plan = xgemm.explain(jnp.ones((3, 4), jnp.float32), B)
    assert plan.copies == ["b: a NumPy array, copied into a JAX array (JAX arrays own their buffers)"]
    plan = xgemm.explain(jnp.ones((3, 4), jnp.float32), jnp.asarray(B), bias=np.zeros(5, np.float32), activation="relu")
    assert [c.split(":")[0] for c in plan.copies] == ["bias"]
    assert xgemm.explain(jnp.ones((3, 4), jnp.float32), jnp.asarray(B)).copies == []
