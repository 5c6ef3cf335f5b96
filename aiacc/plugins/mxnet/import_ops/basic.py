"""The converters of the MXNet ops vision models and BERT are made of: convolution, batch norm,
activations, pooling, dense layers, elementwise and scalar ops, reshaping, softmax, dot products,
slicing and broadcasting. Registered in the importer's table (`importer.converters`).
"""
from __future__ import annotations

import numpy as np

from aiacc.core.ir import Value
from aiacc.core.ops import get_schema
from aiacc.core.translate import Untranslatable
from aiacc.errors import AiaccError, ShapeError
from aiacc.plugins.mxnet.importer import SELU_ALPHA, SELU_GAMMA, Ctx, converters
from aiacc.plugins.mxnet.symjson import attr_bool

# -- the core: convolution, normalization, activations, dense layers, elementwise and shape ops -------

def _spatial(ctx: Ctx, key: str, n: int, default: int) -> list[int]:
    t = ctx.tuple(key, None)
    if not t:
        return [default] * n
    if len(t) != n:
        raise AiaccError(f"{ctx.node.describe()}: {key}={t} does not match a {n}-d kernel")
    return list(t)


@converters.register("Convolution")
def _convolution(ctx: Ctx):
    if ctx.str("layout") not in (None, "None", "NCW", "NCHW", "NCDHW"):
        return None
    kernel = list(ctx.tuple("kernel"))
    n = len(kernel)
    no_bias = ctx.bool("no_bias", False)
    ctx.need_inputs(2 if no_bias else 3)
    ctx.count("num_filter", 1, 0)
    ctx.kernel_matches(kernel)
    pad = _spatial(ctx, "pad", n, 0)
    return ctx.op("Conv", ctx.inputs[0], ctx.inputs[1], None if no_bias else ctx.inputs[2],
                  kernel_shape=kernel, strides=_spatial(ctx, "stride", n, 1),
                  dilations=_spatial(ctx, "dilate", n, 1), pads=pad + pad, group=ctx.int("num_group", 1))


@converters.register("Deconvolution")
def _deconvolution(ctx: Ctx):
    if ctx.str("layout") not in (None, "None", "NCW", "NCHW", "NCDHW"):
        return None
    kernel = list(ctx.tuple("kernel"))
    n = len(kernel)
    no_bias = ctx.bool("no_bias", True)
    ctx.need_inputs(2 if no_bias else 3)
    ctx.count("num_filter", 1, 1, ctx.int("num_group", 1))
    ctx.kernel_matches(kernel)
    pad, adj = _spatial(ctx, "pad", n, 0), _spatial(ctx, "adj", n, 0)
    stride, dilate = _spatial(ctx, "stride", n, 1), _spatial(ctx, "dilate", n, 1)
    target = ctx.tuple("target_shape", None)
    if target and any(target):
        # MXNet derives pad and adj from the target size (DeconvolutionParam::InferPad)
        s = ctx.shape(0)
        if s is None or len(target) != n or not all(isinstance(d, int) for d in s[-n:]):
            return None
        for i in range(n):
            total = stride[i] * (s[len(s) - n + i] - 1) + dilate[i] * (kernel[i] - 1) + 1 - target[i]
            if total < 0:
                raise ShapeError(f"{ctx.node.describe()}: target_shape {list(target)} is larger than the "
                                 f"deconvolution can produce")
            pad[i], adj[i] = (total + 1) // 2, total % 2
    return ctx.op("ConvTranspose", ctx.inputs[0], ctx.inputs[1], None if no_bias else ctx.inputs[2],
                  kernel_shape=kernel, strides=stride, dilations=dilate, pads=pad + pad,
                  group=ctx.int("num_group", 1), output_padding=adj)


