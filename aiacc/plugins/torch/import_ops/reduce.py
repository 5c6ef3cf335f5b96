"""Converters of reductions and statistics (mean, sum, var, std, ...)."""
from __future__ import annotations


import numpy as np
import torch

from aiacc.core.translate import Untranslatable
from aiacc.plugins.torch.import_ops.common import need, norm_axis, rank, tensor
from aiacc.plugins.torch.importer import ATEN, FUNCTIONS, METHODS, torch_dtype_name


# ---------------------------------------------------------------------------------- reductions
_INTEGRAL = ("bool", "uint8", "int8", "int16", "int32")


def _reduce(op_name):
    def conv(imp, x, dim=None, keepdim=False, *, dtype=None):
        x = tensor(x)
        need(op_name)
        if dtype is not None:  # torch casts the input to dtype, then reduces
            x = imp.op("Cast", x, to=torch_dtype_name(dtype))
        elif op_name == "ReduceSum" and x.dtype in _INTEGRAL:
            # torch sums bool and integer tensors as int64 ((mask == 0).sum() counts; a bool sum is no "any")
            x = imp.op("Cast", x, to="int64")
        r = rank(x)
        dims = list(range(r)) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
        return imp.op(op_name, x, imp.ints([norm_axis(d, r) for d in dims]), keepdims=int(bool(keepdim)))
    return conv


FUNCTIONS.update({torch.mean: _reduce("ReduceMean"), torch.sum: _reduce("ReduceSum")})
METHODS.update({"mean": _reduce("ReduceMean"), "sum": _reduce("ReduceSum")})


def _axes(dim, r: int) -> list[int]:
    """The axes `dim` names (an int, a sequence; None or empty: every axis), each in 0..r-1."""
    dims = list(range(r)) if dim in (None, (), []) else ([dim] if isinstance(dim, int) else list(dim))
    return [norm_axis(d, r) for d in dims]


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
        axes = _axes(dim, r)
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


# ---------------------------------------------------------------------------------- vector norms
def vector_norm(imp, x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    """torch.linalg.vector_norm: ord 2 / 1 as ReduceL2 / ReduceL1, +-inf as ReduceMax / ReduceMin of |x|,
    any other non-zero p as (sum |x|^p)^(1/p); dim None flattens (every axis)."""
    x = tensor(x)
    if dtype is not None or out is not None:
        raise Untranslatable("dtype= / out=")
    if isinstance(ord, str) or isinstance(ord, bool) or not isinstance(ord, (int, float)):
        raise Untranslatable(f"ord={ord!r}")
    if x.dtype not in ("float16", "float32", "float64"):
        raise Untranslatable(f"the norm of a {x.dtype} tensor")
    r = rank(x)
    axes = imp.ints(_axes(dim, r))
    keep = int(bool(keepdim))
    p = float(ord)
    if p == 2.0:
        return imp.op("ReduceL2", x, axes, keepdims=keep)
    if p == 1.0:
        return imp.op("ReduceL1", x, axes, keepdims=keep)
    if p in (float("inf"), float("-inf")):
        return imp.op("ReduceMax" if p > 0 else "ReduceMin", imp.op("Abs", x), axes, keepdims=keep)
    if p == 0.0 or p != p:
        raise Untranslatable(f"ord={ord!r} (a count of non-zeros / nan)")
    s = imp.op("ReduceSum", imp.op("Pow", imp.op("Abs", x), imp.scalar_like(p, x)), axes, keepdims=keep)
    return imp.op("Pow", s, imp.scalar_like(1.0 / p, x))


FUNCTIONS.add(torch.linalg.vector_norm, vector_norm)
ATEN.add("linalg_vector_norm", vector_norm)


def _norm(imp, x, p="fro", dim=None, keepdim=False, out=None, dtype=None):
    """torch.norm / Tensor.norm: a vector norm (p a number, or "fro" = 2 over the given axes); the nuclear
    norm and matrix norms stay opaque."""
    if p in ("fro", None):
        p = 2
    if isinstance(p, str):
        raise Untranslatable(f"p={p!r}")
    return vector_norm(imp, x, p, dim, keepdim, dtype=dtype, out=out)


FUNCTIONS.add(torch.norm, _norm)
METHODS.add("norm", _norm)


# ---------------------------------------------------------------------------------- histograms
@FUNCTIONS.register(torch.histc)
@METHODS.register("histc")
def _histc(imp, x, bins=100, min=0, max=0, *, out=None):
    """torch.histc with a given range (min < max): bin = floor((x - min) / (max - min) * bins), x == max in
    the last bin, values outside the range not counted; counts in x's dtype (a static [bins] output; the
    mixture-of-experts routers count tokens per expert with it). min == max (the data's own range) stays
    opaque."""
    x = tensor(x)
    if out is not None:
        raise Untranslatable("out= argument")
    if x.dtype not in ("float16", "float32", "float64"):
        raise Untranslatable(f"histc of a {x.dtype} tensor")
    lo, hi, bins = float(min), float(max), int(bins)
    if not lo < hi:
        raise Untranslatable("histc over the data's own range (min >= max)")
    flat = imp.op("Reshape", x, imp.ints([-1, 1]))
    pos = imp.op("Mul", imp.op("Div", imp.op("Sub", flat, imp.scalar_like(lo, x)), imp.scalar_like(hi - lo, x)),
                 imp.scalar_like(float(bins), x))
    b = imp.op("Min", imp.op("Floor", pos), imp.scalar_like(float(bins - 1), x))
    inside = imp.op("And", imp.op("GreaterOrEqual", flat, imp.scalar_like(lo, x)),
                    imp.op("LessOrEqual", flat, imp.scalar_like(hi, x)))
    hit = imp.op("And", imp.op("Equal", b, imp.const(np.arange(bins, dtype=x.dtype)[None, :])), inside)
    return imp.op("ReduceSum", imp.op("Cast", hit, to=x.dtype), imp.ints([0]), keepdims=0)


# ---------------------------------------------------------------------------------- any / all
def _truth(kind: str):
    def conv(imp, x, dim=None, keepdim=False, *, out=None):
        """torch.any / torch.all: the elements as bool (non-zero), the max / min over the axes (as int32:
        every runtime reduces it), back to bool."""
        if out is not None:
            raise Untranslatable("out= argument")
        x = tensor(x)
        r = rank(x)
        flags = imp.op("Cast", x if x.dtype == "bool" else imp.op("Cast", x, to="bool"), to="int32")
        y = imp.op("ReduceMax" if kind == "any" else "ReduceMin", flags, imp.ints(_axes(dim, r)),
                   keepdims=int(bool(keepdim)))
        return imp.op("Cast", y, to="bool")
    return conv


for _kind in ("any", "all"):
    FUNCTIONS.add(getattr(torch, _kind), _truth(_kind))
    METHODS.add(_kind, _truth(_kind))
