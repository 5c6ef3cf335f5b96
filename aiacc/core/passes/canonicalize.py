"""Canonicalization: one form for the idioms different importers use for the same computation.

Four importers translating the same architecture give four different, equally correct graphs: TF's Dense is
MatMul + BiasAdd where torch's Linear is Gemm, Keras freezes BatchNorm into Mul + Add, Keras' Tensordot
flattens a 3-D input around a 2-D MatMul, TF's Flatten runs in NHWC, Caffe's pooling rounds up... This
pass rewrites all of them into one form, so that `canonical_text` of the results can be compared:

    layout      a Transpose right after a graph input (TF's NHWC -> NCHW) or right before a graph output
                becomes part of the input/output layout: the input takes the transposed type and the
                canonical graph is fed NCHW (recorded in graph.meta["canonical_layout"])
    cleanup     Identity / inference Dropout removed, constants folded (e.g. torch's Transpose of a weight),
                common subexpressions merged, dead code removed
    linear      Reshape(x, [-1, K]) -> MatMul(W) -> Reshape(back) (Tensordot) is MatMul(x, W);
                Transpose -> flattening Reshape -> MatMul(const W) is Flatten -> MatMul(W with permuted rows);
                a 2-D MatMul(x, const W) + Add(const b) is Gemm(x, W^T, b, transB=1) (W as [out, in]);
                Gemm(transB=0) with a constant B is Gemm(transB=1) with B^T
    conv        Conv without bias + Add(per-channel constant) is Conv with that bias; a zero Pad on spatial
                axes before a Conv goes into the Conv's pads
    batchnorm   inference BatchNormalization with constant parameters, and a per-channel Mul + Add on a
                4-D tensor (Keras' frozen BatchNorm), are both BatchNormalization in affine form:
                scale = gamma / sqrt(var + eps), bias = beta - mean * scale, mean 0, var 1, epsilon 0
    pooling     ReduceMean over the spatial axes of a 4-D tensor (keepdims) and an AveragePool covering
                the whole input are GlobalAveragePool; ceil_mode=1 that changes no output size is 0
    reshapes    Reshape / Squeeze / Flatten producing [d0, d1*d2*...] is Flatten(axis=1); a Reshape that
                changes nothing is removed; Reshape targets are written with 0 for copied dims and -1 for the
                one symbolic dim
    arithmetic  the constant operand of Add/Mul/Max/Min goes second; Div by a float constant is Mul by its
                reciprocal; GELU and LayerNorm written out (including Keras' forms) become Gelu and
                LayerNormalization
    attributes  negative axes made positive; attributes equal to their schema default dropped (Conv and
                pooling pads/strides/dilations of all zeros/ones included)

Optionally (`input_shapes=`) symbolic input dims are specialized to concrete sizes and every type re-inferred,
so an importer that keeps the batch symbolic and one that fixes it compare equal.

Assumes: inference mode (BatchNorm statistics are constants). Guarantees: the same function up to float
rounding (reciprocals, folded BatchNorm, transposed weights); the input/output layout changes recorded in
graph.meta["canonical_layout"] are the only interface change.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from aiacc.core.ir import Graph, Node, TensorType, Value
from aiacc.core.passes.manager import Pass, PassContext, register_pass
from aiacc.core.passes.utils import const_value, single_use

FLOATS = ("float16", "float32", "float64")


# ------------------------------------------------------------------------------------------------ helpers
def _shape(v: Value | None):
    return None if v is None or v.type is None else v.shape


def _static(v: Value | None):
    s = _shape(v)
    return tuple(s) if s is not None and all(isinstance(d, int) for d in s) else None


def _replace(g: Graph, node: Node, new: Value) -> None:
    """Readers of node's single output read `new`; node is erased when unused (graph outputs keep names)."""
    old = node.output
    name = old.name
    was_output = old.is_graph_output
    old.replace_all_uses_with(new)
    if not old.uses and not old.is_graph_output:
        g.erase(node)
        if was_output and new.producer is not None and not g.has_value(name) and \
                sum(o is new for o in g.outputs) == 1:
            new.name = name


