"""The one cache root: $XGEMM_CACHE_DIR, else ~/.cache/xgemm.

Beneath it: cute/<fingerprint>/ (CuTe objects, runtime/cute_cache.py), gluon/ (prebuilt cubins,
runtime/gluon_cache.py) and ffi/ (the native libraries, runtime/native_build.py).
"""
from __future__ import annotations

import os
from pathlib import Path


def root() -> Path:
    env = os.environ.get("XGEMM_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "xgemm"
