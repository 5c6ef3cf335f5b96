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
def _category(dtype: str) -> int:
    kind = np.dtype(dtype).kind
    return {"b": 0, "i": 1, "u": 1, "f": 2}.get(kind, 3)


def _operands(imp, a, b):
    if isinstance(a, Value) and isinstance(b, Value):
        if a.dtype != b.dtype:
            # torch's promotion across categories (bool < integer < float): the operand of the lower
            # category takes the other's dtype, unless that other one is a 0-d tensor (other rules apply)
            ca, cb = _category(a.dtype), _category(b.dtype)
            hi, lo = (a, b) if ca > cb else (b, a)
            if ca == cb or max(ca, cb) > 2 or not hi.shape:
                raise Untranslatable(f"operands of dtypes {a.dtype} and {b.dtype} (type promotion)")
            cast = imp.op("Cast", lo, to=hi.dtype)
            return (hi, cast) if hi is a else (cast, hi)
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
        # tensor bounds: elementwise Max / Min (broadcasting like torch)
        y = tensor(x)
        if min is not None:
            y = imp.op("Max", *_operands(imp, y, min))
        if max is not None:
            y = imp.op("Min", *_operands(imp, y, max))
        return y
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
    if dtype not in _NUMPY_DTYPES:
        raise Untranslatable(f"{dtype} has no numpy dtype in the IR")
    return x if dtype == x.dtype else imp.op("Cast", x, to=dtype)


_NUMPY_DTYPES = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"}


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
    if padding_idx is not None and imp.training:
        raise Untranslatable("padding_idx in training (its row gets no gradient)")
    return imp.op("Gather", tensor(weight), tensor(idx), axis=0)


