"""One translation per TF op type (TF semantics on the left, IR/ONNX semantics on the right), registered
in the importer's table (`importer.handlers`).

A handler returns one `Entry` per TF output, or raises `Untranslatable` (or returns None) for a form it
does not cover: the importer rolls back what it added and keeps the op opaque.
"""
from __future__ import annotations

import numpy as np

from aiacc.core.ops import get_schema
from aiacc.core.translate import Untranslatable
from aiacc.errors import UnsupportedError
from aiacc.plugins.tf._tf import np_dtype_name, same_pads, tf, tf_shape
from aiacc.plugins.tf.importer import INT_MAX, NHWC_AXIS_TO_NCHW, TO_NCHW, Entry, GraphImporter, handlers


def _attr(tfop, key, default=None):
    try:
        v = tfop.get_attr(key)
    except ValueError:
        return default
    return v.decode() if isinstance(v, bytes) else v


# ------------------------------------------------------------------------------------------ plumbing
@handlers.register("Const")
def _const(imp: GraphImporter, tfop):
    value = tf().make_ndarray(tfop.get_attr("value"))
    return [Entry(imp.init(value, tfop.name))]


@handlers.register("Identity", "StopGradient", "Snapshot", "PreventGradient", "EnsureShape", "CheckNumerics")
def _identity(imp, tfop):
    return [imp.entry(tfop.inputs[0])]


@handlers.register("IdentityN")
def _identity_n(imp, tfop):
    return [imp.entry(t) for t in tfop.inputs]


@handlers.register("Cast")
def _cast(imp, tfop):
    to = np_dtype_name(tfop.get_attr("DstT"), f"TF node {tfop.name} (Cast)")
    e = imp.entry(tfop.inputs[0])
    return [Entry(imp.emit1("Cast", [e.value], {"to": to}, name=tfop.name), e.nchw)]


# ------------------------------------------------------------------------------------------ elementwise
_UNARY = {"Relu": "Relu", "Elu": "Elu", "Selu": "Selu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp",
          "Log": "Log", "Sqrt": "Sqrt", "Neg": "Neg", "Abs": "Abs", "Erf": "Erf", "Reciprocal": "Reciprocal",
          "Inv": "Reciprocal", "Floor": "Floor", "Ceil": "Ceil", "Round": "Round", "Sign": "Sign", "Sin": "Sin",
          "Cos": "Cos", "Softplus": "Softplus", "Softsign": "Softsign", "LogicalNot": "Not"}


@handlers.register(*_UNARY)
def _unary(imp, tfop):
    e = imp.entry(tfop.inputs[0])
    return [Entry(imp.emit1(_UNARY[tfop.type], [e.value], name=tfop.name), e.nchw)]


@handlers.register("LeakyRelu")
def _leaky(imp, tfop):
    e = imp.entry(tfop.inputs[0])
    return [Entry(imp.emit1("LeakyRelu", [e.value], {"alpha": float(tfop.get_attr("alpha"))}, name=tfop.name),
                  e.nchw)]


@handlers.register("Relu6")
def _relu6(imp, tfop):
    e = imp.entry(tfop.inputs[0])
    dt = e.value.dtype
    lo, hi = imp.init(np.array(0, dt), tfop.name + "_min"), imp.init(np.array(6, dt), tfop.name + "_max")
    return [Entry(imp.emit1("Clip", [e.value, lo, hi], name=tfop.name), e.nchw)]


@handlers.register("Rsqrt")
def _rsqrt(imp, tfop):
    e = imp.entry(tfop.inputs[0])
    s = imp.emit1("Sqrt", [e.value], name=tfop.name + "_sqrt")
    return [Entry(imp.emit1("Reciprocal", [s], name=tfop.name), e.nchw)]


@handlers.register("Square")
def _square(imp, tfop):
    e = imp.entry(tfop.inputs[0])
    return [Entry(imp.emit1("Mul", [e.value, e.value], name=tfop.name), e.nchw)]


@handlers.register("Erfc")
def _erfc(imp, tfop):
    e = imp.entry(tfop.inputs[0])
    erf = imp.emit1("Erf", [e.value], name=tfop.name + "_erf")
    one = imp.init(np.array(1, e.value.dtype), tfop.name + "_one")
    return [Entry(imp.emit1("Sub", [one, erf], name=tfop.name), e.nchw)]


def _operands(imp: GraphImporter, tensors) -> tuple[list, bool]:
    """IR operands of a broadcasting op: NCHW when a rank-4 operand already is and the others can follow
    (constants are permuted, rank-4 tensors transposed), else all in TF layout."""
    entries = [imp.entry(t) for t in tensors]
    if any(e.nchw for e in entries):
        ok = all(e.nchw or e.value.const is not None or (e.value.shape is not None and len(e.value.shape) == 4)
                 for e in entries)
        if ok:
            vals = []
            for t, e in zip(tensors, entries):
                if e.nchw:
                    vals.append(e.value)
                elif e.value.const is not None:
                    vals.append(_const_to_nchw(imp, e.value, t.name))
                else:
                    vals.append(imp.nchw(t))
            return vals, True
    return [imp.plain(t) for t in tensors], False


def _const_to_nchw(imp, v, name):
    """A constant broadcast against an NHWC rank-4 tensor, rewritten to broadcast against NCHW."""
    c = v.const
    if c.ndim == 0:
        return v
    if c.ndim > 4:
        raise Untranslatable("constant of rank > 4")
    c4 = c.reshape((1,) * (4 - c.ndim) + c.shape).transpose(TO_NCHW)
    while c4.ndim > 1 and c4.shape[0] == 1:  # drop leading ones: (1,C,1,1) -> (C,1,1)
        c4 = c4[0]
    return imp.init(np.ascontiguousarray(c4), name + "_nchw")


_BINARY = {"AddV2": "Add", "Add": "Add", "Sub": "Sub", "Mul": "Mul", "RealDiv": "Div", "Maximum": "Max",
           "Minimum": "Min", "Pow": "Pow", "Less": "Less", "Greater": "Greater", "LessEqual": "LessOrEqual",
           "GreaterEqual": "GreaterOrEqual", "Equal": "Equal", "LogicalAnd": "And", "LogicalOr": "Or",
           "FloorMod": "Mod", "AddN": "Sum"}


@handlers.register(*_BINARY)
def _binary(imp, tfop):
    if tfop.type in ("RealDiv",) and not tfop.inputs[0].dtype.is_floating:
        return None
    vals, nchw = _operands(imp, list(tfop.inputs))
    return [Entry(imp.emit1(_BINARY[tfop.type], vals, name=tfop.name), nchw)]


@handlers.register("Div")
def _div(imp, tfop):
    if not tfop.inputs[0].dtype.is_floating:
        return None  # TF integer Div floors, ONNX Div truncates
    vals, nchw = _operands(imp, list(tfop.inputs))
    return [Entry(imp.emit1("Div", vals, name=tfop.name), nchw)]


@handlers.register("SquaredDifference")
def _sqdiff(imp, tfop):
    vals, nchw = _operands(imp, list(tfop.inputs))
    d = imp.emit1("Sub", vals, name=tfop.name + "_diff")
    return [Entry(imp.emit1("Mul", [d, d], name=tfop.name), nchw)]


