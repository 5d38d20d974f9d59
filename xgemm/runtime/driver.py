"""The CUDA driver API through ctypes on libcuda: the calls xgemm's own launches need, nothing more.

Why not cuda-python here: `import cuda.bindings.driver` costs ~18 ms, a third of a fresh process's
first softmax (issue 4 wants <= 50 ms), and its launch wrapper costs more per call than a ctypes
call into a prebuilt CUlaunchConfig. libcuda is loaded on first use (dlopen, ~1 ms); no CUDA
toolkit is needed. The struct layouts are cuda.h's (the same ones ffi/cuda_min.h declares).

Every call checks its CUresult and raises CudaError(call, code, name); `launch_kernel_ex` returns
the raw code instead, so the per-call path of launch.py does the check itself without a wrapper.
Two failures get a typed error of their own: CUDA_ERROR_OUT_OF_MEMORY is a CudaOutOfMemoryError
(an errors.OutOfMemoryError too), and a cubin the driver cannot load because it is too old for
the ptxas that built it (or the GPU is not the cubin's) is an errors.KernelUnavailableError naming
the CUDA version the cubin needs and the one the driver supports.
"""
from __future__ import annotations

import ctypes
import re
import threading
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

from xgemm.errors import KernelUnavailableError, OutOfMemoryError, XgemmError

