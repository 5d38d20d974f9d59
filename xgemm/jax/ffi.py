"""The native XLA FFI of ffi/: build it with g++, load it, register it, and encode the calls.

ffi/xgemm_ffi.cc has these handlers:
  xgemm_cubin_launch_v1  (CUDA; initialize + execute, CUDA-graph compatible) launches any
      prebuilt cubin (Gluon/Triton) on XLA's stream. What to launch travels as custom-call
      attributes (cubin bytes, kernel name, grid/block/cluster, shared memory, parameters), so an
      exported module is self-contained. Describe it with `Launch` + `Param`; emit with `call()`.
  xgemm_tvm_ffi_call_v1  (CUDA; execute) calls a TVM-FFI function - a CuTe-DSL kernel compiled
      with --enable-tvm-ffi, the same function the eager path calls - with the XLA buffers as
      DLTensor* (views allowed) and XLA's stream. Describe it with `TvmFfiCall` + `Arg`; emit with
      `call_tvm_ffi()`. The function handle is process-local: such modules run in the process
      that lowered them (a token check turns a stale handle into an error, never a crash).
      xgemm_tvm_ffi_call_graph_v1 is the same handler declared CUDA-graph compatible, so XLA may
      record it into its command buffers: the default ($XGEMM_JAX_TVM_GRAPH=0 picks the other).
  xgemm_exchange_v1  (CUDA; execute) a collective-permute between the devices of this process by
      the copy engines (ffi/peer_exchange.h), alone or fused with a TVM-FFI call that runs on
      XLA's stream while the copy runs beside it. Describe it with `Route`; emit with
      `call_exchange()`.

Building needs only g++ and the XLA FFI headers jaxlib ships (`jax.ffi.include_dir()`); the .so
goes to a cache dir keyed on the sources, the headers and the compiler, so CI builds it on CPU
in a few seconds and a GPU machine rebuilds it once against its own jaxlib.
Cache dir: $XGEMM_CACHE_DIR/ffi, else ~/.cache/xgemm/ffi (beside the gluon/ and CuTe caches).
With no C++ compiler, a library already in the cache dir (e.g. built on another machine with an
older jaxlib: the XLA FFI C API is versioned and stays backward compatible) is used instead.
"""
from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

from xgemm.runtime import native_build
from xgemm.runtime.calls import (  # noqa: F401
    _A_TENSOR,
    _DIM_I32,
    _DIM_I64,
    _PTR,
    _STRIDE_I64,
    Arg,
    Launch,
    Param,
    TvmFfiCall,
    triton_launch,
)
from xgemm.runtime.native_build import cache_dir, source_dir  # noqa: F401  (this module's public names)

TARGET = "xgemm_cubin_launch_v1"                    # CUDA
HOST_TEST_TARGET = "xgemm_cubin_launch_host_test_v1"  # CPU, through a substitute driver (tests only)
TVM_TARGET = "xgemm_tvm_ffi_call_v1"                  # CUDA
TVM_GRAPH_TARGET = "xgemm_tvm_ffi_call_graph_v1"      # CUDA, CUDA-graph compatible (the default)
TVM_HOST_TEST_TARGET = "xgemm_tvm_ffi_call_host_test_v1"  # CPU (tests only)
EXCHANGE_TARGET = "xgemm_exchange_v1"                 # CUDA, never in a CUDA graph (devices meet on the host)
EXCHANGE_HOST_TEST_TARGET = "xgemm_exchange_host_test_v1"  # CPU (tests: fake devices of one process)
TARGETS = (TARGET, TVM_TARGET)
ABI_VERSION = 1
_CXXFLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-w")

# XLA_FFI_DataType of the buffers we pass
_XLA_DTYPES = {"float16": 10, "float32": 11, "float64": 12, "bfloat16": 16, "uint8": 6, "int8": 2,
               "int32": 4, "int64": 5, "uint32": 8, "bool": 1, "float8_e5m2": 19, "float8_e4m3fn": 20}


# ---------------------------------------------------------------------------------------------
# Launch attributes

