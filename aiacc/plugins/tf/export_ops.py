"""One TensorFlow lowering per IR op (ONNX/NCHW semantics in, NHWC TF ops out where the layout allows), registered
in the exporter's table (`exporter.emitters`, keyed by the qualified op)."""
from __future__ import annotations

import base64

import numpy as np

from aiacc.errors import UnsupportedError
from aiacc.plugins.tf._tf import same_pads, tf
from aiacc.plugins.tf.exporter import NCHW_AXIS_TO_NHWC, TO_NCHW, TO_NHWC, Emitter, const_to_nhwc, emitters
from aiacc.plugins.tf.exporter import BUILT_WHEN_READ

INT_MAX = 2 ** 63 - 1


def _ints(node, key, default):
    v = node.attr(key)
    return list(default) if v is None else [int(x) for x in v]


# ------------------------------------------------------------------------------------------ plumbing
@emitters.register("Identity", "Dropout")
def _identity(ex: Emitter, node):
    t, f = ex.env_entry(node.inputs[0])
    ex.set(node.outputs[0], t, f)
    if len(node.outputs) > 1:  # Dropout's mask: all kept at inference
        ex.set(node.outputs[1], tf().ones_like(ex.std(node.inputs[0]), dtype=tf().bool))


@emitters.register("Constant")
def _constant(ex, node):
    value = ex.const(node.outputs[0])
    if value is None:
        for key in ("value_float", "value_floats", "value_int", "value_ints"):
            if node.attrs.get(key) is not None:
                value = np.asarray(node.attrs[key], np.float32 if "float" in key else np.int64)
    ex.set(node.outputs[0], tf().constant(value))


@emitters.register("Cast")
def _cast(ex, node):
    t, f = ex.env_entry(node.inputs[0])
    ex.set(node.outputs[0], tf().cast(t, tf().as_dtype(node.attr("to"))), f)


@emitters.register("Shape")
def _shape(ex, node):
    s = tf().shape(ex.std(node.inputs[0]), out_type=tf().int64)
    start, end = node.attr("start", 0), node.attr("end")
    if start or end is not None:
        s = s[start:end]
    ex.set(node.outputs[0], s)


# ------------------------------------------------------------------------------------------ elementwise
def _act(fn):
    def emit(ex, node):
        t, f = ex.env_entry(node.inputs[0])
        ex.set(node.outputs[0], fn(node, t), f)

    return emit


def _tf_unary():
    t = tf()
    return {
        "Relu": lambda n, x: t.nn.relu(x),
        "Sigmoid": lambda n, x: t.math.sigmoid(x),
        "Tanh": lambda n, x: t.math.tanh(x),
        "Erf": lambda n, x: t.math.erf(x),
        "Sqrt": lambda n, x: t.math.sqrt(x),
        "Exp": lambda n, x: t.math.exp(x),
        "Log": lambda n, x: t.math.log(x),
        "Neg": lambda n, x: t.math.negative(x),
        "Abs": lambda n, x: t.math.abs(x),
        "Reciprocal": lambda n, x: t.math.reciprocal(x),
        "Floor": lambda n, x: t.math.floor(x),
        "Ceil": lambda n, x: t.math.ceil(x),
        "Round": lambda n, x: t.math.round(x),
        "Sign": lambda n, x: t.math.sign(x),
        "Sin": lambda n, x: t.math.sin(x),
        "Cos": lambda n, x: t.math.cos(x),
        "Not": lambda n, x: t.math.logical_not(x),
        "Softplus": lambda n, x: t.math.softplus(x),
        "Softsign": lambda n, x: t.nn.softsign(x),
        "LeakyRelu": lambda n, x: t.nn.leaky_relu(x, alpha=float(n.attr("alpha"))),
        "Elu": lambda n, x: t.nn.elu(x) if float(n.attr("alpha")) == 1.0 else
        t.where(x > 0, x, float(n.attr("alpha")) * t.math.expm1(x)),
        "Selu": lambda n, x: t.nn.selu(x) if abs(float(n.attr("alpha")) - 1.6732632423543772) < 1e-6 and
        abs(float(n.attr("gamma")) - 1.0507009873554805) < 1e-6 else float(n.attr("gamma")) * t.where(x > 0, x, float(n.attr("alpha")) * t.math.expm1(x)),
        "Gelu": lambda n, x: t.nn.gelu(x, approximate=n.attr("approximate") == "tanh"),
        "HardSigmoid": lambda n, x: t.clip_by_value(float(n.attr("alpha")) * x + float(n.attr("beta")), 0.0, 1.0),
        "HardSwish": lambda n, x: x * t.nn.relu6(x + 3.0) / 6.0,
        "Mish": lambda n, x: x * t.math.tanh(t.math.softplus(x)),
    }


for _name in ("Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Neg", "Abs", "Floor", "Ceil",
              "Round", "Sign", "Sin", "Cos", "Not", "Softplus", "Softsign", "LeakyRelu", "Elu", "Selu", "Gelu",
              "HardSigmoid", "HardSwish", "Mish"):
    emitters.add(_name, _act(lambda n, x, _k=_name: _tf_unary()[_k](n, x)))


@emitters.register("Sqrt")
def _sqrt(ex: Emitter, node):
    """Built when read: a Sqrt read only by Reciprocal (the TF importer's form of Rsqrt) becomes no TF op."""
    x_v = node.inputs[0]

    def make():
        t, f = ex.env_entry(x_v)
        return tf().math.sqrt(t), f
    ex.defer(node.outputs[0], make)


BUILT_WHEN_READ.add("Sqrt")


@emitters.register("Reciprocal")
def _reciprocal(ex: Emitter, node):
    """Reciprocal(Sqrt(x)) -> one Rsqrt (tf.nn.batch_normalization's and Keras' own op: one op and one
    RsqrtGrad in the backward instead of two of each; equal within float rounding)."""
    x_v = node.inputs[0]
    p = x_v.producer
    if p is not None and p.op == "Sqrt" and p.domain == "" and p.inputs[0] is not None:
        t, f = ex.env_entry(p.inputs[0])
        ex.set(node.outputs[0], tf().math.rsqrt(t), f)
        return
    t, f = ex.env_entry(x_v)
    ex.set(node.outputs[0], tf().math.reciprocal(t), f)


