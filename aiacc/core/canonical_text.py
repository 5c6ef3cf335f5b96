"""A name-free text form of a graph, for comparing graphs "up to value names and constant layout".

    from aiacc.core.canonical_text import canonical_text
    canonical_text(graph_a) == canonical_text(graph_b)

Differences from `print_graph`:
- nodes are listed in one canonical topological order: a depth-first walk from the graph outputs that
  visits each node's inputs in order (so two importers that emit independent branches in different
  orders print the same text); nodes no output depends on follow in graph order;
- values are renamed by position: graph inputs `%in0, %in1, ...`, node outputs `%0, %1, ...` in that
  order; node names and the graph name are left out;
- constants are written where they are used, as `$dtype[shape]`; integer and boolean constants of at
  most 16 elements (shapes, axes) also show their values, `$int64[4]{0, 0, 2, 8}`, since they decide
  what the op does; float data never appears (it is compared numerically, not textually);
- symbolic dimensions are renamed `s0, s1, ...` in order of appearance;
- float attributes are written at float32 precision (6 significant digits), so an epsilon read from a
  float32 protobuf field (9.99999975e-06) and one from a Python float (1e-05) print the same.

The text is not meant to be parsed back; golden files in tests/golden hold it.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from aiacc.core.ir import Graph, Node, TensorType, Value
from aiacc.core.text import format_scalar

INLINE_INT_LIMIT = 16


def _scalar(x: Any) -> str:
    # float32 precision, so the same attribute read from float32 and float64 sources prints alike
    return format_scalar(x, ".6g")


def _attr(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"tensor<{value.dtype.name}{list(value.shape)}>"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_scalar(x) for x in value) + "]"
    return _scalar(value)


class _Printer:
    def __init__(self, graph: Graph):
        self.g = graph
        self.names: dict[int, str] = {}
        self.symbols: dict[str, str] = {}

    def dim(self, d) -> str:
        if d is None:
            return "?"
        if isinstance(d, int):
            return str(d)
        return self.symbols.setdefault(d, f"s{len(self.symbols)}")

    def type(self, t: TensorType | None) -> str:
        if t is None:
            return "?"
        if t.shape is None:
            return f"{t.dtype or '?'}[*]"
        return f"{t.dtype or '?'}[" + ",".join(self.dim(d) for d in t.shape) + "]"

    def ref(self, v: Value | None) -> str:
        if v is None:
            return "_"
        if v.const is not None:
            c = v.const
            text = "$" + self.type(v.type)
            if c.dtype.kind in "iub" and c.size <= INLINE_INT_LIMIT:
                text += "{" + ", ".join(_scalar(x) for x in c.reshape(-1).tolist()) + "}"
            return text
        return self.names.get(id(v), f"%<undefined {v.name}>")

    def order(self) -> list[Node]:
        """Post-order DFS from the outputs, inputs visited in order; then unreachable nodes."""
        done: set[int] = set()
        out: list[Node] = []
        for root in self.g.outputs:
            if root.producer is None or id(root.producer) in done:
                continue
            stack = [(root.producer, iter(root.producer.inputs))]
            done.add(id(root.producer))
            while stack:
                node, it = stack[-1]
                for v in it:
                    p = None if v is None else v.producer
                    if p is not None and id(p) not in done:
                        done.add(id(p))
                        stack.append((p, iter(p.inputs)))
                        break
                else:
                    stack.pop()
                    out.append(node)
        out.extend(n for n in self.g if id(n) not in done)
        return out

    def print(self) -> str:
        ins = []
        for i, v in enumerate(self.g.inputs):
            self.names[id(v)] = f"%in{i}"
            ins.append(f"%in{i}: {self.type(v.type)}")
        lines = ["graph(" + ", ".join(ins) + ") {"]
        k = 0
        for node in self.order():
            outs = []
            for v in node.outputs:
                self.names[id(v)] = f"%{k}"
                outs.append(f"%{k}: {self.type(v.type)}")
                k += 1
            op = f"{node.domain}::{node.op}" if node.domain else node.op
            inputs = list(node.inputs)
            while inputs and inputs[-1] is None:  # a trailing omitted optional input is the same as none
                inputs.pop()
            args = ", ".join(self.ref(v) for v in inputs)
            attrs = ""
            if node.attrs:
                attrs = " {" + ", ".join(f"{a}={_attr(node.attrs[a])}" for a in sorted(node.attrs)) + "}"
            lines.append(f"  {', '.join(outs)} = {op}({args}){attrs}")
        lines.append("  return " + ", ".join(self.ref(v) for v in self.g.outputs))
        lines.append("}")
        return "\n".join(lines) + "\n"


def canonical_text(graph: Graph) -> str:
    """The name-free text of `graph` (see the module docstring). Run
    `aiacc.core.passes.canonicalize(graph)` first to also erase the differences between importers' idioms."""
    return _Printer(graph).print()
