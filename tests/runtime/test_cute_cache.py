"""runtime/cute_cache.warm's worker processes import the same xgemm as their parent, wherever the
package sits (the H200 run after the move into subpackages caught every worker failing: the
workers' PYTHONPATH pointed inside the package)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import xgemm
from xgemm.runtime import cute_cache


class _Worker:
    def __init__(self, args, stdin, env):
        _Worker.started.append((args, env))
        self.stdin = open("/dev/null", "wb")

    def wait(self):
        return 0


def test_warm_workers_find_this_package(monkeypatch, tmp_path):
    monkeypatch.setenv("XGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cute_cache, "on_disk", lambda key, build=None: False)
    _Worker.started = []
    monkeypatch.setattr(subprocess, "Popen", _Worker)
    items = [("xgemm.kernels.cute_sgemm", ("k", i)) for i in range(4)]
    monkeypatch.setattr("xgemm.kernels.cute_sgemm.build_for_key", lambda key: None)
    assert cute_cache.warm(items, jobs=2) == 4
    assert len(_Worker.started) == 2
    for args, env in _Worker.started:
        root = Path(env["PYTHONPATH"].split(":")[0])
        assert (root / "xgemm" / "__init__.py").resolve() == Path(xgemm.__file__).resolve(), root
        assert "_warm_worker" in args[-1]


# A first-use compile runs in a child process, so that a compiler that aborts (CuTe-DSL did, building
# a 96-column gate half's TMA atom) leaves the caller alive with a typed error. The fake kernel
# module below stands in for a kernel's build module: its build refuses to run in the test's own
# process, so a build that is not in a child fails the test instead of aborting it.
FAKE_KERNEL = '''
import os


class Compiled:
    def export_to_c(self, object_file_path, function_name):
        with open(object_file_path, "w") as f:
            f.write(f"built in pid {os.getpid()}")


def build():
    if os.environ.get("XGEMM_CUTE_BUILD") != "inline":
        raise AssertionError("built in the calling process")
    how = os.environ["FAKE_BUILD"]
    if how == "abort":
        os.abort()
    if how == "raise":
        raise ValueError("this tile does not fit")
    return Compiled()


def build_for_key(key):
    return os.abort if key[-1] == "die" else build
'''


def _fake_kernel(monkeypatch, tmp_path, how):
    import importlib
    import sys
    src = tmp_path / "src"
    src.mkdir()
    (src / "xgemm_fake_kernel.py").write_text(FAKE_KERNEL)
    monkeypatch.syspath_prepend(str(src))
    monkeypatch.setenv("PYTHONPATH", str(src))
    monkeypatch.setenv("XGEMM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_BUILD", how)
    monkeypatch.delenv("XGEMM_CUTE_BUILD", raising=False)
    monkeypatch.delenv("XGEMM_CACHE", raising=False)
    sys.modules.pop("xgemm_fake_kernel", None)
    monkeypatch.setattr(cute_cache, "_memory", {})
    return importlib.import_module("xgemm_fake_kernel")


def test_a_build_that_aborts_is_a_typed_error_and_the_caller_lives(monkeypatch, tmp_path):
    from xgemm import errors
    fake = _fake_kernel(monkeypatch, tmp_path, "abort")
    monkeypatch.setattr(cute_cache, "_died", {})
    try:
        cute_cache.cute(("fake", "abort"), fake.build)
    except errors.KernelBuildError as exc:
        assert "SIGABRT" in str(exc) and "'fake', 'abort'" in str(exc), exc
        first = str(exc)
    else:
        raise AssertionError("no error")
    # asked again, it raises the same error at once, without another child
    from xgemm.runtime import build_process
    monkeypatch.setattr(build_process, "build", None)
    try:
        cute_cache.cute(("fake", "abort"), fake.build)
    except errors.KernelBuildError as exc:
        assert str(exc) == first
    else:
        raise AssertionError("no error the second time")


def test_a_build_that_raises_raises_its_own_error_in_the_caller(monkeypatch, tmp_path):
    # the child fails as Python: the caller builds once more itself, here the fake's assertion
    fake = _fake_kernel(monkeypatch, tmp_path, "raise")
    try:
        cute_cache.cute(("fake", "raise"), fake.build)
    except AssertionError as exc:
        assert "calling process" in str(exc)
    else:
        raise AssertionError("no error")


def test_the_child_exports_and_the_caller_loads_it(monkeypatch, tmp_path):
    import os
    fake = _fake_kernel(monkeypatch, tmp_path, "ok")
    monkeypatch.setattr(cute_cache, "_try_load", lambda so, obj: obj.read_text() if obj.exists() else None)
    got = cute_cache.cute(("fake", "ok"), fake.build)
    assert got.startswith("built in pid ") and got != f"built in pid {os.getpid()}", got
    assert cute_cache.cute(("fake", "ok"), fake.build) is got           # memory, then
    monkeypatch.setenv("XGEMM_CUTE_BUILD", "inline")     # the fake then builds in this process
    monkeypatch.setattr(cute_cache, "_memory", {})
    assert cute_cache.cute(("fake", "inline"), fake.build) == f"built in pid {os.getpid()}"


def test_one_child_serves_the_process_and_another_follows_a_death(monkeypatch, tmp_path):
    """The build child is kept between first-use compiles (its imports are paid once); after a
    build kills it, the next build starts a new one; a changed environment starts a new one too."""
    from xgemm import errors
    fake = _fake_kernel(monkeypatch, tmp_path, "ok")
    monkeypatch.setattr(cute_cache, "_died", {})
    monkeypatch.setattr(cute_cache, "_try_load", lambda so, obj: obj.read_text() if obj.exists() else None)
    first = cute_cache.cute(("fake", 1), fake.build)
    assert cute_cache.cute(("fake", 2), fake.build) == first            # the same child built both
    try:
        cute_cache.cute(("fake", "die"), fake.build)
    except errors.KernelBuildError as exc:
        assert "SIGABRT" in str(exc)
    else:
        raise AssertionError("no error")
    after = cute_cache.cute(("fake", 4), fake.build)
    assert after.startswith("built in pid ") and after != first, (first, after)
    monkeypatch.setenv("FAKE_BUILD_NOTE", "another environment")
    assert cute_cache.cute(("fake", 5), fake.build) not in (first, after)


def test_a_child_that_ended_idle_or_was_killed_idle_is_replaced_not_blamed(monkeypatch, tmp_path):
    import signal
    import time

    from xgemm.runtime import build_process
    fake = _fake_kernel(monkeypatch, tmp_path, "ok")
    monkeypatch.setenv("XGEMM_BUILD_IDLE_S", "0.5")
    monkeypatch.setattr(cute_cache, "_try_load", lambda so, obj: obj.read_text() if obj.exists() else None)
    first = cute_cache.cute(("fake", 1), fake.build)
    child = build_process._child.proc
    deadline = time.monotonic() + 30
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert child.returncode == 0                                     # it ended by itself, idle
    second = cute_cache.cute(("fake", 2), fake.build)
    assert second != first
    build_process._child.proc.send_signal(signal.SIGKILL)             # killed between builds
    build_process._child.proc.wait()
    assert cute_cache.cute(("fake", 3), fake.build) not in (first, second)
