"""IR op -> torch lowerings of TopK, ScatterElements and ScatterND (aiacc/core/ops/scatter.py). Same contract
as the other lowering modules: a lowering gets the Builder and an LNode and returns the fx value of each
output. Negative indices (which ONNX allows and torch's scatter does not) are wrapped first."""
from __future__ import annotations

import operator

import torch

from aiacc.errors import UnsupportedError
from aiacc.plugins.torch.exporter import LOWERINGS, LNode


def wrap_index(index: torch.Tensor, size: int) -> torch.Tensor:
    """index with negative entries counted from the end (`size` the indexed axis's length)."""
    return torch.where(index < 0, index + size, index)


def scatter_nd(data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor, reduction: str) -> torch.Tensor:
    """ONNX ScatterND on a copy of `data`: each row of `indices`' last axis addresses a slice of `data`'s
    leading axes; "none" writes (the last of repeated rows wins), "add" / "mul" / "max" / "min" combine."""
    k = indices.shape[-1]
    dims = torch.tensor(data.shape[:k], dtype=indices.dtype, device=indices.device)
    idx = torch.where(indices < 0, indices + dims, indices).reshape(-1, k)
    upd = updates.reshape((idx.shape[0],) + tuple(data.shape[k:]))
    where = tuple(idx[:, j] for j in range(k))
    if reduction == "none":
        return data.index_put(where, upd)
    if reduction == "add":
        return data.index_put(where, upd, accumulate=True)
    # mul / max / min: scatter_reduce over the flattened leading axes
    lead = 1
    for d in data.shape[:k]:
        lead *= d
    flat = data.reshape((lead,) + tuple(data.shape[k:]))
    linear = torch.zeros_like(idx[:, 0])
    for j in range(k):
        linear = linear * data.shape[j] + idx[:, j]
    linear = linear.reshape((-1,) + (1,) * (flat.dim() - 1)).expand(upd.shape)
    mode = {"mul": "prod", "max": "amax", "min": "amin"}[reduction]
    return flat.scatter_reduce(0, linear, upd, mode, include_self=True).reshape(data.shape)


@LOWERINGS.register("TopK")
def _topk(b, n: LNode):
    k = n.ints(1)
    if not k or len(k) != 1:
        raise UnsupportedError(f"node {n.name}: TopK with a non-constant k")
    res = b.call(torch.topk, n.arg(0), k[0], n.attr("axis", -1), bool(n.attr("largest", 1)),
                 bool(n.attr("sorted", 1)))
    return [b.call(operator.getitem, res, 0), b.call(operator.getitem, res, 1)]


@LOWERINGS.register("ScatterElements")
def _scatter_elements(b, n: LNode):
    shape = n.shape(0)
    axis = n.attr("axis", 0)
    if shape is None or not isinstance(shape[axis], int):
        raise UnsupportedError(f"node {n.name}: ScatterElements on an axis of unknown size")
    axis = axis % len(shape)
    idx = b.call(wrap_index, n.arg(1), shape[axis])
    red = n.attr("reduction", "none")
    if red == "none":
        return b.call(torch.scatter, n.arg(0), axis, idx, n.arg(2))
    if red == "add":
        return b.call(torch.scatter_add, n.arg(0), axis, idx, n.arg(2))
    mode = {"mul": "prod", "max": "amax", "min": "amin"}.get(red)
    if mode is None:
        raise UnsupportedError(f"node {n.name}: ScatterElements reduction {red!r}")
    return b.call(torch.scatter_reduce, n.arg(0), axis, idx, n.arg(2), mode, include_self=True)


@LOWERINGS.register("ScatterND")
def _scatter_nd(b, n: LNode):
    return b.call(scatter_nd, n.arg(0), n.arg(1), n.arg(2), n.attr("reduction", "none"))
