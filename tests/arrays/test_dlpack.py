"""DLPack 1.0 for arrays of frameworks xgemm does not know (issue 22): the versioned capsule is asked for
first (legacy producers still work), read in place without being consumed, and its read-only flag
makes a read-only view; a read-only out is refused with the fix, read-only inputs compute.

Producers here wrap NumPy arrays and hand out NumPy's own capsules (NumPy >= 2.1 exports DLPack 1.0
and sets the read-only flag of a non-writeable array), or hand-built ones for the fields NumPy never
sets (byte_offset, no strides, other versions and flags).
"""
from __future__ import annotations

import ctypes
import gc
import sys

import numpy as np
import pytest

import xgemm
from xgemm import arrays, errors, prepare
from xgemm.arrays import ops
from xgemm.runtime import dlpack

pytestmark = pytest.mark.skipif(np.lib.NumpyVersion(np.__version__) < "2.1.0",
                                reason="NumPy < 2.1 exports no versioned DLPack capsule")

A = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
B = np.arange(20, dtype=np.float32).reshape(4, 5) % 7 - 3
C = np.arange(15, dtype=np.float32).reshape(3, 5) % 4


def read_only(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    x.flags.writeable = False
    return x


class Producer:
    """An array of an unknown framework: NumPy's capsules under another type. Records each call."""

    def __init__(self, arr: np.ndarray):
        self.arr, self.shape, self.dtype = arr, arr.shape, arr.dtype
        self.calls: list = []
        self.last = None                     # the last capsule handed out (to see it is not consumed)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "max_version": max_version, "dl_device": dl_device, "copy": copy})
        self.last = self.arr.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)
        return self.last

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


class LegacyProducer(Producer):
    """A producer older than DLPack 1.0: no max_version argument, unversioned capsules only."""

    def __dlpack__(self, stream=None):
        self.calls.append({"stream": stream})
        self.last = self.arr.__dlpack__(stream=stream)
        return self.last


class IgnoresVersionProducer(Producer):
    """Takes max_version but answers with a legacy capsule (the spec allows it)."""

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "max_version": max_version})
        self.last = self.arr.__dlpack__()
        return self.last


_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))


class Handmade:
    """A producer of hand-built capsules over a NumPy array's memory (no destructor: the structs live
    in this object). `data` is the address DLTensor.data gets; `byte_offset` is added by the reader."""

    def __init__(self, arr: np.ndarray, *, flags: int = 0, major: int = 1, byte_offset: int = 0,
                 strides: bool = True, lanes: int = 1, name: bytes = dlpack.VERSIONED_NAME,
                 device=(dlpack.CPU, 0)):
        self.arr, self.shape, self.dtype, self.name, self.device = arr, arr.shape, arr.dtype, name, device
        self.calls: list = []
        nd = arr.ndim
        self._shape = (ctypes.c_int64 * nd)(*arr.shape)
        self._strides = (ctypes.c_int64 * nd)(*(s // arr.itemsize for s in arr.strides))
        code, bits = dlpack.CODES[arr.dtype.name]
        tensor = dlpack.DLTensor(
            data=arr.ctypes.data - byte_offset, device=dlpack.DLDevice(*device), ndim=nd,
            dtype=dlpack.DLDataType(code, bits, lanes),
            shape=ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64)),
            strides=ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64)) if strides else None,
            byte_offset=byte_offset)
        if name in (dlpack.LEGACY_NAME, b"used_dltensor"):
            self._managed = dlpack.DLManagedTensor(dl_tensor=tensor)
        else:
            self._managed = dlpack.DLManagedTensorVersioned(version=dlpack.DLPackVersion(major, 0), flags=flags,
                                                            dl_tensor=tensor)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "max_version": max_version})
        return _capsule_new(ctypes.addressof(self._managed), self.name, None)

    def __dlpack_device__(self):
        return self.device


# -- reading the capsule ----------------------------------------------------------------------------

