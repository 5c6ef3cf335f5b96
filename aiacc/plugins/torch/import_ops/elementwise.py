"""Converters of elementwise calls: arithmetic, activations, comparisons and logic, max / min."""
from __future__ import annotations

import operator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from aiacc.core.ir import Value
from aiacc.core.translate import Untranslatable
from aiacc.plugins.torch.import_ops.common import norm_axis, rank, tensor
from aiacc.plugins.torch.import_ops.shape import split
from aiacc.plugins.torch.importer import FUNCTIONS, METHODS, MODULES, torch_dtype_name


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
        a = _promote_to_scalar(imp, a, b)
        return a, imp.scalar_like(b, a)
    b = _promote_to_scalar(imp, b, a)
    return imp.scalar_like(a, b), b


def _promote_to_scalar(imp, t: Value, scalar) -> Value:
    """torch's promotion of a tensor with a Python number of a higher category: an integer or bool tensor
    with a float becomes the default float dtype (int64 positions * 1.0 in timm's MViTv2), a bool tensor
    with an int becomes int64."""
    if t.dtype is None:
        return t
    kind = np.dtype(t.dtype).kind
    if isinstance(scalar, float) and kind in "iub":
        return imp.op("Cast", t, to=str(torch.get_default_dtype()).replace("torch.", ""))
    if isinstance(scalar, int) and not isinstance(scalar, bool) and kind == "b":
        return imp.op("Cast", t, to="int64")
    return t


def divide(imp, a, b, rounding_mode):
    """torch.div(a, b, rounding_mode='trunc' | 'floor') for tensors of one dtype."""
    a, b = _operands(imp, a, b)
    integer = np.dtype(a.dtype).kind in "iu"
    if rounding_mode == "trunc":
        if integer:
            return imp.op("Div", a, b)  # integer Div truncates (ONNX)
        q = imp.op("Div", a, b)
        return imp.op("Mul", imp.op("Sign", q), imp.op("Floor", imp.op("Abs", q)))
    if rounding_mode == "floor":
        if integer:  # a - a mod b (the floor remainder) is a multiple of b: its quotient is exact
            return imp.op("Div", imp.op("Sub", a, imp.op("Mod", a, b, fmod=0)), b)
        return imp.op("Floor", imp.op("Div", a, b))
    raise Untranslatable(f"rounding_mode={rounding_mode!r}")



def _binary(op_name: str):
    def conv(imp, a, b, *, alpha=1, out=None, rounding_mode=None):
        if out is not None:
            raise Untranslatable("out= argument")
        if rounding_mode is not None:
            if op_name != "Div":
                raise Untranslatable(f"rounding_mode= for {op_name}")
            return divide(imp, a, b, rounding_mode)
        if op_name in ("Add", "Mul") and (isinstance(a, (tuple, list)) or isinstance(b, (tuple, list))):
            # Python sequences holding tensors (`outputs = (attn,) + outputs`, `(x,) * 2`): the same Python op
            return a + b if op_name == "Add" else a * b
        a, b = _operands(imp, a, b)
        if alpha != 1:
            b = imp.op("Mul", b, imp.scalar_like(alpha, b))
        if op_name == "Div" and np.dtype(a.dtype).kind in "iub":
            # true division of integers is in torch's default float dtype, both operands cast to it first
            # (Ministral 3's `positions / max_positions`)
            to = torch_dtype_name(torch.get_default_dtype())
            a, b = imp.op("Cast", a, to=to), imp.op("Cast", b, to=to)
        return imp.op(op_name, a, b)
    return conv


for _op, _targets, _methods in (
        ("Add", (operator.add, operator.iadd, torch.add), ("add", "add_", "__add__", "__iadd__")),
        # torch's aliases (ConvBERT calls torch.multiply)
        ("Sub", (operator.sub, operator.isub, torch.sub, torch.subtract), ("sub", "sub_", "__sub__", "subtract")),
        ("Mul", (operator.mul, operator.imul, torch.mul, torch.multiply), ("mul", "mul_", "__mul__", "multiply")),
        ("Div", (operator.truediv, operator.itruediv, torch.div, torch.divide, torch.true_divide),
         ("div", "div_", "__truediv__", "divide", "true_divide"))):
    FUNCTIONS.update({t: _binary(_op) for t in _targets})
    METHODS.update({m: _binary(_op) for m in _methods})


