"""A graph drawn as SVG by Graphviz's `dot`, and the facts shown when a node is clicked.

Layout is Graphviz's (`dot`, the Debian/Ubuntu package `graphviz`): a layered layout made for DAGs, so the
data flow reads top to bottom, and no layout code of our own. Each IR node becomes an SVG group with the id
`<prefix>n<index>` and the classes `irnode`, `op-<op>` and `opaque` / `fused` where they apply; the page's
script finds nodes by those ids. Edges carry the value's type (`f32[1,64,56,56]`); constants are not
drawn, a node says how many it reads.

dot's full layout (network simplex ranking, crossing minimization, spline routing) grows quickly with
the graph: a few hundred nodes take well under a second, but a 24-layer encoder (about 800 nodes) takes
minutes. Above `FULL_LAYOUT_NODES` nodes (or when the full layout runs past its time limit) dot runs with
its fast settings instead: straight edges, one network-simplex pass and no crossing reduction rounds
(4-5 s for 800 nodes); the report says which layout it used.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from aiacc.core.ir import Graph, Node
from aiacc.core.passes.rewrite import sources_of
from aiacc.core.text import format_type
from aiacc.errors import UnsupportedError

FULL_LAYOUT_NODES = 400  # above this, dot's fast settings (see the module docstring)
FULL_LAYOUT_SECONDS = 30.0
FAST_SETTINGS = ("-Gsplines=line", "-Gmclimit=0.1", "-Gnslimit=1", "-Gnslimit1=1", "-Gremincross=false",
                 "-Gsearchsize=5")

# meta keys under which the plugins keep the framework layer a node came from, most specific first
_SOURCE_KEYS = ("source", "caffe_layer", "torch.target", "keras_layer")


@dataclass
class DrawnGraph:
    """A graph's SVG and, by SVG id, what the page shows about each node."""

    svg: str
    nodes: dict[str, dict[str, Any]]  # SVG id -> node facts (see node_facts)
    ids: dict[str, str]  # node name -> SVG id
    layout: str  # "dot" or "dot (fast settings: ...)"
    notes: list[str] = field(default_factory=list)


def dot_binary() -> str:
    """The path of Graphviz's `dot`; UnsupportedError saying how to install it when missing."""
    path = shutil.which("dot")
    if path is None:
        raise UnsupportedError("drawing a graph needs Graphviz's `dot` (Debian/Ubuntu: apt-get install graphviz; "
                               "macOS: brew install graphviz)")
    return path


def _q(s: str) -> str:
    return json.dumps(s)


def sources_list(node: Node) -> list[str]:
    """The framework layers a node came from: one for an imported node, those of every node a fused node
    replaced (aiacc.core.passes.rewrite.sources_of), else what an opaque node's payload names."""
    found = sources_of(node)
    if found:
        return found
    one = source_of(node)
    return [one] if one else []


def source_of(node: Node) -> str | None:
    """The framework layer a node came from, where its plugin recorded one ("; "-joined for a fused node)."""
    if node.meta.get("sources"):
        return "; ".join(node.meta["sources"])
    for key in _SOURCE_KEYS:
        v = node.meta.get(key)
        if isinstance(v, str) and v:
            return v
    mx = node.meta.get("mxnet_node")
    if isinstance(mx, dict) and mx.get("name"):
        return str(mx["name"])
    nd = node.meta.get("node_def")
    if getattr(nd, "name", None):
        return str(nd.name)
    return None


def _attr_text(v: Any) -> str:
    if isinstance(v, np.ndarray):
        if v.size <= 16:
            return f"array({v.tolist()}, {v.dtype})"
        return f"array of shape {list(v.shape)}, {v.dtype}"
    if isinstance(v, Graph):
        return f"subgraph {v.name} ({len(v)} nodes)"
    text = repr(v)
    return text if len(text) <= 200 else text[:197] + "..."


def node_facts(node: Node, flops: int | None) -> dict[str, Any]:
    """What a click on `node` shows: op, attributes, inputs/outputs with types, FLOPs, source layer,
    and for a fused node the rule that made it and the original nodes it replaced."""
    ins = []
    for v in node.inputs:
        if v is None:
            ins.append({"name": "", "type": "(omitted)", "from": ""})
            continue
        src = "constant" if v.is_constant else ("graph input" if v.producer is None else v.producer.name)
        ins.append({"name": v.name, "type": format_type(v.type), "from": src})
    return {
        "name": node.name, "op": node.qualified_op, "opaque": node.is_opaque,
        "attrs": {k: _attr_text(v) for k, v in sorted(node.attrs.items())},
        "inputs": ins,
        "outputs": [{"name": v.name, "type": format_type(v.type),
                     "to": [u.name for u, _ in v.uses][:12]} for v in node.outputs],
        "flops": flops, "source": source_of(node), "sources": sources_list(node),
        "fused_from": list(node.meta.get("replaced", ())), "rule": node.meta.get("rule"),
    }


