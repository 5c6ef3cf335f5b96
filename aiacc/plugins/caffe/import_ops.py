"""The Caffe importer's op table: one translator per layer type, registered in importer.TRANSLATORS.

A translator takes the LayerContext (the layer, its bottoms, helpers adding nodes and constants named after
the layer) and returns the values of the layer's tops; it raises Untranslatable for a configuration the IR
cannot express (the importer rolls back what it added and keeps the layer opaque) and an aiacc error for
a malformed layer.
"""
from __future__ import annotations

import numpy as np

from aiacc.core.ir import Value
from aiacc.core.translate import Untranslatable
from aiacc.errors import GraphError
from aiacc.plugins.caffe.importer import TRANSLATORS, LayerContext, int_list
from aiacc.plugins.caffe.schema import pb


def _per_axis(ctx: LayerContext, what: str, repeated, h, w, n: int, default: int | None) -> list[int]:
    """Caffe's kernel/pad/stride/dilation: `*_h`/`*_w` (2-d only), else one value or one per axis."""
    if h is not None or w is not None:
        if n != 2:
            raise ctx.fail(f"{what}_h/{what}_w apply to 2-d layers only, this one has {n} spatial axes")
        if h is None or w is None:
            raise ctx.fail(f"give both {what}_h and {what}_w")
        if len(repeated):
            raise ctx.fail(f"give either {what} or {what}_h/{what}_w, not both")
        return [int(h), int(w)]
    vals = int_list(repeated)
    if not vals:
        if default is None:
            raise ctx.fail(f"{what} is required")
        return [default] * n
    if len(vals) == 1:
        return vals * n
    if len(vals) != n:
        raise ctx.fail(f"{what} has {len(vals)} values for {n} spatial axes")
    return vals


def _opt(msg, field):
    return getattr(msg, field) if msg.HasField(field) else None


def _conv_geometry(ctx: LayerContext, p, n: int):
    kernel = _per_axis(ctx, "kernel_size", p.kernel_size, _opt(p, "kernel_h"), _opt(p, "kernel_w"), n, None)
    hw_pad = (p.pad_h, p.pad_w) if (p.HasField("pad_h") or p.HasField("pad_w")) else (None, None)
    pads = _per_axis(ctx, "pad", p.pad, *hw_pad, n, 0)
    strides = _per_axis(ctx, "stride", p.stride, _opt(p, "stride_h"), _opt(p, "stride_w"), n, 1)
    dilations = _per_axis(ctx, "dilation", p.dilation, None, None, n, 1)
    return kernel, pads, strides, dilations


