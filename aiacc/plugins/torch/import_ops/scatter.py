"""Converters for the ops that choose or write elements by index: topk and sort / argsort (the IR's TopK), scatter /
scatter_add / scatter_reduce / index_add (ScatterElements), index_put and `x[idx] = v` with index tensors
(ScatterND), `x[mask] = v` with a boolean mask and a one-element value (Where). Static shapes; every write
is out of place (a copy with the elements replaced), as the importer's other in-place forms.
"""
from __future__ import annotations

import numpy as np
import torch

from aiacc.core.ir import Value
from aiacc.core.translate import Untranslatable
from aiacc.plugins.torch.import_ops.common import norm_axis, rank, tensor
from aiacc.plugins.torch.import_ops.indexing import _index_value, _wrap, check_axis_index
from aiacc.plugins.torch.importer import ATEN, FUNCTIONS, METHODS


# ------------------------------------------------------------------------------------------------ topk
@FUNCTIONS.register(torch.topk)
@METHODS.register("topk")
def _topk(imp, x, k, dim=-1, largest=True, sorted=True, *, out=None):
    """torch.topk: (values, indices) as one TopK node (k a Python int: the example's)."""
    if out is not None:
        raise Untranslatable("out= argument")
    x = tensor(x)
    if isinstance(k, Value):
        raise Untranslatable("topk with a tensor k")
    axis = norm_axis(int(dim), rank(x))
    values, indices = imp.op("TopK", x, imp.ints([int(k)]), axis=axis, largest=int(bool(largest)),
                             sorted=int(bool(sorted)), outputs=2)
    return torch.return_types.topk((values, indices))



def _sorted(imp, x, dim, descending):
    """(values, indices) of a full sort along dim: one TopK of k = the axis' size (its ties go by the lower
    index, the order torch's stable sort gives)."""
    x = tensor(x)
    if x.dtype == "bool":
        raise Untranslatable("sort of a bool tensor")
    r = max(rank(x), 1)
    axis = norm_axis(int(dim), r)
    size = imp.shape_of(x)[axis] if rank(x) else 1
    return imp.op("TopK", x, imp.ints([int(size)]), axis=axis, largest=int(bool(descending)), sorted=1,
                  outputs=2)


@FUNCTIONS.register(torch.sort)
@METHODS.register("sort")
def _sort(imp, x, dim=-1, descending=False, stable=None, *, out=None):
    """torch.sort (also with stable=True): values and indices as one TopK."""
    if out is not None:
        raise Untranslatable("out= argument")
    if isinstance(dim, bool):
        raise Untranslatable("sort with a bool dim")
    return torch.return_types.sort(_sorted(imp, x, dim, descending))


@FUNCTIONS.register(torch.argsort)
@METHODS.register("argsort")
def _argsort(imp, x, dim=-1, descending=False, stable=False):
    """torch.argsort: the indices of a full TopK."""
    return _sorted(imp, x, dim, descending)[1]


@FUNCTIONS.register(torch.msort)
@METHODS.register("msort")
def _msort(imp, x):
    return _sorted(imp, x, 0, False)[0]

# ------------------------------------------------------------------------------------- ScatterElements
def _updates(imp, src, index: Value, like: Value) -> Value:
    """scatter's source cut to the index's shape (torch reads only src[:index.shape]), or a scalar value
    filled to it."""
    ishape = list(imp.shape_of(index))
    if not isinstance(src, Value):
        if isinstance(src, (torch.Tensor, list)) or isinstance(src, bool):
            raise Untranslatable("scatter value of an unsupported kind")
        return imp.const(np.full(ishape, src, dtype=like.dtype))
    if src.dtype != like.dtype:
        src = imp.op("Cast", src, to=like.dtype)
    sshape = list(imp.shape_of(src))
    if len(sshape) != len(ishape):
        raise Untranslatable("scatter source of another rank than the index")
    if sshape != ishape:
        if any(s < i for s, i in zip(sshape, ishape)):
            raise Untranslatable("scatter source smaller than the index")
        src = imp.op("Slice", src, imp.ints([0] * len(ishape)), imp.ints(ishape), imp.ints(range(len(ishape))))
    return src


