"""Neural-network ops (ONNX semantics, NCHW): convolution, pooling, normalization, matrix products, softmax."""
from __future__ import annotations

import numpy as np

from aiacc.core.ir import TensorType
from aiacc.core.ops.elementwise import infer_unary
from aiacc.core.ops.registry import InferContext, op
from aiacc.core.ops.shape_utils import auto_pads, broadcast_shapes, conv_output_size, normalize_axis

_CONV_ATTRS = {
    "auto_pad": ("string", "NOTSET"),
    "dilations": ("ints", None),
    "group": ("int", 1),
    "kernel_shape": ("ints", None),
    "pads": ("ints", None),
    "strides": ("ints", None),
}


def window_params(spatial, kernel, attrs):
    """(strides, dilations, pads) of a sliding-window op with defaults and auto_pad resolved."""
    n = len(kernel)
    strides = list(attrs.get("strides") or [1] * n)
    dilations = list(attrs.get("dilations") or [1] * n)
    auto_pad = attrs.get("auto_pad") or "NOTSET"
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = auto_pads(auto_pad, spatial, kernel, strides, dilations)
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    elif auto_pad == "NOTSET":
        pads = list(attrs.get("pads") or [0] * (2 * n))
    else:
        raise ValueError(f"unknown auto_pad {auto_pad!r}")
    if len(strides) != n or len(dilations) != n or (pads is not None and len(pads) != 2 * n):
        raise ValueError(f"strides/dilations/pads do not match a {n}-d kernel")
    return strides, dilations, pads


def _dtype_only(ctx: InferContext, n: int = 1) -> list[TensorType | None]:
    """Outputs of unknown shape but with the first input's dtype (a rank-unknown input), or unknown."""
    dtype = ctx.dtype(0) if ctx.type(0) is not None else None
    return [TensorType(dtype, None) if dtype else None] + [None] * (n - 1)


def infer_conv(ctx: InferContext) -> list[TensorType | None]:
    x, w = ctx.type(0), ctx.type(1)
    if x is None or w is None or x.shape is None or w.shape is None:
        return _dtype_only(ctx)
    if len(x.shape) != len(w.shape) or len(x.shape) < 3:
        raise ctx.fail(f"input rank {len(x.shape)} and weight rank {len(w.shape)} must be equal and at least 3")
    kernel = list(ctx.attrs["kernel_shape"] or w.shape[2:])
    if ctx.attrs["kernel_shape"] and list(kernel) != [d if isinstance(d, int) else k
                                                       for d, k in zip(w.shape[2:], kernel)]:
        raise ctx.fail(f"kernel_shape {list(kernel)} does not match the weight's spatial shape {list(w.shape[2:])}")
    group = ctx.attrs["group"]
    cin = x.shape[1]
    if isinstance(cin, int) and isinstance(w.shape[1], int) and cin != w.shape[1] * group:
        raise ctx.fail(f"input has {cin} channels but the weight expects {w.shape[1]} x group {group} = "
                       f"{w.shape[1] * group}")
    if isinstance(w.shape[0], int) and w.shape[0] % group:
        raise ctx.fail(f"{w.shape[0]} output channels do not divide into {group} groups")
    if ctx.has_input(2) and ctx.shape(2) is not None and tuple(ctx.shape(2)) != (w.shape[0],):
        raise ctx.fail(f"bias of shape {list(ctx.shape(2))} does not match {w.shape[0]} output channels")
    try:
        strides, dilations, pads = window_params(x.shape[2:], kernel, ctx.attrs)
        if pads is None:
            spatial = [None] * len(kernel)
        else:
            n = len(kernel)
            spatial = [conv_output_size(x.shape[2 + i], kernel[i], strides[i], pads[i], pads[n + i], dilations[i])
                       for i in range(n)]
    except ValueError as e:
        raise ctx.fail(str(e)) from None
    return [TensorType(x.dtype, (x.shape[0], w.shape[0], *spatial))]


