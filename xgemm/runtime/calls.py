"""What a kernel hands the JAX wing to run inside jax.jit: plain descriptions, no JAX.

A kernel's `jax_lowering(problem, policy)` hook returns one of these; xgemm/jax/lowering.py turns
it into an XLA custom call of the native handler (ffi/xgemm_ffi.cc, built by xgemm/jax/ffi.py):
  Launch + Param       a prebuilt cubin (Gluon/Triton) launched by xgemm_cubin_launch_v1;
  TvmFfiCall + Arg     a TVM-FFI function (a CuTe kernel) called by xgemm_tvm_ffi_call_v1.
Buffers are named by role and index: inputs (a, b[, c]) / (x,), then outputs, then scratch.
Plain value classes, not dataclasses or NamedTuples: every kernel module imports these, and each
generated class costs a fresh process's first call about a millisecond (benchmarks/first_call.py).
"""
from __future__ import annotations

import struct
from typing import Any, Optional, Sequence, Tuple


class _Value:
    """Immutable record: the fields named in _fields, set once by __init__, compared and hashed as
    a tuple of them."""
    __slots__ = ()
    _fields: Tuple[str, ...] = ()

    def _set(self, *values) -> None:
        for name, value in zip(self._fields, values):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _tuple(self) -> tuple:
        return tuple(getattr(self, f) for f in self._fields)

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other._tuple() == self._tuple()

    def __hash__(self) -> int:
        return hash((type(self).__name__,) + self._tuple())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields) + ")"


# Parameter kinds, as in ffi/xgemm_ffi.cc
_PTR, _I32, _I64, _F32, _F64, _NULL, _DIM_I32, _DIM_I64, _STRIDE_I64 = range(9)


# ---------------------------------------------------------------------------------------------
# Launching a prebuilt cubin

class Param(_Value):
    """One kernel parameter. Buffers are named by role: input i, output i, scratch i.
    ref: ("in" | "out" | "scratch", index) for buffer kinds; value: a literal (bits for floats) or
    the dim for DIM/STRIDE kinds."""
    __slots__ = _fields = ("kind", "ref", "value")

    def __init__(self, kind: int, ref: Tuple[str, int] = ("", 0), value: int = 0):
        self._set(kind, ref, value)

    @staticmethod
    def input(i: int) -> "Param":
        return Param(_PTR, ("in", i))

    @staticmethod
    def output(i: int = 0) -> "Param":
        return Param(_PTR, ("out", i))

    @staticmethod
    def scratch(i: int = 0) -> "Param":
        return Param(_PTR, ("scratch", i))

    @staticmethod
    def i32(v: int) -> "Param":
        return Param(_I32, value=int(v))

    @staticmethod
    def i64(v: int) -> "Param":
        return Param(_I64, value=int(v))

    @staticmethod
    def f32(v: float) -> "Param":
        return Param(_F32, value=struct.unpack("<I", struct.pack("<f", float(v)))[0])

    @staticmethod
    def f64(v: float) -> "Param":
        return Param(_F64, value=struct.unpack("<q", struct.pack("<d", float(v)))[0])

    @staticmethod
    def null() -> "Param":
        return Param(_NULL)

    @staticmethod
    def dim(role: str, i: int, d: int, *, bits: int = 32) -> "Param":
        """Dim d of a buffer's (DLPack) shape, read at run time by the handler."""
        return Param(_DIM_I32 if bits == 32 else _DIM_I64, (role, i), d)

    @staticmethod
    def stride(role: str, i: int, d: int) -> "Param":
        """Stride (elements, int64) of dim d of a buffer, from the layout the lowering requested."""
        return Param(_STRIDE_I64, (role, i), d)


class Launch(_Value):
    """A prebuilt kernel and how to launch it: what a cubin kernel's `jax_lowering` returns.
    scratch_bytes: extra uint8 results (e.g. Triton's global scratch), each aligned to
    scratch_align (default 16); alignment: the pointer alignment (bytes) the kernel assumes for its
    operands; zeroed: int32 element counts of zero-filled buffers passed after the call's own
    inputs (Param.input(n_inputs + i)), which the kernel may write as long as it leaves them zero
    (stream-K's flags); pdl: launched with programmatic dependent launch (the kernel waits for its
    predecessor with griddepcontrol.wait before touching memory)."""
    __slots__ = _fields = ("cubin", "kernel", "grid", "block", "params", "cluster", "shared_mem", "scratch_bytes",
                           "alignment", "scratch_align", "notes", "zeroed", "pdl")

    def __init__(self, cubin: bytes, kernel: str, grid: Tuple[int, int, int], block: Tuple[int, int, int],
                 params: Tuple[Param, ...], cluster: Tuple[int, int, int] = (1, 1, 1), shared_mem: int = 0,
                 scratch_bytes: Tuple[int, ...] = (), alignment: int = 16, scratch_align: Tuple[int, ...] = (),
                 notes: Tuple[str, ...] = (), zeroed: Tuple[int, ...] = (), pdl: bool = False):
        self._set(cubin, kernel, grid, block, params, cluster, shared_mem, scratch_bytes, alignment, scratch_align,
                  notes, zeroed, pdl)

    @property
    def module_key(self) -> int:
        import hashlib  # lazy: only jit lowerings of cubins need it, not import xgemm
        digest = hashlib.sha256(self.cubin + b"\0" + self.kernel.encode()).digest()
        return int.from_bytes(digest[:8], "little", signed=True)


