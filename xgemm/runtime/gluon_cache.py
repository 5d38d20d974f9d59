"""Ahead-of-time build and on-disk cache of Gluon kernels: cubin + JSON metadata per entry.

Layout:  <root>/<kernel>-<source hash>-triton<version>/<arch>/<entry>.cubin|.json
  root     $XGEMM_CACHE_DIR/gluon, else ~/.cache/xgemm/gluon
  kernel   a registered Gluon kernel module (gluon_softmax, ...); its source hash covers SCHEMA
           and the module's code: the file without its docstrings, comment lines and blank lines
           (cache.code_text), so an edit of its code (a trailing comment too) starts a new dir: rebuild
           the cache after it; an edit of its docs keeps the cubins. A kernel with a
           `<module>_build.py` (gluon_splitk_sm90) is compiled from that file, and only it is hashed:
           its policy, in the module itself, changes without orphaning the cubins
  entry    the kernel's entry key with "/" -> "~", e.g. gluon_softmax~fp32-fp32~n4096-m8-w16-c1-v4-a4-o0

The JSON holds: key, kernel, name (the cubin's entry), arch, num_warps, num_ctas, shared (dynamic
smem bytes), global/profile scratch size and align, params (name, triton type, PTX type; the two
trailing scratch pointers included), constexprs, compile options, triton_version, source_hash,
cubin_sha256, regs (per thread, from cuobjdump).

The build runs wherever triton >= 3.8 is importable, GPU or not (GPUTarget("cuda", 90, 32)); the
cache is read with no triton at all (a machine with triton 3.6, or none, just needs the files).
`lookup` compiles a missing entry on first use into the same cache when it can, and otherwise
raises CacheMissError telling the user to run `python -m xgemm build-cache`.

Faults: an entry whose JSON does not parse or names another entry, or whose cubin is missing or
fails the metadata's sha256 (truncated, foreign) is a miss, rebuilt and overwritten, with one
errors.CacheWarning (runtime/cache.py). A compile holds `<entry>.lock` (flock) and looks at the
disk again once it has it, so processes wanting one entry build it once. A cache directory that
cannot be created or written (read-only, full) keeps the entry in memory, with one warning.

A kernel module plugs in with two functions (see kernels/gluon_softmax.py), and a third optional:
  gluon_entries(arch) -> [entry key]                    what build() makes by default
  gluon_compile_args(key, arch) -> (jit fn, signature, constexprs, attrs, options)
  gluon_patch_ptx(key, ptx) -> ptx                      an edit of triton's PTX (e.g. a barrier
                                                        the kernel proves needless); the cubin is
                                                        then reassembled by triton's ptxas stage
"""
from __future__ import annotations

import glob
import hashlib
import importlib
import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from xgemm.core import registry
from xgemm.errors import KernelUnavailableError
from xgemm.runtime import cache

SCHEMA = 1                      # bump when the metadata format or compile options change
MIN_TRITON = (3, 8)             # cross-CTA gl.max / gl.sum need it (3.6/3.7 fail in ReduceOpToLLVM)
DEFAULT_ARCH = "sm_90a"

_entries: Dict[Tuple[str, str], "Entry"] = {}
_source_hashes: Dict[str, str] = {}


class CacheMissError(KernelUnavailableError):
    """A prebuilt kernel is missing and this machine cannot compile it (no triton >= 3.8)."""


class Entry:
    """One cached kernel: its key, arch, metadata (the JSON), the cubin's path and its bytes
    (those checked against the metadata's sha256; where the cache could not be written, the only
    copy)."""
    __slots__ = ("key", "arch", "meta", "cubin_path", "data")

    def __init__(self, key: str, arch: str, meta: dict, cubin_path: str, data: Optional[bytes] = None):
        self.key, self.arch, self.meta, self.cubin_path, self.data = key, arch, meta, cubin_path, data

    def __repr__(self) -> str:
        return f"Entry({self.key!r}, {self.arch!r}, {self.cubin_path!r})"

    @property
    def cubin(self) -> bytes:
        if self.data is not None:
            return self.data
        with open(self.cubin_path, "rb") as f:
            return f.read()


def cache_root() -> Path:
    """$XGEMM_CACHE_DIR/gluon, else ~/.cache/xgemm/gluon (the CuTe cache, runtime/cute_cache.py, sits beside it)."""
    return cache.root() / "gluon"