def sliding_windows(x: np.ndarray, kernel, strides, dilations, pads, pad_value=0.0) -> np.ndarray:
    """View of x (N, C, *spatial) as (N, C, *out_spatial, *kernel) windows after padding."""
    n = len(kernel)
    pad_width = [(0, 0), (0, 0)] + [(pads[i], pads[n + i]) for i in range(n)]
    if any(p for pw in pad_width for p in pw):
        x = np.pad(x, pad_width, constant_values=pad_value)
    effective = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    win = np.lib.stride_tricks.sliding_window_view(x, effective, axis=tuple(range(2, 2 + n)))
    index = (slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides) \
        + tuple(slice(None, None, d) for d in dilations)
    return win[index]


@op("Conv", attrs=_CONV_ATTRS, inputs=(2, 3), infer=infer_conv)
def conv(x, w, b=None, *, auto_pad, dilations, group, kernel_shape, pads, strides):
    """N-d grouped convolution by im2col + matrix product."""
    kernel = list(kernel_shape or w.shape[2:])
    n = len(kernel)
    strides, dilations, pads = window_params(x.shape[2:], kernel, dict(
        auto_pad=auto_pad, strides=strides, dilations=dilations, pads=pads))
    win = sliding_windows(x, kernel, strides, dilations, pads)  # N, C, *out, *k
    batch, out_spatial = x.shape[0], win.shape[2:2 + n]
    m = w.shape[0]
    cg, mg = x.shape[1] // group, m // group
    # N, *out, C, *k -> rows of patches
    perm = (0, *range(2, 2 + n), 1, *range(2 + n, 2 + 2 * n))
    cols = win.transpose(perm)
    out = np.empty((batch, *out_spatial, m), dtype=np.result_type(x.dtype, w.dtype))
    for g in range(group):
        patch = cols[..., g * cg:(g + 1) * cg, *([slice(None)] * n)].reshape(-1, cg * int(np.prod(kernel)))
        wg = w[g * mg:(g + 1) * mg].reshape(mg, -1)
        out[..., g * mg:(g + 1) * mg] = (patch @ wg.T).reshape(batch, *out_spatial, mg)
    if b is not None:
        out += b
    return np.ascontiguousarray(np.moveaxis(out, -1, 1)).astype(x.dtype)


_CONVT_ATTRS = dict(_CONV_ATTRS, output_padding=("ints", None), output_shape=("ints", None))


def convtranspose_pads(spatial, kernel, strides, dilations, attrs):
    """(pads, output_padding, out_sizes) of ConvTranspose per ONNX, with output_shape and auto_pad resolved."""
    n = len(kernel)
    out_pad = list(attrs.get("output_padding") or [0] * n)
    output_shape = attrs.get("output_shape")
    pads = list(attrs.get("pads") or [0] * (2 * n))
    auto_pad = attrs.get("auto_pad") or "NOTSET"
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = list(output_shape[-n:]) if output_shape is not None else [s * st for s, st in zip(spatial, strides)]
        pads = [0] * (2 * n)
        for i in range(n):
            # a negative total extends the output at the end (ONNX: output_shape larger than the full result)
            total = strides[i] * (spatial[i] - 1) + out_pad[i] + ((kernel[i] - 1) * dilations[i] + 1) - target[i]
            if auto_pad == "SAME_UPPER":
                pads[i], pads[n + i] = total // 2, total - total // 2
            else:
                pads[i], pads[n + i] = total - total // 2, total // 2
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    sizes = [None if not isinstance(spatial[i], int) else
             strides[i] * (spatial[i] - 1) + out_pad[i] + ((kernel[i] - 1) * dilations[i] + 1) - pads[i] - pads[n + i]
             for i in range(n)]
    return pads, out_pad, sizes


def infer_convtranspose(ctx: InferContext) -> list[TensorType | None]:
    x, w = ctx.type(0), ctx.type(1)
    if x is None or w is None or x.shape is None or w.shape is None:
        return _dtype_only(ctx)
    kernel = list(ctx.attrs["kernel_shape"] or w.shape[2:])
    n = len(kernel)
    group = ctx.attrs["group"]
    if isinstance(x.shape[1], int) and isinstance(w.shape[0], int) and x.shape[1] != w.shape[0]:
        raise ctx.fail(f"input has {x.shape[1]} channels but the weight expects {w.shape[0]}")
    strides = list(ctx.attrs["strides"] or [1] * n)
    dilations = list(ctx.attrs["dilations"] or [1] * n)
    if any(not isinstance(s, int) for s in x.shape[2:]) and ctx.attrs["output_shape"] is None:
        sizes = [None] * n
    else:
        _, _, sizes = convtranspose_pads(list(x.shape[2:]), kernel, strides, dilations, ctx.attrs)
    m = w.shape[1] * group if isinstance(w.shape[1], int) else None
    return [TensorType(x.dtype, (x.shape[0], m, *sizes))]


