"""Resize (ONNX opset 19 semantics): nearest, linear and cubic interpolation, every coordinate transformation
mode, antialiasing, `axes` and `keep_aspect_ratio_policy`.

Interpolation is separable: each resized axis is handled in turn by mapping output positions to input
coordinates, taking the neighbouring input elements and weighting them (the same construction as the ONNX
definition).
"""
from __future__ import annotations

import math

import numpy as np

from aiacc.core.ir import TensorType
from aiacc.core.ops.registry import InferContext, op
from aiacc.core.ops.shape_utils import normalize_axis

_ATTRS = {
    "antialias": ("int", 0),
    "axes": ("ints", None),
    "coordinate_transformation_mode": ("string", "half_pixel"),
    "cubic_coeff_a": ("float", -0.75),
    "exclude_outside": ("int", 0),
    "extrapolation_value": ("float", 0.0),
    "keep_aspect_ratio_policy": ("string", "stretch"),
    "mode": ("string", "nearest"),
    "nearest_mode": ("string", "round_prefer_floor"),
}


def resize_plan(shape, scales, sizes, axes, policy):
    """Per-axis (scale, output size) for every axis of the input."""
    rank = len(shape)
    axes = list(range(rank)) if axes is None else [normalize_axis(int(a), rank) for a in axes]
    scale = [1.0] * rank
    out = list(shape)
    if sizes is not None and np.asarray(sizes).size:
        sizes = [int(s) for s in np.asarray(sizes).reshape(-1)]
        if len(sizes) != len(axes):
            raise ValueError(f"sizes has {len(sizes)} entries for {len(axes)} axes")
        for a, s in zip(axes, sizes):
            out[a] = s
            scale[a] = s / shape[a]
        if policy != "stretch":
            if policy == "not_larger":
                common = min(scale[a] for a in axes)
            elif policy == "not_smaller":
                common = max(scale[a] for a in axes)
            else:
                raise ValueError(f"unknown keep_aspect_ratio_policy {policy!r}")
            for a in axes:
                scale[a] = common
                out[a] = int(common * shape[a] + 0.5)
    elif scales is not None and np.asarray(scales).size:
        scales = [float(s) for s in np.asarray(scales).reshape(-1)]
        if len(scales) != len(axes):
            raise ValueError(f"scales has {len(scales)} entries for {len(axes)} axes")
        for a, s in zip(axes, scales):
            if s <= 0:
                raise ValueError(f"scale {s} must be positive")
            scale[a] = s
            out[a] = int(math.floor(s * shape[a]))
    else:
        raise ValueError("Resize needs scales or sizes")
    return axes, scale, out


