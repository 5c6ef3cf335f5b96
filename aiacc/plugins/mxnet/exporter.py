"""aiacc IR -> MXNet symbol JSON + parameters (no mxnet import: the JSON is written directly).

The walker and the lowerings' table. One lowering per IR op, registered in the table `lowerings`, keyed
by the node's qualified op (`@lowerings.register("Conv")`, `@lowerings.register("aiacc::FusedConv")`) in
aiacc.plugins.mxnet.export_ops, which the plugin's translator imports. A lowering receives the `Emitter` and the
IR node and returns one symbol reference `(node index, output index)` per IR output. Constants that an
MXNet op takes as attributes (reshape targets, clip bounds, scalar operands) become attributes; other
constants become parameters (`arg:` or, where MXNet reads them as auxiliary states such as BatchNorm
statistics, `aux:`). Opaque MXNet nodes (domain "mxnet") are written back exactly as they were read; aiacc
fused ops without a lowering are decomposed first (aiacc.core.translate.decompose_fused).

Lowerings aim at MXNet's fast forms: MatMul + bias on a constant weight becomes FullyConnected, scalar
operands become `_mul_scalar` and friends, BatchNorm-folded convolutions stay a single Convolution.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from aiacc.core.ir import Graph, Node, Value, const_value
from aiacc.core.translate import OpTable, decompose_fused
from aiacc.errors import UnsupportedError
from aiacc.plugins.mxnet.importer import OPAQUE_DOMAIN
from aiacc.plugins.mxnet.symjson import MxNode, MxSymbol, format_attr

Ref = tuple[int, int]

# qualified op -> lowering(emitter, node) -> Ref | [Ref] (filled by aiacc.plugins.mxnet.export_ops)
lowerings = OpTable("mxnet export")


class Emitter:
    """Builds the MXNet node list, the parameters and the map from IR values to symbol references."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes: list[MxNode] = []
        self.env: dict[int, Ref] = {}
        self.arg_params: dict[str, np.ndarray] = {}
        self.aux_params: dict[str, np.ndarray] = {}
        self._vars: dict[tuple[int, bool], Ref] = {}
        self._names: set[str] = set()
        self.skip: set[int] = set()  # IR nodes folded into a later node's lowering
        self.fold: dict[int, Any] = {}  # per-node notes left by peephole pre-passes

    def unique(self, base: str) -> str:
        name, k = base, 0
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        return name

    def _add(self, op: str, name: str, attrs: dict[str, Any], inputs: list[Ref]) -> int:
        idx = len(self.nodes)
        fmt = {k: (v if isinstance(v, str) else format_attr(v)) for k, v in attrs.items() if v is not None}
        self.nodes.append(MxNode(idx, op, self.unique(name), fmt, list(inputs)))
        return idx

    def input_var(self, v: Value) -> None:
        self.env[id(v)] = (self._add("null", v.name, {}, []), 0)

    def param(self, name: str, array: np.ndarray, aux: bool = False) -> Ref:
        """A new parameter variable holding `array`."""
        idx = self._add("null", name, {}, [])
        (self.aux_params if aux else self.arg_params)[self.nodes[idx].name] = np.ascontiguousarray(array)
        return idx, 0

    def ref(self, v: Value, aux: bool = False) -> Ref:
        """The symbol reference of an IR value; constants become parameters on first use."""
        if v.const is None and id(v) in self.env:
            return self.env[id(v)]
        c = const_value(v)
        if c is None:
            raise UnsupportedError(f"value %{v.name} is read before it is defined (graph not in topological order)")
        key = (id(v), aux)
        if key not in self._vars:
            self._vars[key] = self.param(v.name, c, aux)
        return self._vars[key]

    def op(self, op: str, name: str, inputs: list[Ref], **attrs: Any) -> Ref:
        return self._add(op, name, attrs, inputs), 0

    def op_multi(self, op: str, name: str, inputs: list[Ref], n_out: int, **attrs: Any) -> list[Ref]:
        idx = self._add(op, name, attrs, inputs)
        return [(idx, k) for k in range(n_out)]


def export_symbol(graph: Graph) -> tuple[MxSymbol, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Lower an IR graph to (MxSymbol, arg_params, aux_params). Raises UnsupportedError naming a node
    that has no MXNet form."""
    graph = _decompose_unlowered(graph)
    em = Emitter(graph)
    for v in graph.inputs:
        em.input_var(v)
    _peephole(em, graph)
    for node in graph:
        if id(node) in em.skip:
            continue
        fn = lowerings.get(node.qualified_op)
        if fn is None and node.domain == OPAQUE_DOMAIN:
            fn = _lower_opaque
        if fn is None:
            raise UnsupportedError(f"node {node.name} ({node.qualified_op}) has no MXNet form; "
                                   f"use backend='onnxruntime' or disable the pass that made it")
        outs = fn(em, node)
        if isinstance(outs, tuple):
            outs = [outs]
        for v, r in zip(node.outputs, outs):
            if r is not None:
                em.env[id(v)] = r
    heads = []
    for v in graph.outputs:
        r = em.ref(v)
        # an output straight from a constant: copied (a parameter is not an output); an input is returned
        # as itself, as MXNet names it (list_outputs() gives the variable's name, as the original's does)
        if em.nodes[r[0]].is_variable and not any(v is i for i in graph.inputs):
            r = em.op("_copy", v.name, [r])
        heads.append(r)
    _keep_output_names(em, graph, heads)
    return MxSymbol(em.nodes, heads), em.arg_params, em.aux_params


def _keep_output_names(em: Emitter, graph: Graph, heads: list[Ref]) -> None:
    """Each output node takes the name of the original's symbol node for that output (graph.meta
    "mxnet.output_heads", recorded at import), so list_outputs() is the original's even where a pass fused
    the node that computed it into the one before (Dense + relu: one FullyConnected named after the Dense)
    or the importer decomposed it (FullyConnected: Flatten + Gemm). A node already holding that name inside
    the graph (or a constant aiacc made) is renamed instead; an input's name is never taken."""
    wanted = graph.meta.get("mxnet.output_heads")
    if not wanted or len(wanted) != len(heads):
        return
    by_name = {n.name: n for n in em.nodes}
    head_nodes = {idx for idx, _ in heads}
    inputs = {v.name for v in graph.inputs}
    for (idx, k), (name, k0) in zip(heads, wanted):
        node = em.nodes[idx]
        if k != 0 or k0 != 0 or node.is_variable or node.name == name:
            continue
        other = by_name.get(name)
        if other is not None:
            if other.index in head_nodes or name in inputs:
                continue
            if other.is_variable:  # a constant aiacc made (a folded value): its parameter moves with it
                params = em.arg_params if name in em.arg_params else em.aux_params if name in em.aux_params \
                    else None
                if params is None:
                    continue
                new = em.unique(f"{name}_value")
                params[new] = params.pop(name)
            else:
                new = em.unique(f"{name}_inner")
            del by_name[other.name]
            other.name = new
            by_name[new] = other
        del by_name[node.name]
        node.name = name
        em._names.add(name)
        by_name[name] = node


