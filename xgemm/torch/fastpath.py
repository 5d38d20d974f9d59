"""Repeat calls skip planning: eager torch CUDA calls with a signature seen before.

A framework user calls the same GEMM shape thousands of times; validating, classifying and
choosing again each time cost ~70 us of Python on the H200 host (the kernel itself takes a few
us). The first call with a signature runs the full path (api.py); if it needed no copy, no
promotion and no batch folding, its Problem, kernel and Policy are kept under a key of
everything they depend on: shape, strides, dtype, device and 16-byte alignment class of each
operand, alpha/beta, the forced kernel. Anything else (other frameworks, out=, autograd,
torch.compile) misses.

A hit allocates the result and launches. Where the kernel can bind a signature (its `bind`
method, the kernel protocol's optional fourth method), everything its run() derives
from the problem -- launch configuration, compiled function, scalars, strides -- is resolved
once at store time into `go(arrays..., stream)`, and a hit passes only the framework arrays and
the raw stream: no ArrayView, no run(). The result's 16-byte alignment class is part of what
was bound, so a result allocated differently falls back to views + run(). Otherwise a hit makes
views and calls run(), as before.

Where the bound launch also describes itself (`go.native`), the signature is registered with the
native torch fast path (xgemm/torch/native.py, ffi/torch_fastpath.cc), which api.py asks first:
a hit there never reaches Python beyond that call. Signatures stored before that module loaded
are registered at their next hit here.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from xgemm import arrays
from xgemm.core import policy
from xgemm.runtime import driver
from xgemm.torch import native as torch_native

_gemm: dict = {}
_softmax: dict = {}
_LIMIT = 1024


def _offer(entry_key: tuple, table: dict, op: str, forced: Any, s0: Any, s1: Any, a: Any, b: Any, c: Any,
           result: Any, start: bool = True) -> None:
    """Register table[entry_key]'s bound launch natively, once the module is there (then the
    entry's recipe is dropped: nothing left to offer); else, if `start`, start loading it. Stores
    pass start=False: a signature called once never needs the module, and a fresh process's
    first call (issue 3: <= 50 ms) should not pay its load; the first repeat starts it."""
    entry = table.get(entry_key)
    if entry is None or entry[-1] is None:
        return
    if torch_native.active is None:
        if not start:
            return
        torch_native.start()
        if torch_native.active is None:
            return
    torch_native.register(op, forced, s0, s1, a, b, c, result, entry[-1])
    table[entry_key] = entry[:-1] + (None,)

def _torch_cuda(*xs: Any):
    """torch when every x is a plain CUDA tensor that needs no autograd and no trace, else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    tensor = torch.Tensor
    for x in xs:
        if x is not None and (type(x) is not tensor or not x.is_cuda or x.requires_grad):
            return None
    if torch.compiler.is_compiling():
        return None
    return torch


def _sig(t: Any) -> Optional[tuple]:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15)


def _number(v: Any) -> bool:
    return type(v) in (float, int)


def _stream_getter(problem: Any) -> Callable[[int], int]:
    """index -> the current stream of that device as an int: torch's raw getter (one C call;
    torch.cuda.current_stream builds a Stream object) where it exists, else arrays'; first the
    thread is bound to the device's context, as prepare.run does (torch's autograd workers have
    none)."""
    if problem.device.kind != "cuda":
        return lambda index: 0
    raw = getattr(sys.modules["torch"]._C, "_cuda_getCurrentRawStream", None)
    device = problem.device

    def stream(index: int, bind=driver.bind_thread) -> int:
        bind(index)
        return raw(index) if raw is not None else arrays.current_stream("torch", device)
    return stream


def _bind(binder: Optional[Callable], *args: Any) -> Optional[Callable]:
    """binder(*args), or None (views + run() per hit) when there is none or it fails: the call
    that gets here has already run, so a binding problem must cost speed, never the result."""
    if binder is None:
        return None
    try:
        return binder(*args)
    except Exception:       # noqa: BLE001
        return None


def gemm_key(fn: str, a: Any, b: Any, c: Any, alpha: Any, beta: Any) -> Optional[tuple]:
    ta, tb = type(alpha), type(beta)
    if ta is not float and ta is not int or tb is not float and tb is not int or _torch_cuda(a, b, c) is None:
        return None
    return (fn, (a.shape, a.stride(), a.dtype, a.device, a.data_ptr() & 15),
            (b.shape, b.stride(), b.dtype, b.device, b.data_ptr() & 15),
            _sig(c) if beta != 0 else None, alpha, beta, policy.forced_kernel())


def gemm_hit(key: tuple, a: Any, b: Any, c: Any) -> Optional[Any]:
    entry = _gemm.get(key)
    if entry is None:
        return None
    problem, kernel, pol, shape, dtype, device, empty, go, align, stream, index, recipe = entry
    # a.new_empty(shape): a's dtype and device without parsing them (~1 us less than torch.empty)
    result = a.new_empty(shape) if empty is None else empty(shape, dtype=dtype, device=device)
    if go is not None and result.data_ptr() & 15 == align:
        go(a, b, c, result, stream(index))
        if recipe is not None:
            _offer(key, _gemm, key[0], key[-1], key[4], key[5], a, b, c, result)
        return result
    view = arrays.view_torch
    operands = (view(a), view(b), view(c) if problem.c is not None else None)
    kernel.run(problem, pol, operands, view(result), stream(index))
    return result