def source_hash(kernel: str) -> str:
    """sha256 of the code text of the file the kernel is compiled from and SCHEMA, read without
    importing it: `<module>_build.py` where the kernel has one (the kernels and their compile
    arguments, apart from the policy in `<module>.py`, whose edits then keep the cubins), else the
    kernel module itself."""
    if kernel not in _source_hashes:
        name = registry.module_name(kernel)
        spec = importlib.util.find_spec(name + "_build") or importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise KernelUnavailableError(f"Gluon kernel {kernel!r}: module {registry.module_name(kernel)} is not installed")
        h = hashlib.sha256(f"xgemm-gluon-schema-{SCHEMA}\n".encode())
        h.update(cache.code_text_of(Path(spec.origin)).encode())
        _source_hashes[kernel] = h.hexdigest()[:16]
    return _source_hashes[kernel]


def triton_version() -> Optional[Tuple[int, ...]]:
    """The installed triton's version, from its metadata (triton is not imported)."""
    try:
        if importlib.util.find_spec("triton") is None:
            return None
    except (ImportError, ValueError):      # blocked or half-imported: treat as absent
        return None
    try:
        from importlib.metadata import version
        text = version("triton")
    except Exception:
        import triton  # an unpackaged checkout: importing is the only way to ask
        text = triton.__version__
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def can_compile() -> bool:
    v = triton_version()
    return v is not None and v[:2] >= MIN_TRITON


def _kernel_of(key: str) -> str:
    kernel = key.split("/", 1)[0]
    if kernel not in registry.names():
        raise KeyError(kernel)
    return kernel


def _file_stem(key: str) -> str:
    return key.replace("/", "~")


def _dir_for(kernel: str, version: Tuple[int, ...], arch: str) -> Path:
    return cache_root() / f"{kernel}-{source_hash(kernel)}-triton{'.'.join(map(str, version))}" / arch


_corrupt: Dict[Tuple[str, str], str] = {}       # (key, arch) -> why its disk entry was refused


def _find(key: str, arch: str) -> Optional[Entry]:
    """The entry on disk under any triton version's dir for this source (newest version first);
    one that is unreadable, truncated or foreign is skipped (and warned about once)."""
    kernel = _kernel_of(key)
    stem = _file_stem(key)
    pattern = str(cache_root() / f"{kernel}-{source_hash(kernel)}-triton*" / arch / f"{stem}.json")
    paths = glob.glob(pattern)

    def version_of(p: str):
        m = re.search(r"-triton([\d.]+)" + re.escape(os.sep), p)
        return tuple(int(v) for v in m.group(1).split(".") if v) if m else ()

    for path in sorted(paths, key=version_of, reverse=True):
        cubin = path[:-len(".json")] + ".cubin"
        try:
            with open(path) as f:
                meta = json.load(f)
            with open(cubin, "rb") as f:
                data = f.read()
        except (OSError, ValueError) as exc:        # a truncated JSON, a missing cubin
            _refuse(key, arch, path, f"{type(exc).__name__}: {exc}")
            continue
        if not isinstance(meta, dict) or meta.get("schema") != SCHEMA or meta.get("key") != key:
            _refuse(key, arch, path, "its metadata is not this entry's (schema, key)")
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest != meta.get("cubin_sha256"):
            _refuse(key, arch, cubin, f"sha256 {digest[:12]}... of {len(data)} bytes, the metadata says "
                                      f"{str(meta.get('cubin_sha256'))[:12]}...")
            continue
        return Entry(key, arch, meta, cubin, data)
    return None


def _refuse(key: str, arch: str, path: str, why: str) -> None:
    _corrupt[key, arch] = f"{path}: {why}"
    cache.corrupt(Path(path), why)


def parse_key(key: str, kernel: str) -> Tuple[List[str], Dict[str, int]]:
    """A kernel Config's entry key, '<kernel>/<dtypes>/<letter><int>-...' (e.g.
    'gluon_softmax/f32-f32/n1024-m8-...'), as (the dash-separated dtype part, {letter: int})."""
    name, dts, rest = key.split("/")
    if name != kernel:
        raise ValueError(f"{key!r} is not a {kernel} entry key")
    return dts.split("-"), {p[0]: int(p[1:]) for p in rest.split("-")}