def remainder(imp, a, b, *, out=None):
    """torch.remainder / `a % b` (the remainder with the divisor's sign, Python's rule). Integers: the
    IR's Mod; floats: ONNX's float Mod is fmod, so fmod's result moved by b where its sign differs from
    b's (exactly torch's formula)."""
    if out is not None:
        raise Untranslatable("out= argument")
    a, b = _operands(imp, a, b)
    if np.dtype(a.dtype).kind in "iu":
        return imp.op("Mod", a, b, fmod=0)
    if np.dtype(a.dtype).kind != "f":
        raise Untranslatable(f"remainder of {a.dtype} tensors")
    m = imp.op("Mod", a, b, fmod=1)
    zero = imp.scalar_like(0, m)
    differs = imp.op("Xor", imp.op("Less", m, zero), imp.op("Less", b, zero))
    fix = imp.op("And", differs, imp.op("Not", imp.op("Equal", m, zero)))
    return imp.op("Where", fix, imp.op("Add", m, b), m)


def fmod(imp, a, b, *, out=None):
    """torch.fmod: the remainder with the dividend's sign (ONNX Mod, fmod=1)."""
    if out is not None:
        raise Untranslatable("out= argument")
    a, b = _operands(imp, a, b)
    return imp.op("Mod", a, b, fmod=1)


FUNCTIONS.update({operator.mod: remainder, operator.imod: remainder, torch.remainder: remainder,
                  torch.fmod: fmod,
                  operator.floordiv: lambda imp, a, b: divide(imp, a, b, "floor"),
                  operator.ifloordiv: lambda imp, a, b: divide(imp, a, b, "floor"),
                  torch.floor_divide: lambda imp, a, b, *, out=None: divide(imp, a, b, "floor")})
METHODS.update({"remainder": remainder, "remainder_": remainder, "__mod__": remainder, "fmod": fmod,
                "fmod_": fmod, "floor_divide": lambda imp, a, b: divide(imp, a, b, "floor"),
                "__floordiv__": lambda imp, a, b: divide(imp, a, b, "floor")})


@FUNCTIONS.register(torch.addcmul)
@METHODS.register("addcmul")
def _addcmul(imp, x, t1, t2, *, value=1, out=None):
    """torch.addcmul: x + value * t1 * t2."""
    return _addc(imp, "Mul", x, t1, t2, value, out)


@FUNCTIONS.register(torch.addcdiv)
@METHODS.register("addcdiv")
def _addcdiv(imp, x, t1, t2, *, value=1, out=None):
    """torch.addcdiv: x + value * t1 / t2 (float tensors)."""
    return _addc(imp, "Div", x, t1, t2, value, out)


def _addc(imp, op, x, t1, t2, value, out):
    if out is not None:
        raise Untranslatable("out= argument")
    t1, t2 = tensor(t1, "tensor1"), tensor(t2, "tensor2")
    if op == "Div" and np.dtype(t1.dtype).kind in "iub":
        raise Untranslatable("addcdiv of integer tensors")
    y = imp.op(op, *_operands(imp, t1, t2))
    if value != 1:
        y = imp.op("Mul", *_operands(imp, y, value))
    return imp.op("Add", *_operands(imp, x, y))


@FUNCTIONS.register(torch.rsub)
def _rsub(imp, a, b, *, alpha=1):
    return _binary("Sub")(imp, b, a, alpha=alpha)


@FUNCTIONS.register(operator.neg, torch.neg)
@METHODS.register("neg")
def _neg(imp, x):
    return imp.op("Neg", tensor(x))


@FUNCTIONS.register(operator.pow, torch.pow)
@METHODS.register("pow")
def _pow(imp, a, b):
    a, b = _operands(imp, a, b)
    return imp.op("Pow", a, b)


def unary(op_name: str, **attrs):
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
    FUNCTIONS.update({t: unary(_op) for t in _fns})
    METHODS.update({m: unary(_op) for m in _methods})
    MODULES.update({m: (lambda op_name: lambda imp, mod, x: imp.op(op_name, tensor(x)))(_op) for m in _mods})


@FUNCTIONS.register(torch.rsqrt)
@METHODS.register("rsqrt")
def _rsqrt(imp, x):
    return imp.op("Reciprocal", imp.op("Sqrt", tensor(x)))


def _clip(imp, x, lo, hi):
    x = tensor(x)
    return imp.op("Clip", x, None if lo is None else imp.scalar_like(lo, x),
                  None if hi is None else imp.scalar_like(hi, x))


@FUNCTIONS.register(F.relu6)
def relu6(imp, x, inplace=False):
    return _clip(imp, x, 0.0, 6.0)


@FUNCTIONS.register(F.hardtanh)
def hardtanh(imp, x, min_val=-1.0, max_val=1.0, inplace=False):
    return _clip(imp, x, min_val, max_val)


@FUNCTIONS.register(torch.clamp, torch.clip)
@METHODS.register("clamp", "clip", "clamp_")
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