def _layout_minor_to_major(major_to_minor: Optional[Sequence[int]], rank: int) -> Tuple[int, ...]:
    return tuple(reversed(range(rank))) if major_to_minor is None else tuple(reversed(tuple(major_to_minor)))


def attributes(launch: Launch, in_avals: Sequence[Any], out_avals: Sequence[Any],
               in_layouts: Sequence[Optional[Sequence[int]]],
               out_layouts: Sequence[Optional[Sequence[int]]]) -> Dict[str, Any]:
    """The custom-call attributes of one launch (see ffi/xgemm_ffi.cc for their meaning)."""
    import numpy as np

    n_in, n_out = len(in_avals), len(out_avals)
    scratch_avals = [_U8(n) for n in launch.scratch_bytes]
    avals = list(in_avals) + list(out_avals) + scratch_avals
    layouts = list(in_layouts) + list(out_layouts) + [None] * len(scratch_avals)
    base = {"in": 0, "out": n_in, "scratch": n_in + n_out}
    count = {"in": n_in, "out": n_out, "scratch": len(scratch_avals)}
    params = []
    for p in launch.params:
        a, b = p.value, 0
        if p.kind in (_PTR, _DIM_I32, _DIM_I64, _STRIDE_I64):
            role, i = p.ref
            if role not in base or not 0 <= i < count[role]:
                raise ValueError(f"{launch.kernel}: parameter {p} names {role} buffer {i}, but the call has "
                                 f"{count.get(role, 0)} {role} buffers")
            a, b = base[role] + i, p.value
        params.extend((p.kind, a, b))
    buffers, flat_layouts = [], []
    align = max(1, min(int(launch.alignment), 256))
    aligns = [align] * (n_in + n_out) + [
        max(1, min(int(launch.scratch_align[i]) if i < len(launch.scratch_align) else 16, 256))
        for i in range(len(scratch_avals))]
    for aval, layout, align in zip(avals, layouts, aligns):
        dt = np.dtype(aval.dtype).name
        if dt not in _XLA_DTYPES:
            raise ValueError(f"{launch.kernel}: no XLA FFI dtype for {dt}")
        rank = len(aval.shape)
        buffers.extend((_XLA_DTYPES[dt], rank, align))
        flat_layouts.extend(_layout_minor_to_major(layout, rank))
    i64 = lambda xs: np.asarray(list(xs), dtype=np.int64)
    return dict(cubin=bytes(launch.cubin), kernel=launch.kernel, module_key=np.int64(launch.module_key),
                grid=i64(launch.grid), block=i64(tuple(launch.block) + ((1,) if launch.pdl else ())),
                cluster=i64(launch.cluster),
                smem=np.int64(launch.shared_mem), params=i64(params), buffers=i64(buffers),
                layouts=i64(flat_layouts))


@dataclass(frozen=True)
class _U8:
    n: int

    @property
    def shape(self):
        return (self.n,)

    @property
    def dtype(self):
        import numpy as np
        return np.dtype(np.uint8)


def call(launch: Launch, operands: Sequence[Any], out_avals: Sequence[Any], *,
         in_layouts: Optional[Sequence[Optional[Sequence[int]]]] = None,
         out_layouts: Optional[Sequence[Optional[Sequence[int]]]] = None,
         target: str = TARGET) -> Tuple[Any, ...]:
    """Emit the custom call for `launch` (inside a lowering or jit); returns the outputs (no scratch).

    Layouts are major-to-minor dimension orders (None = row-major), as jax.ffi.ffi_call takes them.
    """
    operands, in_layouts = _with_zeroed(launch, operands, in_layouts)
    return _emit(target, attributes, launch, launch.scratch_bytes, operands, out_avals, in_layouts, out_layouts)


