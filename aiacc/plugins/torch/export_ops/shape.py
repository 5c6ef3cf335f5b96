"""Lowerings of shape ops (Reshape, Flatten, Transpose, (Un)Squeeze, Concat, Gather, Expand, Shape, Constant, Slice,
Split, Pad) and of the reductions ReduceMean/Sum/Max/Min.

A lowering, registered in exporter.LOWERINGS under the op's qualified name ("Conv", "aiacc::FusedConv"),
gets the Builder and an LNode (see exporter.py) and returns the fx value of each output. Constant inputs
that torch takes as Python values (shapes, axes, clip bounds, dropout ratios) are read at export time;
everything else stays a tensor so gradients flow.
"""
from __future__ import annotations

import operator

import numpy as np
import torch
import torch.nn.functional as F

from aiacc.core.ops.tensor import constant
from aiacc.errors import UnsupportedError
from aiacc.plugins.torch.exporter import LOWERINGS


@LOWERINGS.register("Reshape")
def _reshape(b, n):
    target = n.ints(1)
    if target is None:
        return b.call(torch.reshape, n.arg(0), b.method("tolist", n.arg(1)))
    x = n.arg(0)
    if not n.attr("allowzero"):
        target = [b.method("size", x, i) if t == 0 else t for i, t in enumerate(target)]
    # to 0-d: reshape(()) (a bare reshape() has no shape)
    return b.method("reshape", x, *target) if target else b.method("reshape", x, ())


@LOWERINGS.register("Flatten")
def _flatten(b, n):
    axis = n.attr("axis", 1)
    shape = n.shape(0)
    rank = len(shape) if shape is not None else None
    if axis < 0 and rank is not None:
        axis += rank
    if axis == 0:
        return b.method("reshape", n.arg(0), 1, -1)
    y = b.call(torch.flatten, n.arg(0), axis)
    return y if axis == 1 else b.call(torch.flatten, y, 0, axis - 1)


@LOWERINGS.register("Transpose")
def _transpose(b, n):
    perm = n.attr("perm")
    if perm is None:
        perm = list(range(len(n.shape(0))))[::-1]
    return b.method("permute", n.arg(0), *perm)


@LOWERINGS.register("Squeeze")
def _squeeze(b, n):
    axes = n.ints(1) if n.n_inputs > 1 and n.values[1] is not None else None
    if axes is None:
        return b.call(torch.squeeze, n.arg(0))
    return b.call(torch.squeeze, n.arg(0), tuple(axes))


@LOWERINGS.register("Unsqueeze")
def _unsqueeze(b, n):
    axes = n.ints(1)
    rank = len(n.outputs[0].shape) if n.outputs[0].shape is not None else None
    y = n.arg(0)
    for a in sorted(a % rank if rank else a for a in axes):
        y = b.call(torch.unsqueeze, y, a)
    return y


@LOWERINGS.register("Concat")
def _concat(b, n):
    return b.call(torch.cat, n.args, n.attr("axis", 0))


@LOWERINGS.register("Gather")
def _gather(b, n):
    axis = n.attr("axis", 0)
    idx = n.const(1)
    data = n.arg(0)
    if idx is not None and idx.ndim == 0:
        return b.call(torch.select, data, axis, int(idx))
    if idx is not None and idx.ndim == 1 and idx.size > 0 and (idx >= 0).all() \
            and np.array_equal(idx, np.arange(idx[0], idx[0] + idx.size)):
        return b.call(torch.narrow, data, axis, int(idx[0]), int(idx.size))
    shape = n.shape(0)
    if axis == 0 and shape is not None and len(shape) == 2:
        return b.call(F.embedding, n.arg(1), data)  # the embedding-table lookup, with its fast backward
    index = n.arg(1)
    flat = b.call(torch.index_select, data, axis, b.method("reshape", index, -1))
    out_shape = n.outputs[0].shape
    if out_shape is None or not all(isinstance(d, int) for d in out_shape):
        raise UnsupportedError(f"node {n.name}: Gather with a dynamic output shape")
    return b.method("reshape", flat, *out_shape)


@LOWERINGS.register("Expand")
def _expand(b, n):
    out = n.outputs[0].shape
    if out is None or not all(isinstance(d, int) for d in out):
        raise UnsupportedError(f"node {n.name}: Expand to a dynamic shape")
    return b.method("expand", n.arg(0), *out)


