"""The MXNet op converters, registered in the importer's table (`importer.converters`).

Each converter takes a `Ctx` and returns the IR values of the node's outputs, or None where MXNet's
semantics need information it does not have (usually a static shape); the node then stays opaque and
round-trips. The vision-zoo / BERT core first (convolution, normalization, activations, dense layers,
elementwise and shape ops), then the ops MXNet models use beyond it: upsampling, instance/group/L2
normalization and norms (decomposed into ONNX reductions), comparisons, padding, cropping and slicing by
another tensor, tiling and repeating, stacking, the loss heads' inference forms (SoftmaxOutput is a
softmax, MakeLoss / regression outputs are the identity or a sigmoid), and creation ops (`_zeros`,
`_arange`, ...) that become constants where their shape is static.
"""
from __future__ import annotations

import numpy as np

from aiacc.core.ir import Value
from aiacc.core.ops import get_schema
from aiacc.errors import AiaccError, ShapeError
from aiacc.plugins.mxnet.importer import SELU_ALPHA, SELU_GAMMA, Ctx, converters
from aiacc.plugins.mxnet.symjson import attr_bool

_BIG = np.iinfo(np.int64).max

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
        gamma = ctx.constant("gamma_fixed", np.ones(mean.shape, dtype=ctx.dtype(3)))
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


@converters.register("LayerNorm")
def _layernorm(ctx: Ctx):
    ctx.need_inputs(3)
    rank = ctx.rank(0)
    axis = ctx.int("axis", -1)
    if (axis != -1 and rank is None) or ctx.bool("output_mean_var", False):
        return None
    if axis == -1 or axis % rank == rank - 1:
        return ctx.op("LayerNormalization", *ctx.inputs, axis=-1, epsilon=ctx.float("eps", 1e-5))
    # another axis (e.g. channels of NCHW): normalize along it alone, scale and shift along it
    x, gamma, beta = ctx.inputs
    y = _normalize(ctx, x, [axis % rank], ctx.float("eps", 1e-5))
    y = ctx.op("Mul", y, along_axis(ctx, gamma, rank, axis % rank, "gamma"))
    return ctx.op("Add", y, along_axis(ctx, beta, rank, axis % rank, "beta"))


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
    return ctx.op("Dropout", ctx.inputs[0], ctx.constant("ratio", np.asarray(p, dtype=np.float32)))


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


# -- reductions ----------------------------------------------------------------------------------------

def along_axis(ctx: Ctx, v: Value, rank: int, axis: int, suffix: str) -> Value:
    """A 1-d per-channel value shaped to broadcast along `axis` of a rank-`rank` tensor."""
    target = [1] * rank
    target[axis] = -1
    if v.const is not None:
        return ctx.constant(suffix, v.const.reshape([v.const.size if d == -1 else 1 for d in target]))
    return ctx.op("Reshape", v, ctx.ints(f"{suffix}_shape", target))


def as_mx_scalar(ctx: Ctx, y: Value) -> Value:
    """MXNet 1.x has no 0-d arrays: a reduction over every axis gives shape (1,)."""
    return ctx.op("Reshape", y, ctx.ints("shape1", [1]))


def reduce_axes(ctx: Ctx) -> tuple[list[int] | None, bool] | None:
    """(axes or None for all, whether every axis is reduced) of an MXNet reduction with `axis` and
    `exclude`; None when that depends on a rank that is unknown."""
    axes = ctx.tuple("axis", None)
    rank = ctx.rank(0)
    exclude = ctx.bool("exclude", False)
    if not axes:
        return (None, True) if not exclude else None  # axis=() reduces everything
    if rank is None:
        return None if exclude else (list(axes), False)
    kept = sorted({a % rank for a in axes})
    if exclude:
        kept = [a for a in range(rank) if a not in kept]
    return kept, len(kept) == rank


_REDUCE = {"mean": "ReduceMean", "sum": "ReduceSum", "max": "ReduceMax", "min": "ReduceMin"}