def _emit(target: str, make_attributes, described: Any, scratch_bytes: Sequence[int], operands: Sequence[Any],
          out_avals: Sequence[Any], in_layouts, out_layouts) -> Tuple[Any, ...]:
    """The jax.ffi.ffi_call of one described call (a Launch or a TvmFfiCall, whose attributes
    make_attributes encodes), with its scratch results appended and dropped again."""
    import jax
    import numpy as np

    in_layouts = list(in_layouts) if in_layouts is not None else [None] * len(operands)
    out_layouts = list(out_layouts) if out_layouts is not None else [None] * len(out_avals)
    attrs = make_attributes(described, [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in operands], out_avals,
                            in_layouts, out_layouts)
    results = [jax.ShapeDtypeStruct(tuple(a.shape), a.dtype) for a in out_avals]
    results += [jax.ShapeDtypeStruct((n,), np.uint8) for n in scratch_bytes]
    outs = jax.ffi.ffi_call(target, results, input_layouts=in_layouts,
                            output_layouts=out_layouts + [None] * len(scratch_bytes))(*operands, **attrs)
    return tuple(outs[:len(out_avals)])


# ---------------------------------------------------------------------------------------------
# TVM-FFI calls (CuTe kernels)

_keepalive: Dict[int, Any] = {}            # handle -> function: lowered modules hold raw handles
_TOKEN = int.from_bytes(os.urandom(8), "little", signed=True) or 1


def _handle(function: Any) -> int:
    handle = int(function.__chandle__())
    _keepalive[handle] = function
    return handle


def tvm_attributes(tc: TvmFfiCall, in_avals, out_avals, in_layouts, out_layouts) -> Dict[str, Any]:
    import numpy as np
    fake = Launch(cubin=b"", kernel="tvm", grid=(1, 1, 1), block=(1, 1, 1), params=(),
                  scratch_bytes=tc.scratch_bytes, alignment=tc.alignment)
    base = attributes(fake, in_avals, out_avals, in_layouts, out_layouts)
    n_in, n_out = len(in_avals), len(out_avals)
    offsets = {"in": 0, "out": n_in, "scratch": n_in + n_out}
    counts = {"in": n_in, "out": n_out, "scratch": len(tc.scratch_bytes)}
    args, views = [], []
    for a in tc.args:
        x, y = a.value, 0
        if a.kind == _A_TENSOR:
            role, i = a.ref
            if role not in offsets or not 0 <= i < counts[role]:
                raise ValueError(f"TVM-FFI call: argument {a} names {role} buffer {i} of {counts.get(role, 0)}")
            x, y = offsets[role] + i, -1
            if a.view is not None:
                y = len(views)
                views.extend((len(a.view[0]),) + a.view[0] + a.view[1])
        args.extend((a.kind, x, y))
    i64 = lambda xs: np.asarray(list(xs), dtype=np.int64)
    return dict(function=np.int64(_handle(tc.function)), token=np.int64(_TOKEN), args=i64(args),
                views=i64(views or [0]), buffers=base["buffers"], layouts=base["layouts"])


def default_tvm_target() -> str:
    """TVM_GRAPH_TARGET (XLA may record the call into a CUDA graph; on the H200 a cold process's
    first jit call works under capture, tests/test_jax_gpu.py), or TVM_TARGET when
    $XGEMM_JAX_TVM_GRAPH=0 keeps CuTe calls out of XLA's command buffers."""
    return TVM_TARGET if os.environ.get("XGEMM_JAX_TVM_GRAPH", "") == "0" else TVM_GRAPH_TARGET


def _with_zeroed(tc: Any, operands: Sequence[Any], in_layouts):
    """The operands and input layouts with the call's zero-filled int32 buffers (TvmFfiCall.zeroed,
    Launch.zeroed) appended."""
    if not tc.zeroed:
        return operands, in_layouts
    import jax.numpy as jnp
    operands = list(operands) + [jnp.zeros((n,), jnp.int32) for n in tc.zeroed]
    if in_layouts is not None:
        in_layouts = list(in_layouts) + [None] * len(tc.zeroed)
    return operands, in_layouts


def call_tvm_ffi(tc: TvmFfiCall, operands: Sequence[Any], out_avals: Sequence[Any], *,
                 in_layouts=None, out_layouts=None, target: Optional[str] = None) -> Tuple[Any, ...]:
    """Emit the TVM-FFI custom call (inside a lowering or jit); returns the outputs (no scratch)."""
    load()      # the process token must be set before such a module can run
    operands, in_layouts = _with_zeroed(tc, operands, in_layouts)
    return _emit(target or default_tvm_target(), tvm_attributes, tc, tc.scratch_bytes, operands, out_avals,
                 in_layouts, out_layouts)


