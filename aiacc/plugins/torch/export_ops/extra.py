"""IR op -> torch lowerings for the less common ops the importer emits (Resize, Tile, ArgMax/ArgMin) and that
ONNX models bring (ReduceProd, ReduceL1/L2, ReduceLogSumExp, ReduceSumSquare, Range, ConstantOfShape).

Kept apart from the hot path of CNNs and transformers (elementwise, shape, nn, fused). Same contract: a lowering gets the
Builder and an LNode (see exporter.py) and returns the fx value of each output.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from aiacc.core.ops.resize import resize, resize_plan
from aiacc.errors import UnsupportedError
from aiacc.plugins.torch.exporter import LOWERINGS, LNode


# ------------------------------------------------------------------------------------------------ Resize
def _resize_plan(n: LNode):
    """(axes, per-axis scale or None, per-axis output size) of a Resize with constant scales / sizes."""
    shape = n.shape(0)
    if shape is None or not all(isinstance(d, int) for d in shape):
        raise UnsupportedError(f"node {n.name}: Resize of a tensor without a static shape")
    scales = n.const(2) if n.n_inputs > 2 and n.values[2] is not None else None
    sizes = n.const(3) if n.n_inputs > 3 and n.values[3] is not None else None
    if (n.n_inputs > 2 and n.values[2] is not None and scales is None) or \
            (n.n_inputs > 3 and n.values[3] is not None and sizes is None):
        raise UnsupportedError(f"node {n.name}: Resize with non-constant scales or sizes")
    if n.n_inputs > 1 and n.values[1] is not None and n.const(1) is not None and n.const(1).size:
        if n.attr("coordinate_transformation_mode") == "tf_crop_and_resize":
            raise UnsupportedError(f"node {n.name}: Resize with tf_crop_and_resize")
    use_sizes = sizes is not None and sizes.size
    axes, scale, out = resize_plan(list(shape), None if use_sizes else scales, sizes if use_sizes else None,
                                   n.attr("axes"), n.attr("keep_aspect_ratio_policy"))
    return list(shape), axes, scale, out, not use_sizes


def _interpolate_mode(n: LNode) -> tuple[str, bool | None] | None:
    """The F.interpolate mode (and align_corners) with exactly this Resize's semantics, if there is one."""
    mode, ctm = n.attr("mode"), n.attr("coordinate_transformation_mode")
    if n.attr("antialias") or n.attr("exclude_outside"):
        return None
    if mode == "nearest":
        if ctm == "asymmetric" and n.attr("nearest_mode") == "floor":
            return "nearest", None
        if ctm == "half_pixel" and n.attr("nearest_mode") == "round_prefer_ceil":
            return "nearest-exact", None
        return None
    if mode == "linear":
        if ctm == "align_corners":
            return "linear", True
        if ctm == "half_pixel":
            return "linear", False
    return None


def _axis_matrix(n: LNode, in_len: int, scale: float, out_len: int, by_scale: bool) -> np.ndarray:
    """The (out_len, in_len) matrix of one axis's interpolation (Resize is separable and linear per axis),
    computed by the reference kernel on an identity matrix."""
    attrs = dict(n.attrs)
    attrs["axes"] = [0]
    eye = np.eye(in_len, dtype=np.float64)
    scales = np.array([scale], np.float32) if by_scale else None
    sizes = None if by_scale else np.array([out_len], np.int64)
    return np.asarray(resize(eye, None, scales, sizes, **attrs), dtype=np.float64)


