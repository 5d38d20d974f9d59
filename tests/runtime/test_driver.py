"""xgemm/driver.py on a machine without a GPU: the ctypes structs have cuda.h's layout (the same
as ffi/cuda_min.h), the launch config carries the cluster attributes, and a missing driver is a
typed error, not a crash."""
from __future__ import annotations

import ctypes

import pytest

from xgemm.runtime import driver


def test_struct_layout_matches_cuda_h():
    assert ctypes.sizeof(driver.LaunchAttribute) == 72          # id, 4 pad bytes, 64-byte value union
    assert driver.LaunchAttribute.value.offset == 8
    c = driver.LaunchConfig
    assert (c.sharedMemBytes.offset, c.hStream.offset, c.attrs.offset, c.numAttrs.offset) == (24, 32, 40, 48)
    assert ctypes.sizeof(c) == 56


def test_launch_config_cluster_attributes():
    cfg = driver.launch_config(block=128, shared=1024, cluster=4)
    assert (cfg.blockDimX, cfg.blockDimY, cfg.gridDimY, cfg.sharedMemBytes, cfg.numAttrs) == (128, 1, 1, 1024, 2)
    a = cfg.attrs[0]
    assert a.id == driver.LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    assert (a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z) == (4, 1, 1)
    assert cfg.attrs[1].value.clusterSchedulingPolicyPreference == driver.CLUSTER_SCHEDULING_POLICY_SPREAD
    assert driver.launch_config(block=64, shared=0).numAttrs == 0
    assert driver.launch_config(block=64, shared=0, cluster=2, spread=False).numAttrs == 1


def test_launch_config_programmatic_dependent_launch():
    """pdl adds the programmatic stream serialization attribute after the cluster ones."""
    for cluster, n in ((1, 1), (2, 3)):
        cfg = driver.launch_config(block=128, shared=0, cluster=cluster, pdl=True)
        assert cfg.numAttrs == n
        a = cfg.attrs[n - 1]
        assert a.id == driver.LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION == 6
        assert a.value.programmaticStreamSerializationAllowed == 1


def test_enum_values_match_cuda_python():
    d = pytest.importorskip("cuda.bindings.driver")
    assert driver.FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES == int(
        d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
    assert driver.FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED == int(
        d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED)
    assert driver.LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION == int(d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
    assert driver.DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT == int(
        d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    assert driver.TENSOR_MAP_L2_PROMOTION_L2_128B == int(
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B)


def test_no_driver_is_a_typed_error():
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this machine has an NVIDIA driver")
    except OSError:
        pass
    with pytest.raises(driver.CudaError, match="libcuda"):
        driver.sm_count(0)
    with pytest.raises(driver.CudaError, match="libcuda"):
        driver.device_count()


def test_bind_thread_makes_the_primary_context_current_once_per_thread(monkeypatch):
    """A thread with no current context (torch's autograd workers: the 2026-12-02 H200 run's gate
    backward failed with CUDA_ERROR_INVALID_CONTEXT) gets the device's primary context, once; a
    thread whose context is already current keeps it; each thread is checked on its own."""
    import threading
    calls, current = [], {}

    def get_current(out):
        calls.append("get")
        out._obj.value = current.get(threading.get_ident())
        return 0

    def set_current(ctx):
        calls.append(("set", ctx))
        current[threading.get_ident()] = ctx
        return 0
    fns = {"cuCtxGetCurrent": get_current, "cuCtxSetCurrent": set_current}
    monkeypatch.setattr(driver, "_fn", lambda name: fns[name])
    monkeypatch.setattr(driver, "primary_context", lambda index: 0x1000 + index)
    monkeypatch.setattr(driver, "_bound", threading.local())

    def worker():
        driver.bind_thread(0)
        driver.bind_thread(0)
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert calls == ["get", ("set", 0x1000)]
    calls.clear()
    current[threading.get_ident()] = 0x2000          # this thread: a context of its own already
    driver.bind_thread(0)
    driver.bind_thread(0)
    assert calls == ["get"] and current[threading.get_ident()] == 0x2000


def test_every_driver_call_has_a_signature():
    """Each cu* function the module calls through _fn is declared in _SIGNATURES (an undeclared one
    raised KeyError on the H200 at its first call, 2026-12-02)."""
    import re
    from pathlib import Path
    called = set(re.findall(r'_fn\("(cu\w+)"\)', Path(driver.__file__).read_text()))
    assert called and called <= set(driver._SIGNATURES), sorted(called - set(driver._SIGNATURES))
