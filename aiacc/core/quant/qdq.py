"""QuantizeLinear/DequantizeLinear placement: the int8 plan written into the IR (QDQ form).

Which nodes run in int8 is a set of node names (`quantized`); placement then follows onnxruntime's QDQ
conventions so that its graph optimizer turns each DequantizeLinear -> op -> QuantizeLinear group into an
integer kernel (QLinearConv, QGemm, QLinearMatMul/MatMulIntegerToFloat, QLinearAdd, QLinearConcat,
QLinearGlobalAveragePool, ...) and conv/matmul chains stay in int8 end to end:

- weights of Conv/MatMul/Gemm: int8, symmetric, per output channel, stored as int8 initializers behind a
  DequantizeLinear (4x smaller model); biases: int32 at scale x_scale * w_scale (what the integer kernels
  take).
- activations: uint8 asymmetric (x86's fast u8 x s8 form), one Q/DQ pair per tensor right after its
  producer, shared by every quantized consumer. A quantized producer's output goes to all its consumers
  through the pair (so the producer itself can run in int8); an unquantized producer keeps feeding its
  float consumers directly.
- a Relu/Clip that is the only consumer of a quantized conv/matmul/add is quantized with it: the pair goes
  after the activation, whose range starts at 0 (zero point 0), which onnxruntime folds into the kernel.
- data-movement ops (MaxPool, Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Gather, Slice, Split,
  Expand, Tile) keep their input's scale on their output, so onnxruntime drops their Q/DQ pairs and they
  move int8 data; one whose consumers are all int8 is int8 too, so a float producer's output is
  quantized once, before it, and shared (a LayerNorm feeding a reshaped matmul and a residual add).
- a MatMul of activations followed only by a scale (Mul/Div by a constant) keeps its output float
  (onnxruntime's MatMulIntegerToFloat); a positive scalar scale (attention's Q K^T / sqrt(d)) is folded
  into the quantization (fold_scale: into its first input's dequantize scale when float reads it, or
  Q(c * y, s) == Q(y, s / c) when int8 does), so the float Mul and its pass over the scores disappear.
- Softmax stays float: onnxruntime's QLinearSoftmax is slower than float Softmax plus a QuantizeLinear.
- MatMul + bias Add over a [.., K] input becomes Reshape -> Gemm (bias in it, int32) -> Reshape first
  (matmul_bias_to_gemm), run as QGemm.
  Measured against the float-output form (weight-only DequantizeLinear, static activation Q/DQ, MatMul
  producing float, bias Add after; BERT-style encoder b8, 2 threads, AVX2, onnxruntime 1.32, 12 interleaved
  runs, a one-off script): onnxruntime's level-1 MatMulAddFusion turns 12 of its 17 linear layers into
  float Gemm over dequantized weights before the QDQ fusions (min 107.4 vs 68.4 ms); with that fusion
  disabled in the session they become MatMulIntegerToFloat, min 63.0 vs 64.5 ms (median 64.6 vs 68.2),
  within the machine's noise: not adopted.
- graph outputs stay float (the last layer produces float, which integer kernels with float output do);
  so does the output of a Gemm/MatMul that only float nodes read (float_output).
- opaque nodes are never quantized: their inputs come dequantized, their outputs are quantized for a
  quantized consumer from the ranges calibration measured around them.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from aiacc.core.ir import Graph, Node, Value, const_value
from aiacc.core.quant.calibration import Range

COMPUTE = ("Conv", "MatMul", "Gemm")  # ops with an int8 weight
ACTIVATIONS = ("Relu", "Clip")  # folded into the quantized op before them
# int8 moves through these unchanged (onnxruntime drops a DQ -> op -> Q group of one scale around each:
# checked for every op here with onnxruntime 1.32; Resize is not here: it would interpolate the levels)
PASSTHROUGH = ("MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Gather", "Slice", "Split",
               "Expand", "Tile")
# integer kernels; Softmax is not: onnxruntime's QLinearSoftmax (a table per row) took 1.45 ms on BERT-style
# scores [8, 4, 128, 128] where float Softmax took 0.24 ms plus a QuantizeLinear (2 threads, AVX2)
OTHER = ("Add", "Mul", "Concat", "AveragePool", "GlobalAveragePool", "Sigmoid")
QUANTIZABLE = COMPUTE + PASSTHROUGH + OTHER
FUSES_ACTIVATION = COMPUTE + ("Add", "Mul", "Concat", "AveragePool", "GlobalAveragePool")
# symmetric int8 weights in [-WEIGHT_QMAX, WEIGHT_QMAX] (no -128: symmetric around exact zero). x86 without
# VNNI multiplies u8 x s8 pairs into saturating int16 (vpmaddubsw): there weights get 7 bits (63), as
# onnxruntime's own reduce_range does, or its int8 kernels and the QDQ graph's meaning part (measured:
# 2.8% relative output difference at 127, 1e-7 at 63); the backend chooses (aiacc.backends.quant)
WEIGHT_QMAX = 127
FLOATS = ("float32",)


def weight_axis(node: Node) -> int | None:
    """The output-channel axis of a compute node's weight (input 1), or None when it has no constant
    weight (a MatMul of two activations quantizes both as activations)."""
    w = const_value(node.inputs[1]) if len(node.inputs) > 1 else None
    if w is None or w.dtype.name not in FLOATS or w.ndim < 1:
        return None
    if node.op == "Conv":
        return 0
    if node.op == "Gemm":
        return 0 if node.attrs.get("transB", 0) else (1 if w.ndim == 2 else None)
    return w.ndim - 1 if w.ndim >= 2 else None  # MatMul [.., K, N]: per output column


def activation_inputs(node: Node) -> list[int]:
    """Indices of a quantizable node's inputs that are float activations to quantize."""
    if node.op in COMPUTE:
        idx = [0] if weight_axis(node) is not None else [0, 1]
    elif node.op in ("Add", "Mul", "Concat"):
        idx = list(range(len(node.inputs)))
    else:
        idx = [0]
    return [i for i in idx if i < len(node.inputs) and node.inputs[i] is not None
            and node.inputs[i].dtype in FLOATS and const_value(node.inputs[i]) is None]


