"""The native torch fast path (ffi/torch_fastpath.cc) built against this machine's torch and run
on a CPU: CPU tensors stand for one CUDA device (configure(allow_cpu=True)), cuLaunchKernelEx is
ffi/testing/fake_libcuda.cc (its fake softmax computes on the host buffers) and the CuTe
function is tests/data/tvm_abi_echo.c (it records the cells it gets). Checked: a hit launches
what the first call launched with only the data pointers and the stream changed; the result is
a fresh tensor of the stored shape and dtype; every part of the key misses when it differs;
launch errors raise the Python error types."""
from __future__ import annotations

import ctypes
import struct

import pytest

torch = pytest.importorskip("torch")
from xgemm.jax import ffi as jax_ffi
from xgemm.runtime import driver, launch
from xgemm.torch import native as torch_native  # noqa: E402
from xgemm.torch.native import OPS, OUT, A, B, C  # noqa: E402

pytestmark = pytest.mark.compile      # builds the module with g++ against torch's headers (~20 s)
STREAM = 0x7F00_1234_5670


@pytest.fixture(scope="module")
def native():
    saved = (torch_native.active, torch_native.compiling)
    mod = torch_native.load()
    assert mod is not None, torch_native.status()
    fake = jax_ffi.build_fake_driver()
    torch_native.configure(str(fake), allow_cpu=True, test_stream=STREAM)
    try:
        yield mod, ctypes.CDLL(str(fake))
    finally:
        mod.clear()
        torch_native.configure()
        torch_native.active, torch_native.compiling = saved


def _launcher(lib, monkeypatch, name="fake_softmax_f32", num_ctas=2, shared=70_000):
    """A launch.Launcher of the fake driver's kernel `name` (module loading through the fake)."""
    module, func = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.cuModuleLoadData(ctypes.byref(module), b"XGEMM-FAKE-CUBIN") == 0
    assert lib.cuModuleGetFunction(ctypes.byref(func), module, name.encode()) == 0
    d = type("FakeDriver", (), {})()
    d.load_kernel = lambda cubin, n, device, sh, cl=1: driver.LoadedKernel(module.value, func.value, 32, 0)
    d.launch_config, d.check = driver.launch_config, driver.check
    d.launcher = lambda: lib.cuLaunchKernelEx
    lib.cuLaunchKernelEx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    monkeypatch.setattr(launch, "_driver", lambda: d)
    params = [{"name": "x", "type": "*fp32", "ptx": "u64"}, {"name": "y", "type": "*fp32", "ptx": "u64"},
              {"name": "rows", "type": "i32", "ptx": "u32"}, {"name": "cols", "type": "i32", "ptx": "u32"},
              {"name": "global_scratch", "type": "*i8", "ptx": "u64"},
              {"name": "profile_scratch", "type": "*i8", "ptx": "u64"}]
    meta = {"name": name, "num_warps": 4, "num_ctas": num_ctas, "shared": shared, "params": params}
    return launch.Launcher(b"XGEMM-FAKE-CUBIN", meta, 0)


def _stats(lib):
    out = (ctypes.c_int64 * 15)()
    lib.fake_cuda_stats(out)
    return list(out)


def test_cubin_launch_hit_computes_on_fresh_buffers(native, monkeypatch):
    mod, lib = native
    launcher = _launcher(lib, monkeypatch)
    x0 = torch.randn(6, 40)
    y0 = torch.full_like(x0, float("nan"))
    launcher(3, STREAM, x0.data_ptr(), y0.data_ptr(), 6, 40)          # the first call, through Python
    recipe = launcher.native_recipe(3, (A, OUT), (6, 40))
    assert torch_native.register("softmax", None, -1, 0, x0, None, None, y0, recipe)
    launches = _stats(lib)[2]
    x = torch.randn(6, 40)
    y = mod.hit(OPS["softmax"], None, -1, 0, x, None, None)
    assert y is not None and y.shape == x.shape and y.dtype == x.dtype
    assert y.data_ptr() not in (x.data_ptr(), y0.data_ptr())
    torch.testing.assert_close(y, torch.softmax(x, -1))              # the fake kernel ran on x and y
    stats = _stats(lib)
    assert stats[2] == launches + 1
    assert stats[5:15] == [3 * 2, 1, 1, 128, 1, 1, 2, 1, 1, 70_000]   # grid in CTAs, block, cluster, smem
    assert mod.stats()["hits"] >= 1


def test_cubin_launch_misses(native, monkeypatch):
    mod, lib = native
    launcher = _launcher(lib, monkeypatch, num_ctas=1, shared=0)
    x0 = torch.randn(4, 16)
    y0 = torch.empty_like(x0)
    assert torch_native.register("softmax", None, 1, 0, x0, None, None, y0,
                                 launcher.native_recipe(4, (A, OUT), (4, 16)))
    hit = lambda x, axis=1, forced=None: mod.hit(OPS["softmax"], forced, axis, 0, x, None, None)  # noqa: E731
    assert hit(torch.randn(4, 16)) is not None
    assert hit(torch.randn(4, 17)) is None                            # shape
    assert hit(torch.randn(16, 4).T) is None                          # strides
    assert hit(torch.randn(4, 16, dtype=torch.float64)) is None       # dtype
    assert hit(torch.randn(4, 16), axis=-1) is None                   # another axis value
    assert hit(torch.randn(4, 16), axis=1.0) is None                  # a float is not the int axis
    assert hit(torch.randn(4, 16), forced="gluon_softmax") is None    # a forced kernel
    assert hit(torch.randn(4, 16, requires_grad=True)) is None        # autograd goes elsewhere
    assert hit(torch.randn(4, 17)[:, 1:]) is None                     # another 16-byte class / strides
    assert hit(torch.nn.Parameter(torch.randn(4, 16))) is None        # requires grad
    assert hit(torch.randn(4, 16).numpy()) is None                    # not a torch tensor
    assert mod.hit(OPS["gemm"], None, 1, 0, torch.randn(4, 16), None, None) is None   # another op