@converters.register("BatchNorm")
def _batchnorm(ctx: Ctx):
    ctx.need_inputs(5)
    rank = ctx.rank(0)
    axis = ctx.int("axis", 1)
    # ONNX normalizes axis 1 whatever the rank, so axis=1 needs no shape
    if attr_bool(ctx.node, "output_mean_var", False):
        return None
    if axis != 1 and (rank is None or axis % rank != 1):
        return _batchnorm_other_axis(ctx)
    x, gamma, beta, mean, var = ctx.inputs
    if ctx.bool("fix_gamma", True):  # MXNet's default: gamma is held at 1 whatever its stored value
        if ctx.training:
            raise Untranslatable("fix_gamma=True in training (gamma gets no gradient): kept as MXNet's op")
        gamma = ctx.constant("gamma_fixed", np.ones(mean.shape, dtype=ctx.dtype(3)))
    if ctx.training:
        if ctx.bool("use_global_stats", False):
            raise Untranslatable("use_global_stats in training: kept as MXNet's op")
        # batch statistics; MXNet updates the moving mean/var (aux states) in place, so the new-statistics
        # outputs have no readers here (the exporter lowers this node back to BatchNorm on the same aux)
        y, _, _ = ctx.op("BatchNormalization", x, gamma, beta, mean, var, epsilon=ctx.float("eps", 1e-3),
                         momentum=ctx.float("momentum", 0.9), training_mode=1, outputs=3)
        return y
    return ctx.op("BatchNormalization", x, gamma, beta, mean, var, epsilon=ctx.float("eps", 1e-3))


def _batchnorm_other_axis(ctx: Ctx):
    """BatchNorm along an axis other than 1: with constant statistics, a per-channel scale and shift."""
    rank = ctx.rank(0)
    x, gamma, beta, mean, var = ctx.inputs
    if rank is None or any(v.const is None for v in (gamma, beta, mean, var)):
        return None
    eps = ctx.float("eps", 1e-3)
    g = np.ones_like(mean.const) if ctx.bool("fix_gamma", True) else gamma.const
    scale = (g / np.sqrt(var.const.astype(np.float64) + eps)).astype(mean.const.dtype)
    shift = (beta.const - mean.const * scale).astype(mean.const.dtype)
    shape = [1] * rank
    shape[ctx.int("axis", 1) % rank] = scale.size
    y = ctx.op("Mul", x, ctx.constant("scale", scale.reshape(shape)))
    return ctx.op("Add", y, ctx.constant("shift", shift.reshape(shape)))


_ACTIVATIONS = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "softrelu": "Softplus",
                "softsign": "Softsign"}


@converters.register("Activation")
def _activation(ctx: Ctx):
    act = ctx.str("act_type")
    if act == "log_sigmoid":
        return ctx.op("Log", ctx.op("Sigmoid", ctx.inputs[0]))
    if act == "mish":
        return ctx.op("Mish", ctx.inputs[0])
    if act not in _ACTIVATIONS:
        return None
    return ctx.op(_ACTIVATIONS[act], ctx.inputs[0])


@converters.register("relu", "sigmoid", "tanh", "softsign", "erf", "sqrt", "exp", "log", "abs", "negative",
           "reciprocal", "floor", "ceil", "sign", "sin", "cos", "_copy", "identity", "BlockGrad", "stop_gradient",
           "rsqrt", "square", "log_sigmoid", "mish")
def _unary(ctx: Ctx):
    x = ctx.inputs[0]
    op = ctx.node.op
    simple = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "softsign": "Softsign", "erf": "Erf",
              "sqrt": "Sqrt", "exp": "Exp", "log": "Log", "abs": "Abs", "negative": "Neg", "reciprocal": "Reciprocal",
              "floor": "Floor", "ceil": "Ceil", "sign": "Sign", "sin": "Sin", "cos": "Cos", "mish": "Mish"}
    if op in simple:
        return ctx.op(simple[op], x)
    if op in ("_copy", "identity", "BlockGrad", "stop_gradient"):
        return ctx.op("Identity", x)
    if op == "rsqrt":
        return ctx.op("Reciprocal", ctx.op("Sqrt", x))
    if op == "square":
        return ctx.op("Mul", x, x)
    if op == "log_sigmoid":
        return ctx.op("Log", ctx.op("Sigmoid", x))
    return None