def test_versioned_capsule_is_read_in_place_and_not_consumed():
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    x = base[1:, ::3]                               # an offset pointer and non-unit strides
    p = Producer(x)
    before = sys.getrefcount(x)
    v = arrays.view(p, "b", "matmul")
    assert p.calls == [{"stream": None, "max_version": (1, 0), "dl_device": None, "copy": None}]
    assert v.framework == "other" and v.obj is p
    assert (v.shape, v.strides, v.dtype, v.itemsize) == ((5, 4), (10, 3), "float32", 4)
    assert v.ptr == x.ctypes.data and not v.readonly
    # not consumed: still named "dltensor_versioned" (not "used_..."), so collecting it runs the
    # producer's deleter, which drops NumPy's reference to x
    assert 'capsule object "dltensor_versioned"' in repr(p.last)
    assert sys.getrefcount(x) == before + 1          # the capsule p keeps
    p.last = None
    gc.collect()
    assert sys.getrefcount(x) == before


def test_legacy_only_producer_still_works():
    x = np.arange(12, dtype=np.float64).reshape(4, 3).T     # column-major
    p = LegacyProducer(x)
    v = arrays.view(p, "a", "matmul")
    assert p.calls == [{"stream": None}]                    # the versioned ask failed with TypeError
    assert 'capsule object "dltensor"' in repr(p.last)
    assert (v.shape, v.strides, v.dtype, v.ptr, v.readonly) == ((3, 4), (1, 3), "float64", x.ctypes.data, False)


def test_legacy_capsule_answering_a_versioned_ask():
    p = IgnoresVersionProducer(A)
    v = arrays.view(p, "a", "matmul")
    assert p.calls == [{"stream": None, "max_version": (1, 0)}]
    assert (v.shape, v.strides, v.ptr, v.readonly) == ((3, 4), (4, 1), A.ctypes.data, False)


def test_read_only_flag_makes_a_read_only_view():
    assert arrays.view(Producer(read_only(A)), "a", "t").readonly
    assert not arrays.view(Producer(A.copy()), "a", "t").readonly
    assert arrays.view(Handmade(A, flags=dlpack.FLAG_READ_ONLY), "a", "t").readonly
    assert not arrays.view(Handmade(A), "a", "t").readonly


def test_hand_built_fields():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    v = arrays.view(Handmade(x, byte_offset=64), "a", "t")         # data + byte_offset is element 0
    assert v.ptr == x.ctypes.data and v.shape == (4, 6) and v.strides == (6, 1)
    v = arrays.view(Handmade(x, strides=False), "a", "t")          # NULL strides: row-major
    assert v.strides == (6, 1)
    v = arrays.view(Handmade(x, name=dlpack.LEGACY_NAME), "a", "t")
    assert v.ptr == x.ctypes.data and not v.readonly
    v = arrays.view(Handmade(x, lanes=4), "a", "t")                 # a vector dtype: a name no check accepts
    assert v.dtype == "dlpack(2, 32)x4"
    v = arrays.view(Handmade(x.astype(np.float16), device=(dlpack.CUDA, 0)), "a", "t")
    assert v.device.kind == "cuda" and v.dtype == "float16"


def test_cuda_producer_is_asked_to_order_before_the_legacy_default_stream():
    """Calls owned by an unknown framework launch on the legacy default stream, which DLPack names 1
    (a stand-in that only says it is on CUDA; nothing is launched)."""
    p = Handmade(A, device=(dlpack.CUDA, 0))
    arrays.view(p, "a", "t")
    assert p.calls == [{"stream": 1, "max_version": (1, 0)}]
    p = Handmade(A)
    arrays.view(p, "a", "t")
    assert p.calls == [{"stream": None, "max_version": (1, 0)}]     # CPU: no stream


@pytest.mark.parametrize("kw,words", [
    ({"major": 2}, ["a (Handmade) could not be read through DLPack", "DLPack 2.0", "numpy.from_dlpack(a)"]),
    ({"name": b"used_dltensor"}, ["could not be read through DLPack", "used_", "pass a NumPy"]),
    ({"flags": dlpack.FLAG_IS_COPIED}, ["a's producer (Handmade) exported a copy", "IS_COPIED", "in place"]),
])
def test_unreadable_capsules_get_a_typed_error(kw, words):
    with pytest.raises(errors.FrameworkError) as info:
        arrays.view(Handmade(A, **kw), "a", "matmul")
    for w in words:
        assert w in str(info.value), str(info.value)


