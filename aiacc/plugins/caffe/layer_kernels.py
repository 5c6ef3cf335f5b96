"""aiacc's own numpy kernels for Caffe layer types that stay opaque and that OpenCV dnn (4.11) cannot run,
registered in importer.BUILTIN_LAYERS: BVLC's Threshold, Clip, Reduction, ArgMax, Tile and Embed, MAX Pooling
with its argmax mask as a second top (SegNet/ENet; OpenCV computes that mask only inside a net that reads it),
and the SegNet/YOLO forks' Upsample (max-unpooling by a mask bottom, or nearest-neighbour without one). Each follows
the Caffe source of its layer (forward pass, CPU), including its output shape; the layer is written back
unchanged. A user's register_layer for the same type takes precedence.
"""
from __future__ import annotations

import numpy as np

from aiacc.errors import KernelError, ShapeError
from aiacc.plugins.caffe.importer import BUILTIN_LAYERS, FORK_FIELDS, OPAQUE_BLOBS, CustomLayer
from aiacc.plugins.caffe.schema import pb
from aiacc.plugins.caffe.unknown_fields import field_name


def _axis(layer, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"layer {layer.name!r} ({layer.type}): {what} {axis} is out of range for rank {rank}")
    return axis % max(rank, 1)


def _threshold(layer, x):
    return (x > layer.threshold_param.threshold).astype(np.float32)


def _clip(layer, x):
    p = layer.clip_param
    return np.clip(x, p.min, p.max).astype(np.float32)


def _reduction(layer, x):
    """Caffe's Reduction: over every axis from `axis` to the last, times coeff; top shape = shape[:axis]."""
    p = layer.reduction_param
    a = _axis(layer, p.axis, x.ndim)
    flat = x.reshape(x.shape[:a] + (-1,)).astype(np.float64)
    op = p.operation
    if op == pb.ReductionParameter.SUM:
        y = flat.sum(-1)
    elif op == pb.ReductionParameter.ASUM:
        y = np.abs(flat).sum(-1)
    elif op == pb.ReductionParameter.SUMSQ:
        y = (flat * flat).sum(-1)
    else:  # MEAN
        y = flat.mean(-1)
    return np.asarray(y * p.coeff, np.float32)


