"""JSON save/load of graphs, weights in a side .npz file.

    save(graph, "model.json")      # writes model.json and model.npz
    g = load("model.json")         # reads both back; load(save(g)) equals g

The JSON holds the structure (inputs, nodes, attributes, types, outputs); the .npz holds every initializer
and every tensor-valued attribute, keyed by position so that any value name works. Node metadata is not
serialized except ONNX attributes the IR cannot hold (kept as base64 protobuf bytes).
"""
from __future__ import annotations

import base64
import json
import os
from typing import Any

import numpy as np

from aiacc.core.ir import Graph, TensorType
from aiacc.errors import ParseError

FORMAT = "aiacc-graph"
VERSION = 1


def _type(t: TensorType | None) -> Any:
    if t is None:
        return None
    return {"dtype": t.dtype, "shape": None if t.shape is None else list(t.shape)}


def _untype(d: Any) -> TensorType | None:
    if d is None:
        return None
    return TensorType(d["dtype"], None if d["shape"] is None else tuple(d["shape"]))


def weights_path(path: str | os.PathLike) -> str:
    """The .npz side file of a JSON graph file."""
    root, _ = os.path.splitext(os.fspath(path))
    return root + ".npz"


def to_dict(graph: Graph) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(JSON-ready structure, arrays for the .npz)."""
    arrays: dict[str, np.ndarray] = {}
    inits = []
    for i, (name, v) in enumerate(graph.initializers.items()):
        arrays[f"init{i}"] = v.const
        inits.append({"name": name, "data": f"init{i}"})
    nodes = []
    for k, n in enumerate(graph):
        attrs: dict[str, Any] = {}
        for key in sorted(n.attrs):
            val = n.attrs[key]
            if isinstance(val, np.ndarray):
                ref = f"attr{k}_{len(arrays)}"
                arrays[ref] = val
                attrs[key] = {"tensor": ref}
            elif isinstance(val, (list, tuple)):
                attrs[key] = {"list": [x.item() if isinstance(x, np.generic) else x for x in val]}
            else:
                attrs[key] = {"value": val.item() if isinstance(val, np.generic) else val}
        entry = {"name": n.name, "op": n.op, "domain": n.domain,
                 "inputs": [None if v is None else v.name for v in n.inputs],
                 "outputs": [{"name": v.name, "type": _type(v.type)} for v in n.outputs], "attrs": attrs}
        raw = n.meta.get("onnx_attributes")
        if raw:
            entry["onnx_attributes"] = [base64.b64encode(r).decode("ascii") for r in raw]
        nodes.append(entry)
    doc = {"format": FORMAT, "version": VERSION, "name": graph.name, "doc": graph.doc,
           "opset_imports": graph.opset_imports,
           "inputs": [{"name": v.name, "type": _type(v.type)} for v in graph.inputs],
           "initializers": inits, "nodes": nodes, "outputs": [v.name for v in graph.outputs]}
    return doc, arrays


def from_dict(doc: dict[str, Any], arrays: dict[str, np.ndarray], where: str = "<graph>") -> Graph:
    """Rebuild a Graph from `to_dict`'s output."""
    if doc.get("format") != FORMAT:
        raise ParseError(f"{where}: not an aiacc graph (format {doc.get('format')!r})")
    if doc.get("version", 0) > VERSION:
        raise ParseError(f"{where}: written by a newer aiacc (version {doc['version']})")
    try:
        g = Graph(doc["name"])
        g.doc = doc.get("doc", "")
        g.opset_imports = dict(doc.get("opset_imports", {"": 17}))
        for i in doc["inputs"]:
            t = _untype(i["type"])
            if t is None:
                g.add_untyped_input(i["name"])
            else:
                g.add_input(i["name"], t.dtype, t.shape)
        for i in doc["initializers"]:
            if i["data"] not in arrays:
                raise ParseError(f"{where}: weights for initializer {i['name']!r} are missing")
            v = g.add_initializer(i["name"], arrays[i["data"]])
            if v.name != i["name"]:
                raise ParseError(f"{where}: initializer name {i['name']!r} is used twice")
        for n in doc["nodes"]:
            ins = []
            for name in n["inputs"]:
                if name is not None and not g.has_value(name):
                    raise ParseError(f"{where}: input %{name} of node {n['name']} is not defined before it")
                ins.append(None if name is None else g.value(name))
            attrs = {}
            for key, a in n["attrs"].items():
                if "tensor" in a:
                    attrs[key] = np.asarray(arrays[a["tensor"]])
                elif "list" in a:
                    attrs[key] = list(a["list"])
                else:
                    attrs[key] = a["value"]
            node = g.add_node(n["op"], ins, attrs, domain=n["domain"], name=n["name"],
                              outputs=[o["name"] for o in n["outputs"]],
                              output_types=[_untype(o["type"]) for o in n["outputs"]])
            if node.name != n["name"] or [v.name for v in node.outputs] != [o["name"] for o in n["outputs"]]:
                raise ParseError(f"{where}: names of node {n['name']} clash with earlier ones")
            if n.get("onnx_attributes"):
                node.meta["onnx_attributes"] = [base64.b64decode(r) for r in n["onnx_attributes"]]
        outs = []
        for name in doc["outputs"]:
            if not g.has_value(name):
                raise ParseError(f"{where}: graph output %{name} is not defined")
            outs.append(g.value(name))
        g.outputs = outs
    except (KeyError, TypeError) as e:
        raise ParseError(f"{where}: malformed aiacc graph JSON ({type(e).__name__}: {e})") from e
    return g


def save(graph: Graph, path: str | os.PathLike) -> str:
    """Write `graph` to `path` (JSON) and its weights next to it (.npz); returns the weights path."""
    doc, arrays = to_dict(graph)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    wpath = weights_path(path)
    np.savez(wpath, **arrays)
    return wpath


def load(path: str | os.PathLike) -> Graph:
    """Read a graph written by `save`."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise ParseError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from e
    wpath = weights_path(path)
    arrays: dict[str, np.ndarray] = {}
    if os.path.exists(wpath):
        with np.load(wpath, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    return from_dict(doc, arrays, where=os.fspath(path))