_META_KINDS = {"i32": (_I32, _DIM_I32), "i64": (_I64, _DIM_I64, _STRIDE_I64), "fp32": (_F32,), "fp64": (_F64,)}


def triton_launch(cubin: bytes, meta: dict, clusters: int, args: Sequence[Param], *, alignment: int = 16,
                  scratch_bytes: Sequence[int] = (), zeroed: Sequence[int] = ()) -> Launch:
    """A Launch of a Triton/Gluon cubin described by gluon_cache's JSON metadata.

    `clusters` programs of num_ctas CTAs each (grid x = clusters * num_ctas, the cluster
    attribute (num_ctas, 1, 1)), 32 * num_warps threads, meta["shared"] dynamic shared memory, and
    `args` for the kernel's own parameters; the two trailing scratch pointers Triton appends are
    added here: a scratch result of clusters * num_ctas * size bytes, or null when the size is 0.
    scratch_bytes: the kernel's own scratch buffers (Param.scratch(0), ...: Triton's come after
    them, 16-byte aligned); zeroed: as Launch's.
    """
    params = meta["params"]
    if [p["name"] for p in params[-2:]] != ["global_scratch", "profile_scratch"] or len(args) != len(params) - 2:
        raise ValueError(f"{meta.get('name')}: takes {[p['name'] for p in params[:-2]]} plus two scratch "
                         f"pointers; got {len(args)} args")
    for p, a in zip(params, args):
        t = p.get("type", "")
        ok = a.kind in (_PTR, _NULL) if t.startswith("*") else a.kind in _META_KINDS.get(t, ())
        if not ok:
            raise ValueError(f"{meta.get('name')}: parameter {p['name']} ({t}) cannot take {a}")
    ctas = int(meta.get("num_ctas", 1))
    scratch, aligns, tail = [int(n) for n in scratch_bytes], [16] * len(scratch_bytes), []
    for what in ("global", "profile"):
        size = int(meta.get(f"{what}_scratch_size", 0))
        if size:
            tail.append(Param.scratch(len(scratch)))
            scratch.append(clusters * ctas * size)
            aligns.append(int(meta.get(f"{what}_scratch_align", 1)))
        else:
            tail.append(Param.null())
    return Launch(cubin=cubin, kernel=meta["name"], grid=(clusters * ctas, 1, 1),
                  block=(32 * int(meta["num_warps"]), 1, 1), params=tuple(args) + tuple(tail),
                  cluster=(ctas, 1, 1), shared_mem=int(meta.get("shared", 0)), scratch_bytes=tuple(scratch),
                  scratch_align=tuple(aligns), alignment=alignment, zeroed=tuple(zeroed),
                  pdl=bool(meta.get("options", {}).get("launch_pdl", False)))


# ---------------------------------------------------------------------------------------------
# Calling a TVM-FFI function (CuTe kernels)

_A_TENSOR, _A_INT, _A_F64, _A_NONE, _A_STREAM, _A_BOOL = range(6)


class Arg(_Value):
    """One argument of a TVM-FFI call: a buffer as DLTensor* (optionally a strided view of it: view
    is (shape, strides in elements)), a scalar, None, or XLA's stream."""
    __slots__ = _fields = ("kind", "ref", "value", "view")

    def __init__(self, kind: int, ref: Tuple[str, int] = ("", 0), value: int = 0,
                 view: Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]] = None):
        self._set(kind, ref, value, view)

    @staticmethod
    def tensor(role: str, i: int = 0, shape: Optional[Sequence[int]] = None,
               strides: Optional[Sequence[int]] = None) -> "Arg":
        """Buffer `i` of `role` ("in" | "out" | "scratch"); with shape/strides, that view of its data."""
        view = None if shape is None else (tuple(int(d) for d in shape), tuple(int(s) for s in strides))
        return Arg(_A_TENSOR, (role, i), view=view)

    @staticmethod
    def i64(v: int) -> "Arg":
        return Arg(_A_INT, value=int(v))

    @staticmethod
    def boolean(v: bool) -> "Arg":
        return Arg(_A_BOOL, value=int(bool(v)))

    @staticmethod
    def f64(v: float) -> "Arg":
        return Arg(_A_F64, value=struct.unpack("<q", struct.pack("<d", float(v)))[0])

    @staticmethod
    def none() -> "Arg":
        return Arg(_A_NONE)

    @staticmethod
    def stream() -> "Arg":
        return Arg(_A_STREAM)


class TvmFfiCall(_Value):
    """A TVM-FFI function (tvm_ffi.Function) and its arguments: what a CuTe kernel's `jax_lowering` returns.
    scratch_bytes: byte buffers XLA allocates for the call (Arg.tensor("scratch", i)), uninitialised;
    zeroed: int32 element counts of zero-filled buffers passed after the call's own inputs (its
    Arg.tensor("in", n_inputs + i)), which the function may write as long as it leaves them zero
    (split-K's flags)."""
    __slots__ = _fields = ("function", "args", "alignment", "scratch_bytes", "zeroed")

    def __init__(self, function: Any, args: Tuple[Arg, ...], alignment: int = 16, scratch_bytes: Tuple[int, ...] = (),
                 zeroed: Tuple[int, ...] = ()):
        self._set(function, args, alignment, scratch_bytes, zeroed)
