"""xgemm.arrays: views, majorness/alignment classes, zero-copy sharing, light import."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import xgemm
from xgemm import arrays
from xgemm.core import layout
from xgemm.core.problem import COL, ROW, STRIDED


def test_import_xgemm_loads_no_framework_or_compiler():
    code = ("import sys, xgemm; import xgemm.api, xgemm.core.policy, xgemm.arrays;"
            "heavy = [m for m in ('numpy', 'torch', 'jax', 'cupy', 'triton', 'cutlass', 'cuda', 'array_api_compat')"
            " if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_numpy_matmul_imports_no_other_framework():
    code = ("import sys, numpy as np, xgemm; xgemm.matmul(np.ones((2,2)), np.ones((2,2))); xgemm.softmax(np.ones(3));"
            "print([m for m in ('torch', 'jax', 'cupy', 'triton', 'cutlass') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


@pytest.mark.parametrize("shape,strides,expected", [
    ((3, 4), (4, 1), ROW), ((3, 4), (1, 3), COL), ((3, 4), (8, 2), STRIDED), ((3, 4), (-4, 1), STRIDED),
    ((1, 4), (99, 1), ROW), ((3, 1), (1, 99), ROW), ((3, 4), (5, 1), ROW), ((3, 4), (1, 5), COL),
    ((3, 4), (0, 1), STRIDED), ((1, 1), (7, 7), ROW),
])
def test_majorness(shape, strides, expected):
    assert layout.majorness(shape, strides) == expected


def test_view_and_alignment_numpy():
    base = np.zeros(64 + 1, np.float32)
    x = base[1:65].reshape(8, 8)      # 4 bytes past a 16-byte boundary at best
    v = arrays.view(x, "x", "t")
    assert v.framework == "numpy" and v.shape == (8, 8) and v.strides == (8, 1) and v.dtype == "float32"
    assert v.ptr == x.ctypes.data
    aligned = np.zeros((8, 8), np.float32)
    assert arrays.alignment(arrays.view(aligned, "x", "t"), ROW) == (16 if aligned.ctypes.data % 16 == 0 else 4)
    assert arrays.alignment(v, ROW) <= 8
    odd = np.zeros((8, 5), np.float32)   # a 20-byte leading stride: not vectorizable by 16
    assert arrays.alignment(arrays.view(odd, "x", "t"), ROW) == 4


def test_view_negative_strides_and_span():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)[::-1]
    v = arrays.view(x, "x", "t")
    assert v.strides == (-4, 1)
    lo, hi = v.span()
    assert hi - lo == 12 * 4


def test_torch_and_numpy_share_without_copy():
    torch = pytest.importorskip("torch")
    b = np.ones((4, 5), np.float32)
    t = arrays.import_into("torch", b, "b", "t")
    assert t.data_ptr() == b.ctypes.data                     # zero-copy through DLPack
    a = torch.ones(3, 4)
    d = xgemm.matmul(a, b)
    assert isinstance(d, torch.Tensor) and torch.equal(d, torch.full((3, 5), 4.0))
    back = arrays.import_into("numpy", d, "d", "t")
    assert back.ctypes.data == d.data_ptr()


def test_torch_and_jax_share_without_copy():
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    j = jnp.ones((4, 5), jnp.float32)
    t = arrays.import_into("torch", j, "b", "t")
    assert t.data_ptr() == j.unsafe_buffer_pointer()
    d = xgemm.matmul(torch.ones(3, 4), j)
    assert isinstance(d, torch.Tensor) and torch.equal(d, torch.full((3, 5), 4.0))


def test_explain_reports_kernel_policy_and_no_copy_on_cpu():
    plan = xgemm.explain(np.ones((3, 4), np.float32), np.ones((4, 5), np.float32))
    text = str(plan)
    assert plan.kernel_name == "reference" and "kernel: reference" in text and "zero-copy" in text
    assert "declined" in text       # the GPU kernels say why they do not serve a CPU problem
    plan = xgemm.explain(np.ones((3, 4), np.float32))
    assert plan.op == "softmax" and plan.kernel_name == "reference"


def test_cli_info_and_explain():
    out = subprocess.run([sys.executable, "-m", "xgemm", "info"], capture_output=True, text=True, check=True).stdout
    assert '"frameworks"' in out and '"gpus"' in out and '"kernels"' in out
    out = subprocess.run([sys.executable, "-m", "xgemm", "explain", "8", "8", "8"], capture_output=True,
                         text=True, check=True).stdout
    assert "kernel: reference" in out
    from xgemm.__main__ import main
    with pytest.raises(SystemExit) as done:             # argparse printed the help (a tuple metavar crashed it)
        main(["explain", "--help"])
    assert done.value.code == 0


def test_cli_explain_defaults_each_dimension(capsys):
    from xgemm.__main__ import main
    assert main(["explain", "64", "32"]) == 0
    assert "gemm 64x32x256 float32" in capsys.readouterr().out
    assert main(["explain", "8", "24", "16", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "gemm 8x24x16 bfloat16" in out and "softmax" in out
    with pytest.raises(SystemExit) as done:                  # argparse's usage error, not a traceback
        main(["explain", "-1", "5", "6"])
    assert done.value.code == 2 and "negative" in capsys.readouterr().err
    from xgemm import policy
    with policy.force("garbage"):                            # a bad override: its message, exit status 1
        assert main(["explain", "8", "8", "8"]) == 1
    assert "forced kernel 'garbage'" in capsys.readouterr().err


def test_extent_one_dims_get_the_dense_stride_on_the_same_memory():
    """(8, 1).T has strides (1, 1) in elements; the view carries (8, 1) on the same memory and keeps
    a read-only array read-only (issue 22)."""
    x = np.arange(8.0).reshape(8, 1)
    x.flags.writeable = False
    v = arrays.view(x.T, "x", "test")
    assert x.T.strides == (8, 8) and v.strides == (8, 1)
    assert v.ptr == x.__array_interface__["data"][0] and v.readonly and not v.obj.flags.writeable
    np.testing.assert_array_equal(v.obj, x.T)
    assert arrays.view(np.zeros((4, 4)), "x", "test").obj.strides == (32, 8)      # no extent 1: as is


def test_torch_first_with_a_flipped_numpy_operand():
    """torch.from_dlpack aborts the process (C++ terminate) on a NumPy array with a negative
    stride: such an operand joins torch as a copy. Run in a child so a regression fails the test
    instead of ending the run."""
    pytest.importorskip("torch")
    code = ("import numpy as np, torch, xgemm\n"
            "a, b = np.random.rand(4, 6).astype(np.float32), np.random.rand(6, 5).astype(np.float32)\n"
            "r = xgemm.matmul(torch.from_numpy(a), np.flip(b, 1))\n"
            "assert np.allclose(r.numpy(), a @ np.flip(b, 1), atol=1e-5)\n"
            "r = xgemm.gemm(torch.from_numpy(a), b, np.flip(np.ones((4, 5), np.float32), 0), beta=1.0)\n"
            "assert np.allclose(r.numpy(), a @ b + 1, atol=1e-5)\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_numpy_bfloat16_mixes_with_torch_and_jax_both_ways():
    """NumPy's DLPack has no bfloat16 (ml_dtypes): its bits cross as int16 views, zero-copy."""
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    jnp = pytest.importorskip("jax.numpy")
    rng = np.random.default_rng(0)
    a, b = rng.random((4, 6)).astype(ml_dtypes.bfloat16), rng.random((6, 5)).astype(ml_dtypes.bfloat16)
    want = a.astype(np.float32) @ b.astype(np.float32)
    ta, tb = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16), torch.from_numpy(b.view(np.int16)).view(torch.bfloat16)
    for x, y in ((ta, b), (a, tb), (a, jnp.asarray(b)), (jnp.asarray(a), b)):
        r = xgemm.matmul(x, y)
        assert xgemm.arrays.dtype_name(r) == "bfloat16" and type(r) is type(x)
        np.testing.assert_allclose(np.asarray(r.float() if hasattr(r, "float") else r, np.float32), want, atol=0.05)


class _DLPackOnly:
    """A DLPack producer with nothing else: no .dtype, no .shape."""

    def __init__(self, x):
        self._x = x

    def __dlpack__(self, **kw):
        return self._x.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._x.__dlpack_device__()


def test_a_dlpack_only_object_after_the_first_operand():
    rng = np.random.default_rng(0)
    a, b = rng.random((4, 6)).astype(np.float32), rng.random((6, 5)).astype(np.float32)
    np.testing.assert_allclose(xgemm.matmul(a, _DLPackOnly(b)), a @ b, rtol=1e-5)
    np.testing.assert_allclose(xgemm.gemm(a, b, _DLPackOnly(np.ones((4, 5), np.float32)), beta=1.0), a @ b + 1, rtol=1e-5)
    got = xgemm.gemm(a, _DLPackOnly(b), bias=_DLPackOnly(np.ones(5, np.float32)), activation="relu")
    np.testing.assert_allclose(got, np.maximum(a @ b + 1, 0), rtol=1e-5)
    assert xgemm.gated(a, _DLPackOnly(np.ones((6, 8), np.float32))).shape == (4, 4)
