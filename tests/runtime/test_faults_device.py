"""Issue 22, faults of the device (CPU only; the GPU and its driver are fakes):

- running out of memory -- an output or staging allocation (torch, CuPy, NumPy), or the driver's
  CUDA_ERROR_OUT_OF_MEMORY during a launch -- is an errors.OutOfMemoryError (a MemoryError) that
  says what to do, and the next call works;
- a driver too old for a kernel's cubin is a KernelUnavailableError naming the CUDA version the
  cubin needs and the one the driver supports.
"""
from __future__ import annotations

import types

import pytest

from xgemm import errors
from xgemm.core.problem import Device
from xgemm.runtime import driver, launch

CPU = Device("cpu", None, None)
# what ptxas writes into a cubin's .note.nv.tkinfo (see driver.cubin_cuda_version)
CUBIN_13 = b"\x7fELF...ptxas\0Cuda compilation tools, release 13.4, V13.4.59\0Build cuda_13.4...\0"
META = {"name": "xgemm_k", "num_warps": 4, "num_ctas": 1, "shared": 0,
        "params": [{"name": "x", "type": "*fp32", "ptx": "u64"}, {"name": "n", "type": "i32", "ptx": "u32"},
                   {"name": "global_scratch", "type": "*i8", "ptx": "u64"},
                   {"name": "profile_scratch", "type": "*i8", "ptx": "u64"}]}


# ------------------------------------------------------------------------------------------
# out of memory
# ------------------------------------------------------------------------------------------
def _fails_once(real, exc):
    state = {"left": 1}

    def alloc(*args, **kwargs):
        if state["left"]:
            state["left"] -= 1
            raise exc
        return real(*args, **kwargs)
    return alloc


def test_oom_allocating_the_result_is_typed_and_the_next_call_works(monkeypatch):
    """Through the whole call (CPU tensors dressed as a CUDA device, tests/fake_cuda.py): the
    planned call's output allocation fails once; the error is typed; the same call then runs."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("cuda.bindings")
    from fake_cuda import Fake

    import xgemm
    a, b = torch.ones(64, 32), torch.ones(32, 48)
    with Fake(keep=True) as fake:
        monkeypatch.setattr(torch, "empty", _fails_once(torch.empty, torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 12.00 KiB")))
        with pytest.raises(errors.OutOfMemoryError, match=r"shape \(64, 48\).*smaller batches") as info:
            xgemm.matmul(a, b)
        assert isinstance(info.value, MemoryError) and info.value.__cause__ is None
        assert "Tried to allocate" in str(info.value)
        assert not fake.calls
        out = xgemm.matmul(a, b)
        assert tuple(out.shape) == (64, 48) and len(fake.calls) == 1


def test_oom_in_a_staging_copy_and_on_the_host(monkeypatch):
    torch = pytest.importorskip("torch")
    import numpy

    from xgemm import arrays
    from xgemm.arrays import ops
    x = torch.ones(5, 7)
    v = arrays.view(x, "a", "matmul")
    monkeypatch.setattr(torch, "empty", _fails_once(torch.empty, torch.OutOfMemoryError("out of memory")))
    with pytest.raises(errors.OutOfMemoryError, match=r"a staging copy"):
        ops.padded_copy(v, (8, 8), True, True, "a", [])
    padded = ops.padded_copy(v, (8, 8), True, True, "a", [])      # the next one works
    assert tuple(padded.obj.shape) == (8, 8) and float(padded.obj.sum()) == 35.0
    monkeypatch.setattr(numpy, "empty", _fails_once(numpy.empty, MemoryError("Unable to allocate 4.00 TiB")))
    with pytest.raises(errors.OutOfMemoryError, match="host memory.*smaller batches"):
        ops.empty("numpy", (2 ** 40,), "float32", CPU, None)
    assert ops.empty("numpy", (3,), "float32", CPU, None).shape == (3,)
    # other errors of the framework pass through untouched
    monkeypatch.setattr(torch, "empty", _fails_once(torch.empty, RuntimeError("some other failure")))
    with pytest.raises(RuntimeError, match="some other failure") as info:
        ops.empty("torch", (2,), "float32", CPU, x)
    assert not isinstance(info.value, errors.XgemmError)


def _fake_driver(launch_codes):
    """launch's view of the driver: the real check and launch config, module loading stubbed,
    cuLaunchKernelEx answering the given codes in turn (then 0)."""
    codes = list(launch_codes)
    fake = types.SimpleNamespace(launch_config=driver.launch_config, check=driver.check, CudaError=driver.CudaError)
    fake.load_kernel = lambda cubin, name, device, shared, cluster=1: driver.LoadedKernel("module", name, 0, 0)
    fake.launcher = lambda: (lambda cfg, func, params, extra: codes.pop(0) if codes else 0)
    return fake


def test_oom_from_the_driver_is_typed_and_the_launcher_stays_usable(monkeypatch):
    monkeypatch.setattr(launch, "_driver", lambda: fake)
    fake = _fake_driver([driver.CUDA_ERROR_OUT_OF_MEMORY])
    k = launch.Launcher(b"cubin", META, 0)
    with pytest.raises(errors.OutOfMemoryError, match="cuLaunchKernelEx.*OUT_OF_MEMORY.*smaller batches") as info:
        k(4, 0, 0x1000, 10)
    assert isinstance(info.value, driver.CudaError) and info.value.code == 2     # still a CudaError
    k(4, 0, 0x1000, 10)                    # the same Launcher launches again
    with pytest.raises(driver.CudaError) as other:      # other codes stay plain CudaErrors
        driver.check(700, "cuLaunchKernelEx")
    assert not isinstance(other.value, MemoryError)


# ------------------------------------------------------------------------------------------
# a driver too old for a kernel
# ------------------------------------------------------------------------------------------
class FakeLibcuda:
    """The libcuda entry points load_kernel uses, as driver._fn hands them out."""

    def __init__(self, version: int, load_code: int, capability=(9, 0)):
        self.version, self.load_code, self.capability = version, load_code, capability

    def __call__(self, name):
        return getattr(self, name)

    @staticmethod
    def _set(ref, value):
        ref._obj.value = value
        return 0

    def cuInit(self, flags):
        return 0

    def cuGetErrorName(self, code, ref):
        return 1                           # no name from the driver: driver's own table names it

    def cuDriverGetVersion(self, ref):
        return self._set(ref, self.version)

    def cuDeviceGet(self, ref, index):
        return self._set(ref, index)

    def cuDeviceGetAttribute(self, ref, attribute, dev):
        return self._set(ref, {driver.DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: self.capability[0],
                               driver.DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: self.capability[1]}[attribute])

    def cuDevicePrimaryCtxRetain(self, ref, dev):
        return self._set(ref, 0xC0)

    def cuCtxPushCurrent_v2(self, ctx):
        return 0

    def cuCtxPopCurrent_v2(self, ref):
        return 0

    def cuModuleLoadData(self, ref, image):
        return self.load_code or self._set(ref, 0x40)

    def cuModuleGetFunction(self, ref, module, name):
        return self._set(ref, 0xF0)

    def cuFuncGetAttribute(self, ref, attribute, func):
        return self._set(ref, 32)

    def cuLaunchKernelEx(self, config, func, params, extra):
        return 0


@pytest.fixture
def libcuda(monkeypatch):
    """Install a FakeLibcuda(version, load_code) behind driver._fn, the driver's memos fresh."""
    for name, value in {"_initialized": False, "_contexts": {}, "_attributes": {}, "_driver_version": None}.items():
        monkeypatch.setattr(driver, name, value)
    monkeypatch.setattr(launch, "_launchers", {})

    def install(version, load_code, capability=(9, 0)):
        fake = FakeLibcuda(version, load_code, capability)
        monkeypatch.setattr(driver, "_fn", fake)
        monkeypatch.setattr(driver, "_driver_version", None)
        return fake
    return install