@converters.register("LeakyReLU")
def _leaky(ctx: Ctx):
    act = ctx.str("act_type", "leaky")
    x = ctx.inputs[0]
    slope = ctx.float("slope", 0.25)
    if act == "leaky":
        return ctx.op("LeakyRelu", x, alpha=slope)
    if act == "elu":
        return ctx.op("Elu", x, alpha=slope)
    if act == "selu":
        return ctx.op("Selu", x, alpha=SELU_ALPHA, gamma=SELU_GAMMA)
    if act == "gelu":
        return ctx.op("Gelu", x)
    if act == "prelu":
        ctx.need_inputs(2)
        gamma = ctx.inputs[1]
        rank = ctx.rank(0)
        if rank is None or gamma.shape is None:
            return None
        if len(gamma.shape) == 1 and gamma.shape[0] != 1 and rank > 2:
            # MXNet's gamma runs along the channel axis 1; ONNX PRelu broadcasts from the right
            target = (gamma.shape[0],) + (1,) * (rank - 2)
            gamma = ctx.constant("gamma", gamma.const.reshape(target)) if gamma.const is not None \
                else ctx.op("Reshape", gamma, ctx.ints("shape", target))
        return ctx.op("PRelu", x, gamma)
    return None


@converters.register("Pooling")
def _pooling(ctx: Ctx):
    if ctx.str("layout") not in (None, "None", "NCW", "NCHW", "NCDHW"):
        return None
    pool_type = ctx.str("pool_type", "max")
    x = ctx.inputs[0]
    if ctx.bool("global_pool", False):
        if pool_type == "max":
            return ctx.op("GlobalMaxPool", x)
        if pool_type == "avg":
            return ctx.op("GlobalAveragePool", x)
        if pool_type == "sum" and ctx.rank(0) is not None:
            return ctx.op("ReduceSum", x, ctx.ints("axes", list(range(2, ctx.rank(0)))), keepdims=1)
        return None
    kernel = list(ctx.tuple("kernel"))
    n = len(kernel)
    convention = ctx.str("pooling_convention", "valid")
    if convention not in ("valid", "full") or pool_type not in ("max", "avg", "sum"):
        return None  # "same" (MXNet: 1-d max only) and lp pooling stay opaque
    if pool_type == "sum":  # the padded average times the window size (windows past the pads: opaque)
        if convention != "valid":
            return None
        pad = _spatial(ctx, "pad", n, 0)
        avg = ctx.op("AveragePool", x, kernel_shape=kernel, strides=_spatial(ctx, "stride", n, 1), pads=pad + pad,
                     ceil_mode=int(convention == "full"), count_include_pad=1)
        return ctx.op("Mul", avg, ctx.scalar(float(np.prod(kernel))))
    pad = _spatial(ctx, "pad", n, 0)
    common = dict(kernel_shape=kernel, strides=_spatial(ctx, "stride", n, 1), pads=pad + pad,
                  ceil_mode=int(convention == "full"))
    if pool_type == "max":
        return ctx.op("MaxPool", x, **common)
    return ctx.op("AveragePool", x, count_include_pad=int(ctx.bool("count_include_pad", True)), **common)


@converters.register("FullyConnected")
def _fully_connected(ctx: Ctx):
    no_bias = ctx.bool("no_bias", False)
    ctx.need_inputs(2 if no_bias else 3)
    ctx.count("num_hidden", 1, 0)
    x, w = ctx.inputs[0], ctx.inputs[1]
    b = None if no_bias else ctx.inputs[2]
    rank = ctx.rank(0)
    if not ctx.bool("flatten", True) and rank is None:
        return None  # the product along the last axis needs the rank
    if ctx.bool("flatten", True) or (rank is not None and rank <= 2):
        if rank != 2:  # (also when the rank is unknown: Flatten of a matrix is the identity)
            x = ctx.op("Flatten", x, axis=1)
        return ctx.op("Gemm", x, w, b, transB=1)
    # flatten=False: the product runs along the last axis, leading axes are kept
    wt = ctx.constant("weight_t", np.ascontiguousarray(w.const.T)) if w.const is not None \
        else ctx.op("Transpose", w, perm=[1, 0])
    y = ctx.op("MatMul", x, wt)
    return y if b is None else ctx.op("Add", y, b)


