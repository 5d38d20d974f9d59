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