def gemm_store(key: tuple, prep: Any, result: Any) -> None:
    """Keep the plan of a call that ran a GPU kernel on the caller's own operands, unchanged."""
    plan = prep.plan
    problem = plan.problem
    if (plan.kernel.name == "reference" or plan.copies or problem.batch or
            tuple(result.shape) != (problem.m, problem.n) or len(_gemm) >= _LIMIT):
        return
    a, b, c = prep.operands
    if a.ndim != 2 or b.ndim != 2 or (c is not None and tuple(c.shape) != (problem.m, problem.n)):
        return
    if a.strides != key[1][1] or b.strides != key[2][1] or (key[3] is not None and c.strides != key[3][1]):
        return          # views restrided (extent-1 dims): a bound launch would get the caller's strides
    kernel, pol = plan.kernel, plan.policy
    # bound on the views run() just got: the caller's own tensors (no copies) and the result
    go = _bind(getattr(kernel, "bind", None), problem, pol, prep.operands, prep.out)
    torch = sys.modules["torch"]
    same = result.dtype == a.obj.dtype and result.device == a.obj.device
    _gemm[key] = (problem, kernel, pol, tuple(result.shape), result.dtype, result.device,
                  None if same else torch.empty, go,
                  result.data_ptr() & 15, _stream_getter(problem), problem.device.index,
                  getattr(go, "native", None))
    _offer(key, _gemm, key[0], key[-1], key[4], key[5], a.obj, b.obj, None if c is None else c.obj, result,
           start=False)


def softmax_key(x: Any, axis: Any) -> Optional[tuple]:
    if type(axis) is not int or _torch_cuda(x) is None:
        return None
    return ((x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15), axis, policy.forced_kernel())


def softmax_hit(key: tuple, x: Any) -> Optional[Any]:
    entry = _softmax.get(key)
    if entry is None:
        return None
    problem, kernel, pol, shape, dtype, device, empty, go, align, stream, index, recipe = entry
    result = x.new_empty(shape)             # x's dtype and device, contiguous
    if go is not None and result.data_ptr() & 15 == align:
        go(x, result, stream(index))
        if recipe is not None:
            _offer(key, _softmax, "softmax", key[-1], key[1], 0, x, None, None, result)
        return result
    view = arrays.view_torch
    rows, cols = problem.rows, problem.cols
    kernel.run(problem, pol, (view(x.reshape(rows, cols)),), view(result.view(rows, cols)), stream(index))
    if go is None and align == _UNBOUND:
        # bound on the first hit, which has the caller's x (store time sees only its reshape)
        go = _bind(_bind_softmax, kernel, problem, pol, x, result)
        if key in _softmax:
            _softmax[key] = entry[:7] + (go, result.data_ptr() & 15 if go is not None else _NEVER) + entry[9:11] \
                + (getattr(go, "native", None),)
            _offer(key, _softmax, "softmax", key[-1], key[1], 0, x, None, None, result)
    return result


def softmax_store(key: tuple, prep: Any) -> None:
    plan = prep.plan
    problem = plan.problem
    if (plan.kernel.name == "reference" or plan.copies or problem.axis != len(problem.shape) - 1
            or len(_softmax) >= _LIMIT):
        return
    _softmax[key] = (problem, plan.kernel, plan.policy, tuple(problem.shape), None, None, None,
                     None, _UNBOUND, _stream_getter(problem), problem.device.index, None)


_UNBOUND, _NEVER = -1, -2       # softmax entries' align before binding / when it cannot bind


def _bind_softmax(kernel: Any, problem: Any, pol: Any, x: Any, result: Any) -> Optional[Callable]:
    """The kernel's bind() on the (rows, cols) views run() gets: go(x, y, stream) on the caller's
    tensors (their reshape to rows x cols is the same view on every hit of this signature)."""
    binder = getattr(kernel, "bind", None)
    if binder is None or problem.rows == 0 or problem.cols == 0:
        return None
    try:
        xv, yv = x.view(problem.rows, problem.cols), result.view(problem.rows, problem.cols)
    except RuntimeError:
        return None
    view = arrays.view_torch
    return binder(problem, pol, (view(xv),), view(yv))


def kept(op: str) -> int:
    """How many signatures of op ("gemm" | "softmax") are kept for repeat calls."""
    return len(_gemm if op == "gemm" else _softmax)


def bound(op: str, key: tuple) -> bool:
    """Whether the signature `key` (gemm_key / softmax_key) is kept with a launch bound to it."""
    entry = (_gemm if op == "gemm" else _softmax).get(key)
    return entry is not None and entry[7] is not None


def clear() -> None:
    _gemm.clear()
    _softmax.clear()
    if torch_native.active is not None:
        torch_native.active.clear()


policy.on_change(clear)     # kept plans may name the old table's kernels
