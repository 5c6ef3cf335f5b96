"""The TF plumbing ops (Const, Identity, Cast, ...) and the elementwise ops: unary, binary and
broadcasting, Select, BiasAdd, comparisons, IsFinite, clipping, rounding, DivNoNan and ArgMax /
ArgMin. Registered in the importer's table (`importer.handlers`)."""
from __future__ import annotations

import numpy as np

from aiacc.core.translate import Untranslatable
from aiacc.plugins.tf._tf import np_dtype_name, tf
from aiacc.plugins.tf.importer import Entry, GraphImporter, handlers
from aiacc.plugins.tf.import_ops.common import attr, const_to_nchw, int64_as, operands


# ------------------------------------------------------------------------------------------ plumbing
@handlers.register("Const")
def _const(imp: GraphImporter, tfop):
    value = tf().make_ndarray(tfop.get_attr("value"))
    return [Entry(imp.init(value, tfop.name))]


@handlers.register("Identity", "StopGradient", "Snapshot", "PreventGradient", "EnsureShape", "CheckNumerics")
def _identity(imp, tfop):
    if imp.training and tfop.type in ("StopGradient", "PreventGradient") and not _layernorm_moments_shift(imp, tfop):
        # kept as the TF op, so TF's autodiff of the exported step stops there as it does in the original
        # (dropped, tf.nn.moments' stopped mean in BatchNormalization's variance gave the backward an extra,
        # exactly zero, path through the mean: ResNet-18 layout, 40 more AddN and 20 more Neg than Keras)
        raise Untranslatable("stops gradients in training: kept as the TF op")
    return [imp.entry(tfop.inputs[0])]


def _layernorm_moments_shift(imp, tfop) -> bool:
    """tf.nn.moments' variance, SquaredDifference(x, StopGradient(Mean(x))), over the trailing axes of x:
    the LayerNormalization form, which the core's LayerNorm recognition needs without the StopGradient (its
    TF lowering is tf.nn.moments again, StopGradient included). Dropping it leaves gradients unchanged: the
    gradient through the stopped mean is mean(x - mean(x)) = 0. Over other axes (BatchNormalization: all
    but the channel axis) the StopGradient stays, as in the original graph."""
    src = tfop.inputs[0].op
    users = tfop.outputs[0].consumers()
    if tfop.type != "StopGradient" or src.type != "Mean" or not users:
        return False
    x = src.inputs[0]
    if not all(u.type == "SquaredDifference" and x in list(u.inputs) for u in users):
        return False
    axes, rank = imp.const(src.inputs[1]), imp.rank(x)
    if axes is None or rank is None:
        return False
    axes = sorted({int(a) % rank for a in np.asarray(axes).reshape(-1)})
    return bool(axes) and axes == list(range(rank - len(axes), rank))


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


_BINARY = {"AddV2": "Add", "Add": "Add", "Sub": "Sub", "Mul": "Mul", "RealDiv": "Div", "Maximum": "Max",
           "Minimum": "Min", "Pow": "Pow", "Less": "Less", "Greater": "Greater", "LessEqual": "LessOrEqual",
           "GreaterEqual": "GreaterOrEqual", "Equal": "Equal", "LogicalAnd": "And", "LogicalOr": "Or",
           "FloorMod": "Mod", "AddN": "Sum"}


@handlers.register(*_BINARY)
def _binary(imp, tfop):
    if tfop.type in ("RealDiv",) and not tfop.inputs[0].dtype.is_floating:
        return None
    vals, nchw = operands(imp, list(tfop.inputs))
    return [Entry(imp.emit1(_BINARY[tfop.type], vals, name=tfop.name), nchw)]


@handlers.register("Div")
def _div(imp, tfop):
    if not tfop.inputs[0].dtype.is_floating:
        return None  # TF integer Div floors, ONNX Div truncates
    vals, nchw = operands(imp, list(tfop.inputs))
    return [Entry(imp.emit1("Div", vals, name=tfop.name), nchw)]


@handlers.register("SquaredDifference")
def _sqdiff(imp, tfop):
    vals, nchw = operands(imp, list(tfop.inputs))
    d = imp.emit1("Sub", vals, name=tfop.name + "_diff")
    return [Entry(imp.emit1("Mul", [d, d], name=tfop.name), nchw)]


@handlers.register("Select", "SelectV2")
def _select(imp, tfop):
    if tfop.type == "Select" and imp.rank(tfop.inputs[0]) not in (0, imp.rank(tfop.inputs[1])):
        return None  # Select with a vector condition picks rows: not numpy broadcasting
    vals, nchw = operands(imp, list(tfop.inputs))
    return [Entry(imp.emit1("Where", vals, name=tfop.name), nchw)]


@handlers.register("BiasAdd", "BiasAddV1")
def _bias_add(imp, tfop):
    x, b = tfop.inputs
    e = imp.entry(x)
    fmt = attr(tfop, "data_format", "NHWC")
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


# ------------------------------------------------------------------------------------------ more elementwise
@handlers.register("IsFinite")
def _is_finite(imp, tfop):
    # |x| < inf is False for inf and NaN alike
    e = imp.entry(tfop.inputs[0])
    a = imp.emit1("Abs", [e.value], name=tfop.name + "_abs")
    inf = imp.init(np.array(np.inf, e.value.dtype), tfop.name + "_inf")
    return [Entry(imp.emit1("Less", [a, inf], name=tfop.name), e.nchw)]


@handlers.register("NotEqual")
def _not_equal(imp, tfop):
    vals, nchw = operands(imp, list(tfop.inputs))
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
    vals, nchw = operands(imp, list(tfop.inputs))
    d = imp.emit1("Div", vals, name=tfop.name + "_div")
    return [Entry(imp.emit1("Floor", [d], name=tfop.name), nchw)]


@handlers.register("ClipByValue")
def _clip_by_value(imp, tfop):
    x, lo, hi = tfop.inputs
    if imp.rank(lo) == 0 and imp.rank(hi) == 0:
        e = imp.entry(x)
        return [Entry(imp.emit1("Clip", [e.value, imp.plain(lo), imp.plain(hi)], name=tfop.name), e.nchw)]
    vals, nchw = operands(imp, [x, lo])
    y = imp.emit1("Max", vals, name=tfop.name + "_max")
    if nchw:
        hv = imp.const(hi)
        hv = const_to_nchw(imp, imp.plain(hi), hi.name) if hv is not None else imp.nchw(hi)
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
    return [Entry(int64_as(imp, tfop, y, "output_type"))]


@handlers.register("Rint")
def _rint(imp, tfop):
    e = imp.entry(tfop.inputs[0])  # both round half to even
    return [Entry(imp.emit1("Round", [e.value], name=tfop.name), e.nchw)]


@handlers.register("DivNoNan")
def _div_no_nan(imp, tfop):
    if not tfop.inputs[0].dtype.is_floating:
        return None
    vals, nchw = operands(imp, list(tfop.inputs))
    n = tfop.name
    zero = imp.init(np.array(0, vals[0].dtype), n + "_zero")
    q = imp.emit1("Div", vals, name=n + "_div")
    return [Entry(imp.emit1("Where", [imp.emit1("Equal", [vals[1], zero], name=n + "_is_zero"), zero, q], name=n),
                  nchw)]