def _new(g: Graph, anchor: Node, op: str, inputs: Sequence[Value | None], attrs: dict | None = None) -> Value:
    return g.add_node(op, list(inputs), attrs or {}, name=anchor.name, before=anchor).output


def _const(g: Graph, name: str, array) -> Value:
    return g.add_initializer(g.fresh_name(name), np.asarray(array))


def _only_user(v: Value) -> Node | None:
    users = v.users()
    return users[0] if single_use(v) and users else None


def _same_dim(a, b) -> bool:
    return a == b and a is not None


# ------------------------------------------------------------------------------------------ shapes/layout
def specialize_shapes(g: Graph, input_shapes: Mapping[str, Sequence[int]] | Sequence[Sequence[int]]) -> None:
    """Give graph inputs concrete shapes (by name, or positionally) and re-infer every node's output types."""
    from aiacc.core.ops import infer_node

    if not isinstance(input_shapes, Mapping):
        input_shapes = {v.name: s for v, s in zip(g.inputs, input_shapes)}
    for v in g.inputs:
        if v.name in input_shapes:
            v.type = TensorType(v.dtype, tuple(int(d) for d in input_shapes[v.name]))
    for node in g:
        if node.schema is None:
            continue
        for v, t in zip(node.outputs, infer_node(node)):
            if t is not None:
                v.type = t


def _io_layout(g: Graph) -> int:
    """Transposes at graph inputs/outputs become the canonical graph's layout."""
    n = 0
    layout = g.meta.setdefault("canonical_layout", {})
    for v in g.inputs:
        users = v.users()
        if not users or v.is_graph_output or any(u.op != "Transpose" or u.domain for u in users):
            continue
        perms = {tuple(u.attr("perm") or ()) for u in users}
        if len(perms) != 1 or v.shape is None or len(next(iter(perms))) != len(v.shape):
            continue
        perm = next(iter(perms))
        v.type = TensorType(v.dtype, tuple(v.shape[p] for p in perm))
        for u in users:
            _replace(g, u, v)
        layout[v.name] = {"input_perm": list(perm)}  # canonical input = framework input.transpose(perm)
        n += 1
    for i, o in enumerate(list(g.outputs)):
        p = o.producer
        if p is None or p.op != "Transpose" or p.domain or p.inputs[0] is None:
            continue
        src = p.inputs[0]
        if src.producer is None or src.is_graph_output:
            continue
        perm = [int(a) for a in (p.attr("perm") or range(len(src.shape or ()))[::-1])]
        inv = [perm.index(k) for k in range(len(perm))]
        g.outputs[i] = src
        if not o.uses and not o.is_graph_output:
            name = o.name
            g.erase(p)
            src.name = name if not g.has_value(name) else src.name
        layout[src.name] = {"output_perm": inv}  # canonical output = framework output.transpose(inv)
        n += 1
    return n


# --------------------------------------------------------------------------------------------- arithmetic
_COMMUTATIVE = {"Add", "Mul", "Max", "Min"}


def _commute_constants(g: Graph) -> int:
    n = 0
    for node in g:
        if node.domain or node.op not in _COMMUTATIVE or len(node.inputs) != 2:
            continue
        a, b = node.inputs
        if const_value(a) is not None and const_value(b) is None:
            node.set_input(0, b)
            node.set_input(1, a)
            n += 1
    return n


def _div_by_constant(g: Graph) -> int:
    n = 0
    for node in g.nodes:
        if node.domain or node.op != "Div" or len(node.inputs) != 2:
            continue
        x, c = node.inputs
        cv = const_value(c)
        if cv is None or cv.dtype.name not in FLOATS or x.dtype != cv.dtype.name or not np.all(cv != 0):
            continue
        recip = _const(g, c.name + "_reciprocal", (1.0 / cv.astype(np.float64)).astype(cv.dtype))
        _replace(g, node, _new(g, node, "Mul", [x, recip]))
        n += 1
    return n


