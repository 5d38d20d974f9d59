"""xgemm/tvm_abi.py's marshalling on a CPU: a C stand-in for an exported CuTe function
(tests/data/tvm_abi_echo.c, built here with the system C compiler) records the TVM-FFI cells it
receives, and they must be the DLTensor / int / float / None cells ffi/xgemm_ffi.cc sends too."""
from __future__ import annotations

import struct

import pytest

from xgemm.arrays import ArrayView
from xgemm.core.problem import Device
from xgemm.torch.native import OUT, A, B


@pytest.fixture(scope="module")
def echo(tvm_echo):
    return tvm_echo


def _view(ptr, shape, strides, dtype, index=1):
    return ArrayView(None, "torch", Device("cuda", index, (9, 0)), ptr, shape, strides, dtype, 2, False)


def _f64_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def test_generic_call_cells(echo):
    fn, rec = echo
    a = _view(0x1000, (3, 5), (5, 1), "bfloat16")
    d = _view(0x2000, (2, 3, 5), (15, 1, 3), "float32")
    fn(a, d, None, 2.5, 7, True)
    got = list(rec[:40])
    assert got[0] == 6
    # DLTensor cells (type 7): data, kDLCUDA on device 1, dtype code/bits, ndim, shape, strides
    assert got[1:12] == [7, 0x1000, 2, 1, 4, 16, 2, 3, 5, 5, 1]          # bf16: kDLBfloat, 16 bits
    assert got[12:25] == [7, 0x2000, 2, 1, 2, 32, 3, 2, 3, 5, 15, 1, 3]  # fp32, 3-d, column strides
    assert got[25:33] == [0, 0, 3, _f64_bits(2.5), 1, 7, 2, 1]            # None, float, int, bool


class _Ptr:
    """A stand-in for a torch tensor: only data_ptr()."""

    def __init__(self, p):
        self.p = p

    def data_ptr(self):
        return self.p


def test_prepared_call_rewrites_pointers_and_stream(echo):
    fn, rec = echo
    a, b, d = (_view(p, (4, 4), (4, 1), "float16", 0) for p in (0x10, 0x20, 0x30))
    go = fn.prepare(a, b, d, 1.0, 0).go((A, B, OUT))

    go(_Ptr(0xA0), _Ptr(0xB0), None, _Ptr(0xD0), 0x5EED)
    got = list(rec[:60])
    per_tensor = 1 + 6 + 4                        # type, data/dev/dtype/ndim, 2 shape, 2 strides
    datas = [got[1 + i * per_tensor + 1] for i in range(3)]
    assert datas == [0xA0, 0xB0, 0xD0]            # a, b and d in the prepared order
    tail = got[1 + 3 * per_tensor:][:4]
    assert tail == [3, _f64_bits(1.0), 1, 0x5EED]  # alpha unchanged, the stream rewritten


def test_prepared_call_follows_its_roles(echo):
    """A call prepared for the transposed problem (the kernel's A is the caller's B): go(a, b, c, d)
    writes b's pointer into the first tensor cell and a's into the second."""
    fn, rec = echo
    a, b, d = (_view(p, (4, 4), (1, 4), "float16", 0) for p in (0x10, 0x20, 0x30))
    go = fn.prepare(b, a, d, 1.0, 0).go((B, A, OUT))

    go(_Ptr(0xA0), _Ptr(0xB0), None, _Ptr(0xD0), 7)
    got = list(rec[:60])
    per_tensor = 1 + 6 + 4                        # type, data/dev/dtype/ndim, 2 shape, 2 strides
    assert [got[1 + i * per_tensor + 1] for i in range(3)] == [0xB0, 0xA0, 0xD0]
    assert go.native[4] == (B, A, OUT)
    with pytest.raises(AssertionError):
        fn.prepare(b, a, d, 1.0, 0).go((B, A))        # one role per tensor argument
