"""The TF neural-network ops: convolutions (depthwise, transposed, dilated through BatchToSpaceND), pools,
fused batch norm, LRN, MatMul / BatchMatMul / Einsum, reductions (Any / All too), softmax and resizing.
Registered in the importer's table (`importer.handlers`)."""
from __future__ import annotations

import numpy as np

from aiacc.core.ops import get_schema
from aiacc.core.translate import Untranslatable
from aiacc.errors import UnsupportedError
from aiacc.plugins.tf._tf import same_pads, tf, tf_shape
from aiacc.plugins.tf.importer import NHWC_AXIS_TO_NCHW, TO_NCHW, Entry, handlers
from aiacc.plugins.tf.import_ops.common import attr


# ------------------------------------------------------------------------------------------ convolution
def _spatial(tfop, key, fmt):
    v = list(tfop.get_attr(key))
    return v[1:3] if fmt == "NHWC" else v[2:4]


def _padding_attrs(imp, tfop, x, kernel, strides, dilations, fmt):
    """ONNX pads / auto_pad for TF's padding attribute."""
    padding = attr(tfop, "padding")
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
    fmt = attr(tfop, "data_format", "NHWC")
    wc = imp.const(w)
    if wc is None and tfop.type == "Conv2D" and imp.training and _static4(imp, w):
        return _conv_variable_filter(imp, tfop, x, w, fmt)
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


def _static4(imp, t) -> bool:
    shape = imp.static_shape(t)
    return shape is not None and len(shape) == 4 and all(isinstance(d, int) for d in shape)


def _conv_variable_filter(imp, tfop, x, w, fmt):
    """Training: the filter is a variable read (an IR input), transposed HWIO -> OIHW by an IR Transpose so
    gradients reach the variable."""
    kh, kw, cin_w, _ = imp.static_shape(w)
    strides, dilations = _spatial(tfop, "strides", fmt), _spatial(tfop, "dilations", fmt)
    xv = _layout_in(imp, x, fmt)
    cin = (imp.static_shape(x) or [None] * 4)[3 if fmt == "NHWC" else 1]
    group = cin // cin_w if isinstance(cin, int) and cin != cin_w else 1
    attrs = {"kernel_shape": [kh, kw], "strides": strides, "dilations": dilations, "group": group}
    attrs.update(_padding_attrs(imp, tfop, x, [kh, kw], strides, dilations, fmt))
    wv = imp.transpose(imp.plain(w), (3, 2, 0, 1))
    return [Entry(imp.emit1("Conv", [xv, wv], attrs, name=tfop.name), fmt == "NHWC")]


@handlers.register("MaxPool", "AvgPool")
def _pool(imp, tfop):
    (x,) = tfop.inputs[:1]
    fmt = attr(tfop, "data_format", "NHWC")
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
    fmt = attr(tfop, "data_format", "NHWC")
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
    eq = attr(tfop, "equation").replace(" ", "")
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
def reduce_axes(imp, tfop):
    """(sorted non-negative axes, rank) of a TF reduction: its constant axes input (Untranslatable otherwise)."""
    axes = imp.need_const(tfop.inputs[1], "non-constant axes")
    rank = imp.rank(tfop.inputs[0])
    if rank is None:
        raise Untranslatable("unknown rank")
    return sorted({int(a) % rank for a in np.asarray(axes).reshape(-1)}), rank


_REDUCE = {"Mean": "ReduceMean", "Sum": "ReduceSum", "Max": "ReduceMax", "Min": "ReduceMin", "Prod": "ReduceProd"}


@handlers.register(*_REDUCE)
def _reduce(imp, tfop):
    axes, rank = reduce_axes(imp, tfop)
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


# ------------------------------------------------------------------------------------------ transposed conv
@handlers.register("Conv2DBackpropInput")
def _conv_transpose(imp, tfop):
    """Conv2DBackpropInput (Keras Conv2DTranspose) -> ConvTranspose with the pads TF derives from the output
    size it is given."""
    sizes_t, w, dy = tfop.inputs
    fmt = attr(tfop, "data_format", "NHWC")
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
    padding = attr(tfop, "padding")
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
    if block != block2 or attr(conv, "data_format", "NHWC") != "NHWC" or attr(conv, "padding") != "VALID" or \
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


# ------------------------------------------------------------------------------------------ more nn
@handlers.register("Any", "All")
def _any_all(imp, tfop):
    """Any / All over bool -> ReduceMax / ReduceMin over the values as int32."""
    axes, rank = reduce_axes(imp, tfop)
    keep = int(bool(tfop.get_attr("keep_dims")))
    n = tfop.name
    as_int = imp.emit1("Cast", [imp.plain(tfop.inputs[0])], {"to": "int32"}, name=n + "_int")
    red = imp.emit1("ReduceMax" if tfop.type == "Any" else "ReduceMin", [as_int, imp.ints(axes, n + "_axes")],
                    {"keepdims": keep}, name=n + "_reduce")
    return [Entry(imp.emit1("Cast", [red], {"to": "bool"}, name=n))]


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