# ----------------------------------------------------------------------------------------------- reshapes
def _flatten_like(g: Graph) -> int:
    """Reshape/Squeeze/Flatten giving [d0, prod(rest)] is Flatten(axis=1); a no-op Reshape goes away."""
    n = 0
    for node in g.nodes:
        if node.domain or node.op not in ("Reshape", "Squeeze", "Flatten"):
            continue
        x = node.inputs[0]
        xs, ys = _shape(x), _shape(node.output)
        if xs is None or ys is None:
            continue
        if node.op in ("Reshape", "Squeeze") and len(xs) == len(ys) and all(_same_dim(a, b) for a, b in zip(xs, ys)):
            _replace(g, node, x)
            n += 1
            continue
        if len(ys) != 2 or len(xs) < 2 or not _same_dim(xs[0], ys[0]):
            continue
        rest = xs[1:]
        if not all(isinstance(d, int) for d in rest) or ys[1] != int(np.prod(rest)):
            continue
        if node.op == "Flatten" and int(node.attr("axis") if node.attr("axis") is not None else 1) % len(xs) == 1:
            continue
        if len(xs) == 2:
            _replace(g, node, x)
        else:
            _replace(g, node, _new(g, node, "Flatten", [x], {"axis": 1}))
        n += 1
    return n


def _reshape_targets(g: Graph) -> int:
    """Reshape targets: 0 where the input's dim is copied, concrete sizes, -1 for one symbolic dim."""
    n = 0
    for node in g.nodes:
        if node.domain or node.op != "Reshape" or len(node.inputs) < 2:
            continue
        x, target = node.inputs[:2]
        xs, ys = _shape(x), _shape(node.output)
        tv = const_value(target)
        if xs is None or ys is None or tv is None:
            continue
        new = []
        for k, d in enumerate(ys):
            if k < len(xs) and _same_dim(xs[k], d):
                new.append(0)
            elif isinstance(d, int):
                new.append(d)
            else:
                new.append(-1)
        if new.count(-1) > 1 or node.attr("allowzero"):
            continue
        if [int(t) for t in tv.reshape(-1)] == new:
            continue
        node.set_input(1, _const(g, "reshape_shape", np.asarray(new, dtype=np.int64)))
        n += 1
    return n


# ------------------------------------------------------------------------------------------------- linear
def _tensordot(g: Graph) -> int:
    """Reshape(x, [-1, K]) -> MatMul(W) -> Reshape(lead + [out]) is MatMul(x, W)."""
    n = 0
    for node in g.nodes:
        if node.domain or node.op != "MatMul" or node.erased:
            continue
        r1 = node.inputs[0].producer
        w = node.inputs[1]
        if r1 is None or r1.op != "Reshape" or r1.domain or const_value(w) is None or w.shape is None \
                or len(w.shape) != 2:
            continue
        x = r1.inputs[0]
        r2 = _only_user(node.output)
        xs, ms = _shape(x), _shape(node.output)
        if r2 is None or r2.op != "Reshape" or r2.inputs[0] is not node.output or xs is None or ms is None \
                or len(xs) < 3:
            continue
        ys = _shape(r2.output)
        if ys is None or len(ys) != len(xs) or not all(_same_dim(a, b) for a, b in zip(xs[:-1], ys[:-1])) \
                or ys[-1] != w.shape[1] or xs[-1] != w.shape[0] or len(ms) != 2 or ms[1] != w.shape[1]:
            continue
        _replace(g, r2, _new(g, r2, "MatMul", [x, w]))
        n += 1
    return n


