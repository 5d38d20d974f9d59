"""Issue 22, faults of the kernel cache (CPU only; every compile is a counted fake):

- a truncated or foreign entry (Gluon cubin + JSON, CuTe .so/.o, a native FFI library) is
  detected before it is loaded, warned about once, and rebuilt -- or, where this machine cannot
  compile, a CacheMissError that says so; never a raw exception, never a SIGBUS from dlopen;
- two processes wanting the same missing entry build it once (the second waits on the entry's
  lock and loads the first one's result);
- a cache directory that cannot be created or written (read-only, full) still serves the call,
  from memory, with one warning per process.
"""
from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
import sysconfig
import textwrap
import warnings
from pathlib import Path

import pytest

from xgemm.errors import CacheWarning
from xgemm.runtime import cache, cute_cache, gluon_cache, native_build

ROOT = Path(__file__).resolve().parents[2]
KEY = "gluon_softmax/fp32-fp32/n1024-m1-w4-c1-v4-a4-o0"
KEY2 = "gluon_softmax/fp32-fp32/n2048-m1-w4-c1-v4-a4-o0"


@pytest.fixture
def root(tmp_path, monkeypatch):
    """A fresh cache root, fresh in-memory memos and warning set (restored after the test)."""
    monkeypatch.setenv("XGEMM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "_warned", set())
    for name in ("_entries", "_availability", "_corrupt"):
        monkeypatch.setattr(gluon_cache, name, {})
    for name in ("_memory", "_eager"):
        monkeypatch.setattr(cute_cache, name, {})
    monkeypatch.setattr(native_build, "_placed", {})
    monkeypatch.setattr(native_build, "_private", None)
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def elf() -> bytes:
    """The bytes of a small, whole ELF64 shared library (one of Python's own extension modules)."""
    libs = sorted(Path(sysconfig.get_config_var("DESTSHARED") or "/nonexistent").glob("*.so"),
                  key=lambda p: p.stat().st_size)
    for lib in libs:
        if cache.elf_intact(lib):
            return lib.read_bytes()
    pytest.skip("no ELF64 shared library to stand in for a built one")


def caught(fn, *args):
    """(fn's result, the CacheWarnings it raised), every warning recorded."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [w for w in got if issubclass(w.category, CacheWarning)]


# ------------------------------------------------------------------------------------------
# Gluon: cubin + JSON
# ------------------------------------------------------------------------------------------
def _gluon_cubin(key: str) -> bytes:
    return b"\x7fELF fake cubin of " + key.encode() + b" Cuda compilation tools, release 13.4" + bytes(200)


@pytest.fixture
def gluon_compiles(root, monkeypatch):
    """gluon_cache's compile replaced by a fake that records the keys it compiled."""
    calls = []

    def compile_(key, arch):
        calls.append(key)
        cubin = _gluon_cubin(key)
        return cubin, {"schema": gluon_cache.SCHEMA, "key": key, "name": "k", "arch": arch,
                       "cubin_sha256": hashlib.sha256(cubin).hexdigest()}
    monkeypatch.setattr(gluon_cache, "_compile", compile_)
    monkeypatch.setattr(gluon_cache, "_register_count", lambda path: 7)
    monkeypatch.setattr(gluon_cache, "triton_version", lambda: (3, 9, 0))
    monkeypatch.setattr(gluon_cache, "can_compile", lambda: True)
    return calls


def _fresh_lookup(key=KEY):
    gluon_cache._entries.clear()
    return gluon_cache.lookup(key)


@pytest.mark.parametrize("damage", ["truncated cubin", "foreign cubin", "truncated json", "foreign json",
                                    "missing cubin"])
def test_gluon_corrupt_entry_is_rebuilt_with_one_warning(gluon_compiles, damage):
    entry = gluon_cache.lookup(KEY)
    cubin, meta = Path(entry.cubin_path), Path(entry.cubin_path[:-len(".cubin")] + ".json")
    assert gluon_compiles == [KEY] and cubin.read_bytes() == _gluon_cubin(KEY)
    if damage == "truncated cubin":
        cubin.write_bytes(_gluon_cubin(KEY)[:40])
    elif damage == "foreign cubin":
        cubin.write_bytes(_gluon_cubin(KEY2))
    elif damage == "truncated json":
        meta.write_text(meta.read_text()[:30])
    elif damage == "foreign json":
        meta.write_text(meta.read_text().replace(KEY, KEY2))
    else:
        cubin.unlink()
    again, warned = caught(_fresh_lookup)
    assert gluon_compiles == [KEY, KEY], "the damaged entry was not rebuilt"
    assert len(warned) == 1 and "corrupt" in str(warned[0].message), warned
    assert again.cubin == _gluon_cubin(KEY) and cubin.read_bytes() == _gluon_cubin(KEY)   # overwritten
    third, warned = caught(_fresh_lookup)                  # repaired on disk: a plain hit
    assert gluon_compiles == [KEY, KEY] and not warned and third.cubin == _gluon_cubin(KEY)


def test_gluon_corrupt_entry_without_a_compiler_is_a_cache_miss(gluon_compiles, monkeypatch):
    entry = gluon_cache.lookup(KEY)
    Path(entry.cubin_path).write_bytes(b"\x7fELF cut")
    monkeypatch.setattr(gluon_cache, "can_compile", lambda: False)
    for attempt in range(2):
        gluon_cache._entries.clear()
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            with pytest.raises(gluon_cache.CacheMissError, match="corrupt.*build-cache"):
                gluon_cache.lookup(KEY)
        assert len([w for w in got if issubclass(w.category, CacheWarning)]) == (1 if attempt == 0 else 0)
    assert "corrupt" in gluon_cache.unavailable_reason(KEY)


# ------------------------------------------------------------------------------------------
# CuTe: .so / .o
# ------------------------------------------------------------------------------------------
class _Compiled:
    """What cute.compile returns, as far as cute_cache uses it: export_to_c writes the object."""
    __chandle__ = 1             # "has an execution engine": the compile result is used as is

    def __init__(self, data: bytes, fail: BaseException = None):
        self.data, self.fail = data, fail

    def export_to_c(self, object_file_path, function_name):
        if self.fail is not None:
            raise self.fail
        Path(object_file_path).write_bytes(self.data)


@pytest.fixture
def cute_fakes(root, monkeypatch, elf):
    """Loaders that accept only the current build (`elf` + a marker), a linker that copies."""
    state = {"builds": 0, "marker": b"build-1", "fail": None}

    def load(path):
        data = Path(path).read_bytes()
        if not data.endswith(state["marker"]):
            raise RuntimeError(f"{path}: not the expected library")     # what a foreign library gives
        return ("loaded", Path(path).suffix)

    def link(obj, so):
        so.write_bytes(obj.read_bytes())
        return True

    def build():
        state["builds"] += 1
        return _Compiled(elf + state["marker"], state["fail"])
    monkeypatch.setattr(cute_cache, "_load_so", load)
    monkeypatch.setattr(cute_cache, "_load_o", load)
    monkeypatch.setattr(cute_cache, "_link_so", link)
    state["build"] = build
    return state


CUTE_KEY = ("xgemm-test-faults", "sm_90a", 1)


def _cute_paths(key=CUTE_KEY, build=None):
    stem = cute_cache.cute_dir(cute_cache.source_of(build) if build else None) / cute_cache.key_hash(key)
    return stem.with_suffix(".so"), stem.with_suffix(".o")


@pytest.mark.parametrize("damage", ["truncated so", "truncated so and o", "foreign so and o"])
def test_cute_corrupt_object_is_rebuilt_with_one_warning(cute_fakes, elf, damage):
    build = cute_fakes["build"]
    fn = cute_cache.cute(CUTE_KEY, build)
    so, obj = _cute_paths(build=build)
    assert cute_fakes["builds"] == 1 and obj.exists() and so.exists()
    good = so.read_bytes()
    if damage.startswith("truncated"):
        so.write_bytes(good[:len(good) // 2])
        if "and o" in damage:
            obj.write_bytes(good[:100])
    else:
        so.write_bytes(elf + b"build-0")
        obj.write_bytes(elf + b"build-0")
    cute_cache._memory.clear()
    fn, warned = caught(cute_cache.cute, CUTE_KEY, build)
    assert warned and all("corrupt" in str(w.message) for w in warned)
    assert len({str(w.message) for w in warned}) == len(warned), "a cause was warned about twice"
    if damage == "truncated so":           # the object is good: relinked, no compile
        assert cute_fakes["builds"] == 1 and fn == ("loaded", ".o")
    else:
        assert cute_fakes["builds"] == 2
    assert so.read_bytes() == good and obj.read_bytes() == good       # both overwritten with a good build
    cute_cache._memory.clear()
    fn, warned = caught(cute_cache.cute, CUTE_KEY, build)
    assert fn == ("loaded", ".so") and not warned


def test_cute_library_linked_on_another_machine_is_relinked_without_a_warning(cute_fakes, monkeypatch):
    """A carried cache's .so was linked against the build machine's cutlass paths: its load fails
    for a missing dependency, which says nothing about the file; the .o serves and is relinked."""
    build = cute_fakes["build"]
    cute_cache.cute(CUTE_KEY, build)
    so, obj = _cute_paths(build=build)
    real_load = cute_cache._load_so

    def load_elsewhere(path):
        raise RuntimeError(f"Failed to load dynamic shared library {path} libcute_dsl_runtime.so: "
                           f"cannot open shared object file: No such file or directory")
    monkeypatch.setattr(cute_cache, "_load_so", load_elsewhere)
    cute_cache._memory.clear()
    fn, warned = caught(cute_cache.cute, CUTE_KEY, build)
    assert fn == ("loaded", ".o") and not warned and cute_fakes["builds"] == 1
    monkeypatch.setattr(cute_cache, "_load_so", real_load)


def test_cute_truncated_library_is_never_dlopened(root, elf, tmp_path):
    """The real loaders (tvm_ffi, ctypes) die of SIGBUS on a truncated library; a fresh process
    with a truncated .so and .o in its cache must rebuild, not crash."""
    pytest.importorskip("tvm_ffi")
    for key in (CUTE_KEY, CUTE_KEY + ("eager",)):
        so, obj = _cute_paths(key)
        so.parent.mkdir(parents=True, exist_ok=True)
        so.write_bytes(elf[:3000])
        obj.write_bytes(elf[:3000])
    code = textwrap.dedent(f"""
        import warnings
        from xgemm.runtime import cute_cache
        cute_cache._link_so = lambda obj, so: False     # not a loader; it would import cutlass
        class Compiled:
            __chandle__ = 1
            def export_to_c(self, object_file_path, function_name):
                open(object_file_path, "wb").write(b"not elf")
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            fn = cute_cache.cute({CUTE_KEY!r}, Compiled)
            eager = cute_cache.cute_eager({CUTE_KEY + ("eager",)!r}, Compiled)
        print(type(fn).__name__, cute_cache.stats()["compiled"], sorted({{str(w.category.__name__) for w in got}}))
    """)
    env = dict(os.environ, XGEMM_CACHE_DIR=str(root))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert res.returncode == 0, (res.returncode, res.stderr[-2000:])
    assert res.stdout.split()[:2] == ["Compiled", "2"], res.stdout
    assert "CacheWarning" in res.stdout


# ------------------------------------------------------------------------------------------
# native FFI libraries: a fake compiler that copies a real library, counts and can be slow
# ------------------------------------------------------------------------------------------
@pytest.fixture
def fake_cxx(root, tmp_path, monkeypatch, elf):
    lib = tmp_path / "good.so"
    lib.write_bytes(elf)
    counter = tmp_path / "cxx-calls"
    counter.write_text("")
    cxx = tmp_path / "fakecxx"
    cxx.write_text(f"#!{sys.executable}\n" + textwrap.dedent("""
        import os, shutil, sys, time
        args = sys.argv[1:]
        if args == ["--version"]:
            print("fakecxx 1.0")
            sys.exit(0)
        with open(os.environ["FAKE_CXX_COUNTER"], "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(float(os.environ.get("FAKE_CXX_SLEEP", "0")))
        shutil.copyfile(os.environ["FAKE_CXX_ELF"], args[args.index("-o") + 1])
    """))
    cxx.chmod(0o755)
    src = tmp_path / "lib.cc"
    src.write_text("int xgemm_fault_test;\n")
    for k, v in {"CXX": str(cxx), "FAKE_CXX_COUNTER": str(counter), "FAKE_CXX_ELF": str(lib)}.items():
        monkeypatch.setenv(k, v)
    return {"src": src, "counter": counter, "elf": elf}


def _native(src):
    return native_build.build([src], "xgemm_fault_test", ["-shared"], b"fingerprint")


def test_native_truncated_library_is_rebuilt_with_one_warning(fake_cxx):
    out = _native(fake_cxx["src"])
    assert out.read_bytes() == fake_cxx["elf"] and len(fake_cxx["counter"].read_text().split()) == 1
    out.write_bytes(fake_cxx["elf"][:5000])
    again, warned = caught(_native, fake_cxx["src"])
    assert again == out and out.read_bytes() == fake_cxx["elf"]
    assert len(fake_cxx["counter"].read_text().split()) == 2
    assert len(warned) == 1 and "corrupt" in str(warned[0].message)


# ------------------------------------------------------------------------------------------
# two processes, one build
# ------------------------------------------------------------------------------------------
_BARRIER = """
import os, sys, time
from pathlib import Path
def barrier(ready):
    # both processes reach the lookup together, so both see the entry missing
    (ready / str(os.getpid())).touch()
    deadline = time.monotonic() + 120
    while len(list(ready.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
"""

_WORKERS = {
    "gluon": _BARRIER + textwrap.dedent("""
        import hashlib
        from xgemm.runtime import gluon_cache
        counter, ready = sys.argv[1], Path(sys.argv[2])
        def compile_(key, arch):
            with open(counter, "a") as f:
                f.write(f"{os.getpid()}\\n")
            time.sleep(1.0)
            cubin = b"cubin of " + key.encode()
            return cubin, {"schema": gluon_cache.SCHEMA, "key": key, "name": "k", "arch": arch,
                           "cubin_sha256": hashlib.sha256(cubin).hexdigest()}
        gluon_cache._compile = compile_
        gluon_cache._register_count = lambda path: None
        gluon_cache.triton_version = lambda: (3, 9, 0)
        gluon_cache.can_compile = lambda: True
        barrier(ready)
        print(gluon_cache.lookup(%r).meta["cubin_sha256"])
    """ % KEY),
    "cute": _BARRIER + textwrap.dedent("""
        from xgemm.runtime import cute_cache
        counter, ready, elf = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]).read_bytes()
        class Compiled:
            __chandle__ = 1
            def export_to_c(self, object_file_path, function_name):
                Path(object_file_path).write_bytes(elf)
        def build():
            with open(counter, "a") as f:
                f.write(f"{os.getpid()}\\n")
            time.sleep(1.0)
            return Compiled()
        cute_cache._load_o = lambda path: "loaded from disk"
        cute_cache._load_so = lambda path: "loaded from disk"
        cute_cache._link_so = lambda obj, so: False
        barrier(ready)
        fn = cute_cache.cute(%r, build)
        print("built" if isinstance(fn, Compiled) else fn)
    """ % (CUTE_KEY,)),
    "native": _BARRIER + textwrap.dedent("""
        from xgemm.runtime import native_build
        ready, src = Path(sys.argv[2]), Path(sys.argv[3])
        barrier(ready)
        print(native_build.build([src], "xgemm_fault_test", ["-shared"], b"fingerprint"))
    """),
}


@pytest.mark.parametrize("kind", ["gluon", "cute", "native"])
def test_two_processes_build_one_entry_once(kind, root, tmp_path, elf, fake_cxx):
    counter = fake_cxx["counter"] if kind == "native" else tmp_path / f"{kind}-builds"
    counter.write_text("")
    ready = tmp_path / "ready"
    ready.mkdir()
    third = str(fake_cxx["src"]) if kind == "native" else str(tmp_path / "good.so")
    env = dict(os.environ, XGEMM_CACHE_DIR=str(root), FAKE_CXX_SLEEP="1.0")
    procs = [subprocess.Popen([sys.executable, "-c", _WORKERS[kind], str(counter), str(ready), third], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    builds = counter.read_text().split()
    assert len(builds) == 1, f"{kind}: {len(builds)} builds of one entry by two processes"
    results = sorted(out.strip() for out, _ in outs)
    if kind == "cute":
        assert results == ["built", "loaded from disk"]
    else:
        assert results[0] == results[1], results


# ------------------------------------------------------------------------------------------
# a cache directory that cannot be created or written
# ------------------------------------------------------------------------------------------
def _blocked_root(root: Path, monkeypatch) -> None:
    """XGEMM_CACHE_DIR under a regular file: no directory can be made there, root or not."""
    root.parent.mkdir(parents=True, exist_ok=True)
    (root.parent / "a-file").write_text("")
    monkeypatch.setenv("XGEMM_CACHE_DIR", str(root.parent / "a-file" / "cache"))


FAULTS = {
    "full": lambda: OSError(errno.ENOSPC, "No space left on device"),
    "read-only": lambda: PermissionError(errno.EACCES, "Permission denied"),
    "not a directory": None,
}


def _raiser(exc):
    def fail(*args, **kwargs):
        raise exc
    return fail


@pytest.mark.parametrize("fault", list(FAULTS))
def test_gluon_unwritable_cache_serves_from_memory_with_one_warning(gluon_compiles, root, monkeypatch, fault):
    if FAULTS[fault] is None:
        _blocked_root(root, monkeypatch)
    else:
        monkeypatch.setattr(gluon_cache, "_atomic_write", _raiser(FAULTS[fault]()))
    entry, warned = caught(gluon_cache.lookup, KEY)
    assert entry.cubin == _gluon_cubin(KEY) and entry.meta["key"] == KEY
    assert len(warned) == 1 and "cannot write the kernel cache" in str(warned[0].message)
    assert "XGEMM_CACHE_DIR" in str(warned[0].message)
    other, warned = caught(gluon_cache.lookup, KEY2)            # a second entry: no second warning
    assert other.cubin == _gluon_cubin(KEY2) and not warned
    same, warned = caught(gluon_cache.lookup, KEY)              # held in memory: no recompile
    assert same is entry and gluon_compiles == [KEY, KEY2] and not warned


@pytest.mark.parametrize("fault", list(FAULTS))
def test_cute_unwritable_cache_serves_from_memory_with_one_warning(cute_fakes, root, monkeypatch, fault):
    if FAULTS[fault] is None:
        _blocked_root(root, monkeypatch)
    else:
        cute_fakes["fail"] = FAULTS[fault]()
    fn, warned = caught(cute_cache.cute, CUTE_KEY, cute_fakes["build"])
    assert isinstance(fn, _Compiled) and cute_fakes["builds"] == 1
    assert len(warned) == 1 and "cannot write the kernel cache" in str(warned[0].message)
    other, warned = caught(cute_cache.cute, CUTE_KEY + ("other",), cute_fakes["build"])
    assert isinstance(other, _Compiled) and not warned
    again, warned = caught(cute_cache.cute, CUTE_KEY, cute_fakes["build"])
    assert again is fn and cute_fakes["builds"] == 2 and not warned


@pytest.mark.parametrize("fault", list(FAULTS))
def test_native_unwritable_cache_builds_privately_with_one_warning(fake_cxx, root, monkeypatch, fault):
    if FAULTS[fault] is None:
        _blocked_root(root, monkeypatch)
    else:
        monkeypatch.setattr(native_build.shutil, "copyfile", _raiser(FAULTS[fault]()))
    out, warned = caught(_native, fake_cxx["src"])
    assert out.read_bytes() == fake_cxx["elf"] and not str(out).startswith(str(root))
    assert len(warned) == 1 and "cannot write the kernel cache" in str(warned[0].message)
    again, warned = caught(_native, fake_cxx["src"])            # found again: no second build or warning
    assert again == out and not warned and len(fake_cxx["counter"].read_text().split()) == 1


def test_read_only_directory(gluon_compiles, cute_fakes, root):
    """A real chmod 0o500 cache root (skipped where it does not bite, e.g. as root)."""
    root.mkdir(parents=True)
    root.chmod(0o500)
    try:
        if os.access(root, os.W_OK):
            pytest.skip("chmod does not stop this user from writing (root)")
        entry, warned = caught(gluon_cache.lookup, KEY)
        fn, warned2 = caught(cute_cache.cute, CUTE_KEY, cute_fakes["build"])
        assert entry.cubin == _gluon_cubin(KEY) and isinstance(fn, _Compiled)
        assert len(warned + warned2) == 1
    finally:
        root.chmod(0o700)