def test_producer_refusing_to_export_gets_a_typed_error():
    # NumPy refuses a legacy capsule of a read-only array: DLPack < 1.0 cannot say read-only
    with pytest.raises(errors.FrameworkError, match=r"b \(LegacyProducer\) could not be read through DLPack"):
        arrays.view(LegacyProducer(read_only(B)), "b", "explain")


def test_an_unknown_producer_first_gets_a_typed_error_naming_the_fix():
    """The result takes the first operand's framework, which must be one xgemm can allocate in."""
    for call in (lambda: xgemm.matmul(Producer(A), B), lambda: xgemm.softmax(Producer(C)),
                 lambda: xgemm.explain(Producer(A), B)):
        with pytest.raises(errors.FrameworkError, match=r"(a|x) is a Producer .*pass a NumPy, torch, CuPy or JAX array "
                                                        r"first, e.g. numpy.from_dlpack\((a|x)\)"):
            call()


# -- read-only out -----------------------------------------------------------------------------------

def test_read_only_out_of_a_versioned_producer_is_refused():
    """The out checks refuse DLPack's read-only flag (the public calls refuse an unknown owner first)."""
    va, vb = arrays.view(Producer(A), "a", "matmul"), arrays.view(Producer(B), "b", "matmul")
    for ro in (Producer(read_only(np.zeros((3, 5), np.float32))),
               Handmade(np.zeros((3, 5), np.float32), flags=dlpack.FLAG_READ_ONLY)):
        with pytest.raises(errors.OutError) as info:
            prepare.check_out("matmul", ro, "other", (3, 5), ("float32",), [va, vb])
        msg = str(info.value)
        assert "out is read-only" in msg and "read-only flag" in msg and "pass a writeable array" in msg, msg
        assert "drop out=" in msg, msg


def test_writeable_out_of_a_versioned_producer_passes_the_out_checks():
    va, vb = arrays.view(Producer(A), "a", "matmul"), arrays.view(Producer(B), "b", "matmul")
    out = Producer(np.zeros((3, 5), np.float32))
    v = prepare.check_out("matmul", out, "other", (3, 5), ("float32",), [va, vb])
    assert not v.readonly and v.shape == (3, 5)


def test_read_only_numpy_out_still_names_the_numpy_fix():
    with pytest.raises(errors.OutError, match=r"out is read-only; pass a writeable array \(numpy: out.flags"):
        xgemm.matmul(A, B, out=read_only(np.zeros((3, 5), np.float32)))


# -- read-only inputs --------------------------------------------------------------------------------

def test_read_only_numpy_inputs_compute():
    a, b, c = read_only(A), read_only(B), read_only(C)
    np.testing.assert_array_equal(xgemm.matmul(a, b), A @ B)
    np.testing.assert_array_equal(xgemm.gemm(a, b, c, alpha=2.0, beta=0.5), 2 * (A @ B) + 0.5 * C)
    out = np.full((3, 5), np.nan, np.float32)
    assert xgemm.gemm(a, b, c, beta=1.0, out=out) is out
    np.testing.assert_array_equal(out, A @ B + C)
    e = np.exp(A - A.max(-1, keepdims=True))
    np.testing.assert_allclose(xgemm.softmax(a), e / e.sum(-1, keepdims=True), rtol=1e-6)
    assert not (a.flags.writeable or b.flags.writeable or c.flags.writeable)


def test_read_only_numpy_operands_join_a_torch_owner():
    torch = pytest.importorskip("torch")
    d = xgemm.gemm(torch.from_numpy(A.copy()), read_only(B), read_only(C), beta=1.0)
    assert isinstance(d, torch.Tensor)
    np.testing.assert_array_equal(d.numpy(), A @ B + C)


def test_read_only_versioned_producer_as_an_input_is_not_refused():
    """Planning reads every operand's view; read-only inputs pass (only out must be writeable)."""
    plan = xgemm.explain(read_only(A), Producer(read_only(B)), Producer(read_only(C)), beta=1.0)
    assert plan.kernel_name == "reference"


def test_read_only_versioned_producer_joins_a_numpy_owner():
    pb, pc = Producer(read_only(B)), Producer(read_only(C))
    np.testing.assert_array_equal(xgemm.gemm(A, pb, pc, alpha=2.0, beta=1.0), 2 * (A @ B) + C)
    assert all(call["max_version"] == (1, 0) for call in pb.calls + pc.calls)
