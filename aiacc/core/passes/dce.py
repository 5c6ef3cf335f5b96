"""Dead-code elimination."""
from __future__ import annotations

from aiacc.core.ir import Graph
from aiacc.core.ops.registry import has_side_effects
from aiacc.core.passes.manager import Pass, PassContext, register_pass


def eliminate_dead_code(graph: Graph) -> int:
    """Erase every node none of whose outputs is read (by a node or as a graph output), latest first so
    chains die in one sweep, then drop initializers nothing reads. Returns the number of nodes erased.

    A node with side effects (`has_side_effects`: its schema says so, or `meta["side_effects"]`) is kept
    even when its outputs are unused.
    """
    erased = 0
    for node in reversed(graph.nodes):
        if has_side_effects(node):
            continue
        if all(not v.uses and not v.is_graph_output for v in node.outputs):
            graph.erase(node)
            erased += 1
    graph.remove_unused_initializers()
    return erased


@register_pass
class DeadCodeElimination(Pass):
    """Remove nodes whose outputs nobody reads and initializers nobody reads.

    Assumes: nodes are pure (no side effects) unless their schema or `node.meta["side_effects"]` says
    otherwise; opaque nodes count as pure.
    Guarantees: graph outputs, and every value they depend on, are untouched; the graph stays topological.
    """

    name = "dce"
    level = 1

    def run(self, graph: Graph, ctx: PassContext) -> int:
        return eliminate_dead_code(graph)
