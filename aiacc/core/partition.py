"""Split a graph into segments a backend can run whole and single nodes it cannot.

Used by execution backends (onnxruntime) that run most of a graph but must hand opaque nodes back to
their framework: each maximal run of supported nodes, in schedule order, becomes its own `Graph`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from aiacc.core.ir import Graph, Node


@dataclass
class Segment:
    """A run of consecutive nodes. `graph` is set for a supported run (a self-contained subgraph whose
    inputs and outputs keep the parent's value names); `node` is set for a single unsupported node."""

    graph: Graph | None = None
    node: Node | None = None

    @property
    def input_names(self) -> list[str]:
        if self.graph is not None:
            return [v.name for v in self.graph.inputs]
        return [v.name for v in self.node.inputs if v is not None and not v.is_constant]

    @property
    def output_names(self) -> list[str]:
        if self.graph is not None:
            return [v.name for v in self.graph.outputs]
        return [v.name for v in self.node.outputs]


def partition(graph: Graph, supported: Callable[[Node], bool]) -> list[Segment]:
    """Segments in execution order; constants used by a supported run are copied into its subgraph."""
    runs: list[list[Node] | Node] = []
    for node in graph:
        if supported(node):
            if runs and isinstance(runs[-1], list):
                runs[-1].append(node)
            else:
                runs.append([node])
        else:
            runs.append(node)
    # values needed after each run: read by a later node or a graph output
    needed_later: list[set[int]] = []
    later: set[int] = {id(v) for v in graph.outputs}
    for run in reversed(runs):
        needed_later.append(set(later))
        nodes = run if isinstance(run, list) else [run]
        for n in nodes:
            later.update(id(v) for v in n.inputs if v is not None)
    needed_later.reverse()
    segments = []
    for run, needed in zip(runs, needed_later):
        if isinstance(run, Node):
            segments.append(Segment(node=run))
        else:
            segments.append(Segment(graph=_subgraph(graph, run, needed)))
    return segments


def _subgraph(parent: Graph, nodes: list[Node], needed: set[int]) -> Graph:
    g = Graph(f"{parent.name}_segment")
    g.opset_imports = dict(parent.opset_imports)
    vmap: dict[int, object] = {}
    inside = {id(v) for n in nodes for v in n.outputs}
    for n in nodes:
        ins = []
        for v in n.inputs:
            if v is None:
                ins.append(None)
                continue
            if id(v) not in vmap:
                if v.is_constant:
                    vmap[id(v)] = g.add_initializer(v.name, v.const)
                elif id(v) not in inside:
                    vmap[id(v)] = g.add_input(v.name, v.dtype, v.shape)
            ins.append(vmap[id(v)])
        new = g.add_node(n.op, ins, n.attrs, domain=n.domain, name=n.name, outputs=[v.name for v in n.outputs],
                         output_types=[v.type for v in n.outputs])
        new.meta = dict(n.meta)
        for old, nv in zip(n.outputs, new.outputs):
            vmap[id(old)] = nv
    for n in nodes:
        for v in n.outputs:
            if id(v) in needed:
                g.add_output(vmap[id(v)])
    return g
