"""Small helpers shared by the passes."""
from __future__ import annotations

import numpy as np

from aiacc.core.ir import Graph, Node, Value
from aiacc.core.passes.rewrite import const_value  # noqa: F401  (re-exported)


def replace_node_output(graph: Graph, node: Node, new: Value) -> bool:
    """Make readers of `node`'s single output read `new` and erase `node`, keeping a graph output's name
    where possible. Returns False (and changes nothing) when that would leave a graph output renamed to a
    graph input or constant, or listed under a name of another output."""
    old = node.output
    if old.is_graph_output:
        # the replacement must be able to take the graph output's name
        if new.producer is None or new.is_graph_output:
            return False
    name, was_output = old.name, old.is_graph_output
    old.replace_all_uses_with(new)
    graph.erase(node)
    if was_output and not graph.has_value(name):  # (a value that was an input or output keeps its name)
        new.name = name
    return True


def set_const(graph: Graph, value: Value, array: np.ndarray) -> Value:
    """Replace `value` (a node output) by an initializer holding `array`, under the same name.
    The producer is erased when nothing else of it is read."""
    node = value.producer
    name = value.name
    new = graph.add_initializer(graph.fresh_name(name + "_folded"), np.asarray(array))
    value.replace_all_uses_with(new)
    if node is not None and all(not v.uses and not v.is_graph_output for v in node.outputs):
        graph.erase(node)
        new.name = name
    return new


def single_use(v: Value) -> bool:
    """Read by exactly one node input and not a graph output."""
    return len(v.uses) == 1 and not v.is_graph_output


def static_shape(v: Value | None) -> tuple[int, ...] | None:
    if v is None or v.type is None or not v.type.is_static:
        return None
    return tuple(v.shape)