def test_cubin_launch_error_raises_cuda_error(native, monkeypatch):
    mod, lib = native
    launcher = _launcher(lib, monkeypatch, num_ctas=1, shared=0)
    x0 = torch.randn(2, 8)
    recipe = list(launcher.native_recipe(1, (A, OUT), (2, 8)))
    bogus = ctypes.c_int(0)
    recipe[1] = ctypes.addressof(bogus)                 # a function the fake driver does not know
    assert torch_native.register("softmax", None, 5, 0, x0, None, None, torch.empty_like(x0), recipe)
    with pytest.raises(driver.CudaError) as info:
        mod.hit(OPS["softmax"], None, 5, 0, torch.randn(2, 8), None, None)
    assert info.value.code == 400 and "native fast path" in str(info.value)


def _f64_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _cells(record, count):
    """The echo's record -> per cell: ('t', data, shape, strides) or (type index, bits)."""
    out, i = [], 1
    assert record[0] == count
    for _ in range(count):
        kind = record[i]
        if kind == 7:
            ndim = record[i + 6]
            out.append(("t", record[i + 1], tuple(record[i + 7:i + 7 + ndim]), tuple(record[i + 7 + ndim:i + 7 + 2 * ndim])))
            i += 7 + 2 * ndim
        else:
            out.append((kind, record[i + 1]))
            i += 2
    return out


def test_tvm_call_hit_rewrites_only_pointers_and_stream(native, tvm_echo):
    mod, _ = native
    fn, record = tvm_echo
    a0, b0, d0 = torch.randn(8, 4), torch.randn(4, 6), torch.empty(8, 6)
    go = fn.prepare(a0, b0, d0, 2.5, 0).go((A, B, OUT))
    assert go.native[0] == "tvm" and go.native[4] == (A, B, OUT)
    assert torch_native.register("matmul", None, 2.5, 0.0, a0, b0, None, d0, go.native)
    a, b = torch.randn(8, 4), torch.randn(4, 6)
    d = mod.hit(OPS["matmul"], None, 2.5, 0.0, a, b, None)
    assert d is not None and d.shape == (8, 6) and d.dtype == torch.float32
    assert _cells(record, 5) == [("t", a.data_ptr(), (8, 4), (4, 1)), ("t", b.data_ptr(), (4, 6), (6, 1)),
                                 ("t", d.data_ptr(), (8, 6), (6, 1)), (3, _f64_bits(2.5)), (1, STREAM)]
    # the Python bound call of the same Prepared still makes the same call (its own cells)
    go(a, b, None, d, 77)
    assert _cells(record, 5)[-1] == (1, 77)
    assert mod.hit(OPS["matmul"], None, 2.0, 0.0, a, b, None) is None          # alpha
    assert mod.hit(OPS["gemm"], None, 2.5, 0.0, a, b, None) is None            # op
    assert mod.hit(OPS["matmul"], None, 2.5, 0.0, a, b.half(), None) is None   # b's dtype
    assert mod.hit(OPS["matmul"], None, True, 0.0, a, b, None) is None         # bool is not a number here


def test_tvm_call_with_c(native, tvm_echo):
    mod, _ = native
    fn, record = tvm_echo
    a0, b0, c0, d0 = torch.randn(8, 4), torch.randn(4, 6), torch.randn(8, 6), torch.empty(8, 6)
    go = fn.prepare(a0, b0, d0, c0, 1.0, -0.5, 0).go((A, B, OUT, C))
    assert go.native[4] == (A, B, OUT, C)
    assert torch_native.register("gemm", None, 1.0, -0.5, a0, b0, c0, d0, go.native)
    a, b, c = torch.randn(8, 4), torch.randn(4, 6), torch.randn(8, 6)
    d = mod.hit(OPS["gemm"], None, 1.0, -0.5, a, b, c)
    cells = _cells(record, 7)
    assert [x[1] for x in cells[:4]] == [a.data_ptr(), b.data_ptr(), d.data_ptr(), c.data_ptr()]
    assert cells[4:] == [(3, _f64_bits(1.0)), (3, _f64_bits(-0.5)), (1, STREAM)]
    assert mod.hit(OPS["gemm"], None, 1.0, -0.5, a, b, None) is None           # C is part of the key
    assert mod.hit(OPS["gemm"], None, 1.0, -0.5, a, b, c.T.contiguous().T) is None


def test_register_refuses_what_it_cannot_serve(native, tvm_echo):
    fn, _ = tvm_echo
    a0, b0, d0 = torch.randn(8, 4), torch.randn(4, 6), torch.empty(8, 6)
    go = fn.prepare(a0, b0, d0, 1.0, 0).go((A, B, OUT))
    assert not torch_native.register("matmul", None, 1.0, 0.0, a0.numpy(), b0, None, d0, go.native)
    assert not torch_native.register("matmul", None, 1.0, 0.0, a0, b0, None, d0.T, go.native)   # not contiguous
    assert not torch_native.register("matmul", None, 1.0, 0.0, a0, b0, None, d0, None)
