"""python -m xgemm info | explain | build-cache

  info          frameworks, GPU (or none), and which kernel families can run here
  explain       the plan for a sample problem on this machine's GPU, or CPU (kernel, policy, declines, copies)
  build-cache   compile the kernel set ahead of time (no GPU needed) into the on-disk cache
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import xgemm
from xgemm.core import registry
from xgemm.runtime import cute_cache, driver, gluon_cache
from xgemm.runtime import pack as cache_pack
from xgemm.torch import native as torch_native


def _version(module: str) -> str:
    if importlib.util.find_spec(module) is None:
        return "not installed"
    try:
        from importlib.metadata import version
        dist = {"cutlass": "nvidia-cutlass-dsl", "cuda": "cuda-python", "jax": "jax", "torch": "torch",
                "cupy": "cupy-cuda13x", "triton": "triton", "numpy": "numpy"}[module]
        return version(dist)
    except Exception:
        return "installed"


def _gpus() -> list:
    """GPUs through the driver (xgemm.runtime.driver: ctypes on libcuda; no framework, no cuda-python)."""
    try:
        count = driver.device_count()
    except driver.CudaError:        # no NVIDIA driver here, or it finds no device
        return []
    gpus = []
    for i in range(count):
        major, minor = driver.capability(i)
        gpus.append(f"cuda:{i} {driver.device_name(i)} sm_{major}{minor} {driver.sm_count(i)} SMs")
    return gpus


def info() -> dict:
    gpus = _gpus()
    families = {}
    for op, names in registry.TABLE.items():
        for name in names:
            spec = importlib.util.find_spec(registry.module_name(name))
            families[f"{op}/{name}"] = "present" if spec is not None else "not in this install"
    needs = {"CuTe-DSL kernels (cute_*)": "cutlass", "Gluon build (gluon_*, build-cache)": "triton"}
    return {
        "xgemm": __import__("xgemm").__version__,
        "python": sys.version.split()[0],
        "frameworks": {m: _version(m) for m in ("numpy", "torch", "jax", "cupy")},
        "compilers": {m: _version(m) for m in ("cutlass", "triton", "cuda")},
        "gpus": gpus or ["none: every call runs on the embedded default (the framework's own op)"],
        "kernels": families,
        "kernel families need": {k: _version(v) for k, v in needs.items()},
    }


def _sample(shape, dtype: str):
    """An uninitialized array to plan for: a torch (or CuPy) array on the first GPU where there is
    one, so that the plan is the GPU's, else NumPy's (bfloat16 from ml_dtypes)."""
    if importlib.util.find_spec("torch") is not None:
        import torch
        if torch.cuda.is_available():
            return torch.empty(shape, dtype=getattr(torch, dtype), device="cuda")
    if dtype != "bfloat16" and importlib.util.find_spec("cupy") is not None:
        import cupy
        try:
            if cupy.cuda.runtime.getDeviceCount():
                return cupy.empty(shape, dtype)
        except cupy.cuda.runtime.CUDARuntimeError:
            pass
    import numpy as np
    if dtype == "bfloat16":
        import ml_dtypes
        return np.zeros(shape, ml_dtypes.bfloat16)
    return np.zeros(shape, dtype)


def _explain(args) -> None:
    m, n, k = args.m, args.n, args.k
    print(xgemm.explain(_sample((m, k), args.dtype), _sample((k, n), args.dtype)))
    print(xgemm.explain(_sample((m, n), args.dtype)))


def _build_cache(args) -> None:
    built = []
    try:
        built += gluon_cache.build(arch=args.arch)
    except ImportError as exc:
        print(f"gluon kernels skipped: {exc}", file=sys.stderr)
    try:
        built += cute_cache.prebuild(arch=args.arch, jobs=args.jobs, progress=print)
    except ImportError as exc:
        print(f"CuTe kernels skipped: {exc}", file=sys.stderr)
    print(f"{len(built)} kernel entries in the cache")
    if importlib.util.find_spec("torch") is not None:      # built against this machine's torch
        try:
            print(f"native torch fast path: {torch_native.library_path(build=True)}")
        except RuntimeError as exc:                         # no compiler: the Python fast path serves
            print(f"native torch fast path skipped: {exc}", file=sys.stderr)
    if args.pack:
        dirs = cache_pack.pack(args.pack)
        print(f"packed {len(dirs)} cache directories into {args.pack} "
              f"({os.path.getsize(args.pack) / 2**20:.1f} MiB): " + ", ".join(map(str, dirs)))


def _extent(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; a dimension is 0 or more")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xgemm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="frameworks, GPUs and kernel families available")
    p = sub.add_parser("explain", help="the plan for an M x N x K matmul and an M x N softmax, on the first "
                                       "GPU where torch or CuPy sees one")
    # three positionals, not one of nargs=3: argparse cannot print a tuple metavar's help
    for dim in "MNK":
        p.add_argument(dim.lower(), nargs="?", type=_extent, default=256, metavar=dim, help=f"{dim} (default 256)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    p = sub.add_parser("build-cache", help="compile the kernel set ahead of time (no GPU needed)")
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compile processes")
    p.add_argument("--pack", metavar="FILE", default="",
                   help="then write FILE (.tar.xz): the cache directories of the installed sources only "
                        "(xgemm/runtime/pack.py), to carry to a GPU machine")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "info":
            print(json.dumps(info(), indent=2))
        elif args.cmd == "explain":
            _explain(args)
        else:
            _build_cache(args)
    except xgemm.errors.XgemmError as exc:       # a bad override or input: its message, not a traceback
        print(f"python -m xgemm {args.cmd}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
