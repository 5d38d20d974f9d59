"""The Gluon cache's source hash covers a kernel module's code, not its docs: a docstring, comment
line or blank line edited keeps the cached cubins (session 18 lost an H200 measurement to a
docstring edit that orphaned the carried cubins); a code edit, a trailing comment or a line of a
multi-line string that is not a docstring starts a new cache dir."""
from __future__ import annotations

import pytest

from xgemm.core import registry
from xgemm.runtime import gluon_cache

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
    assert gluon_cache.code_text(SOURCE.replace(old, new)) == gluon_cache.code_text(SOURCE)


@pytest.mark.parametrize("old,new", [
    ("return x + 1", "return x + 2"),
    ("# one more", "# one more, said again"),
    ("# not a comment: part of the string", "# another line of the string"),
    ("    bm = 128", "    bm = 64"),
])
def test_code_edits_change_the_code_text(old, new):
    assert old in SOURCE
    assert gluon_cache.code_text(SOURCE.replace(old, new)) != gluon_cache.code_text(SOURCE)


def test_every_gluon_kernel_has_a_source_hash():
    names = [n for n in registry.names() if n.startswith(("gluon_", "triton_"))]
    assert names, registry.names()
    hashes = {n: gluon_cache.source_hash(n) for n in names}
    assert all(len(h) == 16 for h in hashes.values()) and len(set(hashes.values())) == len(hashes)