@emitters.register("Clip")
def _clip(ex, node):
    t, f = ex.env_entry(node.inputs[0])
    lo = ex.const(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    hi = ex.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
    tfm = tf()
    if lo is not None and hi is not None and float(lo) == 0 and float(hi) == 6:
        y = tfm.nn.relu6(t)
    elif lo is not None and float(lo) == 0 and (len(node.inputs) < 3 or node.inputs[2] is None):
        y = tfm.nn.relu(t)
    else:
        y = t
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            y = tfm.maximum(y, tfm.cast(ex.std(node.inputs[1]), t.dtype))
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            y = tfm.minimum(y, tfm.cast(ex.std(node.inputs[2]), t.dtype))
    ex.set(node.outputs[0], y, f)


def _broadcast_operands(ex: Emitter, node, inputs=None) -> tuple[list, bool]:
    """Operands of a broadcasting op: NHWC when a rank-4 operand is and the others can follow."""
    inputs = [v for v in (inputs if inputs is not None else node.inputs) if v is not None]
    out_rank = ex.rank(node.outputs[0])
    if out_rank == 4 and any(ex.flagged(v) for v in inputs):
        ops, ok = [], True
        for v in inputs:
            c = ex.const(v)
            if ex.flagged(v):
                ops.append(ex.env_entry(v)[0])
            elif c is not None:
                c2 = const_to_nhwc(c)
                if c2 is None:
                    ok = False
                    break
                ops.append(tf().constant(c2))
            elif ex.rank(v) == 4:
                ops.append(ex.nhwc(v))
            else:
                ok = False
                break
        if ok:
            return ops, True
    return [ex.std(v) for v in inputs], False


def _binary(fn_name):
    def emit(ex, node):
        if fn_name == "Sub":
            # built when read: a Sub read only as Mul(d, d) (the TF importer's SquaredDifference) is no TF op
            ex.defer(node.outputs[0], lambda: compute(ex, node))
            return
        if fn_name == "Mul" and node.inputs[0] is node.inputs[1] and _is_sub(node.inputs[0].producer):
            # Mul(a - b, a - b) -> SquaredDifference(a, b), tf.nn.moments' own op: its gradient is one
            # 2 * (a - b) * dy, where Mul's gives dy * d and d * dy summed by an AddN (equal: doubling is exact)
            (a, b), f = _broadcast_operands(ex, node.inputs[0].producer)
            if a.dtype == b.dtype and a.dtype.is_floating:
                ex.set(node.outputs[0], tf().math.squared_difference(a, b), f)
                return
        ex.set(node.outputs[0], *compute(ex, node))

    def compute(ex, node):
        tfm = tf()
        a_v, b_v = node.inputs[0], node.inputs[1]
        ops, f = _broadcast_operands(ex, node)
        if fn_name == "Add" and f:
            # x + per-channel constant is a BiasAdd on NHWC: the shape Grappler fuses into Conv2D
            for x_v, c_v, x_t in ((a_v, b_v, ops[0]), (b_v, a_v, ops[1])):
                c = ex.const(c_v)
                if c is not None and ex.flagged(x_v) and c.dtype.kind == "f":
                    c2 = const_to_nhwc(c)
                    if c2 is not None and c2.ndim == 1 and c2.shape[0] == x_v.shape[1] and x_v.shape[1] != 1:
                        return tfm.nn.bias_add(x_t, tfm.constant(c2)), True
        if fn_name == "Add" and not f:
            # (..., C) + constant (C,): BiasAdd, which Grappler fuses into the MatMul before it; + a (C,)
            # variable (mode="train": a Dense bias): BiasAdd too, Keras' op, whose gradient is one BiasAddGrad
            for x_v, c_v, x_t, c_t in ((a_v, b_v, ops[0], ops[1]), (b_v, a_v, ops[1], ops[0])):
                c = ex.const(c_v)
                s = x_v.shape
                if x_v.const is not None or s is None or len(s) < 2 or node.outputs[0].shape != s:
                    continue
                if c is not None and c.ndim == 1 and c.dtype.kind == "f" and s[-1] == c.shape[0]:
                    return tfm.nn.bias_add(x_t, tfm.constant(c)), False
                if c is None and c_v.shape is not None and len(c_v.shape) == 1 and isinstance(s[-1], int) and \
                        c_v.shape[0] == s[-1] and c_t.dtype == x_t.dtype and x_t.dtype.is_floating:
                    return tfm.nn.bias_add(x_t, c_t), False
        a, b = ops
        if a.dtype != b.dtype and fn_name != "Pow":
            b = tfm.cast(b, a.dtype)
        y = {
            "Add": lambda: tfm.math.add(a, b),
            "Sub": lambda: tfm.math.subtract(a, b),
            "Mul": lambda: tfm.math.multiply(a, b),
            "Div": lambda: tfm.math.truediv(a, b) if a.dtype.is_floating else tfm.math.truncatediv(a, b),
            "Pow": lambda: tfm.math.pow(a, tfm.cast(b, a.dtype)),
            "And": lambda: tfm.math.logical_and(a, b),
            "Or": lambda: tfm.math.logical_or(a, b),
            "Xor": lambda: tfm.math.logical_xor(a, b),
            "Equal": lambda: tfm.math.equal(a, b),
            "Less": lambda: tfm.math.less(a, b),
            "Greater": lambda: tfm.math.greater(a, b),
            "LessOrEqual": lambda: tfm.math.less_equal(a, b),
            "GreaterOrEqual": lambda: tfm.math.greater_equal(a, b),
            "Mod": lambda: tfm.math.truncatemod(a, b) if node.attr("fmod") else tfm.math.floormod(a, b),
        }[fn_name]()
        return y, f

    return emit


def _is_sub(node) -> bool:
    return node is not None and node.op == "Sub" and node.domain == "" and len(node.inputs) == 2 and \
        all(v is not None for v in node.inputs)


for _name in ("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Less", "Greater", "LessOrEqual",
              "GreaterOrEqual", "Mod"):
    emitters.add(_name, _binary(_name))
BUILT_WHEN_READ.add("Sub")  # _binary defers a Sub (read as Mul(d, d): SquaredDifference)


@emitters.register("Max", "Min", "Sum", "Mean")
def _variadic(ex, node):
    tfm = tf()
    ops, f = _broadcast_operands(ex, node)
    fn = {"Max": tfm.math.maximum, "Min": tfm.math.minimum, "Sum": tfm.math.add, "Mean": tfm.math.add}[node.op]
    y = ops[0]
    for o in ops[1:]:
        y = fn(y, o)
    if node.op == "Mean":
        y = y / len(ops)
    ex.set(node.outputs[0], y, f)


@emitters.register("Where")
def _where(ex, node):
    ops, f = _broadcast_operands(ex, node)
    ex.set(node.outputs[0], tf().where(*ops), f)


@emitters.register("PRelu")
def _prelu(ex, node):
    (x, s), f = _broadcast_operands(ex, node)
    tfm = tf()
    ex.set(node.outputs[0], tfm.where(x >= 0, x, x * s), f)


# ------------------------------------------------------------------------------------------ convolution
def _padding(node, x, kernel, strides, dilations):
    """'SAME', 'VALID' or a list of (begin, end) per spatial axis for an ONNX window op."""
    auto = node.attr("auto_pad") or "NOTSET"
    if auto == "SAME_UPPER":
        return "SAME"
    if auto == "VALID":
        return "VALID"
    if auto == "SAME_LOWER":
        raise UnsupportedError(f"node {node.name} ({node.op}): auto_pad SAME_LOWER has no TF equivalent")
    pads = _ints(node, "pads", [0] * (2 * len(kernel)))
    if not any(pads):
        return "VALID"
    sizes = None if x.shape is None else x.shape[2:]
    if sizes is not None and all(isinstance(s, int) for s in sizes) and \
            pads == same_pads(sizes, kernel, strides, dilations):
        return "SAME"
    n = len(kernel)
    return [(pads[i], pads[i + n]) for i in range(n)]


def _conv_weight(ex, node, w_v):
    w = ex.const(w_v)
    if w is None:
        raise UnsupportedError(f"node {node.name} (Conv): the TF exporter needs a constant weight")
    return w


class FilterTensor:
    """A Conv weight that is not a constant (a trained variable in mode="train"): the HWIO tensor TF's
    Conv2D takes, with the IR weight's OIHW shape."""

    def __init__(self, hwio, shape):
        self.hwio, self.shape, self.ndim = hwio, tuple(shape), len(shape)


def _conv_filter(ex, node, w_v):
    """The Conv weight: a numpy constant, or (a tensor: training) a FilterTensor. A weight the importer
    transposed HWIO -> OIHW is read before that Transpose, so no transpose pair reaches TF."""
    w = ex.const(w_v)
    if w is not None:
        return w
    if w_v.shape is None or len(w_v.shape) != 4 or not all(isinstance(d, int) for d in w_v.shape):
        raise UnsupportedError(f"node {node.name} (Conv): a non-constant weight needs a static 4-D shape")
    p = w_v.producer
    if p is not None and p.op == "Transpose" and [int(i) for i in p.attr("perm")] == [3, 2, 0, 1]:
        return FilterTensor(ex.std(p.inputs[0]), w_v.shape)
    return FilterTensor(tf().transpose(ex.std(w_v), (2, 3, 1, 0)), w_v.shape)


def _conv_bias(ex, node, b_v):
    """The Conv bias: None, a numpy constant or (training: a variable) a tensor."""
    if b_v is None:
        return None
    bias = ex.const(b_v)
    return bias if bias is not None else ex.std(b_v)


def conv2d_nhwc(ex: Emitter, node, x_v, w, bias):
    """A 2-D ONNX Conv on the NHWC tensor of x_v: Conv2D / DepthwiseConv2dNative (+ BiasAdd). `w` is the
    OIHW numpy weight or a FilterTensor (then only group 1); `bias` numpy, a tensor or None."""
    tfm = tf()
    if isinstance(w, FilterTensor) and int(node.attr("group") or 1) != 1:
        raise UnsupportedError(f"node {node.name} (Conv): a non-constant weight lowers for group=1 only")
    if w.ndim != 4:
        raise UnsupportedError(f"node {node.name} (Conv): only 2-D convolutions lower to TF, weight is {w.shape}")
    o, i_g, kh, kw = w.shape
    strides = _ints(node, "strides", [1, 1])
    dilations = _ints(node, "dilations", [1, 1])
    group = int(node.attr("group") or 1)
    padding = _padding(node, x_v, [kh, kw], strides, dilations)
    x = ex.nhwc(x_v)
    explicit = []
    if isinstance(padding, list):
        explicit = [0, 0, padding[0][0], padding[0][1], padding[1][0], padding[1][1], 0, 0]
        padding = "EXPLICIT"
    st, dl = [1, strides[0], strides[1], 1], [1, dilations[0], dilations[1], 1]
    if group == 1:
        filt = w.hwio if isinstance(w, FilterTensor) else \
            tfm.constant(np.ascontiguousarray(w.transpose(2, 3, 1, 0)))  # OIHW -> HWIO
        y = tfm.raw_ops.Conv2D(input=x, filter=filt, strides=st, padding=padding, explicit_paddings=explicit,
                               data_format="NHWC", dilations=dl)
    elif i_g == 1 and o % group == 0 and strides[0] == strides[1]:
        mult = o // group
        if padding == "EXPLICIT":
            # TF 2.21 aborts (tensor_format.h CHECK) on DepthwiseConv2dNative with EXPLICIT padding: pad first
            x = tfm.pad(x, [[0, 0], explicit[2:4], explicit[4:6], [0, 0]])
            padding, explicit = "VALID", []
        filt = tfm.constant(np.ascontiguousarray(w.reshape(group, mult, kh, kw).transpose(2, 3, 0, 1)))
        if dilations != [1, 1] and strides == [1, 1]:
            # TF's CPU DepthwiseConv2dNative kernel refuses dilations (without oneDNN); tf.nn's wrapper
            # runs a dilated depthwise conv as space_to_batch + conv + batch_to_space, as Keras does
            y = tfm.nn.depthwise_conv2d(x, filt, st, padding, dilations=dilations, data_format="NHWC")
        else:
            y = tfm.raw_ops.DepthwiseConv2dNative(input=x, filter=filt, strides=st, padding=padding,
                                                  explicit_paddings=explicit, data_format="NHWC", dilations=dl)
    else:  # grouped: one Conv2D per group
        xs = tfm.split(x, group, axis=3)
        ws = np.split(w, group, axis=0)
        y = tfm.concat([tfm.raw_ops.Conv2D(input=xi, filter=tfm.constant(np.ascontiguousarray(wi.transpose(2, 3, 1, 0))),
                                           strides=st, padding=padding, explicit_paddings=explicit,
                                           data_format="NHWC", dilations=dl) for xi, wi in zip(xs, ws)], axis=3)
    if isinstance(bias, np.ndarray):
        y = tfm.nn.bias_add(y, tfm.constant(bias.astype(y.dtype.as_numpy_dtype)))
    elif bias is not None:
        y = tfm.nn.bias_add(y, bias)
    return y


@emitters.register("Conv")
def _conv(ex, node):
    x_v, w_v = node.inputs[0], node.inputs[1]
    b_v = node.inputs[2] if len(node.inputs) > 2 else None
    y = conv2d_nhwc(ex, node, x_v, _conv_filter(ex, node, w_v), _conv_bias(ex, node, b_v))
    ex.set(node.outputs[0], y, True)


def _pool_padding(ex, node, x_v, kernel, strides, pad_value):
    """(NHWC input tensor, TF padding) for an ONNX pool; explicit pads become a tf.pad."""
    tfm = tf()
    if node.attr("ceil_mode"):
        raise UnsupportedError(f"node {node.name} ({node.op}): ceil_mode=1 has no TF equivalent")
    padding = _padding(node, x_v, kernel, strides, _ints(node, "dilations", [1, 1]))
    x = ex.nhwc(x_v)
    if isinstance(padding, list):
        x = tfm.pad(x, [[0, 0], list(padding[0]), list(padding[1]), [0, 0]], constant_values=pad_value)
        padding = "VALID"
    return x, padding


@emitters.register("MaxPool")
def _maxpool(ex, node):
    kernel, strides = _ints(node, "kernel_shape", []), _ints(node, "strides", [1, 1])
    if len(kernel) != 2 or len(node.outputs) > 1:
        raise UnsupportedError(f"node {node.name} (MaxPool): only 2-D pooling without indices lowers to TF")
    x, padding = _pool_padding(ex, node, node.inputs[0], kernel, strides, float("-inf"))
    y = tf().nn.max_pool2d(x, kernel, strides, padding)
    ex.set(node.outputs[0], y, True)


@emitters.register("AveragePool")
def _avgpool(ex, node):
    kernel, strides = _ints(node, "kernel_shape", []), _ints(node, "strides", [1, 1])
    padding = _padding(node, node.inputs[0], kernel, strides, [1, 1])
    if isinstance(padding, list) and not node.attr("count_include_pad"):
        raise UnsupportedError(f"node {node.name} (AveragePool): explicit pads that exclude the padding from the "
                               f"average and are not TF's SAME have no TF equivalent")
    if padding == "SAME" and node.attr("count_include_pad"):
        # TF's SAME averages over the valid window only; counting the zeros needs the padding made explicit
        x_v = node.inputs[0]
        pads = _ints(node, "pads", [0, 0, 0, 0])
        if node.attr("auto_pad") in ("SAME_UPPER",):
            sizes = None if x_v.shape is None else x_v.shape[2:]
            if sizes is None or not all(isinstance(d, int) for d in sizes):
                raise UnsupportedError(f"node {node.name} (AveragePool): SAME padding counted in the average needs "
                                       f"static spatial sizes")
            pads = same_pads(sizes, kernel, strides, [1, 1])
        x = tf().pad(ex.nhwc(x_v), [[0, 0], [pads[0], pads[2]], [pads[1], pads[3]], [0, 0]])
        ex.set(node.outputs[0], tf().nn.avg_pool2d(x, kernel, strides, "VALID"), True)
        return
    x, padding = _pool_padding(ex, node, node.inputs[0], kernel, strides, 0.0)
    ex.set(node.outputs[0], tf().nn.avg_pool2d(x, kernel, strides, padding), True)


@emitters.register("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ex, node):
    tfm = tf()
    x_v = node.inputs[0]
    fn = tfm.reduce_mean if node.op == "GlobalAveragePool" else tfm.reduce_max
    if ex.rank(x_v) == 4:
        ex.set(node.outputs[0], fn(ex.nhwc(x_v), axis=[1, 2], keepdims=True), True)
    else:
        r = ex.rank(x_v)
        ex.set(node.outputs[0], fn(ex.std(x_v), axis=list(range(2, r)), keepdims=True))


@emitters.register("BatchNormalization")
def _batchnorm(ex, node):
    tfm = tf()
    x_v = node.inputs[0]
    params = [ex.const(v) for v in node.inputs[1:5]]
    eps = float(node.attr("epsilon"))
    if ex.rank(x_v) == 4 and all(p is not None for p in params) and x_v.dtype in ("float32", "float16"):
        scale, bias, mean, var = [tfm.constant(p.astype(np.float32)) for p in params]
        y = tfm.raw_ops.FusedBatchNormV3(x=ex.nhwc(x_v), scale=scale, offset=bias, mean=mean, variance=var,
                                         epsilon=eps, data_format="NHWC", is_training=False)[0]
        ex.set(node.outputs[0], y, True)
        return
    x = ex.std(x_v)
    r = ex.rank(x_v)
    shape = [-1] + [1] * (r - 2)
    scale, bias, mean, var = [tfm.reshape(tfm.cast(ex.std(v), x.dtype), shape) for v in node.inputs[1:5]]
    ex.set(node.outputs[0], (x - mean) * (scale * tfm.math.rsqrt(var + eps)) + bias)


@emitters.register("LRN")
def _lrn(ex, node):
    size = int(node.attr("size"))
    if size % 2 == 0:
        raise UnsupportedError(f"node {node.name} (LRN): an even size has no TF equivalent")
    tfm = tf()
    y = tfm.nn.local_response_normalization(ex.nhwc(node.inputs[0]), depth_radius=size // 2,
                                            bias=float(node.attr("bias")), alpha=float(node.attr("alpha")) / size,
                                            beta=float(node.attr("beta")))
    ex.set(node.outputs[0], y, True)


# ------------------------------------------------------------------------------------------ matmul
@emitters.register("MatMul")
def _matmul(ex, node):
    tfm = tf()
    a, b = ex.std(node.inputs[0]), ex.std(node.inputs[1])
    ra, rb = a.shape.rank, b.shape.rank
    if ra == 1 or rb == 1:
        y = tfm.linalg.matvec(a, b) if rb == 1 and ra and ra >= 2 else tfm.tensordot(a, b, axes=[[ra - 1], [0 if rb == 1 else rb - 2]])
    elif ra is not None and rb == 2 and ra > 2:
        # (..., K) @ (K, N): one 2-D MatMul on the flattened rows (what Keras' Dense emits)
        k, n = b.shape
        y2 = tfm.linalg.matmul(tfm.reshape(a, [-1, k]), b)
        middle = a.shape[1:-1].as_list()
        if all(d is not None for d in middle):
            y = tfm.reshape(y2, [-1] + middle + [n])
        else:
            y = tfm.reshape(y2, tfm.concat([tfm.shape(a)[:-1], [n]], axis=0))
            y.set_shape(a.shape[:-1].as_list() + [n])
    else:
        y = tfm.linalg.matmul(a, b)
    ex.set(node.outputs[0], y)


def _alpha_matmul(ex, node):
    """alpha * A' B' of a Gemm-like node (transA/transB applied) and its beta."""
    tfm = tf()
    a, b = ex.std(node.inputs[0]), ex.std(node.inputs[1])
    y = tfm.linalg.matmul(a, b, transpose_a=bool(node.attr("transA")), transpose_b=bool(node.attr("transB")))
    alpha, beta = float(node.attr("alpha")), float(node.attr("beta"))
    if alpha != 1.0:
        y = y * alpha
    return y, beta


@emitters.register("Gemm")
def _gemm(ex, node):
    tfm = tf()
    y, beta = _alpha_matmul(ex, node)
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        c = ex.const(node.inputs[2])
        if c is not None and beta == 1.0 and c.ndim == 1:
            y = tfm.nn.bias_add(y, tfm.constant(c.astype(node.outputs[0].dtype or c.dtype)))
        else:
            y = _gemm_c(ex, node, y, beta)
    ex.set(node.outputs[0], y)


def _gemm_c(ex, node, y, beta):
    """y + beta * C of a Gemm-like node, C not a constant (a trained bias variable in mode="train"): a
    BiasAdd where C is a vector along y's last axis (Keras Dense's own op: its gradient is one BiasAddGrad,
    not Sum + Reshape), no Mul for beta == 1."""
    tfm = tf()
    c_v = node.inputs[2]
    c = ex.std(c_v)
    if beta != 1.0:
        c = beta * c
    if c_v.shape is not None and len(c_v.shape) == 1 and y.shape.rank is not None and y.shape.rank >= 2 and \
            isinstance(c_v.shape[0], int) and y.shape[-1] == c_v.shape[0] and c.dtype == y.dtype:
        return tfm.nn.bias_add(y, c)
    return y + c


# ------------------------------------------------------------------------------------------ reductions
def _axes_input(ex, node, idx=1):
    if len(node.inputs) > idx and node.inputs[idx] is not None:
        c = ex.const(node.inputs[idx])
        if c is None:
            raise UnsupportedError(f"node {node.name} ({node.op}): the TF exporter needs constant axes")
        return [int(a) for a in np.asarray(c).reshape(-1)]
    return None


@emitters.register("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd")
def _reduce(ex, node):
    tfm = tf()
    fn = {"ReduceMean": tfm.reduce_mean, "ReduceSum": tfm.reduce_sum, "ReduceMax": tfm.reduce_max,
          "ReduceMin": tfm.reduce_min, "ReduceProd": tfm.reduce_prod}[node.op]
    x_v = node.inputs[0]
    axes = _axes_input(ex, node)
    keep = bool(node.attr("keepdims"))
    r = ex.rank(x_v)
    if not axes:
        if node.attr("noop_with_empty_axes"):
            t, f = ex.env_entry(x_v)
            ex.set(node.outputs[0], t, f)
            return
        axes = list(range(r)) if r is not None else None
    if ex.flagged(x_v) and keep and r == 4:
        ex.set(node.outputs[0], fn(ex.env_entry(x_v)[0], axis=[NCHW_AXIS_TO_NHWC[a % 4] for a in axes],
                                   keepdims=True), True)
        return
    ex.set(node.outputs[0], fn(ex.std(x_v), axis=axes, keepdims=keep))


@emitters.register("Softmax", "LogSoftmax")
def _softmax(ex, node):
    tfm = tf()
    fn = tfm.nn.softmax if node.op == "Softmax" else tfm.nn.log_softmax
    x_v = node.inputs[0]
    axis = int(node.attr("axis"))
    r = ex.rank(x_v)
    if ex.flagged(x_v) and r == 4:
        ex.set(node.outputs[0], fn(ex.env_entry(x_v)[0], axis=NCHW_AXIS_TO_NHWC[axis % 4]), True)
        return
    ex.set(node.outputs[0], fn(ex.std(x_v), axis=axis))


@emitters.register("LayerNormalization")
def _layernorm(ex, node):
    tfm = tf()
    x = ex.std(node.inputs[0])
    r = x.shape.rank
    axis = int(node.attr("axis")) % r
    axes = list(range(axis, r))
    mean, var = tfm.nn.moments(x, axes=axes, keepdims=True)
    y = (x - mean) * tfm.math.rsqrt(var + float(node.attr("epsilon")))
    y = y * ex.std(node.inputs[1])
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        y = y + ex.std(node.inputs[2])
    ex.set(node.outputs[0], y)


# ------------------------------------------------------------------------------------------ shapes
def _spatial_ones(v) -> bool:
    return v.shape is not None and len(v.shape) == 4 and v.shape[2] == 1 and v.shape[3] == 1


@emitters.register("Reshape")
def _reshape(ex, node):
    tfm = tf()
    x_v, s_v = node.inputs
    target = ex.const(s_v)
    out = node.outputs[0]
    # (N,C,1,1) -> (N,C): the NHWC tensor (N,1,1,C) has the same element order
    x = ex.env_entry(x_v)[0] if ex.flagged(x_v) and _spatial_ones(x_v) else ex.std(x_v)
    if target is None:
        ex.set(out, tfm.reshape(x, ex.std(s_v)))
        return
    target = [int(t) for t in np.asarray(target).reshape(-1)]
    if not node.attr("allowzero") and 0 in target:
        dyn = None
        resolved = []
        for i, t in enumerate(target):
            if t != 0:
                resolved.append(t)
            elif x_v.shape is not None and isinstance(x_v.shape[i], int):
                resolved.append(x_v.shape[i])
            else:
                dyn = tfm.shape(x) if dyn is None else dyn
                resolved.append(dyn[i])
        target = tfm.stack([tfm.cast(t, tfm.int32) for t in resolved]) if dyn is not None else resolved
    ex.set(out, tfm.reshape(x, target))


@emitters.register("Flatten")
def _flatten(ex, node):
    tfm = tf()
    x_v = node.inputs[0]
    axis = int(node.attr("axis"))
    x = ex.env_entry(x_v)[0] if ex.flagged(x_v) and _spatial_ones(x_v) and axis == 1 else ex.std(x_v)
    s = x_v.shape
    r = len(s) if s is not None else x.shape.rank
    axis %= r + 1 if axis < 0 else r + 1
    tail = s[axis:] if s is not None else None
    if tail is not None and all(isinstance(d, int) for d in tail):
        y = tfm.reshape(x, [-1, int(np.prod(tail, dtype=np.int64))]) if axis > 0 else tfm.reshape(x, [1, -1])
    else:
        dyn = tfm.shape(x)
        y = tfm.reshape(x, [tfm.reduce_prod(dyn[:axis]), -1])
    ex.set(node.outputs[0], y)


@emitters.register("Transpose")
def _transpose(ex, node):
    """Built when read (Emitter.defer): a training graph's kernel Transpose (HWIO -> OIHW) that Conv reads
    around (_conv_filter) then leaves no dead TF op behind."""
    ex.defer(node.outputs[0], lambda: _transposed(ex, node))


BUILT_WHEN_READ.add("Transpose")


def _transposed(ex, node):
    tfm = tf()
    x_v = node.inputs[0]
    r = ex.rank(x_v)
    perm = _ints(node, "perm", list(range(r))[::-1] if r else [])
    t, f = ex.env_entry(x_v)
    if f:
        # t is x permuted by TO_NHWC; y = x permuted by perm = t permuted by inv(TO_NHWC) then perm
        perm = [TO_NHWC.index(p) for p in perm]
        f = False
    if tuple(perm) == TO_NCHW and len(perm) == 4:
        return t, True  # only the flag changes: no TF op
    if perm == list(range(len(perm))):
        return t, False
    return tfm.transpose(t, perm), False


@emitters.register("Squeeze")
def _squeeze(ex, node):
    tfm = tf()
    x_v = node.inputs[0]
    axes = _axes_input(ex, node)
    r = ex.rank(x_v)
    if axes is not None and r == 4 and ex.flagged(x_v) and sorted(a % 4 for a in axes) == [2, 3]:
        ex.set(node.outputs[0], tfm.squeeze(ex.env_entry(x_v)[0], axis=[1, 2]))  # (N,1,1,C) -> (N,C)
        return
    ex.set(node.outputs[0], tfm.squeeze(ex.std(x_v), axis=axes))


@emitters.register("Unsqueeze")
def _unsqueeze(ex, node):
    tfm = tf()
    x = ex.std(node.inputs[0])
    axes = _axes_input(ex, node)
    rank = x.shape.rank + len(axes)
    for a in sorted(a % rank for a in axes):
        x = tfm.expand_dims(x, a)
    ex.set(node.outputs[0], x)


@emitters.register("Concat")
def _concat(ex, node):
    tfm = tf()
    axis = int(node.attr("axis"))
    ops, f = _broadcast_operands(ex, node)
    if f:
        axis = NCHW_AXIS_TO_NHWC[axis % 4]
    ex.set(node.outputs[0], tfm.concat(ops, axis=axis), f)


@emitters.register("Split")
def _split(ex, node):
    tfm = tf()
    x_v = node.inputs[0]
    axis = int(node.attr("axis"))
    sizes = _axes_input(ex, node)
    n = len(node.outputs)
    t, f = ex.env_entry(x_v)
    if f and ex.rank(x_v) == 4:
        axis = NCHW_AXIS_TO_NHWC[axis % 4]
    else:
        t, f = ex.std(x_v), False
    outs = tfm.split(t, sizes if sizes else n, axis=axis)
    for v, o in zip(node.outputs, outs):
        ex.set(v, o, f)


@emitters.register("Slice")
def _slice(ex, node):
    tfm = tf()
    x_v = node.inputs[0]
    r = ex.rank(x_v)
    starts, ends = _axes_input(ex, node, 1), _axes_input(ex, node, 2)
    axes = _axes_input(ex, node, 3) or list(range(len(starts)))
    steps = _axes_input(ex, node, 4) or [1] * len(starts)
    if r is None:
        raise UnsupportedError(f"node {node.name} (Slice): the TF exporter needs the input rank")
    begin, end, strides = [0] * r, [0] * r, [1] * r
    bmask = emask = (1 << r) - 1
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax %= r
        strides[ax] = sp
        big = en >= INT_MAX // 2 if sp > 0 else en <= -(INT_MAX // 2)
        if not (st == 0 and sp > 0) and not (sp < 0 and st >= INT_MAX // 2):
            begin[ax] = st
            bmask &= ~(1 << ax)
        if not big:
            end[ax] = en
            emask &= ~(1 << ax)
    y = tfm.strided_slice(ex.std(x_v), begin, end, strides, begin_mask=bmask, end_mask=emask)
    ex.set(node.outputs[0], y)


@emitters.register("Pad")
def _pad(ex, node):
    tfm = tf()
    x_v = node.inputs[0]
    pads = _axes_input(ex, node, 1)
    r = ex.rank(x_v)
    axes = _axes_input(ex, node, 3) if len(node.inputs) > 3 else None
    axes = list(range(r)) if axes is None else [a % r for a in axes]
    widths = [[0, 0] for _ in range(r)]
    for k, a in enumerate(axes):
        widths[a] = [pads[k], pads[k + len(axes)]]
    if any(w < 0 for p in widths for w in p):
        raise UnsupportedError(f"node {node.name} (Pad): negative pads have no TF lowering")
    mode = node.attr("mode")
    value = 0
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        c = ex.const(node.inputs[2])
        value = c.reshape(-1)[0] if c is not None and c.size else value
    t, f = ex.env_entry(x_v)
    if f and r == 4:
        widths = [widths[p] for p in TO_NHWC]
    else:
        t, f = ex.std(x_v), False
    tf_mode = {"constant": "CONSTANT", "reflect": "REFLECT"}.get(mode)
    if tf_mode is None:
        raise UnsupportedError(f"node {node.name} (Pad): mode {mode!r} has no TF lowering")
    y = tfm.pad(t, widths, mode=tf_mode, constant_values=value) if tf_mode == "CONSTANT" else \
        tfm.pad(t, widths, mode=tf_mode)
    ex.set(node.outputs[0], y, f)


@emitters.register("Gather")
def _gather(ex, node):
    tfm = tf()
    data_v, idx_v = node.inputs
    axis = int(node.attr("axis"))
    idx = ex.const(idx_v)
    if idx is not None:
        n = data_v.shape[axis] if data_v.shape is not None else None
        if isinstance(n, int):
            idx = np.where(idx < 0, idx + n, idx)
        indices = tfm.constant(idx)
    else:
        indices = ex.std(idx_v)
    ex.set(node.outputs[0], tfm.gather(ex.std(data_v), indices, axis=axis))


@emitters.register("Expand")
def _expand(ex, node):
    tfm = tf()
    x = ex.std(node.inputs[0])
    shape = tfm.cast(ex.std(node.inputs[1]), tfm.int64)
    ex.set(node.outputs[0], tfm.broadcast_to(x, tfm.broadcast_dynamic_shape(tfm.shape(x, out_type=tfm.int64),
                                                                            shape)))


@emitters.register("Tile")
def _tile(ex, node):
    x_v = node.inputs[0]
    reps = ex.const(node.inputs[1])
    if reps is not None and ex.flagged(x_v) and ex.rank(x_v) == 4:
        reps = np.asarray(reps, np.int64).reshape(-1)[list(TO_NHWC)]
        ex.set(node.outputs[0], tf().tile(ex.env_entry(x_v)[0], reps), True)
        return
    ex.set(node.outputs[0], tf().tile(ex.std(x_v), ex.std(node.inputs[1])))


# ------------------------------------------------------------------------------------------ opaque TF ops
@emitters.register("tf::*")
def _tf_opaque(ex, node):
    from aiacc.plugins.tf.importer import rebuild_node

    tfm = tf()
    if node.attrs.get("graph_def") is not None:  # a region (control flow, TensorLists, function calls)
        from aiacc.plugins.tf.regions import decode, rebuild_region

        gd = node.meta.get("graph_def")
        if gd is None:
            gd = decode(node.attrs["graph_def"])
        outs = rebuild_region(gd, [ex.std(v) for v in node.inputs], list(node.attrs["tf_outputs"]))
        for v, o in zip(node.outputs, outs):
            if v.shape is not None:  # import_graph_def loses what shape inference cannot see through
                try:
                    o.set_shape([d if isinstance(d, int) else None for d in v.shape])
                except ValueError:
                    pass
            ex.set(v, o)
        return
    nd = node.meta.get("node_def")
    if nd is None:
        nd = tfm.compat.v1.NodeDef()
        nd.ParseFromString(base64.b64decode(node.attrs["node_def"]))
    inputs = [ex.std(v) for v in node.inputs]
    outs = rebuild_node(nd, [t.dtype.as_datatype_enum for t in inputs], inputs, len(node.outputs))
    for v, o in zip(node.outputs, outs):
        ex.set(v, o)


# ------------------------------------------------------------------------------------------ aiacc fused ops
def _activation(node, y):
    """The fused activation of an aiacc op, with the TF op Grappler fuses where there is one."""
    tfm = tf()
    act = node.attr("activation") or ""
    params = [float(p) for p in (node.attr("activation_params") or [])]
    if not act:
        return y
    if act == "Relu":
        return tfm.nn.relu(y)
    if act == "Clip":
        lo, hi = (params + [-np.inf, np.inf])[:2]
        if lo == 0 and hi == 6:
            return tfm.nn.relu6(y)
        if lo == 0 and hi == np.inf:
            return tfm.nn.relu(y)
        return tfm.clip_by_value(y, lo, hi)
    if act == "LeakyRelu":
        return tfm.nn.leaky_relu(y, alpha=params[0] if params else 0.01)
    if act == "Elu":
        alpha = params[0] if params else 1.0
        return tfm.nn.elu(y) if alpha == 1.0 else tfm.where(y > 0, y, alpha * tfm.math.expm1(y))
    if act == "Sigmoid":
        return tfm.math.sigmoid(y)
    if act == "Tanh":
        return tfm.math.tanh(y)
    if act == "HardSigmoid":
        alpha, beta = (params + [0.2, 0.5])[:2]
        return tfm.clip_by_value(alpha * y + beta, 0.0, 1.0)
    if act == "HardSwish":
        return y * tfm.nn.relu6(y + 3.0) / 6.0
    if act in ("Gelu", "GeluTanh"):
        return tfm.nn.gelu(y, approximate=act == "GeluTanh")
    raise UnsupportedError(f"node {node.name} ({node.qualified_op}): activation {act!r} has no TF lowering")


@emitters.register("aiacc::FusedConv")
def _fused_conv(ex, node):
    """Conv2D + BiasAdd (+ Add residual) + activation: the chain Grappler's remapper turns into _FusedConv2D."""
    tfm = tf()
    ins = list(node.inputs) + [None] * 4
    x_v, w_v, b_v, r_v = ins[:4]
    y = conv2d_nhwc(ex, node, x_v, _conv_filter(ex, node, w_v), _conv_bias(ex, node, b_v))
    if r_v is not None:
        c = ex.const(r_v)
        y = tfm.math.add(y, tfm.constant(const_to_nhwc(c)) if c is not None else ex.nhwc(r_v))
    ex.set(node.outputs[0], _activation(node, y), True)


@emitters.register("aiacc::FusedGemm")
def _fused_gemm(ex, node):
    """MatMul + BiasAdd + activation (Grappler fuses it into _FusedMatMul)."""
    tfm = tf()
    y, beta = _alpha_matmul(ex, node)
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        c = ex.const(node.inputs[2])
        if c is not None and c.ndim == 1:
            y = tfm.nn.bias_add(y, tfm.constant((c * beta).astype(c.dtype)))
        else:
            y = _gemm_c(ex, node, y, beta)
    ex.set(node.outputs[0], _activation(node, y))


# ------------------------------------------------------------------------------------------ transposed conv
@emitters.register("ConvTranspose")
def _conv_transpose(ex, node):
    """2-D ConvTranspose -> Conv2DBackpropInput (NHWC) with explicit paddings (+ BiasAdd)."""
    from aiacc.core.ops.nn import convtranspose_pads

    tfm = tf()
    x_v, w_v = node.inputs[0], node.inputs[1]
    b_v = node.inputs[2] if len(node.inputs) > 2 else None
    w = _conv_weight(ex, node, w_v)
    if w.ndim != 4 or int(node.attr("group") or 1) != 1:
        raise UnsupportedError(f"node {node.name} (ConvTranspose): only 2-D ungrouped transposed convolutions "
                               f"lower to TF")
    kernel = list(node.attr("kernel_shape") or w.shape[2:])
    strides = _ints(node, "strides", [1, 1])
    dilations = _ints(node, "dilations", [1, 1])
    spatial = None if x_v.shape is None else list(x_v.shape[2:])
    if spatial is None or not all(isinstance(d, int) for d in spatial) or dilations != [1, 1]:
        raise UnsupportedError(f"node {node.name} (ConvTranspose): the TF lowering needs static spatial sizes "
                               f"and no dilation")
    pads, out_pad, sizes = convtranspose_pads(spatial, kernel, strides, dilations, {
        "auto_pad": node.attr("auto_pad"), "pads": node.attr("pads"), "output_padding": node.attr("output_padding"),
        "output_shape": node.attr("output_shape")})
    # TF crops [begin, begin + size) of the full result; an end pad absorbs output_padding when < stride
    if min(pads) < 0 or any(p >= s for p, s in zip(out_pad, strides)):
        raise UnsupportedError(f"node {node.name} (ConvTranspose): pads {pads} / output_padding {out_pad} have "
                               f"no TF equivalent")
    x = ex.nhwc(x_v)
    cout = w.shape[1]
    batch = tfm.shape(x)[0]
    out_sizes = tfm.stack([batch, tfm.constant(sizes[0]), tfm.constant(sizes[1]), tfm.constant(cout)])
    filt = tfm.constant(np.ascontiguousarray(w.transpose(2, 3, 1, 0)))  # IOHW -> HW O I
    y = tfm.raw_ops.Conv2DBackpropInput(
        input_sizes=out_sizes, filter=filt, out_backprop=x, strides=[1, strides[0], strides[1], 1],
        padding="EXPLICIT", explicit_paddings=[0, 0, pads[0], pads[2], pads[1], pads[3], 0, 0], data_format="NHWC")
    y.set_shape([None, sizes[0], sizes[1], cout])
    if b_v is not None:
        bias = ex.const(b_v)
        if bias is None:
            raise UnsupportedError(f"node {node.name} (ConvTranspose): the TF exporter needs a constant bias")
        y = tfm.nn.bias_add(y, tfm.constant(bias.astype(w.dtype)))
    ex.set(node.outputs[0], y, True)


# ------------------------------------------------------------------------------------------ resize
@emitters.register("Resize")
def _resize(ex, node):
    """Resize over H and W of a 4-D tensor -> ResizeBilinear / ResizeNearestNeighbor (NHWC) where TF has the
    same coordinate rule."""
    tfm = tf()
    x_v, y_v = node.inputs[0], node.outputs[0]
    mode = node.attr("mode")
    coord = node.attr("coordinate_transformation_mode")
    nearest = node.attr("nearest_mode")
    shape_in, shape_out = x_v.shape, y_v.shape
    ok = shape_in is not None and shape_out is not None and len(shape_in) == 4 and \
        all(isinstance(d, int) for d in shape_out[2:]) and shape_out[:2] == shape_in[:2] and \
        not node.attr("antialias") and (node.attr("keep_aspect_ratio_policy") or "stretch") == "stretch"
    h, w = (shape_out[2], shape_out[3]) if ok else (None, None)
    if coord == "pytorch_half_pixel" and ok and h > 1 and w > 1:
        coord = "half_pixel"
    flags = None
    if ok and mode == "linear" and x_v.dtype == "float32":
        flags = {"align_corners": (True, False), "half_pixel": (False, True),
                 "asymmetric": (False, False)}.get(coord)
        fn = tfm.raw_ops.ResizeBilinear
    elif ok and mode == "nearest":
        flags = {("align_corners", "round_prefer_ceil"): (True, False),
                 ("half_pixel", "round_prefer_ceil"): (False, True),
                 ("tf_half_pixel_for_nn", "floor"): (False, True),
                 ("asymmetric", "floor"): (False, False)}.get((coord, nearest))
        fn = tfm.raw_ops.ResizeNearestNeighbor
    if flags is None:
        raise UnsupportedError(f"node {node.name} (Resize): mode {mode!r} with coordinate transformation "
                               f"{coord!r} (nearest_mode {nearest!r}) on shape {shape_in} has no TF lowering")
    y = fn(images=ex.nhwc(x_v), size=tfm.constant([h, w], tfm.int32), align_corners=flags[0],
           half_pixel_centers=flags[1])
    ex.set(y_v, y, True)


@emitters.register("Range")
def _range(ex, node):
    tfm = tf()
    start, limit, delta = [ex.std(v) for v in node.inputs]
    ex.set(node.outputs[0], tfm.range(start, limit, delta, dtype=start.dtype))


@emitters.register("ArgMax", "ArgMin")
def _arg_max(ex, node):
    tfm = tf()
    x = ex.std(node.inputs[0])
    axis = int(node.attr("axis"))
    if node.attr("select_last_index"):
        raise UnsupportedError(f"node {node.name} ({node.op}): select_last_index has no TF lowering")
    fn = tfm.math.argmax if node.op == "ArgMax" else tfm.math.argmin
    y = fn(x, axis=axis, output_type=tfm.int64)
    if node.attr("keepdims"):
        y = tfm.expand_dims(y, axis)
    ex.set(node.outputs[0], y)