def _scatter_elements(imp, x, dim, index, src, reduction: str, op: str = "scatter"):
    """ScatterElements along `dim`; an index computed from the inputs is checked at run time in 0..size-1
    (torch raises RuntimeError on any other, a negative one too)."""
    x = tensor(x)
    index = _index_value(imp, index)
    if index is None:
        raise Untranslatable("scatter index is not a tensor")
    r = rank(x)
    if rank(index) != r:
        raise Untranslatable("scatter index of another rank")
    axis = norm_axis(int(dim), r)
    check_axis_index(imp, index, imp.shape_of(x)[axis], axis, op, False, "RuntimeError")
    idx = index if index.dtype == "int64" else imp.op("Cast", index, to="int64")
    idx = _wrap(imp, idx, imp.shape_of(x)[axis])
    return imp.op("ScatterElements", x, idx, _updates(imp, src, idx, x), axis=axis, reduction=reduction)


_TORCH_REDUCE = {None: "none", "add": "add", "sum": "add", "multiply": "mul", "prod": "mul", "amax": "max",
                 "amin": "min"}


@FUNCTIONS.register(torch.scatter)
@METHODS.register("scatter", "scatter_")
def _scatter(imp, x, dim, index, src=None, value=None, *, reduce=None, out=None):
    """torch.scatter(x, dim, index, src | value, reduce=None | 'add' | 'multiply')."""
    if out is not None:
        raise Untranslatable("out= argument")
    if reduce not in _TORCH_REDUCE or reduce in ("sum", "prod", "amax", "amin"):
        raise Untranslatable(f"scatter reduce={reduce!r}")
    return _scatter_elements(imp, x, dim, index, value if src is None else src, _TORCH_REDUCE[reduce])


@FUNCTIONS.register(torch.scatter_add)
@METHODS.register("scatter_add", "scatter_add_")
def _scatter_add(imp, x, dim, index, src, *, out=None):
    if out is not None:
        raise Untranslatable("out= argument")
    return _scatter_elements(imp, x, dim, index, src, "add", "scatter_add")


@FUNCTIONS.register(torch.scatter_reduce)
@METHODS.register("scatter_reduce", "scatter_reduce_")
def _scatter_reduce(imp, x, dim, index, src, reduce, *, include_self=True, out=None):
    """scatter_reduce with sum / prod / amax / amin, include_self=True (mean and include_self=False have no
    ScatterElements form)."""
    if out is not None:
        raise Untranslatable("out= argument")
    if reduce not in ("sum", "prod", "amax", "amin") or not include_self:
        raise Untranslatable(f"scatter_reduce {reduce!r}, include_self={include_self}")
    return _scatter_elements(imp, x, dim, index, src, _TORCH_REDUCE[reduce], "scatter_reduce")


@FUNCTIONS.register(torch.index_add)
@METHODS.register("index_add", "index_add_")
def _index_add(imp, x, dim, index, source, *, alpha=1, out=None):
    """x.index_add(dim, index, source): out[..., index[i], ...] += alpha * source[..., i, ...], a
    ScatterElements (add) with the 1-d index spread over source's shape; an index computed from the inputs
    is checked at run time in 0..size-1 (torch raises RuntimeError on any other)."""
    if out is not None:
        raise Untranslatable("out= argument")
    x, source = tensor(x), tensor(source, "source")
    index = _index_value(imp, index)
    if index is None or rank(index) != 1:
        raise Untranslatable("index_add with an index that is not 1-d")
    r = rank(x)
    axis = norm_axis(int(dim), r)
    sshape = list(imp.shape_of(source))
    if len(sshape) != r:
        raise Untranslatable("index_add source of another rank")
    check_axis_index(imp, index, imp.shape_of(x)[axis], axis, "index_add", False, "RuntimeError")
    idx = index if index.dtype == "int64" else imp.op("Cast", index, to="int64")
    idx = _wrap(imp, idx, imp.shape_of(x)[axis])
    spread = [1] * r
    spread[axis] = sshape[axis]
    idx = imp.op("Expand", imp.op("Reshape", idx, imp.ints(spread)), imp.ints(sshape))
    if alpha != 1:
        source = imp.op("Mul", source, imp.scalar_like(alpha, source))
    if source.dtype != x.dtype:
        source = imp.op("Cast", source, to=x.dtype)
    return imp.op("ScatterElements", x, idx, source, axis=axis, reduction="add")


