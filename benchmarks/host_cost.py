"""Python cost of a repeat (fast-path) call with the GPU launch stubbed out, on any CPU machine.

    python benchmarks/host_cost.py [--n 20000] [--repeats 5] [--json FILE] [--root CHECKOUT]

--root times the xgemm of another checkout (e.g. `git archive <rev> | tar -x -C /tmp/old`), with
this file's recorders: run it on both trees for a before/after table. (The script then runs
itself again with that checkout first on PYTHONPATH.)

CPU torch tensors are dressed as an sm_90 CUDA device and the lowest launch call is a no-op
recorder (tests/fake_cuda.py says exactly what is stubbed): the TVM-FFI function for the CuTe
kernels, cuLaunchKernelEx for Gluon. What is timed is everything Python does between the user's
call and that launch: fast-path key, plan lookup, result allocation (a CPU torch.empty here),
views, the stream query (stubbed: its real cost is on the GPU host) and the kernel's run().
Each case is checked first: the planned call, the first repeat and a bound repeat must reach
the stubbed launch with identical arguments (pointers named by the buffer they point into).
Best of `repeats` runs of `n` calls; on a busy 2-core machine run it a few times.

    python benchmarks/host_cost.py --gpu [--n 2000 --repeats 3]

on a CUDA machine (no stubs) prints where a repeat call's host time goes: stream query, result
allocation, fast-path key, the bound launch alone, the whole call, and torch's peer op.
Prints one table; --json writes the records. No torch peer: on a CPU machine torch.matmul does
the arithmetic, so its time says nothing about host overhead (benchmarks/overhead.py measures
both on the H200).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _with_root_first() -> None:
    """--root CHECKOUT: run this script again with CHECKOUT first on PYTHONPATH (before xgemm is
    imported), so `import xgemm` finds that checkout's package."""
    if "--root" not in sys.argv:
        return
    root = str(Path(sys.argv[sys.argv.index("--root") + 1]).resolve())
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if path[:1] != [root]:
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, PYTHONPATH=os.pathsep.join([root] + path)))


def _fake_cuda():
    """tests/fake_cuda.py, loaded from its file (tests/ is not a package)."""
    spec = importlib.util.spec_from_file_location("fake_cuda", ROOT / "tests" / "fake_cuda.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fake_cuda"] = mod
    spec.loader.exec_module(mod)
    return mod


_with_root_first()

import torch  # noqa: E402

import xgemm  # noqa: E402
from xgemm.torch import fastpath  # noqa: E402

_fc = _fake_cuda()
Fake, normalize = _fc.Fake, _fc.normalize


def per_call_us(fn, n: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t)
    return best / n * 1e6


def cases():
    torch.manual_seed(0)
    f32 = (torch.randn(256, 256), torch.randn(256, 256))
    bf16 = tuple(t.to(torch.bfloat16) for t in (torch.randn(256, 256), torch.randn(256, 256)))
    x = torch.randn(64, 1024)
    return [
        ("sgemm fp32 256^3", "cute_sgemm", lambda: xgemm.matmul(*f32), f32),
        ("sm90 bf16 256^3", "cute_gemm_sm90", lambda: xgemm.matmul(*bf16), bf16),
        ("softmax fp32 64x1024", "gluon_softmax", lambda: xgemm.softmax(x), (x,)),
    ]


def check(fn, inputs, kernel: str):
    """Three calls (planned, first repeat, bound repeat) must launch the same thing; returns
    (ok, plan line)."""
    with Fake(keep=True) as fake:
        seen = []
        for _ in range(3):
            before = len(fake.calls)
            result = fn()
            seen.append(normalize(fake.calls[before:], {**{f"in{i}": t for i, t in enumerate(inputs)},
                                                        "out": result}))
        stored = len(fastpath._gemm) + len(fastpath._softmax)
        plan = str(xgemm.explain(*inputs)).splitlines()[1].strip()
    ok = stored == 1 and bool(seen[0]) and seen[0] == seen[1] == seen[2] and f"kernel: {kernel}" in plan
    return ok, plan


