"""Converters from torch calls (functions, Tensor methods, leaf modules) to IR ops with ONNX semantics.

A converter takes the Importer and the call's arguments (IR values where the argument is a tensor,
Python objects otherwise) and returns the result the same way. It raises `Untranslatable` when the
call uses a feature it does not cover; the importer then rolls back what it added and keeps the call
as an opaque node. Attention and transformer layers are in attention.py.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from aiacc.core.ir import Value
from aiacc.core.ops import get_schema


class Untranslatable(Exception):
    """This call uses something the converter does not cover; keep it opaque."""


FUNCTIONS: dict[Any, Callable] = {}
METHODS: dict[str, Callable] = {}
MODULES: dict[type, Callable] = {}


def function(*targets):
    def wrap(fn):
        for t in targets:
            FUNCTIONS[t] = fn
        return fn
    return wrap


def method(*names):
    def wrap(fn):
        for n in names:
            METHODS[n] = fn
        return fn
    return wrap


def module(*types):
    def wrap(fn):
        for t in types:
            MODULES[t] = fn
        return fn
    return wrap


def need(op: str) -> None:
    """Refuse (-> opaque) when the core registry lacks an op this conversion needs."""
    if get_schema(op) is None:
        raise Untranslatable(f"the IR has no {op} op")


def tensor(x: Any, what: str = "input") -> Value:
    if not isinstance(x, Value):
        raise Untranslatable(f"{what} is not a tensor")
    return x


def rank(v: Value) -> int:
    if v.shape is None:
        raise Untranslatable(f"%{v.name} has unknown rank")
    return len(v.shape)


def norm_axis(axis: int, r: int) -> int:
    if not -r <= axis < max(r, 1):
        raise Untranslatable(f"axis {axis} out of range for rank {r}")
    return axis % r if r else 0


def _pair(x, n: int) -> list[int]:
    if isinstance(x, (list, tuple)):
        return [int(v) for v in x]
    return [int(x)] * n


# ---------------------------------------------------------------------------------------- elementwise
def _operands(imp, a, b):
    if isinstance(a, Value) and isinstance(b, Value):
        if a.dtype != b.dtype:
            raise Untranslatable(f"operands of dtypes {a.dtype} and {b.dtype} (type promotion)")
        return a, b
    if isinstance(a, Value):
        return a, imp.scalar_like(b, a)
    return imp.scalar_like(a, b), b


def _binary(op_name: str):
    def conv(imp, a, b, *, alpha=1, out=None):
        if out is not None:
            raise Untranslatable("out= argument")
        a, b = _operands(imp, a, b)
        if alpha != 1:
            b = imp.op("Mul", b, imp.scalar_like(alpha, b))
        if op_name == "Div" and np.dtype(a.dtype).kind in "iub":
            raise Untranslatable("true division of integer tensors")
        return imp.op(op_name, a, b)
    return conv


for _op, _targets, _methods in (
        ("Add", (operator.add, operator.iadd, torch.add), ("add", "add_", "__add__", "__iadd__")),
        ("Sub", (operator.sub, operator.isub, torch.sub), ("sub", "sub_", "__sub__")),
        ("Mul", (operator.mul, operator.imul, torch.mul), ("mul", "mul_", "__mul__")),
        ("Div", (operator.truediv, operator.itruediv, torch.div), ("div", "div_", "__truediv__"))):
    FUNCTIONS.update({t: _binary(_op) for t in _targets})
    METHODS.update({m: _binary(_op) for m in _methods})


@function(torch.rsub)
def _rsub(imp, a, b, *, alpha=1):
    return _binary("Sub")(imp, b, a, alpha=alpha)


@function(operator.neg, torch.neg)
@method("neg")
def _neg(imp, x):
    return imp.op("Neg", tensor(x))


@function(operator.pow, torch.pow)
@method("pow")
def _pow(imp, a, b):
    a, b = _operands(imp, a, b)
    return imp.op("Pow", a, b)


def _unary(op_name: str, **attrs):
    def conv(imp, x, *args, inplace=False, **kwargs):
        return imp.op(op_name, tensor(x), **attrs)
    return conv


for _op, _fns, _methods, _mods in (
        ("Relu", (F.relu, torch.relu, torch.relu_, F.relu_), ("relu", "relu_"), (nn.ReLU,)),
        ("Sigmoid", (torch.sigmoid, F.sigmoid), ("sigmoid", "sigmoid_"), (nn.Sigmoid,)),
        ("Tanh", (torch.tanh, F.tanh), ("tanh", "tanh_"), (nn.Tanh,)),
        ("HardSwish", (F.hardswish,), (), (nn.Hardswish,)),
        ("Exp", (torch.exp,), ("exp",), ()),
        ("Log", (torch.log,), ("log",), ()),
        ("Sqrt", (torch.sqrt,), ("sqrt",), ()),
        ("Abs", (torch.abs,), ("abs",), ()),
        ("Erf", (torch.erf, torch.special.erf), ("erf",), ()),
        ("Reciprocal", (torch.reciprocal,), ("reciprocal",), ()),
        ("Floor", (torch.floor,), ("floor",), ()),
        ("Ceil", (torch.ceil,), ("ceil",), ()),
        ("Sin", (torch.sin,), ("sin",), ()),
        ("Cos", (torch.cos,), ("cos",), ()),
        ("Softsign", (F.softsign,), (), (nn.Softsign,)),
        ("Mish", (F.mish,), (), (nn.Mish,))):
    FUNCTIONS.update({t: _unary(_op) for t in _fns})
    METHODS.update({m: _unary(_op) for m in _methods})
    MODULES.update({m: (lambda op_name: lambda imp, mod, x: imp.op(op_name, tensor(x)))(_op) for m in _mods})


@function(torch.rsqrt)
@method("rsqrt")
def _rsqrt(imp, x):
    return imp.op("Reciprocal", imp.op("Sqrt", tensor(x)))


def _clip(imp, x, lo, hi):
    x = tensor(x)
    return imp.op("Clip", x, None if lo is None else imp.scalar_like(lo, x),
                  None if hi is None else imp.scalar_like(hi, x))


@function(F.relu6)
def _relu6(imp, x, inplace=False):
    return _clip(imp, x, 0.0, 6.0)


@function(F.hardtanh)
def _hardtanh(imp, x, min_val=-1.0, max_val=1.0, inplace=False):
    return _clip(imp, x, min_val, max_val)


@function(torch.clamp, torch.clip)
@method("clamp", "clip", "clamp_")
def _clamp(imp, x, min=None, max=None):
    if isinstance(min, Value) or isinstance(max, Value):
        raise Untranslatable("tensor bounds")
    return _clip(imp, x, min, max)


@module(nn.ReLU6)
def _m_relu6(imp, m, x):
    return _clip(imp, x, 0.0, 6.0)


@module(nn.Hardtanh)
def _m_hardtanh(imp, m, x):
    return _clip(imp, x, m.min_val, m.max_val)


@function(F.leaky_relu)
def _leaky(imp, x, negative_slope=0.01, inplace=False):
    return imp.op("LeakyRelu", tensor(x), alpha=float(negative_slope))


@module(nn.LeakyReLU)
def _m_leaky(imp, m, x):
    return imp.op("LeakyRelu", tensor(x), alpha=float(m.negative_slope))


@function(F.elu)
def _elu(imp, x, alpha=1.0, inplace=False):
    return imp.op("Elu", tensor(x), alpha=float(alpha))


@module(nn.ELU)
def _m_elu(imp, m, x):
    return imp.op("Elu", tensor(x), alpha=float(m.alpha))


@function(F.hardsigmoid)
def _hardsigmoid(imp, x, inplace=False):
    return imp.op("HardSigmoid", tensor(x), alpha=1.0 / 6, beta=0.5)


@module(nn.Hardsigmoid)
def _m_hardsigmoid(imp, m, x):
    return _hardsigmoid(imp, x)


@function(F.silu)
def _silu(imp, x, inplace=False):
    x = tensor(x)
    return imp.op("Mul", x, imp.op("Sigmoid", x))


@module(nn.SiLU)
def _m_silu(imp, m, x):
    return _silu(imp, x)


@function(F.gelu)
def _gelu(imp, x, approximate="none"):
    return imp.op("Gelu", tensor(x), approximate=approximate)


@module(nn.GELU)
def _m_gelu(imp, m, x):
    return _gelu(imp, x, m.approximate)


@function(F.softplus)
def _softplus(imp, x, beta=1.0, threshold=20.0):
    if beta != 1:
        raise Untranslatable("beta != 1")
    return imp.op("Softplus", tensor(x))


@module(nn.Softplus)
def _m_softplus(imp, m, x):
    return _softplus(imp, x, m.beta, m.threshold)


def _softmax_like(op_name):
    def conv(imp, x, dim=None, _stacklevel=3, dtype=None):
        x = tensor(x)
        if dim is None or dtype is not None:
            raise Untranslatable("implicit dim or dtype=")
        return imp.op(op_name, x, axis=norm_axis(dim, rank(x)))
    return conv


FUNCTIONS.update({F.softmax: _softmax_like("Softmax"), torch.softmax: _softmax_like("Softmax"),
                  F.log_softmax: _softmax_like("LogSoftmax"), torch.log_softmax: _softmax_like("LogSoftmax")})
METHODS.update({"softmax": _softmax_like("Softmax"), "log_softmax": _softmax_like("LogSoftmax")})
MODULES.update({nn.Softmax: lambda imp, m, x: _softmax_like("Softmax")(imp, x, m.dim),
                nn.LogSoftmax: lambda imp, m, x: _softmax_like("LogSoftmax")(imp, x, m.dim)})


@function(torch.where)
def _where(imp, cond, a=None, b=None):
    if a is None:
        raise Untranslatable("one-argument where")
    cond = tensor(cond)
    if not isinstance(a, Value):
        a = imp.scalar_like(a, tensor(b))
    if not isinstance(b, Value):
        b = imp.scalar_like(b, a)
    return imp.op("Where", cond, a, b)


@method("masked_fill", "masked_fill_")
def _masked_fill(imp, x, mask, value):
    x = tensor(x)
    if isinstance(value, Value):
        raise Untranslatable("tensor fill value")
    return imp.op("Where", tensor(mask), imp.scalar_like(value, x), x)


# ------------------------------------------------------------------------------------- dropout
def dropout(imp, x, p: float, active: bool):
    """Dropout with the ratio and training flag as constant inputs (identity unless active)."""
    x = tensor(x)
    return imp.op("Dropout", x, imp.const(np.float32(p)), imp.const(np.bool_(active and p > 0)))


@function(F.dropout)
def _f_dropout(imp, x, p=0.5, training=True, inplace=False):
    return dropout(imp, x, p, bool(training) and imp.training)


@module(nn.Dropout)
def _m_dropout(imp, m, x):
    return dropout(imp, x, m.p, imp.module_training(m))


@module(nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
def _m_channel_dropout(imp, m, x):
    if imp.module_training(m) and m.p > 0:
        raise Untranslatable("channel-wise dropout in training")
    return dropout(imp, x, m.p, False)


@module(nn.Identity)
def _m_identity(imp, m, x, *args, **kwargs):
    return x


@method("contiguous", "clone")
def _same(imp, x, *args, **kwargs):
    return tensor(x)


@method("detach")
def _detach(imp, x):
    if imp.training:
        raise Untranslatable("detach changes gradients in training")
    return tensor(x)


@method("to", "type", "float", "half", "double", "long", "int", "bool")
def _to(imp, x, *args, **kwargs):
    x = tensor(x)
    name = imp.current.target
    dtypes = {"float": torch.float32, "half": torch.float16, "double": torch.float64, "long": torch.int64,
              "int": torch.int32, "bool": torch.bool}
    target = dtypes.get(name)
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.dtype):
            target = a
        elif isinstance(a, Value):
            raise Untranslatable("to(tensor)")
    if target is None:
        return x  # a device move: the exported module runs wherever it is put
    dtype = str(target).replace("torch.", "")
    return x if dtype == x.dtype else imp.op("Cast", x, to=dtype)


# ---------------------------------------------------------------------------------- shapes and sizes
def _dim(imp, v: Value, axis: int):
    from aiacc.plugins.torch.importer import Dim

    shape = imp.shape_of(v)
    return Dim(shape[axis], v, axis)


@method("size")
def _size(imp, x, dim=None):
    x = tensor(x)
    if dim is None:
        return torch.Size([_dim(imp, x, i) for i in range(rank(x))])
    return _dim(imp, x, norm_axis(dim, rank(x)))


@method("dim", "ndimension")
def _ndim(imp, x):
    return rank(tensor(x))


@method("numel")
def _numel(imp, x):
    return int(np.prod(imp.shape_of(tensor(x))))


@function(getattr)
def _getattr(imp, x, name, *default):
    if not isinstance(x, Value):
        return getattr(x, name, *default)
    if name == "shape":
        return _size(imp, x)
    if name == "ndim":
        return rank(x)
    if name == "T":
        return imp.op("Transpose", x, perm=list(range(rank(x)))[::-1])
    example = imp.example_of()
    if name in ("dtype", "device", "is_cuda", "requires_grad", "layout") and example is not None:
        return example
    raise Untranslatable(f"attribute {name}")


def reshape_target(imp, x: Value, shape) -> list[int]:
    """Target of a reshape: sizes read off tensors at the same position become 0 (copy the input's
    dimension), so `x.view(x.size(0), -1)` keeps working at other batch sizes."""
    if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)):
        shape = shape[0]
    in_shape = x.shape or ()
    out = []
    for i, d in enumerate(shape):
        if isinstance(d, Value):
            raise Untranslatable("reshape to a computed tensor shape")
        axis = getattr(d, "axis", None)
        if axis is not None and axis == i and i < len(in_shape) and in_shape[i] == int(d) \
                and (d.source is x or i == 0):
            out.append(0)
        else:
            out.append(int(d))
    return out


@method("view", "reshape")
def _view(imp, x, *shape):
    x = tensor(x)
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise Untranslatable("view as another dtype")
    return imp.op("Reshape", x, imp.ints(reshape_target(imp, x, shape)))


@function(torch.reshape)
def _reshape(imp, x, shape):
    return _view(imp, x, shape)


def flatten(imp, x, start_dim=0, end_dim=-1):
    x = tensor(x)
    r = rank(x)
    if r == 0:
        return imp.op("Reshape", x, imp.ints([1]))
    s, e = norm_axis(start_dim, r), norm_axis(end_dim, r)
    if s == e:
        return x
    if s == 1 and e == r - 1:
        return imp.op("Flatten", x, axis=1)
    shape = imp.shape_of(x)
    target = [0] * s + [-1] + list(shape[e + 1:])
    return imp.op("Reshape", x, imp.ints(target))


FUNCTIONS[torch.flatten] = flatten
METHODS["flatten"] = flatten
MODULES[nn.Flatten] = lambda imp, m, x: flatten(imp, x, m.start_dim, m.end_dim)


@method("permute")
def _permute(imp, x, *dims):
    x = tensor(x)
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = dims[0]
    r = rank(x)
    return imp.op("Transpose", x, perm=[norm_axis(d, r) for d in dims])


@function(torch.permute)
def _f_permute(imp, x, dims):
    return _permute(imp, x, dims)


@function(torch.transpose)
@method("transpose")
def _transpose(imp, x, dim0, dim1):
    x = tensor(x)
    r = rank(x)
    perm = list(range(r))
    a, b = norm_axis(dim0, r), norm_axis(dim1, r)
    perm[a], perm[b] = perm[b], perm[a]
    return imp.op("Transpose", x, perm=perm)


@function(torch.t)
@method("t")
def _t(imp, x):
    x = tensor(x)
    return x if rank(x) < 2 else imp.op("Transpose", x, perm=[1, 0])


@function(torch.unsqueeze)
@method("unsqueeze")
def _unsqueeze(imp, x, dim):
    x = tensor(x)
    return imp.op("Unsqueeze", x, imp.ints([norm_axis(dim, rank(x) + 1)]))


@function(torch.squeeze)
@method("squeeze")
def _squeeze(imp, x, dim=None):
    x = tensor(x)
    shape = imp.shape_of(x)
    dims = range(len(shape)) if dim is None else ([dim] if isinstance(dim, int) else dim)
    axes = [a for a in (norm_axis(d, len(shape)) for d in dims) if shape[a] == 1]
    return x if not axes else imp.op("Squeeze", x, imp.ints(axes))


@function(torch.cat, torch.concat, torch.concatenate)
def _cat(imp, tensors, dim=0, axis=None):
    tensors = [tensor(t) for t in tensors]
    if len({t.dtype for t in tensors}) > 1:
        raise Untranslatable("inputs of different dtypes")
    return imp.op("Concat", *tensors, axis=norm_axis(dim if axis is None else axis, rank(tensors[0])))


@function(torch.stack)
def _stack(imp, tensors, dim=0):
    tensors = [tensor(t) for t in tensors]
    axis = norm_axis(dim, rank(tensors[0]) + 1)
    return imp.op("Concat", *[imp.op("Unsqueeze", t, imp.ints([axis])) for t in tensors], axis=axis)


@method("expand")
def _expand(imp, x, *sizes):
    x = tensor(x)
    if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)):
        sizes = sizes[0]
    shape = imp.shape_of(x)
    offset = len(sizes) - len(shape)
    target = [shape[i - offset] if int(s) == -1 else int(s) for i, s in enumerate(sizes)]
    return imp.op("Expand", x, imp.ints(target))


@method("expand_as")
def _expand_as(imp, x, other):
    return _expand(imp, x, imp.shape_of(tensor(other)))


def _split(imp, x, sizes: list[int], axis: int):
    need("Split")
    outs = imp.op("Split", x, imp.ints(sizes), axis=axis, outputs=len(sizes))
    return tuple(outs) if isinstance(outs, tuple) else (outs,)


@function(torch.chunk)
@method("chunk")
def _chunk(imp, x, chunks, dim=0):
    x = tensor(x)
    axis = norm_axis(dim, rank(x))
    n = imp.shape_of(x)[axis]
    size = -(-n // chunks)
    sizes = [min(size, n - i) for i in range(0, n, size)]
    return _split(imp, x, sizes, axis)


@function(torch.split)
@method("split")
def _f_split(imp, x, split_size_or_sections, dim=0):
    x = tensor(x)
    axis = norm_axis(dim, rank(x))
    n = imp.shape_of(x)[axis]
    if isinstance(split_size_or_sections, int):
        s = split_size_or_sections
        sizes = [min(s, n - i) for i in range(0, n, s)]
    else:
        sizes = [int(s) for s in split_size_or_sections]
    return _split(imp, x, sizes, axis)


@function(operator.getitem)
def _getitem(imp, x, index):
    if not isinstance(x, Value):
        return x[index]
    index = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, Value) or isinstance(i, (list, torch.Tensor)) for i in index):
        raise Untranslatable("advanced indexing")
    shape = list(imp.shape_of(x))
    if index.count(Ellipsis) > 1:
        raise Untranslatable("two ellipses")
    consumed = sum(1 for i in index if i is not None and i is not Ellipsis)
    if Ellipsis in index:
        k = index.index(Ellipsis)
        index = index[:k] + (slice(None),) * (len(shape) - consumed) + index[k + 1:]
    starts, ends, axes, steps, gathers, unsq = [], [], [], [], [], []
    axis = 0
    out_axis = 0
    for i in index:
        if i is None:
            unsq.append(out_axis)
            out_axis += 1
            continue
        if isinstance(i, slice):
            if i != slice(None):
                b, e, st = i.indices(shape[axis])
                if st <= 0:
                    raise Untranslatable("negative step")
                starts.append(b)
                ends.append(e)
                axes.append(axis)
                steps.append(st)
            out_axis += 1
        else:
            gathers.append((axis, int(i) % shape[axis]))
        axis += 1
    y = x
    if starts:
        need("Slice")
        y = imp.op("Slice", y, imp.ints(starts), imp.ints(ends), imp.ints(axes), imp.ints(steps))
    for k, (ax, i) in enumerate(reversed(gathers)):  # highest axis first so lower axes keep their place
        y = imp.op("Gather", y, imp.const(np.int64(i)), axis=ax)
    if unsq:
        y = imp.op("Unsqueeze", y, imp.ints(unsq))
    return y


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


# ---------------------------------------------------------------------------------- linear algebra
@function(operator.matmul, torch.matmul, torch.mm, torch.bmm)
@method("matmul", "mm", "bmm", "__matmul__")
def _matmul(imp, a, b):
    a, b = tensor(a), tensor(b)
    if a.dtype != b.dtype:
        raise Untranslatable("operands of different dtypes")
    return imp.op("MatMul", a, b)


def linear(imp, x: Value, w: Value, b: Value | None) -> Value:
    """y = x W^T + b: Gemm for matrices, MatMul + Add otherwise (both lower to F.linear)."""
    x = tensor(x)
    if rank(x) == 2:
        return imp.op("Gemm", x, w, b, transB=1) if b is not None else imp.op("Gemm", x, w, transB=1)
    y = imp.op("MatMul", x, imp.op("Transpose", w, perm=[1, 0]))
    return y if b is None else imp.op("Add", y, b)


@function(F.linear)
def _f_linear(imp, x, weight, bias=None):
    return linear(imp, x, tensor(weight, "weight"), bias)


@module(nn.Linear)
def _m_linear(imp, m, x):
    return linear(imp, x, imp.param(m, "weight"), imp.param(m, "bias"))


@function(F.embedding)
def _f_embedding(imp, idx, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                 sparse=False):
    if max_norm is not None or scale_grad_by_freq:
        raise Untranslatable("max_norm / scale_grad_by_freq")
    return imp.op("Gather", tensor(weight), tensor(idx), axis=0)


@module(nn.Embedding)
def _m_embedding(imp, m, idx):
    if m.max_norm is not None or m.scale_grad_by_freq:
        raise Untranslatable("max_norm / scale_grad_by_freq")
    return imp.op("Gather", imp.param(m, "weight"), tensor(idx), axis=0)


# ---------------------------------------------------------------------------------- convolution
def conv(imp, x, w, b, stride, padding, dilation, groups, n: int):
    x = tensor(x)
    kernel = list(w.shape[2:])
    strides, dilations = _pair(stride, n), _pair(dilation, n)
    if padding == "valid":
        pads = [0] * (2 * n)
    elif padding == "same":
        total = [d * (k - 1) for d, k in zip(dilations, kernel)]
        pads = [t // 2 for t in total] + [t - t // 2 for t in total]
    else:
        p = _pair(padding, n)
        pads = p + p
    if rank(x) != n + 2:
        raise Untranslatable(f"unbatched {n}-d convolution")
    return imp.op("Conv", x, w, b, kernel_shape=kernel, strides=strides, pads=pads, dilations=dilations,
                  group=int(groups))


@module(nn.Conv1d, nn.Conv2d, nn.Conv3d)
def _m_conv(imp, m, x):
    if m.padding_mode != "zeros":
        raise Untranslatable(f"padding_mode={m.padding_mode}")
    n = len(m.kernel_size)
    return conv(imp, x, imp.param(m, "weight"), imp.param(m, "bias"), m.stride, m.padding, m.dilation, m.groups, n)


def _f_conv(n):
    def convert(imp, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        return conv(imp, x, tensor(weight), bias, stride, padding, dilation, groups, n)
    return convert


FUNCTIONS.update({F.conv1d: _f_conv(1), F.conv2d: _f_conv(2), F.conv3d: _f_conv(3)})


@module(nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
def _m_convt(imp, m, x, output_size=None):
    if output_size is not None or m.padding_mode != "zeros":
        raise Untranslatable("output_size= or padding_mode")
    x = tensor(x)
    n = len(m.kernel_size)
    p = _pair(m.padding, n)
    return imp.op("ConvTranspose", x, imp.param(m, "weight"), imp.param(m, "bias"), kernel_shape=list(m.kernel_size),
                  strides=_pair(m.stride, n), pads=p + p, dilations=_pair(m.dilation, n), group=int(m.groups),
                  output_padding=_pair(m.output_padding, n))


# ---------------------------------------------------------------------------------- normalization
def batch_norm(imp, x, mean, var, weight, bias, training, momentum, eps, bn_module=None):
    x = tensor(x)
    c = imp.shape_of(x)[1]
    dtype = x.dtype
    if weight is None:
        weight = imp.const(np.ones(c, dtype))
    if bias is None:
        bias = imp.const(np.zeros(c, dtype))
    if not training:
        if mean is None:
            raise Untranslatable("inference without running statistics")
        return imp.op("BatchNormalization", x, weight, bias, mean, var, epsilon=float(eps))
    if momentum is None:
        raise Untranslatable("cumulative moving average (momentum=None)")
    if mean is None:  # batch statistics only: the stats inputs are placeholders, never updated
        mean, var = imp.const(np.zeros(c, dtype)), imp.const(np.ones(c, dtype))
    y, _, _ = imp.op("BatchNormalization", x, weight, bias, mean, var, epsilon=float(eps),
                     momentum=float(1.0 - momentum), training_mode=1, outputs=3)
    if bn_module is not None and bn_module.track_running_stats and bn_module.num_batches_tracked is not None:
        counter = imp.param(bn_module, "num_batches_tracked")
        y.producer.meta["torch.num_batches_tracked"] = counter.name
    return y


@module(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
def _m_bn(imp, m, x):
    training = imp.module_training(m) or not m.track_running_stats
    mean = imp.param(m, "running_mean") if m.track_running_stats else None
    var = imp.param(m, "running_var") if m.track_running_stats else None
    return batch_norm(imp, x, mean, var, imp.param(m, "weight"), imp.param(m, "bias"), training,
                      m.momentum, m.eps, m if imp.module_training(m) else None)


@function(F.batch_norm)
def _f_bn(imp, x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    training = bool(training) and imp.training
    if training and running_mean is not None:
        raise Untranslatable("functional batch_norm updating tensors in training")
    return batch_norm(imp, x, running_mean, running_var, weight, bias, training or running_mean is None,
                      momentum, eps)


def layer_norm(imp, x, normalized_shape, weight, bias, eps):
    x = tensor(x)
    n = len(normalized_shape) if isinstance(normalized_shape, (list, tuple, torch.Size)) else 1
    if weight is None:
        weight = imp.const(np.ones(imp.shape_of(x)[-n:], x.dtype))
    return imp.op("LayerNormalization", x, weight, bias, axis=-n, epsilon=float(eps))


@function(F.layer_norm)
def _f_ln(imp, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return layer_norm(imp, x, normalized_shape, weight, bias, eps)


@module(nn.LayerNorm)
def _m_ln(imp, m, x):
    return layer_norm(imp, x, m.normalized_shape, imp.param(m, "weight"), imp.param(m, "bias"), m.eps)


# ---------------------------------------------------------------------------------- pooling
def _pool(imp, op_name, x, kernel_size, stride, padding, dilation, ceil_mode, n, **extra):
    x = tensor(x)
    if rank(x) != n + 2:
        raise Untranslatable(f"unbatched {n}-d pooling")
    kernel = _pair(kernel_size, n)
    strides = _pair(stride if stride not in (None, [], ()) else kernel, n)
    p = _pair(padding, n)
    attrs = dict(kernel_shape=kernel, strides=strides, pads=p + p, ceil_mode=int(bool(ceil_mode)), **extra)
    if dilation is not None and any(d != 1 for d in _pair(dilation, n)):
        attrs["dilations"] = _pair(dilation, n)
    return imp.op(op_name, x, **attrs)


@module(nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)
def _m_maxpool(imp, m, x):
    if m.return_indices:
        raise Untranslatable("return_indices")
    n = {nn.MaxPool1d: 1, nn.MaxPool2d: 2, nn.MaxPool3d: 3}[type(m)]
    return _pool(imp, "MaxPool", x, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode, n)


def _f_maxpool(n):
    def convert(imp, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        if return_indices:
            raise Untranslatable("return_indices")
        return _pool(imp, "MaxPool", x, kernel_size, stride, padding, dilation, ceil_mode, n)
    return convert


FUNCTIONS.update({F.max_pool1d: _f_maxpool(1), F.max_pool2d: _f_maxpool(2), F.max_pool3d: _f_maxpool(3)})


def _avgpool(imp, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n):
    if divisor_override is not None:
        raise Untranslatable("divisor_override")
    return _pool(imp, "AveragePool", x, kernel_size, stride, padding, None, ceil_mode, n,
                 count_include_pad=int(bool(count_include_pad)))


@module(nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)
def _m_avgpool(imp, m, x):
    n = {nn.AvgPool1d: 1, nn.AvgPool2d: 2, nn.AvgPool3d: 3}[type(m)]
    return _avgpool(imp, x, m.kernel_size, m.stride, m.padding, m.ceil_mode, m.count_include_pad,
                    getattr(m, "divisor_override", None), n)


def _f_avgpool(n):
    def convert(imp, x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
        return _avgpool(imp, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n)
    return convert


FUNCTIONS.update({F.avg_pool1d: _f_avgpool(1), F.avg_pool2d: _f_avgpool(2), F.avg_pool3d: _f_avgpool(3)})


def adaptive_pool(imp, x, output_size, n: int, kind: str):
    """Adaptive pooling: global pooling for output 1, a plain pool when the input divides evenly."""
    x = tensor(x)
    shape = imp.shape_of(x)
    if len(shape) != n + 2:
        raise Untranslatable(f"unbatched adaptive pooling")
    spatial = list(shape[2:])
    out = [s if o is None else int(o) for o, s in zip(_pair(output_size, n) if not isinstance(output_size, (list, tuple))
                                                       else output_size, spatial)]
    if all(o == 1 for o in out):
        return imp.op("GlobalAveragePool" if kind == "avg" else "GlobalMaxPool", x)
    if any(s % o for s, o in zip(spatial, out)):
        raise Untranslatable(f"input {spatial} does not divide into output {out}")
    k = [s // o for s, o in zip(spatial, out)]
    if kind == "avg":
        return imp.op("AveragePool", x, kernel_shape=k, strides=k)
    return imp.op("MaxPool", x, kernel_shape=k, strides=k)


for _n, _m, _f in ((1, nn.AdaptiveAvgPool1d, F.adaptive_avg_pool1d), (2, nn.AdaptiveAvgPool2d, F.adaptive_avg_pool2d),
                   (3, nn.AdaptiveAvgPool3d, F.adaptive_avg_pool3d)):
    MODULES[_m] = (lambda n: lambda imp, m, x: adaptive_pool(imp, x, m.output_size, n, "avg"))(_n)
    FUNCTIONS[_f] = (lambda n: lambda imp, x, output_size: adaptive_pool(imp, x, output_size, n, "avg"))(_n)
for _n, _m in ((1, nn.AdaptiveMaxPool1d), (2, nn.AdaptiveMaxPool2d), (3, nn.AdaptiveMaxPool3d)):
    MODULES[_m] = (lambda n: lambda imp, m, x: adaptive_pool(imp, x, m.output_size, n, "max")
                   if not m.return_indices else (_ for _ in ()).throw(Untranslatable("return_indices")))(_n)


@function(F.pad)
def _f_pad(imp, x, pad, mode="constant", value=None):
    x = tensor(x)
    need("Pad")
    modes = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}
    if mode not in modes:
        raise Untranslatable(f"mode {mode}")
    r = rank(x)
    k = len(pad) // 2
    # torch lists (begin, end) pairs from the last axis backwards; ONNX wants all begins then all ends
    axes = [r - 1 - i for i in range(k)]
    begins = [int(pad[2 * i]) for i in range(k)]
    ends = [int(pad[2 * i + 1]) for i in range(k)]
    cv = None if value in (None, 0, 0.0) or mode != "constant" else imp.scalar_like(value, x)
    return imp.op("Pad", x, imp.ints(begins + ends), cv, imp.ints(axes), mode=modes[mode])


LEAF_TYPES: tuple[type, ...] = ()  # filled in by attention.py (modules aiacc decomposes itself)

from aiacc.plugins.torch import attention  # noqa: E402,F401  (registers the attention converters)


# ---------------------------------------------------------------------------------- aten (torch.export)
def aten_converter(target: Any) -> Callable | None:
    """A converter for an aten OpOverload (programs from torch.export): the converter of the torch
    function or Tensor method of the same name, whose positional arguments aten mirrors."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    name = target.overloadpacket.__name__
    if name in ATEN:
        return ATEN[name]
    fn = getattr(torch, name, None)
    conv = FUNCTIONS.get(fn) if fn is not None else None
    if conv is None and getattr(F, name, None) is not None:
        conv = FUNCTIONS.get(getattr(F, name))
    if conv is None and name in METHODS:
        conv = METHODS[name]
    return conv