def lookup(key: str, arch: str = DEFAULT_ARCH, compile: bool = True) -> Optional[Entry]:
    """The cached entry for `key` (e.g. "gluon_softmax/fp32-fp32/n4096-m2-w4-c1-v4-a4").

    Missing: compiled now into the cache when triton >= 3.8 is importable and compile=True;
    None when compile=False or the key names no registered kernel; otherwise CacheMissError.
    """
    hit = _entries.get((key, arch))
    if hit is not None:
        return hit
    try:
        entry = _find(key, arch)
    except KeyError:
        return None
    if entry is None:
        if not compile:
            return None
        if not can_compile():
            v = triton_version()
            bad = _corrupt.get((key, arch))
            raise CacheMissError(
                f"no {'usable' if bad else 'prebuilt'} Gluon kernel {key} for {arch} under {cache_root()} "
                f"(XGEMM_CACHE_DIR){f' (the cached one is corrupt: {bad})' if bad else ''}, and "
                f"this machine cannot compile one (triton {'.'.join(map(str, v)) if v else 'is not installed'}; "
                f"needs >= {'.'.join(map(str, MIN_TRITON))}). Run `python -m xgemm build-cache --arch {arch}` "
                f"on a machine with triton >= 3.8 (no GPU needed) and point XGEMM_CACHE_DIR at the result")
        entry = compile_entry(key, arch)
    _entries[(key, arch)] = entry
    return entry


def unavailable_reason(key: str, arch: str = DEFAULT_ARCH) -> Optional[str]:
    """None when lookup(key) will succeed (cached, or compilable here); else why not."""
    try:
        if lookup(key, arch, compile=False) is not None or can_compile():
            return None
    except KernelUnavailableError as exc:
        return str(exc)
    return (f"no prebuilt cubin {key} under {cache_root()} and no triton >= 3.8 to build it; "
            f"run `python -m xgemm build-cache`")


_availability: Dict[Tuple[str, str], Optional[str]] = {}


def available(key: str, arch: str = DEFAULT_ARCH) -> Optional[str]:
    """unavailable_reason(key), remembered for the process: kernels ask it from supports()."""
    if (key, arch) not in _availability:
        _availability[key, arch] = unavailable_reason(key, arch)
    return _availability[key, arch]


# ----------------------------------------------------------------------------------------------
# Compiling (needs triton >= 3.8; no GPU)
# ----------------------------------------------------------------------------------------------

def _target(arch: str):
    from triton.backends.compiler import GPUTarget
    m = re.fullmatch(r"sm_(\d+)a?", arch)
    if not m:
        raise ValueError(f"arch {arch!r}: expected e.g. 'sm_90a' or 'sm_100a'")
    return GPUTarget("cuda", int(m.group(1)), 32)


