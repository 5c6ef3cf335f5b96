"""onnxruntime's own fused transformer kernels for the graph aiacc hands to an onnxruntime CPU session.

onnxruntime's graph optimizer fuses LayerNormalization + residual Add (SkipLayerNormalization), MatMul + bias
(Gemm) and Gelu + bias (BiasGelu) by itself, but none of the attention forms torch's exporters and aiacc
write (scaled_dot_product_attention with a boolean or additive mask): each head's scores product, scale,
mask, Softmax and value product, and the Reshape/Transpose between the heads and the hidden axis, stay
separate kernels. `fuse_attention` rewrites each multi-head attention of an ONNX model into one
com.microsoft kernel:

    Reshape(q2) -> Transpose[0,2,1,3] ----------------------------\\
    Reshape(k2) -> Transpose[0,2,3,1] (or [0,2,1,3] then [0,1,3,2]) -> MatMul -> [Mul|Div c] -> [Add bias] ->
    Softmax(last axis) -> MatMul with Reshape(v2) -> Transpose[0,2,1,3] -> Transpose[0,2,1,3] -> Reshape [B,S,H*D]

    * q2, k2 and v2 projections of one input x by constant weights (MatMul + bias, Gemm on a flattened x,
      or column blocks of one packed projection cut by Split/Slice): com.microsoft.Attention(x, [Wq|Wk|Wv],
      [bq|bk|bv], attention_bias=bias): one GEMM for the three projections and one attention kernel;
    * otherwise (cross-attention, computed projections): com.microsoft.MultiHeadAttention(q2, k2, v2,
      attention_bias=bias).

The attention bias (the additive mask, causal or padding) is passed as it is, broadcast over batch and
heads by onnxruntime ([1|B, 1|H, S, T]); a form that matches none of the above is left as it was. The
fused kernels compute the same function (float rounding only; tests/reach/test_speed_choice.py checks
1e-4 on transformers BERT, DistilBERT, GPT-2 and ViT).

onnxruntime's own transformers optimizer (onnxruntime.transformers.optimizer) is not used: on aiacc's graphs
(small BERT, DistilBERT, GPT-2, ViT; batch 1, seq 128) its attention fusion matches none of them unfused, and
after this module's it only adds SkipLayerNormalization on the pre-LayerNorm models (GPT-2, ViT) and writes
Gemm + Gelu as MatMul + BiasGelu: no faster beyond this machine's noise (0.96-1.04x in one process), and it
rewrites GPT-2's tanh-approximated GELU as BiasGelu, which is the erf form (1.3e-4 from the original).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS = "com.microsoft"


class _Index:
    """Producers, consumers, constants and static shapes of an ONNX graph's tensors."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.producer = {o: n for n in graph.node for o in n.output if o}
        self.consumers: dict[str, list] = defaultdict(list)
        for n in graph.node:
            for i in n.input:
                if i:
                    self.consumers[i].append(n)
        self.inits = {i.name: i for i in graph.initializer}
        self.outputs = {o.name for o in graph.output}
        self.shapes = {}
        for v in list(graph.input) + list(graph.value_info) + list(graph.output):
            t = v.type.tensor_type
            if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
                self.shapes[v.name] = [d.dim_value for d in t.shape.dim]
        self.dtypes = {v.name: v.type.tensor_type.elem_type
                       for v in list(graph.input) + list(graph.value_info) + list(graph.output)}
        for i in graph.initializer:
            self.shapes[i.name] = list(i.dims)
            self.dtypes[i.name] = i.data_type

    def const(self, name: str) -> np.ndarray | None:
        """The value of a constant tensor (initializer or Constant node), None when computed."""
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        n = self.producer.get(name)
        if n is not None and n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
        return None

    def node_of(self, name: str, op: str):
        """The producer of `name` when it is an `op` node (default domain), else None."""
        n = self.producer.get(name)
        return n if n is not None and n.op_type == op and n.domain in ("", "ai.onnx") else None

    def only_reader(self, name: str):
        """The single node reading `name` (None when several, none, or it is a graph output)."""
        users = self.consumers.get(name, [])
        return users[0] if len(users) == 1 and name not in self.outputs else None


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _perm(ix: _Index, name: str, perm: list[int]):
    """The input of a Transpose with exactly this permutation producing `name`, else None."""
    t = ix.node_of(name, "Transpose")
    if t is None or list(_attr(t, "perm", [])) != perm:
        return None
    return t.input[0]