@op("ConvTranspose", attrs=_CONVT_ATTRS, inputs=(2, 3), infer=infer_convtranspose)
def conv_transpose(x, w, b=None, *, auto_pad, dilations, group, kernel_shape, pads, strides, output_padding,
                   output_shape):
    """Transposed convolution: scatter-add of each input pixel's weighted kernel (col2im)."""
    kernel = list(kernel_shape or w.shape[2:])
    n = len(kernel)
    strides = list(strides or [1] * n)
    dilations = list(dilations or [1] * n)
    pads, out_pad, sizes = convtranspose_pads(list(x.shape[2:]), kernel, strides, dilations, dict(
        auto_pad=auto_pad, pads=pads, output_padding=output_padding, output_shape=output_shape))
    batch, cin = x.shape[:2]
    cg = cin // group
    mg = w.shape[1]
    full = [strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1 for i in range(n)]
    out = np.zeros((batch, mg * group, *full), dtype=np.float64)
    for g in range(group):
        xg = x[:, g * cg:(g + 1) * cg].reshape(batch, cg, -1)  # N, Cg, P
        wg = w[g * cg:(g + 1) * cg].reshape(cg, -1)  # Cg, Mg*K
        cols = np.einsum("ncp,ck->nkp", xg, wg).reshape(batch, mg, *kernel, *x.shape[2:])
        for kidx in np.ndindex(*kernel):
            src = cols[(slice(None), slice(None), *kidx)]
            dst = (slice(None), slice(g * mg, (g + 1) * mg)) + tuple(
                slice(kidx[i] * dilations[i], kidx[i] * dilations[i] + strides[i] * (x.shape[2 + i] - 1) + 1,
                      strides[i]) for i in range(n))
            out[dst] += src
    if any(p < 0 for p in pads):  # negative pads grow the output with zeros
        out = np.pad(out, [(0, 0), (0, 0)] + [(max(-pads[i], 0), max(-pads[n + i], 0)) for i in range(n)])
    crop = (slice(None), slice(None)) + tuple(slice(max(pads[i], 0), max(pads[i], 0) + sizes[i]) for i in range(n))
    out = out[crop]
    if b is not None:
        out += b.reshape(1, -1, *([1] * n))
    return out.astype(x.dtype)


def infer_batchnorm(ctx: InferContext) -> list[TensorType | None]:
    x = ctx.type(0)
    if x is not None and x.shape is not None and len(x.shape) >= 2:
        c = x.shape[1]
        for i, what in zip(range(1, 5), ("scale", "bias", "mean", "var")):
            s = ctx.shape(i)
            if s is not None and isinstance(c, int) and tuple(s) != (c,):
                raise ctx.fail(f"{what} of shape {list(s)} does not match {c} channels")
    outs = [x]
    c = None if x is None or x.shape is None else x.shape[1]
    if len(ctx.node.outputs) > 1:
        outs += [TensorType(x.dtype if x else None, (c,))] * 2
    return outs


@op("BatchNormalization", attrs={"epsilon": ("float", 1e-5), "momentum": ("float", 0.9),
                                 "training_mode": ("int", 0)},
    inputs=5, outputs=(1, 3), infer=infer_batchnorm)
