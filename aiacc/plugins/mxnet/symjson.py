"""MXNet symbol JSON: reading, validating and writing it, and parsing its string attributes.

An MXNet symbol file (`-symbol.json`) holds `nodes` (each with `op`, `name`, `attrs` and `inputs` given as
`[node index, output index, version]`), `arg_nodes` (the variables) and `heads` (the outputs). Every
attribute value is a string ("(3, 3)", "True", "1e-05", "None"); the `attr_*` helpers parse them.

This module needs no mxnet: the importer parses the JSON itself, so a malformed file gets an aiacc error
that names the node, not an MXNet stack trace.
"""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any

from aiacc.errors import ParseError

MXNET_VERSION = 10901  # written into exported files (mxnet 1.9.1); avoids MXNet's legacy upgrade path


@dataclass
class MxNode:
    """One node of a symbol JSON: op ("null" for a variable), name, string attributes, inputs."""

    index: int
    op: str
    name: str
    attrs: dict[str, str] = field(default_factory=dict)
    inputs: list[tuple[int, int]] = field(default_factory=list)  # (node index, output index)
    # other fields of the JSON node kept verbatim: control-flow ops (_foreach, _while_loop, _cond) carry
    # their bodies as "subgraphs"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_variable(self) -> bool:
        return self.op == "null"

    def describe(self) -> str:
        return f"node {self.name!r} ({self.op})"

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.op, "name": self.name}
        if self.attrs:
            d["attrs"] = dict(self.attrs)
        d["inputs"] = [[i, k, 0] for i, k in self.inputs]
        d.update(self.extra)
        return d


@dataclass
class MxSymbol:
    """A parsed symbol JSON: nodes in topological order and the output heads."""

    nodes: list[MxNode]
    heads: list[tuple[int, int]]

    def to_json(self) -> str:
        return json.dumps({
            "nodes": [n.to_json() for n in self.nodes],
            "arg_nodes": [n.index for n in self.nodes if n.is_variable],
            "heads": [[i, k, 0] for i, k in self.heads],
            "attrs": {"mxnet_version": ["int", MXNET_VERSION]},
        }, indent=1)


