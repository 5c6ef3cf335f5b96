"""The readable text form of a graph: `print_graph(g)` writes it, `parse(text)` reads it back, and
`parse(print_graph(g))` equals `g`.

    graph main(%x: float32[N,3,8,8]) {
      %w: float32[4,3,3,3] = const                    # data in the weights side file (large constants)
      %b: float32[4] = const [0.1, 0.2, 0.3, 0.4]     # small constants inline
      %y: float32[N,4,8,8] = Conv<conv1>(%x, %w, %b) {pads=[1,1,1,1]}
      %z: float32[N,4,8,8] = aiacc::FusedRelu<r>(%y)
      return %z
    }

Types are `dtype[dims]` with symbolic dims as names, `?` for an unknown dim, `dtype[*]` for an unknown
rank and `?` alone for an unknown type. `_` is an omitted optional input. Names that are not plain
identifiers (letters, digits, `_ . - /`) are written as JSON strings, e.g. `%"conv/BiasAdd:0"`.
`#` starts a comment.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from aiacc.core.ir import Graph, TensorType
from aiacc.errors import ParseError

INLINE_CONST_LIMIT = 16  # constants with at most this many elements are printed inline

_PLAIN = re.compile(r"^[A-Za-z0-9_.\-/]+$")


# ------------------------------------------------------------------------------------------------
# printing
# ------------------------------------------------------------------------------------------------
def _name(name: str) -> str:
    return name if _PLAIN.match(name) and name != "_" else json.dumps(name)


def format_type(t: TensorType | None) -> str:
    if t is None:
        return "?"
    dtype = t.dtype or "?"
    if t.shape is None:
        return f"{dtype}[*]"
    dims = ",".join("?" if d is None else (str(d) if isinstance(d, int) else _name(d)) for d in t.shape)
    return f"{dtype}[{dims}]"


def format_float(f: float, digits: str = "r") -> str:
    """A float as text: nan, inf, -inf, else repr (round-trips exactly) or format(f, digits)."""
    f = float(f)
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    return repr(f) if digits == "r" else format(f, digits)


def format_scalar(x: Any, digits: str = "r") -> str:
    """One attribute or constant element as text (floats via `format_float` with `digits`)."""
    if isinstance(x, (bool, np.bool_)):
        return "true" if x else "false"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        return format_float(x, digits)
    if isinstance(x, (complex, np.complexfloating)):
        raise ParseError("complex constants have no text form")
    return json.dumps(str(x))



def _flat(array: np.ndarray) -> str:
    return "[" + ", ".join(format_scalar(x) for x in array.reshape(-1).tolist()) + "]"


def format_attr(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"tensor<{format_type(TensorType(value.dtype.name, value.shape))}>{_flat(value)}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_scalar(x) for x in value) + "]"
    return format_scalar(value)


def _typed(v) -> str:
    return f"%{_name(v.name)}" + ("" if v.type is None else f": {format_type(v.type)}")


def print_graph(graph: Graph, *, inline_limit: int = INLINE_CONST_LIMIT) -> str:
    """The text form of `graph`; constants larger than `inline_limit` elements are written as `const`."""
    lines = [f"graph {_name(graph.name)}(" + ", ".join(_typed(v) for v in graph.inputs) + ") {"]
    for v in graph.initializers.values():
        data = f" {_flat(v.const)}" if v.const.size <= inline_limit else ""
        lines.append(f"  {_typed(v)} = const{data}")
    for node in graph:
        outs = ", ".join(_typed(v) for v in node.outputs)
        ins = ", ".join("_" if v is None else f"%{_name(v.name)}" for v in node.inputs)
        op = f"{_name(node.domain)}::{_name(node.op)}" if node.domain else _name(node.op)
        attrs = ""
        if node.attrs:
            attrs = " {" + ", ".join(f"{_name(k)}={format_attr(node.attrs[k])}" for k in sorted(node.attrs)) + "}"
        lines.append(f"  {outs} = {op}<{_name(node.name)}>({ins}){attrs}")
    lines.append("  return " + ", ".join(f"%{_name(v.name)}" for v in graph.outputs))
    lines.append("}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------
# parsing
# ------------------------------------------------------------------------------------------------
_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r]+) | (?P<comment>\#[^\n]*) | (?P<nl>\n)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<number>-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\.\d+(?:[eE][-+]?\d+)?|\d+)(?![A-Za-z_.\-/]))
  | (?P<word>-?[A-Za-z0-9_.\-/]+)
  | (?P<punct>::|[%(){}\[\],:=<>_?*])
""", re.VERBOSE)


