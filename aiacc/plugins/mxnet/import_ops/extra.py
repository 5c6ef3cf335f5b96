"""The converters of the MXNet ops models use beyond the core (`basic`): reductions, upsampling,
instance/group/layer/L2 normalization and norms (decomposed into ONNX reductions), the loss heads'
inference forms (SoftmaxOutput is a softmax, MakeLoss / regression outputs are the identity or a sigmoid),
comparisons, padding, cropping and slicing by another tensor, tiling and repeating, stacking, creation ops
(`_zeros`, `_arange`, ...) that become constants where their shape is static, the numpy-interface ops and
the sequence ops. Registered in the importer's table (`importer.converters`).
"""
from __future__ import annotations

import numpy as np

from aiacc.core.ir import Value
from aiacc.errors import ShapeError
from aiacc.plugins.mxnet.import_ops.basic import _batchnorm
from aiacc.plugins.mxnet.importer import Ctx, converters

_BIG = np.iinfo(np.int64).max

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
