"""No module-level import cycle inside the `aiacc` package.

Every module's top-level imports are read with `ast` (imports inside functions do not count, nor those
under `if TYPE_CHECKING:`); `from pkg import name` is an edge to `pkg.name` when that is a module, else to
`pkg`. A strongly connected component of more than one module (or a module importing itself) is a cycle.
Op tables import their host module, never the other way round (see DESIGN.md).
"""
from __future__ import annotations

import ast
from pathlib import Path

import aiacc

ROOT = Path(aiacc.__file__).parent


def module_files() -> dict[str, Path]:
    """Every aiacc module by dotted name (packages by their __init__)."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def top_level_imports(tree: ast.Module):
    """Import statements executed when the module is imported: the module body and the blocks of its
    top-level if/try/with statements, not function or class bodies, not `if TYPE_CHECKING:`."""
    todo = list(tree.body)
    while todo:
        stmt = todo.pop(0)
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            yield stmt
        elif isinstance(stmt, ast.If):
            if not _is_type_checking(stmt.test):
                todo[:0] = stmt.body
            todo[:0] = stmt.orelse
        elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            todo[:0] = stmt.body + [s for h in stmt.handlers for s in h.body] + stmt.orelse + stmt.finalbody
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            todo[:0] = stmt.body


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        for stmt in top_level_imports(tree):
            if isinstance(stmt, ast.Import):
                targets = [alias.name for alias in stmt.names]
            else:
                base = stmt.module or ""
                if stmt.level:
                    pkg = name.split(".") if is_package else name.split(".")[:-1]
                    pkg = pkg[:len(pkg) - (stmt.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in stmt.names]
            for t in targets:
                while t and t not in modules:  # `import aiacc.x.y` of a name inside a module
                    t = t.rpartition(".")[0]
                if t:
                    graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components that are cycles (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            for succ in it:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1 or node in graph[node]:
                        found.append(sorted(comp))
    return found


def test_the_checker_finds_a_cycle_and_skips_function_and_type_checking_imports():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(cycles(g)) == [["a", "b", "c"], ["e"]]
    tree = ast.parse("import os\nif TYPE_CHECKING:\n    import x\nelse:\n    import y\n"
                     "try:\n    import z\nexcept ImportError:\n    import w\ndef f():\n    import v\n")
    names = [a.name for s in top_level_imports(tree) for a in s.names]
    assert names == ["os", "y", "z", "w"]


def test_the_import_graph_sees_real_edges():
    g = import_graph()
    assert "aiacc.core.ir" in g["aiacc.core.ops.registry"]
    assert "aiacc.core.ops" in g["aiacc.core"]  # `from aiacc.core import ops`: the submodule


def test_no_module_level_import_cycle():
    found = cycles(import_graph())
    assert not found, "module-level import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)