class _Tokens:
    def __init__(self, text: str):
        self.toks: list[tuple[str, str, int]] = []
        line, pos = 1, 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise ParseError(f"line {line}: unexpected character {text[pos]!r}")
            kind = m.lastgroup
            if kind == "nl":
                line += 1
            elif kind not in ("ws", "comment"):
                val = m.group()
                if kind == "word" and val == "_":
                    kind = "punct"
                self.toks.append((kind, val, line))
            pos = m.end()
        self.i = 0

    def peek(self, k: int = 0) -> tuple[str, str, int]:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else ("eof", "", self.toks[-1][2] if self.toks else 1)

    def next(self) -> tuple[str, str, int]:
        t = self.peek()
        self.i += 1
        return t

    def error(self, message: str) -> ParseError:
        kind, val, line = self.peek()
        return ParseError(f"line {line}: {message} (found {val!r})" if kind != "eof" else
                          f"line {line}: {message} (found end of text)")

    def expect(self, val: str) -> None:
        if self.peek()[1] != val or self.peek()[0] in ("string",):
            raise self.error(f"expected {val!r}")
        self.next()

    def accept(self, val: str) -> bool:
        if self.peek()[1] == val and self.peek()[0] == "punct":
            self.next()
            return True
        return False

    def name(self) -> str:
        kind, val, _ = self.peek()
        if kind == "string":
            self.next()
            return json.loads(val)
        if kind in ("word", "number"):
            self.next()
            return val
        raise self.error("expected a name")


def _parse_scalar(toks: _Tokens) -> Any:
    kind, val, _ = toks.next()
    if kind == "number":
        return float(val) if any(c in val for c in ".eE") else int(val)
    if kind == "string":
        return json.loads(val)
    if kind == "word":
        special = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "true": True, "false": False}
        if val in special:
            return special[val]
    toks.i -= 1
    raise toks.error("expected a number, string, true/false, nan or inf")


def _parse_list(toks: _Tokens) -> list:
    toks.expect("[")
    items = []
    if not toks.accept("]"):
        while True:
            items.append(_parse_scalar(toks))
            if toks.accept("]"):
                break
            toks.expect(",")
    return items


def _parse_type(toks: _Tokens) -> TensorType | None:
    if toks.accept("?"):
        return None
    dtype = toks.name()
    toks.expect("[")
    if toks.accept("*"):
        toks.expect("]")
        return TensorType(dtype, None)
    dims: list = []
    if not toks.accept("]"):
        while True:
            if toks.accept("?"):
                dims.append(None)
            else:
                kind, val, _ = toks.peek()
                if kind == "number":
                    toks.next()
                    dims.append(int(val))
                else:
                    dims.append(toks.name())
            if toks.accept("]"):
                break
            toks.expect(",")
    return TensorType(dtype, tuple(dims))


def _parse_attr_value(toks: _Tokens) -> Any:
    kind, val, _ = toks.peek()
    if kind == "word" and val == "tensor":
        toks.next()
        toks.expect("<")
        t = _parse_type(toks)
        toks.expect(">")
        data = _parse_list(toks)
        return np.asarray(data, dtype=t.dtype).reshape(t.shape)
    if val == "[" and kind == "punct":
        return _parse_list(toks)
    return _parse_scalar(toks)


def _parse_value_ref(toks: _Tokens) -> str:
    toks.expect("%")
    return toks.name()


def _parse_typed(toks: _Tokens) -> tuple[str, TensorType | None, bool]:
    name = _parse_value_ref(toks)
    if toks.accept(":"):
        return name, _parse_type(toks), True
    return name, None, False