@pytest.mark.parametrize("code", [driver.CUDA_ERROR_UNSUPPORTED_PTX_VERSION, driver.CUDA_ERROR_NO_BINARY_FOR_GPU,
                                  driver.CUDA_ERROR_INVALID_IMAGE, driver.CUDA_ERROR_INVALID_PTX])
def test_driver_too_old_names_the_requirement(libcuda, code):
    fake = libcuda(12040, code)
    with pytest.raises(errors.KernelUnavailableError) as info:
        launch.get_launcher(CUBIN_13, META, 0)
    msg = str(info.value)
    for words in ("kernel xgemm_k", "CUDA 13.x", "R580", "ptxas of CUDA 13.4",
                  "installed driver supports CUDA 12.4 (cuDriverGetVersion 12040)", "Update the NVIDIA driver",
                  driver._NAMES[code]):
        assert words in msg, (words, msg)
    assert not isinstance(info.value, driver.CudaError) and not launch._launchers   # nothing half-made kept
    fake.load_code = 0                      # a driver that loads it: the same process carries on
    assert launch.get_launcher(CUBIN_13, META, 0).num_regs == 32


def test_cubin_for_another_gpu_names_the_arch(libcuda):
    libcuda(13000, driver.CUDA_ERROR_NO_BINARY_FOR_GPU, capability=(10, 0))
    with pytest.raises(errors.KernelUnavailableError, match=r"not for device 0 \(sm_100a.*--arch sm_100a"):
        launch.get_launcher(CUBIN_13, META, 0)


def test_unknown_toolkit_and_other_load_errors(libcuda):
    libcuda(12040, driver.CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
    with pytest.raises(errors.KernelUnavailableError, match="names no toolkit release.*CUDA 12.4"):
        launch.get_launcher(b"\x7fELF no note", META, 0)
    libcuda(12040, 1)                       # CUDA_ERROR_INVALID_VALUE: not a version problem
    with pytest.raises(driver.CudaError, match="cuModuleLoadData"):
        launch.get_launcher(CUBIN_13, META, 0)