_PTX_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(([^)]*)\)", re.S)
# ".param .u64 x" -> "u64"; a by-value TMA map ".param .align 64 .b8 x[128]" -> "b8[128]"
_PTX_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)[^,\[]*?(\[\d+\])?\s*(?:,|$)")


def ptx_params(ptx: str) -> Tuple[str, List[str]]:
    """(entry name, [ptx type of each .param]) of the (single) kernel in a PTX module."""
    m = _PTX_ENTRY.search(ptx)
    if not m:
        raise ValueError("no .entry in PTX")
    return m.group(1), [t + arr for t, arr in _PTX_PARAM.findall(m.group(2))]


def _expand_params(sig: dict) -> Tuple[List[str], List[str]]:
    """Kernel parameter names and triton types, a tensor descriptor expanded as triton's launcher
    does (backends/driver.py expand_signature): the 128-byte map, then shape (i32) and strides
    (i64) per dim, outermost first."""
    names, types = [], []
    for k, v in sig.items():
        if v == "constexpr":
            continue
        if v.startswith("tensordesc"):
            rank = re.search(r"\[([\d,\s]*)\]", v).group(1).count(",") + 1
            names += [k] + [f"{k}.shape{i}" for i in range(rank)] + [f"{k}.stride{i}" for i in range(rank)]
            types += ["nvTmaDesc"] + ["i32"] * rank + ["i64"] * rank
        else:
            names.append(k)
            types.append(v)
    return names, types


def _register_count(cubin_path: str) -> Optional[int]:
    """Registers per thread from cuobjdump (shipped with triton), or None; informative only."""
    import subprocess
    try:
        from triton.knobs import nvidia
        tool = nvidia.cuobjdump.path
        out = subprocess.run([tool, "--dump-resource-usage", cubin_path], capture_output=True, text=True,
                             timeout=60).stdout
        m = re.search(r"REG:(\d+)", out)
        return int(m.group(1)) if m else None
    except Exception:
        return None


def _jsonable(v):
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return str(v)


def _jsonable_meta(v):
    if isinstance(v, dict):
        return {k: _jsonable_meta(x) for k, x in v.items()}
    return [_jsonable_meta(x) for x in v] if isinstance(v, (list, tuple)) else _jsonable(v)


def compile_kernel(key: str, arch: str = DEFAULT_ARCH):
    """triton.compile one entry: (CompiledKernel with asm ptx/cubin/..., signature, constexprs, options)."""
    import triton
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
    module = importlib.import_module(registry.module_name(_kernel_of(key)))
    fn, sig, constexprs, attrs, options = module.gluon_compile_args(key, arch)
    source = GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource    # Gluon, or plain Triton
    compiled = triton.compile(source(fn, sig, constexprs, attrs), target=_target(arch), options=options)
    return compiled, sig, constexprs, options


def _assemble(ptx: str, compiled, options: dict, arch: str) -> bytes:
    """PTX -> cubin with the ptxas and flags triton's own last stage uses."""
    from triton.compiler.compiler import make_backend
    backend = make_backend(_target(arch))
    opt = backend.parse_options(dict(options))
    return backend.make_cubin(ptx, {"name": compiled.metadata.name}, opt, _target(arch).arch)


def compile_entry(key: str, arch: str = DEFAULT_ARCH, force: bool = False) -> Entry:
    """Compile one entry and write <entry>.cubin + <entry>.json atomically into the cache.

    Under an exclusive lock on <entry>.lock: a process that waited for another's compile of the
    same entry finds it on disk and returns it (unless force). Where the directory cannot be made
    or written (read-only, full), the entry is kept in memory only, with one warning."""
    kernel = _kernel_of(key)
    version = triton_version() or _imported_triton_version()
    out_dir = _dir_for(kernel, version, arch)
    stem = out_dir / _file_stem(key)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        cache.unwritable(out_dir, exc)
    with cache.FileLock(Path(f"{stem}.lock")):
        entry = None if force else _find(key, arch)
        if entry is None:
            cubin, meta = _compile(key, arch)
            entry = _store(stem, key, arch, cubin, meta)
    _entries[(key, arch)] = entry
    return entry


def _imported_triton_version() -> Tuple[int, ...]:
    import triton
    return tuple(int(p) for p in re.findall(r"\d+", triton.__version__)[:3])


def _compile(key: str, arch: str) -> Tuple[bytes, dict]:
    """(cubin, metadata) of one entry: triton's compile, its PTX patched where the kernel asks."""
    import triton
    kernel = _kernel_of(key)
    compiled, sig, constexprs, options = compile_kernel(key, arch)
    md = compiled.metadata
    name, ptx_types = ptx_params(compiled.asm["ptx"])
    names, types = _expand_params(sig)
    names += ["global_scratch", "profile_scratch"]
    types += ["*i8", "*i8"]
    if len(names) != len(ptx_types):
        raise RuntimeError(f"{key}: PTX entry has {len(ptx_types)} params, expected {names}")
    cubin = compiled.asm["cubin"]
    patch = getattr(importlib.import_module(registry.module_name(kernel)), "gluon_patch_ptx", None)
    if patch is not None:               # a kernel may edit its PTX (e.g. drop a barrier it proves needless)
        ptx = patch(key, compiled.asm["ptx"])
        if ptx != compiled.asm["ptx"]:
            cubin = _assemble(ptx, compiled, options, arch)
    meta = {
        "schema": SCHEMA, "key": key, "kernel": kernel, "name": name, "arch": arch,
        "num_warps": md.num_warps, "num_ctas": md.num_ctas, "shared": md.shared,
        "global_scratch_size": md.global_scratch_size, "global_scratch_align": md.global_scratch_align,
        "profile_scratch_size": md.profile_scratch_size, "profile_scratch_align": md.profile_scratch_align,
        "params": [{"name": n, "type": t, "ptx": p} for n, t, p in zip(names, types, ptx_types)],
        "constexprs": {k: _jsonable(v) for k, v in constexprs.items()},
        "options": {k: _jsonable(v) for k, v in options.items()},
        "triton_version": triton.__version__, "source_hash": source_hash(kernel),
        "cubin_sha256": hashlib.sha256(cubin).hexdigest(),
    }
    if getattr(md, "tensordesc_meta", None):     # TMA maps: what the host must encode per descriptor
        meta["tensordesc_meta"] = _jsonable_meta(md.tensordesc_meta)
    return cubin, meta


def _store(stem: Path, key: str, arch: str, cubin: bytes, meta: dict) -> Entry:
    """Write the cubin, then the JSON (a reader takes an entry by its JSON, so never half of one);
    on a read-only or full disk, the entry in memory only."""
    try:
        _atomic_write(Path(f"{stem}.cubin"), cubin)
        meta["regs"] = _register_count(f"{stem}.cubin")
        _atomic_write(Path(f"{stem}.json"), json.dumps(meta, indent=1, sort_keys=True).encode())
    except OSError as exc:
        cache.unwritable(stem.parent, exc)
        meta.setdefault("regs", None)
    return Entry(key, arch, meta, f"{stem}.cubin", cubin)


def _atomic_write(path: Path, data: bytes) -> None:
    import tempfile
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)       # mkstemp makes 0600; the cache is meant to be shared/copied
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _compile_worker(args):
    key, arch, force = args
    try:
        compile_entry(key, arch, force)
        return key, None
    except Exception as exc:                # reported by build(), which keeps going
        return key, f"{type(exc).__name__}: {exc}"