# ---------------------------------------------------------------------------------------------
# The peer exchange (copy-engine collective-permute)

@dataclass(frozen=True)
class Route:
    """Who receives from whom: `groups` of local device ordinals, each in rank order (one group per
    combination of the mesh's other axes), and per rank the rank it receives from. `channel` is
    unique per op in the process: the calls of one group meet on it."""
    channel: int
    groups: Tuple[Tuple[int, ...], ...]
    sources: Tuple[int, ...]


@dataclass(frozen=True)
class Into:
    """An exchange that receives into rows of a 2-D (rows, N) result instead of a buffer of its own:
    the sender's piece lands at sender_rank * block_rows + chunk_row and, with `local`, this rank's
    own send at rank * block_rows + chunk_row (the ranks' blocks of rows, computed where the rank is
    known: in the handler). The result is the `dest` operand updated in place (aliased) or, with no
    dest, a new buffer whose other rows are unset until later exchanges fill them."""
    rows: int
    block_rows: int
    chunk_row: int
    local: bool


def _exchange_attributes(route: Route, send_index: int, recv_index: int, into: Optional[Into],
                         row_bytes: int) -> Dict[str, Any]:
    import numpy as np
    i64 = lambda xs: np.asarray(list(xs), dtype=np.int64)
    where = [0, 0, 0] if into is None else [into.block_rows * row_bytes, into.chunk_row * row_bytes, int(into.local)]
    return dict(channel=np.int64(route.channel), group_size=np.int64(len(route.sources)),
                devices=i64(d for g in route.groups for d in g), sources=i64(route.sources),
                exchange=i64([send_index, recv_index] + where))


def exchange_result(send_shape: Sequence[int], into: Optional[Into]) -> Tuple[int, ...]:
    """The shape an exchange returns: send's, or the (rows, N) result it receives into."""
    if into is None:
        return tuple(send_shape)
    if len(send_shape) != 2:
        raise ValueError(f"exchange into a result: send must be 2-D (rows, N), got {tuple(send_shape)}")
    return (into.rows, send_shape[1])


def call_exchange(route: Route, send: Any, *, into: Optional[Into] = None, dest: Any = None,
                  tc: Optional[TvmFfiCall] = None, operands: Sequence[Any] = (), out_avals: Sequence[Any] = (),
                  in_layouts=None, platform: str = "cuda") -> Tuple[Any, ...]:
    """One custom call: what this rank receives (its source rank's `send`; see Into for receiving
    into rows of a result, `dest` being that result so far) and, with `tc`, the TVM-FFI call's
    outputs, computed on XLA's stream while the copy runs. Returns (*outs, received).
    platform "cpu": the host test variant (exchange only)."""
    import jax
    import numpy as np
    if dest is not None and into is None:
        raise ValueError("call_exchange: dest needs into")
    recv_aval = jax.ShapeDtypeStruct(exchange_result(send.shape, into), send.dtype)
    if tc is not None:
        operands, in_layouts = _with_zeroed(tc, operands, in_layouts)
    row_bytes = int(send.shape[-1]) * np.dtype(send.dtype).itemsize if send.ndim else 0
    operands = list(operands) + [send] + ([dest] if dest is not None else [])
    out_avals = [jax.ShapeDtypeStruct(tuple(a.shape), a.dtype) for a in out_avals]
    n_in, n_out = len(operands), len(out_avals) + 1
    send_index = n_in - 1 - (dest is not None)
    attrs = _exchange_attributes(route, send_index, n_in + n_out - 1, into, row_bytes)
    aliases = {n_in - 1: n_out - 1} if dest is not None else {}
    if platform == "cpu":
        if tc is not None:
            raise ValueError("call_exchange: the host test variant exchanges only")
        return tuple(jax.ffi.ffi_call(EXCHANGE_HOST_TEST_TARGET, [recv_aval], input_output_aliases=aliases)(
            *operands, **attrs))
    load()
    n_extra = 1 + (dest is not None)
    in_layouts = (list(in_layouts) if in_layouts is not None else [None] * (n_in - n_extra)) + [None] * n_extra
    if tc is None:                   # exchange only: no function to call
        zero = np.asarray([0, 0, 0], dtype=np.int64)
        attrs.update(function=np.int64(0), token=np.int64(_TOKEN), args=zero, views=zero, buffers=zero,
                     layouts=zero)
        scratch = ()
    else:
        attrs.update(tvm_attributes(tc, [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in operands],
                                    out_avals + [recv_aval], in_layouts, [None] * n_out))
        scratch = tc.scratch_bytes
    results = out_avals + [recv_aval] + [jax.ShapeDtypeStruct((n,), np.uint8) for n in scratch]
    outs = jax.ffi.ffi_call(EXCHANGE_TARGET, results, input_layouts=in_layouts,
                            output_layouts=[None] * (n_out + len(scratch)),
                            input_output_aliases=aliases)(*operands, **attrs)
    return tuple(outs[:n_out])


