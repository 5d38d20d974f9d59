"""The child process that first-use CuTe compiles run in (runtime/cute_cache.py).

CuTe-DSL aborts the whole process on some builds it cannot do (a 96-column gate half's TMA atom,
2026-12-07) instead of raising, and a user's process must outlive that, so a class compiles in a
child. One child serves the calling process's later first-use compiles too: its imports (cutlass
and the kernel module, ~3 s on a 2-core machine) are paid once, not per class. A new one starts
after a child dies, and when the environment a child would get has changed (a build may read it).
An idle child exits after IDLE_S seconds (XGEMM_BUILD_IDLE_S), so that a long-lived process does
not keep the compiler's memory for the compiles it made at its start.

The parent writes a pickled (module, key, object path, library path) to the child's stdin; the
child builds `module.build_for_key(key)()`, exports it (cute_cache._export, handed to serve())
and answers one line on its stdout, "ok" or "failed". Everything else it writes, the compiler's output and a failed
build's traceback, goes to its log: a temporary file whose new part the parent reads back when a
build fails or the child dies. Callers serialize builds (cute_cache holds its lock); the lock
here keeps the one child consistent regardless.
"""
from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Dict, NamedTuple, Optional


IDLE_S = 120.0


class Outcome(NamedTuple):
    status: str            # "ok" | "failed" (as Python, or the child exited) | "died" (of a signal)
    signal: str = ""       # the signal's name, for "died"
    log: str = ""          # what the child wrote during this build, for "failed" and "died"


class _Child:
    def __init__(self, env: Dict[str, str]):
        self.env, self.pid = env, os.getpid()
        fd, path = tempfile.mkstemp(prefix="xgemm-build-", suffix=".log")
        os.unlink(path)                     # only the child writes it (its stderr); read with pread
        self.log_fd = fd
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from xgemm.runtime.build_process import serve; "
                                   "from xgemm.runtime.cute_cache import _export; serve(_export)"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=fd, env=env)

    def usable(self, env: Dict[str, str]) -> bool:
        return self.pid == os.getpid() and self.env == env and self.proc.poll() is None

    def log_since(self, start: int) -> str:
        size = os.fstat(self.log_fd).st_size
        return os.pread(self.log_fd, max(0, size - start), start).decode(errors="replace")

    def close(self) -> None:
        if self.pid != os.getpid():        # a fork's copy: the parent's child is not ours to end
            return
        try:
            self.proc.stdin.close()         # EOF: the child returns
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        os.close(self.log_fd)


_lock = threading.Lock()
_child: Optional[_Child] = None


def build(module: str, key: tuple, obj: str, so: str, env: Dict[str, str]) -> Optional[Outcome]:
    """Build `key` of kernel module `module` in the child, exported to obj / so; None where no
    child process can be started here (an embedded Python without an interpreter to run)."""
    with _lock:
        return _build((module, key, obj, so), env, retry=True)


def _build(request: tuple, env: Dict[str, str], retry: bool) -> Optional[Outcome]:
    global _child
    if _child is None or not _child.usable(env):
        if _child is not None:
            _child.close()
            _child = None
        try:
            _child = _Child(env)
        except OSError:
            return None
    child = _child
    start = os.fstat(child.log_fd).st_size
    try:
        pickle.dump(request, child.proc.stdin)
        child.proc.stdin.flush()
        answer = child.proc.stdout.readline()
    except OSError:                         # it had ended before it read the request
        answer = b""
    if answer == b"ok\n":
        return Outcome("ok")
    if answer == b"failed\n":
        return Outcome("failed", log=child.log_since(start))
    code = child.proc.wait()
    log = child.log_since(start)
    child.close()
    _child = None
    if code == 0 and retry:                 # it ended idle as the request came: once more, in a new one
        return _build(request, env, retry=False)
    if code >= 0:
        return Outcome("failed", log=log + f"\n(the build process exited with status {code})")
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return Outcome("died", name, log)


@atexit.register
def _stop() -> None:
    global _child
    if _child is not None:
        _child.close()
        _child = None


def serve(export: Callable[[Any, Path, Path], None]) -> None:
    """The child: build requests from stdin until it closes (or stays idle), one answer line each;
    export(compiled, obj, so) saves a build (cute_cache._export)."""
    import importlib
    import traceback

    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)                           # what the compiler prints goes to the log, not the answers
    requests = sys.stdin.buffer
    idle_s = float(os.environ.get("XGEMM_BUILD_IDLE_S", IDLE_S))
    while True:
        if not select.select([requests], [], [], idle_s)[0]:
            return                          # idle: the parent starts another when it needs one
        try:
            module, key, obj, so = pickle.load(requests)
        except EOFError:
            return
        try:
            export(importlib.import_module(module).build_for_key(key)(), Path(obj), Path(so))
            answer = b"ok\n"
        except Exception:                   # noqa: BLE001 - reported; the parent builds it itself
            traceback.print_exc()
            answer = b"failed\n"
        sys.stdout.flush()
        sys.stderr.flush()
        answers.write(answer)