@MODULES.register(nn.ReLU6)
def _m_relu6(imp, m, x):
    return _clip(imp, x, 0.0, 6.0)


@MODULES.register(nn.Hardtanh)
def _m_hardtanh(imp, m, x):
    return _clip(imp, x, m.min_val, m.max_val)


@FUNCTIONS.register(F.leaky_relu)
def _leaky(imp, x, negative_slope=0.01, inplace=False):
    return imp.op("LeakyRelu", tensor(x), alpha=float(negative_slope))


@MODULES.register(nn.LeakyReLU)
def _m_leaky(imp, m, x):
    return imp.op("LeakyRelu", tensor(x), alpha=float(m.negative_slope))


@FUNCTIONS.register(F.elu)
def _elu(imp, x, alpha=1.0, inplace=False):
    return imp.op("Elu", tensor(x), alpha=float(alpha))


@MODULES.register(nn.ELU)
def _m_elu(imp, m, x):
    return imp.op("Elu", tensor(x), alpha=float(m.alpha))


@FUNCTIONS.register(F.hardsigmoid)
def _hardsigmoid(imp, x, inplace=False):
    return imp.op("HardSigmoid", tensor(x), alpha=1.0 / 6, beta=0.5)


@MODULES.register(nn.Hardsigmoid)
def _m_hardsigmoid(imp, m, x):
    return _hardsigmoid(imp, x)


@FUNCTIONS.register(F.silu)
def silu(imp, x, inplace=False):
    x = tensor(x)
    return imp.op("Mul", x, imp.op("Sigmoid", x))


@MODULES.register(nn.SiLU)
def _m_silu(imp, m, x):
    return silu(imp, x)


@FUNCTIONS.register(F.gelu)
def gelu(imp, x, approximate="none"):
    return imp.op("Gelu", tensor(x), approximate=approximate)


@MODULES.register(nn.GELU)
def _m_gelu(imp, m, x):
    return gelu(imp, x, m.approximate)


def softmax_like(op_name):
    def conv(imp, x, dim=None, _stacklevel=3, dtype=None):
        x = tensor(x)
        if dim is None:
            raise Untranslatable("implicit dim")
        if dtype is not None and str(dtype).replace("torch.", "") != x.dtype:
            x = imp.op("Cast", x, to=str(dtype).replace("torch.", ""))  # softmax computed in dtype
        return imp.op(op_name, x, axis=norm_axis(dim, rank(x)))
    return conv


FUNCTIONS.update({F.softmax: softmax_like("Softmax"), torch.softmax: softmax_like("Softmax"),
                  F.log_softmax: softmax_like("LogSoftmax"), torch.log_softmax: softmax_like("LogSoftmax")})
METHODS.update({"softmax": softmax_like("Softmax"), "log_softmax": softmax_like("LogSoftmax")})
MODULES.update({nn.Softmax: lambda imp, m, x: softmax_like("Softmax")(imp, x, m.dim),
                nn.LogSoftmax: lambda imp, m, x: softmax_like("LogSoftmax")(imp, x, m.dim)})


@FUNCTIONS.register(torch.where)
def _where(imp, cond, a=None, b=None):
    if a is None:
        raise Untranslatable("one-argument where")
    cond = tensor(cond)
    if not isinstance(a, Value):
        a = imp.scalar_like(a, tensor(b))
    if not isinstance(b, Value):
        b = imp.scalar_like(b, a)
    return imp.op("Where", cond, a, b)


@METHODS.register("where")
def _tensor_where(imp, x, condition, other):
    """x.where(condition, other) is torch.where(condition, x, other) (Longformer's band masks)."""
    return _where(imp, condition, x, other)


@METHODS.register("masked_fill", "masked_fill_")
def _masked_fill(imp, x, mask, value):
    """x.masked_fill(mask, value): Where(mask, value, x). A tensor value (torch takes a 0-d one only: a buffer,
    a computed scalar, aten.masked_fill.Tensor) is cast to x's dtype, as torch writes it into x."""
    x = tensor(x)
    if isinstance(value, Value):
        if value.shape is None or len(value.shape) != 0:
            raise Untranslatable(f"a fill value of shape {value.shape} (torch takes a 0-d one)")
        if value.dtype != x.dtype:
            value = imp.op("Cast", value, to=x.dtype)
        return imp.op("Where", tensor(mask), value, x)
    return imp.op("Where", tensor(mask), imp.scalar_like(value, x), x)


FUNCTIONS[torch.masked_fill] = _masked_fill  # torch.masked_fill(x, mask, value), Longformer's form