@converters.register(*_REDUCE)
def _reduce(ctx: Ctx):
    plan = reduce_axes(ctx)
    if plan is None:
        return None
    axes, everything = plan
    if axes == []:
        return ctx.op("Identity", ctx.inputs[0])
    keep = int(ctx.bool("keepdims", False))
    y = ctx.op(_REDUCE[ctx.node.op], ctx.inputs[0], None if axes is None else ctx.ints("axes", axes), keepdims=keep)
    return as_mx_scalar(ctx, y) if everything and not keep else y


# -- upsampling and normalization ---------------------------------------------------------------------

@converters.register("UpSampling")
def _upsampling(ctx: Ctx):
    scale = ctx.int("scale", 1)
    kind = ctx.str("sample_type", "nearest")
    if kind == "nearest":
        if len(ctx.inputs) != 1 or ctx.rank(0) != 4 or ctx.static(0) is None:
            return None  # several inputs are resized to the first one's size and concatenated or summed
        scales = ctx.constant("scales", np.asarray([1, 1, scale, scale], dtype=np.float32))
        # each input pixel repeated scale x scale times: out[i] = in[floor(i / scale)]
        return ctx.op("Resize", ctx.inputs[0], None, scales, mode="nearest",
                      coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    if kind == "bilinear":
        if len(ctx.inputs) != 2 or ctx.rank(0) != 4:
            return None
        # what MXNet runs: a depthwise Deconvolution with the given (num_filter, 1, k, k) weight
        num_filter = ctx.int("num_filter", None) or (ctx.shape(0)[1] if ctx.shape(0) else None)
        if not isinstance(num_filter, int):
            return None
        k = 2 * scale - scale % 2
        pad = int(np.ceil((scale - 1) / 2.0))
        return ctx.op("ConvTranspose", ctx.inputs[0], ctx.inputs[1], None, kernel_shape=[k, k],
                      strides=[scale, scale], pads=[pad] * 4, group=num_filter)
    return None


@converters.register("_contrib_BilinearResize2D")
def _bilinear_resize(ctx: Ctx):
    """Bilinear resizing to a given size (mode "size" with height and width, or "like"): ONNX linear
    Resize with align_corners (MXNet's default) or half_pixel coordinates."""
    s = ctx.static(0)
    mode = ctx.str("mode", "size")
    if s is None or len(s) != 4:
        return None
    if mode == "like" and len(ctx.inputs) == 2 and ctx.static(1) is not None:
        h, w = ctx.static(1)[2:]
    elif mode == "size" and len(ctx.inputs) == 1 and ctx.float("scale_height") is None \
            and ctx.float("scale_width") is None:
        h, w = ctx.int("height", 1), ctx.int("width", 1)
    else:
        return None
    ctm = "align_corners" if ctx.bool("align_corners", True) else "half_pixel"
    return ctx.op("Resize", ctx.inputs[0], None, None, ctx.ints("sizes", [s[0], s[1], h, w]), mode="linear",
                  coordinate_transformation_mode=ctm)


def _normalize(ctx: Ctx, x: Value, axes: list[int], eps: float) -> Value:
    """(x - mean) / sqrt(var + eps) over `axes` (biased variance, as MXNet computes it)."""
    ax = ctx.ints("axes", axes)
    mean = ctx.op("ReduceMean", x, ax, keepdims=1)
    d = ctx.op("Sub", x, mean)
    var = ctx.op("ReduceMean", ctx.op("Mul", d, d), ax, keepdims=1)
    return ctx.op("Div", d, ctx.op("Sqrt", ctx.op("Add", var, ctx.scalar(eps))))


@converters.register("InstanceNorm")
def _instance_norm(ctx: Ctx):
    ctx.need_inputs(3)
    rank = ctx.rank(0)
    if rank is None or rank < 3:
        return None
    x, gamma, beta = ctx.inputs
    y = _normalize(ctx, x, list(range(2, rank)), ctx.float("eps", 1e-3))
    y = ctx.op("Mul", y, along_axis(ctx, gamma, rank, 1, "gamma"))
    return ctx.op("Add", y, along_axis(ctx, beta, rank, 1, "beta"))


@converters.register("GroupNorm")
def _group_norm(ctx: Ctx):
    ctx.need_inputs(3)
    s = ctx.static(0)
    groups = ctx.int("num_groups", 1)
    if s is None or len(s) < 3 or s[1] % groups or ctx.bool("output_mean_var", False):
        return None
    x, gamma, beta = ctx.inputs
    if gamma.shape is None or beta.shape is None or len(gamma.shape) != 1:
        return None
    grouped = ctx.op("Reshape", x, ctx.ints("grouped", [s[0], groups, -1]))
    y = ctx.op("Reshape", _normalize(ctx, grouped, [2], ctx.float("eps", 1e-5)), ctx.ints("shape", s))
    # MXNet 1.x scales per group (gamma has num_groups entries); per channel where it has C entries
    n = gamma.shape[0]
    if n == s[1]:
        return ctx.op("Add", ctx.op("Mul", y, along_axis(ctx, gamma, len(s), 1, "gamma")),
                      along_axis(ctx, beta, len(s), 1, "beta"))
    if n != groups:
        return None
    y = ctx.op("Reshape", y, ctx.ints("grouped2", [s[0], groups, -1]))
    y = ctx.op("Add", ctx.op("Mul", y, along_axis(ctx, gamma, 3, 1, "gamma")), along_axis(ctx, beta, 3, 1, "beta"))
    return ctx.op("Reshape", y, ctx.ints("shape2", s))


@converters.register("_contrib_AdaptiveAvgPooling2D")
def _adaptive_avg_pool(ctx: Ctx):
    """Adaptive average pooling to output_size: a global average for 1x1, a plain average pool where the
    input divides evenly (every window then has the same size); other sizes stay opaque."""
    s = ctx.static(0)
    size = ctx.tuple("output_size", (1,))
    if s is None or len(s) != 4:
        return None
    out = (size[0], size[0]) if len(size) == 1 else tuple(size)
    if out == (1, 1):
        return ctx.op("GlobalAveragePool", ctx.inputs[0])
    if len(out) != 2 or any(o <= 0 or i % o for i, o in zip(s[2:], out)):
        return None
    kernel = [s[2] // out[0], s[3] // out[1]]
    return ctx.op("AveragePool", ctx.inputs[0], kernel_shape=kernel, strides=kernel, pads=[0, 0, 0, 0])


@converters.register("_contrib_SyncBatchNorm")
def _sync_batchnorm(ctx: Ctx):
    """At inference a SyncBatchNorm is a BatchNorm (moving statistics; same attribute defaults)."""
    return _batchnorm(ctx)


@converters.register("L2Normalization")
def _l2_normalization(ctx: Ctx):
    rank = ctx.rank(0)
    mode = ctx.str("mode", "instance")
    if rank is None or rank < 2:
        return None
    axes = {"instance": list(range(1, rank)), "channel": [1], "spatial": list(range(2, rank))}.get(mode)
    if not axes:
        return None
    x = ctx.inputs[0]
    sq = ctx.op("ReduceSum", ctx.op("Mul", x, x), ctx.ints("axes", axes), keepdims=1)
    norm = ctx.op("Sqrt", ctx.op("Add", sq, ctx.scalar(ctx.float("eps", 1e-10))))
    return ctx.op("Div", x, norm)


@converters.register("norm")
def _norm(ctx: Ctx):
    order = ctx.int("ord", 2)
    if order not in (1, 2) or ctx.str("out_dtype") not in (None, "None"):
        return None
    plan = reduce_axes(ctx)
    if plan is None:
        return None
    axes, everything = plan
    x = ctx.inputs[0]
    keep = int(ctx.bool("keepdims", False))
    ax = None if axes is None else ctx.ints("axes", axes)
    if order == 1:
        y = ctx.op("ReduceSum", ctx.op("Abs", x), ax, keepdims=keep)
    else:
        y = ctx.op("Sqrt", ctx.op("ReduceSum", ctx.op("Mul", x, x), ax, keepdims=keep))
    return as_mx_scalar(ctx, y) if everything and not keep else y


@converters.register("LRN")
def _lrn(ctx: Ctx):
    # MXNet: x / (knorm + alpha / nsize * sum of squares over nsize channels) ^ beta, as ONNX LRN
    return ctx.op("LRN", ctx.inputs[0], size=ctx.int("nsize"), alpha=ctx.float("alpha", 1e-4),
                  beta=ctx.float("beta", 0.75), bias=ctx.float("knorm", 2.0))


@converters.register("hard_sigmoid")
def _hard_sigmoid(ctx: Ctx):
    return ctx.op("HardSigmoid", ctx.inputs[0], alpha=ctx.float("alpha", 0.2), beta=ctx.float("beta", 0.5))


# -- loss heads at inference --------------------------------------------------------------------------

@converters.register("SoftmaxOutput", "Softmax")
def _softmax_output(ctx: Ctx):
    """The forward of SoftmaxOutput: a softmax (the label only matters for the gradient)."""
    x = ctx.inputs[0]
    rank = ctx.rank(0)
    if rank is None:
        return None
    if ctx.bool("multi_output", False):
        return ctx.op("Softmax", x, axis=1)
    if ctx.bool("preserve_shape", False) or rank <= 2:
        return ctx.op("Softmax", x, axis=-1)
    s = ctx.static(0)
    if s is None or rank == 4:
        return None  # 4-d: MKLDNN builds take the softmax over the last axis, others over all but N
    flat = ctx.op("Reshape", x, ctx.ints("flat", [s[0], -1]))
    return ctx.op("Reshape", ctx.op("Softmax", flat, axis=-1), ctx.ints("shape", s))


@converters.register("MakeLoss", "make_loss", "LinearRegressionOutput", "MAERegressionOutput")
def _identity_head(ctx: Ctx):
    return ctx.op("Identity", ctx.inputs[0])


@converters.register("LogisticRegressionOutput")
def _logistic_head(ctx: Ctx):
    return ctx.op("Sigmoid", ctx.inputs[0])


# -- comparisons ----------------------------------------------------------------------------------------

_COMPARE = {"equal": ("Equal", False), "not_equal": ("Equal", True), "greater": ("Greater", False),
            "greater_equal": ("GreaterOrEqual", False), "lesser": ("Less", False),
            "lesser_equal": ("LessOrEqual", False)}
_COMPARE_OPS = {}
for _k, _v in _COMPARE.items():
    _COMPARE_OPS[f"broadcast_{_k}"] = _v + (False,)
    _COMPARE_OPS[f"_{_k}"] = _v + (False,)
    _COMPARE_OPS[f"_{_k}_scalar"] = _v + (True,)


@converters.register(*_COMPARE_OPS)
def _compare(ctx: Ctx):
    """MXNet comparisons give 0/1 in the input's dtype (no Not: MXNet cannot negate a bool tensor)."""
    op, negate, scalar = _COMPARE_OPS[ctx.node.op]
    a = ctx.inputs[0]
    b = ctx.scalar(ctx.float("scalar", 0.0)) if scalar else ctx.inputs[1]
    r = ctx.op("Cast", ctx.op(op, a, b), to=np.dtype(ctx.dtype(0)).name)
    return ctx.op("Sub", ctx.scalar(1.0), r) if negate else r


@converters.register("logical_not")
def _logical_not(ctx: Ctx):
    r = ctx.op("Equal", ctx.inputs[0], ctx.scalar(0.0))
    return ctx.op("Cast", r, to=np.dtype(ctx.dtype(0)).name)


# -- shapes: broadcasting, slicing, padding, stacking ----------------------------------------------------

@converters.register("broadcast_like")
def _broadcast_like(ctx: Ctx):
    a, b = ctx.static(0), ctx.static(1)
    if a is None or b is None:
        return None
    lhs, rhs = ctx.tuple("lhs_axes", None), ctx.tuple("rhs_axes", None)
    if lhs is None and rhs is None:
        if len(a) != len(b):
            return None
        target = list(b)
    else:
        if lhs is None or rhs is None or len(lhs) != len(rhs):
            return None
        target = list(a)
        for i, j in zip(lhs, rhs):
            target[i % len(a)] = b[j % len(b)]
    return ctx.op("Expand", ctx.inputs[0], ctx.ints("shape", target))


@converters.register("slice_like")
def _slice_like(ctx: Ctx):
    a, b = ctx.static(0), ctx.static(1)
    if a is None or b is None:
        return None
    axes = ctx.tuple("axes", ())
    axes = [x % len(a) for x in axes] if axes else list(range(min(len(a), len(b))))
    if any(ax >= len(b) for ax in axes):
        return None
    return ctx.op("Slice", ctx.inputs[0], ctx.ints("starts", [0] * len(axes)),
                  ctx.ints("ends", [b[ax] for ax in axes]), ctx.ints("axes", axes))


@converters.register("Crop", "crop_like")
def _crop(ctx: Ctx):
    s = ctx.static(0)
    if s is None or len(s) != 4:
        return None
    if len(ctx.inputs) >= 2:
        like = ctx.static(1)
        if like is None:
            return None
        h, w = like[2], like[3]
    else:
        hw = ctx.tuple("h_w", (0, 0))
        h, w = hw
    if ctx.bool("center_crop", False):
        oy, ox = (s[2] - h) // 2, (s[3] - w) // 2
    else:
        oy, ox = ctx.tuple("offset", (0, 0))
    if h <= 0 or w <= 0 or oy + h > s[2] or ox + w > s[3]:
        raise ShapeError(f"{ctx.node.describe()}: a {h}x{w} crop at ({oy}, {ox}) does not fit input {list(s)}")
    return ctx.op("Slice", ctx.inputs[0], ctx.ints("starts", [oy, ox]), ctx.ints("ends", [oy + h, ox + w]),
                  ctx.ints("axes", [2, 3]))


@converters.register("Pad", "pad")
def _pad(ctx: Ctx):
    mode = ctx.str("mode", "constant")
    width = ctx.tuple("pad_width", ())
    rank = ctx.rank(0)
    if ctx.static(0) is None:
        return None
    if mode not in ("constant", "edge", "reflect") or rank is None or len(width) != 2 * rank:
        return None
    pads = list(width[0::2]) + list(width[1::2])  # MXNet: (before, after) per axis; ONNX: befores, afters
    value = ctx.constant("value", np.asarray(ctx.float("constant_value", 0.0), dtype=ctx.dtype(0)))
    return ctx.op("Pad", ctx.inputs[0], ctx.ints("pads", pads), value if mode == "constant" else None, mode=mode)


@converters.register("tile")
def _tile(ctx: Ctx):
    reps = list(ctx.tuple("reps", ()))
    rank = ctx.rank(0)
    if rank is None or not reps:
        return None
    x = ctx.inputs[0]
    if len(reps) > rank:  # the input gains leading axes of size 1
        x = ctx.op("Unsqueeze", x, ctx.ints("axes", list(range(len(reps) - rank))))
    reps = [1] * (max(rank, len(reps)) - len(reps)) + reps  # short reps apply to the trailing axes
    return ctx.op("Tile", x, ctx.ints("repeats", reps))


@converters.register("repeat")
def _repeat(ctx: Ctx):
    s = ctx.static(0)
    r = ctx.int("repeats")
    axis = ctx.int("axis", None)
    if s is None or r is None or r < 1:
        return None
    x = ctx.inputs[0]
    if axis is None:  # MXNet repeats the flattened input
        x = ctx.op("Reshape", x, ctx.ints("flat", [-1]))
        s, axis = (int(np.prod(s, dtype=np.int64)),), 0
    axis %= len(s)
    # each element repeated in place: (.., d, 1, ..) -> (.., d, r, ..) -> (.., d * r, ..)
    u = ctx.op("Unsqueeze", x, ctx.ints("axes", [axis + 1]))
    e = ctx.op("Expand", u, ctx.ints("expand", list(s[:axis + 1]) + [r] + list(s[axis + 1:])))
    return ctx.op("Reshape", e, ctx.ints("shape", list(s[:axis]) + [s[axis] * r] + list(s[axis + 1:])))


@converters.register("stack")
def _stack(ctx: Ctx):
    rank = ctx.rank(0)
    axis = ctx.int("axis", 0)
    if rank is None:
        return None
    if axis < 0:
        axis += rank + 1
    parts = [ctx.op("Unsqueeze", v, ctx.ints("axes", [axis])) for v in ctx.inputs]
    return ctx.op("Concat", *parts, axis=axis)


@converters.register("SwapAxis", "swapaxes")
def _swap_axis(ctx: Ctx):
    rank = ctx.rank(0)
    if rank is None:
        return None
    perm = list(range(rank))
    a, b = ctx.int("dim1", 0) % rank, ctx.int("dim2", 0) % rank
    perm[a], perm[b] = perm[b], perm[a]
    return ctx.op("Transpose", ctx.inputs[0], perm=perm)


@converters.register("reverse", "flip")
def _reverse(ctx: Ctx):
    axes = ctx.tuple("axis", ())
    if not axes or ctx.static(0) is None:
        return None
    n = len(axes)
    return ctx.op("Slice", ctx.inputs[0], ctx.ints("starts", [-1] * n), ctx.ints("ends", [-_BIG] * n),
                  ctx.ints("axes", list(axes)), ctx.ints("steps", [-1] * n))


@converters.register("reshape_like")
def _reshape_like(ctx: Ctx):
    a, b = ctx.static(0), ctx.static(1)
    if a is None or b is None or any(ctx.str(k) not in (None, "None") for k in
                                     ("lhs_begin", "lhs_end", "rhs_begin", "rhs_end")):
        return None
    return ctx.op("Reshape", ctx.inputs[0], ctx.ints("shape", b))


@converters.register("depth_to_space", "space_to_depth")
def _depth_space(ctx: Ctx):
    s = ctx.static(0)
    b = ctx.int("block_size")
    if s is None or len(s) != 4 or not b:
        return None
    n, c, h, w = s
    x = ctx.inputs[0]
    if ctx.node.op == "depth_to_space":  # MXNet's (DCR) order
        if c % (b * b):
            return None
        t = ctx.op("Reshape", x, ctx.ints("split", [n, b, b, c // (b * b), h, w]))
        t = ctx.op("Transpose", t, perm=[0, 3, 4, 1, 5, 2])
        return ctx.op("Reshape", t, ctx.ints("shape", [n, c // (b * b), h * b, w * b]))
    if h % b or w % b:
        return None
    t = ctx.op("Reshape", x, ctx.ints("split", [n, c, h // b, b, w // b, b]))
    t = ctx.op("Transpose", t, perm=[0, 3, 5, 1, 2, 4])
    return ctx.op("Reshape", t, ctx.ints("shape", [n, c * b * b, h // b, w // b]))


@converters.register("_split_v2")
def _split_v2(ctx: Ctx):
    s = ctx.static(0)
    if s is None:
        return None
    axis = ctx.int("axis", 0) % len(s)
    size = s[axis]
    idx = ctx.tuple("indices", ())
    sections = ctx.int("sections", 0)
    if sections:
        if size % sections:
            return None
        bounds = [size // sections * k for k in range(sections)] + [size]
    else:
        bounds = [i % size if i < 0 else i for i in idx] + [size]
        if bounds[0] != 0:
            bounds = [0] + bounds
    sizes = [bounds[k + 1] - bounds[k] for k in range(len(bounds) - 1)]
    if any(n < 0 for n in sizes):
        return None
    if any(n == 0 for n in sizes):
        return None  # empty parts: keep MXNet's own handling
    outs = ctx.op("Split", ctx.inputs[0], ctx.ints("split", sizes), axis=axis, outputs=len(sizes)) \
        if len(sizes) > 1 else [ctx.op("Identity", ctx.inputs[0])]
    if ctx.bool("squeeze_axis", False):
        if any(n != 1 for n in sizes):
            return None
        outs = [ctx.op("Squeeze", o, ctx.ints("axes", [axis])) for o in outs]
    return outs


@converters.register("_contrib_div_sqrt_dim")
def _div_sqrt_dim(ctx: Ctx):
    s = ctx.shape(0)
    if s is None or not isinstance(s[-1], int):
        return None
    return ctx.op("Div", ctx.inputs[0], ctx.scalar(float(np.sqrt(s[-1]))))


@converters.register("_rnn_param_concat")
def _rnn_param_concat(ctx: Ctx):
    return ctx.op("Concat", *ctx.inputs, axis=ctx.int("dim", 1))


@converters.register("amp_cast")
def _amp_cast(ctx: Ctx):
    return ctx.op("Cast", ctx.inputs[0], to=np.dtype(ctx.str("dtype")).name)


@converters.register("take")
def _take(ctx: Ctx):
    """take with MXNet's default mode "clip" (indices clamped into range) or "wrap" (indices modulo the
    axis size); "raise" stays opaque."""
    mode = ctx.str("mode", "clip")
    data = ctx.static(0)
    if data is None or mode not in ("clip", "wrap"):
        return None
    idx = ctx.inputs[1]
    if idx.dtype is None or not np.issubdtype(np.dtype(idx.dtype), np.integer):
        idx = ctx.op("Cast", idx, to="int64")
    axis = ctx.int("axis", 0) % len(data)
    n = data[axis]
    if mode == "clip":
        idx = ctx.op("Clip", idx, ctx.constant("lo", np.asarray(0, dtype=idx.dtype)),
                     ctx.constant("hi", np.asarray(n - 1, dtype=idx.dtype)))
    else:
        idx = ctx.op("Mod", idx, ctx.constant("n", np.asarray(n, dtype=idx.dtype)))
    return ctx.op("Gather", ctx.inputs[0], idx, axis=axis)


@converters.register("argmax", "argmin")
def _argmax(ctx: Ctx):
    axis = ctx.int("axis", None)
    rank = ctx.rank(0)
    if axis is None or rank is None:
        return None  # MXNet then takes the arg over the flattened input
    op = "ArgMax" if ctx.node.op == "argmax" else "ArgMin"
    r = ctx.op(op, ctx.inputs[0], axis=axis % rank, keepdims=int(ctx.bool("keepdims", False)))
    return ctx.op("Cast", r, to=np.dtype(ctx.dtype(0)).name)  # MXNet gives float indices


# -- creation ops: constants where the shape is static ----------------------------------------------

def _dtype_attr(ctx: Ctx, default: str = "float32") -> str:
    d = ctx.str("dtype", default)
    return np.dtype(default if d in (None, "None") else d).name


@converters.register("_zeros", "_ones", "_full")
def _filled(ctx: Ctx):
    shape = ctx.tuple("shape", ())
    if not shape or any(d <= 0 for d in shape) or ctx.inputs:
        return None  # 0 = a size MXNet infers from the consumers: keep the node (its type is inferred)
    fill = {"_zeros": 0.0, "_ones": 1.0}.get(ctx.node.op)
    fill = ctx.float("value", 0.0) if fill is None else fill
    return ctx.constant("value", np.full(shape, fill, dtype=_dtype_attr(ctx)))


@converters.register("zeros_like", "ones_like")
def _filled_like(ctx: Ctx):
    s = ctx.static(0)
    if s is None:
        return None
    fill = 0 if ctx.node.op == "zeros_like" else 1
    return ctx.constant("value", np.full(s, fill, dtype=ctx.dtype(0)))


@converters.register("_arange")
def _arange(ctx: Ctx):
    if ctx.bool("infer_range", False) or ctx.inputs:
        return None
    start, stop, step = ctx.float("start", 0.0), ctx.float("stop", None), ctx.float("step", 1.0)
    if stop is None:
        start, stop = 0.0, start
    values = np.arange(start, stop, step, dtype=np.float64)
    values = np.repeat(values, ctx.int("repeat", 1) or 1)
    return ctx.constant("value", values.astype(_dtype_attr(ctx)))


# -- the numpy-interface ops (mx.np / npx.set_np blocks) whose semantics equal the classic ones ----------

_NP_BINARY = {"_npi_add": "Add", "_npi_subtract": "Sub", "_npi_multiply": "Mul", "_npi_true_divide": "Div",
              "_npi_maximum": "Max", "_npi_minimum": "Min", "_npi_power": "Pow"}
_NP_SCALAR = {"_npi_add_scalar": ("Add", True), "_npi_subtract_scalar": ("Sub", True),
              "_npi_rsubtract_scalar": ("Sub", False), "_npi_multiply_scalar": ("Mul", True),
              "_npi_true_divide_scalar": ("Div", True), "_npi_rtrue_divide_scalar": ("Div", False),
              "_npi_power_scalar": ("Pow", True), "_npi_rpower_scalar": ("Pow", False),
              "_npi_maximum_scalar": ("Max", True), "_npi_minimum_scalar": ("Min", True)}
_NP_UNARY = {"_npx_relu": "Relu", "_npx_sigmoid": "Sigmoid", "_npi_tanh": "Tanh", "_npi_exp": "Exp",
             "_npi_log": "Log", "_npi_sqrt": "Sqrt", "_npi_absolute": "Abs", "_npi_negative": "Neg"}


def _floats(ctx: Ctx) -> bool:
    """numpy type promotion equals the classic ops' only when every input has one floating dtype."""
    dtypes = {v.dtype for v in ctx.inputs}
    return len(dtypes) == 1 and None not in dtypes and np.issubdtype(np.dtype(dtypes.pop()), np.floating)


@converters.register(*_NP_BINARY)
def _np_binary(ctx: Ctx):
    if len(ctx.inputs) != 2 or not _floats(ctx):
        return None
    return ctx.op(_NP_BINARY[ctx.node.op], ctx.inputs[0], ctx.inputs[1])


@converters.register(*_NP_SCALAR)
def _np_scalar(ctx: Ctx):
    if not _floats(ctx):
        return None
    op, right = _NP_SCALAR[ctx.node.op]
    s = ctx.scalar(ctx.float("scalar", 0.0))
    return ctx.op(op, ctx.inputs[0], s) if right else ctx.op(op, s, ctx.inputs[0])


@converters.register(*_NP_UNARY)
def _np_unary(ctx: Ctx):
    if not _floats(ctx):
        return None
    return ctx.op(_NP_UNARY[ctx.node.op], ctx.inputs[0])


@converters.register("_contrib_arange_like")
def _arange_like(ctx: Ctx):
    """start + step * (i // repeat) over the input's shape, or along one axis of it: a constant where the
    shape is static (MXNet gives float32)."""
    s = ctx.static(0)
    if s is None:
        return None
    axis = ctx.int("axis", None)
    shape = (s[axis % len(s)],) if axis is not None else s
    n = int(np.prod(shape, dtype=np.int64))
    repeat = ctx.int("repeat", 1) or 1
    values = ctx.float("start", 0.0) + ctx.float("step", 1.0) * (np.arange(n) // repeat)
    return ctx.constant("value", values.reshape(shape).astype(np.float32))


# -- sequence ops without lengths (a sequence_length input makes them data-dependent: opaque) -------------

@converters.register("SequenceMask")
def _sequence_mask(ctx: Ctx):
    if ctx.bool("use_sequence_length", False):
        return None
    return ctx.op("Identity", ctx.inputs[0])  # every step is within the (full) length


@converters.register("SequenceLast")
def _sequence_last(ctx: Ctx):
    if ctx.bool("use_sequence_length", False) or ctx.static(0) is None:
        return None
    axis = ctx.int("axis", 0) % len(ctx.static(0))
    last = ctx.op("Slice", ctx.inputs[0], ctx.ints("starts", [-1]), ctx.ints("ends", [_BIG]), ctx.ints("axes", [axis]))
    return ctx.op("Squeeze", last, ctx.ints("axes", [axis]))


@converters.register("SequenceReverse")
def _sequence_reverse(ctx: Ctx):
    if ctx.bool("use_sequence_length", False) or ctx.static(0) is None:
        return None
    return ctx.op("Slice", ctx.inputs[0], ctx.ints("starts", [-1]), ctx.ints("ends", [-_BIG]), ctx.ints("axes", [0]),
                  ctx.ints("steps", [-1]))


@converters.register("shape_array")
def _shape_array(ctx: Ctx):
    return ctx.op("Shape", ctx.inputs[0])  # both int64