def _source_coords(mode, out_len, in_len, scale, roi):
    """Input coordinate of each output position, and a mask of positions outside the input (crop mode)."""
    y = np.arange(out_len, dtype=np.float64)
    out_w = scale * in_len  # the ONNX formulas use the unrounded output length
    outside = None
    if mode == "align_corners":
        x = np.zeros(out_len) if out_w == 1 else y * (in_len - 1) / (out_w - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        r0, r1 = roi
        if out_w == 1:
            x = np.full(out_len, (r1 - r0) * (in_len - 1) / 2)
        else:
            x = y * (r1 - r0) * (in_len - 1) / (out_w - 1)
        x = x + r0 * (in_len - 1)
        outside = (x < 0) | (x > in_len - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(out_len, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        adjustment = out_len / out_w
        offset = in_len / 2 * (1 - adjustment)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")
    return x, outside


def _nearest_coeffs(ratio, nearest_mode):
    if ratio == 1.0:  # integral coordinate
        return np.array([0.0, 1.0])
    if nearest_mode == "round_prefer_floor":
        return np.array([ratio <= 0.5, ratio > 0.5], dtype=np.float64)
    if nearest_mode == "round_prefer_ceil":
        return np.array([ratio < 0.5, ratio >= 0.5], dtype=np.float64)
    if nearest_mode == "floor":
        return np.array([1.0, 0.0])
    if nearest_mode == "ceil":
        return np.array([0.0, 1.0])
    raise ValueError(f"unknown nearest_mode {nearest_mode!r}")


def _cubic_kernel(x, a):
    x = abs(x)
    if x <= 1:
        return (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1
    if x < 2:
        return a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a
    return 0.0


def _coeffs(ratio, scale, mode, nearest_mode, a, antialias):
    if mode == "nearest":
        return _nearest_coeffs(ratio, nearest_mode)
    if mode == "linear":
        if antialias:
            s = min(scale, 1.0)
            start = int(np.floor(-1 / s) + 1)
            args = (np.arange(start, 2 - start) - ratio) * s
            c = np.clip(1 - np.abs(args), 0, 1)
            return c / c.sum()
        return np.array([1 - ratio, ratio])
    if mode == "cubic":
        if antialias:
            s = min(scale, 1.0)
            start = int(np.floor(-2 / s) + 1)
            c = np.array([_cubic_kernel(s * (i - ratio), a) for i in range(start, 2 - start)])
            return c / c.sum()
        return np.array([_cubic_kernel(ratio + 1, a), _cubic_kernel(ratio, a), _cubic_kernel(1 - ratio, a),
                         _cubic_kernel(2 - ratio, a)])
    raise ValueError(f"unknown mode {mode!r}")


def _resize_axis(data, axis, scale, out_len, roi, attrs):
    in_len = data.shape[axis]
    x, outside = _source_coords(attrs["coordinate_transformation_mode"], out_len, in_len, scale, roi)
    floor = np.floor(x)
    ratios = np.where(x == floor, 1.0, x - floor)
    coeffs = np.stack([_coeffs(float(r), scale, attrs["mode"], attrs["nearest_mode"], attrs["cubic_coeff_a"],
                               attrs["antialias"]) for r in ratios]) if out_len else np.zeros((0, 2))
    n = coeffs.shape[1]
    # neighbour indices: the n input positions nearest to x, ties broken towards smaller indices
    pad = int(np.ceil(n / 2))
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        base = -((n - 1) // 2)
        offset = np.where(frac <= 0.5, base, base + 1)
    idx = (p + offset)[:, None] + np.arange(n)[None, :] - pad
    if attrs["exclude_outside"]:
        coeffs = np.where((idx < 0) | (idx >= in_len), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    idx = np.clip(idx, 0, in_len - 1)
    if attrs["mode"] == "nearest":
        pick = idx[np.arange(out_len), np.argmax(coeffs, axis=1)] if out_len else np.zeros(0, np.int64)
        result = np.take(data, pick, axis=axis)
    else:
        gathered = np.take(data, idx, axis=axis)  # ..., out, n, ...
        shape = (1,) * axis + coeffs.shape + (1,) * (data.ndim - axis - 1)
        result = (gathered * coeffs.reshape(shape)).sum(axis=axis + 1)
    if outside is not None and outside.any():
        mask = outside.reshape((1,) * axis + (out_len,) + (1,) * (data.ndim - axis - 1))
        result = np.where(mask, attrs["extrapolation_value"], result)
    return result


def infer_resize(ctx: InferContext):
    s = ctx.shape(0)
    if s is None:
        return [TensorType(ctx.dtype(0), None)]
    scales = ctx.const(2) if ctx.has_input(2) else None
    sizes = ctx.const(3) if ctx.has_input(3) else None
    if (ctx.has_input(2) and scales is None) or (ctx.has_input(3) and sizes is None):
        return [TensorType(ctx.dtype(0), (None,) * len(s))]
    rank = len(s)
    try:
        axes = list(range(rank)) if ctx.attrs["axes"] is None else \
            [normalize_axis(a, rank) for a in ctx.attrs["axes"]]
        if all(isinstance(s[a], int) for a in axes):
            concrete = [d if isinstance(d, int) else 1 for d in s]
            _, _, out = resize_plan(concrete, scales, sizes, ctx.attrs["axes"], ctx.attrs["keep_aspect_ratio_policy"])
            return [TensorType(ctx.dtype(0), tuple(o if a in axes else d for a, (o, d) in enumerate(zip(out, s))))]
        # a symbolic axis survives where its scale is 1; sizes fix a dimension outright (stretch policy)
        out = list(s)
        use_sizes = sizes is not None and sizes.size
        values = (sizes if use_sizes else scales).reshape(-1)
        if len(values) != len(axes):
            raise ValueError(f"{'sizes' if use_sizes else 'scales'} has {len(values)} entries for {len(axes)} axes")
        for a, val in zip(axes, values):
            if use_sizes:
                out[a] = int(val) if ctx.attrs["keep_aspect_ratio_policy"] == "stretch" else None
            elif isinstance(s[a], int):
                out[a] = int(math.floor(float(val) * s[a]))
            elif float(val) != 1.0:
                out[a] = None
    except ValueError as e:
        raise ctx.fail(str(e)) from None
    return [TensorType(ctx.dtype(0), tuple(out))]


@op("Resize", attrs=_ATTRS, inputs=(1, 4), infer=infer_resize)
def resize(x, roi=None, scales=None, sizes=None, **attrs):
    """Resize by scales or to sizes, interpolating with the chosen mode."""
    axes, scale, out = resize_plan(x.shape, scales, sizes, attrs["axes"], attrs["keep_aspect_ratio_policy"])
    rank = x.ndim
    full_roi = None
    if roi is not None and roi.size:
        r = [float(v) for v in roi.reshape(-1)]
        k = len(axes)
        if len(r) != 2 * k:
            raise ValueError(f"roi has {len(r)} entries for {k} axes")
        full_roi = [0.0] * rank + [1.0] * rank
        for i, a in enumerate(axes):
            full_roi[a], full_roi[rank + a] = r[i], r[k + i]
    if attrs["mode"] == "nearest" and attrs["antialias"]:
        raise ValueError("antialias is not defined for mode nearest")
    result = x if attrs["mode"] == "nearest" else x.astype(np.float64)
    for a in axes:
        axis_roi = None if full_roi is None else (full_roi[a], full_roi[rank + a])
        if math.isclose(scale[a], 1.0) and out[a] == result.shape[a] and \
                (axis_roi is None or (math.isclose(axis_roi[0], 0.0) and math.isclose(axis_roi[1], 1.0))):
            continue
        if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize" and axis_roi is None:
            raise ValueError("coordinate_transformation_mode tf_crop_and_resize needs roi")
        result = _resize_axis(result, a, scale[a], out[a], axis_roi, attrs)
    if np.issubdtype(x.dtype, np.integer) and result.dtype != x.dtype:
        info = np.iinfo(x.dtype)
        result = np.clip(np.rint(result), info.min, info.max)
    return result.astype(x.dtype)