def parse_symbol_json(text: str | bytes | dict, source: str = "symbol JSON") -> MxSymbol:
    """Parse and check a symbol JSON (text or already-decoded dict). Raises ParseError naming the node."""
    if isinstance(text, dict):
        doc = text
    else:
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise ParseError(f"{source}: not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or "heads" not in doc:
        raise ParseError(f"{source}: not an MXNet symbol (expected an object with 'nodes' and 'heads')")
    nodes: list[MxNode] = []
    for i, raw in enumerate(doc["nodes"]):
        where = f"{source}: node {i}"
        if not isinstance(raw, dict) or not isinstance(raw.get("op"), str) or not isinstance(raw.get("name"), str):
            raise ParseError(f"{where}: every node needs string fields 'op' and 'name', got {raw!r:.120}")
        where = f"{source}: node {i} {raw['name']!r} ({raw['op']})"
        attrs = raw.get("attrs", raw.get("attr", raw.get("param", {}))) or {}
        if not isinstance(attrs, dict):
            raise ParseError(f"{where}: 'attrs' must be an object of strings, got {attrs!r:.80}")
        attrs = {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in attrs.items()}
        inputs = []
        for ref in raw.get("inputs", []):
            if not isinstance(ref, list) or len(ref) < 2 or not all(isinstance(x, int) for x in ref):
                raise ParseError(f"{where}: input {ref!r} is not [node index, output index, version]")
            if not 0 <= ref[0] < i:
                raise ParseError(f"{where}: input refers to node {ref[0]}, which is not an earlier node "
                                 f"(the file has {len(doc['nodes'])} nodes; inputs must come first)")
            inputs.append((ref[0], ref[1]))
        if raw["op"] == "null" and inputs:
            raise ParseError(f"{where}: a variable (op 'null') cannot have inputs")
        # the only other node field that survives re-indexing (control_deps name node indices, and
        # backward_source_id is a pre-1.0 leftover)
        extra = {"subgraphs": raw["subgraphs"]} if raw.get("subgraphs") else {}
        nodes.append(MxNode(i, raw["op"], raw["name"], attrs, inputs, extra))
    heads = []
    for ref in doc["heads"]:
        if not isinstance(ref, list) or len(ref) < 2 or not all(isinstance(x, int) for x in ref) \
                or not 0 <= ref[0] < len(nodes):
            raise ParseError(f"{source}: output head {ref!r} does not refer to a node")
        heads.append((ref[0], ref[1]))
    if not heads:
        raise ParseError(f"{source}: the symbol has no outputs ('heads' is empty)")
    return MxSymbol(nodes, heads)


# -- attribute strings ------------------------------------------------------------------------------

def _literal(node: MxNode, key: str, text: str) -> Any:
    t = text.strip()
    if t in ("None", "none", ""):
        return None
    if t in ("True", "true"):
        return True
    if t in ("False", "false"):
        return False
    # MXNet writes "(1L, 1L)" from old Python 2 builds, "[1,2]" or "(3,)"
    t = t.replace("L,", ",").replace("L)", ")")
    try:
        return ast.literal_eval(t)
    except (ValueError, SyntaxError):
        try:
            return float(t)  # "inf", "-inf", "nan"
        except ValueError:
            raise ParseError(f"{node.describe()}: attribute {key}={text!r} is not a number, tuple or bool") from None


def attr_str(node: MxNode, key: str, default: str | None = None) -> str | None:
    return node.attrs.get(key, default)


def attr_bool(node: MxNode, key: str, default: bool) -> bool:
    if key not in node.attrs:
        return default
    v = _literal(node, key, node.attrs[key])
    if v is None:
        return default
    if isinstance(v, (bool, int)) and v in (0, 1):
        return bool(v)
    raise ParseError(f"{node.describe()}: attribute {key}={node.attrs[key]!r} is not a bool")


def attr_int(node: MxNode, key: str, default: int | None = None) -> int | None:
    if key not in node.attrs:
        return default
    v = _literal(node, key, node.attrs[key])
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
        raise ParseError(f"{node.describe()}: attribute {key}={node.attrs[key]!r} is not an integer")
    return int(v)


def attr_float(node: MxNode, key: str, default: float | None = None) -> float | None:
    if key not in node.attrs:
        return default
    v = _literal(node, key, node.attrs[key])
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ParseError(f"{node.describe()}: attribute {key}={node.attrs[key]!r} is not a number")
    return float(v)


def attr_tuple(node: MxNode, key: str, default: tuple | None = None, allow_none: bool = False) -> tuple | None:
    """A tuple of ints (entries may be None where `allow_none`); a bare int becomes a 1-tuple."""
    if key not in node.attrs:
        return default
    v = _literal(node, key, node.attrs[key])
    if v is None:
        return default
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = (v,)
    if not isinstance(v, (tuple, list)):
        raise ParseError(f"{node.describe()}: attribute {key}={node.attrs[key]!r} is not a tuple")
    out = []
    for x in v:
        if x is None and allow_none:
            out.append(None)
        elif isinstance(x, (int, float)) and not isinstance(x, bool) and int(x) == x:
            out.append(int(x))
        else:
            raise ParseError(f"{node.describe()}: attribute {key}={node.attrs[key]!r} holds {x!r}, not an integer")
    return tuple(out)


def format_attr(value: Any) -> str:
    """An attribute value as MXNet writes it: "(3, 3)", "True", "1e-05", "relu"."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (list, tuple)):
        items = ["None" if x is None else str(int(x)) if float(x).is_integer() else repr(float(x)) for x in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(value, float):
        return repr(value)
    return str(value)
