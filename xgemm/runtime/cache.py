"""The one cache root ($XGEMM_CACHE_DIR, else ~/.cache/xgemm) and what its three users share when
the disk misbehaves: the per-entry file lock and the once-per-cause warnings.

Beneath the root: cute/<fingerprint>/ (CuTe objects, runtime/cute_cache.py), gluon/ (prebuilt
cubins, runtime/gluon_cache.py), ffi/ (the native libraries, runtime/native_build.py) and code/
(the kernel sources' code text, code_text_of).

The compiled caches key on code_text of their kernels' sources: an edit of a docstring or a
comment line keeps what was built. Parsing a kernel module takes 5-35 ms, more than a first call, so
code_text_of remembers each source's code text under code/<sha256 of the file>.

Faults never stop a call: a corrupt entry is rebuilt (corrupt()), a directory that cannot be
created or written keeps what was built in memory for the process (unwritable()), each with one
errors.CacheWarning per process per cause.
"""
from __future__ import annotations

import ast
import hashlib
import os
import time
import warnings
from pathlib import Path
from typing import Set

from xgemm.errors import CacheWarning

LOCK_TIMEOUT_S = 600.0      # a compile holding the lock can take minutes on a slow machine

_warned: Set[tuple] = set()


def root() -> Path:
    env = os.environ.get("XGEMM_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "xgemm"


def warn_once(cause: tuple, message: str) -> None:
    """warnings.warn(message, CacheWarning) the first time this process meets `cause`."""
    if cause not in _warned:
        _warned.add(cause)
        warnings.warn(message, CacheWarning, stacklevel=3)


def corrupt(path: Path, why: str) -> None:
    """A cache entry on disk is truncated or not what its name says: the caller rebuilds it."""
    warn_once(("corrupt", str(path)), f"xgemm: cached {path} is corrupt or foreign ({why}); rebuilding it "
                                      f"(if this repeats, delete the file or run `python -m xgemm build-cache`)")


def unwritable(path: Path, exc: BaseException) -> None:
    """The cache cannot be written (read-only, full, not a directory): one warning per cache root."""
    warn_once(("unwritable", str(root())),
              f"xgemm: cannot write the kernel cache at {path} ({type(exc).__name__}: {exc}); kernels built "
              f"now stay in memory for this process and are rebuilt by the next one. Point XGEMM_CACHE_DIR "
              f"at a writable directory with free space to keep them")


def elf_intact(path: Path) -> bool:
    """Whether `path` is an ELF file whose headers, segments and section table all lie inside it.

    Checked before any dlopen of a cached library or object: dlopen maps the segments the headers
    name, and touching a page past the end of a truncated file kills the process with SIGBUS
    instead of raising. A foreign but whole library passes (nothing here knows what it exports)."""
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 16)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return False
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2:     # ELF64 only (all xgemm builds)
        return False
    order = "little" if data[5] == 1 else "big"

    def u(at: int, n: int) -> int:
        return int.from_bytes(data[at:at + n], order)
    phoff, shoff = u(0x20, 8), u(0x28, 8)
    phentsize, phnum, shentsize, shnum = u(0x36, 2), u(0x38, 2), u(0x3A, 2), u(0x3C, 2)
    if phoff + phentsize * phnum > min(size, len(data)) or shoff + shentsize * shnum > size:
        return False
    for i in range(phnum):
        ph = phoff + i * phentsize          # p_offset at +8, p_filesz at +32 (Elf64_Phdr)
        if u(ph + 8, 8) + u(ph + 32, 8) > size:
            return False
    return True


class FileLock:
    """flock on `path` (shared to read, exclusive to build + write), polled until `timeout`.

    No lock where there is no fcntl (not Linux/macOS) or the lock file cannot be created (a
    read-only cache: nothing will be written there either, so there is nothing to serialize)."""

    def __init__(self, path: Path, exclusive: bool = True, timeout: float = LOCK_TIMEOUT_S):
        self.path, self.exclusive, self.timeout, self.fd = path, exclusive, timeout, -1

    def __enter__(self) -> "FileLock":
        try:
            import fcntl
            self.fd = os.open(str(self.path), os.O_RDWR | os.O_CREAT, 0o644)
        except (ImportError, OSError):
            return self
        mode = (fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, mode)
                return self
            except OSError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    self.fd = -1
                    raise TimeoutError(f"xgemm: timed out after {self.timeout:.0f}s waiting for the cache lock "
                                       f"{self.path}: another process is still building this entry") from None
                time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        if self.fd >= 0:
            import fcntl
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


def code_text(source: str) -> str:
    """source without its docstrings (module, class, function), comment lines and blank lines, each
    kept line right-stripped: what a compiled kernel depends on. ast's line numbers are the same on
    every Python, so the device's Python hashes what the build machine's did; lines inside other
    multi-line strings are kept whatever they hold."""
    tree = ast.parse(source)
    drop, keep = set(), set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                drop.update(range(first.lineno, first.end_lineno + 1))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.end_lineno > node.lineno:
            lines = set(range(node.lineno, node.end_lineno + 1))
            if not lines <= drop:
                keep.update(lines)
    out = [line.rstrip() for i, line in enumerate(source.splitlines(), 1)
           if i in keep or (i not in drop and line.strip() and not line.lstrip().startswith("#"))]
    return "\n".join(out)


def code_text_of(path: Path) -> str:
    """code_text of the file at path, remembered under <root>/code/<sha256 of its bytes> (with the
    sha256 of the text first, so a truncated memo is recomputed); an unwritable cache computes it
    each time."""
    raw = path.read_bytes()
    memo = root() / "code" / hashlib.sha256(raw).hexdigest()
    try:
        digest, _, text = memo.read_text().partition("\n")
        if hashlib.sha256(text.encode()).hexdigest() == digest:
            return text
    except (OSError, UnicodeDecodeError):
        pass
    text = code_text(raw.decode())
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f"{memo.name}.{os.getpid()}.tmp")
        tmp.write_text(hashlib.sha256(text.encode()).hexdigest() + "\n" + text)
        os.replace(tmp, memo)
    except OSError:
        pass
    return text