def _transpose_flatten_matmul(g: Graph) -> int:
    """Transpose(x, perm) -> Reshape/Flatten to [N, F] -> MatMul(const W): flatten x as it is and permute
    W's rows instead (TF's Flatten reads NHWC; the canonical Flatten reads NCHW)."""
    n = 0
    for node in g.nodes:
        if node.domain or node.op != "Transpose" or node.erased:
            continue
        x = node.inputs[0]
        xs = _static(x)
        perm = node.attr("perm")
        if xs is None or perm is None or int(perm[0]) != 0 or len(xs) < 3:
            continue
        perm = [int(p) for p in perm]
        flat = _only_user(node.output)
        if flat is None or flat.domain or flat.op not in ("Reshape", "Flatten") or flat.inputs[0] is not node.output:
            continue
        fs = _shape(flat.output)
        feat = int(np.prod(xs[1:]))
        if fs is None or len(fs) != 2 or fs[1] != feat or not _same_dim(fs[0], xs[0]) and fs[0] != xs[0]:
            continue
        users = flat.output.users()
        if not users or flat.output.is_graph_output or any(
                u.op != "MatMul" or u.domain or u.inputs[0] is not flat.output or const_value(u.inputs[1]) is None
                or u.inputs[1].shape is None or len(u.inputs[1].shape) != 2 for u in users):
            continue
        ts = [xs[p] for p in perm]
        inv = [perm.index(i) for i in range(len(perm))]
        flat_x = _new(g, flat, "Flatten", [x], {"axis": 1})
        for u in users:
            wv = const_value(u.inputs[1])
            wr = wv.reshape(ts[1:] + [wv.shape[1]])
            w2 = np.ascontiguousarray(wr.transpose([inv[i] - 1 for i in range(1, len(xs))] + [len(xs) - 1]))
            u.set_input(0, flat_x)
            u.set_input(1, _const(g, u.inputs[1].name + "_rows", w2.reshape(feat, wv.shape[1])))
        g.erase(flat)
        g.erase(node)
        n += 1
    return n


def _matmul_add_to_gemm(g: Graph) -> int:
    n = 0
    for node in g.nodes:
        if node.domain or node.op != "MatMul" or node.erased:
            continue
        x, w = node.inputs
        wv = const_value(w)
        xs = _shape(x)
        add = _only_user(node.output)
        if wv is None or wv.ndim != 2 or xs is None or len(xs) != 2 or add is None or add.op != "Add" \
                or add.domain or add.inputs[0] is not node.output:
            continue
        bv = const_value(add.inputs[1])
        if bv is None or bv.dtype != wv.dtype or bv.size != wv.shape[1] or bv.ndim > 2 or \
                (bv.ndim == 2 and bv.shape[0] != 1):
            continue
        wt = _const(g, w.name + "_t", np.ascontiguousarray(wv.T))
        b = _const(g, add.inputs[1].name + "_flat", bv.reshape(-1))
        _replace(g, add, _new(g, add, "Gemm", [x, wt, b], {"transB": 1}))
        n += 1
    return n


def _gemm_trans_b(g: Graph) -> int:
    n = 0
    for node in g.nodes:
        if node.domain or node.op != "Gemm" or node.attr("transB"):
            continue
        bv = const_value(node.inputs[1])
        if bv is None:
            continue
        node.set_input(1, _const(g, node.inputs[1].name + "_t", np.ascontiguousarray(bv.T)))
        node.attrs["transB"] = 1
        n += 1
    return n


# --------------------------------------------------------------------------------------------------- conv
def _per_channel(v: Value, c: int, rank: int) -> np.ndarray | None:
    """The constant as a [C] vector when it broadcasts only over axis 1 of a rank-`rank` tensor."""
    a = const_value(v)
    if a is None:
        return None
    s = list(a.shape)
    while s and s[0] == 1 and len(s) > rank - 1:
        s = s[1:]
    if len(s) != rank - 1 or s[0] != c or any(d != 1 for d in s[1:]):
        return None
    return a.reshape(c)


def _conv_bias(g: Graph) -> int:
    n = 0
    for node in g.nodes:
        if node.domain or node.op != "Conv" or node.erased or (len(node.inputs) > 2 and node.inputs[2] is not None):
            continue
        ys = _shape(node.output)
        add = _only_user(node.output)
        if ys is None or add is None or add.op != "Add" or add.domain or add.inputs[0] is not node.output:
            continue
        b = _per_channel(add.inputs[1], ys[1], len(ys))
        if b is None or b.dtype.name != node.output.dtype:
            continue
        bias = _const(g, add.inputs[1].name + "_bias", np.ascontiguousarray(b))
        new = g.add_node("Conv", [node.inputs[0], node.inputs[1], bias], dict(node.attrs), name=node.name,
                         before=add).output
        _replace(g, add, new)
        g.erase(node)
        n += 1
    return n


