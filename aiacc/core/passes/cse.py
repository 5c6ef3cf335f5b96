"""Common-subexpression elimination."""
from __future__ import annotations

import hashlib

import numpy as np

from aiacc.core.ir import Graph, Node
from aiacc.core.ops.registry import has_side_effects
from aiacc.core.passes.manager import Pass, PassContext, register_pass

_IMPURE = {"Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
           "Bernoulli"}

# constants above this size are not compared byte by byte (hashing them costs more than it saves)
MAX_DEDUP_BYTES = 1 << 24


def _attr_key(value):
    if isinstance(value, np.ndarray):
        return ("tensor", value.dtype.name, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key(v) for v in value)
    if isinstance(value, float) and value != value:
        return ("nan",)
    return value


def _node_key(node: Node):
    return (node.domain, node.op, tuple(None if v is None else id(v) for v in node.inputs), len(node.outputs),
            tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items())))


def dedup_initializers(graph: Graph) -> int:
    """Make readers of identical constants (dtype, shape, bytes) read one of them. Returns how many merged."""
    seen: dict[tuple, object] = {}
    merged = 0
    for v in list(graph.initializers.values()):
        if v.const.nbytes > MAX_DEDUP_BYTES or v.is_graph_output:
            continue
        key = (v.const.dtype.name, v.const.shape, hashlib.sha1(np.ascontiguousarray(v.const).tobytes()).digest())
        keep = seen.get(key)
        if keep is None:
            seen[key] = v
            continue
        if not np.array_equal(keep.const, v.const):
            continue
        v.replace_all_uses_with(keep)
        graph.remove_initializer(v)
        merged += 1
    return merged


def eliminate_common_subexpressions(graph: Graph) -> int:
    merged = dedup_initializers(graph)
    seen: dict[tuple, Node] = {}
    for node in graph.nodes:
        if node.schema is None or node.op in _IMPURE or has_side_effects(node) or not node.outputs:
            continue  # opaque nodes may hide state; random ops differ on every call
        key = _node_key(node)
        other = seen.get(key)
        if other is None:
            seen[key] = node
            continue
        if any(v.is_graph_output for v in node.outputs) and any(v.is_graph_output for v in other.outputs):
            continue  # both names must survive as outputs
        keep, drop = other, node
        renames = [(a, b.name) for a, b in zip(keep.outputs, drop.outputs) if b.is_graph_output]
        for a, b in zip(keep.outputs, drop.outputs):
            b.replace_all_uses_with(a)
        graph.erase(drop)
        for a, name in renames:  # a graph output keeps its name (the kept value was internal)
            a.name = name
        merged += 1
    return merged


@register_pass
class CommonSubexpressionElimination(Pass):
    """Merge nodes computing the same op with the same attributes on the same inputs, and identical
    constants.

    Assumes: registered ops are pure (random ops, Dropout and opaque nodes are never merged).
    Guarantees: every reader sees a bit-identical value; the first (earliest) node is kept, so the order
    stays topological; graph outputs keep their names (two nodes that both produce graph outputs are
    both kept).
    """

    name = "cse"
    level = 1

    def run(self, graph: Graph, ctx: PassContext) -> int:
        return eliminate_common_subexpressions(graph)