@handlers.register("Select", "SelectV2")
def _select(imp, tfop):
    if tfop.type == "Select" and imp.rank(tfop.inputs[0]) not in (0, imp.rank(tfop.inputs[1])):
        return None  # Select with a vector condition picks rows: not numpy broadcasting
    vals, nchw = _operands(imp, list(tfop.inputs))
    return [Entry(imp.emit1("Where", vals, name=tfop.name), nchw)]


@handlers.register("BiasAdd", "BiasAddV1")
def _bias_add(imp, tfop):
    x, b = tfop.inputs
    e = imp.entry(x)
    fmt = _attr(tfop, "data_format", "NHWC")
    rank = imp.rank(x)
    bias = imp.plain(b)
    if fmt == "NCHW" and rank and rank > 2:
        bias = _channel_vector(imp, bias, rank - 2, tfop.name)
        return [Entry(imp.emit1("Add", [imp.plain(x), bias], name=tfop.name))]
    if e.nchw:
        bias = _channel_vector(imp, bias, 2, tfop.name)
        return [Entry(imp.emit1("Add", [e.value, bias], name=tfop.name), True)]
    return [Entry(imp.emit1("Add", [e.value, bias], name=tfop.name))]


def _channel_vector(imp, bias, trailing: int, name):
    """(C,) -> (C, 1, ..., 1) so that it broadcasts over a channels-first tensor."""
    if bias.const is not None:
        return imp.init(bias.const.reshape(bias.const.shape + (1,) * trailing), name + "_bias")
    return imp.emit1("Unsqueeze", [bias, imp.ints(list(range(1, trailing + 1)), name + "_axes")],
                     name=name + "_bias")


# ------------------------------------------------------------------------------------------ convolution
def _spatial(tfop, key, fmt):
    v = list(tfop.get_attr(key))
    return v[1:3] if fmt == "NHWC" else v[2:4]


def _padding_attrs(imp, tfop, x, kernel, strides, dilations, fmt):
    """ONNX pads / auto_pad for TF's padding attribute."""
    padding = _attr(tfop, "padding")
    if padding == "VALID":
        return {"pads": [0, 0, 0, 0]}
    if padding == "EXPLICIT":
        ex = list(tfop.get_attr("explicit_paddings"))
        pairs = [ex[i:i + 2] for i in range(0, len(ex), 2)]
        hw = pairs[1:3] if fmt == "NHWC" else pairs[2:4]
        return {"pads": [hw[0][0], hw[1][0], hw[0][1], hw[1][1]]}
    shape = imp.static_shape(x)
    sizes = None if shape is None else (shape[1:3] if fmt == "NHWC" else shape[2:4])
    if sizes is not None and all(isinstance(s, int) for s in sizes):
        return {"pads": same_pads(sizes, kernel, strides, dilations)}
    return {"auto_pad": "SAME_UPPER"}


def _layout_in(imp, x, fmt):
    if fmt == "NHWC":
        return imp.nchw(x)
    if fmt == "NCHW":
        return imp.plain(x)
    raise Untranslatable(f"data_format {fmt}")


@handlers.register("Conv2D", "DepthwiseConv2dNative")
def _conv(imp, tfop):
    x, w = tfop.inputs
    fmt = _attr(tfop, "data_format", "NHWC")
    wc = imp.need_const(w, "non-constant filter")
    kh, kw, cin_w, cout_w = wc.shape
    strides, dilations = _spatial(tfop, "strides", fmt), _spatial(tfop, "dilations", fmt)
    xv = _layout_in(imp, x, fmt)
    if tfop.type == "Conv2D":
        weight = np.ascontiguousarray(wc.transpose(3, 2, 0, 1))  # HWIO -> OIHW
        cin = (imp.static_shape(x) or [None] * 4)[3 if fmt == "NHWC" else 1]
        group = cin // cin_w if isinstance(cin, int) and cin != cin_w else 1
    else:  # depthwise: (H, W, C, M) -> (C*M, 1, H, W), group C
        weight = np.ascontiguousarray(wc.reshape(kh, kw, cin_w * cout_w).transpose(2, 0, 1)[:, None])
        group = cin_w
    attrs = {"kernel_shape": [kh, kw], "strides": strides, "dilations": dilations, "group": group}
    attrs.update(_padding_attrs(imp, tfop, x, [kh, kw], strides, dilations, fmt))
    wv = imp.init(weight, tfop.name + "_weight")
    return [Entry(imp.emit1("Conv", [xv, wv], attrs, name=tfop.name), fmt == "NHWC")]


@handlers.register("MaxPool", "AvgPool")
def _pool(imp, tfop):
    (x,) = tfop.inputs[:1]
    fmt = _attr(tfop, "data_format", "NHWC")
    kernel, strides = _spatial(tfop, "ksize", fmt), _spatial(tfop, "strides", fmt)
    attrs = {"kernel_shape": kernel, "strides": strides}
    attrs.update(_padding_attrs(imp, tfop, x, kernel, strides, [1, 1], fmt))
    op = "MaxPool"
    if tfop.type == "AvgPool":
        op = "AveragePool"
        attrs["count_include_pad"] = 0  # TF SAME averages over the valid window only
    return [Entry(imp.emit1(op, [_layout_in(imp, x, fmt)], attrs, name=tfop.name), fmt == "NHWC")]


