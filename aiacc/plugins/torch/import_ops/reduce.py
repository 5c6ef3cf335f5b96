"""Converters of reductions and statistics (mean, sum, var, std, ...)."""
from __future__ import annotations


import numpy as np
import torch

from aiacc.core.translate import Untranslatable
from aiacc.plugins.torch.import_ops.common import need, norm_axis, rank, tensor
from aiacc.plugins.torch.importer import FUNCTIONS, METHODS


# ---------------------------------------------------------------------------------- reductions
def _reduce(op_name):
    def conv(imp, x, dim=None, keepdim=False, *, dtype=None):
        x = tensor(x)
        need(op_name)
        if dtype is not None:
            raise Untranslatable("dtype=")
        r = rank(x)
        dims = list(range(r)) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
        return imp.op(op_name, x, imp.ints([norm_axis(d, r) for d in dims]), keepdims=int(bool(keepdim)))
    return conv


FUNCTIONS.update({torch.mean: _reduce("ReduceMean"), torch.sum: _reduce("ReduceSum")})
METHODS.update({"mean": _reduce("ReduceMean"), "sum": _reduce("ReduceSum")})


# ---------------------------------------------------------------------------------- statistics
def _moments(kind: str):
    """var / std (and var_mean / std_mean) with torch's `correction` (unbiased=True is correction=1)."""

    def conv(imp, x, dim=None, unbiased=None, keepdim=False, *, correction=None, out=None):
        x = tensor(x)
        if isinstance(dim, bool):  # x.var(False): the old unbiased-only form
            dim, unbiased = None, dim
        if out is not None:
            raise Untranslatable("out= argument")
        if correction is None:
            correction = 1 if unbiased in (None, True) else 0
        r = rank(x)
        shape = imp.shape_of(x)
        dims = list(range(r)) if dim in (None, (), []) else ([dim] if isinstance(dim, int) else list(dim))
        axes = [norm_axis(d, r) for d in dims]
        count = int(np.prod([shape[a] for a in axes]))
        mean = imp.op("ReduceMean", x, imp.ints(axes), keepdims=1)
        d = imp.op("Sub", x, mean)
        ss = imp.op("ReduceSum", imp.op("Mul", d, d), imp.ints(axes), keepdims=int(bool(keepdim)))
        var = imp.op("Div", ss, imp.scalar_like(float(max(count - correction, 0)), x))
        y = imp.op("Sqrt", var) if kind.startswith("std") else var
        if kind.endswith("_mean"):
            return y, mean if keepdim else imp.op("ReduceMean", x, imp.ints(axes), keepdims=0)
        return y
    return conv


for _kind in ("var", "std"):
    FUNCTIONS[getattr(torch, _kind)] = _moments(_kind)
    METHODS[_kind] = _moments(_kind)
    FUNCTIONS[getattr(torch, _kind + "_mean")] = _moments(_kind + "_mean")