def _top_k(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest along the last axis, in Caffe's order: std::partial_sort of (value, index)
    pairs by std::greater, so equal values put the larger index first."""
    n = values.shape[-1]
    idx = np.broadcast_to(np.arange(n), values.shape)
    order = np.lexsort((-idx, -values.astype(np.float64)), axis=-1)
    return order[..., :k]


def _argmax(layer, x):
    p = layer.argmax_param
    k = int(p.top_k)
    if p.HasField("axis"):
        a = _axis(layer, p.axis, x.ndim)
        if not 1 <= k <= x.shape[a]:
            raise ShapeError(f"layer {layer.name!r} (ArgMax): top_k {k} must be within 1..{x.shape[a]}")
        moved = np.moveaxis(x, a, -1)
        order = _top_k(moved, k)
        out = np.take_along_axis(moved, order, -1) if p.out_max_val else order
        return np.moveaxis(out, -1, a).astype(np.float32)
    flat = x.reshape(x.shape[0], -1)
    if not 1 <= k <= flat.shape[1]:
        raise ShapeError(f"layer {layer.name!r} (ArgMax): top_k {k} must be within 1..{flat.shape[1]}")
    order = _top_k(flat, k)
    if not p.out_max_val:
        return order.reshape(x.shape[0], 1, k).astype(np.float32)
    return np.stack([order, np.take_along_axis(flat, order, -1)], 1).astype(np.float32)


def _tile(layer, x):
    p = layer.tile_param
    a = _axis(layer, p.axis, x.ndim)
    if p.tiles < 1:
        raise ShapeError(f"layer {layer.name!r} (Tile): tiles must be at least 1, got {p.tiles}")
    reps = [1] * x.ndim
    reps[a] = int(p.tiles)
    return np.tile(x, reps)


def _embed_blobs(layer, shapes):
    p = layer.embed_param
    return [("weights", [int(p.input_dim), int(p.num_output)])] + ([("bias", [int(p.num_output)])] if p.bias_term else [])


def _embed(layer, ids, weights, bias=None):
    """Caffe's Embed: row ids[i] of the (input_dim, num_output) weights (+ bias); top shape ids.shape + (N,)."""
    p = layer.embed_param
    index = ids.astype(np.int64)
    if (index != ids).any() or (index < 0).any() or (index >= p.input_dim).any():
        raise KernelError(f"layer {layer.name!r} (Embed): its bottom must hold integers in [0, {p.input_dim})")
    out = weights[index]
    if bias is not None:
        out = out + bias
    return out.astype(np.float32)


def _upsample_param(layer):
    msg = pb.UpsampleParameter()
    from google.protobuf import text_format

    for kept in layer.aiacc_unknown_text:
        if field_name(kept) == "upsample_param":
            body = kept.strip()[len("upsample_param"):].lstrip().lstrip(":").strip()
            text_format.Parse(body[1:-1] if body.startswith("{") else body, msg)
    return msg


def _upsample_size(layer, h: int, w: int) -> tuple[int, int]:
    """The top's size as the SegNet fork computes it: upsample_h/w when given, else scale * size, one less
    where pad_out_h/w asks for an odd size."""
    p = _upsample_param(layer)
    sh = p.scale_h if p.HasField("scale_h") else p.scale
    sw = p.scale_w if p.HasField("scale_w") else p.scale
    oh = p.upsample_h if p.HasField("upsample_h") else h * sh - int(p.pad_out_h)
    ow = p.upsample_w if p.HasField("upsample_w") else w * sw - int(p.pad_out_w)
    return int(oh), int(ow)


def _upsample(layer, x, mask=None):
    n, c, h, w = x.shape
    oh, ow = _upsample_size(layer, h, w)
    if mask is None:  # YOLO v3 ports: nearest neighbour by an integer scale
        if oh % h or ow % w:
            raise ShapeError(f"layer {layer.name!r} (Upsample): {h}x{w} to {oh}x{ow} is no integer scale")
        return np.repeat(np.repeat(x, oh // h, 2), ow // w, 3)
    if mask.shape != x.shape:
        raise ShapeError(f"layer {layer.name!r} (Upsample): mask of shape {list(mask.shape)} for a bottom of "
                         f"shape {list(x.shape)}")
    index = mask.reshape(n * c, h * w).astype(np.int64)
    if (index < 0).any() or (index >= oh * ow).any():
        raise KernelError(f"layer {layer.name!r} (Upsample): a mask index is outside the {oh}x{ow} top")
    out = np.zeros((n * c, oh * ow), np.float32)
    np.put_along_axis(out, index, x.reshape(n * c, h * w), 1)
    return out.reshape(n, c, oh, ow)


def _upsample_infer(layer, shapes):
    n, c, h, w = shapes[0]
    return [[n, c, *_upsample_size(layer, h, w)]]


def _pool_geometry(layer, h: int, w: int):
    """(kernel, stride, pad, out) per axis of a Pooling layer, with Caffe's rounding (CEIL unless FLOOR or
    the forks' ceil_mode: false) and its rule that the last window starts inside the image."""
    p = layer.pooling_param
    k = (p.kernel_h, p.kernel_w) if p.HasField("kernel_h") else (p.kernel_size, p.kernel_size)
    st = (p.stride_h, p.stride_w) if p.HasField("stride_h") else (p.stride, p.stride)
    pad = (p.pad_h, p.pad_w) if (p.HasField("pad_h") or p.HasField("pad_w")) else (p.pad, p.pad)
    ceil = bool(p.ceil_mode) if p.HasField("ceil_mode") else p.round_mode == pb.PoolingParameter.CEIL
    outs = []
    for size, kk, ss, pp in zip((h, w), k, st, pad):
        span = size + 2 * pp - kk
        out = (-(-span // ss) if ceil else span // ss) + 1
        if pp and (out - 1) * ss >= size + pp:
            out -= 1
        outs.append(out)
    return k, st, pad, outs


def _max_pool_with_mask(layer, x):
    """Caffe's MAX Pooling with two tops: the maxima and, as floats, each one's index h * W + w in its input
    plane (the first maximum in row-major order of the window, which is clipped to the image)."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (oh, ow) = _pool_geometry(layer, h, w)
    big_h, big_w = (oh - 1) * sh + kh, (ow - 1) * sw + kw
    padded = np.full((n, c, max(big_h, h + ph), max(big_w, w + pw)), -np.inf, np.float32)
    padded[:, :, ph:ph + h, pw:pw + w] = x
    windows = np.lib.stride_tricks.sliding_window_view(padded, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw][:, :, :oh, :ow]
    flat = windows.reshape(n, c, oh, ow, kh * kw)
    best = flat.argmax(-1)
    top = np.take_along_axis(flat, best[..., None], -1)[..., 0]
    rows = np.arange(oh)[:, None] * sh - ph + best // kw
    cols = np.arange(ow)[None, :] * sw - pw + best % kw
    return [top.astype(np.float32), (rows * w + cols).astype(np.float32)]


def _max_pool_with_mask_infer(layer, shapes):
    n, c, h, w = shapes[0]
    oh, ow = _pool_geometry(layer, h, w)[3]
    return [[n, c, oh, ow], [n, c, oh, ow]]


def _is_max_pool_with_mask(layer) -> bool:
    p = layer.pooling_param
    return (len(layer.top) == 2 and p.pool == pb.PoolingParameter.MAX and not p.global_pooling
            and (p.HasField("kernel_size") or p.HasField("kernel_h")))


BUILTIN_LAYERS.update({
    "Pooling": CustomLayer(_max_pool_with_mask, infer=_max_pool_with_mask_infer, accepts=_is_max_pool_with_mask),
    "Threshold": CustomLayer(_threshold),
    "Clip": CustomLayer(_clip),
    "Reduction": CustomLayer(_reduction),
    "ArgMax": CustomLayer(_argmax),
    "Tile": CustomLayer(_tile),
    "Embed": CustomLayer(_embed, blobs=_embed_blobs),
    "Upsample": CustomLayer(_upsample, infer=_upsample_infer),
})
# the forks' Upsample keeps its upsample_param as text; the kernel reads it (the layer is no translator's)
FORK_FIELDS.setdefault("Upsample", {})["upsample_param"] = pb.UpsampleParameter

# the SSD fork's Normalize (OpenCV runs it) reads one scale per channel, or one for all with channel_shared
OPAQUE_BLOBS["Normalize"] = lambda layer, shapes: [("scale", [1 if layer.norm_param.channel_shared else shapes[0][1]])]