def eligible(node: Node) -> bool:
    """Whether the plan may quantize this node at all (known op, float data; Add/Mul only between two
    activations: a bias or scale by a constant stays in the float op it belongs to)."""
    if node.domain or node.op not in QUANTIZABLE or node.is_opaque:
        return False
    if any(v.dtype not in FLOATS for v in node.outputs if v is not None):
        return False
    if node.op in ("Add", "Mul"):
        return len(activation_inputs(node)) == 2
    if node.op == "Gemm" and (node.attrs.get("transA", 0) or weight_axis(node) is None):
        return False
    if node.op == "MatMul":
        a = node.inputs[0]
        if a is None or a.shape is None or len(a.shape) < 2:
            return False
    return bool(activation_inputs(node))


def fused_activation(node: Node, quantized: set[str]) -> Node | None:
    """The Relu/Clip a quantized node's output goes to alone (quantized with it), if any."""
    out = node.outputs[0]
    users = out.users()
    if node.op not in FUSES_ACTIVATION or out.is_graph_output or len(users) != 1:
        return None
    act = users[0]
    if act.op in ACTIVATIONS and not act.domain and act.inputs[0] is out and act.name in quantized:
        return act
    return None


def float_epilogue(node: Node) -> bool:
    """A matmul whose output goes alone to a float Mul/Div by a constant (attention's 1/sqrt(d) scale):
    its output stays float, so onnxruntime runs it as MatMulIntegerToFloat instead of requantizing
    before the float op. (A bias Add is not: onnxruntime would fuse MatMul+Add into a float Gemm before
    its int8 fusions; matmul_bias_to_gemm makes such pairs a Gemm first.)"""
    if node.op != "MatMul":
        return False
    out = node.outputs[0]
    users = out.users()
    if out.is_graph_output or len(users) != 1:
        return False
    u = users[0]
    return (not u.domain and u.op in ("Add", "Mul", "Sub", "Div") and len(u.inputs) == 2
            and any(x is not None and x is not out and const_value(x) is not None for x in u.inputs))