def _heads(ix: _Index, name: str) -> tuple[str, int, int] | None:
    """(x, heads, head size) when `name` is Reshape(x [B, S, H*D]) to [B, S, H, D]."""
    r = ix.node_of(name, "Reshape")
    if r is None:
        return None
    shape, src = ix.shapes.get(name), ix.shapes.get(r.input[0])
    if shape is None or src is None or len(shape) != 4 or len(src) != 3 or src[:2] != shape[:2] or \
            src[2] != shape[2] * shape[3]:
        return None
    return r.input[0], shape[2], shape[3]


@dataclass
class _Match:
    q: str
    k: str
    v: str
    heads: int
    head_size: int
    scale: float
    bias: str | None
    out: str  # the tensor the fused node writes (the final Reshape's output)
    flat: bool  # that output is [B*S, H*D] (the fused kernel writes [B, S, H*D], reshaped after it)


def _match(ix: _Index, softmax) -> _Match | None:
    """The attention around a Softmax node, or None when it is not one of the recognised forms."""
    s_out = softmax.output[0]
    shape = ix.shapes.get(s_out)
    if shape is None or len(shape) != 4 or _attr(softmax, "axis", -1) not in (-1, 3):
        return None
    pv = ix.only_reader(s_out)
    if pv is None or pv.op_type != "MatMul" or pv.input[0] != s_out:
        return None
    # the output: [B, H, S, D] -> [B, S, H, D] -> [B, S, H*D]
    t = ix.only_reader(pv.output[0])
    if t is None or t.op_type != "Transpose" or list(_attr(t, "perm", [])) != [0, 2, 1, 3]:
        return None
    r = ix.only_reader(t.output[0])
    if r is None or r.op_type != "Reshape":
        return None
    out_shape, pv_shape = ix.shapes.get(r.output[0]), ix.shapes.get(pv.output[0])
    if out_shape is None or pv_shape is None or len(pv_shape) != 4:
        return None
    b, h, s, d = pv_shape
    if out_shape not in ([b, s, h * d], [b * s, h * d]):  # [B*S, H*D]: flattened for the next Gemm
        return None
    # scores: MatMul(q, k^T) [* scale | / scale] [+ bias]
    name, bias, scale = softmax.input[0], None, 1.0
    add = ix.node_of(name, "Add")
    if add is not None:
        for a, b in ((0, 1), (1, 0)):
            if ix.producer.get(add.input[a]) is not None and \
                    ix.producer[add.input[a]].op_type in ("Mul", "Div", "MatMul"):
                name, bias = add.input[a], add.input[b]
                break
        else:
            return None
        if ix.only_reader(name) is None or ix.only_reader(add.output[0]) is None:
            return None
    mul = ix.node_of(name, "Mul") or ix.node_of(name, "Div")
    if mul is not None:
        c = ix.const(mul.input[1])
        if c is None or c.size != 1 or ix.only_reader(mul.output[0]) is None or float(c.ravel()[0]) == 0.0:
            return None
        scale = float(c.ravel()[0]) if mul.op_type == "Mul" else 1.0 / float(c.ravel()[0])
        name = mul.input[0]
    qk = ix.node_of(name, "MatMul")
    if qk is None or ix.only_reader(qk.output[0]) is None:
        return None
    q4, kt = qk.input
    q = _perm(ix, q4, [0, 2, 1, 3])
    k = _perm(ix, kt, [0, 2, 3, 1])
    if k is None:  # k moved to heads first, then its last two axes swapped
        k4 = _perm(ix, kt, [0, 1, 3, 2])
        k = _perm(ix, k4, [0, 2, 1, 3]) if k4 is not None else None
    v = _perm(ix, pv.input[1], [0, 2, 1, 3])
    if q is None or k is None or v is None:
        return None
    hq, hk, hv = _heads(ix, q), _heads(ix, k), _heads(ix, v)
    if hq is None or hk is None or hv is None or not (hq[1:] == hk[1:] == hv[1:]):
        return None
    if bias is not None:
        b_shape, s_shape = ix.shapes.get(bias), shape
        if b_shape is None or len(b_shape) > 4 or ix.dtypes.get(bias) != ix.dtypes.get(s_out):
            return None
        b_shape = [1] * (4 - len(b_shape)) + b_shape
        if b_shape[2:] != s_shape[2:] or b_shape[0] not in (1, s_shape[0]) or b_shape[1] not in (1, s_shape[1]):
            return None
    if ix.dtypes.get(s_out) != onnx.TensorProto.FLOAT:
        return None
    return _Match(hq[0], hk[0], hv[0], hq[1], hq[2], scale, bias, r.output[0], len(out_shape) == 2)