def gpu_breakdown(n: int, repeats: int) -> None:
    """On a CUDA machine (no stubs): where a repeat call's host time goes. Kernels launch for real;
    back-to-back launches of kernels shorter than the launch cost time the host side."""
    import torch

    def us(fn):
        fn()
        torch.cuda.synchronize()
        v = per_call_us(fn, n, repeats)
        torch.cuda.synchronize()
        return v
    rows = [("torch.cuda.current_stream(0).cuda_stream", us(lambda: torch.cuda.current_stream(0).cuda_stream)),
            ("torch._C._cuda_getCurrentRawStream(0)", us(lambda: torch._C._cuda_getCurrentRawStream(0)))]
    a = torch.randn(256, 256, device="cuda")
    rows += [("torch.empty(256x256, dtype=, device=)",
              us(lambda: torch.empty((256, 256), dtype=torch.float32, device=a.device))),
             ("a.new_empty(256x256)", us(lambda: a.new_empty((256, 256))))]
    for label, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(256, 256, device="cuda").to(dtype), torch.randn(256, 256, device="cuda").to(dtype)
        xgemm.matmul(a, b)
        key = fastpath.gemm_key("matmul", a, b, None, 1.0, 0.0)
        entry = fastpath._gemm.get(key)
        go, out = entry[7], torch.empty(256, 256, device="cuda", dtype=dtype)
        raw = torch._C._cuda_getCurrentRawStream
        rows += [(f"matmul {label} 256^3: xgemm.matmul", us(lambda: xgemm.matmul(a, b))),
                 (f"matmul {label}: fastpath.gemm_key", us(lambda: fastpath.gemm_key("matmul", a, b, None, 1.0, 0.0))),
                 (f"matmul {label}: bound launch go(...)",
                  us(lambda: go(a, b, None, out, raw(0))) if go is not None else float("nan")),
                 (f"matmul {label}: torch.matmul (peer)", us(lambda: torch.matmul(a, b)))]
    x = torch.randn(64, 1024, device="cuda")
    xgemm.softmax(x)
    xgemm.softmax(x)                                         # binds on the first repeat
    entry = fastpath._softmax.get(fastpath.softmax_key(x, -1))
    go, y = entry[7], torch.empty_like(x)
    rows += [("softmax 64x1024: xgemm.softmax", us(lambda: xgemm.softmax(x))),
             ("softmax: bound launch go(...)",
              us(lambda: go(x, y, torch._C._cuda_getCurrentRawStream(0))) if go is not None else float("nan")),
             ("softmax: torch.softmax (peer)", us(lambda: torch.softmax(x, -1)))]
    rows += _driver_rows(us, x, y)
    print(f"{'host time per call on ' + torch.cuda.get_device_name():<48} us")
    for name, v in rows:
        print(f"{name:<48} {v:7.2f}")


def _driver_rows(us, x, y):
    """The softmax kernel's launch below the Launcher: the driver call with the prebuilt parameter
    block (cuLaunchKernelEx, and the legacy cuLaunchKernel where the kernel needs no cluster), and
    a no-op ctypes call into libcuda: what the launcher's own Python costs on top."""
    import ctypes
    from xgemm.runtime import driver
    from xgemm.kernels import gluon_softmax as gs
    lau = next(iter(gs.KERNEL._launchers.values()))[0]
    stream = torch._C._cuda_getCurrentRawStream(0)
    lau(1, stream, x.data_ptr(), y.data_ptr(), 64, 1024, 1024, 1024)          # packs the block
    cfg = lau._config
    rows = [("softmax: launcher(...) alone", us(lambda: lau(1, stream, x.data_ptr(), y.data_ptr(), 64, 1024,
                                                            1024, 1024))),
            ("softmax: cuLaunchKernelEx, block prebuilt",
             us(lambda: lau._launch(lau._config_ref, lau._func, lau._params_addr, None)))]
    lib = ctypes.CDLL("libcuda.so.1")
    legacy = lib.cuLaunchKernel
    u = ctypes.c_uint
    legacy.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    args = (lau._func, cfg.gridDimX, 1, 1, cfg.blockDimX, 1, 1, cfg.sharedMemBytes, stream, lau._params_addr, None)
    if lau.num_ctas == 1:
        rows.append(("softmax: cuLaunchKernel (legacy), same block", us(lambda: legacy(*args))))
    count = ctypes.c_int()
    get_count = driver._fn("cuDeviceGetCount")
    rows.append(("ctypes call of cuDeviceGetCount (floor)", us(lambda: get_count(ctypes.byref(count)))))
    torch.cuda.synchronize()
    assert torch.allclose(y, torch.softmax(x, -1), atol=1e-6), "the timed launches left a wrong softmax"
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--root", default=None, help="checkout whose xgemm is timed (default: the xgemm Python "
                    "imports, e.g. PYTHONPATH=$PWD)")
    ap.add_argument("--gpu", action="store_true", help="on a CUDA machine: real launches, a breakdown")
    args = ap.parse_args()
    if args.gpu:
        return gpu_breakdown(args.n, args.repeats)
    rows = []
    for label, kernel, fn, inputs in cases():
        ok, plan = check(fn, inputs, kernel)
        with Fake(keep=False) as fake:
            fn()                                             # plan once, outside the timing
            fn()                                             # first repeat binds (softmax)
            us = per_call_us(fn, args.n, args.repeats)
            reached = fake.last is not None
        rows.append({"case": label, "kernel": kernel, "xgemm_us": us, "launch_reached": reached,
                     "same_launch_args": ok, "plan": plan})
    print(f"xgemm from {xgemm.__file__}")
    print(f"{'case':<22} {'repeat call, launch stubbed (us)':>33} {'ok':>5}   plan")
    for r in rows:
        print(f"{r['case']:<22} {r['xgemm_us']:33.2f} {str(r['same_launch_args'] and r['launch_reached']):>5}"
              f"   {r['plan']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "xgemm": xgemm.__file__, "python": sys.version.split()[0],
                                               "torch": torch.__version__,
                                               "date": time.strftime("%Y-%m-%d %H:%M")}, indent=1))
    if not all(r["same_launch_args"] and r["launch_reached"] for r in rows):
        sys.exit("host_cost: a case did not reach its stubbed launch identically on the repeat call")


if __name__ == "__main__":
    main()