@LOWERINGS.register("Shape")
def _shape(b, n):
    t = b.call(torch._shape_as_tensor, n.arg(0))
    start, end = n.attr("start", 0), n.attr("end")
    return b.call(operator.getitem, t, slice(start, end))


@LOWERINGS.register("Constant")
def _constant(b, n):

    return b.constant(np.asarray(constant(**{k: n.attrs.get(k) for k in
                                             ("value", "value_float", "value_floats", "value_int", "value_ints")})))


@LOWERINGS.register("Slice")
def _slice(b, n):
    starts, ends = n.ints(1), n.ints(2)
    axes = n.ints(3) if n.n_inputs > 3 and n.values[3] is not None else list(range(len(starts or [])))
    steps = n.ints(4) if n.n_inputs > 4 and n.values[4] is not None else [1] * len(starts or [])
    shape = n.shape(0)
    if starts is None or ends is None or axes is None or steps is None or shape is None:
        raise UnsupportedError(f"node {n.name}: Slice with non-constant parameters")
    index = [slice(None)] * len(shape)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        if sp <= 0:
            raise UnsupportedError(f"node {n.name}: Slice with a non-positive step")
        index[ax % len(shape)] = slice(st, None if en >= 2 ** 31 - 1 else en, sp)
    return b.call(operator.getitem, n.arg(0), tuple(index))


@LOWERINGS.register("Split")
def _split(b, n):
    axis = n.attr("axis", 0)
    sizes = n.ints(1) if n.n_inputs > 1 and n.values[1] is not None else None
    if sizes is None:
        dim = n.shape(0)[axis]
        k = len(n.outputs)
        num = n.attr("num_outputs")
        chunk = -(-dim // (num or k)) if num else dim // k
        sizes = [min(chunk, dim - chunk * i) for i in range(k)]
    parts = b.call(torch.split, n.arg(0), sizes, axis)
    return [b.call(operator.getitem, parts, i) for i in range(len(n.outputs))]


@LOWERINGS.register("Pad")
def _pad(b, n):
    pads = n.ints(1)
    shape = n.shape(0)
    if pads is None or shape is None:
        raise UnsupportedError(f"node {n.name}: Pad with non-constant pads")
    rank = len(shape)
    axes = n.ints(3) if n.n_inputs > 3 and n.values[3] is not None else list(range(rank))
    k = len(axes)
    widths = {a % rank: (pads[i], pads[k + i]) for i, a in enumerate(axes)}
    # F.pad lists (begin, end) from the last axis backwards, down to the first padded axis (reflect and
    # replicate accept only as many pairs as they pad trailing axes)
    first = min((a for a, w in widths.items() if w != (0, 0)), default=rank - 1)
    torch_pads = []
    for a in range(rank - 1, first - 1, -1):
        torch_pads += list(widths.get(a, (0, 0)))
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}[n.attr("mode")]
    value = n.scalar(2) if n.n_inputs > 2 and n.values[2] is not None else None
    if mode == "constant":
        return b.call(F.pad, n.arg(0), torch_pads, "constant", 0.0 if value is None else value)
    return b.call(F.pad, n.arg(0), torch_pads, mode)


def _reduce(fn, all_fn=None):
    def lower(b, n):
        axes = n.ints(1) if n.n_inputs > 1 and n.values[1] is not None else None
        keep = bool(n.attr("keepdims", 1))
        if not axes:
            if n.attr("noop_with_empty_axes", 0):
                return n.arg(0)
            axes = list(range(len(n.shape(0))))
        return b.call(fn, n.arg(0), tuple(axes), keep)
    return lower


LOWERINGS.add("ReduceMean", _reduce(torch.mean))
LOWERINGS.add("ReduceSum", _reduce(torch.sum))
LOWERINGS.add("ReduceMax", _reduce(torch.amax))
LOWERINGS.add("ReduceMin", _reduce(torch.amin))


@LOWERINGS.register("CumSum")
def _cumsum(b, n):
    axes = n.ints(1)
    if not axes or len(axes) != 1:
        raise UnsupportedError(f"node {n.name}: CumSum with a non-constant axis")
    x = n.arg(0)
    if n.attr("reverse", 0):
        x = b.call(torch.flip, x, (axes[0],))
    y = b.call(torch.cumsum, x, axes[0])
    if n.attr("exclusive", 0):
        y = b.call(operator.sub, y, x)  # the running sum without x[i]
    if n.attr("reverse", 0):
        y = b.call(torch.flip, y, (axes[0],))
    return y