_BINARY = {
    "elemwise_add": "Add", "elemwise_sub": "Sub", "elemwise_mul": "Mul", "elemwise_div": "Div",
    "broadcast_add": "Add", "broadcast_plus": "Add", "broadcast_sub": "Sub", "broadcast_minus": "Sub",
    "broadcast_mul": "Mul", "broadcast_div": "Div", "broadcast_power": "Pow", "broadcast_maximum": "Max",
    "broadcast_minimum": "Min", "_plus": "Add", "_Plus": "Add", "_add": "Add", "_minus": "Sub", "_Minus": "Sub",
    "_sub": "Sub", "_mul": "Mul", "_Mul": "Mul", "_div": "Div", "_Div": "Div", "_power": "Pow", "_Power": "Pow",
    "_maximum": "Max", "_Maximum": "Max", "_minimum": "Min", "_Minimum": "Min",
}


@converters.register(*_BINARY)
def _binary(ctx: Ctx):
    ctx.need_inputs(2)
    return ctx.op(_BINARY[ctx.node.op], ctx.inputs[0], ctx.inputs[1])


@converters.register("add_n", "ElementWiseSum", "_sum")
def _add_n(ctx: Ctx):
    return ctx.op("Sum", *ctx.inputs) if len(ctx.inputs) > 1 else ctx.op("Identity", ctx.inputs[0])


# (IR op, scalar on the right?)
_SCALAR = {"_plus_scalar": ("Add", True), "_PlusScalar": ("Add", True), "_minus_scalar": ("Sub", True),
           "_MinusScalar": ("Sub", True), "_rminus_scalar": ("Sub", False), "_RMinusScalar": ("Sub", False),
           "_mul_scalar": ("Mul", True), "_MulScalar": ("Mul", True), "_div_scalar": ("Div", True),
           "_DivScalar": ("Div", True), "_rdiv_scalar": ("Div", False), "_RDivScalar": ("Div", False),
           "_power_scalar": ("Pow", True), "_PowerScalar": ("Pow", True), "_rpower_scalar": ("Pow", False),
           "_RPowerScalar": ("Pow", False), "_maximum_scalar": ("Max", True), "_MaximumScalar": ("Max", True),
           "_minimum_scalar": ("Min", True), "_MinimumScalar": ("Min", True)}


@converters.register(*_SCALAR)
def _scalar_op(ctx: Ctx):
    op, right = _SCALAR[ctx.node.op]
    s = ctx.scalar(ctx.float("scalar", 0.0))
    x = ctx.inputs[0]
    return ctx.op(op, x, s) if right else ctx.op(op, s, x)


@converters.register("Concat", "concat")
def _concat(ctx: Ctx):
    return ctx.op("Concat", *ctx.inputs, axis=ctx.int("dim", 1))


@converters.register("Flatten", "flatten")
def _flatten(ctx: Ctx):
    return ctx.op("Flatten", ctx.inputs[0], axis=1)


