"""The package's module-level import graph (ast, as Python runs it): no module cycle, no loop
between packages (coreecg.<subpackage>), and every import inside a function or class in a module
that says why at its top (`LAZY_MARKER`: an optional dependency, torch kept out of a torch-free
module, or a measured import cost; docs/decisions.md). An import inside a function only to dodge
a cycle does not count: the cycle is fixed instead.

Run as a script for the figures: `python tests/test_import_graph.py`.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAZY_MARKER = "Lazy imports:"


def modules(root: Path = REPO) -> dict[str, tuple[Path, bool]]:
    """coreecg's modules: dotted name -> (file, whether it is a package's __init__)."""
    out = {}
    for f in sorted((root / "coreecg").rglob("*.py")):
        rel = f.relative_to(root).with_suffix("")
        out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = (f, rel.name == "__init__")
    return out


def _resolve(name: str, is_pkg: bool, node: ast.Import | ast.ImportFrom, known: dict) -> list[str]:
    """The coreecg modules an import statement names (`from a import b`: a, and a.b if a module)."""
    if isinstance(node, ast.Import):
        out = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = name.split(".") if is_pkg else name.split(".")[:-1]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join(parts + ([base] if base else []))
        out = [base, *(f"{base}.{a.name}" for a in node.names)]
    return [m for m in out if m in known]


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _top_level(tree: ast.Module) -> tuple[set[int], set[int]]:
    """(ids of the imports Python runs when it imports the module: at its top, in a top-level if or
    try; ids of those under `if TYPE_CHECKING`, which never run)."""
    run, typing_only = set(), set()
    for n in tree.body:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            run.add(id(n))
        elif isinstance(n, (ast.If, ast.Try)):
            target = typing_only if isinstance(n, ast.If) and _is_type_checking(n) else run
            target |= {id(m) for m in ast.walk(n) if isinstance(m, (ast.Import, ast.ImportFrom))}
    return run, typing_only


def import_graph(root: Path = REPO) -> tuple[dict[str, set[str]], dict[str, list[int]]]:
    """(module -> the coreecg modules it imports when imported, a package's __init__ included:
    importing a.b.c runs a.b; module -> the lines of its imports inside functions and classes)."""
    known = modules(root)
    edges: dict[str, set[str]] = {m: set() for m in known}
    inner: dict[str, list[int]] = {}
    for m, (f, is_pkg) in known.items():
        tree = ast.parse(f.read_text())
        run, typing_only = _top_level(tree)
        for n in ast.walk(tree):
            if not isinstance(n, (ast.Import, ast.ImportFrom)) or id(n) in typing_only:
                continue
            if id(n) in run:
                edges[m] |= {t for t in _resolve(m, is_pkg, n, known) if t != m}
            else:
                inner.setdefault(m, []).append(n.lineno)
    for m, targets in edges.items():
        for t in list(targets):
            parts = t.split(".")
            for i in range(2, len(parts)):
                p = ".".join(parts[:i])
                if p in known and p != m and not m.startswith(p + "."):
                    targets.add(p)
    return edges, inner


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph collapsed to coreecg.<subpackage> (a top-level module is its own)."""
    def pkg(m: str) -> str:
        return ".".join(m.split(".")[:2])

    out: dict[str, set[str]] = {}
    for m, targets in edges.items():
        out.setdefault(pkg(m), set())
        for t in targets:
            out.setdefault(pkg(t), set())
            if pkg(t) != pkg(m):
                out[pkg(m)].add(pkg(t))
    return out


def _witnesses(edges: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One module edge behind each package edge inside `comp`, for the failure message."""
    inside = set(comp)
    seen = {}
    for m in sorted(edges):
        for t in sorted(edges[m]):
            a, b = ".".join(m.split(".")[:2]), ".".join(t.split(".")[:2])
            if a != b and a in inside and b in inside:
                seen.setdefault((a, b), f"{m} -> {t}")
    return list(seen.values())


def unexplained(inner: dict[str, list[int]], root: Path = REPO) -> list[str]:
    """`module:line` of each import inside a function or class in a module that does not say why
    (LAZY_MARKER before its first function or class)."""
    known = modules(root)
    out = []
    for m, lines in sorted(inner.items()):
        tree = ast.parse(known[m][0].read_text())
        first = min((n.lineno for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                    ast.ClassDef))), default=None)
        head = known[m][0].read_text().splitlines()[: (first - 1) if first else None]
        if not any(LAZY_MARKER in line for line in head):
            out += [f"{known[m][0].relative_to(root)}:{line}" for line in sorted(lines)]
    return out


def test_no_module_cycle():
    edges, _ = import_graph()
    assert len(edges) > 100                                   # the probe read the package
    found = cycles(edges)
    assert not found, f"module import cycles: {found}"


def test_no_package_loop():
    edges, _ = import_graph()
    found = cycles(package_graph(edges))
    assert not found, "package loops: " + "; ".join(f"{c} (through {', '.join(_witnesses(edges, c))})"
                                                    for c in found)


def test_every_lazy_import_says_why():
    _, inner = import_graph()
    assert "coreecg" in inner                                 # the probe sees the top-level API's lazy loaders
    missing = unexplained(inner)
    assert not missing, (f"imports inside functions in modules that do not say why at their top ({LAZY_MARKER!r}): "
                         f"{', '.join(missing)}; move them to the top, or say why (an optional dependency, a "
                         "torch-free module, a measured import cost)")


def test_the_checks_have_teeth(tmp_path):
    pkg = tmp_path / "coreecg"
    (pkg / "a").mkdir(parents=True)
    (pkg / "b").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("from coreecg.a import x\n")
    (pkg / "a" / "x.py").write_text("from coreecg.b.y import f\n")
    (pkg / "a" / "lazy.py").write_text("def g():\n    import json\n")
    (pkg / "b" / "__init__.py").write_text("")
    (pkg / "b" / "y.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import coreecg.a.x\n"
                                    "from coreecg.a import lazy\n\ndef f():\n    pass\n")
    edges, inner = import_graph(tmp_path)
    assert "coreecg.a" in edges["coreecg.b.y"]               # importing coreecg.a.lazy runs coreecg/a/__init__.py
    assert cycles(edges) == [["coreecg.a", "coreecg.a.x", "coreecg.b.y"]]
    assert cycles(package_graph(edges)) == [["coreecg.a", "coreecg.b"]]
    assert inner == {"coreecg.a.lazy": [2]}                   # TYPE_CHECKING imports never run: not counted
    assert unexplained(inner, tmp_path) == ["coreecg/a/lazy.py:2"]
    (pkg / "a" / "lazy.py").write_text("# Lazy imports: json, for the test.\ndef g():\n    import json\n")
    assert unexplained({"coreecg.a.lazy": [3]}, tmp_path) == []


if __name__ == "__main__":
    edges, inner = import_graph()
    print("imports inside functions/classes:", sum(map(len, inner.values())))
    print("module cycles:", cycles(edges))
    print("package cycles:", cycles(package_graph(edges)))
    print("not explained:", unexplained(inner))