def float_output(node: Node, quantized: set[str]) -> bool:
    """A gemm/matmul no quantized node reads: it outputs float (QGemm / MatMulIntegerToFloat), with no
    requantize-dequantize pair before its float consumers."""
    if node.op not in ("Gemm", "MatMul") or fused_activation(node, quantized) is not None:
        return False
    return not any(u.name in quantized for u in node.outputs[0].users())


def tensors_to_quantize(graph: Graph, quantized: set[str]) -> dict[str, str | None]:
    """Activation tensors that get a Q/DQ pair under this plan -> the tensor whose range they use (their
    own name, or the input of a data-movement op whose scale they share)."""
    want: dict[str, str | None] = {}
    skip: set[str] = set()  # compute outputs whose pair goes after the fused activation
    for node in graph:
        if node.name not in quantized:
            continue
        act = fused_activation(node, quantized)
        if act is not None or float_epilogue(node) or float_output(node, quantized):
            skip.add(node.outputs[0].name)
    for node in graph:
        if node.name not in quantized:
            continue
        for i in activation_inputs(node):
            want[node.inputs[i].name] = node.inputs[i].name
        if node.op in ACTIVATIONS and node.inputs[0].name in skip:
            want.pop(node.inputs[0].name, None)
        for v in node.outputs:
            if v.dtype in FLOATS and not v.is_graph_output and v.name not in skip:
                want.setdefault(v.name, v.name)
    for name in skip:
        want.pop(name, None)
    # data-movement ops keep their input's scale (onnxruntime drops their pairs only then)
    for node in graph:
        if node.name in quantized and node.op in PASSTHROUGH:
            src = node.inputs[0].name
            for v in node.outputs:
                if v.name in want:
                    want[v.name] = want.get(src) or src
    return want


