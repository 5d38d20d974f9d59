"""Device buffers a kernel keeps between launches: split-K's float32 workspace and int32 flags.

One pair per (device, stream), allocated stream-ordered on that stream and never freed while the
process runs (cuBLAS keeps a workspace per handle the same way). The flags start at zero and every
split-K launch leaves them at zero again (cute_gemm_sm90_build.Sm90Gemm._split_sum, gluon_splitk's
stream-K kernel), so launches
on one stream share them without a memset; launches on two streams get two pairs. A pair grows by
a new allocation, the old one freed stream-ordered behind the launches already queued.

None where the buffers cannot be had here: a stream being captured into a CUDA graph while its
pair is missing or too small (an allocation there would belong to the graph); the caller runs the
unsplit kernel instead.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from xgemm.arrays.views import ArrayView
from xgemm.core.problem import Device
from xgemm.runtime import driver


@dataclass
class _Pair:
    work: int = 0          # device pointers
    flags: int = 0
    work_elems: int = 0
    flag_count: int = 0


_lock = threading.Lock()
_pairs: Dict[Tuple[int, int], _Pair] = {}


def _view(device: Device, ptr: int, n: int, dtype: str, itemsize: int) -> ArrayView:
    return ArrayView(obj=None, framework="other", device=device, ptr=ptr, shape=(n,), strides=(1,), dtype=dtype,
                     itemsize=itemsize, readonly=False)


def split_k(device: Device, stream: int, work_elems: int, flag_count: int) -> Optional[Tuple[ArrayView, ArrayView]]:
    """(workspace of at least work_elems float32 values, as bytes; zeroed int32 flags of at least
    flag_count) for launches on `stream`, or None (module docstring)."""
    key = (device.index, int(stream or 0))
    with _lock:
        pair = _pairs.setdefault(key, _Pair())
        if pair.work_elems < work_elems or pair.flag_count < flag_count:
            driver.bind_thread(device.index)
            if driver.stream_capturing(stream):
                return None
            work_elems = max(work_elems, pair.work_elems)
            flag_count = max(flag_count, pair.flag_count, 1024)
            work = driver.mem_alloc_async(4 * work_elems + 4 * flag_count, stream)
            flags = work + 4 * work_elems
            driver.memset_d32_async(flags, 0, flag_count, stream)
            if pair.work:
                driver.mem_free_async(pair.work, stream)
            pair.work, pair.flags, pair.work_elems, pair.flag_count = work, flags, work_elems, flag_count
        return (_view(device, pair.work, 4 * pair.work_elems, "uint8", 1),
                _view(device, pair.flags, pair.flag_count, "int32", 4))