def parse(text: str, weights: dict[str, np.ndarray] | None = None) -> Graph:
    """Read the text form back into a Graph. Constants written as bare `const` take their data from
    `weights` (name -> array). Errors name the line."""
    from aiacc.core.ops import get_schema

    toks = _Tokens(text)
    if toks.peek()[1] != "graph":
        raise toks.error("expected 'graph'")
    toks.next()
    g = Graph(toks.name())
    toks.expect("(")
    if not toks.accept(")"):
        while True:
            line = toks.peek()[2]
            name, t, _ = _parse_typed(toks)
            if g.has_value(name):
                raise ParseError(f"line {line}: %{name} is defined twice")
            if t is None:
                g.add_untyped_input(name)
            else:
                g.add_input(name, t.dtype, t.shape)
            if toks.accept(")"):
                break
            toks.expect(",")
    toks.expect("{")
    while True:
        kind, val, line = toks.peek()
        if kind == "word" and val == "return":
            toks.next()
            outs = []
            if toks.peek()[1] == "%":
                while True:
                    ref = _parse_value_ref(toks)
                    if not g.has_value(ref):
                        raise ParseError(f"line {line}: return of undefined value %{ref}")
                    outs.append(g.value(ref))
                    if not toks.accept(","):
                        break
            g.outputs = outs
            toks.expect("}")
            break
        if kind == "eof":
            raise toks.error("expected 'return'")
        # one statement: outputs = const ... | outputs = op<name>(inputs) {attrs}
        targets = [_parse_typed(toks)]
        while toks.accept(","):
            targets.append(_parse_typed(toks))
        for name, _, _ in targets:
            if g.has_value(name):
                raise ParseError(f"line {line}: %{name} is defined twice")
        toks.expect("=")
        if toks.peek() == ("word", "const", toks.peek()[2]):
            toks.next()
            name, t, _ = targets[0]
            if len(targets) != 1 or t is None or not t.is_static:
                raise ParseError(f"line {line}: a constant needs exactly one name and a static type")
            if toks.peek()[1] == "[":
                data = np.asarray(_parse_list(toks), dtype=t.dtype).reshape(t.shape)
            elif weights is not None and name in weights:
                data = np.asarray(weights[name])
                if data.dtype.name != t.dtype or tuple(data.shape) != t.shape:
                    raise ParseError(f"line {line}: weights for %{name} are {data.dtype.name}{list(data.shape)}, "
                                     f"the text says {format_type(t)}")
            else:
                raise ParseError(f"line {line}: no data for constant %{name} (pass weights=)")
            g.add_initializer(name, data)
            continue
        op = toks.name()
        domain = ""
        if toks.accept("::"):
            domain, op = op, toks.name()
        toks.expect("<")
        node_name = toks.name()
        toks.expect(">")
        toks.expect("(")
        inputs = []
        if not toks.accept(")"):
            while True:
                if toks.accept("_"):
                    inputs.append(None)
                else:
                    ref = _parse_value_ref(toks)
                    if not g.has_value(ref):
                        raise ParseError(f"line {line}: input %{ref} of node {node_name} is not defined before it")
                    inputs.append(g.value(ref))
                if toks.accept(")"):
                    break
                toks.expect(",")
        attrs: dict[str, Any] = {}
        if toks.accept("{"):
            while True:
                key = toks.name()
                toks.expect("=")
                attrs[key] = _parse_attr_value(toks)
                if toks.accept("}"):
                    break
                toks.expect(",")
        if g.has_node_name(node_name):
            raise ParseError(f"line {line}: node name {node_name} is used twice")
        attrs = _coerce_attrs(get_schema(op, domain), attrs)
        all_typed = all(typed for _, _, typed in targets)
        node = g.add_node(op, inputs, attrs, domain=domain, name=node_name, outputs=[n for n, _, _ in targets],
                          output_types=[t for _, t, _ in targets] if all_typed else None,
                          infer=not all_typed)
        if node.name != node_name or [v.name for v in node.outputs] != [n for n, _, _ in targets]:
            raise ParseError(f"line {line}: names of node {node_name} clash")
        if not all_typed:
            for v, (_, t, typed) in zip(node.outputs, targets):
                if typed:
                    v.type = t
    if toks.peek()[0] != "eof":
        raise toks.error("unexpected text after the graph")
    return g


def _coerce_attrs(schema, attrs: dict[str, Any]) -> dict[str, Any]:
    """Floats written as integers (`alpha=1`) become floats where the schema says float."""
    if schema is None:
        return attrs
    out = dict(attrs)
    for k, v in attrs.items():
        spec = schema.attrs.get(k)
        if spec is None:
            continue
        if spec.kind == "float" and isinstance(v, int) and not isinstance(v, bool):
            out[k] = float(v)
        elif spec.kind == "floats" and isinstance(v, list):
            out[k] = [float(x) for x in v]
    return out