@module(nn.Embedding)
def _m_embedding(imp, m, idx):
    if m.max_norm is not None or m.scale_grad_by_freq:
        raise Untranslatable("max_norm / scale_grad_by_freq")
    if m.padding_idx is not None and imp.module_training(m):
        raise Untranslatable("padding_idx in training (its row gets no gradient)")
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
    if bias is None:  # explicit zeros: onnxruntime 1.32 crashes on a LayerNormalization without its bias
        bias = imp.const(np.zeros(imp.shape_of(x)[-n:], x.dtype))
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
        # uneven windows: pooling is separable, so reduce one axis at a time over its exact windows
        if sum(o for s, o in zip(spatial, out) if s != o) > 64:
            raise Untranslatable(f"input {spatial} does not divide into output {out} (too many windows)")
        need("Slice")
        y = x
        for i, (s, o) in enumerate(zip(spatial, out)):
            if s != o:
                y = _adaptive_axis(imp, y, 2 + i, s, o, kind)
        return y
    k = [s // o for s, o in zip(spatial, out)]
    if kind == "avg":
        return imp.op("AveragePool", x, kernel_shape=k, strides=k)
    return imp.op("MaxPool", x, kernel_shape=k, strides=k)


for _n, _m, _f in ((1, nn.AdaptiveAvgPool1d, F.adaptive_avg_pool1d), (2, nn.AdaptiveAvgPool2d, F.adaptive_avg_pool2d),
                   (3, nn.AdaptiveAvgPool3d, F.adaptive_avg_pool3d)):
    MODULES[_m] = (lambda n: lambda imp, m, x: adaptive_pool(imp, x, m.output_size, n, "avg"))(_n)
    FUNCTIONS[_f] = (lambda n: lambda imp, x, output_size: adaptive_pool(imp, x, output_size, n, "avg"))(_n)
def _f_adaptive_max(n):
    def convert(imp, x, output_size, return_indices=False):
        if return_indices:
            raise Untranslatable("return_indices")
        return adaptive_pool(imp, x, output_size, n, "max")
    return convert


FUNCTIONS.update({F.adaptive_max_pool1d: _f_adaptive_max(1), F.adaptive_max_pool2d: _f_adaptive_max(2),
                  F.adaptive_max_pool3d: _f_adaptive_max(3)})
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


# ---------------------------------------------------------------------------------- resampling
_NEAREST = {"nearest": ("asymmetric", "floor"), "nearest-exact": ("half_pixel", "round_prefer_ceil")}
_LINEAR = {"linear": ("linear", 1), "bilinear": ("linear", 2), "trilinear": ("linear", 3), "bicubic": ("cubic", 2)}


def interpolate(imp, x, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """F.interpolate as Resize over the spatial axes (the batch axis stays free)."""
    x = tensor(x)
    need("Resize")
    shape = imp.shape_of(x)
    n = len(shape) - 2
    example = imp.example_of()
    if n < 1 or not isinstance(example, torch.Tensor):
        raise Untranslatable("input without spatial axes")
    out = [int(d) for d in example.shape[2:]]
    if antialias:
        raise Untranslatable("antialias")
    if mode == "area":
        return adaptive_pool(imp, x, out, n, "avg")
    if mode in _NEAREST:
        ctm, nearest_mode = _NEAREST[mode]
        attrs = dict(mode="nearest", coordinate_transformation_mode=ctm, nearest_mode=nearest_mode)
    elif mode in _LINEAR:
        kind, dims = _LINEAR[mode]
        if dims != n:
            raise Untranslatable(f"mode {mode} on a {n}-d input")
        attrs = dict(mode=kind, coordinate_transformation_mode="align_corners" if align_corners else "half_pixel")
        if kind == "cubic":
            attrs["cubic_coeff_a"] = -0.75
    else:
        raise Untranslatable(f"mode {mode}")
    axes = list(range(2, n + 2))
    if size is not None or recompute_scale_factor:
        return imp.op("Resize", x, None, None, imp.ints(out), axes=axes, **attrs)
    scales = np.array([float(s) for s in _pair(scale_factor, n)], np.float32)
    if [int(math.floor(float(s) * d)) for s, d in zip(scales, shape[2:])] != out:
        raise Untranslatable(f"scale_factor {scale_factor} in float32 gives another output size than {out}")
    return imp.op("Resize", x, None, imp.const(scales), None, axes=axes, **attrs)


FUNCTIONS[F.interpolate] = interpolate
FUNCTIONS[F.upsample] = interpolate


@function(F.upsample_nearest)
def _upsample_nearest(imp, x, size=None, scale_factor=None):
    return interpolate(imp, x, size, scale_factor, "nearest")


@function(F.upsample_bilinear)
def _upsample_bilinear(imp, x, size=None, scale_factor=None):
    return interpolate(imp, x, size, scale_factor, "bilinear", align_corners=True)


@module(nn.Upsample, nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d)
def _m_upsample(imp, m, x):
    return interpolate(imp, x, m.size, m.scale_factor, m.mode, m.align_corners,
                       getattr(m, "recompute_scale_factor", None))


def _adaptive_axis(imp, x, axis: int, in_len: int, out_len: int, kind: str):
    """Exact adaptive pooling along one axis: output i reduces input [floor(i*L/n), ceil((i+1)*L/n))."""
    reduce = "ReduceMean" if kind == "avg" else "ReduceMax"
    parts = []
    for i in range(out_len):
        start, end = (i * in_len) // out_len, -(-((i + 1) * in_len) // out_len)
        piece = imp.op("Slice", x, imp.ints([start]), imp.ints([end]), imp.ints([axis]))
        parts.append(imp.op(reduce, piece, imp.ints([axis]), keepdims=1))
    return parts[0] if len(parts) == 1 else imp.op("Concat", *parts, axis=axis)


# ---------------------------------------------------------------------------------- more normalization
def _channel_affine(imp, y, weight, bias, r: int):
    """y * weight + bias with per-channel (axis 1) parameters."""
    if weight is None and bias is None:
        return y
    shape = imp.ints([-1] + [1] * (r - 2))
    if weight is not None:
        y = imp.op("Mul", y, imp.op("Reshape", tensor(weight, "weight"), shape))
    if bias is not None:
        y = imp.op("Add", y, imp.op("Reshape", tensor(bias, "bias"), shape))
    return y


def group_norm(imp, x, groups: int, weight, bias, eps: float):
    """GroupNorm: LayerNormalization over each group's (channels x spatial) view, then the channel affine."""
    x = tensor(x)
    shape = imp.shape_of(x)
    if len(shape) < 2 or shape[1] % groups:
        raise Untranslatable(f"{shape[1] if len(shape) > 1 else '?'} channels in {groups} groups")
    per_group = int(np.prod(shape[1:])) // groups
    y = imp.op("Reshape", x, imp.ints([0, groups, per_group]))
    y = imp.op("LayerNormalization", y, imp.const(np.ones(per_group, x.dtype)), imp.const(np.zeros(per_group, x.dtype)),
               axis=-1, epsilon=float(eps))
    y = imp.op("Reshape", y, imp.ints([0] + list(shape[1:])))
    return _channel_affine(imp, y, weight, bias, len(shape))


@function(F.group_norm)
def _f_group_norm(imp, x, num_groups, weight=None, bias=None, eps=1e-5):
    return group_norm(imp, x, int(num_groups), weight, bias, eps)


@module(nn.GroupNorm)
def _m_group_norm(imp, m, x):
    return group_norm(imp, x, m.num_groups, imp.param(m, "weight"), imp.param(m, "bias"), m.eps)


def instance_norm(imp, x, running_mean, running_var, weight, bias, use_input_stats, eps):
    x = tensor(x)
    shape = imp.shape_of(x)
    if len(shape) < 3:
        raise Untranslatable("unbatched instance norm")
    if use_input_stats:
        return group_norm(imp, x, shape[1], weight, bias, eps)
    return batch_norm(imp, x, running_mean, running_var, weight, bias, False, 0.1, eps)


@function(F.instance_norm)
def _f_instance_norm(imp, x, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                     momentum=0.1, eps=1e-5):
    if use_input_stats and running_mean is not None:
        raise Untranslatable("instance norm updating running statistics")
    return instance_norm(imp, x, running_mean, running_var, weight, bias, use_input_stats, eps)


@module(nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
def _m_instance_norm(imp, m, x):
    use_input_stats = m.training or not m.track_running_stats
    if imp.mode == "inference":
        use_input_stats = not m.track_running_stats
    if use_input_stats and m.track_running_stats:
        raise Untranslatable("instance norm updating running statistics in training")
    x = tensor(x)
    if len(imp.shape_of(x)) != {nn.InstanceNorm1d: 3, nn.InstanceNorm2d: 4, nn.InstanceNorm3d: 5}[type(m)]:
        raise Untranslatable("unbatched instance norm")
    mean = imp.param(m, "running_mean") if m.track_running_stats else None
    var = imp.param(m, "running_var") if m.track_running_stats else None
    w = imp.param(m, "weight") if m.affine else None
    b = imp.param(m, "bias") if m.affine else None
    return instance_norm(imp, x, mean, var, w, b, use_input_stats, m.eps)


@function(F.normalize)
def _f_normalize(imp, x, p=2.0, dim=1, eps=1e-12, out=None):
    x = tensor(x)
    if p != 2 or out is not None:
        raise Untranslatable("p != 2 or out=")
    axis = norm_axis(dim, rank(x))
    norm = imp.op("Sqrt", imp.op("ReduceSum", imp.op("Mul", x, x), imp.ints([axis]), keepdims=1))
    return imp.op("Div", x, imp.op("Max", norm, imp.scalar_like(eps, x)))


# ---------------------------------------------------------------------------------- more activations
def prelu(imp, x, weight):
    x, w = tensor(x), tensor(weight, "weight")
    r = rank(x)
    count = int(np.prod(imp.shape_of(w)))
    if count > 1 and r >= 2:
        w = imp.op("Reshape", w, imp.ints([count] + [1] * (r - 2)))
    return imp.op("PRelu", x, w)


FUNCTIONS[F.prelu] = prelu
FUNCTIONS[torch.prelu] = prelu
MODULES[nn.PReLU] = lambda imp, m, x: prelu(imp, x, imp.param(m, "weight"))

_SELU = dict(alpha=1.6732632423543772, gamma=1.0507009873554805)


@function(F.selu, torch.selu)
def _selu(imp, x, inplace=False):
    return imp.op("Selu", tensor(x), **_SELU)


MODULES[nn.SELU] = lambda imp, m, x: _selu(imp, x)


@function(F.celu, torch.celu)
def _celu(imp, x, alpha=1.0, inplace=False):
    x = tensor(x)
    if alpha == 1.0:
        return imp.op("Elu", x, alpha=1.0)
    a = imp.scalar_like(alpha, x)
    return imp.op("Mul", imp.op("Elu", imp.op("Div", x, a), alpha=1.0), a)


MODULES[nn.CELU] = lambda imp, m, x: _celu(imp, x, m.alpha)


def softplus(imp, x, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (torch's linear regime)."""
    x = tensor(x)
    bx = x if beta == 1 else imp.op("Mul", x, imp.scalar_like(beta, x))
    y = imp.op("Softplus", bx)
    if beta != 1:
        y = imp.op("Div", y, imp.scalar_like(beta, x))
    if threshold < 20 or beta != 1:
        y = imp.op("Where", imp.op("Greater", bx, imp.scalar_like(threshold, x)), x, y)
    return y


FUNCTIONS[F.softplus] = softplus
MODULES[nn.Softplus] = lambda imp, m, x: softplus(imp, x, m.beta, m.threshold)


@function(F.logsigmoid)
def _logsigmoid(imp, x):
    x = tensor(x)
    return imp.op("Neg", imp.op("Softplus", imp.op("Neg", x)))


MODULES[nn.LogSigmoid] = lambda imp, m, x: _logsigmoid(imp, x)


@function(F.tanhshrink)
def _tanhshrink(imp, x):
    x = tensor(x)
    return imp.op("Sub", x, imp.op("Tanh", x))


MODULES[nn.Tanhshrink] = lambda imp, m, x: _tanhshrink(imp, x)


@function(F.threshold)
def _threshold(imp, x, threshold, value, inplace=False):
    x = tensor(x)
    return imp.op("Where", imp.op("Greater", x, imp.scalar_like(threshold, x)), x, imp.scalar_like(value, x))


MODULES[nn.Threshold] = lambda imp, m, x: _threshold(imp, x, m.threshold, m.value)


@function(F.glu)
def _glu(imp, x, dim=-1):
    x = tensor(x)
    axis = norm_axis(dim, rank(x))
    n = imp.shape_of(x)[axis]
    if n % 2:
        raise Untranslatable("odd size along the gated axis")
    a, b = _split(imp, x, [n // 2, n // 2], axis)
    return imp.op("Mul", a, imp.op("Sigmoid", b))


MODULES[nn.GLU] = lambda imp, m, x: _glu(imp, x, m.dim)
MODULES[nn.Softmax2d] = lambda imp, m, x: _softmax_like("Softmax")(imp, x, -3)
MODULES[nn.Softmin] = lambda imp, m, x: _softmax_like("Softmax")(imp, imp.op("Neg", tensor(x)), m.dim)


@function(F.softmin)
def _softmin(imp, x, dim=None, _stacklevel=3, dtype=None):
    return _softmax_like("Softmax")(imp, imp.op("Neg", tensor(x)), dim, dtype=dtype)


@function(torch.square)
@method("square")
def _square(imp, x):
    x = tensor(x)
    return imp.op("Mul", x, x)


for _op, _fns, _methods in (("Sign", (torch.sign,), ("sign",)), ("Round", (torch.round,), ()),
                            ("Exp", (torch.exp_,), ("exp_",)), ("Sqrt", (torch.sqrt_,), ("sqrt_",)),
                            ("Abs", (torch.abs_,), ("abs_",)), ("Neg", (), ("neg_",)),
                            ("Reciprocal", (), ("reciprocal_",))):
    FUNCTIONS.update({t: _unary(_op) for t in _fns})
    METHODS.update({m: _unary(_op) for m in _methods})


@method("round")
def _m_round(imp, x, decimals=0):
    if decimals:
        raise Untranslatable("decimals")
    return imp.op("Round", tensor(x))


@function(torch.log1p)
@method("log1p")
def _log1p(imp, x):
    x = tensor(x)
    return imp.op("Log", imp.op("Add", x, imp.scalar_like(1, x)))


@function(torch.expm1)
@method("expm1")
def _expm1(imp, x):
    x = tensor(x)
    return imp.op("Sub", imp.op("Exp", x), imp.scalar_like(1, x))


# ---------------------------------------------------------------------------------- comparison and logic
def _compare(op_name, negate=False):
    def conv(imp, a, b, *, out=None):
        if out is not None:
            raise Untranslatable("out= argument")
        a, b = _operands(imp, a, b)
        y = imp.op(op_name, a, b)
        return imp.op("Not", y) if negate else y
    return conv


for _op, _neg, _fns, _methods in (
        ("Less", False, (operator.lt, torch.lt, torch.less), ("lt", "less", "__lt__")),
        ("LessOrEqual", False, (operator.le, torch.le, torch.less_equal), ("le", "__le__")),
        ("Greater", False, (operator.gt, torch.gt, torch.greater), ("gt", "greater", "__gt__")),
        ("GreaterOrEqual", False, (operator.ge, torch.ge, torch.greater_equal), ("ge", "__ge__")),
        ("Equal", False, (operator.eq, torch.eq), ("eq", "__eq__")),
        ("Equal", True, (operator.ne, torch.ne, torch.not_equal), ("ne", "__ne__"))):
    FUNCTIONS.update({t: _compare(_op, _neg) for t in _fns})
    METHODS.update({m: _compare(_op, _neg) for m in _methods})


def _logical(op_name, bitwise: bool):
    def conv(imp, a, b):
        a, b = _operands(imp, a, b)
        if bitwise and a.dtype != "bool":
            raise Untranslatable(f"bitwise {op_name} of {a.dtype} tensors")
        if not bitwise:
            a = a if a.dtype == "bool" else imp.op("Cast", a, to="bool")
            b = b if b.dtype == "bool" else imp.op("Cast", b, to="bool")
        return imp.op(op_name, a, b)
    return conv


for _op, _fns, _methods, _logic in (
        ("And", (operator.and_, torch.bitwise_and), ("__and__", "bitwise_and"), (torch.logical_and, "logical_and")),
        ("Or", (operator.or_, torch.bitwise_or), ("__or__", "bitwise_or"), (torch.logical_or, "logical_or")),
        ("Xor", (operator.xor, torch.bitwise_xor), ("__xor__", "bitwise_xor"), (torch.logical_xor, "logical_xor"))):
    FUNCTIONS.update({t: _logical(_op, True) for t in _fns})
    METHODS.update({m: _logical(_op, True) for m in _methods})
    FUNCTIONS[_logic[0]] = _logical(_op, False)
    METHODS[_logic[1]] = _logical(_op, False)


@function(operator.invert, torch.bitwise_not, torch.logical_not)
@method("__invert__", "bitwise_not", "logical_not")
def _not(imp, x):
    x = tensor(x)
    if x.dtype != "bool":
        if imp.current.target in (torch.logical_not, "logical_not"):
            x = imp.op("Cast", x, to="bool")
        else:
            raise Untranslatable(f"bitwise not of a {x.dtype} tensor")
    return imp.op("Not", x)


# ---------------------------------------------------------------------------------- max / min
def _max_min(kind: str):
    """torch.max / torch.min in their three forms: over everything, along a dim (values, indices), and
    elementwise between two tensors."""
    reduce, arg, binary = ("ReduceMax", "ArgMax", "Max") if kind == "max" else ("ReduceMin", "ArgMin", "Min")
    result_type = torch.return_types.max if kind == "max" else torch.return_types.min

    def conv(imp, x, dim=None, keepdim=False, *, out=None):
        if out is not None:
            raise Untranslatable("out= argument")
        x = tensor(x)
        if isinstance(dim, Value):
            a, b = _operands(imp, x, dim)
            return imp.op(binary, a, b)
        r = rank(x)
        if dim is None:
            return imp.op(reduce, x, imp.ints(range(r)), keepdims=0)
        axis = norm_axis(dim, r)
        values = imp.op(reduce, x, imp.ints([axis]), keepdims=int(bool(keepdim)))
        indices = imp.op(arg, x, axis=axis, keepdims=int(bool(keepdim)))
        return result_type((values, indices))
    return conv


FUNCTIONS.update({torch.max: _max_min("max"), torch.min: _max_min("min")})
METHODS.update({"max": _max_min("max"), "min": _max_min("min")})


def _elementwise(op_name):
    def conv(imp, a, b, *, out=None):
        a, b = _operands(imp, a, b)
        return imp.op(op_name, a, b)
    return conv


FUNCTIONS.update({torch.maximum: _elementwise("Max"), torch.minimum: _elementwise("Min")})
METHODS.update({"maximum": _elementwise("Max"), "minimum": _elementwise("Min")})


def _reduce_all_or(op_name):
    def conv(imp, x, dim=(), keepdim=False, *, out=None):
        x = tensor(x)
        if out is not None:
            raise Untranslatable("out= argument")
        r = rank(x)
        dims = list(range(r)) if dim in (None, (), []) else ([dim] if isinstance(dim, int) else list(dim))
        return imp.op(op_name, x, imp.ints([norm_axis(d, r) for d in dims]), keepdims=int(bool(keepdim)))
    return conv


FUNCTIONS.update({torch.amax: _reduce_all_or("ReduceMax"), torch.amin: _reduce_all_or("ReduceMin")})
METHODS.update({"amax": _reduce_all_or("ReduceMax"), "amin": _reduce_all_or("ReduceMin")})


def _argmax_like(op_name):
    def conv(imp, x, dim=None, keepdim=False):
        x = tensor(x)
        if dim is None:
            flat = imp.op("Reshape", x, imp.ints([-1]))
            y = imp.op(op_name, flat, axis=0, keepdims=0)
            return imp.op("Reshape", y, imp.ints([1] * rank(x))) if keepdim else y
        return imp.op(op_name, x, axis=norm_axis(dim, rank(x)), keepdims=int(bool(keepdim)))
    return conv


FUNCTIONS.update({torch.argmax: _argmax_like("ArgMax"), torch.argmin: _argmax_like("ArgMin")})
METHODS.update({"argmax": _argmax_like("ArgMax"), "argmin": _argmax_like("ArgMin")})


@function(torch.clamp_min)
@method("clamp_min", "clamp_min_")
def _clamp_min(imp, x, min):
    return _clamp(imp, x, min, None)


@function(torch.clamp_max)
@method("clamp_max", "clamp_max_")
def _clamp_max(imp, x, max):
    return _clamp(imp, x, None, max)


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


# ---------------------------------------------------------------------------------- more shapes
@function(torch.unbind)
@method("unbind")
def _unbind(imp, x, dim=0):
    x = tensor(x)
    axis = norm_axis(dim, rank(x))
    return tuple(imp.op("Gather", x, imp.const(np.int64(i)), axis=axis) for i in range(imp.shape_of(x)[axis]))


@method("repeat")
def _repeat(imp, x, *sizes):
    x = tensor(x)
    if len(sizes) == 1 and isinstance(sizes[0], (list, tuple, torch.Size)):
        sizes = sizes[0]
    sizes = [int(s) for s in sizes]
    r = rank(x)
    if len(sizes) < r:
        raise Untranslatable("fewer repeats than dimensions")
    if len(sizes) > r:
        x = imp.op("Reshape", x, imp.ints([1] * (len(sizes) - r) + list(imp.shape_of(x))))
    need("Tile")
    return imp.op("Tile", x, imp.ints(sizes))


@function(torch.tile)
@method("tile")
def _tile(imp, x, *dims):
    x = tensor(x)
    if len(dims) == 1 and isinstance(dims[0], (list, tuple, torch.Size)):
        dims = dims[0]
    dims = [1] * (rank(x) - len(dims)) + [int(d) for d in dims]
    return _repeat(imp, x, dims)


@function(torch.repeat_interleave)
@method("repeat_interleave")
def _repeat_interleave(imp, x, repeats, dim=None, *, output_size=None):
    x = tensor(x)
    if not isinstance(repeats, int) or dim is None:
        raise Untranslatable("tensor repeats or no dim")
    shape = list(imp.shape_of(x))
    axis = norm_axis(dim, len(shape))
    y = imp.op("Unsqueeze", x, imp.ints([axis + 1]))
    y = imp.op("Tile", y, imp.ints([1] * (axis + 1) + [repeats] + [1] * (len(shape) - axis - 1)))
    shape[axis] *= repeats
    return imp.op("Reshape", y, imp.ints([0] + shape[1:] if axis else shape))


@method("view_as", "reshape_as")
def _view_as(imp, x, other):
    other = tensor(other)
    shape = imp.shape_of(other)
    return imp.op("Reshape", tensor(x), imp.ints(shape))


@method("type_as")
def _type_as(imp, x, other):
    x, other = tensor(x), tensor(other)
    return x if x.dtype == other.dtype else imp.op("Cast", x, to=other.dtype)


@function(torch.broadcast_to)
def _broadcast_to(imp, x, size):
    return _expand(imp, x, *size)


@function(torch.movedim, torch.moveaxis)
@method("movedim", "moveaxis")
def _movedim(imp, x, source, destination):
    x = tensor(x)
    r = rank(x)
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    src, dst = [norm_axis(s, r) for s in src], [norm_axis(d, r) for d in dst]
    rest = [a for a in range(r) if a not in src]
    perm = [None] * r
    for s, d in zip(src, dst):
        perm[d] = s
    it = iter(rest)
    perm = [p if p is not None else next(it) for p in perm]
    return imp.op("Transpose", x, perm=perm)


@function(torch.swapaxes, torch.swapdims)
@method("swapaxes", "swapdims")
def _swapaxes(imp, x, a, b):
    return _transpose(imp, x, a, b)


def _constant_like(fill):
    """zeros_like / ones_like / full_like: ConstantOfShape of the input's shape (a dynamic batch stays free)."""

    def conv(imp, x, *args, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False,
             memory_format=None):
        x = tensor(x)
        value = fill if fill is not None else args[0]
        if isinstance(value, Value):
            raise Untranslatable("tensor fill value")
        dt = str(dtype).replace("torch.", "") if dtype is not None else x.dtype
        shape = imp.op("Shape", x)
        return imp.op("ConstantOfShape", shape, value=np.array([value], dtype=dt))
    return conv


FUNCTIONS.update({torch.zeros_like: _constant_like(0), torch.ones_like: _constant_like(1),
                  torch.full_like: _constant_like(None)})


@method("new_zeros", "new_ones", "new_full", "new_tensor")
def _new_constant(imp, x, *args, **kwargs):
    """A constant made from sizes and values (recomputed: the example run's tensor may have been changed
    in place since)."""
    like = imp.example_of(imp.current.args[0])
    if not isinstance(like, torch.Tensor) or any(isinstance(a, Value) for a in list(args) + list(kwargs.values())):
        raise Untranslatable("no example value")
    return imp.const(tensor_to_numpy_(getattr(like, imp.current.target)(*[int(a) if isinstance(a, int) and not
                                                                          isinstance(a, bool) else a for a in args],
                                                                        **kwargs)))


def tensor_to_numpy_(t: torch.Tensor) -> np.ndarray:
    from aiacc.plugins.torch.importer import tensor_to_numpy

    return tensor_to_numpy(t)


@method("fill_", "zero_")
def _fill(imp, x, value=0):
    x = tensor(x)
    if isinstance(value, Value):
        raise Untranslatable("tensor fill value")
    return imp.op("ConstantOfShape", imp.op("Shape", x), value=np.array([value], dtype=x.dtype))


@function(operator.setitem)
def _setitem(imp, x, index, value):
    """`x[index] = value` out of place: Where(region mask, value padded to x's shape, x). Basic indexing
    (integers, step-1 slices, Ellipsis) only."""
    if not isinstance(x, Value):
        raise Untranslatable("item assignment on a non-tensor")
    shape = list(imp.shape_of(x))
    index = index if isinstance(index, tuple) else (index,)
    if any(i is None or isinstance(i, (Value, list, torch.Tensor)) for i in index) or index.count(Ellipsis) > 1:
        raise Untranslatable("advanced indexing")
    consumed = sum(1 for i in index if i is not Ellipsis)
    if Ellipsis in index:
        k = index.index(Ellipsis)
        index = index[:k] + (slice(None),) * (len(shape) - consumed) + index[k + 1:]
    index = index + (slice(None),) * (len(shape) - len(index))
    if len(index) != len(shape):
        raise Untranslatable("too many indices")
    mask_shape, region, pads_begin, pads_end, int_axes, selects = [], [], [], [], [], []
    for axis, (i, d) in enumerate(zip(index, shape)):
        if isinstance(i, slice):
            b, e, st = i.indices(d)
            if st != 1:
                raise Untranslatable("strided slice assignment")
            e = max(e, b)
        else:
            b = int(i) % d
            e = b + 1
            int_axes.append(axis)
        full = (b, e) == (0, d)
        mask_shape.append(1 if full else d)
        selects.append(slice(None) if full else slice(b, e))
        region.append(e - b)
        pads_begin.append(b)
        pads_end.append(d - e)
    mask = np.zeros(mask_shape, dtype=bool)
    mask[tuple(selects)] = True
    if isinstance(value, Value):
        if value.dtype != x.dtype:
            raise Untranslatable("value of another dtype")
        v = value
        if int_axes:  # the integer-indexed axes are absent from the value: put them back
            v_rank = rank(v)
            kept = len(shape) - len(int_axes)
            if v_rank > kept:
                raise Untranslatable("value of higher rank than the region")
            v = imp.op("Reshape", v, imp.ints([1] * (kept - v_rank) + list(imp.shape_of(v))))
            v = imp.op("Unsqueeze", v, imp.ints(int_axes))
        v = imp.op("Expand", v, imp.ints(region))
        if any(pads_begin) or any(pads_end):
            v = imp.op("Pad", v, imp.ints(pads_begin + pads_end))
    else:
        if isinstance(value, torch.Tensor):
            raise Untranslatable("tensor constant value")
        v = imp.scalar_like(value, x)
    return imp.op("Where", imp.const(mask), v, x)


@method("item", "tolist")
def _item(imp, x):
    raise Untranslatable("reads a tensor's value into Python (data-dependent)")


# ---------------------------------------------------------------------------------- padding modules
def _pad_module(mode):
    def conv(imp, m, x):
        value = getattr(m, "value", 0.0) if mode == "constant" else None
        return _f_pad(imp, x, list(m.padding), mode, value)
    return conv


for _mode, _types in (("constant", ("ZeroPad1d", "ZeroPad2d", "ZeroPad3d", "ConstantPad1d", "ConstantPad2d",
                                    "ConstantPad3d")),
                      ("reflect", ("ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d")),
                      ("replicate", ("ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d")),
                      ("circular", ("CircularPad1d", "CircularPad2d", "CircularPad3d"))):
    for _t in _types:
        if hasattr(nn, _t):
            MODULES[getattr(nn, _t)] = _pad_module(_mode)



# ---------------------------------------------------------------------------------- rearrangements
def pixel_shuffle(imp, x, r: int, inverse: bool = False):
    """PixelShuffle (depth to space, torch's channel order) and PixelUnshuffle as Reshape-Transpose-Reshape."""
    x = tensor(x)
    shape = imp.shape_of(x)
    if len(shape) != 4:
        raise Untranslatable("input of rank other than 4")
    n, c, h, w = shape
    if not inverse:
        if c % (r * r):
            raise Untranslatable(f"{c} channels do not divide by {r}^2")
        y = imp.op("Reshape", x, imp.ints([0, c // (r * r), r, r, h, w]))
        y = imp.op("Transpose", y, perm=[0, 1, 4, 2, 5, 3])
        return imp.op("Reshape", y, imp.ints([0, c // (r * r), h * r, w * r]))
    if h % r or w % r:
        raise Untranslatable(f"{h}x{w} does not divide by {r}")
    y = imp.op("Reshape", x, imp.ints([0, c, h // r, r, w // r, r]))
    y = imp.op("Transpose", y, perm=[0, 1, 3, 5, 2, 4])
    return imp.op("Reshape", y, imp.ints([0, c * r * r, h // r, w // r]))


FUNCTIONS[F.pixel_shuffle] = lambda imp, x, upscale_factor: pixel_shuffle(imp, x, int(upscale_factor))
FUNCTIONS[F.pixel_unshuffle] = lambda imp, x, downscale_factor: pixel_shuffle(imp, x, int(downscale_factor), True)
MODULES[nn.PixelShuffle] = lambda imp, m, x: pixel_shuffle(imp, x, m.upscale_factor)
MODULES[nn.PixelUnshuffle] = lambda imp, m, x: pixel_shuffle(imp, x, m.downscale_factor, True)


@module(nn.ChannelShuffle)
def _m_channel_shuffle(imp, m, x):
    x = tensor(x)
    shape = list(imp.shape_of(x))
    g = m.groups
    if len(shape) < 3 or shape[1] % g:
        raise Untranslatable("channels do not divide into the groups")
    y = imp.op("Reshape", x, imp.ints([0, g, shape[1] // g] + shape[2:]))
    y = imp.op("Transpose", y, perm=[0, 2, 1] + list(range(3, len(shape) + 1)))
    return imp.op("Reshape", y, imp.ints([0] + shape[1:]))


@function(torch.unflatten)
@method("unflatten")
def unflatten(imp, x, dim, sizes):
    x = tensor(x)
    shape = list(imp.shape_of(x))
    axis = norm_axis(dim, len(shape))
    sizes = [int(s) for s in sizes]
    if -1 in sizes:
        known = int(np.prod([s for s in sizes if s != -1]))
        sizes[sizes.index(-1)] = shape[axis] // known
    target = [0] * axis + sizes + shape[axis + 1:]  # leading axes copied (a dynamic batch stays free)
    return imp.op("Reshape", x, imp.ints(target))


MODULES[nn.Unflatten] = lambda imp, m, x: unflatten(imp, x, m.dim, m.unflattened_size)


@function(torch.index_select)
@method("index_select")
def _index_select(imp, x, dim, index):
    x, index = tensor(x), tensor(index, "index")
    return imp.op("Gather", x, index, axis=norm_axis(dim, rank(x)))


@function(torch.addmm)
def _addmm(imp, bias, m1, m2, *, beta=1, alpha=1):
    y = imp.op("MatMul", tensor(m1), tensor(m2))
    if alpha != 1:
        y = imp.op("Mul", y, imp.scalar_like(alpha, y))
    b = tensor(bias, "bias")
    if beta != 1:
        b = imp.op("Mul", b, imp.scalar_like(beta, b))
    return imp.op("Add", y, b)

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
