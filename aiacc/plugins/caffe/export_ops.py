"""The Caffe exporter's op table: one lowering per IR op (registered in exporter.LAYERS by op name), each
adding the Caffe layer(s) that compute the node through the Exporter (`ex`): convolution, pooling, inner
product, activations, normalization and per-channel arithmetic (Scale, Bias, Power, Eltwise), shapes.
The look-ahead patterns of the module docstring of aiacc.plugins.caffe.exporter live here.
"""
from __future__ import annotations

import numpy as np

from aiacc.core.ir import Node, Value
from aiacc.core.ops.nn import window_params
from aiacc.core.ops.shape_utils import conv_output_size
from aiacc.core.passes.utils import const_value as _const  # initializer or Constant node data
from aiacc.plugins.caffe.exporter import LAYERS, inner_product_weights
from aiacc.plugins.caffe.proto import array_to_blob
from aiacc.plugins.caffe.schema import pb


def caffe_pool_size(size: int, kernel: int, stride: int, pad: int, ceil: bool = True) -> int:
    """Caffe's pooled size: rounded up (by default), minus a last window that would start in the padding."""
    span = size + 2 * pad - kernel
    out = (-(-span // stride) if ceil else span // stride) + 1
    if pad and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _static(v: Value) -> list[int] | None:
    s = v.shape
    if s is None or not all(isinstance(d, int) for d in s):
        return None
    return list(s)


def _set_dims(p, field: str, values: list[int], two_d: bool, h: str | None = None, w: str | None = None,
              default: int | None = None, repeated: bool = True) -> None:
    """Write kernel/pad/stride/dilation the way Caffe files usually do: one value when all are equal."""
    if default is not None and all(v == default for v in values):
        return
    if len(set(values)) == 1:
        if repeated:
            getattr(p, field).append(values[0])
        else:
            setattr(p, field, values[0])
    elif two_d and h is not None:
        setattr(p, h, values[0])
        setattr(p, w, values[1])
    elif repeated:
        getattr(p, field).extend(values)
    else:
        raise ValueError(f"{field} differs per axis")


# convolution ----------------------------------------------------------------------------------
def _conv_param(ex, node: Node, layer: pb.LayerParameter, w: np.ndarray, num_output: int) -> None:
    x = node.inputs[0]
    kernel = list(node.attr("kernel_shape") or w.shape[2:])
    n = len(kernel)
    spatial = (x.shape or [None] * (n + 2))[2:]
    if node.op == "ConvTranspose":
        if node.attr("output_shape") is not None or any(node.attr("output_padding") or []) \
                or (node.attr("auto_pad") or "NOTSET") != "NOTSET":
            raise ex.unsupported(node, "output_shape, output_padding and auto_pad have no Caffe form")
        strides = list(node.attr("strides") or [1] * n)
        dilations = list(node.attr("dilations") or [1] * n)
        pads = list(node.attr("pads") or [0] * (2 * n))
    else:
        try:
            strides, dilations, pads = window_params(spatial, kernel, node.attrs)
        except ValueError as e:
            raise ex.unsupported(node, str(e)) from None
        if pads is None:
            raise ex.unsupported(node, "auto_pad needs a static input shape")
    if pads[:n] != pads[n:]:
        raise ex.unsupported(node, f"asymmetric pads {pads}")
    p = layer.convolution_param
    p.num_output = num_output
    two_d = n == 2
    _set_dims(p, "kernel_size", kernel, two_d, "kernel_h", "kernel_w")
    _set_dims(p, "pad", pads[:n], two_d, "pad_h", "pad_w", default=0)
    _set_dims(p, "stride", strides, two_d, "stride_h", "stride_w", default=1)
    _set_dims(p, "dilation", dilations, False, default=1)
    if node.attr("group", 1) != 1:
        p.group = int(node.attr("group"))


@LAYERS.register("Conv")
def _op_Conv(ex, node: Node) -> None:
    x, w, b = (list(node.inputs) + [None])[:3]
    wc, bc = _const(w), _const(b)
    if wc is None or (b is not None and bc is None):
        raise ex.unsupported(node, "weights and bias must be constants")
    layer = ex.add_layer("Convolution", node, [x], node.outputs)
    _conv_param(ex, node, layer, wc, int(wc.shape[0]))
    layer.convolution_param.bias_term = bc is not None
    array_to_blob(wc, layer.blobs.add())
    if bc is not None:
        array_to_blob(bc, layer.blobs.add())


@LAYERS.register("ConvTranspose")
def _op_ConvTranspose(ex, node: Node) -> None:
    x, w, b = (list(node.inputs) + [None])[:3]
    wc, bc = _const(w), _const(b)
    if wc is None or (b is not None and bc is None):
        raise ex.unsupported(node, "weights and bias must be constants")
    layer = ex.add_layer("Deconvolution", node, [x], node.outputs)
    _conv_param(ex, node, layer, wc, int(wc.shape[1]) * int(node.attr("group", 1)))
    layer.convolution_param.bias_term = bc is not None
    array_to_blob(wc, layer.blobs.add())
    if bc is not None:
        array_to_blob(bc, layer.blobs.add())


# pooling --------------------------------------------------------------------------------------
def _pool(ex, node: Node, method) -> None:
    if len(node.outputs) > 1 and node.outputs[1].uses:
        raise ex.unsupported(node, "the argmax indices output")
    x = node.inputs[0]
    shape = _static(x)
    kernel = list(node.attr("kernel_shape"))
    if len(kernel) != 2 or (x.shape is not None and len(x.shape) != 4):
        raise ex.unsupported(node, "Caffe pools 4-d inputs over 2 axes")
    ceil = bool(node.attr("ceil_mode"))
    is_ave = method == pb.PoolingParameter.AVE
    if shape is None:
        # unknown sizes (after an opaque layer): only the form the importer writes is known to match
        if (node.attr("auto_pad") or "NOTSET") != "NOTSET":
            raise ex.unsupported(node, "auto_pad on an input of unknown size")
        strides = list(node.attr("strides") or [1, 1])
        dilations = list(node.attr("dilations") or [1, 1])
        pads = list(node.attr("pads") or [0] * 4)
        if pads[:2] != pads[2:] or (is_ave and any(pads) and not node.attr("count_include_pad")):
            raise ex.unsupported(node, f"pads {pads} on an input of unknown size")
        round_mode = pb.PoolingParameter.CEIL if ceil else pb.PoolingParameter.FLOOR
    else:
        strides, dilations, pads = window_params(shape[2:], kernel, node.attrs)
        want = [conv_output_size(shape[2 + i], kernel[i], strides[i], pads[i], pads[2 + i], 1, ceil)
                for i in range(2)]
        round_mode = pb.PoolingParameter.CEIL
        got = [caffe_pool_size(shape[2 + i], kernel[i], strides[i], pads[i]) for i in range(2)]
        if got != want:
            floor = [caffe_pool_size(shape[2 + i], kernel[i], strides[i], pads[i], ceil=False) for i in range(2)]
            if floor != want:
                raise ex.unsupported(node, f"pads {pads} give {want} outputs, Caffe's symmetric padding {got}")
            round_mode = pb.PoolingParameter.FLOOR
        if is_ave:
            if pads[:2] != pads[2:]:
                raise ex.unsupported(node, f"average pooling with asymmetric pads {pads}")
            if any(pads) and not node.attr("count_include_pad"):
                raise ex.unsupported(node, "Caffe's average pooling counts the padding (count_include_pad=0)")
    if any(d != 1 for d in dilations):
        raise ex.unsupported(node, "dilated pooling")
    begin = pads[:2]
    layer = ex.add_layer("Pooling", node, [x], node.outputs[:1])
    p = layer.pooling_param
    p.pool = method
    if kernel[0] == kernel[1]:
        p.kernel_size = kernel[0]
    else:
        p.kernel_h, p.kernel_w = kernel
    if begin[0] == begin[1]:
        if begin[0]:
            p.pad = begin[0]
    else:
        p.pad_h, p.pad_w = begin
    if strides[0] == strides[1]:
        if strides[0] != 1:
            p.stride = strides[0]
    else:
        p.stride_h, p.stride_w = strides
    if round_mode != pb.PoolingParameter.CEIL:
        if ex.g.meta.get("caffe_ceil_mode_field"):
            p.ceil_mode = False  # the source net's spelling (the forks' and OpenCV's)
        else:
            p.round_mode = round_mode  # BVLC Caffe reads it; OpenCV's schema does not know this field


@LAYERS.register("MaxPool")
def _op_MaxPool(ex, node: Node) -> None:
    _pool(ex, node, pb.PoolingParameter.MAX)


@LAYERS.register("AveragePool")
def _op_AveragePool(ex, node: Node) -> None:
    _pool(ex, node, pb.PoolingParameter.AVE)


def _global_pool(ex, node: Node, method) -> None:
    if _static(node.inputs[0]) is None or len(node.inputs[0].shape) != 4:
        raise ex.unsupported(node, "Caffe pools 4-d inputs")
    layer = ex.add_layer("Pooling", node, [node.inputs[0]], node.outputs)
    layer.pooling_param.pool = method
    layer.pooling_param.global_pooling = True


@LAYERS.register("GlobalMaxPool")
def _op_GlobalMaxPool(ex, node: Node) -> None:
    _global_pool(ex, node, pb.PoolingParameter.MAX)


@LAYERS.register("GlobalAveragePool")
def _op_GlobalAveragePool(ex, node: Node) -> None:
    _global_pool(ex, node, pb.PoolingParameter.AVE)


# inner product --------------------------------------------------------------------------------
def _ip(ex, node: Node) -> None:
    found = inner_product_weights(node)
    if found is None:
        raise ex.unsupported(node, "InnerProduct needs constant weights (and bias), alpha=beta=1, "
                                     "no transA, a 2-d input")
    w, b = found
    layer = ex.add_layer("InnerProduct", node, [node.inputs[0]], node.outputs)
    p = layer.inner_product_param
    p.num_output = int(w.shape[0])
    p.bias_term = b is not None
    array_to_blob(w, layer.blobs.add())
    if b is not None:
        array_to_blob(b, layer.blobs.add())


LAYERS.add("Gemm", _ip)
LAYERS.add("MatMul", _ip)


# activations ----------------------------------------------------------------------------------
@LAYERS.register("Relu")
def _op_Relu(ex, node: Node) -> None:
    ex.add_layer("ReLU", node, [node.inputs[0]], node.outputs, inplace=True)


@LAYERS.register("LeakyRelu")
def _op_LeakyRelu(ex, node: Node) -> None:
    layer = ex.add_layer("ReLU", node, [node.inputs[0]], node.outputs, inplace=True)
    layer.relu_param.negative_slope = float(node.attr("alpha"))


@LAYERS.register("Sigmoid")
def _op_Sigmoid(ex, node: Node) -> None:
    ex.add_layer("Sigmoid", node, [node.inputs[0]], node.outputs)


@LAYERS.register("Tanh")
def _op_Tanh(ex, node: Node) -> None:
    ex.add_layer("TanH", node, [node.inputs[0]], node.outputs)


@LAYERS.register("Elu")
def _op_Elu(ex, node: Node) -> None:
    layer = ex.add_layer("ELU", node, [node.inputs[0]], node.outputs)
    if node.attr("alpha") != 1.0:
        layer.elu_param.alpha = float(node.attr("alpha"))


@LAYERS.register("PRelu")
def _op_PRelu(ex, node: Node) -> None:
    x, slope = node.inputs
    s = _const(slope)
    shape = _static(x)
    if s is None or shape is None:
        raise ex.unsupported(node, "PReLU needs a constant slope and a static input shape")
    if s.size == 1:
        blob, shared = s.reshape(1), True
    else:
        full = (1,) * (len(shape) - s.ndim) + s.shape
        if len(shape) < 2 or full[1] != shape[1] or any(d != 1 for i, d in enumerate(full) if i != 1):
            raise ex.unsupported(node, f"slope of shape {list(s.shape)} is not per channel")
        blob, shared = s.reshape(-1), False
    layer = ex.add_layer("PReLU", node, [x], node.outputs)
    if shared:
        layer.prelu_param.channel_shared = True
    array_to_blob(blob, layer.blobs.add())


@LAYERS.register("Softmax")
def _op_Softmax(ex, node: Node) -> None:
    layer = ex.add_layer("Softmax", node, [node.inputs[0]], node.outputs)
    axis = int(node.attr("axis"))
    if axis != 1:
        layer.softmax_param.axis = axis


@LAYERS.register("Dropout")
def _op_Dropout(ex, node: Node) -> None:
    if len(node.outputs) > 1 and node.outputs[1].uses:
        raise ex.unsupported(node, "the dropout mask output")
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        t = _const(node.inputs[2])
        if t is None or bool(t):
            raise ex.unsupported(node, "training-mode dropout")
    ratio = _const(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    layer = ex.add_layer("Dropout", node, [node.inputs[0]], node.outputs[:1], inplace=True)
    if ratio is not None and float(ratio) != 0.5:
        layer.dropout_param.dropout_ratio = float(ratio)


@LAYERS.register("Identity")
def _op_Identity(ex, node: Node) -> None:
    ex.bind(node.output, ex.blob_of(node.inputs[0], node))
    ex.done.add(id(node))


@LAYERS.register("LRN")
def _op_LRN(ex, node: Node) -> None:
    layer = ex.add_layer("LRN", node, [node.inputs[0]], node.outputs)
    p = layer.lrn_param
    p.local_size = int(node.attr("size"))
    p.alpha = float(node.attr("alpha"))
    p.beta = float(node.attr("beta"))
    p.k = float(node.attr("bias"))


# normalization and per-channel arithmetic -----------------------------------------------------
@LAYERS.register("BatchNormalization")
def _op_BatchNormalization(ex, node: Node) -> None:
    if node.attr("training_mode") or any(v.uses or v.is_graph_output for v in node.outputs[1:]):
        raise ex.unsupported(node, "training-mode batch normalization")
    x = node.inputs[0]
    scale, bias, mean, var = (_const(v) for v in node.inputs[1:5])
    if any(a is None for a in (scale, bias, mean, var)):
        raise ex.unsupported(node, "scale, bias, mean and variance must be constants")
    plain = bool(np.all(scale == 1) and np.all(bias == 0))
    out = node.outputs[0]
    bn = ex.add_layer("BatchNorm", node, [x], [out], inplace=True)
    if node.attr("epsilon") != 1e-5:
        bn.batch_norm_param.eps = float(node.attr("epsilon"))
    for a in (mean, var, np.ones(1, np.float32)):
        array_to_blob(a, bn.blobs.add())
    if not plain:
        layer = ex.net.layer.add()
        layer.name = _unique(ex, f"{node.name}/scale")
        layer.type = "Scale"
        layer.bottom.append(bn.top[0])
        layer.top.append(bn.top[0])
        layer.scale_param.bias_term = True
        array_to_blob(scale, layer.blobs.add())
        array_to_blob(bias, layer.blobs.add())


def _unique(ex, base: str) -> str:
    name, k = base, 1
    while name in ex.layer_names:
        name, k = f"{base}_{k}", k + 1
    ex.layer_names.add(name)
    return name


def _param_layout(x_shape: list[int], c: np.ndarray):
    """(axis, blob array) for a constant that broadcasts against x like a Caffe Scale/Bias parameter
    (its non-1 dims one contiguous run matching x's), ("scalar", value) for a scalar, else None."""
    if c.size == 1:
        return "scalar", float(c.reshape(-1)[0])
    r = len(x_shape)
    if c.ndim > r:
        return None
    full = [1] * (r - c.ndim) + list(c.shape)
    idx = [i for i, d in enumerate(full) if d != 1]
    a, e = idx[0], idx[-1]
    if any(full[i] != x_shape[i] for i in range(a, e + 1)):
        return None
    return a, c.reshape(full[a:e + 1])


def _scalar_operand(ex, node: Node):
    """(dynamic input, scalar value) of a binary node with one scalar constant operand, else None."""
    if node.domain != "" or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    ca, cb = _const(a), _const(b)
    if cb is not None and ca is None and cb.size == 1:
        return a, float(cb.reshape(-1)[0])
    if node.op in ("Mul", "Add") and ca is not None and cb is None and ca.size == 1:
        return b, float(ca.reshape(-1)[0])
    return None


def _power_chain(ex, node: Node) -> None:
    """Mul/Add/Sub/Div/Pow by scalars, in the order scale -> shift -> power, as one Power layer."""
    stage = {"Mul": 0, "Div": 0, "Add": 1, "Sub": 1, "Pow": 2}
    scale, shift, power = 1.0, 0.0, 1.0
    x = _scalar_operand(ex, node)[0]
    cur, last = node, -1
    chain = []
    while True:
        operand = _scalar_operand(ex, cur) if cur.op in stage else None
        if operand is None or stage[cur.op] <= last or (chain and operand[0] is not chain[-1].output):
            break
        value = operand[1]
        if cur.op == "Mul":
            scale = value
        elif cur.op == "Div":
            scale = 1.0 / value
        elif cur.op == "Add":
            shift = value
        elif cur.op == "Sub":
            shift = -value
        else:
            power = value
        chain.append(cur)
        last = stage[cur.op]
        nxt = ex.single_use(cur.output)
        if nxt is None:
            break
        cur = nxt
    end = chain[-1]
    layer = ex.add_layer("Power", node, [x], end.outputs)
    for n in chain:
        ex.done.add(id(n))
    p = layer.power_param
    if power != 1.0:
        p.power = power
    if scale != 1.0:
        p.scale = scale
    if shift != 0.0:
        p.shift = shift


def _binary_const(ex, node: Node) -> bool:
    """Mul/Add/Sub/Div with one constant operand as Scale/Bias/Power; False when no constant."""
    a, b = node.inputs
    ca, cb = _const(a), _const(b)
    if ca is None and cb is None:
        return False
    if ca is not None and cb is not None:
        raise ex.unsupported(node, "both operands are constants (fold them first)")
    if ca is not None and node.op in ("Sub", "Div"):
        raise ex.unsupported(node, "a constant divided by or minus a tensor")
    x, c = (b, ca) if ca is not None else (a, cb)
    shape = _static(x)
    if shape is None:
        raise ex.unsupported(node, "needs a static input shape")
    if c.size == 1:
        _power_chain(ex, node)
        return True
    if node.op == "Sub":
        c = -c
    if node.op == "Div":
        c = (1.0 / c.astype(np.float64)).astype(np.float32)
    layout = _param_layout(shape, c)
    out_shape = _static(node.output)
    if layout is None or out_shape != shape:
        raise ex.unsupported(node, f"constant of shape {list(c.shape)} does not broadcast per Caffe's "
                                     f"Scale/Bias rules against {shape}")
    axis, blob = layout
    is_scale = node.op in ("Mul", "Div")
    bias_node, bias_blob = None, None
    if is_scale:
        nxt = ex.single_use(node.output)
        if nxt is not None and nxt.op in ("Add", "Sub") and nxt.domain == "":
            other = nxt.inputs[1] if nxt.inputs[0] is node.output else nxt.inputs[0]
            oc = _const(other)
            if oc is not None and not (nxt.op == "Sub" and other is nxt.inputs[0]):
                oc = -oc if nxt.op == "Sub" else oc
                full = np.broadcast_to(oc, shape) if oc.size == 1 else oc
                lay = _param_layout(shape, np.asarray(full)) if oc.size != 1 else (axis, np.full(
                    blob.shape, float(oc.reshape(-1)[0]), np.float32))
                if lay is not None and lay[0] == axis and lay[1].shape == blob.shape:
                    bias_node, bias_blob = nxt, lay[1]
    if not is_scale:
        # a lone bias: Scale with unit scale and bias_term, which OpenCV dnn runs (it has no Bias layer)
        bias_blob, blob = blob, np.ones(blob.shape, np.float32)
        is_scale = True
    tops = bias_node.outputs if bias_node is not None else node.outputs
    layer = ex.add_layer("Scale", node, [x], tops, inplace=True)
    if bias_node is not None:
        ex.done.add(id(bias_node))
    p = layer.scale_param
    if axis != 1:
        p.axis = axis
    if blob.ndim != 1:
        p.num_axes = blob.ndim
    array_to_blob(blob, layer.blobs.add())
    if bias_blob is not None:
        layer.scale_param.bias_term = True
        array_to_blob(bias_blob, layer.blobs.add())
    return True


def _coeff_of(ex, v: Value, sum_node: Node):
    """(v's source, coefficient) when v is a scalar Mul read only by `sum_node`, else (v, None)."""
    p = v.producer
    if p is None or p.op != "Mul" or ex.single_use(v) is not sum_node or id(p) in ex.done:
        return v, None
    found = _scalar_operand(ex, p)
    if found is None or found[0].shape != v.shape:
        return v, None
    return found[0], found[1]


def _is_eltwise_sum(ex, node: Node) -> bool:
    if node.domain != "" or node.op not in ("Add", "Sum") or len(node.inputs) < 2:
        return False
    shapes = [_static(v) for v in node.inputs]
    return all(_const(v) is None for v in node.inputs) and shapes[0] is not None and \
        all(s == shapes[0] for s in shapes)


def _eltwise(ex, node: Node, operation) -> None:
    xs = list(node.inputs)
    coeffs = None
    if operation == pb.EltwiseParameter.SUM:
        found = [_coeff_of(ex, v, node) for v in xs]
        if any(c is not None for _, c in found):
            for v, (src, c) in zip(xs, found):
                if c is not None:
                    ex.done.add(id(v.producer))
            xs = [src for src, _ in found]
            coeffs = [1.0 if c is None else c for _, c in found]
    layer = ex.add_layer("Eltwise", node, xs, node.outputs)
    if operation != pb.EltwiseParameter.SUM:
        layer.eltwise_param.operation = operation
    if coeffs:
        layer.eltwise_param.coeff.extend(coeffs)


def _broadcast_dynamic(ex, node: Node, kind: str) -> None:
    """x * y / x + y with y broadcasting like a Caffe parameter: a 2-bottom Scale / Bias (after a
    Reshape of y to the dims it covers)."""
    a, b = node.inputs
    sa, sb = _static(a), _static(b)
    out = _static(node.output)
    if sa is None or sb is None:
        raise ex.unsupported(node, "needs static shapes")
    x, y, sy = (a, b, sb) if sa == out else (b, a, sa) if sb == out else (None, None, None)
    if x is None or len(sy) > len(out):
        raise ex.unsupported(node, "neither operand has the output's shape")
    full = [1] * (len(out) - len(sy)) + sy
    idx = [i for i, d in enumerate(full) if d != 1] or [0]
    axis, end = idx[0], idx[-1]
    covered = out[axis:end + 1]
    if full[axis:end + 1] != covered:
        raise ex.unsupported(node, f"operand of shape {sy} does not broadcast per Caffe's {kind} rules")
    y_blob = ex.blob_of(y, node)
    if sy != covered:
        rs = ex.net.layer.add()
        rs.name = _unique(ex, f"{node.name}/reshape")
        rs.type = "Reshape"
        rs.bottom.append(y_blob)
        y_blob = f"{y.name}/{node.name}/reshaped"
        rs.top.append(y_blob)
        rs.reshape_param.shape.dim.extend(covered)
    layer = ex.add_layer(kind, node, [x], node.outputs)
    layer.bottom.append(y_blob)
    p = layer.scale_param if kind == "Scale" else layer.bias_param
    if axis != 1:
        p.axis = axis


@LAYERS.register("Mul")
def _op_Mul(ex, node: Node) -> None:
    found = _scalar_operand(ex, node)
    if found is not None:
        user = ex.single_use(node.output)
        if user is not None and _is_eltwise_sum(ex, user) and found[0].shape == node.output.shape:
            return  # lowered later as that Eltwise SUM's coefficient
    if _binary_const(ex, node):
        return
    a, b = node.inputs
    if _static(a) is not None and _static(a) == _static(b):
        return _eltwise(ex, node, pb.EltwiseParameter.PROD)
    _broadcast_dynamic(ex, node, "Scale")


@LAYERS.register("Add")
def _op_Add(ex, node: Node) -> None:
    if _binary_const(ex, node):
        return
    if _is_eltwise_sum(ex, node):
        return _eltwise(ex, node, pb.EltwiseParameter.SUM)
    _broadcast_dynamic(ex, node, "Bias")


@LAYERS.register("Sum")
def _op_Sum(ex, node: Node) -> None:
    if len(node.inputs) == 1:
        return _op_Identity(ex, node)
    if not _is_eltwise_sum(ex, node):
        raise ex.unsupported(node, "Eltwise SUM needs inputs of one static shape")
    _eltwise(ex, node, pb.EltwiseParameter.SUM)


@LAYERS.register("Max")
def _op_Max(ex, node: Node) -> None:
    shapes = [_static(v) for v in node.inputs]
    if len(node.inputs) == 1:
        return _op_Identity(ex, node)
    if shapes[0] is None or any(s != shapes[0] for s in shapes) or any(_const(v) is not None for v in node.inputs):
        raise ex.unsupported(node, "Eltwise MAX needs tensor inputs of one static shape")
    _eltwise(ex, node, pb.EltwiseParameter.MAX)


@LAYERS.register("Sub")
def _op_Sub(ex, node: Node) -> None:
    if not _binary_const(ex, node):
        raise ex.unsupported(node, "the difference of two tensors (Caffe has no such Eltwise)")


@LAYERS.register("Div")
def _op_Div(ex, node: Node) -> None:
    if not _binary_const(ex, node):
        raise ex.unsupported(node, "the quotient of two tensors")


@LAYERS.register("Pow")
def _op_Pow(ex, node: Node) -> None:
    found = _scalar_operand(ex, node)
    if found is None:
        raise ex.unsupported(node, "Power needs a scalar constant exponent")
    _power_chain(ex, node)


# shapes ---------------------------------------------------------------------------------------
@LAYERS.register("Concat")
def _op_Concat(ex, node: Node) -> None:
    layer = ex.add_layer("Concat", node, list(node.inputs), node.outputs)
    axis = int(node.attr("axis"))
    if axis != 1:
        layer.concat_param.axis = axis


@LAYERS.register("Transpose")
def _op_Transpose(ex, node: Node) -> None:
    """The SSD fork's Permute (OpenCV reads it); a Caffe without that fork has no layer for it."""
    shape = node.inputs[0].shape
    perm = node.attr("perm")
    if perm is None:
        if shape is None:
            raise ex.unsupported(node, "no perm and an input of unknown rank")
        perm = list(range(len(shape)))[::-1]
    layer = ex.add_layer("Permute", node, [node.inputs[0]], node.outputs)
    layer.permute_param.order.extend(int(a) for a in perm)


@LAYERS.register("Split")
def _op_Split(ex, node: Node) -> None:
    x = node.inputs[0]
    shape = _static(x)
    outs = [_static(v) for v in node.outputs]
    if shape is None or any(o is None for o in outs):
        raise ex.unsupported(node, "needs static shapes")
    axis = int(node.attr("axis")) % len(shape)
    sizes = [o[axis] for o in outs]
    layer = ex.add_layer("Slice", node, [x], node.outputs)
    if axis != 1:
        layer.slice_param.axis = axis
    points = np.cumsum(sizes)[:-1].tolist()
    if len(set(sizes)) != 1:
        layer.slice_param.slice_point.extend(int(p) for p in points)


@LAYERS.register("Flatten")
def _op_Flatten(ex, node: Node) -> None:
    if node.attr("axis") == 1:
        ex.add_layer("Flatten", node, [node.inputs[0]], node.outputs)
    else:
        _reshape_static(ex, node)


def _reshape_static(ex, node: Node) -> None:
    out = _static(node.output)
    if out is None:
        raise ex.unsupported(node, "needs a static output shape")
    layer = ex.add_layer("Reshape", node, [node.inputs[0]], node.outputs)
    layer.reshape_param.shape.dim.extend(out)


@LAYERS.register("Reshape")
def _op_Reshape(ex, node: Node) -> None:
    target = _const(node.inputs[1])
    if target is None:
        raise ex.unsupported(node, "a computed target shape")
    if node.attr("allowzero") and 0 in target.tolist():
        return _reshape_static(ex, node)
    layer = ex.add_layer("Reshape", node, [node.inputs[0]], node.outputs)
    layer.reshape_param.shape.dim.extend(int(d) for d in target.reshape(-1))


@LAYERS.register("Constant")
def _op_Constant(ex, node: Node) -> None:
    ex.done.add(id(node))  # read by layers as their weights; any other reader fails in blob_of