def to_dot(graph: Graph, prefix: str, flops: Mapping[str, int | None]) -> tuple[str, dict, dict]:
    """DOT text of `graph` with SVG ids `<prefix>n<i>` (nodes), `<prefix>i<i>` (inputs), `<prefix>o<i>`
    (outputs); returns (dot, facts by id, id by node name)."""
    lines = [f"digraph {_q(graph.name)} {{", "  rankdir=TB; bgcolor=transparent;",
             '  node [fontname="Helvetica", fontsize=10, style="rounded,filled", fillcolor="#ffffff"];',
             '  edge [fontname="Helvetica", fontsize=8, color="#777777", fontcolor="#555555"];']
    src_of: dict[int, str] = {}
    facts: dict[str, dict] = {}
    ids: dict[str, str] = {}
    for k, v in enumerate(graph.inputs):
        vid = f"{prefix}i{k}"
        src_of[id(v)] = vid
        lines.append(f"  {vid} [id={_q(vid)}, class=\"graphinput\", shape=ellipse, fillcolor=\"#e8f0fe\", "
                     f"label={_q(v.name + chr(10) + format_type(v.type))}];")
    for k, n in enumerate(graph):
        nid = f"{prefix}n{k}"
        ids[n.name] = nid
        for v in n.outputs:
            src_of[id(v)] = nid
        consts = sum(1 for v in n.inputs if v is not None and v.is_constant)
        label = f"{n.qualified_op}\n{n.name}" + (f"\n({consts} const)" if consts else "")
        classes = ["irnode", "op-" + re.sub(r"[^A-Za-z0-9_]", "_", n.qualified_op)]
        style = ""
        if n.is_opaque:
            classes.append("opaque")
            style = ', style="rounded,filled,dashed", fillcolor="#fff3e0", color="#e65100"'
        elif n.domain == "aiacc":
            classes.append("fused")
            style = ', fillcolor="#e8f5e9", color="#2e7d32"'
        lines.append(f"  {nid} [id={_q(nid)}, class={_q(' '.join(classes))}, shape=box{style}, "
                     f"label={_q(label)}, tooltip={_q(n.qualified_op + ' ' + n.name)}];")
        facts[nid] = node_facts(n, flops.get(n.name))
    for k, n in enumerate(graph):
        for v in n.inputs:
            if v is None or v.is_constant or id(v) not in src_of:
                continue
            lines.append(f"  {src_of[id(v)]} -> {prefix}n{k} [label={_q(format_type(v.type))}];")
    for k, v in enumerate(graph.outputs):
        oid = f"{prefix}o{k}"
        lines.append(f"  {oid} [id={_q(oid)}, class=\"graphoutput\", shape=doubleoctagon, fillcolor=\"#e8f0fe\", "
                     f"label={_q(v.name)}];")
        if id(v) in src_of:
            lines.append(f"  {src_of[id(v)]} -> {oid};")
    lines.append("}")
    return "\n".join(lines) + "\n", facts, ids


def run_dot(dot_text: str, *, fast: bool = False, timeout: float | None = None, fmt: str = "svg") -> str:
    """Lay `dot_text` out with Graphviz's dot and return the output (SVG text by default)."""
    cmd = [dot_binary(), f"-T{fmt}", *(FAST_SETTINGS if fast else ())]
    r = subprocess.run(cmd, input=dot_text.encode(), capture_output=True, timeout=timeout)
    if r.returncode != 0:
        raise UnsupportedError(f"Graphviz dot failed ({r.returncode}): {r.stderr.decode(errors='replace')[:500]}")
    return r.stdout.decode()


def _strip_prolog(svg: str) -> str:
    """The <svg> element alone (no XML declaration or DOCTYPE), to sit inside an HTML page."""
    i = svg.find("<svg")
    return svg[i:] if i >= 0 else svg


def draw(graph: Graph, prefix: str, flops: Mapping[str, int | None] | None = None) -> DrawnGraph:
    """Lay out and draw `graph`: dot's full layout up to FULL_LAYOUT_NODES nodes (and within
    FULL_LAYOUT_SECONDS), its fast settings beyond."""
    text, facts, ids = to_dot(graph, prefix, flops or {})
    notes = []
    svg = None
    if len(graph) <= FULL_LAYOUT_NODES:
        try:
            svg = run_dot(text, timeout=FULL_LAYOUT_SECONDS)
            layout = "dot"
        except subprocess.TimeoutExpired:
            notes.append(f"dot's full layout took over {FULL_LAYOUT_SECONDS:.0f} s")
    else:
        notes.append(f"{len(graph)} nodes: more than {FULL_LAYOUT_NODES}")
    if svg is None:
        svg = run_dot(text, fast=True)
        layout = "dot with its fast settings (straight edges, little crossing reduction)"
        notes.append("laid out with " + layout)
    return DrawnGraph(_strip_prolog(svg), facts, ids, layout, notes)