# ---------------------------------------------------------------------------------------------
# Building and loading

def _build(sources: Sequence[Path], name: str, include_dirs: Sequence[str], libs: Sequence[str]) -> Path:
    """Compile `sources` (keyed on the headers of include_dirs too) unless built already."""
    flags = (*_CXXFLAGS, *(f"-I{d}" for d in include_dirs))
    return native_build.build(sources, name, flags, native_build.headers_fingerprint(include_dirs), libs)


def build() -> Path:
    """Build (or find) the handler library; returns its path."""
    import jax.ffi
    src = source_dir()
    return _build([src / "xgemm_ffi.cc", src / "cuda_min.h", src / "foreign_abi.h", src / "peer_exchange.h"],
                  "xgemm_ffi", [jax.ffi.include_dir()], ["-ldl"])


def build_fake_driver() -> Path:
    """The host stand-in for libcuda.so.1 used by the CPU tests of the handler."""
    src = source_dir() / "testing" / "fake_libcuda.cc"
    return _build([src], "fake_libcuda", [], [])


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_registered: set = set()


def load() -> ctypes.CDLL:
    global _lib
    with _lock:
        if _lib is None:
            lib = ctypes.CDLL(str(build()))
            lib.XgemmFfiAbiVersion.restype = ctypes.c_int64
            lib.XgemmFfiModulesLoaded.restype = ctypes.c_int64
            lib.XgemmFfiLaunchCounts.argtypes = [ctypes.POINTER(ctypes.c_int64)]
            lib.XgemmFfiSetDriverPath.argtypes = [ctypes.c_char_p]
            lib.XgemmFfiSetProcessToken.argtypes = [ctypes.c_int64]
            for sym in ("XgemmCubinLaunchExecute", "XgemmCubinLaunchInitialize", "XgemmCubinLaunchHost",
                        "XgemmTvmFfiCallExecute", "XgemmTvmFfiCallGraphExecute", "XgemmTvmFfiCallHost",
                        "XgemmExchangeCallExecute", "XgemmExchangeHost"):
                getattr(lib, sym).restype = ctypes.c_void_p
            if lib.XgemmFfiAbiVersion() != ABI_VERSION:
                raise RuntimeError(f"xgemm FFI: library ABI {lib.XgemmFfiAbiVersion()} != {ABI_VERSION}; "
                                   f"delete {cache_dir()} and retry")
            lib.XgemmFfiSetProcessToken(_TOKEN)
            _lib = lib
        return _lib


def _traits_cmd_buffer() -> Dict[str, Any]:
    try:
        from jaxlib.xla_client import CustomCallTargetTraits
        return {"traits": CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE}
    except (ImportError, AttributeError):    # traits also travel in the handler's own metadata
        return {}