# ---------------------------------------------------------------------------------- more activations
def prelu(imp, x, weight):
    x, w = tensor(x), tensor(weight, "weight")
    r = rank(x)
    count = int(np.prod(imp.shape_of(w)))
    if count > 1 and r >= 2:
        w = imp.op("Reshape", w, imp.ints([count] + [1] * (r - 2)))
    return imp.op("PRelu", x, w)


for _target in {F.prelu, torch.prelu}:  # one object in current torch versions
    FUNCTIONS[_target] = prelu
MODULES[nn.PReLU] = lambda imp, m, x: prelu(imp, x, imp.param(m, "weight"))

_SELU = dict(alpha=1.6732632423543772, gamma=1.0507009873554805)


@FUNCTIONS.register(F.selu, torch.selu)
def _selu(imp, x, inplace=False):
    return imp.op("Selu", tensor(x), **_SELU)


MODULES[nn.SELU] = lambda imp, m, x: _selu(imp, x)


@FUNCTIONS.register(F.celu, torch.celu)
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


@FUNCTIONS.register(F.logsigmoid)
def _logsigmoid(imp, x):
    x = tensor(x)
    return imp.op("Neg", imp.op("Softplus", imp.op("Neg", x)))


MODULES[nn.LogSigmoid] = lambda imp, m, x: _logsigmoid(imp, x)


@FUNCTIONS.register(F.tanhshrink)
def _tanhshrink(imp, x):
    x = tensor(x)
    return imp.op("Sub", x, imp.op("Tanh", x))


MODULES[nn.Tanhshrink] = lambda imp, m, x: _tanhshrink(imp, x)


@FUNCTIONS.register(F.threshold)
def _threshold(imp, x, threshold, value, inplace=False):
    x = tensor(x)
    return imp.op("Where", imp.op("Greater", x, imp.scalar_like(threshold, x)), x, imp.scalar_like(value, x))


MODULES[nn.Threshold] = lambda imp, m, x: _threshold(imp, x, m.threshold, m.value)


@FUNCTIONS.register(F.glu)
def _glu(imp, x, dim=-1):
    x = tensor(x)
    axis = norm_axis(dim, rank(x))
    n = imp.shape_of(x)[axis]
    if n % 2:
        raise Untranslatable("odd size along the gated axis")
    a, b = split(imp, x, [n // 2, n // 2], axis)
    return imp.op("Mul", a, imp.op("Sigmoid", b))


MODULES[nn.GLU] = lambda imp, m, x: _glu(imp, x, m.dim)
MODULES[nn.Softmax2d] = lambda imp, m, x: softmax_like("Softmax")(imp, x, -3)
MODULES[nn.Softmin] = lambda imp, m, x: softmax_like("Softmax")(imp, imp.op("Neg", tensor(x)), m.dim)


@FUNCTIONS.register(F.softmin)
def _softmin(imp, x, dim=None, _stacklevel=3, dtype=None):
    return softmax_like("Softmax")(imp, imp.op("Neg", tensor(x)), dim, dtype=dtype)


@FUNCTIONS.register(torch.square)
@METHODS.register("square")
def _square(imp, x):
    x = tensor(x)
    return imp.op("Mul", x, x)


for _op, _fns, _methods in (("Sign", (torch.sign,), ("sign",)), ("Round", (torch.round,), ()),
                            ("Exp", (torch.exp_,), ("exp_",)), ("Sqrt", (torch.sqrt_,), ("sqrt_",)),
                            ("Abs", (torch.abs_,), ("abs_",)), ("Neg", (), ("neg_",)),
                            ("Reciprocal", (), ("reciprocal_",))):
    FUNCTIONS.update({t: unary(_op) for t in _fns})
    METHODS.update({m: unary(_op) for m in _methods})


@METHODS.register("round")
def _m_round(imp, x, decimals=0):
    if decimals:
        raise Untranslatable("decimals")
    return imp.op("Round", tensor(x))


@FUNCTIONS.register(torch.log1p)
@METHODS.register("log1p")
def _log1p(imp, x):
    x = tensor(x)
    return imp.op("Log", imp.op("Add", x, imp.scalar_like(1, x)))


@FUNCTIONS.register(torch.expm1)
@METHODS.register("expm1")
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


@FUNCTIONS.register(operator.invert, torch.bitwise_not, torch.logical_not)
@METHODS.register("__invert__", "bitwise_not", "logical_not")
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


@FUNCTIONS.register(torch.clamp_min)
@METHODS.register("clamp_min", "clamp_min_")
def _clamp_min(imp, x, min):
    return _clamp(imp, x, min, None)


@FUNCTIONS.register(torch.clamp_max)
@METHODS.register("clamp_max", "clamp_max_")
def _clamp_max(imp, x, max):
    return _clamp(imp, x, None, max)
