"""Ops that cut, pad or tile tensors (ONNX semantics, opset 18+): Split, Slice, Pad, Tile, ConstantOfShape, Range.

Where ONNX moved an attribute to an input in a newer opset (Split's `split`, Pad's `pads`), the registry
follows the newer form; the ONNX bridge converts older models on import.
"""
from __future__ import annotations

import numpy as np

from aiacc.core.ir import TensorType
from aiacc.core.ops.registry import InferContext, get_schema, infer_by_running, op
from aiacc.core.ops.shape_utils import normalize_axis

INT_MAX = 2 ** 63 - 1


# ------------------------------------------------------------------------------------------------ Split
def split_sizes(dim: int, split, num_outputs: int | None, n_out: int) -> list[int]:
    """Chunk sizes of Split: explicit sizes, else `num_outputs` chunks of ceil(dim / n) (last one smaller),
    else equal parts, one per output."""
    if split is not None:
        sizes = [int(s) for s in np.asarray(split).reshape(-1)]
        if sum(sizes) != dim:
            raise ValueError(f"split sizes {sizes} do not add up to the dimension {dim}")
        return sizes
    n = num_outputs or n_out
    if num_outputs is None:
        if dim % n:
            raise ValueError(f"dimension {dim} does not split evenly into {n} outputs")
        return [dim // n] * n
    chunk = -(-dim // n)
    sizes = [min(chunk, max(dim - chunk * i, 0)) for i in range(n)]
    return sizes


def infer_split(ctx: InferContext):
    s = ctx.shape(0)
    n_out = len(ctx.node.outputs)
    if s is None:
        return [TensorType(ctx.dtype(0), None)] * n_out
    axis = normalize_axis(ctx.attrs["axis"], len(s))
    num = ctx.attrs["num_outputs"]
    if num is not None and num != n_out:
        raise ctx.fail(f"num_outputs={num} but the node has {n_out} outputs")
    split = ctx.const(1) if ctx.has_input(1) else None
    if ctx.has_input(1) and split is None or not isinstance(s[axis], int):
        if split is not None:
            sizes = [int(x) for x in split.reshape(-1)]
        elif isinstance(s[axis], str) and num is None and n_out == 1:
            sizes = [s[axis]]
        else:
            sizes = [None] * n_out
    else:
        try:
            sizes = split_sizes(s[axis], split, num, n_out)
        except ValueError as e:
            raise ctx.fail(str(e)) from None
    if len(sizes) != n_out:
        raise ctx.fail(f"{len(sizes)} split sizes for {n_out} outputs")
    return [TensorType(ctx.dtype(0), tuple(s[:axis]) + (d,) + tuple(s[axis + 1:])) for d in sizes]


def _split_kernel(x, split=None, *, axis, num_outputs, _n_out):
    sizes = split_sizes(x.shape[axis], split, num_outputs, _n_out)
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


@op("Split", attrs={"axis": ("int", 0), "num_outputs": ("int", None)}, inputs=(1, 2), outputs=(1, -1),
    infer=infer_split)
def split(x, split=None, *, axis, num_outputs):
    """Split into parts along `axis` (explicit sizes, or `num_outputs` chunks of ceil(dim / n), the last one
    smaller, or equal parts, one per output of the node)."""
    if split is None and num_outputs is None:
        raise ValueError("Split without sizes or num_outputs needs the node's output count")
    n = num_outputs if num_outputs is not None else len(np.asarray(split).reshape(-1))
    return _split_kernel(x, split, axis=axis, num_outputs=num_outputs, _n_out=n)


def _run_split(schema, node, arrays):
    """Split's kernel needs the node's output count when neither sizes nor num_outputs are given."""
    attrs = schema.resolved_attrs(node)
    sp = arrays[1] if len(arrays) > 1 else None
    return [np.asarray(r) for r in _split_kernel(arrays[0], sp, axis=attrs["axis"],
                                                 num_outputs=attrs["num_outputs"], _n_out=len(node.outputs))]


get_schema("Split").node_runner = _run_split


# ------------------------------------------------------------------------------------------------ Slice
def slice_bounds(dim: int, start: int, end: int, step: int) -> tuple[int, int, int]:
    """ONNX Slice clamping for one axis; returns (start, stop, count) with stop usable in range()."""
    if step == 0:
        raise ValueError("slice step cannot be 0")
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start = min(max(start, 0), dim)
        end = min(max(end, 0), dim)
        count = max(0, -(-(end - start) // step))
    else:
        start = min(max(start, -1), dim - 1)
        end = min(max(end, -1), dim - 1)
        count = max(0, -(-(start - end) // -step))
    return start, end, count


def _slice_params(rank, starts, ends, axes, steps):
    starts = [int(v) for v in np.asarray(starts).reshape(-1)]
    ends = [int(v) for v in np.asarray(ends).reshape(-1)]
    axes = list(range(len(starts))) if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
    steps = [1] * len(starts) if steps is None else [int(s) for s in np.asarray(steps).reshape(-1)]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError("starts, ends, axes and steps differ in length")
    axes = [normalize_axis(a, rank) for a in axes]
    if len(set(axes)) != len(axes):
        raise ValueError(f"axes {axes} repeat")
    return starts, ends, axes, steps


def infer_slice(ctx: InferContext):
    s = ctx.shape(0)
    if s is None:
        return [TensorType(ctx.dtype(0), None)]
    consts = [ctx.const(i) if ctx.has_input(i) else None for i in range(1, 5)]
    if consts[0] is None or consts[1] is None or (ctx.has_input(3) and consts[2] is None) \
            or (ctx.has_input(4) and consts[3] is None):
        return [TensorType(ctx.dtype(0), (None,) * len(s))]
    try:
        starts, ends, axes, steps = _slice_params(len(s), *consts)
    except ValueError as e:
        raise ctx.fail(str(e)) from None
    out = list(s)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        d = s[ax]
        if isinstance(d, int):
            out[ax] = slice_bounds(d, st, en, sp)[2]
        elif st == 0 and sp == 1 and en >= 2 ** 31 - 1:
            out[ax] = d  # the whole symbolic axis
        else:
            out[ax] = None
    return [TensorType(ctx.dtype(0), tuple(out))]


@op("Slice", inputs=(3, 5), infer=infer_slice)
def slice_(x, starts, ends, axes=None, steps=None):
    """numpy-style slicing with ONNX clamping; inputs give starts, ends, axes and steps."""
    starts, ends, axes, steps = _slice_params(x.ndim, starts, ends, axes, steps)
    index = [slice(None)] * x.ndim
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        b, e, _ = slice_bounds(x.shape[ax], st, en, sp)
        index[ax] = slice(b, None if e < 0 else e, sp)
    return x[tuple(index)]


# ------------------------------------------------------------------------------------------------ Pad
def _pad_widths(rank, pads, axes):
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    axes = list(range(rank)) if axes is None else [normalize_axis(int(a), rank) for a in np.asarray(axes).reshape(-1)]
    if len(pads) != 2 * len(axes):
        raise ValueError(f"pads has {len(pads)} entries for {len(axes)} axes")
    widths = [[0, 0] for _ in range(rank)]
    for k, a in enumerate(axes):
        widths[a] = [pads[k], pads[len(axes) + k]]
    return widths


def infer_pad(ctx: InferContext):
    s = ctx.shape(0)
    if s is None:
        return [TensorType(ctx.dtype(0), None)]
    pads = ctx.const(1)
    axes = ctx.const(3) if ctx.has_input(3) else None
    if pads is None or (ctx.has_input(3) and axes is None):
        return [TensorType(ctx.dtype(0), (None,) * len(s))]
    try:
        widths = _pad_widths(len(s), pads, axes)
    except ValueError as e:
        raise ctx.fail(str(e)) from None
    out = tuple(d + b + e if isinstance(d, int) else (d if b == e == 0 else None) for d, (b, e) in zip(s, widths))
    return [TensorType(ctx.dtype(0), out)]


@op("Pad", attrs={"mode": ("string", "constant")}, inputs=(2, 4), infer=infer_pad)
def pad(x, pads, constant_value=None, axes=None, *, mode):
    """Pad (or crop, for negative pads) with a constant, reflection, edge copies or wrap-around."""
    widths = _pad_widths(x.ndim, pads, axes)
    # negative pads crop first
    crop = tuple(slice(max(-b, 0), x.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(widths))
    x = x[crop]
    pw = [(max(b, 0), max(e, 0)) for b, e in widths]
    if mode == "constant":
        value = 0 if constant_value is None or constant_value.size == 0 else constant_value.reshape(-1)[0]
        return np.pad(x, pw, mode="constant", constant_values=value)
    if mode == "reflect":
        return np.pad(x, pw, mode="reflect")
    if mode == "edge":
        return np.pad(x, pw, mode="edge")
    if mode == "wrap":
        return np.pad(x, pw, mode="wrap")
    raise ValueError(f"unknown pad mode {mode!r}")


# ------------------------------------------------------------------------------------------------ others
def _infer_when_const(*value_inputs: int, rank_from=None):
    """Inference for ops whose output shape depends on input *values*: run the kernel on zeros only when those
    inputs are constants; otherwise the rank comes from `rank_from(ctx)` (or is unknown)."""

    def infer(ctx: InferContext):
        if all(not ctx.has_input(i) or ctx.const(i) is not None for i in value_inputs):
            return infer_by_running(ctx)
        rank = rank_from(ctx) if rank_from else None
        dtype = ctx.dtype(0) if ctx.num_inputs else None
        return [TensorType(dtype, None if rank is None else (None,) * rank)]

    return infer


def _tile_rank(ctx):
    return None if ctx.shape(0) is None else len(ctx.shape(0))


@op("Tile", inputs=2, infer=_infer_when_const(1, rank_from=_tile_rank))
def tile(x, repeats):
    return np.tile(x, [int(r) for r in repeats.reshape(-1)])


def _infer_constant_of_shape(ctx: InferContext):
    value = ctx.attrs["value"]
    dtype = "float32" if value is None else np.asarray(value).dtype.name
    shape = ctx.const(0)
    if shape is not None:
        return [TensorType(dtype, tuple(int(d) for d in shape.reshape(-1)))]
    s = ctx.shape(0)
    return [TensorType(dtype, None if s is None or not isinstance(s[0], int) else (None,) * s[0])]


@op("ConstantOfShape", attrs={"value": ("tensor", None)}, infer=_infer_constant_of_shape)
def constant_of_shape(shape, *, value):
    """A tensor of `shape` filled with `value` (float32 zero by default)."""
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return np.full([int(d) for d in shape.reshape(-1)], fill[0], dtype=fill.dtype)


@op("Range", inputs=3, infer=_infer_when_const(0, 1, 2, rank_from=lambda ctx: 1))
def range_(start, limit, delta):
    n = max(int(np.ceil((limit.item() - start.item()) / delta.item())), 0)
    return (start + np.arange(n, dtype=np.result_type(start, delta)) * delta).astype(start.dtype)