def mx_reshape_shape(in_shape, spec, reverse=False) -> tuple[int, ...]:
    """MXNet's Reshape output shape with its special codes 0 (copy), -1 (infer), -2 (copy the rest),
    -3 (merge two), -4 (split one into the next two), optionally applied right to left."""
    d = list(in_shape)
    spec = list(spec)
    if reverse:
        d, spec = d[::-1], spec[::-1]
    out: list[int] = []
    src = 0
    infer = -1
    i = 0
    while i < len(spec):
        p = spec[i]
        if p == 0:
            out.append(d[src])
            src += 1
        elif p == -1:
            infer = len(out)
            out.append(1)
            src += 1
        elif p == -2:
            out.extend(d[src:])
            src = len(d)
        elif p == -3:
            out.append(d[src] * d[src + 1])
            src += 2
        elif p == -4:
            d1, d2 = spec[i + 1], spec[i + 2]
            i += 2
            if d1 == -1:
                d1 = d[src] // d2
            if d2 == -1:
                d2 = d[src] // d1
            if d1 * d2 != d[src]:
                raise ValueError(f"-4 splits dimension {d[src]} into {d1} x {d2}")
            out += [d1, d2]
            src += 1
        elif p > 0:
            out.append(p)
            src += 1
        else:
            raise ValueError(f"unknown reshape code {p}")
        i += 1
    total = int(np.prod(in_shape, dtype=np.int64))
    if infer >= 0:
        known = int(np.prod(out, dtype=np.int64))
        if known == 0 or total % known:
            raise ValueError(f"cannot infer the -1 dimension of {list(spec)} for shape {list(in_shape)}")
        out[infer] = total // known
    if int(np.prod(out, dtype=np.int64)) != total:
        raise ValueError(f"cannot reshape {list(in_shape)} to {list(spec)}")
    return tuple(out[::-1] if reverse else out)


@converters.register("Reshape", "reshape")
def _reshape(ctx: Ctx):
    target = ctx.tuple("target_shape")
    if target:  # the legacy form: one 0 is inferred; keep_highest keeps the input's first dimension
        spec = list(target)
        if ctx.bool("keep_highest", False):
            spec[0] = 0
        inferred = [i for i, d in enumerate(spec) if d == 0 and not (i == 0 and ctx.bool("keep_highest", False))]
        if len(inferred) > 1:
            return None
        for i in inferred:
            spec[i] = -1
        return ctx.op("Reshape", ctx.inputs[0], ctx.ints("shape", spec))
    if ctx.bool("keep_highest", False):
        return None
    spec = list(ctx.tuple("shape", ()))
    reverse = ctx.bool("reverse", False)
    x = ctx.inputs[0]
    simple = not reverse and all(p >= -1 for p in spec) and spec.count(-1) <= 1
    if not simple:
        s = x.shape
        if s is None or not all(isinstance(d, int) for d in s):
            return None
        try:
            spec = list(mx_reshape_shape(s, spec, reverse))
        except (ValueError, IndexError) as e:
            raise ShapeError(f"{ctx.node.describe()}: shape={ctx.str('shape')} does not fit input shape "
                             f"{list(s)}: {e}") from None
    return ctx.op("Reshape", x, ctx.ints("shape", spec))


@converters.register("transpose")
def _transpose(ctx: Ctx):
    axes = ctx.tuple("axes", ())
    return ctx.op("Transpose", ctx.inputs[0], perm=list(axes) if axes else None)


@converters.register("softmax", "log_softmax")
def _softmax(ctx: Ctx):
    if ctx.bool("use_length", False):
        return None
    x = ctx.inputs[0]
    t = ctx.float("temperature", None)
    if t is not None and t != 1.0:
        x = ctx.op("Div", x, ctx.scalar(t))
    y = ctx.op("Softmax" if ctx.node.op == "softmax" else "LogSoftmax", x, axis=ctx.int("axis", -1))
    dtype = ctx.str("dtype")
    if dtype not in (None, "None") and np.dtype(dtype).name != ctx.dtype(0):
        y = ctx.op("Cast", y, to=np.dtype(dtype).name)  # MXNet computes in the input type, returns `dtype`
    return y


@converters.register("SoftmaxActivation")
def _softmax_activation(ctx: Ctx):
    if ctx.str("mode", "instance") == "channel":
        return ctx.op("Softmax", ctx.inputs[0], axis=1)
    # instance mode: MXNet (with and without MKLDNN) takes the softmax over the last axis at any rank
    return ctx.op("Softmax", ctx.inputs[0], axis=-1)