def _pad_into_conv(g: Graph) -> int:
    n = 0
    for node in g.nodes:
        if node.domain or node.op != "Pad" or node.erased:
            continue
        x = node.inputs[0]
        xs = _shape(x)
        pads = const_value(node.inputs[1]) if len(node.inputs) > 1 else None
        if xs is None or pads is None or (node.attr("mode") or "constant") != "constant":
            continue
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            val = const_value(node.inputs[2])
            if val is None or np.any(val != 0):
                continue
        if len(node.inputs) > 3 and node.inputs[3] is not None:
            continue
        r = len(xs)
        pads = [int(p) for p in pads.reshape(-1)]
        if len(pads) != 2 * r or min(pads) < 0 or pads[0] or pads[1] or pads[r] or pads[r + 1]:
            continue
        users = node.output.users()
        if not users or node.output.is_graph_output or any(u.op != "Conv" or u.domain or u.inputs[0] is not node.output
                                                           or (u.attr("auto_pad") or "NOTSET") != "NOTSET"
                                                           for u in users):
            continue
        spatial = pads[2:r] + pads[r + 2:]
        for u in users:
            cur = [int(p) for p in (u.attr("pads") or [0] * (2 * (r - 2)))]
            u.attrs["pads"] = [a + b for a, b in zip(cur, spatial)]
            u.set_input(0, x)
        g.erase(node)
        n += 1
    return n


# ---------------------------------------------------------------------------------------------- batchnorm
def _is_affine_bn(node: Node) -> bool:
    mean, var = const_value(node.inputs[3]), const_value(node.inputs[4])
    return (float(node.attr("epsilon")) == 0.0 and mean is not None and var is not None
            and not np.any(mean) and np.all(var == 1))


def _batchnorm_affine(g: Graph) -> int:
    n = 0
    for node in g.nodes:
        if node.domain or node.op != "BatchNormalization" or len(node.outputs) != 1 or node.attr("training_mode"):
            continue
        ins = node.inputs
        params = [const_value(v) for v in ins[1:5]]
        if len(ins) != 5 or any(p is None for p in params) or _is_affine_bn(node):
            continue
        gamma, beta, mean, var = (p.astype(np.float64) for p in params)
        scale = gamma / np.sqrt(var + float(node.attr("epsilon")))
        bias = beta - mean * scale
        _set_affine(g, node, ins[0], scale, bias, params[0].dtype)
        n += 1
    return n


def _set_affine(g: Graph, anchor: Node, x: Value, scale, bias, dtype) -> Value:
    c = scale.shape[0]
    new = g.add_node("BatchNormalization", [x, _const(g, "bn_scale", scale.astype(dtype)),
                                            _const(g, "bn_bias", bias.astype(dtype)),
                                            _const(g, "bn_mean", np.zeros(c, dtype)),
                                            _const(g, "bn_var", np.ones(c, dtype))],
                     {"epsilon": 0.0}, name=anchor.name, before=anchor).output
    _replace(g, anchor, new)
    return new


def _mul_add_to_batchnorm(g: Graph) -> int:
    n = 0
    for node in g.nodes:
        if node.domain or node.op != "Mul" or node.erased:
            continue
        x = node.inputs[0]
        xs = _shape(x)
        if xs is None or len(xs) != 4 or not isinstance(xs[1], int) or x.dtype not in FLOATS:
            continue
        scale = _per_channel(node.inputs[1], xs[1], 4)
        add = _only_user(node.output)
        if scale is None or add is None or add.op != "Add" or add.domain or add.inputs[0] is not node.output:
            continue
        bias = _per_channel(add.inputs[1], xs[1], 4)
        if bias is None or _shape(add.output) != xs:
            continue
        _set_affine(g, add, x, scale.astype(np.float64), bias.astype(np.float64), np.dtype(x.dtype))
        g.erase(node)
        n += 1
    return n