def default_entries(kernels: Optional[Iterable[str]] = None, arch: str = DEFAULT_ARCH) -> List[str]:
    """Entry keys build() makes: each named Gluon kernel's prebuild(arch) (default: every one the
    registry lists), or explicit keys."""
    keys: List[str] = []
    known = registry.of_backend("gluon")
    names = list(kernels) if kernels is not None else list(known)
    for name in names:
        if "/" in name:                 # an explicit entry key
            keys.append(name)
            continue
        if name not in known:
            raise KernelUnavailableError(f"{name!r} is not a Gluon kernel of the registry ({', '.join(known)})")
        keys.extend(known[name].prebuild(arch))
    return list(dict.fromkeys(keys))


def build(arch: str = DEFAULT_ARCH, kernels: Optional[Iterable[str]] = None, jobs: Optional[int] = None,
          force: bool = False, progress=None) -> List[Entry]:
    """Compile the kernel set (or `kernels`: names and/or entry keys) for `arch` into the cache.

    Needs triton >= 3.8, no GPU. Entries already cached are kept unless force=True. Returns every
    requested entry. progress(done, total, key) is called after each compile when given.
    """
    if not can_compile():
        v = triton_version()
        raise KernelUnavailableError(
            f"build-cache needs triton >= {'.'.join(map(str, MIN_TRITON))} (found "
            f"{'.'.join(map(str, v)) if v else 'none'}); install it (pip install 'triton>=3.8'), no GPU needed")
    keys = default_entries(kernels, arch)
    todo = [k for k in keys if force or _find(k, arch) is None]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(todo) or 1))
    failed = []
    if jobs == 1:
        results = (_compile_worker((k, arch, force)) for k in todo)
    else:
        import concurrent.futures as cf
        import multiprocessing
        # spawn: workers import triton themselves; the parent may hold a CUDA context or threads.
        pool = cf.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
        results = pool.map(_compile_worker, [(k, arch, force) for k in todo], chunksize=4)
    try:
        for i, (k, err) in enumerate(results):
            if err:
                failed.append(f"{k}: {err}")
            if progress:
                progress(i + 1, len(todo), k if not err else f"{k} FAILED: {err}")
    finally:
        if jobs > 1:
            pool.shutdown()
    if failed:
        raise RuntimeError(f"build: {len(failed)} of {len(todo)} entries failed to compile:\n  " +
                           "\n  ".join(failed[:20]))
    _entries.clear()
    out = []
    for k in keys:
        entry = _find(k, arch)
        if entry is None:
            raise RuntimeError(f"build: {k} missing after compile")
        out.append(entry)
    return out


def clear_memory() -> None:
    """Forget the entries and availability answers held in memory (the disk cache stays): for a
    process whose XGEMM_CACHE_DIR changed, e.g. tests that build into a fresh directory."""
    _entries.clear()
    _availability.clear()
    _corrupt.clear()