@LOWERINGS.register("Resize")
def _resize(b, n: LNode):
    shape, axes, scale, out, by_scale = _resize_plan(n)
    rank = len(shape)
    moved = [a for a in range(rank) if out[a] != shape[a] or not math.isclose(scale[a], 1.0)]
    x = n.arg(0)
    mode = _interpolate_mode(n)
    spatial = list(range(2, rank))
    if mode is not None and 3 <= rank <= 5 and set(moved) <= set(spatial) and \
            (mode[0] != "linear" or all(out[a] > 1 for a in spatial)):
        name, align = mode
        if name == "linear":
            name = {3: "linear", 4: "bilinear", 5: "trilinear"}[rank]
        kwargs = {} if align is None else {"align_corners": align}
        if by_scale:
            kwargs["scale_factor"] = [float(scale[a]) for a in spatial]
        else:
            kwargs["size"] = [out[a] for a in spatial]
        return b.call(F.interpolate, x, mode=name, **kwargs)
    # the general form: an index pick (nearest) or a matrix product (linear, cubic) per resized axis
    y = x
    for a in moved:
        m = _axis_matrix(n, shape[a], scale[a], out[a], by_scale)
        if n.attr("mode") == "nearest":
            pick = np.argmax(m, axis=1).astype(np.int64)
            y = b.call(torch.index_select, y, a, b.constant(pick))
        else:
            w = b.constant(m.astype(np.dtype(n.outputs[0].dtype or "float32")))
            y = b.call(torch.movedim, b.call(torch.matmul, w, b.call(torch.movedim, y, a, -2)), -2, a)
    return y


# ------------------------------------------------------------------------------------------------ others
@LOWERINGS.register("Tile")
def _tile(b, n: LNode):
    repeats = n.ints(1)
    if repeats is None:
        raise UnsupportedError(f"node {n.name}: Tile with non-constant repeats")
    return b.method("repeat", n.arg(0), *repeats)


def _arg(fn):
    def lower(b, n: LNode):
        axis, keep = n.attr("axis", 0), bool(n.attr("keepdims", 1))
        x = n.arg(0)
        if n.attr("select_last_index", 0):
            shape = n.shape(0)
            if shape is None or not isinstance(shape[axis], int):
                raise UnsupportedError(f"node {n.name}: {n.op} select_last_index on a dynamic axis")
            idx = b.call(fn, b.call(torch.flip, x, (axis,)), axis, keep)
            return b.call(torch.sub, shape[axis] - 1, idx)
        return b.call(fn, x, axis, keep)
    return lower


LOWERINGS.add("ArgMax", _arg(torch.argmax))
LOWERINGS.add("ArgMin", _arg(torch.argmin))


def _axes(n: LNode):
    axes = n.ints(1) if n.n_inputs > 1 and n.values[1] is not None else None
    if n.n_inputs > 1 and n.values[1] is not None and axes is None:
        raise UnsupportedError(f"node {n.name}: {n.op} with non-constant axes")
    if not axes:
        if n.attr("noop_with_empty_axes", 0):
            return None
        axes = list(range(len(n.shape(0))))
    return tuple(axes)


def _reduce(kind):
    def lower(b, n: LNode):
        axes = _axes(n)
        x = n.arg(0)
        if axes is None:
            return x
        keep = bool(n.attr("keepdims", 1))
        if kind == "prod":
            for a in sorted(axes, reverse=True):
                x = b.call(torch.prod, x, a, True)
            return x if keep else b.call(torch.squeeze, x, axes)
        if kind == "l1":
            return b.call(torch.sum, b.call(torch.abs, x), axes, keep)
        if kind == "l2":
            return b.call(torch.sqrt, b.call(torch.sum, b.call(torch.square, x), axes, keep))
        if kind == "sumsquare":
            return b.call(torch.sum, b.call(torch.square, x), axes, keep)
        if kind == "logsum":
            return b.call(torch.log, b.call(torch.sum, x, axes, keep))
        return b.call(torch.logsumexp, x, axes, keep)
    return lower


for _op, _kind in (("ReduceProd", "prod"), ("ReduceL1", "l1"), ("ReduceL2", "l2"), ("ReduceSumSquare", "sumsquare"),
                   ("ReduceLogSum", "logsum"), ("ReduceLogSumExp", "logsumexp")):
    LOWERINGS.add(_op, _reduce(_kind))


@LOWERINGS.register("Range")
def _range(b, n: LNode):
    start, limit, delta = n.scalar(0), n.scalar(1), n.scalar(2)
    dtype = getattr(torch, np.dtype(n.outputs[0].dtype or "float32").name)
    return b.call(torch.arange, start, limit, delta, dtype=dtype, device=b.device())


@LOWERINGS.register("ConstantOfShape")
def _constant_of_shape(b, n: LNode):
    value = n.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    dtype = getattr(torch, value.dtype.name)
    shape = n.ints(0)
    if shape is None:
        shape = b.method("tolist", n.arg(0))
    return b.call(torch.full, shape, value[0].item(), dtype=dtype, device=b.device())