# ------------------------------------------------------------------------------------------------ pooling
def _global_pool(g: Graph) -> int:
    n = 0
    for node in g.nodes:
        if node.domain or node.erased:
            continue
        x = node.inputs[0] if node.inputs else None
        xs = _shape(x)
        if xs is None or len(xs) != 4:
            continue
        if node.op == "ReduceMean":
            axes = node.attr("axes")
            if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
                axes = const_value(node.inputs[1])
            if axes is None:
                continue
            if sorted(int(a) % 4 for a in np.asarray(axes).reshape(-1)) != [2, 3]:
                continue
            gap = _new(g, node, "GlobalAveragePool", [x])
            keep = node.attr("keepdims")
            _replace(g, node, gap if keep is None or keep else _new(g, node, "Flatten", [gap], {"axis": 1}))
            n += 1
        elif node.op == "AveragePool":
            k = node.attr("kernel_shape")
            pads = node.attr("pads") or [0, 0, 0, 0]
            if k is None or not all(isinstance(d, int) for d in xs[2:]) or list(k) != list(xs[2:]) or any(pads) \
                    or (node.attr("auto_pad") or "NOTSET") != "NOTSET":
                continue
            _replace(g, node, _new(g, node, "GlobalAveragePool", [x]))
            n += 1
    return n


def _ceil_mode(g: Graph) -> int:
    n = 0
    for node in g:
        if node.domain or node.op not in ("MaxPool", "AveragePool") or not node.attr("ceil_mode"):
            continue
        xs = _static(node.inputs[0])
        k = node.attr("kernel_shape")
        if xs is None or k is None or (node.attr("auto_pad") or "NOTSET") != "NOTSET":
            continue
        r = len(k)
        strides = node.attr("strides") or [1] * r
        dil = node.attr("dilations") or [1] * r
        pads = node.attr("pads") or [0] * (2 * r)
        ok = True
        for i in range(r):
            span = xs[2 + i] + pads[i] + pads[i + r] - ((k[i] - 1) * dil[i] + 1)
            if span % strides[i]:
                ok = False
        if ok:
            node.attrs["ceil_mode"] = 0
            n += 1
    return n


# ------------------------------------------------------------------------------------- recognized forms
def _recognition_rules():
    """GELU and LayerNorm written out, in the forms the existing recognizers know plus Keras' forms."""
    from aiacc.core.passes import gelu, layernorm
    from aiacc.core.passes.rewrite import Const, Op, Rule, Scalar, Var

    x = Var("x")
    # Keras/TF exact GELU: 0.5 * x * erfc(-x / sqrt 2), erfc(z) imported as 1 - erf(z)
    erfc = Op("Sub", Scalar(1.0), Op("Erf", Op("Mul", Op("Neg", x), Scalar(1 / math.sqrt(2.0)))))
    gelu_erfc = Rule("gelu_erfc", [Op("Mul", Op("Mul", x, Scalar(0.5)), erfc, name="y")],
                     lambda m, b: b.op("Gelu", m["x"], name=m.root.name), gelu._check,
                     doc="0.5 * x * (1 - erf(-x / sqrt 2)) is Gelu(x).")
    # Keras LayerNormalization: x * m + (beta - mean * m), m = rsqrt(var + eps) * gamma
    mean = Op("ReduceMean", x, Const("axes1"), name="mean")
    var = Op("ReduceMean", Op("Mul", Op("Sub", x, mean, name="d"), Var("d"), name="sq"), Const("axes2"), name="var")
    rstd = Op("Reciprocal", Op("Sqrt", Op("Add", var, Scalar(name="eps"), name="veps"), name="std"), name="rstd")
    m_ = Op("Mul", rstd, Var("scale"), name="m")
    keras_ln = Op("Add", Op("Mul", x, m_, name="xm"),
                  Op("Add", Op("Mul", Op("Neg", Var("mean"), name="neg"), Var("m"), name="nm"), Var("bias"),
                     name="shift"), name="y")
    ln_keras = Rule("layernorm_keras", [keras_ln], layernorm._rewrite, layernorm._check,
                    doc="x * (gamma / sqrt(var + eps)) + (beta - mean * gamma / sqrt(var + eps)) is "
                        "LayerNormalization.")
    return gelu.RULES + [gelu_erfc, layernorm.RULE, ln_keras]


# --------------------------------------------------------------------------------------------- attributes
_AXIS_OPS = {"Softmax", "LogSoftmax", "LayerNormalization", "Flatten", "Concat", "Gather", "Split", "Hardmax"}