def batch_norm(x, scale, bias, mean, var, *, epsilon, momentum, training_mode):
    """Inference batch norm; in training mode also returns the updated running mean and variance."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if training_mode:
        axes = (0,) + tuple(range(2, x.ndim))
        bmean = x.mean(axis=axes)
        bvar = x.var(axis=axes)
        y = (x - bmean.reshape(shape)) / np.sqrt(bvar.reshape(shape) + epsilon) * scale.reshape(shape) \
            + bias.reshape(shape)
        return (y.astype(x.dtype), (mean * momentum + bmean * (1 - momentum)).astype(mean.dtype),
                (var * momentum + bvar * (1 - momentum)).astype(var.dtype))
    inv = (scale / np.sqrt(var.astype(np.float64) + epsilon)).astype(x.dtype)
    return x * inv.reshape(shape) + (bias - mean * inv).astype(x.dtype).reshape(shape)


_POOL_ATTRS = {
    "auto_pad": ("string", "NOTSET"),
    "ceil_mode": ("int", 0),
    "dilations": ("ints", None),
    "kernel_shape": ("ints", None),
    "pads": ("ints", None),
    "strides": ("ints", None),
}


def infer_pool(ctx: InferContext) -> list[TensorType | None]:
    x = ctx.type(0)
    if x is None or x.shape is None:
        return _dtype_only(ctx, len(ctx.node.outputs))
    kernel = ctx.attrs["kernel_shape"]
    if kernel is None:
        raise ctx.fail("kernel_shape is required")
    n = len(kernel)
    if len(x.shape) != n + 2:
        raise ctx.fail(f"a {n}-d kernel needs a rank-{n + 2} input")
    try:
        strides, dilations, pads = window_params(x.shape[2:], kernel, ctx.attrs)
        spatial = [None] * n if pads is None else [
            conv_output_size(x.shape[2 + i], kernel[i], strides[i], pads[i], pads[n + i], dilations[i],
                             bool(ctx.attrs["ceil_mode"])) for i in range(n)]
    except ValueError as e:
        raise ctx.fail(str(e)) from None
    t = TensorType(x.dtype, (*x.shape[:2], *spatial))
    return [t, TensorType("int64", t.shape)][:len(ctx.node.outputs)]


def _pool_windows(x, kernel, strides, dilations, pads, ceil_mode, pad_value):
    """Windows with extra end padding so ceil_mode windows exist; returns (windows, out_sizes)."""
    n = len(kernel)
    sizes = [conv_output_size(x.shape[2 + i], kernel[i], strides[i], pads[i], pads[n + i], dilations[i],
                              bool(ceil_mode)) for i in range(n)]
    extra = [max(0, (sizes[i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1
                 - (x.shape[2 + i] + pads[i] + pads[n + i])) for i in range(n)]
    pads2 = list(pads[:n]) + [pads[n + i] + extra[i] for i in range(n)]
    win = sliding_windows(x, kernel, strides, dilations, pads2, pad_value)
    return win[(slice(None), slice(None)) + tuple(slice(0, s) for s in sizes)], sizes, pads2


@op("MaxPool", attrs=dict(_POOL_ATTRS, storage_order=("int", 0)), outputs=(1, 2), infer=infer_pool)
def max_pool(x, *, auto_pad, ceil_mode, dilations, kernel_shape, pads, strides, storage_order):
    """Max pooling; padding never wins (it is -inf)."""
    n = len(kernel_shape)
    strides, dilations, pads = window_params(x.shape[2:], kernel_shape, dict(
        auto_pad=auto_pad, strides=strides, dilations=dilations, pads=pads))
    fill = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    win, _, _ = _pool_windows(x, kernel_shape, strides, dilations, pads, ceil_mode, fill)
    values = win.max(axis=tuple(range(-n, 0))).astype(x.dtype)
    # indices into the flattened input (row-major, or column-major over the spatial axes if storage_order=1)
    spatial = x.shape[2:]
    coords = np.indices(spatial)
    if storage_order:
        flat_sp = sum(coords[i] * int(np.prod(spatial[:i], dtype=np.int64)) for i in range(n))
    else:
        flat_sp = np.ravel_multi_index(tuple(coords), spatial) if n else np.zeros((), np.int64)
    base = (np.arange(x.shape[0] * x.shape[1]) * int(np.prod(spatial, dtype=np.int64))).reshape(x.shape[:2])
    index = (base.reshape(*x.shape[:2], *([1] * n)) + flat_sp).astype(np.int64)
    iwin, _, _ = _pool_windows(index, kernel_shape, strides, dilations, pads, ceil_mode, -1)
    flat_win = win.reshape(*win.shape[:2 + n], -1)
    arg = np.argmax(flat_win, axis=-1)
    indices = np.take_along_axis(iwin.reshape(*iwin.shape[:2 + n], -1), arg[..., None], axis=-1)[..., 0]
    return values, indices


@op("AveragePool", attrs=dict(_POOL_ATTRS, count_include_pad=("int", 0)), infer=infer_pool)
def average_pool(x, *, auto_pad, ceil_mode, dilations, kernel_shape, pads, strides, count_include_pad):
    """Average pooling; count_include_pad decides whether explicit padding counts in the divisor."""
    n = len(kernel_shape)
    strides, dilations, pads = window_params(x.shape[2:], kernel_shape, dict(
        auto_pad=auto_pad, strides=strides, dilations=dilations, pads=pads))
    axes = tuple(range(-n, 0))
    win, sizes, pads2 = _pool_windows(x.astype(np.float64), kernel_shape, strides, dilations, pads, ceil_mode, 0.0)
    total = win.sum(axis=axes)
    # the divisor: window elements inside the input, plus the explicit pads when count_include_pad
    ones = np.ones((1, 1, *x.shape[2:]))
    if count_include_pad:
        ones = np.pad(ones, [(0, 0), (0, 0)] + [(pads[i], pads[n + i]) for i in range(n)], constant_values=1.0)
        ceil_extra = [0] * n + [pads2[n + i] - pads[n + i] for i in range(n)]
        cwin = sliding_windows(ones, kernel_shape, strides, dilations, ceil_extra)
    else:
        cwin = sliding_windows(ones, kernel_shape, strides, dilations, pads2)
    counts = cwin.sum(axis=axes)[(slice(None), slice(None)) + tuple(slice(0, s) for s in sizes)]
    return (total / counts).astype(x.dtype)


def infer_global_pool(ctx: InferContext) -> list[TensorType | None]:
    x = ctx.type(0)
    if x is None or x.shape is None:
        return _dtype_only(ctx)
    return [TensorType(x.dtype, (*x.shape[:2], *([1] * (len(x.shape) - 2))))]


@op("GlobalAveragePool", infer=infer_global_pool)
def global_average_pool(x):
    return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=np.float64).astype(x.dtype)


@op("GlobalMaxPool", infer=infer_global_pool)
def global_max_pool(x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


@op("LRN", attrs={"alpha": ("float", 1e-4), "beta": ("float", 0.75), "bias": ("float", 1.0), "size": ("int", None)},
    infer=infer_unary)
def lrn(x, *, alpha, beta, bias, size):
    """Local response normalization across channels (ONNX: window of `size` centred on each channel)."""
    if size is None:
        raise ValueError("LRN needs the size attribute")
    sq = np.square(x.astype(np.float64))
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    padded = np.pad(sq, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
    csum = np.cumsum(padded, axis=1)
    csum = np.concatenate([np.zeros_like(csum[:, :1]), csum], axis=1)
    window = csum[:, size:size + c] - csum[:, :c]
    return (x / (bias + alpha / size * window) ** beta).astype(x.dtype)


def infer_matmul(ctx: InferContext) -> list[TensorType | None]:
    a, b = ctx.type(0), ctx.type(1)
    if a is None or b is None or a.shape is None or b.shape is None:
        return _dtype_only(ctx)
    sa, sb = list(a.shape), list(b.shape)
    if not sa or not sb:
        raise ctx.fail("MatMul inputs must have rank >= 1")
    va, vb = len(sa) == 1, len(sb) == 1
    if va:
        sa = [1] + sa
    if vb:
        sb = sb + [1]
    k1, k2 = sa[-1], sb[-2]
    if isinstance(k1, int) and isinstance(k2, int) and k1 != k2:
        raise ctx.fail(f"inner dimensions {k1} and {k2} differ")
    try:
        batch = broadcast_shapes(sa[:-2], sb[:-2])
    except ValueError as e:
        raise ctx.fail(str(e)) from None
    shape = list(batch) + ([] if va else [sa[-2]]) + ([] if vb else [sb[-1]])
    return [TensorType(a.dtype, tuple(shape))]


@op("MatMul", inputs=2, infer=infer_matmul)
def matmul(a, b):
    return np.matmul(a, b)


def infer_gemm(ctx: InferContext) -> list[TensorType | None]:
    a, b = ctx.type(0), ctx.type(1)
    if a is None or b is None or a.shape is None or b.shape is None:
        return _dtype_only(ctx)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ctx.fail("Gemm inputs must be matrices")
    m, k1 = a.shape[::-1] if ctx.attrs["transA"] else a.shape
    k2, n = b.shape[::-1] if ctx.attrs["transB"] else b.shape
    if isinstance(k1, int) and isinstance(k2, int) and k1 != k2:
        raise ctx.fail(f"inner dimensions {k1} and {k2} differ")
    if ctx.has_input(2) and ctx.shape(2) is not None:
        try:
            broadcast_shapes((m, n), ctx.shape(2))
        except ValueError:
            raise ctx.fail(f"C of shape {list(ctx.shape(2))} does not broadcast to [{m}, {n}]") from None
    return [TensorType(a.dtype, (m, n))]


@op("Gemm", attrs={"alpha": ("float", 1.0), "beta": ("float", 1.0), "transA": ("int", 0), "transB": ("int", 0)},
    inputs=(2, 3), infer=infer_gemm)
def gemm(a, b, c=None, *, alpha, beta, transA, transB):
    """alpha * A' B' + beta * C."""
    a = a.T if transA else a
    b = b.T if transB else b
    y = a @ b
    if alpha != 1.0:
        y = y * np.asarray(alpha, y.dtype)
    if c is not None:
        y = y + (c * np.asarray(beta, c.dtype) if beta != 1.0 else c)
    return y.astype(a.dtype)


def _softmax(x, axis):
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@op("Softmax", attrs={"axis": ("int", -1)}, infer=infer_unary)
def softmax(x, *, axis):
    return _softmax(x, axis).astype(x.dtype)


@op("LogSoftmax", attrs={"axis": ("int", -1)}, infer=infer_unary)
def log_softmax(x, *, axis):
    x64 = x.astype(np.float64)
    m = x64.max(axis=axis, keepdims=True)
    return (x64 - m - np.log(np.exp(x64 - m).sum(axis=axis, keepdims=True))).astype(x.dtype)


def infer_layernorm(ctx: InferContext) -> list[TensorType | None]:
    x = ctx.type(0)
    outs = [x]
    if len(ctx.node.outputs) > 1 and x is not None and x.shape is not None:
        axis = normalize_axis(ctx.attrs["axis"], len(x.shape))
        stat = TensorType("float32", (*x.shape[:axis], *([1] * (len(x.shape) - axis))))
        outs += [stat, stat]
    return outs


@op("LayerNormalization", attrs={"axis": ("int", -1), "epsilon": ("float", 1e-5), "stash_type": ("int", 1)},
    inputs=(2, 3), outputs=(1, 3), infer=infer_layernorm)
def layer_norm(x, scale, bias=None, *, axis, epsilon, stash_type):
    """Normalize over the axes from `axis` on; optional mean and inverse std-dev outputs."""
    axis = normalize_axis(axis, x.ndim)
    axes = tuple(range(axis, x.ndim))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(var + epsilon)
    y = (x64 - mean) * inv * scale
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype), mean.astype(np.float32), inv.astype(np.float32)


def infer_dropout(ctx: InferContext) -> list[TensorType | None]:
    x = ctx.type(0)
    return [x, None if x is None else TensorType("bool", x.shape)]


@op("Dropout", attrs={"seed": ("int", None)}, inputs=(1, 3), outputs=(1, 2), infer=infer_dropout)
def dropout(x, ratio=None, training_mode=None, *, seed):
    """Dropout: identity at inference; in training mode drops with probability `ratio` and rescales. The mask
    is the one ONNX's reference draws (numpy RandomState(seed).uniform(0, 1) >= ratio), so a seeded Dropout
    gives the same mask here as in onnx.reference and the ONNX conformance cases; no seed: fresh entropy."""
    if training_mode is None or not bool(training_mode):
        return x, np.ones(x.shape, dtype=bool)
    r = 0.5 if ratio is None else float(ratio)
    if r == 0:
        return x, np.ones(x.shape, dtype=bool)
    mask = np.random.RandomState(seed).uniform(0.0, 1.0, x.shape) >= r
    return (mask * x * (1.0 / (1.0 - r))).astype(x.dtype), mask
