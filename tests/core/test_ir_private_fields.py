"""No module outside aiacc/core/ir.py touches a private field or method of the IR's classes.

The private names are read from core/ir.py itself: underscore slots, attributes assigned on `self` and
methods of Value, Node, Graph and the list sentinel. Every other module under aiacc/ is walked with `ast`
for an attribute access `x._name` with one of those names, where `x` is not `self` or `cls` (an object's
own private fields are its business). Plugins and passes use the IR's public API instead (Node.erased,
Graph.add_untyped_input, remove_input, checkpoint/rollback, first_node/last_node...).
"""
from __future__ import annotations

import ast
from pathlib import Path

import aiacc

ROOT = Path(aiacc.__file__).parent
IR = ROOT / "core" / "ir.py"
IR_CLASSES = {"Value", "Node", "Graph", "_Root"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def ir_private_names() -> set[str]:
    names: set[str] = set()
    tree = ast.parse(IR.read_text())
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef) or cls.name not in IR_CLASSES:
            continue
        for stmt in cls.body:
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                    for t in stmt.targets):
                names.update(e.value for e in ast.walk(stmt.value) if isinstance(e, ast.Constant)
                             and isinstance(e.value, str) and _private(e.value))
            elif isinstance(stmt, ast.FunctionDef) and _private(stmt.name):
                names.add(stmt.name)
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id == "self" and _private(node.attr):
                names.add(node.attr)
    return names


def violations(source: str, private: set[str]) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in private and \
                not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            out.append((node.lineno, ast.unparse(node)))
    return sorted(out)


def test_the_private_names_come_from_the_ir():
    names = ir_private_names()
    assert {"_root", "_prev", "_next", "_values", "_erased", "_inputs", "_link", "_new_value"} <= names
    assert "__weakref__" not in names and "name" not in names


def test_the_checker_flags_a_private_access_and_not_an_objects_own():
    private = {"_root", "_erased"}
    assert violations("g._root._prev\nif node._erased: pass\nself._erased = 1\n", private) == \
        [(1, "g._root"), (2, "node._erased")]


def test_no_module_outside_the_ir_touches_its_private_fields():
    private = ir_private_names()
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == IR:
            continue
        for line, expr in violations(path.read_text(), private):
            found.append(f"{path.relative_to(ROOT.parent)}:{line}: {expr}")
    assert not found, "private IR fields used outside aiacc/core/ir.py:\n" + "\n".join(found)