def _normalize_attrs(g: Graph) -> int:
    n = 0
    for node in g:
        schema = node.schema
        if schema is None:
            continue
        x = node.inputs[0] if node.inputs else None
        rank = len(x.shape) if x is not None and x.shape is not None else None
        if node.op in _AXIS_OPS and "axis" in node.attrs and rank is not None and node.attrs["axis"] < 0:
            r = rank + 1 if node.op == "Flatten" else rank
            node.attrs["axis"] = int(node.attrs["axis"]) + r
            n += 1
        if node.op in ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"):
            for key, neutral in (("pads", 0), ("strides", 1), ("dilations", 1)):
                v = node.attrs.get(key)
                if v is not None and all(int(a) == neutral for a in v):
                    del node.attrs[key]
                    n += 1
            if node.op == "Conv" and "kernel_shape" not in node.attrs and node.inputs[1].shape is not None:
                node.attrs["kernel_shape"] = list(node.inputs[1].shape[2:])
                n += 1
        for key in list(node.attrs):
            spec = schema.attrs.get(key)
            if spec is None or spec.default is None:
                continue
            v, d = node.attrs[key], spec.default
            if isinstance(v, (list, tuple)) and isinstance(d, (list, tuple)):
                same = list(v) == list(d)
            elif isinstance(v, float) or isinstance(d, float):  # at float32 precision (protobuf fields)
                same = not isinstance(v, (list, tuple, np.ndarray, str)) and np.float32(v) == np.float32(d)
            else:
                same = not isinstance(v, (list, tuple, np.ndarray)) and v == d
            if same:
                del node.attrs[key]
                n += 1
    return n


# ----------------------------------------------------------------------------------------------- the pass
_RULES = None


def canonicalize(graph: Graph, *, input_shapes=None, ctx: PassContext | None = None) -> int:
    """Rewrite `graph` in place into the canonical form (see the module docstring); returns the number of
    rewrites. `input_shapes` ({input name: shape} or a list in input order, in the canonical layout, e.g.
NCHW for a TF image input) specializes symbolic dims."""
    from aiacc.core.passes.manager import get_pass
    from aiacc.core.passes.rewrite import RuleSet

    global _RULES
    if _RULES is None:
        _RULES = RuleSet(_recognition_rules())
    ctx = ctx or PassContext("inference", 0)
    total = _io_layout(graph)
    if input_shapes is not None:  # canonical (post-layout) shapes
        specialize_shapes(graph, input_shapes)
    cleanup = [get_pass(n) for n in ("identity_removal", "constant_folding", "cse", "dce")]
    steps = [_commute_constants, _div_by_constant, _tensordot, _transpose_flatten_matmul, _flatten_like,
             _matmul_add_to_gemm, _gemm_trans_b, _conv_bias, _pad_into_conv, _batchnorm_affine,
             _mul_add_to_batchnorm, _global_pool, _ceil_mode, _reshape_targets]
    for _ in range(20):  # to a fixed point (each round shrinks the graph or normalizes a node for good)
        changed = 0
        for p in cleanup:
            changed += int(p.run(graph, PassContext(ctx.mode, ctx.level)) or 0)
        for step in steps:
            changed += step(graph)
        changed += _RULES.run(graph, ctx)
        total += changed
        if not changed:
            break
    total += _normalize_attrs(graph)
    graph.remove_unused_initializers()
    return total


class Canonicalize(Pass):
    """Rewrite importer idioms into one canonical form (module docstring of aiacc.core.passes.canonicalize).

    Not part of any optimization level: run it by name (`run_passes(g, passes=["canonicalize"])`) or call
    `canonicalize(graph)`; the cross-framework tests apply it after every import before comparing IR text.

    Assumes: inference mode (BatchNorm statistics are constants).
    Guarantees: the same function up to float rounding; Transposes at graph inputs/outputs become the graph's
    layout, recorded in graph.meta["canonical_layout"] (the only interface change).
    """

    name = "canonicalize"
    level = 3  # the level it would belong to; it is not in PIPELINE, so no level runs it
    modes = ("inference",)

    def run(self, graph: Graph, ctx: PassContext) -> int:
        return canonicalize(graph, ctx=ctx)


register_pass(Canonicalize)