def _aten_embedding(imp, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return imp.op("Gather", tensor(weight), tensor(indices), axis=0)


def _aten_bn_no_training(imp, x, weight, bias, running_mean, running_var, momentum, eps):
    y = batch_norm(imp, x, running_mean, running_var, weight, bias, False, momentum, eps)
    return (y, None, None)


def _aten_batch_norm(imp, x, weight, bias, running_mean, running_var, training, momentum, eps, cudnn=True):
    return _f_bn(imp, x, running_mean, running_var, weight, bias, training, momentum, eps)


def _aten_dropout(imp, x, p, train):
    return dropout(imp, x, p, bool(train) and imp.training)


ATEN: dict[str, Callable] = {
    "embedding": _aten_embedding,
    "_native_batch_norm_legit_no_training": _aten_bn_no_training,
    "batch_norm": _aten_batch_norm,
    "dropout": _aten_dropout,
    "linear": _f_linear,
    "conv2d": _f_conv(2), "conv1d": _f_conv(1),
    "max_pool2d": _f_maxpool(2), "avg_pool2d": _f_avgpool(2),
    "adaptive_avg_pool2d": FUNCTIONS[F.adaptive_avg_pool2d],
    "gelu": _gelu, "silu": _silu, "hardswish": _unary("HardSwish"), "relu6": _relu6, "hardtanh": _hardtanh,
    "layer_norm": lambda imp, x, shape, w=None, b=None, eps=1e-5, cudnn=True: layer_norm(imp, x, shape, w, b, eps),
    "softmax": _softmax_like("Softmax"), "_softmax": lambda imp, x, dim, half: _softmax_like("Softmax")(imp, x, dim),
    "view": _view, "reshape": _view, "flatten": flatten, "permute": _f_permute, "expand": _expand,
    "scaled_dot_product_attention": None,
}
ATEN = {k: v for k, v in ATEN.items() if v is not None}
