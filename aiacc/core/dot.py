"""Graphviz DOT of a graph (for `aiacc dump --format dot`): one box per node, edges labelled with types."""
from __future__ import annotations

import json

from aiacc.core.ir import Graph
from aiacc.core.text import format_type


def _q(s: str) -> str:
    return json.dumps(s)


def to_dot(graph: Graph, *, show_constants: bool = False) -> str:
    """DOT text: graph inputs as ellipses, nodes as boxes, outputs as double octagons; constants hidden
    unless `show_constants` (they are listed in the node label as a count)."""
    lines = [f"digraph {_q(graph.name)} {{", "  rankdir=TB;", '  node [fontname="Helvetica", fontsize=10];']
    for v in graph.inputs:
        lines.append(f"  {_q('in:' + v.name)} [shape=ellipse, label={_q(v.name + chr(10) + format_type(v.type))}];")
    if show_constants:
        for v in graph.initializers.values():
            lines.append(f"  {_q('const:' + v.name)} [shape=note, label={_q(v.name + chr(10) + format_type(v.type))}];")
    node_id = {}
    for n in graph:
        nid = "node:" + n.name
        for v in n.outputs:
            node_id[id(v)] = nid
        consts = sum(1 for v in n.inputs if v is not None and v.is_constant)
        label = f"{n.qualified_op}\n{n.name}" + (f"\n({consts} const)" if consts and not show_constants else "")
        style = ', style=dashed' if n.is_opaque else ""
        lines.append(f"  {_q(nid)} [shape=box{style}, label={_q(label)}];")
    for v in graph.inputs:
        node_id[id(v)] = "in:" + v.name
    for n in graph:
        for v in n.inputs:
            if v is None:
                continue
            if v.is_constant:
                if not show_constants:
                    continue
                src = "const:" + v.name
            else:
                src = node_id[id(v)]
            lines.append(f"  {_q(src)} -> {_q('node:' + n.name)} [label={_q(format_type(v.type))}];")
    for k, v in enumerate(graph.outputs):
        oid = f"out:{k}:{v.name}"
        lines.append(f"  {_q(oid)} [shape=doubleoctagon, label={_q(v.name)}];")
        src = node_id.get(id(v), ("const:" if v.is_constant else "in:") + v.name)
        lines.append(f"  {_q(src)} -> {_q(oid)};")
    lines.append("}")
    return "\n".join(lines) + "\n"