@TRANSLATORS.register("Convolution", "Deconvolution")
def _convolution(ctx: LayerContext) -> list[Value]:
    ctx.need_bottoms(1)
    p = ctx.layer.convolution_param
    shape = ctx.shape()
    if p.axis not in (1, 1 - len(shape)):
        raise Untranslatable(f"convolution axis {p.axis} (aiacc handles channel axis 1)")
    n = len(shape) - 2
    if n < 1:
        raise ctx.fail(f"needs an input with spatial axes, got shape {shape}")
    kernel, pads, strides, dilations = _conv_geometry(ctx, p, n)
    group, m, cin = int(p.group), int(p.num_output), shape[1]
    if not p.HasField("num_output") or m <= 0:
        raise ctx.fail("num_output is required")
    if group < 1 or cin % group or m % group:
        raise ctx.fail(f"group {group} does not divide {cin} input and {m} output channels")
    deconv = ctx.layer.type == "Deconvolution"
    wshape = [cin, m // group, *kernel] if deconv else [m, cin // group, *kernel]
    expected = [("weights", wshape)] + ([("bias", [m])] if p.bias_term else [])
    arrays = ctx.blobs(expected)
    w = ctx.const(arrays[0], "weights")
    b = ctx.const(arrays[1], "bias") if p.bias_term else None
    attrs = dict(kernel_shape=kernel, pads=pads + pads, strides=strides, dilations=dilations, group=group)
    return ctx.final("ConvTranspose" if deconv else "Conv", ctx.x(), w, b, **attrs)


@TRANSLATORS.register("DepthwiseConvolution", "ConvolutionDepthwise")
def _depthwise_convolution(ctx: LayerContext) -> list[Value]:
    """The forks' depthwise layer types (MobileNet ports): a Convolution whose group is its input channels,
    which is what they compute. Another group (or none given) is left to the fork: opaque."""
    p = ctx.layer.convolution_param
    shape = ctx.maybe_shape()
    if shape is None or len(shape) < 3 or p.group != shape[1] or p.num_output % max(p.group, 1):
        raise Untranslatable(f"{ctx.layer.type} with group {p.group} on {shape} is not a plain grouped convolution")
    return _convolution(ctx)


@TRANSLATORS.register("Pooling")
def _pooling(ctx: LayerContext) -> list[Value]:
    p = ctx.layer.pooling_param
    if len(ctx.layer.top) == 2 and len(ctx.bottoms) == 1 and p.pool == pb.PoolingParameter.MAX:
        raise Untranslatable("MAX pooling with its argmax mask as a second top (SegNet/ENet)")
    ctx.need_bottoms(1)
    shape = ctx.maybe_shape()
    if shape is not None and len(shape) != 4:
        raise ctx.fail(f"Caffe pooling takes a 4-d input, got shape {shape}")
    if p.pool == pb.PoolingParameter.STOCHASTIC:
        raise Untranslatable("STOCHASTIC pooling")
    is_max = p.pool == pb.PoolingParameter.MAX
    if p.global_pooling:
        if p.HasField("kernel_size") or p.HasField("kernel_h"):
            raise ctx.fail("global_pooling and a kernel size are exclusive")
        if p.pad or p.pad_h or p.pad_w:
            raise ctx.fail("global pooling takes no padding")
        return ctx.final("GlobalMaxPool" if is_max else "GlobalAveragePool", ctx.x())
    single = lambda f: [getattr(p, f)] if p.HasField(f) else []  # noqa: E731
    kernel = _per_axis(ctx, "kernel_size", single("kernel_size"), _opt(p, "kernel_h"), _opt(p, "kernel_w"), 2, None)
    hw_pad = (p.pad_h, p.pad_w) if (p.HasField("pad_h") or p.HasField("pad_w")) else (None, None)
    pads = _per_axis(ctx, "pad", single("pad"), *hw_pad, 2, 0)
    strides = _per_axis(ctx, "stride", single("stride"), _opt(p, "stride_h"), _opt(p, "stride_w"), 2, 1)
    for k, pad in zip(kernel, pads):
        if pad >= k:
            raise ctx.fail(f"pad {pad} must be smaller than the kernel {k}")
    ceil = p.round_mode == pb.PoolingParameter.CEIL
    if p.HasField("ceil_mode"):  # the forks' (and OpenCV's) spelling of the same choice
        if p.HasField("round_mode") and p.ceil_mode != ceil:
            raise ctx.fail("round_mode and ceil_mode disagree")
        ceil = bool(p.ceil_mode)
        ctx.g.meta["caffe_ceil_mode_field"] = True  # the exporter writes FLOOR back in the same spelling
    attrs = dict(kernel_shape=kernel, pads=pads + pads, strides=strides, ceil_mode=int(ceil))
    if is_max:
        return ctx.final("MaxPool", ctx.x(), **attrs)
    # Caffe's average divides by the window clipped to the padded input (padding counts, the part of a
    # ceil-rounded last window beyond the padding does not): ONNX count_include_pad=1 with ceil_mode
    return ctx.final("AveragePool", ctx.x(), count_include_pad=1, **attrs)


@TRANSLATORS.register("InnerProduct")
def _inner_product(ctx: LayerContext) -> list[Value]:
    ctx.need_bottoms(1)
    p = ctx.layer.inner_product_param
    shape = ctx.shape()
    axis = p.axis % len(shape) if -len(shape) <= p.axis < len(shape) else None
    if axis is None:
        raise ctx.fail(f"axis {p.axis} is out of range for a rank-{len(shape)} bottom")
    n = int(p.num_output)
    if n <= 0:
        raise ctx.fail("num_output is required")
    k = int(np.prod(shape[axis:], dtype=np.int64))
    wshape = [k, n] if p.transpose else [n, k]
    arrays = ctx.blobs([("weights", wshape)] + ([("bias", [n])] if p.bias_term else []))
    w = ctx.const(arrays[0], "weights")
    b = ctx.const(arrays[1], "bias") if p.bias_term else None
    x = ctx.x()
    if not (axis == 1 and len(shape) == 2):
        x = ctx.inner("Flatten", x, sub="flatten", axis=axis)
    if axis == 1:
        return ctx.final("Gemm", x, w, b, transB=0 if p.transpose else 1)
    y = ctx.inner("Gemm", x, w, b, sub="gemm", transB=0 if p.transpose else 1)
    target = ctx.const(np.asarray(shape[:axis] + [n], dtype=np.int64), "shape")
    return ctx.final("Reshape", y, target)


@TRANSLATORS.register("ReLU")
def _relu(ctx: LayerContext) -> list[Value]:
    ctx.need_bottoms(1)
    slope = ctx.layer.relu_param.negative_slope
    if slope:
        return ctx.final("LeakyRelu", ctx.x(), alpha=float(slope))
    return ctx.final("Relu", ctx.x())


@TRANSLATORS.register("PReLU")
def _prelu(ctx: LayerContext) -> list[Value]:
    ctx.need_bottoms(1)
    shape = ctx.shape()
    shared = ctx.layer.prelu_param.channel_shared
    c = 1 if shared else shape[1]
    (slope,) = ctx.blobs([("slope", [c])])
    # ONNX PRelu broadcasts from the right: (C,) becomes (C, 1, ..., 1)
    slope = slope.reshape([c] + [1] * (len(shape) - 2)) if not shared else slope
    return ctx.final("PRelu", ctx.x(), ctx.const(slope, "slope"))


@TRANSLATORS.register("Sigmoid")
def _sigmoid(ctx):
    ctx.need_bottoms(1)
    return ctx.final("Sigmoid", ctx.x())


@TRANSLATORS.register("TanH")
def _tanh(ctx):
    ctx.need_bottoms(1)
    return ctx.final("Tanh", ctx.x())


@TRANSLATORS.register("ELU")
def _elu(ctx):
    ctx.need_bottoms(1)
    return ctx.final("Elu", ctx.x(), alpha=float(ctx.layer.elu_param.alpha))


@TRANSLATORS.register("BatchNorm")
def _batch_norm(ctx: LayerContext) -> list[Value]:
    ctx.need_bottoms(1)
    p = ctx.layer.batch_norm_param
    if p.HasField("use_global_stats") and not p.use_global_stats:
        raise Untranslatable("use_global_stats: false normalizes with the batch's own statistics")
    shape = ctx.shape()
    c = shape[1]
    mean, var, factor = ctx.blobs([("mean", [c]), ("variance", [c]), ("moving-average factor", [1])])
    # Caffe stores running sums; the statistics are the sums divided by the moving-average factor
    f = float(factor.reshape(-1)[0])
    inv = 0.0 if f == 0 else 1.0 / f
    mean = (mean.astype(np.float64) * inv).astype(np.float32)
    var = (var.astype(np.float64) * inv).astype(np.float32)
    ones = ctx.const(np.ones(c, np.float32), "scale")
    zeros = ctx.const(np.zeros(c, np.float32), "bias")
    return ctx.final("BatchNormalization", ctx.x(), ones, zeros, ctx.const(mean, "mean"), ctx.const(var, "variance"),
                     epsilon=float(p.eps))


def _param_axes(ctx: LayerContext, shape, axis: int, num_axes: int, second) -> tuple[int, list[int]]:
    """(axis, covered dims) of a Scale/Bias parameter per Caffe's rules."""
    r = len(shape)
    if not -r <= axis < max(r, 1):
        raise ctx.fail(f"axis {axis} is out of range for a rank-{r} bottom")
    axis %= max(r, 1)
    if second is not None:
        pshape = list(second)
        if shape[axis:axis + len(pshape)] != pshape:
            # SENet's gate: a (N, C, 1, 1) second bottom scales (N, C, H, W) from axis 0; its trailing 1s
            # cover nothing (SENet's Caffe and OpenCV read it so)
            while pshape and pshape[-1] == 1 and shape[axis:axis + len(pshape)] != pshape:
                pshape.pop()
        if pshape and shape[axis:axis + len(pshape)] != pshape:
            raise ctx.fail(f"bottom 1 of shape {pshape} does not match bottom 0 of shape {shape} from axis {axis}")
        return axis, pshape
    if num_axes < -1:
        raise ctx.fail(f"num_axes {num_axes} must be -1 or more")
    end = r if num_axes == -1 else axis + num_axes
    if end > r:
        raise ctx.fail(f"axis {axis} + num_axes {num_axes} exceeds the bottom's rank {r}")
    return axis, shape[axis:end]


def _broadcastable(array_or_value, axis: int, covered: list[int], rank: int, ctx: LayerContext, what: str):
    """Reshape a (covered) parameter so ONNX broadcasting aligns it at `axis` of a rank-`rank` tensor."""
    target = covered + [1] * (rank - axis - len(covered))
    if isinstance(array_or_value, np.ndarray):
        return ctx.const(array_or_value.reshape(target) if covered else array_or_value.reshape(()), what)
    if len(target) == len(covered):
        return array_or_value
    return ctx.inner("Reshape", array_or_value, ctx.const(np.asarray(target, dtype=np.int64), f"{what}_shape"),
                     sub=f"{what}_reshape")


def _merge_into_batchnorm(ctx: LayerContext, axis: int, covered: list[int], arrays) -> bool:
    """Caffe's BatchNorm + Scale pair is one ONNX BatchNormalization: give the BatchNorm node the Scale's
    weights instead of adding Mul/Add (the core then folds it into the convolution before it)."""
    x = ctx.x()
    bn = x.producer
    if bn is None or bn.op != "BatchNormalization" or bn.domain != "" or x.uses or x.is_graph_output:
        return False
    if axis != 1 or len(covered) != 1 or "caffe_scale" in bn.meta:
        return False
    bottom = ctx.layer.bottom[0]
    if bottom not in ctx.layer.top and ctx.imp.read_later(bottom):
        return False  # another layer reads the BatchNorm's own output later
    c = covered[0]
    scale = arrays[0]
    bias = arrays[1] if len(arrays) > 1 else np.zeros(c, np.float32)
    for i, (array, what) in ((1, (scale, "scale")), (2, (bias, "bias"))):
        old = bn.inputs[i]
        bn.set_input(i, ctx.g.add_initializer(f"{ctx.layer.name}/{what}", np.asarray(array, np.float32).reshape(c)))
        if not old.uses and old.const is not None:
            ctx.g.remove_initializer(old)
    bn.meta["caffe_scale"] = ctx.layer.name
    return True


@TRANSLATORS.register("Scale")
def _scale(ctx: LayerContext) -> list[Value]:
    ctx.need_bottoms(1, 2)
    p = ctx.layer.scale_param
    shape = ctx.shape()
    second = ctx.shape(1) if len(ctx.bottoms) == 2 else None
    axis, covered = _param_axes(ctx, shape, p.axis, p.num_axes, second)
    expected = []
    if second is None:
        expected.append(("scale", covered))
    if p.bias_term:
        expected.append(("bias", covered))
    arrays = ctx.blobs(expected)
    if second is None and _merge_into_batchnorm(ctx, axis, covered, arrays):
        return [ctx.x()]
    scale = ctx.bottoms[1] if second is not None else arrays.pop(0)
    s = _broadcastable(scale, axis, covered, len(shape), ctx, "scale")
    if not p.bias_term:
        return ctx.final("Mul", ctx.x(), s)
    y = ctx.inner("Mul", ctx.x(), s, sub="mul")
    return ctx.final("Add", y, _broadcastable(arrays[0], axis, covered, len(shape), ctx, "bias"))


@TRANSLATORS.register("Bias")
def _bias(ctx: LayerContext) -> list[Value]:
    ctx.need_bottoms(1, 2)
    p = ctx.layer.bias_param
    shape = ctx.shape()
    second = ctx.shape(1) if len(ctx.bottoms) == 2 else None
    axis, covered = _param_axes(ctx, shape, p.axis, p.num_axes, second)
    if second is None:
        (bias,) = ctx.blobs([("bias", covered)])
    else:
        ctx.blobs([])
        bias = ctx.bottoms[1]
    return ctx.final("Add", ctx.x(), _broadcastable(bias, axis, covered, len(shape), ctx, "bias"))


@TRANSLATORS.register("Eltwise")
def _eltwise(ctx: LayerContext) -> list[Value]:
    ctx.need_bottoms(2, 1 << 30)
    p = ctx.layer.eltwise_param
    shapes = [ctx.shape(i) for i in range(len(ctx.bottoms))]
    if any(s != shapes[0] for s in shapes):
        raise ctx.fail(f"bottoms have different shapes {shapes}")
    xs = list(ctx.bottoms)
    op = p.operation
    if p.coeff and op != pb.EltwiseParameter.SUM:
        raise ctx.fail("coeff applies to the SUM operation only")
    if op == pb.EltwiseParameter.SUM:
        coeffs = list(p.coeff)
        if coeffs and len(coeffs) != len(xs):
            raise ctx.fail(f"{len(coeffs)} coefficients for {len(xs)} bottoms")
        for i, c in enumerate(coeffs):
            if c != 1.0:
                xs[i] = ctx.inner("Mul", xs[i], ctx.scalar(c, f"coeff{i}"), sub=f"scaled{i}")
        kind = "Add" if len(xs) == 2 else "Sum"
    elif op == pb.EltwiseParameter.PROD:
        while len(xs) > 2:
            xs = [ctx.inner("Mul", xs[0], xs[1], sub=f"prod{len(xs)}")] + xs[2:]
        kind = "Mul"
    else:
        kind = "Max"
    return ctx.final(kind, *xs)


@TRANSLATORS.register("Concat")
def _concat(ctx: LayerContext) -> list[Value]:
    ctx.need_bottoms(1, 1 << 30)
    p = ctx.layer.concat_param
    axis = p.axis if p.HasField("axis") or not p.HasField("concat_dim") else p.concat_dim
    if len(ctx.bottoms) == 1:
        return ctx.final("Identity", ctx.x())
    return ctx.final("Concat", *ctx.bottoms, axis=int(axis))


@TRANSLATORS.register("Slice")
def _slice(ctx: LayerContext) -> list[Value]:
    ctx.need_bottoms(1)
    p = ctx.layer.slice_param
    shape = ctx.shape()
    axis = p.axis if p.HasField("axis") or not p.HasField("slice_dim") else p.slice_dim
    if not -len(shape) <= axis < len(shape):
        raise ctx.fail(f"axis {axis} is out of range for shape {shape}")
    axis %= len(shape)
    dim, n = shape[axis], len(ctx.layer.top)
    points = int_list(p.slice_point)
    if points:
        if len(points) != n - 1:
            raise ctx.fail(f"{len(points)} slice points for {n} tops (need {n - 1})")
        bounds = [0] + points + [dim]
        sizes = [b - a for a, b in zip(bounds, bounds[1:])]
        if any(s <= 0 for s in sizes):
            raise ctx.fail(f"slice points {points} are not increasing inside 0..{dim}")
    else:
        if dim % n:
            raise ctx.fail(f"dimension {dim} does not split evenly into {n} tops")
        sizes = [dim // n] * n
    if n == 1:
        return ctx.final("Identity", ctx.x())
    return ctx.final("Split", ctx.x(), ctx.const(np.asarray(sizes, dtype=np.int64), "split"), n_out=n, axis=axis)


@TRANSLATORS.register("Permute")
def _permute(ctx: LayerContext) -> list[Value]:
    """The SSD fork's Permute: `order` gives the new order of the axes; axes it leaves out follow in their
    own order (the fork's rule). As a Transpose the detection heads stay IR (and in one onnxruntime session)."""
    ctx.need_bottoms(1)
    r = len(ctx.shape())
    order = int_list(ctx.layer.permute_param.order)
    if len(set(order)) != len(order) or any(not 0 <= a < r for a in order):
        raise ctx.fail(f"order {order} is not a permutation of the axes of a rank-{r} bottom")
    order += [a for a in range(r) if a not in order]
    if order == list(range(r)):
        return ctx.final("Identity", ctx.x())
    return ctx.final("Transpose", ctx.x(), perm=order)


@TRANSLATORS.register("Silence")
def _silence(ctx: LayerContext) -> list[Value]:
    """Silence reads its bottoms (so they are no net outputs) and computes nothing."""
    if ctx.layer.top:
        raise ctx.fail(f"has {len(ctx.layer.top)} tops; Silence has none", GraphError)
    return []


@TRANSLATORS.register("Split")
def _split(ctx: LayerContext) -> list[Value]:
    ctx.need_bottoms(1)
    return [ctx.x()] * len(ctx.layer.top)  # every top is the bottom itself: no node needed in SSA


@TRANSLATORS.register("Softmax")
def _softmax(ctx):
    ctx.need_bottoms(1)
    return ctx.final("Softmax", ctx.x(), axis=int(ctx.layer.softmax_param.axis))


@TRANSLATORS.register("Dropout")
def _dropout(ctx):
    ctx.need_bottoms(1)
    ratio = ctx.scalar(ctx.layer.dropout_param.dropout_ratio, "ratio")
    return ctx.final("Dropout", ctx.x(), ratio)


@TRANSLATORS.register("LRN")
def _lrn(ctx: LayerContext) -> list[Value]:
    ctx.need_bottoms(1)
    p = ctx.layer.lrn_param
    size = int(p.local_size)
    if size % 2 == 0:
        raise ctx.fail(f"local_size {size} must be odd")
    if p.norm_region == pb.LRNParameter.ACROSS_CHANNELS:
        return ctx.final("LRN", ctx.x(), size=size, alpha=float(p.alpha), beta=float(p.beta), bias=float(p.k))
    # WITHIN_CHANNEL, as Caffe builds it: x * (1 + alpha * avgpool(x^2))^-beta, the pool counting padding
    x = ctx.x()
    pad = (size - 1) // 2
    sq = ctx.inner("Mul", x, x, sub="square")
    pooled = ctx.inner("AveragePool", sq, sub="pool", kernel_shape=[size, size], pads=[pad] * 4, strides=[1, 1],
                       count_include_pad=1, ceil_mode=1)
    scaled = ctx.inner("Mul", pooled, ctx.scalar(p.alpha, "alpha"), sub="scale")
    shifted = ctx.inner("Add", scaled, ctx.scalar(1.0, "one"), sub="shift")
    power = ctx.inner("Pow", shifted, ctx.scalar(-p.beta, "power"), sub="power")
    return ctx.final("Mul", x, power)


@TRANSLATORS.register("Flatten")
def _flatten(ctx: LayerContext) -> list[Value]:
    ctx.need_bottoms(1)
    p = ctx.layer.flatten_param
    shape = ctx.shape()
    r = len(shape)
    if not (-r <= p.axis < r and -r <= p.end_axis < r):
        raise ctx.fail(f"axis {p.axis} / end_axis {p.end_axis} out of range for shape {shape}")
    a, e = p.axis % r, p.end_axis % r
    if a == 1 and e == r - 1:
        return ctx.final("Flatten", ctx.x(), axis=1)
    out = shape[:a] + [int(np.prod(shape[a:e + 1], dtype=np.int64))] + shape[e + 1:]
    return ctx.final("Reshape", ctx.x(), ctx.const(np.asarray(out, dtype=np.int64), "shape"))


def caffe_reshape(shape: list[int], spec: list[int], axis: int, num_axes: int) -> list[int]:
    """Caffe's Reshape output shape: spec replaces dims [axis, axis + num_axes); 0 copies, -1 infers."""
    r = len(shape)
    start = axis if axis >= 0 else r + axis + 1
    if not 0 <= start <= r:
        raise ValueError(f"axis {axis} is out of range for rank {r}")
    end = r if num_axes == -1 else start + num_axes
    if end > r or num_axes < -1:
        raise ValueError(f"num_axes {num_axes} from axis {axis} exceeds rank {r}")
    out = shape[:start]
    for i, d in enumerate(spec):
        if d == 0:
            if start + i >= r:
                raise ValueError(f"dim {i} is 0 (copy) but the bottom has no axis {start + i}")
            out.append(shape[start + i])
        else:
            out.append(d)
    out += shape[end:]
    if out.count(-1) > 1:
        raise ValueError("more than one -1 dimension")
    total = int(np.prod(shape, dtype=np.int64))
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        if known == 0 or total % known:
            raise ValueError(f"cannot infer the -1 dimension: {total} elements into {out}")
        out[out.index(-1)] = total // known
    if int(np.prod(out, dtype=np.int64)) != total:
        raise ValueError(f"{out} holds {int(np.prod(out))} elements, the bottom {shape} holds {total}")
    return out


@TRANSLATORS.register("Reshape")
def _reshape(ctx: LayerContext) -> list[Value]:
    ctx.need_bottoms(1)
    p = ctx.layer.reshape_param
    try:
        out = caffe_reshape(ctx.shape(), int_list(p.shape.dim), int(p.axis), int(p.num_axes))
    except ValueError as e:
        raise ctx.fail(str(e)) from None
    return ctx.final("Reshape", ctx.x(), ctx.const(np.asarray(out, dtype=np.int64), "shape"))


@TRANSLATORS.register("Power")
def _power(ctx: LayerContext) -> list[Value]:
    ctx.need_bottoms(1)
    p = ctx.layer.power_param
    steps = []
    if p.scale != 1.0:
        steps.append(("Mul", p.scale, "scale"))
    if p.shift != 0.0:
        steps.append(("Add", p.shift, "shift"))
    if p.power != 1.0:
        steps.append(("Pow", p.power, "power"))
    if not steps:
        return ctx.final("Identity", ctx.x())
    v = ctx.x()
    for i, (op, value, what) in enumerate(steps):
        c = ctx.scalar(value, what)
        if i == len(steps) - 1:
            return ctx.final(op, v, c)
        v = ctx.inner(op, v, c, sub=f"{what}d")
    raise AssertionError("unreachable")


# the opaque layer types aiacc runs with numpy kernels of its own (registered on import)
from aiacc.plugins.caffe import layer_kernels  # noqa: E402,F401