# ------------------------------------------------------------------------------------------ ScatterND
def index_put(imp, x, indices, values, accumulate=False, checked=True):
    """x.index_put(indices, values[, accumulate]): the index tensors (broadcast together) on adjacent axes,
    full slices around them, as one ScatterND on x with those axes moved first; values broadcast to the
    indexed region as torch does. A boolean mask with a one-element value is a Where. Each index tensor
    computed from the inputs is checked at run time in -size..size-1 of its axis (torch raises IndexError
    on another) unless not `checked` (aten._unsafe_index_put, which torch does not check)."""
    x = tensor(x)
    shape = list(imp.shape_of(x))
    indices = list(indices) + [None] * (len(shape) - len(indices))
    if len(indices) != len(shape):
        raise Untranslatable("too many indices")
    tensors = [k for k, i in enumerate(indices) if i is not None]
    if not tensors:
        raise Untranslatable("index_put without an index tensor")
    first = indices[tensors[0]]
    if isinstance(first, Value) and first.dtype == "bool":
        return _masked_put(imp, x, indices, tensors, values, accumulate)
    if tensors != list(range(tensors[0], tensors[-1] + 1)):
        raise Untranslatable("index tensors on axes that are not adjacent")
    idx = []
    for k in tensors:
        v = _index_value(imp, indices[k])
        if v is None:
            raise Untranslatable("an index that is not a tensor")
        if checked:
            check_axis_index(imp, v, shape[k], k, "index_put", True, "IndexError")
        v = v if v.dtype == "int64" else imp.op("Cast", v, to="int64")
        idx.append(_wrap(imp, v, shape[k]))
    try:
        bshape = list(np.broadcast_shapes(*[tuple(imp.shape_of(v)) for v in idx]))
    except ValueError:
        raise Untranslatable("index tensors that do not broadcast") from None
    pre, post = list(range(tensors[0])), list(range(tensors[-1] + 1, len(shape)))
    # the region torch writes: pre dims, the broadcast index dims, post dims (adjacent advanced indices)
    region = [shape[a] for a in pre] + bshape + [shape[a] for a in post]
    if isinstance(values, Value):
        v = values if values.dtype == x.dtype else imp.op("Cast", values, to=x.dtype)
        vshape = list(imp.shape_of(v))
        if len(vshape) > len(region):
            raise Untranslatable("values of a higher rank than the indexed region")
        try:
            if list(np.broadcast_shapes(tuple(vshape), tuple(region))) != region:
                raise ValueError
        except ValueError:
            raise Untranslatable("values that do not broadcast to the indexed region") from None
        if vshape != region:
            v = imp.op("Expand", v, imp.ints(region))
    elif isinstance(values, (int, float)) and not isinstance(values, bool):
        v = imp.const(np.full(region, values, dtype=x.dtype))
    else:
        raise Untranslatable("index_put values of an unsupported kind")
    nb = len(bshape)
    stacked = imp.op("Concat", *[imp.op("Unsqueeze", imp.op("Expand", i, imp.ints(bshape)), imp.ints([nb]))
                                 for i in idx], axis=nb)
    perm = list(tensors) + pre + post  # the indexed axes first: ScatterND addresses leading axes
    moved = perm != list(range(len(shape)))
    data = imp.op("Transpose", x, perm=perm) if moved else x
    if pre:  # the values' broadcast index dims first too
        vperm = list(range(len(pre), len(pre) + nb)) + list(range(len(pre))) + \
            list(range(len(pre) + nb, len(region)))
        v = imp.op("Transpose", v, perm=vperm)
    y = imp.op("ScatterND", data, stacked, v, reduction="add" if accumulate else "none")
    if moved:
        y = imp.op("Transpose", y, perm=[int(p) for p in np.argsort(perm)])
    return y


