"""Removal of Identity nodes, no-op Casts and inference-time Dropout."""
from __future__ import annotations

from aiacc.core.ir import Graph, Node
from aiacc.core.passes.manager import Pass, PassContext, register_pass
from aiacc.core.passes.utils import const_value, replace_node_output


def _dropout_is_identity(node: Node) -> bool:
    """Dropout computes the identity when training_mode is absent or a constant false, or ratio is 0."""
    ins = node.inputs
    ratio = const_value(ins[1]) if len(ins) > 1 and ins[1] is not None else None
    if len(ins) > 2 and ins[2] is not None:
        tm = const_value(ins[2])
        if tm is None:
            return ratio is not None and float(ratio.reshape(-1)[0]) == 0.0
        if bool(tm.reshape(-1)[0]):
            return ratio is not None and float(ratio.reshape(-1)[0]) == 0.0
    return True


def remove_identities(graph: Graph, ctx: PassContext) -> int:
    removed = 0
    for node in graph.nodes:
        if node.domain != "" or node.inputs == () or node.inputs[0] is None:
            continue
        if node.op == "Identity":
            pass
        elif node.op == "Cast":
            x = node.inputs[0]
            if x.dtype is None or x.dtype != node.attr("to"):
                continue  # a real conversion (or one whose source type is unknown)
        elif node.op == "Dropout" and ctx.inference:
            if not _dropout_is_identity(node):
                continue
            if len(node.outputs) > 1 and (node.outputs[1].uses or node.outputs[1].is_graph_output):
                continue  # the mask is read: keep the node (it is an all-true mask at inference)
        else:
            continue
        x = node.inputs[0]
        if len(node.outputs) > 1:
            # a Dropout with an unused mask output: readers of the data output read x instead
            out = node.outputs[0]
            if out.is_graph_output and (x.producer is None or x.is_graph_output):
                continue
            name = out.name
            out.replace_all_uses_with(x)
            graph.erase(node)
            if x.is_graph_output and not graph.has_value(name):
                x.name = name
            removed += 1
            continue
        if replace_node_output(graph, node, x):
            removed += 1
    return removed


@register_pass
class IdentityRemoval(Pass):
    """Remove Identity nodes, Casts to the dtype their input already has, and (in inference mode) Dropout
    nodes that compute the identity: those whose training_mode input is absent or a constant false (or
    whose ratio is a constant 0) and whose mask output nobody reads.

    Assumes: nothing beyond ONNX semantics.
    Guarantees: readers see the very same array; graph outputs keep their names (an Identity that maps a
    graph input or another output straight to a graph output is kept, since removing it would rename it).
    """

    name = "identity_removal"
    level = 1

    def run(self, graph: Graph, ctx: PassContext) -> int:
        return remove_identities(graph, ctx)
