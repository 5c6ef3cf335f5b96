"""Model statistics: parameter counts and an estimate of floating-point operations.

FLOPs count a multiply-add as 2. One function per op family estimates a node from its input and output
shapes; symbolic dimensions are bound through `bind` (default: every symbol = 1), and a node whose shapes
stay unknown counts as None (reported as unknown, never guessed).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from aiacc.core.ir import Graph, Node, Value


def _dims(v: Value | None, bind: Mapping[str, int]) -> tuple[int, ...] | None:
    if v is None or v.type is None or v.shape is None:
        return None
    out = []
    for d in v.shape:
        if isinstance(d, int):
            out.append(d)
        elif isinstance(d, str) and d in bind:
            out.append(int(bind[d]))
        else:
            return None
    return tuple(out)


def _numel(shape: tuple[int, ...] | None) -> int | None:
    return None if shape is None else int(np.prod(shape, dtype=np.int64))


# ------------------------------------------------------------------------------------------------ families
def conv_flops(node: Node, bind: Mapping[str, int]) -> int | None:
    """Conv: 2 * output elements * (input channels per group * kernel size), plus the bias."""
    out, w = _dims(node.outputs[0], bind), _dims(node.inputs[1], bind)
    if out is None or w is None:
        return None
    macs = _numel(out) * int(np.prod(w[1:], dtype=np.int64))
    bias = _numel(out) if len(node.inputs) > 2 and node.inputs[2] is not None else 0
    return 2 * macs + bias


def conv_transpose_flops(node: Node, bind: Mapping[str, int]) -> int | None:
    """ConvTranspose: every input element scatters (output channels per group * kernel size) products."""
    x, w, out = _dims(node.inputs[0], bind), _dims(node.inputs[1], bind), _dims(node.outputs[0], bind)
    if x is None or w is None:
        return None
    macs = _numel(x) * int(np.prod(w[1:], dtype=np.int64))
    bias = _numel(out) if out is not None and len(node.inputs) > 2 and node.inputs[2] is not None else 0
    return 2 * macs + bias


def matmul_flops(node: Node, bind: Mapping[str, int]) -> int | None:
    """MatMul / Gemm: 2 * output elements * inner dimension (Gemm adds alpha/beta/C terms)."""
    a, out = _dims(node.inputs[0], bind), _dims(node.outputs[0], bind)
    if a is None or out is None:
        return None
    if node.op in ("Gemm", "FusedGemm"):
        k = a[0] if node.attr("transA", 0) else a[-1]
        extra = _numel(out) if len(node.inputs) > 2 and node.inputs[2] is not None else 0
        return 2 * _numel(out) * k + extra
    k = a[-1]
    return 2 * _numel(out) * k


def pool_flops(node: Node, bind: Mapping[str, int]) -> int | None:
    """Windowed pooling: one operation per window element per output."""
    out = _dims(node.outputs[0], bind)
    kernel = node.attrs.get("kernel_shape")
    if out is None or kernel is None:
        return None
    return _numel(out) * int(np.prod(kernel, dtype=np.int64))


def input_sized_flops(node: Node, bind: Mapping[str, int]) -> int | None:
    """Global pools and reductions: one operation per input element."""
    return _numel(_dims(node.inputs[0], bind))


def normalization_flops(factor: int) -> Callable[[Node, Mapping[str, int]], int | None]:
    """BatchNorm (2 per element at inference), LayerNorm/Softmax (about 5 per element), LRN."""

    def estimate(node: Node, bind: Mapping[str, int]) -> int | None:
        n = _numel(_dims(node.outputs[0], bind))
        if n is None:
            return None
        if node.op == "LRN":
            return n * (2 * int(node.attr("size", 1)) + 3)
        return factor * n

    estimate.__doc__ = f"{factor} operations per output element"
    return estimate


def elementwise_flops(node: Node, bind: Mapping[str, int]) -> int | None:
    """Elementwise ops: one operation per output element (per extra input for variadic ops)."""
    n = _numel(_dims(node.outputs[0], bind))
    if n is None:
        return None
    return n * max(1, sum(v is not None for v in node.inputs) - 1)


def resize_flops(node: Node, bind: Mapping[str, int]) -> int | None:
    """Resize: taps per output element (1 nearest, 2 per axis linear, 4 per axis cubic)."""
    out = _dims(node.outputs[0], bind)
    if out is None:
        return None
    mode = node.attr("mode", "nearest")
    if mode == "nearest":
        return 0
    taps = 2 if mode == "linear" else 4
    return 2 * _numel(out) * taps


def zero_flops(node: Node, bind: Mapping[str, int]) -> int:
    """Data movement and shape ops compute nothing."""
    return 0


FAMILIES: dict[str, Callable[[Node, Mapping[str, int]], int | None]] = {}
for _op in ("Conv",):
    FAMILIES[_op] = conv_flops
FAMILIES["ConvTranspose"] = conv_transpose_flops
for _op in ("MatMul", "Gemm"):
    FAMILIES[_op] = matmul_flops
for _op in ("MaxPool", "AveragePool", "LpPool"):
    FAMILIES[_op] = pool_flops
for _op in ("GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
            "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp",
            "ArgMax", "ArgMin"):
    FAMILIES[_op] = input_sized_flops
FAMILIES["BatchNormalization"] = normalization_flops(2)
for _op in ("LayerNormalization", "Softmax", "LogSoftmax", "LRN"):
    FAMILIES[_op] = normalization_flops(5)
FAMILIES["Resize"] = resize_flops
for _op in ("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice", "Gather",
            "Pad", "Identity", "Dropout", "Cast", "Shape", "Constant", "Expand", "Tile", "ConstantOfShape",
            "Range"):
    FAMILIES[_op] = zero_flops


def node_flops(node: Node, bind: Mapping[str, int] | None = None) -> int | None:
    """Estimated FLOPs of one node; None when unknown (opaque node or unknown shapes)."""
    bind = bind or {}
    if node.domain == "":
        fn = FAMILIES.get(node.op)
        if fn is not None:
            return fn(node, bind)
        schema = node.schema
        if schema is not None and schema.elementwise:
            return elementwise_flops(node, bind)
    estimate = node.meta.get("flops")  # plugins may say what an opaque node costs
    if callable(estimate):
        return estimate(node, bind)
    if node.domain == "aiacc":
        if node.op == "ValueGuard":
            return 0  # a check of a condition its own producers compute
        return fused_flops(node, bind)
    return None


def fused_flops(node: Node, bind: Mapping[str, int]) -> int | None:
    """An aiacc fused op costs what its decomposition into standard ops costs."""
    from aiacc.errors import AiaccError

    try:
        from aiacc.core.ops.fused import decompose
    except ImportError:
        return None
    g = Graph("fused")
    ins = []
    for v in node.inputs:
        if v is None:
            ins.append(None)
        elif v.is_constant:
            ins.append(g.add_initializer(v.name, v.const))
        elif g.has_value(v.name):
            ins.append(g.value(v.name))
        elif v.type is None:
            ins.append(g.add_untyped_input(v.name))
        else:
            ins.append(g.add_input(v.name, v.dtype, v.shape))
    try:
        copy = g.add_node(node.op, ins, dict(node.attrs), domain=node.domain, name=node.name,
                          outputs=[v.name for v in node.outputs], output_types=[v.type for v in node.outputs])
        g.outputs = list(copy.outputs)
        decompose(copy, g)
    except AiaccError:
        return None
    total = 0
    for n in g:
        f = node_flops(n, bind)
        if f is None:
            return None
        total += f
    return total


@dataclass
class GraphStats:
    """What `aiacc inspect` prints."""

    nodes: int
    op_histogram: dict[str, int]
    parameters: int  # elements of floating-point initializers
    constant_elements: int
    constant_bytes: int
    flops: int  # over the nodes with a known estimate
    unknown_flops_nodes: list[str] = field(default_factory=list)
    flops_by_op: dict[str, int] = field(default_factory=dict)
    bind: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def graph_symbols(graph: Graph) -> list[str]:
    """Symbolic dimensions of the graph inputs, in order of appearance."""
    seen: list[str] = []
    for v in graph.inputs:
        for d in (v.shape or ()):
            if isinstance(d, str) and d not in seen:
                seen.append(d)
    return seen


def graph_stats(graph: Graph, bind: Mapping[str, int] | None = None) -> GraphStats:
    """Parameter, constant and FLOP statistics. Symbols not in `bind` count as 1."""
    bind = dict(bind or {})
    for s in graph_symbols(graph):
        bind.setdefault(s, 1)
    params = sum(int(v.const.size) for v in graph.initializers.values() if v.const.dtype.kind in "fc")
    total = 0
    unknown = []
    by_op: dict[str, int] = {}
    for n in graph:
        f = node_flops(n, bind)
        if f is None:
            unknown.append(n.name)
            continue
        total += f
        by_op[n.qualified_op] = by_op.get(n.qualified_op, 0) + f
    return GraphStats(nodes=len(graph), op_histogram=graph.op_histogram(), parameters=params,
                      constant_elements=graph.parameter_count(), constant_bytes=graph.constant_bytes(), flops=total,
                      unknown_flops_nodes=unknown,
                      flops_by_op=dict(sorted(by_op.items(), key=lambda kv: -kv[1])), bind=bind)


def format_count(n: float | None, unit: str = "") -> str:
    """1234567 -> '1.23 M' (SI prefixes)."""
    if n is None:
        return "?"
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n:.0f} {unit}".strip()


def format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
