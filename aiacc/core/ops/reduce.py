"""Reductions (ONNX opset 18+ form: the axes are an optional second input) and ArgMax/ArgMin.

Older models carry `axes` as an attribute; the ONNX bridge turns it into an input on import.
"""
from __future__ import annotations

import numpy as np

from aiacc.core.ir import TensorType
from aiacc.core.ops.registry import InferContext, op
from aiacc.core.ops.shape_utils import normalize_axis

_REDUCE_ATTRS = {"keepdims": ("int", 1), "noop_with_empty_axes": ("int", 0)}


def reduce_axes(rank: int, axes, noop_with_empty_axes: int) -> tuple[int, ...] | None:
    """The axes reduced; None means none (the op is an identity)."""
    if axes is None or np.asarray(axes).size == 0:
        return None if noop_with_empty_axes else tuple(range(rank))
    out = sorted({normalize_axis(int(a), rank) for a in np.asarray(axes).reshape(-1)})
    return tuple(out)


def infer_reduce(ctx: InferContext):
    s = ctx.shape(0)
    if s is None:
        return [TensorType(ctx.dtype(0), None)]
    if ctx.has_input(1):
        axes = ctx.const(1)
        if axes is None:
            return [TensorType(ctx.dtype(0), (None,) * len(s) if ctx.attrs["keepdims"] else None)]
    else:
        axes = None
    try:
        red = reduce_axes(len(s), axes, ctx.attrs["noop_with_empty_axes"])
    except ValueError as e:
        raise ctx.fail(str(e)) from None
    if red is None:
        return [ctx.type(0)]
    if ctx.attrs["keepdims"]:
        out = tuple(1 if i in red else d for i, d in enumerate(s))
    else:
        out = tuple(d for i, d in enumerate(s) if i not in red)
    return [TensorType(ctx.dtype(0), out)]


def _reduction(name, fn, doc):
    def kernel(x, axes=None, *, keepdims, noop_with_empty_axes):
        red = reduce_axes(x.ndim, axes, noop_with_empty_axes)
        if red is None:
            return x
        return np.asarray(fn(x, red, bool(keepdims))).astype(x.dtype)

    kernel.__doc__ = doc
    op(name, attrs=_REDUCE_ATTRS, inputs=(1, 2), infer=infer_reduce)(kernel)


def _extreme(np_fn, empty_value):
    def fn(x, axes, keepdims):
        if x.dtype == np.bool_:
            return (np.all if np_fn is np.min else np.any)(x, axis=axes, keepdims=keepdims)
        if x.size == 0 or any(x.shape[a] == 0 for a in axes):
            init = empty_value(x.dtype)
            return np_fn(x, axis=axes, keepdims=keepdims, initial=init)
        return np_fn(x, axis=axes, keepdims=keepdims)

    return fn


def _lowest(dtype):
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def _highest(dtype):
    return np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).max


def _acc(x):
    return x.astype(np.float64) if np.issubdtype(x.dtype, np.floating) else x


_reduction("ReduceSum", lambda x, a, k: np.sum(_acc(x), axis=a, keepdims=k), "Sum over the axes.")
_reduction("ReduceMean", lambda x, a, k: np.mean(_acc(x), axis=a, keepdims=k), "Mean over the axes.")
_reduction("ReduceMax", _extreme(np.max, _lowest), "Maximum over the axes (-inf over an empty set).")
_reduction("ReduceMin", _extreme(np.min, _highest), "Minimum over the axes (+inf over an empty set).")
_reduction("ReduceProd", lambda x, a, k: np.prod(_acc(x), axis=a, keepdims=k), "Product over the axes.")
_reduction("ReduceSumSquare", lambda x, a, k: np.sum(np.square(_acc(x)), axis=a, keepdims=k),
           "Sum of squares over the axes.")
_reduction("ReduceL1", lambda x, a, k: np.sum(np.abs(_acc(x)), axis=a, keepdims=k), "L1 norm over the axes.")
_reduction("ReduceL2", lambda x, a, k: np.sqrt(np.sum(np.square(_acc(x)), axis=a, keepdims=k)),
           "L2 norm over the axes.")
_reduction("ReduceLogSum", lambda x, a, k: np.log(np.sum(_acc(x), axis=a, keepdims=k)), "log of the sum.")
_reduction("ReduceLogSumExp", lambda x, a, k: np.log(np.sum(np.exp(_acc(x)), axis=a, keepdims=k)),
           "log of the sum of exponentials.")


def infer_arg(ctx: InferContext):
    s = ctx.shape(0)
    if s is None:
        return [TensorType("int64", None)]
    axis = normalize_axis(ctx.attrs["axis"], len(s))
    if ctx.attrs["keepdims"]:
        out = tuple(1 if i == axis else d for i, d in enumerate(s))
    else:
        out = tuple(d for i, d in enumerate(s) if i != axis)
    return [TensorType("int64", out)]


def _arg(name, fn):
    def kernel(x, *, axis, keepdims, select_last_index):
        if select_last_index:
            flipped = np.flip(x, axis)
            idx = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            idx = fn(x, axis=axis)
        if keepdims:
            idx = np.expand_dims(idx, axis)
        return idx.astype(np.int64)

    op(name, attrs={"axis": ("int", 0), "keepdims": ("int", 1), "select_last_index": ("int", 0)},
       infer=infer_arg)(kernel)


_arg("ArgMax", np.argmax)
_arg("ArgMin", np.argmin)


def _infer_cumsum(ctx: InferContext):
    return [ctx.type(0)]


@op("CumSum", inputs=2, attrs={"exclusive": ("int", 0), "reverse": ("int", 0)}, infer=_infer_cumsum)
def cumsum(x, axis, *, exclusive, reverse):
    """Running sum along `axis` (ONNX CumSum): y[i] = x[0] + ... + x[i], summed in that order (as torch's
    cumsum); exclusive leaves x[i] out, reverse sums from the end."""
    a = int(np.asarray(axis).reshape(-1)[0])
    a = a + x.ndim if a < 0 else a
    if reverse:
        x = np.flip(x, a)
    y = np.cumsum(x, axis=a, dtype=x.dtype)
    if exclusive:
        y = np.concatenate([np.zeros_like(np.take(y, [0], axis=a)), np.take(y, range(x.shape[a] - 1), axis=a)], a)
    if reverse:
        y = np.flip(y, a)
    return np.ascontiguousarray(y)