def _swap_last(ctx: Ctx, v: Value) -> Value:
    r = len(v.shape)
    return ctx.op("Transpose", v, perm=list(range(r - 2)) + [r - 1, r - 2])


@converters.register("batch_dot")
def _batch_dot(ctx: Ctx):
    a, b = ctx.inputs
    ta, tb = ctx.bool("transpose_a", False), ctx.bool("transpose_b", False)
    if a.shape is None or b.shape is None:
        return None
    if a.shape is not None and b.shape is not None and (len(a.shape) < 3 or len(a.shape) != len(b.shape)):
        return None
    if ta:
        a = _swap_last(ctx, a)
    if tb:
        b = _swap_last(ctx, b)
    return ctx.op("MatMul", a, b)


@converters.register("dot")
def _dot(ctx: Ctx):
    a, b = ctx.inputs
    if a.shape is None or b.shape is None or len(b.shape) != 2:
        return None
    if ctx.bool("transpose_a", False):
        if len(a.shape) != 2:
            return None  # MXNet reverses every axis of an N-d operand
        a = ctx.op("Transpose", a, perm=[1, 0])
    if ctx.bool("transpose_b", False):
        b = ctx.constant("t", np.ascontiguousarray(b.const.T)) if b.const is not None \
            else ctx.op("Transpose", b, perm=[1, 0])
    return ctx.op("MatMul", a, b)


@converters.register("Dropout")
def _dropout(ctx: Ctx):
    if ctx.str("mode", "training") == "always":
        return None  # drops at inference too
    p = ctx.float("p", 0.5)
    ratio = ctx.constant("ratio", np.asarray(p, dtype=np.float32))
    if ctx.training:  # kept: MXNet drops under autograd.record(train_mode=True), with its own RNG
        return ctx.op("Dropout", ctx.inputs[0], ratio, ctx.constant("training_mode", np.asarray(True)))
    return ctx.op("Dropout", ctx.inputs[0], ratio)


@converters.register("Embedding")
def _embedding(ctx: Ctx):
    ctx.need_inputs(2)
    idx = ctx.inputs[0]
    if idx.dtype is None or not np.issubdtype(np.dtype(idx.dtype), np.integer):
        idx = ctx.op("Cast", idx, to="int64")
    out = ctx.op("Gather", ctx.inputs[1], idx, axis=0)
    # remembered so the exporter writes an Embedding again (it clips indices where Gather wraps negatives)
    out.producer.meta["mxnet_op"] = "Embedding"
    return out


@converters.register("clip")
def _clip(ctx: Ctx):
    lo, hi = ctx.float("a_min"), ctx.float("a_max")
    return ctx.op("Clip", ctx.inputs[0], ctx.scalar(lo), ctx.scalar(hi))