def _quantize_weight(w: np.ndarray, axis: int, qmax: int = WEIGHT_QMAX) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-channel int8 in [-qmax, qmax]: (int8 weight, float32 scales along `axis`)."""
    moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    amax = np.abs(moved).max(axis=1)
    scale = np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)), -qmax, qmax).astype(np.int8)
    return q, scale


def insert_qdq(graph: Graph, quantized: set[str], ranges: Mapping[str, Range], *,
               weight_qmax: int = WEIGHT_QMAX) -> Graph:
    """A copy of `graph` with the Q/DQ pairs and int8 weights of the plan `quantized` (node names). Nodes
    whose activation inputs have no measured range are left float. weight_qmax: the weights' largest
    magnitude level (127, or 63 where the kernels saturate)."""
    g = graph.copy()
    plan = set(quantized)
    quantized = {n.name for n in g if n.name in quantized and eligible(n)
                 and all(n.inputs[i].name in ranges for i in activation_inputs(n))}
    quantized |= {act.name for n in g if n.name in quantized
                  for act in [fused_activation(n, plan)] if act is not None}
    want = tensors_to_quantize(g, quantized)
    want = {t: src for t, src in want.items() if src in ranges}
    dq_of: dict[str, Value] = {}
    producers_quantized = {v.name for n in g if n.name in quantized for v in n.outputs}
    first = g.first_node
    for v in list(g.inputs):
        if v.name in want:
            dq_of[v.name] = _pair(g, v, ranges[want[v.name]], before=first)
    for node in list(g.nodes):
        for v in node.outputs:
            if v.name in want and v.name not in dq_of:
                dq_of[v.name] = _pair(g, v, ranges[want[v.name]], after=node)
    # rewire consumers: every consumer of a quantized producer's output, the quantized ones otherwise
    for name, dq in dq_of.items():
        v = g.value(name)
        for user in list(v.users()):
            if user is dq.producer.inputs[0].producer:  # the Q node itself
                continue
            if user.op == "QuantizeLinear" and user.inputs[0] is v:
                continue
            if name in producers_quantized or user.name in quantized:
                for i, x in enumerate(user.inputs):
                    if x is v:
                        user.set_input(i, dq)
    for node in list(g.nodes):
        if node.name in quantized and float_epilogue(node):
            fold_scale(g, node)
    # weights and biases
    for node in list(g.nodes):
        if node.name not in quantized or node.op not in COMPUTE:
            continue
        axis = weight_axis(node)
        if axis is None:
            continue
        w = const_value(node.inputs[1])
        qw, ws = _quantize_weight(w, axis, weight_qmax)
        base = f"{node.name}_w"
        qv = g.add_initializer(g.fresh_name(base + "_int8"), qw)
        sv = g.add_initializer(g.fresh_name(base + "_scale"), ws)
        zv = g.add_initializer(g.fresh_name(base + "_zp"), np.zeros(ws.shape, np.int8))
        dq = g.add_node("DequantizeLinear", [qv, sv, zv], {"axis": axis}, name=f"aiacc_dqw_{node.name}",
                        before=node).output
        node.set_input(1, dq)
        b = const_value(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
        xdq = node.inputs[0].producer
        x_scale = const_value(xdq.inputs[1]) if xdq is not None and xdq.op == "DequantizeLinear" else None
        if b is not None and b.ndim == 1 and b.size == ws.size and x_scale is not None and x_scale.size == 1:
            bs = (ws * np.float32(x_scale)).astype(np.float32)
            qb = np.clip(np.rint(b / np.where(bs > 0, bs, 1)), -2 ** 31, 2 ** 31 - 1).astype(np.int32)
            bq = g.add_initializer(g.fresh_name(f"{node.name}_b_int32"), qb)
            bsv = g.add_initializer(g.fresh_name(f"{node.name}_b_scale"), bs)
            bz = g.add_initializer(g.fresh_name(f"{node.name}_b_zp"), np.zeros(bs.shape, np.int32))
            node.set_input(2, g.add_node("DequantizeLinear", [bq, bsv, bz], {"axis": 0},
                                         name=f"aiacc_dqb_{node.name}", before=node).output)
    g.remove_unused_initializers()
    g.meta["aiacc.quantized"] = sorted(quantized)
    return g


def _scalar_scale(node: Node, x: Value) -> float | None:
    """c where node computes c * x (Mul by a constant scalar, or Div of x by one), else None."""
    if len(node.inputs) != 2 or node.domain:
        return None
    other = node.inputs[1] if node.inputs[0] is x else node.inputs[0]
    c = const_value(other)
    if c is None or c.size != 1 or c.dtype.name not in FLOATS:
        return None
    c = float(c.reshape(()))
    if node.op == "Mul":
        return c
    if node.op == "Div" and node.inputs[0] is x and c != 0:
        return 1.0 / c
    return None


def fold_scale(g: Graph, matmul: Node) -> bool:
    """Fold a positive scalar scale after a quantized MatMul (attention's 1 / sqrt(d)) into the
    quantization parameters, removing the float Mul and its pass over the scores:

    - MatMul -> Mul(c) -> QuantizeLinear(s, z), the Q its only consumer: MatMul -> QuantizeLinear(s / c, z)
      (the same levels: round(c y / s) == round(y / (s / c))), read back as c * y by the DQ after it;
    - MatMul -> Mul(c) read in float: the MatMul's first input is dequantized at scale c * s_a (its own
      DequantizeLinear of the same int8 tensor), so the MatMul computes c * y (MatMulIntegerToFloat).

    Returns whether it folded."""
    out = matmul.outputs[0]
    users = out.users()
    if len(users) != 1:
        return False
    mul = users[0]
    c = _scalar_scale(mul, out)
    y = mul.outputs[0]
    if c is None or not np.isfinite(c) or c <= 0 or y.is_graph_output:
        return False
    qs = y.users()
    if len(qs) == 1 and qs[0].op == "QuantizeLinear" and qs[0].inputs[0] is y:
        q = qs[0]
        sv = const_value(q.inputs[1])
        if sv is None or sv.size != 1:
            return False
        q.set_input(0, out)
        q.set_input(1, g.add_initializer(g.fresh_name(f"{y.name}_scale_folded"),
                                         np.asarray(float(sv.reshape(())) / c, np.float32)))
        g.erase(mul)
        return True
    if any(u.op == "QuantizeLinear" for u in qs):
        return False
    dq = matmul.inputs[0].producer
    sv = const_value(dq.inputs[1]) if dq is not None and dq.op == "DequantizeLinear" else None
    if sv is None or sv.size != 1 or dq.inputs[0].producer is None:
        return False
    own = g.add_node("DequantizeLinear", [dq.inputs[0], g.add_initializer(
        g.fresh_name(f"{dq.output.name}_scale_folded"), np.asarray(float(sv.reshape(())) * c, np.float32)),
        dq.inputs[2]], dict(dq.attrs), name=g.fresh_name(f"{dq.name}_scaled"), after=dq)
    matmul.set_input(0, own.output)
    y.replace_all_uses_with(out)
    g.erase(mul)
    if not dq.output.users():
        g.erase(dq)
    return True


def _pair(g: Graph, v: Value, r: Range, *, before: Node | None = None, after: Node | None = None) -> Value:
    s = g.add_initializer(g.fresh_name(f"{v.name}_scale"), np.asarray(r.scale, np.float32))
    z = g.add_initializer(g.fresh_name(f"{v.name}_zp"), np.asarray(r.zero_point, np.uint8))
    q = g.add_node("QuantizeLinear", [v, s, z], name=f"aiacc_q_{v.name}", before=before, after=after)
    dq = g.add_node("DequantizeLinear", [q.output, s, z], name=f"aiacc_dq_{v.name}", after=q)
    return dq.output


def matmul_bias_to_gemm(graph: Graph) -> dict[str, str]:
    """Rewrite, in place, MatMul(x[..., K], W[K, N]) followed only by Add(bias[N]) (static shapes, not a
    graph output) as Reshape(x, [-1, K]) -> Gemm(W, bias) -> Reshape(back): the bias joins the integer
    kernel (int32) instead of a float Add after a requantization. Numerics are the same ops reassociated
    over no sum (exact up to float rounding). Returns {new Gemm name: replaced MatMul name}."""
    renamed = {}
    for n in list(graph.nodes):
        if n.domain or n.op != "MatMul" or n.erased:
            continue
        x, out = n.inputs[0], n.outputs[0]
        w = const_value(n.inputs[1]) if len(n.inputs) > 1 else None
        if w is None or w.ndim != 2 or w.dtype.name not in FLOATS or x is None or x.type is None \
                or not x.type.is_static or len(x.shape) < 2 or out.is_graph_output:
            continue
        users = out.users()
        if len(users) != 1 or users[0].op != "Add" or users[0].domain or len(users[0].inputs) != 2:
            continue
        add = users[0]
        other = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
        b = const_value(other)
        k, m = w.shape
        y = add.outputs[0]
        if b is None or b.dtype.name not in FLOATS or b.size != m or b.shape[-1:] != (m,) or y.is_graph_output \
                or y.type is None or not y.type.is_static or tuple(y.shape) != tuple(x.shape[:-1]) + (m,):
            continue
        s2 = graph.add_initializer(graph.fresh_name(f"{n.name}_2d"), np.array([-1, k], np.int64))
        s3 = graph.add_initializer(graph.fresh_name(f"{n.name}_nd"), np.array(y.shape, np.int64))
        bias = graph.add_initializer(graph.fresh_name(f"{n.name}_bias"), b.reshape(m).astype(b.dtype))
        x2 = graph.op("Reshape", x, s2, name=f"{n.name}_in2d", before=n)
        gemm = graph.add_node("Gemm", [x2, n.inputs[1], bias], {}, name=f"{n.name}_gemm", before=n)
        back = graph.op("Reshape", gemm.output, s3, name=f"{n.name}_out", before=n)
        y.replace_all_uses_with(back)
        graph.erase(add)
        graph.erase(n)
        renamed[gemm.name] = n.name
    graph.remove_unused_initializers()
    return renamed
