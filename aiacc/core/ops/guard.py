"""aiacc::ValueGuard: a run-time check that a condition has the value a trace was specialised on.

A framework tracer that meets a Python branch on tensor data (`if x.sum() > 0:`, `if mask.any().item():`)
answers it with the example's value, so the graph holds only the branch the example took. The guard keeps
that specialisation safe: it reads the condition on every call and raises GuardError when its truth value
differs from the example's, so a call that would take the other branch never gets a wrong answer.

Its output passes the condition through (the IR wants one) and is read by nobody: the schema is marked
`side_effects`, so dead-code elimination, CSE and constant folding keep the node (that mark is part of the
op, so it survives copies and serialization, which drop node.meta).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from aiacc.core.ir import Node, TensorType
from aiacc.core.ops.registry import REQUIRED, InferContext, OpSchema, get_schema, op
from aiacc.errors import GuardError, UnsupportedError, fallback

DOMAIN = "aiacc"
OP = "ValueGuard"


def truth(cond: np.ndarray, where: str) -> bool:
    """Python's bool() of a one-element array (what `if cond:` read); GuardError for any other size."""
    a = np.asarray(cond)
    if a.size != 1:
        raise GuardError(f"{where}: the guarded condition has {a.size} elements (shape {list(a.shape)}); "
                         f"a branch reads exactly one")
    return bool(a.reshape(-1)[0])


def mismatch_message(where: str, what: str, expected: bool) -> str:
    """The error text of a guard whose condition is not `expected` on this call (shared by every kernel)."""
    return (f"{where}: the model was specialised on the example's value of {what} ({expected}), and this call "
            f"gives {not expected}: it would take the other branch of the original's Python code, which the "
            f"optimized model does not hold; optimize again with an example that takes it")


def _infer(ctx: InferContext) -> list[TensorType | None]:
    return [ctx.type(0)]


def _run(schema: OpSchema, node: Node, arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    attrs = schema.resolved_attrs(node)
    expected, what = bool(attrs["expected"]), attrs["what"] or "a condition"
    where = f"node {node.name} ({DOMAIN}::{OP})"
    if truth(arrays[0], where) != expected:
        raise GuardError(f"{where}: {attrs['message']}" if attrs["message"] else
                         mismatch_message(where, what, expected))
    return [np.asarray(arrays[0])]


# `message`: the error's own text, for a check that is not a branch the trace fixed (a loss's targets inside
# the class range, where torch raises and a one-hot would silently pick nothing); "" is the branch wording
@op(OP, domain=DOMAIN, attrs={"expected": ("int", REQUIRED), "what": ("string", ""), "message": ("string", "")},
    infer=_infer, side_effects=True)
def value_guard(cond, *, expected, what, message=""):
    """cond, unchanged; raises GuardError when bool(cond) != bool(expected) (`what`: the condition in the
    source, for the message; `message`, when given, is the error's text instead). The node-aware runner below
    is what executors call."""
    if truth(cond, "ValueGuard") != bool(expected):
        raise GuardError(f"ValueGuard: {message}" if message else
                         mismatch_message("ValueGuard", what or "a condition", bool(expected)))
    return np.asarray(cond)


def guards_of(graph) -> list[Node]:
    """The graph's value guards, in graph order."""
    return [n for n in graph if n.domain == DOMAIN and n.op == OP]


def input_checks_of(graph) -> list[Node]:
    """The value guards that are no branch but a check that an input is one the original accepts (they have a
    `message`: embedding ids in the table, a loss's class-index targets), where the original raises."""
    return [n for n in guards_of(graph) if n.attrs.get("message")]


def without_input_checks(graph, target: str):
    """`graph`, or a copy without its input checks (`input_checks_of`) and the nodes only they read, for an
    exporter (`target`) that has no run-time check: the written model answers an input the original refuses
    as that format's own ops do (a negative embedding id reads a row from the end, as torch.onnx.export's
    Gather of the original would), never a valid input differently; warned (a fallback) naming them. The
    branch guards are `refuse_guards`' (dropping one could give wrong answers)."""
    if not input_checks_of(graph):
        return graph
    graph = graph.copy()
    checks = input_checks_of(graph)
    for n in checks:
        todo = [n]
        while todo:  # the guard, then each producer of its condition nobody else reads
            node = todo.pop()
            if any(v.uses or v.is_graph_output for v in node.outputs):
                continue
            ins = [v.producer for v in node.inputs if v is not None and v.producer is not None]
            graph.erase(node)
            todo.extend(p for p in ins if not p.erased)
    names = ", ".join(n.name for n in checks[:5]) + (" ..." if len(checks) > 5 else "")
    fallback(f"input-checks:{target}", f"{target} has no run-time check: the model written leaves out "
             f"{len(checks)} check(s) that an input is one the original accepts ({names}); such an input is "
             f"answered as {target}'s own ops do")
    return graph


def refuse_guards(graph, target: str) -> None:
    """An UnsupportedError naming the first value guard that fixes a branch, for an exporter (`target`:
    "ONNX", "TensorFlow", ...) that cannot run aiacc's run-time checks: dropping one would let a call take
    the wrong branch. Input checks (`input_checks_of`) are `without_input_checks`'."""
    nodes = [n for n in guards_of(graph) if not n.attrs.get("message")]
    if nodes:
        n = nodes[0]
        raise UnsupportedError(
            f"node {n.name} ({DOMAIN}::{OP}, guarding {n.attrs.get('what') or 'a condition'}): {target} has no "
            f"counterpart of aiacc's run-time value guard, and dropping it could give wrong answers "
            f"({len(nodes)} guard(s) in the graph)")


get_schema(OP, DOMAIN).node_runner = _run  # the message names the node (as Split's runner needs it)
