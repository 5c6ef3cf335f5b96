"""Ops that choose or write elements by index (ONNX semantics, opset 18): TopK, ScatterElements, ScatterND.

TopK breaks ties by the lower index (as ONNX asks: a stable sort). ScatterElements and ScatterND write
`updates` into a copy of `data` at the given indices; with reduction "none" and repeated indices the last
update wins here (ONNX leaves the order undefined), "add" / "mul" / "max" / "min" combine every update.
"""
from __future__ import annotations

import numpy as np

from aiacc.core.ir import TensorType
from aiacc.core.ops.registry import InferContext, op
from aiacc.core.ops.shape_utils import normalize_axis

_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


# ------------------------------------------------------------------------------------------------ TopK
def _infer_topk(ctx: InferContext):
    s = ctx.shape(0)
    if s is None:
        return [TensorType(ctx.dtype(0), None), TensorType("int64", None)]
    axis = normalize_axis(ctx.attrs["axis"], len(s))
    k = ctx.const(1)
    kk = int(np.asarray(k).reshape(-1)[0]) if k is not None else None
    if kk is not None and isinstance(s[axis], int) and not 0 <= kk <= s[axis]:
        raise ctx.fail(f"k={kk} is outside 0..{s[axis]} (the size of axis {axis})")
    out = tuple(s[:axis]) + (kk,) + tuple(s[axis + 1:])
    return [TensorType(ctx.dtype(0), out), TensorType("int64", out)]


@op("TopK", attrs={"axis": ("int", -1), "largest": ("int", 1), "sorted": ("int", 1)}, inputs=2, outputs=2,
    infer=_infer_topk)
def topk(x, k, *, axis, largest, sorted):
    """The k largest (or smallest) elements along `axis` and their indices, in order (largest first, or
    smallest first); equal values in index order. `sorted=0` returns them in that same order."""
    kk = int(np.asarray(k).reshape(-1)[0])
    axis = normalize_axis(axis, x.ndim)
    # a stable sort of the negated values for largest (NaN sorts as the largest, as in torch)
    key = x
    if largest:
        # ~x reverses the order of integers without overflow (-x does not for the minimum)
        key = np.where(np.isnan(x), -np.inf, -x) if x.dtype.kind == "f" else ~x.astype(np.int64)
    order = np.argsort(key, axis=axis, kind="stable")
    idx = np.take(order, np.arange(kk), axis=axis).astype(np.int64)
    return np.take_along_axis(x, idx, axis=axis), idx


# ------------------------------------------------------------------------------------------ ScatterElements
def _same_as_data(ctx: InferContext):
    return [ctx.type(0)]


@op("ScatterElements", attrs={"axis": ("int", 0), "reduction": ("string", "none")}, inputs=3,
    infer=_same_as_data)
def scatter_elements(data, indices, updates, *, axis, reduction):
    """A copy of `data` with out[..., indices[i, j, ...], ...] (at `axis`) = updates[i, j, ...] (or
    combined by `reduction`); negative indices count from the end."""
    axis = normalize_axis(axis, data.ndim)
    idx = np.asarray(indices, dtype=np.int64)
    n = data.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"ScatterElements: index out of range for axis {axis} of size {n}")
    idx = np.where(idx < 0, idx + n, idx)
    out = np.array(data, copy=True)
    grid = list(np.indices(idx.shape, sparse=True))
    grid[axis] = idx
    where = tuple(grid)
    upd = np.asarray(updates, dtype=data.dtype)[tuple(slice(0, d) for d in idx.shape)]
    return _scatter_into(out, where, upd, reduction, "ScatterElements")


def _scatter_into(out: np.ndarray, where: tuple, upd: np.ndarray, reduction: str, op_name: str) -> np.ndarray:
    """out[where] = upd ("none": the last of repeated indices wins) or combined into it by `reduction`
    (np.ufunc.at, so repeated indices all count); returns `out`."""
    if reduction == "none":
        out[where] = upd
    elif reduction in _REDUCE:
        _REDUCE[reduction].at(out, where, upd)
    else:
        raise ValueError(f"{op_name}: unknown reduction {reduction!r}")
    return out


# ------------------------------------------------------------------------------------------------ ScatterND
def _check_nd(ctx: InferContext):
    d, i, u = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if d is not None and i is not None and u is not None and all(isinstance(x, int) for x in (*d, *i, *u)):
        k = i[-1]
        want = tuple(i[:-1]) + tuple(d[k:])
        if k > len(d) or tuple(u) != want:
            raise ctx.fail(f"updates of shape {tuple(u)} do not fit data {tuple(d)} at indices {tuple(i)} "
                           f"(expected {want})")
    return [ctx.type(0)]


@op("ScatterND", attrs={"reduction": ("string", "none")}, inputs=3, infer=_check_nd)
def scatter_nd(data, indices, updates, *, reduction):
    """A copy of `data` with out[indices[..., :]] = updates[...] (each index row addresses a slice of
    `data`'s leading dims), or combined by `reduction`."""
    idx = np.asarray(indices, dtype=np.int64)
    k = idx.shape[-1]
    out = np.array(data, copy=True)
    flat = idx.reshape(-1, k)
    upd = np.asarray(updates, dtype=data.dtype).reshape((flat.shape[0],) + data.shape[k:])
    dims = np.asarray(data.shape[:k], dtype=np.int64)
    if flat.size and ((flat < -dims).any() or (flat >= dims).any()):
        raise IndexError("ScatterND: index out of range")
    flat = np.where(flat < 0, flat + dims, flat)
    where = tuple(flat[:, j] for j in range(k))
    return _scatter_into(out, where, upd, reduction, "ScatterND")
