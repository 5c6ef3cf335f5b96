"""Converters of the neural-network layers: dropout, linear algebra, convolution, normalization, pooling and
resampling (torch functions, Tensor methods and nn modules)."""
from __future__ import annotations

import math
import operator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from aiacc.core.ops.fused import DOMAIN
from aiacc.core.translate import Untranslatable
from aiacc.plugins.torch.import_ops.common import need, norm_axis, pair, rank, tensor
from aiacc.plugins.torch.importer import ATEN, FUNCTIONS, METHODS, MODULES


# ------------------------------------------------------------------------------------- dropout
def dropout(imp, x, p: float, active: bool):
    """Dropout with the ratio and training flag as constant inputs (identity unless active)."""
    x = tensor(x)
    return imp.op("Dropout", x, imp.const(np.float32(p)), imp.const(np.bool_(active and p > 0)))


@FUNCTIONS.register(F.dropout)
def _f_dropout(imp, x, p=0.5, training=True, inplace=False):
    return dropout(imp, x, p, bool(training) and imp.training)


@MODULES.register(nn.Dropout)
def _m_dropout(imp, m, x):
    return dropout(imp, x, m.p, imp.module_training(m))


@MODULES.register(nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
def _m_channel_dropout(imp, m, x):
    if imp.module_training(m) and m.p > 0:
        raise Untranslatable("channel-wise dropout in training")
    return dropout(imp, x, m.p, False)


# ---------------------------------------------------------------------------------- linear algebra
@FUNCTIONS.register(operator.matmul, torch.matmul, torch.mm, torch.bmm)
@METHODS.register("matmul", "mm", "bmm", "__matmul__")
def _matmul(imp, a, b):
    a, b = tensor(a), tensor(b)
    if a.dtype != b.dtype:
        raise Untranslatable("operands of different dtypes")
    return imp.op("MatMul", a, b)


def linear(imp, x: Value, w: Value, b: Value | None) -> Value:
    """y = x W^T + b: Gemm for matrices, MatMul + Add otherwise (both lower to F.linear)."""
    x = tensor(x)
    if rank(x) == 2:
        return imp.op("Gemm", x, w, b, transB=1) if b is not None else imp.op("Gemm", x, w, transB=1)
    y = imp.op("MatMul", x, imp.op("Transpose", w, perm=[1, 0]))
    return y if b is None else imp.op("Add", y, b)


@FUNCTIONS.register(F.linear)
def f_linear(imp, x, weight, bias=None):
    return linear(imp, x, tensor(weight, "weight"), bias)


@MODULES.register(nn.Linear)
def _m_linear(imp, m, x):
    return linear(imp, x, imp.param(m, "weight"), imp.param(m, "bias"))


def check_ids(imp, weight: Value, idx: Value, what: str = "embedding") -> None:
    """A run-time check that every id of an embedding lookup is a row of the table, 0..rows-1 (an
    `indexing.check_index`): torch raises IndexError on any other, while onnxruntime's Gather and aiacc's
    kernel read a negative id as a row counted from the end (-1: the last row) and fail on a too-large one
    with an error naming no embedding. Left out where the ids are fixed (constants, an arange of static
    length: computed from constants only); placed before the lookup, where the ids are defined."""
    rows = weight.shape[0] if weight.shape is not None and len(weight.shape) == 2 else None
    if not isinstance(rows, int):
        return  # a table of unknown rows: the Gather's own error stands
    from aiacc.plugins.torch.import_ops.indexing import check_index

    message = (f"{what} (node {imp.current.name}): an id is outside the table's {rows} rows (this call has an id "
               f"< 0 or >= {rows}; ids must be in 0..{rows - 1}), where torch raises IndexError; the optimized "
               f"model refuses the call rather than return another row (a negative id would read a row counted "
               f"from the end)")
    check_index(imp, idx, rows, what=f"{what}'s ids", message=message, suffix="ids")


def embedding(imp, weight: Value, idx, padding_idx: int | None, training: bool) -> Value:
    """The table lookup: a Gather, or in training with a padding_idx aiacc::Embedding (the same lookup whose
    padding row gets no gradient, as torch's). A negative padding_idx counts from the end, as torch's. The
    ids are checked in the table's rows at run time (`check_ids`)."""
    idx = tensor(idx)
    check_ids(imp, weight, idx)
    if padding_idx is None or not training:
        return imp.op("Gather", weight, idx, axis=0)
    p = int(padding_idx)  # torch asserts -rows <= p < rows; aiacc::Embedding's shape check names the node
    if p < 0:
        rows = weight.shape[0] if weight.shape is not None and len(weight.shape) == 2 else None
        if not isinstance(rows, int):
            raise Untranslatable(f"padding_idx {p} of an embedding table of unknown rows")
        p += rows
    return imp.op("Embedding", weight, idx, domain=DOMAIN, padding_idx=p)


@FUNCTIONS.register(F.embedding)
def _f_embedding(imp, idx, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                 sparse=False):
    if max_norm is not None or scale_grad_by_freq:
        raise Untranslatable("max_norm / scale_grad_by_freq")
    return embedding(imp, tensor(weight), idx, padding_idx, imp.training)


@MODULES.register(nn.Embedding)
def _m_embedding(imp, m, idx):
    if m.max_norm is not None or m.scale_grad_by_freq:
        raise Untranslatable("max_norm / scale_grad_by_freq")
    return embedding(imp, imp.param(m, "weight"), idx, m.padding_idx, imp.module_training(m))


# ---------------------------------------------------------------------------------- convolution
def conv(imp, x, w, b, stride, padding, dilation, groups, n: int):
    x = tensor(x)
    kernel = list(w.shape[2:])
    strides, dilations = pair(stride, n), pair(dilation, n)
    if padding == "valid":
        pads = [0] * (2 * n)
    elif padding == "same":
        total = [d * (k - 1) for d, k in zip(dilations, kernel)]
        pads = [t // 2 for t in total] + [t - t // 2 for t in total]
    else:
        p = pair(padding, n)
        pads = p + p
    if rank(x) != n + 2:
        raise Untranslatable(f"unbatched {n}-d convolution")
    return imp.op("Conv", x, w, b, kernel_shape=kernel, strides=strides, pads=pads, dilations=dilations,
                  group=int(groups))


@MODULES.register(nn.Conv1d, nn.Conv2d, nn.Conv3d)
def _m_conv(imp, m, x):
    if m.padding_mode != "zeros":
        raise Untranslatable(f"padding_mode={m.padding_mode}")
    n = len(m.kernel_size)
    return conv(imp, x, imp.param(m, "weight"), imp.param(m, "bias"), m.stride, m.padding, m.dilation, m.groups, n)


def f_conv(n):
    def convert(imp, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        return conv(imp, x, tensor(weight), bias, stride, padding, dilation, groups, n)
    return convert


FUNCTIONS.update({F.conv1d: f_conv(1), F.conv2d: f_conv(2), F.conv3d: f_conv(3)})


@MODULES.register(nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
def _m_convt(imp, m, x, output_size=None):
    if output_size is not None or m.padding_mode != "zeros":
        raise Untranslatable("output_size= or padding_mode")
    x = tensor(x)
    n = len(m.kernel_size)
    p = pair(m.padding, n)
    return imp.op("ConvTranspose", x, imp.param(m, "weight"), imp.param(m, "bias"), kernel_shape=list(m.kernel_size),
                  strides=pair(m.stride, n), pads=p + p, dilations=pair(m.dilation, n), group=int(m.groups),
                  output_padding=pair(m.output_padding, n))


# ---------------------------------------------------------------------------------- normalization
def batch_norm(imp, x, mean, var, weight, bias, training, momentum, eps, bn_module=None):
    x = tensor(x)
    c = imp.shape_of(x)[1]
    dtype = x.dtype
    if weight is None:
        weight = imp.const(np.ones(c, dtype))
    if bias is None:
        bias = imp.const(np.zeros(c, dtype))
    if not training:
        if mean is None:
            raise Untranslatable("inference without running statistics")
        return imp.op("BatchNormalization", x, weight, bias, mean, var, epsilon=float(eps))
    if momentum is None:
        raise Untranslatable("cumulative moving average (momentum=None)")
    if mean is None:  # batch statistics only: the stats inputs are placeholders, never updated
        mean, var = imp.const(np.zeros(c, dtype)), imp.const(np.ones(c, dtype))
    y, _, _ = imp.op("BatchNormalization", x, weight, bias, mean, var, epsilon=float(eps),
                     momentum=float(1.0 - momentum), training_mode=1, outputs=3)
    if bn_module is not None and bn_module.track_running_stats and bn_module.num_batches_tracked is not None:
        counter = imp.param(bn_module, "num_batches_tracked")
        y.producer.meta["torch.num_batches_tracked"] = counter.name
    return y


@MODULES.register(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
def _m_bn(imp, m, x):
    training = imp.module_training(m) or not m.track_running_stats
    mean = imp.param(m, "running_mean") if m.track_running_stats else None
    var = imp.param(m, "running_var") if m.track_running_stats else None
    return batch_norm(imp, x, mean, var, imp.param(m, "weight"), imp.param(m, "bias"), training,
                      m.momentum, m.eps, m if imp.module_training(m) else None)


@FUNCTIONS.register(F.batch_norm)
def f_bn(imp, x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    training = bool(training) and imp.training
    if training and running_mean is not None:
        raise Untranslatable("functional batch_norm updating tensors in training")
    return batch_norm(imp, x, running_mean, running_var, weight, bias, training or running_mean is None,
                      momentum, eps)


def layer_norm(imp, x, normalized_shape, weight, bias, eps):
    x = tensor(x)
    n = len(normalized_shape) if isinstance(normalized_shape, (list, tuple, torch.Size)) else 1
    if weight is None:
        weight = imp.const(np.ones(imp.shape_of(x)[-n:], x.dtype))
    if bias is None:  # explicit zeros: onnxruntime 1.32 crashes on a LayerNormalization without its bias
        bias = imp.const(np.zeros(imp.shape_of(x)[-n:], x.dtype))
    return imp.op("LayerNormalization", x, weight, bias, axis=-n, epsilon=float(eps))


@FUNCTIONS.register(F.layer_norm)
def _f_ln(imp, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return layer_norm(imp, x, normalized_shape, weight, bias, eps)


@MODULES.register(nn.LayerNorm)
def _m_ln(imp, m, x):
    return layer_norm(imp, x, m.normalized_shape, imp.param(m, "weight"), imp.param(m, "bias"), m.eps)


def rms_norm(imp, x, normalized_shape, weight, eps):
    """F.rms_norm / nn.RMSNorm: x / sqrt(mean(x^2 over the normalized axes) + eps) * weight (eps None:
    the dtype's machine epsilon, as torch)."""
    x = tensor(x)
    if x.dtype not in ("float16", "float32", "float64"):
        raise Untranslatable(f"rms_norm of a {x.dtype} tensor")
    n = len(normalized_shape) if isinstance(normalized_shape, (list, tuple, torch.Size)) else 1
    r = rank(x)
    if eps is None:
        eps = float(np.finfo(x.dtype).eps)
    ms = imp.op("ReduceMean", imp.op("Mul", x, x), imp.ints(range(r - n, r)), keepdims=1)
    y = imp.op("Mul", x, imp.op("Reciprocal", imp.op("Sqrt", imp.op("Add", ms, imp.scalar_like(float(eps), x)))))
    return y if weight is None else imp.op("Mul", y, tensor(weight, "weight"))


if hasattr(F, "rms_norm"):
    FUNCTIONS.register(F.rms_norm)(lambda imp, x, normalized_shape, weight=None, eps=None:
                                   rms_norm(imp, x, normalized_shape, weight, eps))
if hasattr(nn, "RMSNorm"):
    MODULES.register(nn.RMSNorm)(lambda imp, m, x: rms_norm(imp, x, m.normalized_shape, imp.param(m, "weight"),
                                                            m.eps))



def _weight_norm_parts(imp, v, g, dim):
    """(v * g / ||v||, ||v||): the norm over every axis of v but `dim` (all of them for dim=-1), kept
    broadcastable to g, as torch's norm_except_dim."""
    v, g = tensor(v, "v"), tensor(g, "g")
    r = rank(v)
    axes = list(range(r)) if dim == -1 else [a for a in range(r) if a != norm_axis(dim, r)]
    norm = imp.op("ReduceL2", v, imp.ints(axes), keepdims=1) if axes else imp.op("Abs", v)
    return imp.op("Mul", v, imp.op("Div", g, norm)), norm


@FUNCTIONS.register(torch._weight_norm)
def _weight_norm(imp, v, g, dim=0):
    """torch._weight_norm (nn.utils.parametrizations.weight_norm's parametrization): v * (g / ||v||)."""
    return _weight_norm_parts(imp, v, g, dim)[0]


@ATEN.register("_weight_norm_interface")
def _weight_norm_interface(imp, v, g, dim=0):
    """aten._weight_norm_interface: (the weight, the norm)."""
    return _weight_norm_parts(imp, v, g, dim)


def grouped_mm(imp, x, weight, offs=None, *, bias=None, out_dtype=None):
    """A grouped matrix product (torch._grouped_mm, F.grouped_mm, transformers' grouped_mm_fallback): the
    rows of x [S, K] before offs[0] times weight[0] [K, N], those before offs[1] times weight[1], ...
    (offs the cumulative group sizes); rows past offs[-1] give zeros. On static shapes each row's group is
    the count of offsets <= its index, so it is a batched product with the gathered weights."""
    x, w = tensor(x), tensor(weight, "weight")
    if offs is None or bias is not None or out_dtype is not None:
        raise Untranslatable("grouped_mm without offs, or with bias / out_dtype")
    offs = tensor(offs, "offs")
    if rank(x) != 2 or rank(w) != 3 or rank(offs) != 1:
        raise Untranslatable("grouped_mm other than 2-d input x 3-d weight with 1-d offsets")
    rows, groups = imp.shape_of(x)[0], imp.shape_of(w)[0]
    ends = offs if offs.dtype == "int64" else imp.op("Cast", offs, to="int64")
    index = imp.const(np.arange(rows, dtype=np.int64)[:, None])
    passed = imp.op("LessOrEqual", imp.op("Unsqueeze", ends, imp.ints([0])), index)  # [S, E]: offs[e] <= row
    group = imp.op("ReduceSum", imp.op("Cast", passed, to="int64"), imp.ints([1]), keepdims=0)
    inside = imp.op("Less", group, imp.const(np.asarray(groups, np.int64)))
    chosen = imp.op("Gather", w, imp.op("Min", group, imp.const(np.asarray(groups - 1, np.int64))), axis=0)
    y = imp.op("MatMul", imp.op("Unsqueeze", x, imp.ints([1])), chosen)  # [S, 1, K] @ [S, K, N]
    y = imp.op("Squeeze", y, imp.ints([1]))
    return imp.op("Where", imp.op("Unsqueeze", inside, imp.ints([1])), y, imp.scalar_like(0.0, y))


for _fn in (getattr(torch, "_grouped_mm", None), getattr(F, "grouped_mm", None)):
    if _fn is not None:
        FUNCTIONS.add(_fn, grouped_mm)
ATEN.add("_grouped_mm", grouped_mm)
ATEN.add("transformers::grouped_mm_fallback", grouped_mm)


# ---------------------------------------------------------------------------------- pooling
def _pool(imp, op_name, x, kernel_size, stride, padding, dilation, ceil_mode, n, **extra):
    x = tensor(x)
    if rank(x) != n + 2:
        raise Untranslatable(f"unbatched {n}-d pooling")
    kernel = pair(kernel_size, n)
    strides = pair(stride if stride not in (None, [], ()) else kernel, n)
    p = pair(padding, n)
    dilated = dilation is not None and any(d != 1 for d in pair(dilation, n))
    if ceil_mode and not dilated:
        # a window longer than an unpadded axis (HF EfficientNet's pooler: kernel hidden_dim on 1 x 1): torch's
        # ceil mode gives one window over the whole axis, which is the window of the axis' own size
        size = list(x.shape[2:])
        kernel = [size[i] if p[i] == 0 and isinstance(size[i], int) and kernel[i] > size[i] else kernel[i]
                  for i in range(n)]
    attrs = dict(kernel_shape=kernel, strides=strides, pads=p + p, ceil_mode=int(bool(ceil_mode)), **extra)
    if dilated:
        attrs["dilations"] = pair(dilation, n)
    return imp.op(op_name, x, **attrs)


@MODULES.register(nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)
def _m_maxpool(imp, m, x):
    if m.return_indices:
        raise Untranslatable("return_indices")
    n = {nn.MaxPool1d: 1, nn.MaxPool2d: 2, nn.MaxPool3d: 3}[type(m)]
    return _pool(imp, "MaxPool", x, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode, n)


def f_maxpool(n):
    def convert(imp, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        if return_indices:
            raise Untranslatable("return_indices")
        return _pool(imp, "MaxPool", x, kernel_size, stride, padding, dilation, ceil_mode, n)
    return convert


FUNCTIONS.update({F.max_pool1d: f_maxpool(1), F.max_pool2d: f_maxpool(2), F.max_pool3d: f_maxpool(3)})


def _avgpool(imp, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n):
    if divisor_override is not None:
        raise Untranslatable("divisor_override")
    return _pool(imp, "AveragePool", x, kernel_size, stride, padding, None, ceil_mode, n,
                 count_include_pad=int(bool(count_include_pad)))


@MODULES.register(nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)
def _m_avgpool(imp, m, x):
    n = {nn.AvgPool1d: 1, nn.AvgPool2d: 2, nn.AvgPool3d: 3}[type(m)]
    return _avgpool(imp, x, m.kernel_size, m.stride, m.padding, m.ceil_mode, m.count_include_pad,
                    getattr(m, "divisor_override", None), n)


def f_avgpool(n):
    def convert(imp, x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
        return _avgpool(imp, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n)
    return convert


FUNCTIONS.update({F.avg_pool1d: f_avgpool(1), F.avg_pool2d: f_avgpool(2), F.avg_pool3d: f_avgpool(3)})


def adaptive_pool(imp, x, output_size, n: int, kind: str):
    """Adaptive pooling: global pooling for output 1, a plain pool when the input divides evenly."""
    x = tensor(x)
    shape = imp.shape_of(x)
    if len(shape) != n + 2:
        raise Untranslatable(f"unbatched adaptive pooling")
    spatial = list(shape[2:])
    out = [s if o is None else int(o) for o, s in zip(pair(output_size, n) if not isinstance(output_size, (list, tuple))
                                                       else output_size, spatial)]
    if all(o == 1 for o in out):
        return imp.op("GlobalAveragePool" if kind == "avg" else "GlobalMaxPool", x)
    if any(s % o for s, o in zip(spatial, out)):
        # uneven windows: pooling is separable, so reduce one axis at a time over its exact windows
        if sum(o for s, o in zip(spatial, out) if s != o) > 64:
            raise Untranslatable(f"input {spatial} does not divide into output {out} (too many windows)")
        need("Slice")
        y = x
        for i, (s, o) in enumerate(zip(spatial, out)):
            if s != o:
                y = _adaptive_axis(imp, y, 2 + i, s, o, kind)
        return y
    k = [s // o for s, o in zip(spatial, out)]
    if kind == "avg":
        return imp.op("AveragePool", x, kernel_shape=k, strides=k)
    return imp.op("MaxPool", x, kernel_shape=k, strides=k)


for _n, _m, _f in ((1, nn.AdaptiveAvgPool1d, F.adaptive_avg_pool1d), (2, nn.AdaptiveAvgPool2d, F.adaptive_avg_pool2d),
                   (3, nn.AdaptiveAvgPool3d, F.adaptive_avg_pool3d)):
    MODULES[_m] = (lambda n: lambda imp, m, x: adaptive_pool(imp, x, m.output_size, n, "avg"))(_n)
    FUNCTIONS[_f] = (lambda n: lambda imp, x, output_size: adaptive_pool(imp, x, output_size, n, "avg"))(_n)
def _f_adaptive_max(n):
    def convert(imp, x, output_size, return_indices=False):
        if return_indices:
            raise Untranslatable("return_indices")
        return adaptive_pool(imp, x, output_size, n, "max")
    return convert


FUNCTIONS.update({F.adaptive_max_pool1d: _f_adaptive_max(1), F.adaptive_max_pool2d: _f_adaptive_max(2),
                  F.adaptive_max_pool3d: _f_adaptive_max(3)})
for _n, _m in ((1, nn.AdaptiveMaxPool1d), (2, nn.AdaptiveMaxPool2d), (3, nn.AdaptiveMaxPool3d)):
    MODULES[_m] = (lambda n: lambda imp, m, x: adaptive_pool(imp, x, m.output_size, n, "max")
                   if not m.return_indices else (_ for _ in ()).throw(Untranslatable("return_indices")))(_n)


@FUNCTIONS.register(F.pad)
def f_pad(imp, x, pad, mode="constant", value=None):
    x = tensor(x)
    need("Pad")
    modes = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}
    if mode not in modes:
        raise Untranslatable(f"mode {mode}")
    r = rank(x)
    k = len(pad) // 2
    # torch lists (begin, end) pairs from the last axis backwards; ONNX wants all begins then all ends
    axes = [r - 1 - i for i in range(k)]
    begins = [int(pad[2 * i]) for i in range(k)]
    ends = [int(pad[2 * i + 1]) for i in range(k)]
    cv = None if value in (None, 0, 0.0) or mode != "constant" else imp.scalar_like(value, x)
    return imp.op("Pad", x, imp.ints(begins + ends), cv, imp.ints(axes), mode=modes[mode])


# ---------------------------------------------------------------------------------- resampling
_NEAREST = {"nearest": ("asymmetric", "floor"), "nearest-exact": ("half_pixel", "round_prefer_ceil")}
_LINEAR = {"linear": ("linear", 1), "bilinear": ("linear", 2), "trilinear": ("linear", 3), "bicubic": ("cubic", 2)}


def interpolate(imp, x, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """F.interpolate as Resize over the spatial axes (the batch axis stays free)."""
    x = tensor(x)
    need("Resize")
    shape = imp.shape_of(x)
    n = len(shape) - 2
    example = imp.example_of()
    if n < 1 or not isinstance(example, torch.Tensor):
        raise Untranslatable("input without spatial axes")
    out = [int(d) for d in example.shape[2:]]
    if antialias:
        return _antialiased(imp, x, out, scale_factor if size is None and not recompute_scale_factor else None,
                            mode, align_corners)
    if mode == "area":
        return adaptive_pool(imp, x, out, n, "avg")
    if mode in _NEAREST:
        ctm, nearest_mode = _NEAREST[mode]
        attrs = dict(mode="nearest", coordinate_transformation_mode=ctm, nearest_mode=nearest_mode)
    elif mode in _LINEAR:
        kind, dims = _LINEAR[mode]
        if dims != n:
            raise Untranslatable(f"mode {mode} on a {n}-d input")
        attrs = dict(mode=kind, coordinate_transformation_mode="align_corners" if align_corners else "half_pixel")
        if kind == "cubic":
            attrs["cubic_coeff_a"] = -0.75
    else:
        raise Untranslatable(f"mode {mode}")
    axes = list(range(2, n + 2))
    if size is not None or recompute_scale_factor:
        return imp.op("Resize", x, None, None, imp.ints(out), axes=axes, **attrs)
    # floats: pair() makes ints, which turned every fractional factor (0.5: CoaT's 28 -> 14) into 0
    factors = scale_factor if isinstance(scale_factor, (list, tuple)) else [scale_factor] * n
    scales = np.array([float(s) for s in factors], np.float32)
    if [int(math.floor(float(s) * d)) for s, d in zip(scales, shape[2:])] != out:
        raise Untranslatable(f"scale_factor {scale_factor} in float32 gives another output size than {out}")
    return imp.op("Resize", x, None, imp.const(scales), None, axes=axes, **attrs)


def _antialiased(imp, x, out, scale_factor, mode, align_corners):
    """Antialiased bilinear / bicubic resizing (a downscale that filters first) on static sizes: torch's is
    separable, so each spatial axis is a fixed linear map, whose matrix is torch's own interpolate of the
    identity basis along that axis; the IR does two MatMuls (heights, then widths)."""
    shape = imp.shape_of(x)
    if mode not in ("bilinear", "bicubic") or len(shape) != 4:
        raise Untranslatable(f"antialias with mode {mode} on a rank-{len(shape)} input")
    if np.dtype(x.dtype).kind != "f":
        raise Untranslatable("antialias on a non-floating input")
    scales = None if scale_factor is None else \
        [float(s) for s in (scale_factor if isinstance(scale_factor, (list, tuple)) else [scale_factor] * 2)]
    kw = dict(size=tuple(out)) if scales is None else dict(scale_factor=tuple(scales))
    n_h, n_w = shape[2], shape[3]
    # probes constant along the other axis (whose normalized filter then passes them unchanged): torch's
    # filter on a size-1 axis is not the one it uses at the real size, so the probes keep both real sizes
    probe_h = torch.eye(n_h, dtype=torch.float64).reshape(n_h, 1, n_h, 1).expand(n_h, 1, n_h, n_w)
    probe_w = torch.eye(n_w, dtype=torch.float64).reshape(n_w, 1, 1, n_w).expand(n_w, 1, n_h, n_w)
    mats = [F.interpolate(probe_h, mode=mode, align_corners=align_corners, antialias=True, **kw)[:, 0, :, 0],
            F.interpolate(probe_w, mode=mode, align_corners=align_corners, antialias=True, **kw)[:, 0, 0, :]]
    mats = [np.ascontiguousarray(m.numpy().astype(x.dtype)) for m in mats]  # (n_in, n_out) each
    # each matrix on the right (the form the passes and the lowering take as a weight)
    cols = imp.op("MatMul", imp.op("Transpose", x, perm=[0, 1, 3, 2]), imp.const(mats[0]))  # (N, C, W, out_h)
    rows = imp.op("Transpose", cols, perm=[0, 1, 3, 2])  # (N, C, out_h, W)
    return imp.op("MatMul", rows, imp.const(mats[1]))  # (N, C, out_h, out_w)


FUNCTIONS[F.interpolate] = interpolate
FUNCTIONS[F.upsample] = interpolate


@FUNCTIONS.register(F.upsample_nearest)
def _upsample_nearest(imp, x, size=None, scale_factor=None):
    return interpolate(imp, x, size, scale_factor, "nearest")


@FUNCTIONS.register(F.upsample_bilinear)
def _upsample_bilinear(imp, x, size=None, scale_factor=None):
    return interpolate(imp, x, size, scale_factor, "bilinear", align_corners=True)


@MODULES.register(nn.Upsample, nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d)
def _m_upsample(imp, m, x):
    return interpolate(imp, x, m.size, m.scale_factor, m.mode, m.align_corners,
                       getattr(m, "recompute_scale_factor", None))


def _adaptive_axis(imp, x, axis: int, in_len: int, out_len: int, kind: str):
    """Exact adaptive pooling along one axis: output i reduces input [floor(i*L/n), ceil((i+1)*L/n))."""
    reduce = "ReduceMean" if kind == "avg" else "ReduceMax"
    parts = []
    for i in range(out_len):
        start, end = (i * in_len) // out_len, -(-((i + 1) * in_len) // out_len)
        piece = imp.op("Slice", x, imp.ints([start]), imp.ints([end]), imp.ints([axis]))
        parts.append(imp.op(reduce, piece, imp.ints([axis]), keepdims=1))
    return parts[0] if len(parts) == 1 else imp.op("Concat", *parts, axis=axis)


# ---------------------------------------------------------------------------------- more normalization
def _channel_affine(imp, y, weight, bias, r: int):
    """y * weight + bias with per-channel (axis 1) parameters."""
    if weight is None and bias is None:
        return y
    shape = imp.ints([-1] + [1] * (r - 2))
    if weight is not None:
        y = imp.op("Mul", y, imp.op("Reshape", tensor(weight, "weight"), shape))
    if bias is not None:
        y = imp.op("Add", y, imp.op("Reshape", tensor(bias, "bias"), shape))
    return y


def group_norm(imp, x, groups: int, weight, bias, eps: float):
    """GroupNorm: LayerNormalization over each group's (channels x spatial) view, then the channel affine."""
    x = tensor(x)
    shape = imp.shape_of(x)
    if len(shape) < 2 or shape[1] % groups:
        raise Untranslatable(f"{shape[1] if len(shape) > 1 else '?'} channels in {groups} groups")
    per_group = int(np.prod(shape[1:])) // groups
    y = imp.op("Reshape", x, imp.ints([0, groups, per_group]))
    y = imp.op("LayerNormalization", y, imp.const(np.ones(per_group, x.dtype)), imp.const(np.zeros(per_group, x.dtype)),
               axis=-1, epsilon=float(eps))
    y = imp.op("Reshape", y, imp.ints([0] + list(shape[1:])))
    return _channel_affine(imp, y, weight, bias, len(shape))


@FUNCTIONS.register(F.group_norm)
def _f_group_norm(imp, x, num_groups, weight=None, bias=None, eps=1e-5):
    return group_norm(imp, x, int(num_groups), weight, bias, eps)


@MODULES.register(nn.GroupNorm)
def _m_group_norm(imp, m, x):
    return group_norm(imp, x, m.num_groups, imp.param(m, "weight"), imp.param(m, "bias"), m.eps)


def instance_norm(imp, x, running_mean, running_var, weight, bias, use_input_stats, eps):
    x = tensor(x)
    shape = imp.shape_of(x)
    if len(shape) < 3:
        raise Untranslatable("unbatched instance norm")
    if use_input_stats:
        return group_norm(imp, x, shape[1], weight, bias, eps)
    return batch_norm(imp, x, running_mean, running_var, weight, bias, False, 0.1, eps)


@FUNCTIONS.register(F.instance_norm)
def _f_instance_norm(imp, x, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                     momentum=0.1, eps=1e-5):
    if use_input_stats and running_mean is not None:
        raise Untranslatable("instance norm updating running statistics")
    return instance_norm(imp, x, running_mean, running_var, weight, bias, use_input_stats, eps)


@MODULES.register(nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
def _m_instance_norm(imp, m, x):
    use_input_stats = m.training or not m.track_running_stats
    if imp.mode == "inference":
        use_input_stats = not m.track_running_stats
    if use_input_stats and m.track_running_stats:
        raise Untranslatable("instance norm updating running statistics in training")
    x = tensor(x)
    if len(imp.shape_of(x)) != {nn.InstanceNorm1d: 3, nn.InstanceNorm2d: 4, nn.InstanceNorm3d: 5}[type(m)]:
        raise Untranslatable("unbatched instance norm")
    mean = imp.param(m, "running_mean") if m.track_running_stats else None
    var = imp.param(m, "running_var") if m.track_running_stats else None
    w = imp.param(m, "weight") if m.affine else None
    b = imp.param(m, "bias") if m.affine else None
    return instance_norm(imp, x, mean, var, w, b, use_input_stats, m.eps)


@FUNCTIONS.register(F.normalize)
def _f_normalize(imp, x, p=2.0, dim=1, eps=1e-12, out=None):
    x = tensor(x)
    if p != 2 or out is not None:
        raise Untranslatable("p != 2 or out=")
    axis = norm_axis(dim, rank(x))
    norm = imp.op("Sqrt", imp.op("ReduceSum", imp.op("Mul", x, x), imp.ints([axis]), keepdims=1))
    return imp.op("Div", x, imp.op("Max", norm, imp.scalar_like(eps, x)))


@FUNCTIONS.register(torch.baddbmm)
@METHODS.register("baddbmm", "addmm")
def _baddbmm(imp, x, batch1=None, batch2=None, *, beta=1, alpha=1, mat1=None, mat2=None, out=None):
    """torch.baddbmm / Tensor.baddbmm (BLOOM's ALiBi attention scores, its operands by keyword) and
    Tensor.addmm: beta * x + alpha * (batch1 @ batch2)."""
    if out is not None:
        raise Untranslatable("out= argument")
    m1, m2 = (batch1, batch2) if batch1 is not None else (mat1, mat2)
    if beta == 0:  # torch ignores x then (even its NaNs)
        y = imp.op("MatMul", tensor(m1), tensor(m2))
        return y if alpha == 1 else imp.op("Mul", y, imp.scalar_like(alpha, y))
    return _addmm(imp, x, m1, m2, beta=beta, alpha=alpha)


@FUNCTIONS.register(torch.addmm)
def _addmm(imp, bias, m1, m2, *, beta=1, alpha=1):
    if tensor(m1).dtype != tensor(m2).dtype or tensor(m1).dtype != tensor(bias, "bias").dtype:
        raise Untranslatable("operands of different dtypes")
    y = imp.op("MatMul", tensor(m1), tensor(m2))
    if alpha != 1:
        y = imp.op("Mul", y, imp.scalar_like(alpha, y))
    b = tensor(bias, "bias")
    if beta != 1:
        b = imp.op("Mul", b, imp.scalar_like(beta, b))
    return imp.op("Add", y, b)


# ---------------------------------------------------------------------------------- unfold / fold
def _patch_weight(channels: int, kernel: list[int], dtype: str) -> np.ndarray:
    """The one-hot (C*kh*kw, 1, kh, kw) weight that picks each kernel position into its own channel, in
    im2col's order (channel-major, then row-major over the kernel)."""
    kk = int(np.prod(kernel))
    w = np.zeros((channels, kk, 1, kk), dtype=dtype)
    w[:, np.arange(kk), 0, np.arange(kk)] = 1
    return w.reshape([channels * kk, 1] + list(kernel))


@FUNCTIONS.register(F.unfold)
def _f_unfold(imp, x, kernel_size, dilation=1, padding=0, stride=1):
    """F.unfold (im2col) of a 4-d input: a grouped Conv with the one-hot patch weight (each output channel
    copies one kernel position of one input channel), flattened to (N, C*kh*kw, L). Exact for finite
    inputs (every other product is by 0)."""
    x = tensor(x)
    if rank(x) != 4:
        raise Untranslatable("unfold of a tensor that is not 4-d")
    n, c = imp.shape_of(x)[:2]
    kernel = pair(kernel_size, 2)
    w = imp.const(_patch_weight(c, kernel, x.dtype))
    p = pair(padding, 2)
    y = imp.op("Conv", x, w, None, kernel_shape=kernel, strides=pair(stride, 2), pads=p + p,
               dilations=pair(dilation, 2), group=int(c))
    return imp.op("Reshape", y, imp.ints([0, c * int(np.prod(kernel)), -1]))


@MODULES.register(nn.Unfold)
def _m_unfold(imp, m, x):
    return _f_unfold(imp, x, m.kernel_size, m.dilation, m.padding, m.stride)


@FUNCTIONS.register(F.fold)
def _f_fold(imp, x, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """F.fold (col2im) of a 3-d (N, C*kh*kw, L) input: the transpose of unfold, a grouped ConvTranspose with
    the same one-hot weight on the blocks laid out as (N, C*kh*kw, oh, ow); overlapping blocks are summed."""
    x = tensor(x)
    if rank(x) != 3:
        raise Untranslatable("fold of a tensor that is not 3-d")
    _, ckk, blocks = imp.shape_of(x)
    kernel, size = pair(kernel_size, 2), pair(output_size, 2)
    dil, pad, st = pair(dilation, 2), pair(padding, 2), pair(stride, 2)
    kk = int(np.prod(kernel))
    grid = [(size[i] + 2 * pad[i] - dil[i] * (kernel[i] - 1) - 1) // st[i] + 1 for i in range(2)]
    if ckk % kk or grid[0] * grid[1] != blocks:
        raise Untranslatable("fold input does not match its kernel and output size")
    c = ckk // kk
    y = imp.op("Reshape", x, imp.ints([0, ckk] + grid))
    out_pad = [size[i] - ((grid[i] - 1) * st[i] - 2 * pad[i] + dil[i] * (kernel[i] - 1) + 1) for i in range(2)]
    w = imp.const(_patch_weight(c, kernel, x.dtype))
    return imp.op("ConvTranspose", y, w, None, kernel_shape=kernel, strides=st, pads=pad + pad, dilations=dil,
                  group=int(c), output_padding=out_pad)


@MODULES.register(nn.Fold)
def _m_fold(imp, m, x):
    return _f_fold(imp, x, m.output_size, m.kernel_size, m.dilation, m.padding, m.stride)