# cuda.h enum values
FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3
FUNC_ATTRIBUTE_NUM_REGS = 4
FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5
LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
CLUSTER_SCHEDULING_POLICY_SPREAD = 1
DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
TENSOR_MAP_INTERLEAVE_NONE = 0
TENSOR_MAP_L2_PROMOTION_L2_128B = 2
TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_INVALID_IMAGE = 200
CUDA_ERROR_NO_BINARY_FOR_GPU = 209
CUDA_ERROR_INVALID_PTX = 218
CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222
# what cuModuleLoadData answers for a cubin newer than the driver (or for another GPU)
_NOT_LOADABLE = (CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_INVALID_PTX,
                 CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
# their names where cuGetErrorName gives none (an old or stand-in libcuda)
_NAMES = {code: name for name, code in globals().items() if name.startswith("CUDA_ERROR_")}


class CudaError(XgemmError, RuntimeError):
    """A CUDA driver call failed; `code` is the CUresult value, `name` its name, `call` the call."""

    def __init__(self, call: str, code: int, name: str = "", detail: str = ""):
        self.call, self.code, self.name = call, int(code), name
        msg = f"{call} failed with {name or 'CUresult'} ({int(code)})"
        super().__init__(msg + (f": {detail}" if detail else ""))


class CudaOutOfMemoryError(CudaError, OutOfMemoryError):
    """CUDA_ERROR_OUT_OF_MEMORY from a driver call (a scratch allocation, a module load, a launch)."""


class _ClusterDim(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _LaunchAttributeValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("clusterDim", _ClusterDim),
                ("clusterSchedulingPolicyPreference", ctypes.c_int),
                ("programmaticStreamSerializationAllowed", ctypes.c_int)]


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _LaunchAttributeValue)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig. hStream is a pointer-sized integer (CUstream), read back as an int."""
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_uint64),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def launch_config(block: int, shared: int, cluster: int = 1, spread: bool = True, pdl: bool = False) -> LaunchConfig:
    """A CUlaunchConfig for 1-D grids of `block` threads with a (cluster, 1, 1) cluster attribute
    (plus the spread scheduling preference triton's launcher asks for) when cluster > 1, and with
    pdl the programmatic stream serialization attribute: the kernel may start while the previous
    one in the stream finishes, and waits for it (griddepcontrol.wait) before touching memory. The
    attribute array is kept alive on the config object."""
    cfg = LaunchConfig()
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block, 1, 1
    cfg.gridDimY = cfg.gridDimZ = 1
    cfg.sharedMemBytes = shared
    attrs = (LaunchAttribute * 3)()
    n = 0
    if cluster > 1:
        attrs[0].id = LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attrs[0].value.clusterDim.x, attrs[0].value.clusterDim.y, attrs[0].value.clusterDim.z = cluster, 1, 1
        n = 1
        if spread:
            attrs[1].id = LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE
            attrs[1].value.clusterSchedulingPolicyPreference = CLUSTER_SCHEDULING_POLICY_SPREAD
            n = 2
    if pdl:
        attrs[n].id = LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attrs[n].value.programmaticStreamSerializationAllowed = 1
        n += 1
    if n:
        cfg.attrs = ctypes.cast(attrs, ctypes.POINTER(LaunchAttribute))
        cfg.numAttrs = n
        cfg._keep = attrs
    return cfg


_P = ctypes.c_void_p
_I = ctypes.c_int
_U = ctypes.c_uint
_SIGNATURES = {
    "cuInit": [_U],
    "cuDriverGetVersion": [ctypes.POINTER(_I)],
    "cuGetErrorName": [_I, ctypes.POINTER(ctypes.c_char_p)],
    "cuDeviceGet": [ctypes.POINTER(_I), _I],
    "cuDeviceGetCount": [ctypes.POINTER(_I)],
    "cuDeviceGetName": [ctypes.c_char_p, _I, _I],
    "cuDeviceGetAttribute": [ctypes.POINTER(_I), _I, _I],
    "cuDevicePrimaryCtxRetain": [ctypes.POINTER(_P), _I],
    "cuCtxPushCurrent_v2": [_P],
    "cuCtxPopCurrent_v2": [ctypes.POINTER(_P)],
    "cuCtxGetCurrent": [ctypes.POINTER(_P)],
    "cuCtxSetCurrent": [_P],
    "cuModuleLoadData": [ctypes.POINTER(_P), ctypes.c_char_p],
    "cuModuleGetFunction": [ctypes.POINTER(_P), _P, ctypes.c_char_p],
    "cuFuncSetAttribute": [_P, _I, _I],
    "cuFuncGetAttribute": [ctypes.POINTER(_I), _I, _P],
    "cuLaunchKernelEx": [ctypes.POINTER(LaunchConfig), _P, _P, _P],
    "cuOccupancyMaxActiveClusters": [ctypes.POINTER(_I), _P, ctypes.POINTER(LaunchConfig)],
    "cuMemAllocAsync": [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, _P],
    "cuMemFreeAsync": [ctypes.c_uint64, _P],
    "cuMemsetD32Async": [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, _P],
    "cuStreamIsCapturing": [_P, ctypes.POINTER(_I)],
    "cuTensorMapEncodeTiled": [_P, _I, _U, _P, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                               ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32), _I, _I, _I, _I],
}

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_fns: Dict[str, object] = {}
_initialized = False
_contexts: Dict[int, int] = {}


def _fn(name: str):
    global _lib
    f = _fns.get(name)
    if f is None:
        with _lock:
            if _lib is None:
                try:
                    _lib = ctypes.CDLL("libcuda.so.1")
                except OSError as exc:
                    raise CudaError("dlopen(libcuda.so.1)", 100, "CUDA_ERROR_NO_DEVICE",
                                    f"no NVIDIA driver on this machine ({exc})") from None
            f = getattr(_lib, name)
            f.argtypes = _SIGNATURES[name]
            f.restype = _I
            _fns[name] = f
    return f


def error_name(code: int) -> str:
    s = ctypes.c_char_p()
    try:
        if _fn("cuGetErrorName")(int(code), ctypes.byref(s)) == 0 and s.value:
            return s.value.decode()
    except Exception:   # noqa: BLE001 - a name is a nicety
        pass
    return _NAMES.get(int(code), "")


def check(code: int, call: str, detail: str = "") -> None:
    if code == CUDA_ERROR_OUT_OF_MEMORY:
        raise CudaOutOfMemoryError(call, code, error_name(code),
                                   (f"{detail}; " if detail else "") + "GPU memory is exhausted: free memory "
                                   "(drop references to unused arrays, empty the framework's allocator cache) "
                                   "or use smaller batches")
    if code:
        raise CudaError(call, code, error_name(code), detail)


_driver_version: Optional[int] = None


def driver_version() -> int:
    """The CUDA version the installed driver supports, as cuDriverGetVersion gives it (12040 = 12.4)."""
    global _driver_version
    if _driver_version is None:
        v = _I()
        check(_fn("cuDriverGetVersion")(ctypes.byref(v)), "cuDriverGetVersion")
        _driver_version = v.value
    return _driver_version


_TOOLKIT = re.compile(rb"Cuda compilation tools, release (\d+)\.(\d+)")


def cubin_cuda_version(cubin: bytes) -> Optional[Tuple[int, int]]:
    """The CUDA release of the ptxas that built a cubin, from its .note.nv.tkinfo note (None if absent)."""
    m = _TOOLKIT.search(cubin)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _version_text(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


# the first Linux driver branch of each CUDA major version (NVIDIA's CUDA toolkit release notes)
_FIRST_DRIVER = {11: "450", 12: "525", 13: "580"}


def _not_loadable(exc: CudaError, cubin: bytes, name: str, device: int) -> KernelUnavailableError:
    """The typed error for a cubin the driver refused: which CUDA it needs, which the driver has."""
    built = cubin_cuda_version(cubin)
    try:
        have: Optional[int] = driver_version()
        installed = f"CUDA {_version_text(have)} (cuDriverGetVersion {have})"
    except CudaError:
        have, installed = None, "an unknown CUDA version"
    too_old = built is not None and have is not None and have < built[0] * 1000
    if exc.code == CUDA_ERROR_NO_BINARY_FOR_GPU and not too_old:
        try:
            major, minor = capability(device)
            gpu = f"sm_{major}{minor}{'a' if major >= 9 else ''}"
        except CudaError:
            gpu = "this GPU's arch"
        return KernelUnavailableError(
            f"kernel {name}: its cubin is not for device {device} ({gpu}; driver: {installed}); rebuild the "
            f"kernel cache for it (`python -m xgemm build-cache --arch {gpu}`) [{exc}]")
    if built is not None:
        branch = _FIRST_DRIVER.get(built[0])
        needs = (f"CUDA {built[0]}.x{f' (driver R{branch} or newer)' if branch else ''}; its cubin was built "
                 f"by ptxas of CUDA {built[0]}.{built[1]}")
    else:
        needs = "a newer CUDA than it has (the cubin names no toolkit release)"
    return KernelUnavailableError(
        f"kernel {name} needs an NVIDIA driver for {needs}; the installed driver supports {installed}. Update "
        f"the NVIDIA driver, or rebuild the kernel cache (`python -m xgemm build-cache`) with a triton whose "
        f"ptxas is no newer than the driver [{exc}]")


def init() -> None:
    global _initialized
    if not _initialized:
        check(_fn("cuInit")(0), "cuInit")
        _initialized = True


def device(index: int) -> int:
    init()
    dev = _I()
    check(_fn("cuDeviceGet")(ctypes.byref(dev), int(index)), "cuDeviceGet", f"device {index}")
    return dev.value


def device_count() -> int:
    """CUDA devices the driver sees (0 where cuInit finds none); CudaError without a driver."""
    init()
    n = _I()
    check(_fn("cuDeviceGetCount")(ctypes.byref(n)), "cuDeviceGetCount")
    return n.value


def device_name(index: int) -> str:
    buf = ctypes.create_string_buffer(128)
    check(_fn("cuDeviceGetName")(buf, len(buf), device(index)), "cuDeviceGetName", f"device {index}")
    return buf.value.decode(errors="replace")


_attributes: Dict[Tuple[int, int], int] = {}


def device_attribute(attribute: int, index: int) -> int:
    """A device attribute (they never change: cached per process)."""
    value = _attributes.get((attribute, index))
    if value is None:
        v = _I()
        check(_fn("cuDeviceGetAttribute")(ctypes.byref(v), attribute, device(index)), "cuDeviceGetAttribute",
              f"attribute {attribute} of device {index}")
        value = _attributes[(attribute, index)] = v.value
    return value


def capability(index: int) -> Tuple[int, int]:
    return (device_attribute(DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, index),
            device_attribute(DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, index))


def sm_count(index: int) -> int:
    return device_attribute(DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, index)


def primary_context(index: int) -> int:
    """The device's primary context (the one torch, CuPy and JAX use), retained once per process."""
    with _lock:
        ctx = _contexts.get(index)
    if ctx is None:
        c = _P()
        check(_fn("cuDevicePrimaryCtxRetain")(ctypes.byref(c), device(index)), "cuDevicePrimaryCtxRetain",
              f"device {index}")
        with _lock:
            ctx = _contexts.setdefault(index, c.value)
    return ctx


_bound = threading.local()


def bind_thread(index: int) -> None:
    """Make the device's primary context current on this thread when none is: a thread that has
    run no CUDA runtime call has none (torch's autograd worker threads, whose device guard skips
    cudaSetDevice when the index already matches, and fresh user threads), and a driver-API launch
    there fails with CUDA_ERROR_INVALID_CONTEXT. The runtime would bind the same context; once per
    thread and device."""
    if getattr(_bound, "index", None) == index:
        return
    current = _P()
    check(_fn("cuCtxGetCurrent")(ctypes.byref(current)), "cuCtxGetCurrent")
    if not current.value:
        check(_fn("cuCtxSetCurrent")(primary_context(index)), "cuCtxSetCurrent", f"device {index}")
    _bound.index = index


class current_context:
    """`with current_context(device):` makes the device's primary context current (push/pop)."""

    def __init__(self, index: int):
        self.ctx = primary_context(index)

    def __enter__(self):
        check(_fn("cuCtxPushCurrent_v2")(self.ctx), "cuCtxPushCurrent")
        return self

    def __exit__(self, *exc):
        popped = _P()
        check(_fn("cuCtxPopCurrent_v2")(ctypes.byref(popped)), "cuCtxPopCurrent")


def module_load(cubin: bytes, what: str = "") -> int:
    """Load a cubin into the current context (hold the returned handle for the process)."""
    mod = _P()
    check(_fn("cuModuleLoadData")(ctypes.byref(mod), cubin), "cuModuleLoadData", what)
    return mod.value


def module_function(module: int, name: str) -> int:
    fn = _P()
    check(_fn("cuModuleGetFunction")(ctypes.byref(fn), module, name.encode()), "cuModuleGetFunction", name)
    return fn.value


def set_function_attribute(func: int, attribute: int, value: int, what: str = "") -> None:
    check(_fn("cuFuncSetAttribute")(func, attribute, int(value)), f"cuFuncSetAttribute({attribute})", what)


def function_attribute(func: int, attribute: int) -> int:
    v = _I()
    check(_fn("cuFuncGetAttribute")(ctypes.byref(v), attribute, func), f"cuFuncGetAttribute({attribute})")
    return v.value


class LoadedKernel(NamedTuple):
    module: int
    func: int
    num_regs: int
    local_bytes: int


def load_kernel(cubin: bytes, name: str, device: int, shared: int, cluster: int = 1) -> LoadedKernel:
    """Kernel `name` of a cubin, loaded into the device's primary context (hold the result for the
    process) and opted into what its launches need: dynamic shared memory above the 48 KB default,
    and a non-portable cluster size (> 8 CTAs)."""
    with current_context(device):
        try:
            module = module_load(cubin, name)
        except CudaError as exc:
            if exc.code in _NOT_LOADABLE:
                raise _not_loadable(exc, cubin, name, device) from None
            raise
        func = module_function(module, name)
        if shared > 48 * 1024:
            set_function_attribute(func, FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared,
                                   f"{name} needs {shared} bytes")
        if cluster > 8:
            set_function_attribute(func, FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, name)
        return LoadedKernel(module, func, function_attribute(func, FUNC_ATTRIBUTE_NUM_REGS),
                            function_attribute(func, FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES))


def max_active_clusters(func: int, config: LaunchConfig, device: int = 0) -> int:
    """How many clusters of `config`'s cluster shape (block, shared memory) can be resident at once:
    clusters must fit inside one GPC, so 4- and 8-CTA clusters may leave SMs idle."""
    n = _I()
    with current_context(device):
        check(_fn("cuOccupancyMaxActiveClusters")(ctypes.byref(n), func, ctypes.byref(config)),
              "cuOccupancyMaxActiveClusters")
    return n.value


def launcher():
    """cuLaunchKernelEx(config_ref, func, kernel_params_address, None) -> CUresult (unchecked)."""
    return _fn("cuLaunchKernelEx")


def mem_alloc_async(nbytes: int, stream: int) -> int:
    p = ctypes.c_uint64()
    check(_fn("cuMemAllocAsync")(ctypes.byref(p), int(nbytes), stream or None), "cuMemAllocAsync", f"{nbytes} bytes")
    return p.value


def mem_free_async(ptr: int, stream: int) -> None:
    check(_fn("cuMemFreeAsync")(ptr, stream or None), "cuMemFreeAsync")


def memset_d32_async(ptr: int, value: int, count: int, stream: int) -> None:
    check(_fn("cuMemsetD32Async")(ptr, value, count, stream or None), "cuMemsetD32Async", f"{count} words")


def stream_capturing(stream: int) -> bool:
    """Is the stream being captured into a CUDA graph (cuStreamIsCapturing)?"""
    status = _I()
    check(_fn("cuStreamIsCapturing")(stream or None, ctypes.byref(status)), "cuStreamIsCapturing")
    return status.value != 0


def tensor_map_encode_tiled(dtype: int, base: int, dims: Sequence[int], byte_strides: Sequence[int],
                            box: Sequence[int], elem_strides: Sequence[int], swizzle: int,
                            what: str = "") -> bytes:
    """cuTensorMapEncodeTiled -> the 128-byte CUtensorMap (dims innermost first; byte strides of
    the outer dims), no interleave, L2 promotion 128B, no NaN fill of out-of-bounds elements."""
    rank = len(dims)
    buf = ctypes.create_string_buffer(128 + 64)   # CUtensorMap: 128 bytes, 64-byte aligned
    aligned = (ctypes.addressof(buf) + 63) // 64 * 64
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    check(_fn("cuTensorMapEncodeTiled")(
        aligned, dtype, rank, base, (u64 * rank)(*dims), (u64 * max(1, rank - 1))(*byte_strides),
        (u32 * rank)(*box), (u32 * rank)(*elem_strides), TENSOR_MAP_INTERLEAVE_NONE, swizzle,
        TENSOR_MAP_L2_PROMOTION_L2_128B, TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled", what)
    return ctypes.string_at(aligned, 128)