@converters.register("SliceChannel", "split")
def _split(ctx: Ctx):
    if get_schema("Split") is None:
        return None
    x = ctx.inputs[0]
    n = ctx.int("num_outputs")
    rank = ctx.rank(0)
    if rank is None or x.shape is None:
        return None
    axis = ctx.int("axis", 1) % rank
    size = x.shape[axis]
    if not isinstance(size, int) or size % n:
        return None
    outs = ctx.op("Split", x, ctx.ints("split", [size // n] * n), axis=axis, outputs=n) if n > 1 \
        else [ctx.op("Identity", x)]
    if ctx.bool("squeeze_axis", False):
        if size // n != 1:
            raise ShapeError(f"{ctx.node.describe()}: squeeze_axis needs parts of size 1 along axis {axis}, "
                             f"got {size // n}")
        outs = [ctx.op("Squeeze", o, ctx.ints("axes", [axis])) for o in outs]
    return outs


@converters.register("expand_dims")
def _expand_dims(ctx: Ctx):
    if ctx.rank(0) is None:
        return None
    return ctx.op("Unsqueeze", ctx.inputs[0], ctx.ints("axes", [ctx.int("axis")]))


@converters.register("squeeze")
def _squeeze(ctx: Ctx):
    axes = ctx.tuple("axis", None)
    s = ctx.shape(0)
    if axes is None and s is not None and all(isinstance(d, int) for d in s):
        axes = [i for i, d in enumerate(s) if d == 1]  # explicit axes: the ONNX form every runtime takes
        if len(axes) == len(s):
            axes = axes[1:]  # MXNet keeps one axis of an all-ones shape (no 0-d arrays)
    return ctx.op("Squeeze", ctx.inputs[0], None if axes is None else ctx.ints("axes", axes))


@converters.register("slice_axis")
def _slice_axis(ctx: Ctx):
    if get_schema("Slice") is None:
        return None
    if ctx.static(0) is None:
        return None
    axis, begin, end = ctx.int("axis"), ctx.int("begin", 0), ctx.int("end", None)
    end = np.iinfo(np.int64).max if end is None else end
    return ctx.op("Slice", ctx.inputs[0], ctx.ints("starts", [begin]), ctx.ints("ends", [end]),
                  ctx.ints("axes", [axis]))


@converters.register("slice", "crop")
def _slice(ctx: Ctx):
    if get_schema("Slice") is None:
        return None
    if ctx.static(0) is None:
        return None
    begin = ctx.tuple("begin", (), allow_none=True)
    end = ctx.tuple("end", (), allow_none=True)
    step = ctx.tuple("step", (), allow_none=True) or (None,) * len(begin)
    if len(end) != len(begin) or len(step) != len(begin):
        return None
    big = np.iinfo(np.int64).max
    starts, ends, axes, steps = [], [], [], []
    for ax, (b, e, s) in enumerate(zip(begin, end, step)):
        s = 1 if s is None else s
        if s == 0:
            return None
        if s < 0:  # None runs from the last element down past the first, as ONNX's clamped sentinels do
            starts.append(big if b is None else b)
            ends.append(-big if e is None else e)
        else:
            starts.append(0 if b is None else b)
            ends.append(big if e is None else e)
        axes.append(ax)
        steps.append(s)
    return ctx.op("Slice", ctx.inputs[0], ctx.ints("starts", starts), ctx.ints("ends", ends),
                  ctx.ints("axes", axes), ctx.ints("steps", steps))


@converters.register("Cast", "cast")
def _cast(ctx: Ctx):
    return ctx.op("Cast", ctx.inputs[0], to=np.dtype(ctx.str("dtype")).name)


@converters.register("where")
def _where(ctx: Ctx):
    if any(ctx.static(i) is None for i in range(3)):
        return None
    cond = ctx.op("Cast", ctx.inputs[0], to="bool")
    return ctx.op("Where", cond, ctx.inputs[1], ctx.inputs[2])


@converters.register("broadcast_to")
def _broadcast_to(ctx: Ctx):
    shape = list(ctx.tuple("shape"))
    s = ctx.shape(0)
    if s is None or len(s) != len(shape):
        return None
    # MXNet's 0 keeps the input's size
    target = [s[i] if d == 0 else d for i, d in enumerate(shape)]
    if not all(isinstance(d, int) for d in target):
        return None
    return ctx.op("Expand", ctx.inputs[0], ctx.ints("shape", target))


@converters.register("broadcast_axis", "broadcast_axes")
def _broadcast_axis(ctx: Ctx):
    s = ctx.shape(0)
    axes, sizes = ctx.tuple("axis", ()), ctx.tuple("size", ())
    if s is None or len(axes) != len(sizes):
        return None
    target = list(s)
    for a, n in zip(axes, sizes):
        target[a % len(s)] = n
    if not all(isinstance(d, int) for d in target):
        return None
    return ctx.op("Expand", ctx.inputs[0], ctx.ints("shape", target))