@handlers.register("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
def _fused_bn(imp, tfop):
    if tfop.get_attr("is_training"):
        raise UnsupportedError(f"TF node {tfop.name} ({tfop.type}) is in training mode; aiacc imports "
                               f"inference graphs (call the Keras model with training=False)")
    for t in tfop.outputs[1:]:
        if t.consumers():
            return None
    x = tfop.inputs[0]
    fmt = _attr(tfop, "data_format", "NHWC")
    params = [imp.plain(t) for t in tfop.inputs[1:5]]
    y = imp.emit1("BatchNormalization", [_layout_in(imp, x, fmt)] + params,
                  {"epsilon": float(tfop.get_attr("epsilon"))}, name=tfop.name)
    # the statistics outputs are unread (checked above)
    return [Entry(y, fmt == "NHWC")] + [None] * (len(tfop.outputs) - 1)


# ------------------------------------------------------------------------------------------ matmul
@handlers.register("MatMul")
def _matmul(imp, tfop):
    a, b = [imp.plain(t) for t in tfop.inputs]
    if tfop.get_attr("transpose_a"):
        a = imp.transpose(a, (1, 0))
    if tfop.get_attr("transpose_b"):
        b = imp.transpose(b, (1, 0))
    return [Entry(imp.emit1("MatMul", [a, b], name=tfop.name))]


@handlers.register("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
def _batch_matmul(imp, tfop):
    vals = []
    for t, key in zip(tfop.inputs, ("adj_x", "adj_y")):
        v = imp.plain(t)
        if tfop.get_attr(key):
            r = imp.rank(t)
            if r is None:
                return None
            perm = list(range(r - 2)) + [r - 1, r - 2]
            v = imp.transpose(v, perm)
        vals.append(v)
    return [Entry(imp.emit1("MatMul", vals, name=tfop.name))]


@handlers.register("Einsum")
def _einsum(imp, tfop):
    """Two-operand einsum without ellipsis as Transpose -> (Reshape) -> MatMul -> (Reshape) -> Transpose."""
    eq = _attr(tfop, "equation").replace(" ", "")
    if "..." in eq or len(tfop.inputs) != 2 or "->" not in eq:
        return None
    lhs, out = eq.split("->")
    a_s, b_s = lhs.split(",")
    if len(set(a_s)) != len(a_s) or len(set(b_s)) != len(b_s):
        return None  # repeated letters (traces, diagonals)
    batch = [c for c in a_s if c in b_s and c in out]
    contract = [c for c in a_s if c in b_s and c not in out]
    m = [c for c in a_s if c not in b_s]
    n = [c for c in b_s if c not in a_s]
    if any(c not in out for c in m + n):
        return None  # a letter summed away inside one operand
    sa, sb = imp.static_shape(tfop.inputs[0]), imp.static_shape(tfop.inputs[1])
    if sa is None or sb is None:
        return None
    size = {c: d for c, d in zip(a_s, sa)}
    size.update({c: d for c, d in zip(b_s, sb) if size.get(c) is None})
    if m and n and contract and (not batch or len(m) == 1):
        y = _einsum_broadcast(imp, tfop, a_s, b_s, batch, m, contract, n, size)
    else:
        y = _einsum_grouped(imp, tfop, a_s, b_s, batch, m, contract, n, size)
    order = batch + m + n
    y = imp.transpose(y, [order.index(c) for c in out])
    return [Entry(y)]


def _static(size, letters, what):
    dims = [size[c] for c in letters]
    if not all(isinstance(d, int) for d in dims):
        raise Untranslatable(f"dynamic {what} dims in einsum")
    return dims


def _einsum_broadcast(imp, tfop, a_s, b_s, batch, m, contract, n, size):
    """A as (batch..., m..., K) and B as (batch..., K, N) so MatMul broadcasts over A's leading dims: only
    the contracted and B's free dims need static sizes (Keras' EinsumDense with dynamic batch and length)."""
    name = tfop.name
    a = imp.transpose(imp.plain(tfop.inputs[0]), [a_s.index(c) for c in batch + m + contract])
    if len(contract) > 1:
        k = int(np.prod(_static(size, contract, "contracted")))
        a = imp.emit1("Reshape", [a, imp.ints([0] * (len(batch) + len(m)) + [k], name + "_a_shape")],
                      name=name + "_a_reshape")
    b = imp.transpose(imp.plain(tfop.inputs[1]), [b_s.index(c) for c in batch + contract + n])
    if len(contract) > 1 or len(n) > 1:
        k = int(np.prod(_static(size, contract, "contracted")))
        nn = int(np.prod(_static(size, n, "output")))
        b = imp.emit1("Reshape", [b, imp.ints([0] * len(batch) + [k, nn], name + "_b_shape")],
                      name=name + "_b_reshape")
    y = imp.emit1("MatMul", [a, b], name=name + "_matmul")
    if len(n) > 1:
        y = imp.emit1("Reshape", [y, imp.ints([0] * (len(batch) + len(m)) + _static(size, n, "output"),
                                               name + "_out_shape")], name=name + "_out_reshape")
    return y


def _einsum_grouped(imp, tfop, a_s, b_s, batch, m, contract, n, size):
    """Batch letters and several free letters of A: group both operands into (batch..., rows, cols)."""
    name = tfop.name

    def grouped(v, letters, order, rows, cols, tag):
        v = imp.transpose(v, [letters.index(c) for c in order])
        if len(rows) == 1 and len(cols) == 1:
            return v
        target = [0] * len(batch) + [int(np.prod(_static(size, rows, "grouped"))),
                                     int(np.prod(_static(size, cols, "grouped")))]
        return imp.emit1("Reshape", [v, imp.ints(target, f"{name}_{tag}_shape")], name=f"{name}_{tag}_reshape")

    a = grouped(imp.plain(tfop.inputs[0]), a_s, batch + m + contract, m, contract, "a")
    b = grouped(imp.plain(tfop.inputs[1]), b_s, batch + contract + n, contract, n, "b")
    y = imp.emit1("MatMul", [a, b], name=name + "_matmul")
    if not (len(m) == 1 and len(n) == 1):
        y = imp.emit1("Reshape", [y, imp.ints([0] * len(batch) + _static(size, m + n, "grouped"),
                                               name + "_out_shape")], name=name + "_out_reshape")
    return y


# ------------------------------------------------------------------------------------------ reductions
def _reduce_axes(imp, tfop):
    axes = imp.need_const(tfop.inputs[1], "non-constant axes")
    rank = imp.rank(tfop.inputs[0])
    if rank is None:
        raise Untranslatable("unknown rank")
    return sorted({int(a) % rank for a in np.asarray(axes).reshape(-1)}), rank


_REDUCE = {"Mean": "ReduceMean", "Sum": "ReduceSum", "Max": "ReduceMax", "Min": "ReduceMin", "Prod": "ReduceProd"}


@handlers.register(*_REDUCE)
def _reduce(imp, tfop):
    axes, rank = _reduce_axes(imp, tfop)
    keep = bool(tfop.get_attr("keep_dims"))
    x = tfop.inputs[0]
    e = imp.entry(x)
    op = _REDUCE[tfop.type]
    if get_schema(op) is None:
        return None
    if e.nchw and rank == 4 and axes == [1, 2] and op in ("ReduceMean", "ReduceMax"):
        pooled = imp.emit1("GlobalAveragePool" if op == "ReduceMean" else "GlobalMaxPool", [e.value],
                           name=tfop.name + ("_gap" if not keep else ""))
        if keep:
            return [Entry(pooled, True)]
        return [Entry(imp.emit1("Squeeze", [pooled, imp.ints([2, 3], tfop.name + "_axes")], name=tfop.name))]
    if e.nchw and rank == 4 and keep:
        mapped = sorted(NHWC_AXIS_TO_NCHW[a] for a in axes)
        return [Entry(imp.emit1(op, [e.value, imp.ints(mapped, tfop.name + "_axes")], {"keepdims": 1},
                                name=tfop.name), True)]
    y = imp.emit1(op, [imp.plain(x), imp.ints(axes, tfop.name + "_axes")], {"keepdims": int(keep)}, name=tfop.name)
    return [Entry(y)]


@handlers.register("Softmax", "LogSoftmax")
def _softmax(imp, tfop):
    e = imp.entry(tfop.inputs[0])
    op = tfop.type
    if e.nchw:
        return [Entry(imp.emit1(op, [e.value], {"axis": 1}, name=tfop.name), True)]
    return [Entry(imp.emit1(op, [e.value], {"axis": -1}, name=tfop.name))]


# ------------------------------------------------------------------------------------------ shapes
@handlers.register("Reshape")
def _reshape(imp, tfop):
    x, s = tfop.inputs
    target = imp.const(s)
    if target is None:
        sym = imp.sym.get(s.name)
        if isinstance(sym, list) and not any(isinstance(d, int) and d <= 0 for d in sym):
            # dims equal (same symbol) to the input's at the same index are copied (0), one more may be -1
            in_shape = imp.static_shape(x) or ()
            dims = [d if isinstance(d, int) else (0 if i < len(in_shape) and in_shape[i] == d else None)
                    for i, d in enumerate(sym)]
            if sum(d is None for d in dims) <= 1:
                target = np.array([-1 if d is None else d for d in dims], np.int64)
                y = imp.emit1("Reshape", [imp.plain(x), imp.ints(target, tfop.name + "_shape")], name=tfop.name)
                _set_symbolic_shape(y, sym)
                return [Entry(y)]
        # a shape computed at run time: TF semantics (0 is an empty dim, not a copy)
        sv = imp.plain(s)
        if sv.dtype != "int64":
            sv = imp.emit1("Cast", [sv], {"to": "int64"}, name=tfop.name + "_shape")
        y = imp.emit1("Reshape", [imp.plain(x), sv], {"allowzero": 1}, name=tfop.name)
        if isinstance(sym, list):
            _set_symbolic_shape(y, sym)
        return [Entry(y)]
    target = np.asarray(target, np.int64).reshape(-1)
    attrs = {"allowzero": 1} if (target == 0).any() else {}
    y = imp.emit1("Reshape", [imp.plain(x), imp.ints(target, tfop.name + "_shape")], attrs, name=tfop.name)
    return [Entry(y)]


def _set_symbolic_shape(y, sym) -> None:
    """Give a Reshape output the dims the shape arithmetic knows (symbols included)."""
    from aiacc.core.ir import TensorType

    if y.const is not None:
        return
    if y.shape is None or len(y.shape) != len(sym):
        y.type = TensorType(y.dtype, tuple(sym))
        return
    y.type = TensorType(y.dtype, tuple(d if isinstance(d, int) else o for d, o in zip(y.shape, sym)))


@handlers.register("Squeeze")
def _squeeze(imp, tfop):
    x = tfop.inputs[0]
    dims = list(tfop.get_attr("squeeze_dims"))
    shape = imp.static_shape(x)
    if shape is None:
        return None
    rank = len(shape)
    if not dims:
        if any(d is None or isinstance(d, str) for d in shape):
            return None
        dims = [i for i, d in enumerate(shape) if d == 1]
    dims = sorted(d % rank for d in dims)
    if not dims:
        return [imp.entry(x)]
    return [Entry(imp.emit1("Squeeze", [imp.plain(x), imp.ints(dims, tfop.name + "_axes")], name=tfop.name))]


@handlers.register("ExpandDims")
def _expand_dims(imp, tfop):
    x, a = tfop.inputs
    axis = int(np.asarray(imp.need_const(a, "non-constant axis")).reshape(-1)[0])
    rank = imp.rank(x)
    if rank is None:
        return None
    axis = axis % (rank + 1)
    return [Entry(imp.emit1("Unsqueeze", [imp.plain(x), imp.ints([axis], tfop.name + "_axes")], name=tfop.name))]


@handlers.register("Transpose")
def _transpose(imp, tfop):
    x, p = tfop.inputs
    perm = [int(i) for i in imp.need_const(p, "non-constant perm")]
    e = imp.entry(x)
    if e.nchw and len(perm) == 4:
        inv = [TO_NCHW.index(i) for i in range(4)]  # NHWC axis -> position in the NCHW value
        return [Entry(imp.transpose(e.value, [inv[q] for q in perm]))]
    return [Entry(imp.transpose(e.value, perm))]


def _int64_as(imp, tfop, y, attr):
    """The int64 result `y` of an ONNX op cast to the TF op's integer output dtype (its `attr`), if that differs."""
    to = np_dtype_name(tfop.get_attr(attr), tfop.name)
    if to != "int64":
        y = imp.emit1("Cast", [y], {"to": to}, name=tfop.name + "_cast")
    return y


@handlers.register("Shape")
def _shape(imp, tfop):
    y = imp.emit1("Shape", [imp.plain(tfop.inputs[0])], name=tfop.name)
    return [Entry(_int64_as(imp, tfop, y, "out_type"))]


@handlers.register("ConcatV2")
def _concat(imp, tfop):
    tensors, a = list(tfop.inputs[:-1]), tfop.inputs[-1]
    axis = int(imp.need_const(a, "non-constant axis"))
    rank = imp.rank(tensors[0])
    if rank is None:
        return None
    axis %= rank
    vals, nchw = _operands(imp, tensors)
    if nchw:
        axis = NHWC_AXIS_TO_NCHW[axis]
    return [Entry(imp.emit1("Concat", vals, {"axis": axis}, name=tfop.name), nchw)]


@handlers.register("Pack")
def _pack(imp, tfop):
    rank = imp.rank(tfop.inputs[0])
    if rank is None:
        return None
    axis = tfop.get_attr("axis") % (rank + 1)
    parts = [imp.emit1("Unsqueeze", [imp.plain(t), imp.ints([axis], f"{tfop.name}_axes{k}")],
                       name=f"{tfop.name}_unsqueeze{k}") for k, t in enumerate(tfop.inputs)]
    if len(parts) == 1:
        return [Entry(parts[0])]
    return [Entry(imp.emit1("Concat", parts, {"axis": axis}, name=tfop.name))]


@handlers.register("Pad", "PadV2", "MirrorPad")
def _pad(imp, tfop):
    x = tfop.inputs[0]
    pads = np.asarray(imp.need_const(tfop.inputs[1], "non-constant paddings")).astype(np.int64)
    e = imp.entry(x)
    mode = "constant"
    if tfop.type == "MirrorPad":
        m = _attr(tfop, "mode")
        if m != "REFLECT":
            return None
        mode = "reflect"
    inputs_nchw = e.nchw and pads.shape[0] == 4
    if inputs_nchw:
        pads = pads[list(TO_NCHW)]
        xv = e.value
    else:
        xv = imp.plain(x)
    ins = [xv, imp.ints(np.concatenate([pads[:, 0], pads[:, 1]]), tfop.name + "_pads")]
    if tfop.type == "PadV2":
        ins.append(imp.plain(tfop.inputs[2]))
    return [Entry(imp.emit1("Pad", ins, {"mode": mode}, name=tfop.name), inputs_nchw)]


@handlers.register("StridedSlice")
def _strided_slice(imp, tfop):
    """StridedSlice -> Slice (+ Squeeze for shrink_axis_mask, + Unsqueeze for new_axis_mask); the
    ellipsis stands for the dimensions no other entry of the spec names."""
    x, b, e_, s = tfop.inputs
    rank = imp.rank(x)
    if rank is None:
        return None
    begin = [int(v) for v in np.asarray(imp.need_const(b, "non-constant begin")).reshape(-1)]
    end = [int(v) for v in np.asarray(imp.need_const(e_, "non-constant end")).reshape(-1)]
    strides = [int(v) for v in np.asarray(imp.need_const(s, "non-constant strides")).reshape(-1)]
    bm, em, sm = _attr(tfop, "begin_mask"), _attr(tfop, "end_mask"), _attr(tfop, "shrink_axis_mask")
    nm, elm = _attr(tfop, "new_axis_mask"), _attr(tfop, "ellipsis_mask")
    n_spec = len(begin)
    if bin(elm).count("1") > 1:
        return None
    consumed = sum(1 for i in range(n_spec) if not (nm >> i) & 1 and not (elm >> i) & 1)
    starts, ends, axes, steps, squeeze, new_axes = [], [], [], [], [], []
    dim = out_pos = 0
    for i in range(n_spec):
        if (elm >> i) & 1:
            n_full = rank - consumed
            dim += n_full
            out_pos += n_full
            continue
        if (nm >> i) & 1:
            if (sm >> i) & 1:
                return None
            new_axes.append(out_pos)
            out_pos += 1
            continue
        if dim >= rank:
            return None
        bi, ei, si = begin[i], end[i], strides[i]
        if (sm >> i) & 1:
            starts.append(bi)
            ends.append(bi + 1 if bi != -1 else INT_MAX)
            steps.append(1)
            squeeze.append(dim)
        else:
            out_pos += 1
            if (bm >> i) & 1 and (em >> i) & 1 and si == 1:
                dim += 1
                continue  # the whole axis
            starts.append((0 if si > 0 else INT_MAX) if (bm >> i) & 1 else bi)
            ends.append((INT_MAX if si > 0 else -INT_MAX) if (em >> i) & 1 else ei)
            steps.append(si)
        axes.append(dim)
        dim += 1
    n = tfop.name
    y = imp.plain(x)
    if axes:
        y = imp.emit1("Slice", [y, imp.ints(starts, n + "_starts"), imp.ints(ends, n + "_ends"),
                                imp.ints(axes, n + "_axes"), imp.ints(steps, n + "_steps")], name=n + "_slice")
    if squeeze:
        y = imp.emit1("Squeeze", [y, imp.ints(squeeze, n + "_squeeze_axes")], name=n + "_squeeze")
    if new_axes:
        y = imp.emit1("Unsqueeze", [y, imp.ints(new_axes, n + "_new_axes")], name=n + "_unsqueeze")
    if y is imp.plain(x):
        y = imp.emit1("Identity", [y], name=n)
    return [Entry(y)]


@handlers.register("GatherV2")
def _gather(imp, tfop):
    if _attr(tfop, "batch_dims", 0):
        return None
    params, idx = tfop.inputs[0], tfop.inputs[1]
    axis = int(imp.need_const(tfop.inputs[2], "non-constant axis"))
    return [Entry(imp.emit1("Gather", [imp.plain(params), imp.plain(idx)], {"axis": axis}, name=tfop.name))]


@handlers.register("Tile")
def _tile(imp, tfop):
    x, m = tfop.inputs
    reps = imp.const(m)
    e = imp.entry(x)
    if reps is None:
        mv = imp.plain(m)
        if mv.dtype != "int64":
            mv = imp.emit1("Cast", [mv], {"to": "int64"}, name=tfop.name + "_multiples")
        return [Entry(imp.emit1("Tile", [imp.plain(x), mv], name=tfop.name))]
    reps = np.asarray(reps, np.int64).reshape(-1)
    if e.nchw and reps.size == 4:
        return [Entry(imp.emit1("Tile", [e.value, imp.ints(reps[list(TO_NCHW)], tfop.name + "_multiples")],
                                name=tfop.name), True)]
    return [Entry(imp.emit1("Tile", [imp.plain(x), imp.ints(reps, tfop.name + "_multiples")], name=tfop.name))]


def _expand(imp, tfop, x, shape, cast_suffix):
    """ONNX Expand of tensor `x` to the runtime shape tensor `shape` (cast to int64 when it is not)."""
    sv = imp.plain(shape)
    if sv.dtype != "int64":
        sv = imp.emit1("Cast", [sv], {"to": "int64"}, name=tfop.name + cast_suffix)
    return [Entry(imp.emit1("Expand", [imp.plain(x), sv], name=tfop.name))]


@handlers.register("Fill")
def _fill(imp, tfop):
    dims, value = tfop.inputs
    return _expand(imp, tfop, value, dims, "_dims")


@handlers.register("Range")
def _range(imp, tfop):
    dt = np_dtype_name(tfop.outputs[0].dtype, tfop.name)
    vals = []
    for k, t in enumerate(tfop.inputs):
        v = imp.plain(t)
        if v.dtype != dt:
            v = imp.emit1("Cast", [v], {"to": dt}, name=f"{tfop.name}_in{k}")
        vals.append(v)
    return [Entry(imp.emit1("Range", vals, name=tfop.name))]


@handlers.register("IsFinite")
def _is_finite(imp, tfop):
    # |x| < inf is False for inf and NaN alike
    e = imp.entry(tfop.inputs[0])
    a = imp.emit1("Abs", [e.value], name=tfop.name + "_abs")
    inf = imp.init(np.array(np.inf, e.value.dtype), tfop.name + "_inf")
    return [Entry(imp.emit1("Less", [a, inf], name=tfop.name), e.nchw)]


@handlers.register("ZerosLike", "OnesLike")
def _fill_like(imp, tfop):
    e = imp.entry(tfop.inputs[0])
    shape = imp.emit1("Shape", [e.value], name=tfop.name + "_shape")
    one = imp.init(np.array(0 if tfop.type == "ZerosLike" else 1, e.value.dtype), tfop.name + "_value")
    return [Entry(imp.emit1("Expand", [one, shape], name=tfop.name), e.nchw)]


# ------------------------------------------------------------------------------------------ transposed conv
@handlers.register("Conv2DBackpropInput")
def _conv_transpose(imp, tfop):
    """Conv2DBackpropInput (Keras Conv2DTranspose) -> ConvTranspose with the pads TF derives from the output
    size it is given."""
    sizes_t, w, dy = tfop.inputs
    fmt = _attr(tfop, "data_format", "NHWC")
    wc = imp.need_const(w, "non-constant filter")
    if _spatial(tfop, "dilations", fmt) != [1, 1]:
        return None
    sizes = imp.const(sizes_t)
    sizes = list(np.asarray(sizes).reshape(-1)) if sizes is not None else imp.sym.get(sizes_t.name)
    if not isinstance(sizes, list) or len(sizes) != 4:
        return None
    out_hw = sizes[1:3] if fmt == "NHWC" else sizes[2:4]
    in_shape = imp.static_shape(dy)
    if in_shape is None:
        return None
    in_hw = in_shape[1:3] if fmt == "NHWC" else in_shape[2:4]
    if not all(isinstance(d, (int, np.integer)) for d in list(out_hw) + list(in_hw)):
        return None
    kh, kw, cout, cin = wc.shape
    strides = _spatial(tfop, "strides", fmt)
    padding = _attr(tfop, "padding")
    begin = []
    for n, k, s in zip(out_hw, (kh, kw), strides):
        if padding == "SAME":
            begin.append(max((-(-int(n) // s) - 1) * s + k - int(n), 0) // 2)
        elif padding == "VALID":
            begin.append(0)
        else:
            return None  # EXPLICIT: rare in Keras; stays opaque
    end, out_pad = [], []
    for n, m, k, s, b in zip(out_hw, in_hw, (kh, kw), strides, begin):
        e = s * (int(m) - 1) + k - b - int(n)
        end.append(max(e, 0))
        out_pad.append(max(-e, 0))
    if any(p >= s for p, s in zip(out_pad, strides)):
        return None
    attrs = {"kernel_shape": [kh, kw], "strides": strides, "pads": begin + end, "dilations": [1, 1], "group": 1}
    if any(out_pad):
        attrs["output_padding"] = out_pad
    weight = imp.init(np.ascontiguousarray(wc.transpose(3, 2, 0, 1)), tfop.name + "_weight")  # HWOI -> IOHW
    y = imp.emit1("ConvTranspose", [_layout_in(imp, dy, fmt), weight], attrs, name=tfop.name)
    return [Entry(y, fmt == "NHWC")]


# ------------------------------------------------------------------------------------------ dilated conv
@handlers.register("BatchToSpaceND")
def _batch_to_space(imp, tfop):
    """SpaceToBatchND -> [ExpandDims] -> Conv2D / DepthwiseConv2dNative -> [Squeeze] -> BatchToSpaceND, the
    form TF gives a dilated convolution, becomes one Conv with dilations. (The chain's own IR nodes become
    dead code.) Any other use of BatchToSpaceND stays opaque."""
    y, block_t, crops_t = tfop.inputs
    op = y.op
    squeeze = None
    if op.type == "Squeeze":
        squeeze, op = op, op.inputs[0].op
    if op.type not in ("Conv2D", "DepthwiseConv2dNative"):
        return None
    conv = op
    op = conv.inputs[0].op
    expand = None
    if op.type == "ExpandDims":
        expand, op = op, op.inputs[0].op
    if op.type != "SpaceToBatchND" or (expand is None) != (squeeze is None):
        return None
    s2b = op
    block = imp.const(block_t)
    block2 = imp.const(s2b.inputs[1])
    if block is None or block2 is None:
        return None
    block, block2 = [int(b) for b in np.asarray(block).reshape(-1)], [int(b) for b in np.asarray(block2).reshape(-1)]
    if block != block2 or _attr(conv, "data_format", "NHWC") != "NHWC" or _attr(conv, "padding") != "VALID" or \
            list(conv.get_attr("strides")) != [1, 1, 1, 1] or list(conv.get_attr("dilations")) != [1, 1, 1, 1]:
        return None
    # the convolution pads by paddings - crops; for a run-time size TF computes both from the size, but
    # the size-dependent part (the padding up to a multiple of the block) is the same term in each
    diff = _linear(s2b.inputs[2]) - _linear(crops_t) if imp.const(s2b.inputs[2]) is None or imp.const(crops_t) \
        is None else np.asarray(imp.const(s2b.inputs[2]), np.int64) - np.asarray(imp.const(crops_t), np.int64)
    if diff is None or diff.shape != (len(block), 2):
        return None
    values = [_Lin.value_of(d) for d in diff.reshape(-1)]
    if any(v is None for v in values):
        return None
    diff = np.asarray(values, np.int64).reshape(-1, 2)
    begin, end = [int(v) for v in diff[:, 0]], [int(v) for v in diff[:, 1]]
    if min(begin + end) < 0:
        return None
    x = s2b.inputs[0]
    if expand is None:
        if len(block) != 2 or imp.rank(x) != 4:
            return None
        xv = imp.nchw(x)
        dil, pb, pe = block, begin, end
    else:
        if len(block) != 1 or imp.rank(x) != 3:
            return None
        axis = int(np.asarray(imp.need_const(expand.inputs[1], "non-constant axis")).reshape(-1)[0]) % 4
        sq = [d % 4 for d in squeeze.get_attr("squeeze_dims")]
        if axis not in (1, 2) or sq != [axis]:
            return None
        x4 = imp.emit1("Unsqueeze", [imp.plain(x), imp.ints([axis], tfop.name + "_axes")], name=tfop.name + "_2d")
        xv = imp.transpose(x4, TO_NCHW)
        if axis == 1:  # (N, 1, L, C): the length is the W axis
            dil, pb, pe = [1, block[0]], [0, begin[0]], [0, end[0]]
        else:
            dil, pb, pe = [block[0], 1], [begin[0], 0], [end[0], 0]
    wc = imp.need_const(conv.inputs[1], "non-constant filter")
    kh, kw, cin_w, cout_w = wc.shape
    if conv.type == "Conv2D":
        weight = np.ascontiguousarray(wc.transpose(3, 2, 0, 1))
        cin = xv.shape[1] if xv.shape is not None else None
        group = cin // cin_w if isinstance(cin, int) and cin != cin_w else 1
    else:
        weight = np.ascontiguousarray(wc.reshape(kh, kw, cin_w * cout_w).transpose(2, 0, 1)[:, None])
        group = cin_w
    attrs = {"kernel_shape": [kh, kw], "strides": [1, 1], "dilations": dil, "group": group, "pads": pb + pe}
    out = imp.emit1("Conv", [xv, imp.init(weight, tfop.name + "_weight")], attrs, name=tfop.name)
    if expand is None:
        return [Entry(out, True)]
    out = imp.transpose(out, (0, 2, 3, 1))
    return [Entry(imp.emit1("Squeeze", [out, imp.ints([axis], tfop.name + "_squeeze_axes")],
                            name=tfop.name + "_1d"))]


class _Lin:
    """An integer affine expression over unknown run-time integers: {term: coefficient} + constant."""

    __slots__ = ("terms", "c")

    def __init__(self, terms=None, c=0):
        self.terms = {k: v for k, v in (terms or {}).items() if v}
        self.c = int(c)

    @staticmethod
    def of(x) -> "_Lin":
        return x if isinstance(x, _Lin) else _Lin(c=int(x))

    @staticmethod
    def value_of(x):
        x = _Lin.of(x)
        return None if x.terms else x.c

    def __add__(self, other):
        other = _Lin.of(other)
        terms = dict(self.terms)
        for k, v in other.terms.items():
            terms[k] = terms.get(k, 0) + v
        return _Lin(terms, self.c + other.c)

    __radd__ = __add__

    def __neg__(self):
        return _Lin({k: -v for k, v in self.terms.items()}, -self.c)

    def __sub__(self, other):
        return self + (-_Lin.of(other))

    def __rsub__(self, other):
        return _Lin.of(other) - self


def _linear(t, depth: int = 0):
    """The small static-shape integer tensor `t` as an object array of _Lin, walking Const / Identity / Pack /
    ConcatV2 / StridedSlice / Add / Sub; any other producer is an unknown term per element. None when the
    shape is not static and small."""
    shape = tf_shape(t.shape)
    if shape is None or any(d is None for d in shape) or int(np.prod(shape, dtype=np.int64)) > 64:
        return None
    op = t.op

    def objects(items, dims):
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out.reshape(dims)

    def unknown():
        return objects([_Lin({(t.name, k): 1}) for k in range(int(np.prod(shape, dtype=np.int64)))], shape)

    if depth > 16:
        return unknown()
    try:
        if op.type == "Const":
            v = np.asarray(tf().make_ndarray(op.get_attr("value")))
            return objects([_Lin(c=int(x)) for x in v.reshape(-1)], v.shape)
        ins = [_linear(x, depth + 1) for x in op.inputs] if op.type in (
            "Identity", "Pack", "ConcatV2", "StridedSlice", "AddV2", "Add", "Sub") else None
        if ins is None or any(x is None for x in ins):
            return unknown()
        if op.type == "Identity":
            return ins[0]
        if op.type == "Pack":
            return np.stack(ins, axis=op.get_attr("axis"))
        if op.type == "ConcatV2":
            axis = _Lin.value_of(ins[-1].reshape(-1)[0])
            return np.concatenate(ins[:-1], axis=axis)
        if op.type in ("AddV2", "Add"):
            return ins[0] + ins[1]
        if op.type == "Sub":
            return ins[0] - ins[1]
        # StridedSlice: let TF pick the elements of an index array with the same spec
        spec = [[_Lin.value_of(x) for x in a.reshape(-1)] for a in ins[1:]]
        if any(v is None for a in spec for v in a):
            return unknown()
        idx = np.arange(ins[0].size, dtype=np.int64).reshape(ins[0].shape)
        picked = tf().strided_slice(idx, *[np.asarray(a, np.int64) for a in spec], **{k: op.get_attr(k) for k in (
            "begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")}).numpy()
        flat = ins[0].reshape(-1)
        return objects([flat[i] for i in picked.reshape(-1)], picked.shape)
    except (TypeError, ValueError):
        return unknown()


# ------------------------------------------------------------------------------------------ resize
@handlers.register("ResizeBilinear", "ResizeNearestNeighbor")
def _resize(imp, tfop):
    """TF image resizing -> Resize on the H and W axes with the coordinate mode TF's flags select."""
    x, size_t = tfop.inputs
    size = imp.const(size_t)
    size = list(np.asarray(size).reshape(-1)) if size is not None else imp.sym.get(size_t.name)
    if not isinstance(size, list) or len(size) != 2 or not all(isinstance(s, (int, np.integer)) for s in size):
        return None
    align, half = bool(tfop.get_attr("align_corners")), bool(tfop.get_attr("half_pixel_centers"))
    if align and half:
        return None
    if tfop.type == "ResizeBilinear":
        attrs = {"mode": "linear", "coordinate_transformation_mode":
                 "align_corners" if align else ("half_pixel" if half else "asymmetric")}
    else:
        # TF: src = floor((dst + 0.5) * in/out) for half-pixel centres, round(dst * (in-1)/(out-1)) aligned,
        # floor(dst * in/out) legacy; half_pixel + round_prefer_ceil gives the first exactly
        attrs = {"mode": "nearest",
                 "coordinate_transformation_mode": "align_corners" if align else ("half_pixel" if half else "asymmetric"),
                 "nearest_mode": "round_prefer_ceil" if (align or half) else "floor"}
    if tfop.inputs[0].dtype.name != "float32" and tfop.type == "ResizeBilinear":
        return None  # TF computes bilinear in float32 whatever the input type
    attrs["axes"] = [2, 3]
    sizes = imp.ints([int(s) for s in size], tfop.name + "_sizes")
    return [Entry(imp.emit1("Resize", [imp.nchw(x), None, None, sizes], attrs, name=tfop.name), True)]


# ------------------------------------------------------------------------------------------ more elementwise
@handlers.register("NotEqual")
def _not_equal(imp, tfop):
    vals, nchw = _operands(imp, list(tfop.inputs))
    eq = imp.emit1("Equal", vals, name=tfop.name + "_equal")
    return [Entry(imp.emit1("Not", [eq], name=tfop.name), nchw)]


@handlers.register("Log1p", "Expm1")
def _log1p_expm1(imp, tfop):
    e = imp.entry(tfop.inputs[0])
    one = imp.init(np.array(1, e.value.dtype), tfop.name + "_one")
    if tfop.type == "Log1p":
        s = imp.emit1("Add", [e.value, one], name=tfop.name + "_add")
        return [Entry(imp.emit1("Log", [s], name=tfop.name), e.nchw)]
    ex = imp.emit1("Exp", [e.value], name=tfop.name + "_exp")
    return [Entry(imp.emit1("Sub", [ex, one], name=tfop.name), e.nchw)]


@handlers.register("FloorDiv")
def _floor_div(imp, tfop):
    if not tfop.inputs[0].dtype.is_floating:
        return None  # integer floor division: ONNX Div truncates
    vals, nchw = _operands(imp, list(tfop.inputs))
    d = imp.emit1("Div", vals, name=tfop.name + "_div")
    return [Entry(imp.emit1("Floor", [d], name=tfop.name), nchw)]


@handlers.register("ClipByValue")
def _clip_by_value(imp, tfop):
    x, lo, hi = tfop.inputs
    if imp.rank(lo) == 0 and imp.rank(hi) == 0:
        e = imp.entry(x)
        return [Entry(imp.emit1("Clip", [e.value, imp.plain(lo), imp.plain(hi)], name=tfop.name), e.nchw)]
    vals, nchw = _operands(imp, [x, lo])
    y = imp.emit1("Max", vals, name=tfop.name + "_max")
    if nchw:
        hv = imp.const(hi)
        hv = _const_to_nchw(imp, imp.plain(hi), hi.name) if hv is not None else imp.nchw(hi)
        return [Entry(imp.emit1("Min", [y, hv], name=tfop.name), True)]
    return [Entry(imp.emit1("Min", [y, imp.plain(hi)], name=tfop.name))]


@handlers.register("ArgMax", "ArgMin")
def _arg_max(imp, tfop):
    x, a = tfop.inputs
    rank = imp.rank(x)
    if rank is None:
        return None
    axis = int(np.asarray(imp.need_const(a, "non-constant axis")).reshape(-1)[0]) % rank
    y = imp.emit1(tfop.type, [imp.plain(x)], {"axis": axis, "keepdims": 0}, name=tfop.name)
    return [Entry(_int64_as(imp, tfop, y, "output_type"))]


# ------------------------------------------------------------------------------------------ more shapes
@handlers.register("ReverseV2")
def _reverse(imp, tfop):
    x, a = tfop.inputs
    rank = imp.rank(x)
    if rank is None:
        return None
    axes = sorted({int(v) % rank for v in np.asarray(imp.need_const(a, "non-constant axis")).reshape(-1)})
    if not axes:
        return [imp.entry(x)]
    n = tfop.name
    k = len(axes)
    y = imp.emit1("Slice", [imp.plain(x), imp.ints([-1] * k, n + "_starts"), imp.ints([-INT_MAX] * k, n + "_ends"),
                            imp.ints(axes, n + "_axes"), imp.ints([-1] * k, n + "_steps")], name=n)
    return [Entry(y)]


def _split_parts(imp, tfop, x, axis: int, sizes: list[int] | None):
    e = imp.entry(x)
    rank = imp.rank(x)
    value, ax = imp.plain(x), axis
    if e.nchw and rank == 4:
        value, ax = e.value, NHWC_AXIS_TO_NCHW[axis]
    ins = [value] + ([imp.ints(sizes, tfop.name + "_sizes")] if sizes is not None else [])
    attrs = {"axis": ax}
    if sizes is None:
        attrs["num_outputs"] = len(tfop.outputs)
    outs = imp.emit("Split", ins, attrs, name=tfop.name, outputs=len(tfop.outputs))
    return [Entry(o, e.nchw and rank == 4) for o in outs]


@handlers.register("Split")
def _split(imp, tfop):
    a, x = tfop.inputs
    rank = imp.rank(x)
    if rank is None:
        return None
    axis = int(np.asarray(imp.need_const(a, "non-constant axis")).reshape(-1)[0]) % rank
    n = len(tfop.outputs)
    dim = (imp.static_shape(x) or [None] * rank)[axis]
    sizes = [dim // n] * n if isinstance(dim, int) else None
    return _split_parts(imp, tfop, x, axis, sizes)


@handlers.register("SplitV")
def _split_v(imp, tfop):
    x, s, a = tfop.inputs
    rank = imp.rank(x)
    if rank is None:
        return None
    axis = int(np.asarray(imp.need_const(a, "non-constant axis")).reshape(-1)[0]) % rank
    sizes = [int(v) for v in np.asarray(imp.need_const(s, "non-constant sizes")).reshape(-1)]
    if -1 in sizes:
        dim = (imp.static_shape(x) or [None] * rank)[axis]
        if not isinstance(dim, int):
            return None
        sizes[sizes.index(-1)] = dim - (sum(sizes) + 1)
    return _split_parts(imp, tfop, x, axis, sizes)


@handlers.register("Unpack")
def _unpack(imp, tfop):
    x = tfop.inputs[0]
    rank = imp.rank(x)
    if rank is None:
        return None
    axis = tfop.get_attr("axis") % rank
    n = len(tfop.outputs)
    parts = imp.emit("Split", [imp.plain(x), imp.ints([1] * n, tfop.name + "_sizes")], {"axis": axis},
                     name=tfop.name + "_split", outputs=n)
    return [Entry(imp.emit1("Squeeze", [p, imp.ints([axis], f"{tfop.name}_axes{k}")], name=f"{tfop.name}_{k}"))
            for k, p in enumerate(parts)]


@handlers.register("BroadcastTo")
def _broadcast_to(imp, tfop):
    x, s = tfop.inputs
    return _expand(imp, tfop, x, s, "_shape")


@handlers.register("MatrixBandPart")
def _band_part(imp, tfop):
    """Keep a band of the last two axes (Keras' causal mask): Where with a constant mask."""
    x, lo_t, hi_t = tfop.inputs
    shape = imp.static_shape(x)
    lo, hi = imp.const(lo_t), imp.const(hi_t)
    if shape is None or len(shape) < 2 or lo is None or hi is None:
        return None
    lo, hi = int(lo), int(hi)
    name = tfop.name
    zero = imp.init(np.array(0, np_dtype_name(tfop.inputs[0].dtype, name)), name + "_zero")
    if lo < 0 and hi < 0:
        return [imp.entry(x)]
    if all(isinstance(d, int) for d in shape[-2:]):
        m, n = shape[-2:]
        i, j = np.arange(m)[:, None], np.arange(n)[None, :]
        mask = imp.init(((lo < 0) | (i - j <= lo)) & ((hi < 0) | (j - i <= hi)), name + "_mask")
    else:  # sizes known at run time: the mask from two Ranges
        dims = imp.emit1("Shape", [imp.plain(x)], name=name + "_shape")
        zero64, one64 = imp.ints(0, name + "_start"), imp.ints(1, name + "_delta")
        idx = []
        for k, axis in enumerate((len(shape) - 2, len(shape) - 1)):
            size = imp.emit1("Gather", [dims, imp.ints(axis, f"{name}_axis{k}")], {"axis": 0}, name=f"{name}_size{k}")
            r = imp.emit1("Range", [zero64, size, one64], name=f"{name}_range{k}")
            idx.append(imp.emit1("Unsqueeze", [r, imp.ints([1 - k], f"{name}_unsqueeze_axes{k}")],
                                 name=f"{name}_index{k}"))
        diff = imp.emit1("Sub", idx, name=name + "_diff")  # i - j
        conds = []
        if lo >= 0:
            conds.append(imp.emit1("LessOrEqual", [diff, imp.ints(lo, name + "_lower")], name=name + "_below"))
        if hi >= 0:
            conds.append(imp.emit1("GreaterOrEqual", [diff, imp.ints(-hi, name + "_upper")], name=name + "_above"))
        mask = conds[0] if len(conds) == 1 else imp.emit1("And", conds, name=name + "_mask")
    if tfop.inputs[0].dtype.is_bool:  # (onnxruntime has no bool Where)
        return [Entry(imp.emit1("And", [mask, imp.plain(x)], name=name))]
    return [Entry(imp.emit1("Where", [mask, imp.plain(x), zero], name=name))]


@handlers.register("Any", "All")
def _any_all(imp, tfop):
    """Any / All over bool -> ReduceMax / ReduceMin over the values as int32."""
    axes, rank = _reduce_axes(imp, tfop)
    keep = int(bool(tfop.get_attr("keep_dims")))
    n = tfop.name
    as_int = imp.emit1("Cast", [imp.plain(tfop.inputs[0])], {"to": "int32"}, name=n + "_int")
    red = imp.emit1("ReduceMax" if tfop.type == "Any" else "ReduceMin", [as_int, imp.ints(axes, n + "_axes")],
                    {"keepdims": keep}, name=n + "_reduce")
    return [Entry(imp.emit1("Cast", [red], {"to": "bool"}, name=n))]


@handlers.register("Rint")
def _rint(imp, tfop):
    e = imp.entry(tfop.inputs[0])  # both round half to even
    return [Entry(imp.emit1("Round", [e.value], name=tfop.name), e.nchw)]


@handlers.register("DivNoNan")
def _div_no_nan(imp, tfop):
    if not tfop.inputs[0].dtype.is_floating:
        return None
    vals, nchw = _operands(imp, list(tfop.inputs))
    n = tfop.name
    zero = imp.init(np.array(0, vals[0].dtype), n + "_zero")
    q = imp.emit1("Div", vals, name=n + "_div")
    return [Entry(imp.emit1("Where", [imp.emit1("Equal", [vals[1], zero], name=n + "_is_zero"), zero, q], name=n),
                  nchw)]


@handlers.register("Slice")
def _slice(imp, tfop):
    """tf.slice(x, begin, size): size -1 runs to the end."""
    x, b, s = tfop.inputs
    begin = [int(v) for v in np.asarray(imp.need_const(b, "non-constant begin")).reshape(-1)]
    size = [int(v) for v in np.asarray(imp.need_const(s, "non-constant size")).reshape(-1)]
    ends = [INT_MAX if sz == -1 else st + sz for st, sz in zip(begin, size)]
    n = tfop.name
    e = imp.entry(x)
    if e.nchw and len(begin) == 4:
        perm = list(TO_NCHW)
        return [Entry(imp.emit1("Slice", [e.value, imp.ints([begin[p] for p in perm], n + "_starts"),
                                          imp.ints([ends[p] for p in perm], n + "_ends")], name=n), True)]
    return [Entry(imp.emit1("Slice", [imp.plain(x), imp.ints(begin, n + "_starts"), imp.ints(ends, n + "_ends")],
                            name=n))]


@handlers.register("LRN")
def _lrn(imp, tfop):
    """TF sums squares over depth_radius on each side and scales by alpha; ONNX averages over size."""
    x = tfop.inputs[0]
    if imp.rank(x) != 4:
        return None
    size = 2 * int(tfop.get_attr("depth_radius")) + 1
    attrs = {"size": size, "alpha": float(tfop.get_attr("alpha")) * size, "beta": float(tfop.get_attr("beta")),
             "bias": float(tfop.get_attr("bias"))}
    return [Entry(imp.emit1("LRN", [imp.nchw(x)], attrs, name=tfop.name), True)]


@handlers.register("OneHot")
def _one_hot(imp, tfop):
    """OneHot -> Where(indices == range(depth), on, off) with the new axis where TF puts it."""
    idx, depth_t, on, off = tfop.inputs
    depth = imp.const(depth_t)
    rank = imp.rank(idx)
    if depth is None or rank is None:
        return None
    depth = int(depth)
    axis = tfop.get_attr("axis")
    axis = rank if axis == -1 else axis
    n = tfop.name
    positions = np.arange(depth, dtype=np.int64).reshape([depth] + [1] * (rank - axis))
    iv = imp.plain(idx)
    if iv.dtype != "int64":
        iv = imp.emit1("Cast", [iv], {"to": "int64"}, name=n + "_indices")
    iv = imp.emit1("Unsqueeze", [iv, imp.ints([axis], n + "_axes")], name=n + "_unsqueeze")
    hit = imp.emit1("Equal", [iv, imp.init(positions, n + "_positions")], name=n + "_equal")
    return [Entry(imp.emit1("Where", [hit, imp.plain(on), imp.plain(off)], name=n))]