def _peephole(em: Emitter, graph: Graph) -> None:
    """MatMul(x, constant W) followed by Add(constant bias) -> one FullyConnected (flatten=False)."""
    for node in graph:
        if node.op != "MatMul" or node.domain or len(node.output.uses) != 1 or node.output.is_graph_output:
            continue
        w = const_value(node.inputs[1])
        add = node.output.uses[0][0]
        if w is None or w.ndim != 2 or add.op != "Add" or add.domain:
            continue
        other = add.inputs[1] if add.inputs[0] is node.output else add.inputs[0]
        b = const_value(other)
        if b is None or b.size != w.shape[1] or b.ndim > 1 and b.shape[:-1] != (1,) * (b.ndim - 1) \
                or node.inputs[0].shape is None or add.output.shape != node.output.shape:
            continue
        em.skip.add(id(node))
        em.fold[id(add)] = (node, b.reshape(-1))
    _peephole_variable_weights(em, graph)


def _peephole_variable_weights(em: Emitter, graph: Graph) -> None:
    """MatMul(x, Transpose(W)) [+ Add(b)] with W (N, K) and b (N,) values, not constants (the Parameters of
    mode='train', which must stay trainable) -> one FullyConnected(x, W, b, flatten=False): MXNet's Dense,
    whose forward and backward are a GEMM each, instead of a transpose, a dot and a broadcast_add (and their
    three backward ops) per layer and step. The fold note is (MatMul node, bias value or None, W)."""
    for node in graph:
        if node.op != "MatMul" or node.domain or const_value(node.inputs[1]) is not None:
            continue
        _peephole_batch_dot(em, node)
        t = node.inputs[1].producer
        if t is None or t.op != "Transpose" or t.domain or list(t.attr("perm") or []) != [1, 0] \
                or len(t.output.uses) != 1 or t.output.is_graph_output:
            continue
        w = t.inputs[0]
        x = node.inputs[0]
        if w.shape is None or len(w.shape) != 2 or not isinstance(w.shape[0], int) or x.shape is None \
                or len(x.shape) < 2:
            continue
        em.skip.add(id(t))
        add = node.output.uses[0][0] if len(node.output.uses) == 1 and not node.output.is_graph_output else None
        if add is not None and add.op == "Add" and not add.domain and add.output.shape == node.output.shape:
            b = add.inputs[1] if add.inputs[0] is node.output else add.inputs[0]
            if b is not node.output and b.const is None and b.shape == (w.shape[0],):
                em.skip.add(id(node))
                em.fold[id(add)] = (node, b, w)
                continue
        em.fold[id(node)] = (node, None, w)


def _peephole_batch_dot(em: Emitter, node: Node) -> None:
    """MatMul(a, Transpose(b) of its last two axes), both rank >= 3 with the same batch axes (attention's
    q @ k^T) -> batch_dot(a, b, transpose_b=True): no transpose materialized forward or backward. The fold
    note is ("transpose_b", b)."""
    t = node.inputs[1].producer
    a = node.inputs[0]
    if t is None or t.op != "Transpose" or t.domain or len(t.output.uses) != 1 or t.output.is_graph_output:
        return
    b = t.inputs[0]
    if a.shape is None or b.shape is None or len(a.shape) < 3 or len(a.shape) != len(b.shape):
        return
    r = len(b.shape)
    if list(t.attr("perm") or []) != list(range(r - 2)) + [r - 1, r - 2] or a.shape[:-2] != b.shape[:-2]:
        return
    em.skip.add(id(t))
    em.fold[id(node)] = ("transpose_b", b)


def _lower_opaque(em: Emitter, node: Node) -> list[Ref]:
    original = node.meta.get("mxnet_node", {"op": node.op, "name": node.name, "attrs": node.attrs})
    refs = [em.ref(v) for v in node.inputs if v is not None]
    outs = em.op_multi(original["op"], original["name"], refs, len(node.outputs), **dict(original["attrs"]))
    em.nodes[outs[0][0]].extra = dict(original.get("extra", {}))  # e.g. a control-flow op's subgraphs
    return outs


def _decompose_unlowered(graph: Graph) -> Graph:
    """The graph with every aiacc fused op without an MXNet lowering rewritten into the standard ops it
    stands for (a copy; the graph itself when every fused op has a lowering)."""
    return decompose_fused(graph, keep=lambda n: n.qualified_op in lowerings)[0]