def _projection(ix: _Index, name: str):
    """(x, W, b) when `name` is x @ W + b with constant W [K, N] and b [N] (b zeros when absent), through
    MatMul (+ Add), a Gemm on x flattened to 2-D and unflattened after, and column blocks of such a
    projection cut by Split or Slice on the last axis; None otherwise."""
    n = ix.producer.get(name)
    if n is None or n.domain not in ("", "ai.onnx"):
        return None
    if n.op_type == "Split":
        rank = len(ix.shapes.get(n.input[0], []))
        if rank == 0 or _attr(n, "axis", 0) % rank != rank - 1:
            return None
        whole = _projection(ix, n.input[0])
        if whole is None:
            return None
        width = whole[1].shape[1]
        sizes = ix.const(n.input[1]) if len(n.input) > 1 and n.input[1] else _attr(n, "split")
        if sizes is None:
            sizes = [width // len(n.output)] * len(n.output)
        sizes = [int(s) for s in np.asarray(sizes).ravel()]
        if sum(sizes) != width:
            return None
        start = sum(sizes[:list(n.output).index(name)])
        cols = slice(start, start + sizes[list(n.output).index(name)])
        return whole[0], whole[1][:, cols], whole[2][cols]
    if n.op_type == "Slice":
        whole = _projection(ix, n.input[0])
        starts, ends = ix.const(n.input[1]), ix.const(n.input[2])
        axes = ix.const(n.input[3]) if len(n.input) > 3 and n.input[3] else np.asarray([-1])
        steps = ix.const(n.input[4]) if len(n.input) > 4 and n.input[4] else np.asarray([1])
        rank = len(ix.shapes.get(n.input[0], []))
        if whole is None or starts is None or ends is None or axes is None or steps is None or \
                starts.size != 1 or int(steps.ravel()[0]) != 1 or rank == 0 or \
                int(axes.ravel()[0]) % rank != rank - 1:
            return None
        cols = slice(*slice(int(starts.ravel()[0]), int(ends.ravel()[0])).indices(whole[1].shape[1])[:2])
        return whole[0], whole[1][:, cols], whole[2][cols]
    if n.op_type == "Reshape":  # [B*S, N] -> [B, S, N] after a Gemm on x flattened to [B*S, K]
        out, src = ix.shapes.get(name), ix.shapes.get(n.input[0])
        g = ix.node_of(n.input[0], "Gemm")
        if g is None or out is None or src is None or len(out) != 3 or len(src) != 2 or \
                src != [out[0] * out[1], out[2]]:
            return None
        if _attr(g, "transA", 0) or _attr(g, "alpha", 1.0) != 1.0 or _attr(g, "beta", 1.0) != 1.0:
            return None
        w = ix.const(g.input[1])
        b = ix.const(g.input[2]) if len(g.input) > 2 and g.input[2] else None
        if w is None or w.ndim != 2 or (len(g.input) > 2 and g.input[2] and (b is None or b.ndim > 1)):
            return None
        w = w.T if _attr(g, "transB", 0) else w
        flat = ix.node_of(g.input[0], "Reshape")
        x = flat.input[0] if flat is not None else None
        if x is None or ix.shapes.get(x) != [out[0], out[1], w.shape[0]]:
            return None
        b = np.zeros(w.shape[1], w.dtype) if b is None else np.broadcast_to(b, (w.shape[1],))
        return x, w, b
    bias = None
    if n.op_type == "Add":
        for a, c in ((0, 1), (1, 0)):
            b = ix.const(n.input[c])
            if b is not None and b.ndim == 1 and ix.node_of(n.input[a], "MatMul") is not None:
                n, bias = ix.producer[n.input[a]], b
                break
        else:
            return None
    if n.op_type != "MatMul":
        return None
    w = ix.const(n.input[1])
    if w is None or w.ndim != 2 or len(ix.shapes.get(n.input[0], [])) != 3:
        return None
    if bias is not None and bias.shape[0] != w.shape[1]:
        return None
    return n.input[0], w, np.zeros(w.shape[1], w.dtype) if bias is None else bias


def fuse_attention(model: onnx.ModelProto) -> dict[str, int]:
    """Rewrite the model's multi-head attentions into com.microsoft.Attention (packed QKV projection) or
    com.microsoft.MultiHeadAttention, in place (see the module docstring); returns how many of each."""
    graph = model.graph
    ix = _Index(graph)
    counts = {"Attention": 0, "MultiHeadAttention": 0}
    new_nodes: dict[str, list] = {}  # the nodes replacing each attention, keyed by its Softmax
    inits = []
    for softmax in [n for n in graph.node if n.op_type == "Softmax" and n.domain in ("", "ai.onnx")]:
        m = _match(ix, softmax)
        if m is None:
            continue
        base = softmax.name or m.out
        bias_name, pre = m.bias or "", []
        if m.bias is not None and len(ix.shapes[m.bias]) < 4:  # broadcast to [1, 1, S, T] as the kernel takes it
            axes = f"{base}_fused_bias_axes"
            inits.append(numpy_helper.from_array(np.arange(4 - len(ix.shapes[m.bias]), dtype=np.int64), axes))
            pre = [helper.make_node("Unsqueeze", [m.bias, axes], [f"{base}_fused_bias"], name=f"{base}_fused_bias")]
            bias_name = pre[0].output[0]
        projections = [_projection(ix, t) for t in (m.q, m.k, m.v)]
        packed = all(p is not None for p in projections) and len({p[0] for p in projections}) == 1 and \
            len({p[1].dtype for p in projections}) == 1 and \
            ix.shapes.get(m.q) == ix.shapes.get(m.k) == ix.shapes.get(m.v)
        attrs = {"num_heads": m.heads, "scale": m.scale}
        out = f"{base}_fused_out" if m.flat else m.out
        if packed:
            w = np.concatenate([p[1] for p in projections], axis=1).astype(np.float32)
            b = np.concatenate([p[2] for p in projections]).astype(np.float32)
            inits += [numpy_helper.from_array(w, f"{base}_qkv_weight"), numpy_helper.from_array(b, f"{base}_qkv_bias")]
            ins = [projections[0][0], f"{base}_qkv_weight", f"{base}_qkv_bias", "", "", bias_name]
            node = helper.make_node("Attention", ins, [out], name=f"{base}_attention", domain=MS, **attrs)
            counts["Attention"] += 1
        else:
            ins = [m.q, m.k, m.v, "", "", bias_name]
            node = helper.make_node("MultiHeadAttention", ins, [out], name=f"{base}_mha", domain=MS, **attrs)
            counts["MultiHeadAttention"] += 1
        new_nodes[base] = pre + [node]
        if m.flat:
            shape = f"{base}_fused_flat"
            inits.append(numpy_helper.from_array(np.asarray(ix.shapes[m.out], dtype=np.int64), shape))
            new_nodes[base].append(helper.make_node("Reshape", [out, shape], [m.out], name=f"{base}_fused_flat"))
    if not new_nodes:
        return counts
    # each fused node goes where its final Reshape was (its inputs are all computed before that point)
    outs = {ns[-1].output[0]: ns for ns in new_nodes.values()}
    kept = []
    for n in graph.node:
        kept += outs.get(n.output[0], [n]) if n.output else [n]
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(inits)
    _remove_dead(graph)
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))
    return counts


def _remove_dead(graph: onnx.GraphProto) -> None:
    """Drop nodes none of whose outputs is read (graph outputs count as read), then unread initializers."""
    outputs = {o.name for o in graph.output}
    while True:
        read = {i for n in graph.node for i in n.input} | outputs
        alive = [n for n in graph.node if any(o in read for o in n.output if o)]
        if len(alive) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(alive)
    read = {i for n in graph.node for i in n.input} | outputs
    keep = [i for i in graph.initializer if i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    produced = {o for n in graph.node for o in n.output}
    vis = [v for v in graph.value_info if v.name in produced]
    del graph.value_info[:]
    graph.value_info.extend(vis)
