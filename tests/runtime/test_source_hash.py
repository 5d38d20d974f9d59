"""The compiled caches key on a kernel module's code, not its docs (runtime/cache.code_text): a
docstring, comment line or blank line edited keeps the Gluon cubins and the CuTe objects (session
18 lost an H200 measurement to a docstring edit that orphaned the carried cubins); a code edit, a
trailing comment or a line of a multi-line string that is not a docstring starts a new cache dir."""
from __future__ import annotations

import pytest

from xgemm.core import registry
from xgemm.runtime import cache, cute_cache, gluon_cache

SOURCE = '''"""The module's docstring.

It runs on sm_90a."""
import triton

PTX = """
# not a comment: part of the string
ld.global.v4.b32
"""


def kernel(x):
    """What it does."""
    # why it does it
    return x + 1   # one more


class Config:
    """Its config."""
    bm = 128
'''


@pytest.mark.parametrize("old,new", [
    ("It runs on sm_90a.", "It runs on sm_90a and nowhere else."),
    ('    """What it does."""', '    """What it does,\n    in two lines."""'),
    ("    # why it does it", "    # why it does it, longer\n    # and on"),
    ("import triton\n", "import triton\n\n\n"),
    ('    """Its config."""\n', ""),
])
def test_doc_edits_keep_the_code_text(old, new):
    assert old in SOURCE
    assert cache.code_text(SOURCE.replace(old, new)) == cache.code_text(SOURCE)


@pytest.mark.parametrize("old,new", [
    ("return x + 1", "return x + 2"),
    ("# one more", "# one more, said again"),
    ("# not a comment: part of the string", "# another line of the string"),
    ("    bm = 128", "    bm = 64"),
])
def test_code_edits_change_the_code_text(old, new):
    assert old in SOURCE
    assert cache.code_text(SOURCE.replace(old, new)) != cache.code_text(SOURCE)


def test_every_gluon_kernel_has_a_source_hash():
    names = [n for n in registry.names() if n.startswith(("gluon_", "triton_"))]
    assert names, registry.names()
    hashes = {n: gluon_cache.source_hash(n) for n in names}
    assert all(len(h) == 16 for h in hashes.values()) and len(set(hashes.values())) == len(hashes)


def test_a_build_module_alone_keys_the_cubins(tmp_path, monkeypatch):
    """A kernel with a `<module>_build.py` is hashed from that file only: its policy module's code
    may change and keep the cubins; the build file's code may not."""
    import importlib.util
    import shutil
    import sys

    pkg = tmp_path / "kpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "k.py").write_text(SOURCE)
    (pkg / "k_build.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "module_name", lambda name: f"kpkg.{name}")

    def fresh():
        gluon_cache._source_hashes.clear()
        importlib.invalidate_caches()
        return gluon_cache.source_hash("k")
    base = fresh()
    (pkg / "k.py").write_text(SOURCE.replace("return x + 1", "return x + 2"))      # the policy side
    assert fresh() == base
    (pkg / "k_build.py").write_text(SOURCE.replace("return x + 1", "return x + 2"))
    assert fresh() != base
    shutil.rmtree(pkg / "__pycache__", ignore_errors=True)
    sys.modules.pop("kpkg", None)
    gluon_cache._source_hashes.clear()


def test_cute_fingerprint_follows_the_code(tmp_path):
    files = {name: tmp_path / name / "kernel.py" for name in ("plain", "docs", "code")}   # the name counts
    for path in files.values():
        path.parent.mkdir()
    files["plain"].write_text(SOURCE)
    files["docs"].write_text(SOURCE.replace("It runs on sm_90a.", "It runs on sm_90a, faster."))
    files["code"].write_text(SOURCE.replace("return x + 1", "return x + 2"))
    fp = {name: cute_cache.fingerprint(str(path)) for name, path in files.items()}
    assert fp["plain"] == fp["docs"] != fp["code"]


def test_code_text_is_remembered_by_the_file_bytes(tmp_path, monkeypatch):
    """code_text_of parses a source once per content (a kernel module takes 5-35 ms, more than a
    first call): a second call reads the memo, an edited file is parsed again, a truncated memo is
    recomputed, and an unwritable cache root still answers."""
    import ast
    src = tmp_path / "kernel.py"
    src.write_text(SOURCE)
    monkeypatch.setenv("XGEMM_CACHE_DIR", str(tmp_path / "cache"))
    parses = []
    real = ast.parse
    monkeypatch.setattr(ast, "parse", lambda *a, **k: parses.append(1) or real(*a, **k))
    assert cache.code_text_of(src) == cache.code_text(SOURCE) and len(parses) == 2     # its parse, code_text's
    assert cache.code_text_of(src) == cache.code_text(SOURCE) and len(parses) == 3     # the memo: code_text's only
    (memo,) = (tmp_path / "cache" / "code").iterdir()
    memo.write_text(memo.read_text()[:-5])
    assert cache.code_text_of(src) == cache.code_text(SOURCE)
    src.write_text(SOURCE.replace("return x + 1", "return x + 2"))
    assert cache.code_text_of(src) != cache.code_text(SOURCE)
    (tmp_path / "blocked").write_text("a file where the cache directory should be")
    monkeypatch.setenv("XGEMM_CACHE_DIR", str(tmp_path / "blocked"))
    assert cache.code_text_of(src) == cache.code_text(src.read_text())