def register() -> None:
    """Register the CUDA targets with XLA (idempotent). Call it before running a deserialized export."""
    import jax.ffi
    with _lock:
        if TARGET in _registered:
            return
    lib = load()
    handlers = {"initialize": jax.ffi.pycapsule(lib.XgemmCubinLaunchInitialize),
                "execute": jax.ffi.pycapsule(lib.XgemmCubinLaunchExecute)}
    jax.ffi.register_ffi_target(TARGET, handlers, platform="CUDA", api_version=1, **_traits_cmd_buffer())
    # TVM_TARGET: the same handler, not declared graph-compatible ($XGEMM_JAX_TVM_GRAPH=0)
    jax.ffi.register_ffi_target(TVM_TARGET, jax.ffi.pycapsule(lib.XgemmTvmFfiCallExecute), platform="CUDA",
                                api_version=1)
    jax.ffi.register_ffi_target(TVM_GRAPH_TARGET, jax.ffi.pycapsule(lib.XgemmTvmFfiCallGraphExecute),
                                platform="CUDA", api_version=1, **_traits_cmd_buffer())
    jax.ffi.register_ffi_target(EXCHANGE_TARGET, jax.ffi.pycapsule(lib.XgemmExchangeCallExecute),
                                platform="CUDA", api_version=1)
    with _lock:
        _registered.update((TARGET, TVM_TARGET, TVM_GRAPH_TARGET, EXCHANGE_TARGET))


def register_exchange_host_test() -> None:
    """Tests only: the peer exchange's host variant for XLA:CPU (fake devices of one process);
    it needs no driver. After this, jax_sharding's ring may route K-shard sums through it."""
    import jax.ffi
    lib = load()
    with _lock:
        if EXCHANGE_HOST_TEST_TARGET in _registered:
            return
        jax.ffi.register_ffi_target(EXCHANGE_HOST_TEST_TARGET, jax.ffi.pycapsule(lib.XgemmExchangeHost),
                                    platform="cpu", api_version=1)
        _registered.add(EXCHANGE_HOST_TEST_TARGET)


def exchange_host_test_registered() -> bool:
    return EXCHANGE_HOST_TEST_TARGET in _registered


def register_host_test() -> ctypes.CDLL:
    """Tests only: route the handler to the fake driver and register its host variant for XLA:CPU.

    Returns the fake driver library (its fake_cuda_stats() reports loads/launches/last config).
    Must run before anything in the process launches through the real driver.
    """
    import jax.ffi
    fake_path = build_fake_driver()
    lib = load()
    if HOST_TEST_TARGET not in _registered:
        if lib.XgemmFfiSetDriverPath(str(fake_path).encode()) != 0:
            raise RuntimeError("xgemm FFI: the CUDA driver is already open in this process; "
                               "run the host test in a fresh process")
        jax.ffi.register_ffi_target(HOST_TEST_TARGET, jax.ffi.pycapsule(lib.XgemmCubinLaunchHost),
                                    platform="cpu", api_version=1)
        jax.ffi.register_ffi_target(TVM_HOST_TEST_TARGET, jax.ffi.pycapsule(lib.XgemmTvmFfiCallHost),
                                    platform="cpu", api_version=1)
        _registered.update((HOST_TEST_TARGET, TVM_HOST_TEST_TARGET))
    fake = ctypes.CDLL(str(fake_path))
    fake.fake_cuda_stats.argtypes = [ctypes.POINTER(ctypes.c_int64)]
    return fake


def launch_counts() -> Tuple[int, int]:
    """(launches the handlers made so far -- cubin launches and TVM-FFI calls --, of them those
    recorded while XLA captured a CUDA graph)."""
    out = (ctypes.c_int64 * 2)()
    load().XgemmFfiLaunchCounts(out)
    return out[0], out[1]


def fake_stats(fake: ctypes.CDLL) -> Dict[str, Any]:
    out = (ctypes.c_int64 * 15)()
    fake.fake_cuda_stats(out)
    v = list(out)
    return {"loads": v[0], "set_attribute": v[1], "launches": v[2], "max_smem_attr": v[3],
            "non_portable_cluster": v[4], "grid": tuple(v[5:8]), "block": tuple(v[8:11]),
            "cluster": tuple(v[11:14]), "smem": v[14]}


if __name__ == "__main__":     # python -m xgemm.jax.ffi : build and print the library path
    print(build())