def _masked_put(imp, x, indices, tensors, values, accumulate):
    """`x[mask] = v` (mask over x's leading axes, v one element): Where(mask, v, x), exact."""
    if accumulate or tensors != [0] or len([i for i in indices if i is not None]) != 1:
        raise Untranslatable("a boolean index with accumulate or beside other indices")
    mask = indices[0]
    shape, mshape = imp.shape_of(x), list(imp.shape_of(mask))
    if list(shape[:len(mshape)]) != mshape:
        raise Untranslatable("a boolean mask of another shape than x's leading axes")
    if isinstance(values, Value):
        if int(np.prod(imp.shape_of(values))) != 1:
            raise Untranslatable("x[mask] = v with more than one value (its placement depends on the data)")
        v = imp.op("Reshape", values, imp.ints([]))
        v = v if v.dtype == x.dtype else imp.op("Cast", v, to=x.dtype)
    elif isinstance(values, (int, float)) and not isinstance(values, bool):
        v = imp.const(np.asarray(values, dtype=x.dtype))
    else:
        raise Untranslatable("x[mask] = v with a value of an unsupported kind")
    if len(mshape) < len(shape):
        mask = imp.op("Reshape", mask, imp.ints(mshape + [1] * (len(shape) - len(mshape))))
    return imp.op("Where", mask, v, x)


@FUNCTIONS.register(torch.index_put)
@METHODS.register("index_put", "index_put_")
def _index_put(imp, x, indices, values, accumulate=False):
    return index_put(imp, x, tuple(indices), values, accumulate)


@FUNCTIONS.register(torch.index_copy)
@METHODS.register("index_copy", "index_copy_")
def _index_copy(imp, x, dim, index, source, *, out=None):
    """x.index_copy(dim, index, source): out[..., index[i], ...] = source[..., i, ...], an index_put on axis
    `dim`. An index computed from the inputs is checked at run time in 0..size-1: eager's index_copy raises
    IndexError on any other, a negative one too (where index_put, which torch.export decomposes it into, counts
    a negative index from the end), so it is translated here rather than decomposed."""
    if out is not None:
        raise Untranslatable("out= argument")
    x = tensor(x)
    index = _index_value(imp, index)
    if index is None or rank(index) > 1:
        raise Untranslatable("index_copy with an index that is not 0-d or 1-d")
    axis = norm_axis(int(dim), rank(x))
    check_axis_index(imp, index, imp.shape_of(x)[axis], axis, "index_copy", False, "IndexError")
    if rank(index) == 0:
        index = imp.op("Reshape", index, imp.ints([1]))
    return index_put(imp, x, tuple([None] * axis + [index]), tensor(source, "source"), checked=False)


@FUNCTIONS.register(torch.index_fill)
@METHODS.register("index_fill", "index_fill_")
def _index_fill(imp, x, dim, index, value):
    """x.index_fill(dim, index, value): an index_put of the one value on axis `dim`. An index computed from the
    inputs is checked at run time in -size..size-1, as eager's index_fill (a negative index counts from the end;
    torch.export's decomposition goes through index_copy, which does not take one)."""
    x = tensor(x)
    index = _index_value(imp, index)
    if index is None or rank(index) > 1:
        raise Untranslatable("index_fill with an index that is not 0-d or 1-d")
    axis = norm_axis(int(dim), rank(x))
    check_axis_index(imp, index, imp.shape_of(x)[axis], axis, "index_fill", True, "IndexError")
    if rank(index) == 0:
        index = imp.op("Reshape", index, imp.ints([1]))
    if isinstance(value, Value) and rank(value) != 0:
        raise Untranslatable("index_fill with a value that is not one element")
    return index_put(imp, x, tuple([None] * axis + [index]), value, checked=False)


ATEN.update({"index_put": _index_put, "index_put_": _index_put, "index_copy": _index_copy,
             "index_fill": _index_fill,
             "_unsafe_index_put": lambda imp, x, indices, values, accumulate=False: index_put(
                 imp, x, tuple(indices), values, accumulate, checked=False),
             "scatter": lambda imp, x, dim, index, src, reduce=None: _scatter(
                 imp, x, dim, index, src, reduce=reduce),
             "scatter_add": _scatter_add, "scatter_reduce": _scatter_reduce, "index_add": _index_add,
             "topk": _topk, "sort": _sort})
