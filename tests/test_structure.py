"""The package's shape: one kernel registry whose kernels declare every hook, no import cycle,
lazy imports only where a framework or compiler would load, and kernels that never reach into
the torch or jax wings. All read from the source (ast) or the registry; no GPU, no compiler."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

from xgemm.core import policy, registry
from xgemm.kernels import _common

PACKAGE = Path(__file__).resolve().parents[1] / "xgemm"
HEAVY = {"torch", "jax", "jaxlib", "cupy", "cutlass", "triton", "tvm_ffi", "cuda", "numpy", "ml_dtypes"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> List[Tuple[str, bool, int, str]]:
    """(imported module, inside a function?, line, source line) of every import in a file."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    local = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import; the package imports absolutely"
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found += [(n, id(node) in local, node.lineno, lines[node.lineno - 1]) for n in names]
    return found


def _graph() -> Dict[str, Set[str]]:
    files = {_module_name(f): f for f in PACKAGE.rglob("*.py")}
    edges: Dict[str, Set[str]] = {m: set() for m in files}
    for m, f in files.items():
        for target, _, _, _ in _imports(f):
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != m and not m.startswith(target + "."):
                edges[m].add(target)
    return edges


def _cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_cycle():
    edges = _graph()
    assert sum(map(len, edges.values())) > 50, "the graph reader found almost no imports"
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_lazy_imports_of_the_package_only_where_a_framework_would_load():
    """A function-local import of an xgemm module must either reach a module that imports a
    framework or compiler at its top (the torch and jax wings), or say why it is lazy."""
    files = {_module_name(f): f for f in PACKAGE.rglob("*.py")}
    heavy_at_top = {m for m, f in files.items()
                    if any(not local and n.split(".")[0] in HEAVY for n, local, _, _ in _imports(f))}
    lazy: Dict[Tuple[Path, int], Set[str]] = {}
    for f in files.values():
        for target, local, line, text in _imports(f):
            if local and target.startswith("xgemm") and "# lazy:" not in text:
                while target not in files and "." in target:
                    target = target.rpartition(".")[0]
                lazy.setdefault((f, line), set()).add(target)
    bad = [f"{f.relative_to(PACKAGE.parent)}:{line}" for (f, line), targets in lazy.items()
           if not targets & heavy_at_top]
    assert not bad, "\n".join(sorted(set(bad)))


def test_kernels_import_nothing_from_the_wings():
    for f in (PACKAGE / "kernels").glob("*.py"):
        for target, _, line, _ in _imports(f):
            assert not target.startswith(("xgemm.torch", "xgemm.jax", "xgemm.api", "xgemm.prepare")), \
                f"{f.name}:{line} imports {target}"


@pytest.mark.parametrize("op", sorted(registry.TABLE))
def test_every_registered_kernel_declares_every_hook(op):
    names = registry.TABLE[op]
    assert names[-1] == "reference", "the embedded default must be last"
    assert len(set(names)) == len(names)
    for name in names:
        kernel = registry.kernel(name, op)
        assert op in kernel.ops
        for hook in _common.HOOKS:
            assert hasattr(kernel, hook), f"{name} lacks {hook}"
        for hook in ("supports", "policy", "run", "jax_lowering", "prebuild"):
            assert callable(getattr(kernel, hook)), f"{name}.{hook} is not callable"
        assert kernel.backend in ("cute", "gluon", "host"), (name, kernel.backend)
        assert kernel.name == name or name == "reference"


def test_the_registry_is_the_table_policy_walks():
    for op, names in registry.TABLE.items():
        assert policy.kernel_names(op) == list(names)


def test_a_kernel_declares_what_it_serves_once():
    """The registry names modules; which op each of a module's kernels serves is the kernel's own
    `ops`, and no module serves one op twice."""
    for name in registry.names():
        served = [op for k in __import__(registry.module_name(name), fromlist=["KERNELS"]).KERNELS for op in k.ops]
        assert len(served) == len(set(served)), (name, served)
        assert set(served) == {op for op, names in registry.TABLE.items() if name in names}, name


def test_import_xgemm_loads_no_framework_or_compiler():
    code = ("import sys, xgemm; heavy = %r; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))" % sorted(HEAVY))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
