"""Elementwise ops (ONNX semantics): activations, unary math, broadcasting binary arithmetic, comparisons."""
from __future__ import annotations

import math

import numpy as np

from aiacc.core.ir import TensorType
from aiacc.core.ops.registry import InferContext, op
from aiacc.core.ops.shape_utils import broadcast_shapes


def infer_unary(ctx: InferContext) -> list[TensorType | None]:
    return [ctx.type(0)]


def infer_broadcast(ctx: InferContext) -> list[TensorType | None]:
    """Output of numpy-broadcasting inputs; dtype of the first input."""
    types = [ctx.type(i) for i in range(ctx.num_inputs) if ctx.has_input(i)]
    if any(t is None for t in types):
        return [None]
    try:
        shape = broadcast_shapes(*(t.shape for t in types))
    except ValueError as e:
        raise ctx.fail(str(e)) from None
    return [TensorType(types[0].dtype, shape)]


def infer_compare(ctx: InferContext) -> list[TensorType | None]:
    t = infer_broadcast(ctx)[0]
    return [None if t is None else TensorType("bool", t.shape)]


def _unary(name, fn, attrs=None):
    op(name, attrs=attrs, infer=infer_unary, elementwise=True)(fn)


def _like(x, value):
    return np.asarray(value, dtype=x.dtype)


_unary("Relu", lambda x: np.maximum(x, _like(x, 0)))
_unary("LeakyRelu", lambda x, *, alpha: np.where(x >= 0, x, x * _like(x, alpha)), {"alpha": ("float", 0.01)})
_unary("Elu", lambda x, *, alpha: np.where(x > 0, x, _like(x, alpha) * np.expm1(x)).astype(x.dtype),
       {"alpha": ("float", 1.0)})
_unary("Selu", lambda x, *, alpha, gamma: (_like(x, gamma) * np.where(x > 0, x, _like(x, alpha) * np.expm1(x)))
       .astype(x.dtype), {"alpha": ("float", 1.6732632423543772), "gamma": ("float", 1.0507009873554805)})
_unary("Sigmoid", lambda x: (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(x.dtype))
_unary("Tanh", np.tanh)
_unary("HardSigmoid", lambda x, *, alpha, beta: np.clip(x * _like(x, alpha) + _like(x, beta), 0, 1).astype(x.dtype),
       {"alpha": ("float", 0.2), "beta": ("float", 0.5)})
_unary("HardSwish", lambda x: (x * np.clip(x / _like(x, 6) + _like(x, 0.5), 0, 1)).astype(x.dtype))
_unary("Softplus", lambda x: np.logaddexp(_like(x, 0), x).astype(x.dtype))
_unary("Softsign", lambda x: (x / (1 + np.abs(x))).astype(x.dtype))
_unary("Mish", lambda x: (x * np.tanh(np.logaddexp(0, x.astype(np.float64)))).astype(x.dtype))
_unary("Erf", lambda x: np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype) if x.size else x)
_unary("Sqrt", np.sqrt)
_unary("Exp", np.exp)
_unary("Log", np.log)
_unary("Neg", np.negative)
_unary("Abs", np.abs)
_unary("Reciprocal", np.reciprocal)
_unary("Floor", np.floor)
_unary("Ceil", np.ceil)
_unary("Round", np.round)
_unary("Sign", np.sign)
_unary("Sin", np.sin)
_unary("Cos", np.cos)
_unary("Not", np.logical_not)


@op("Gelu", attrs={"approximate": ("string", "none")}, infer=infer_unary, elementwise=True)
def gelu(x, *, approximate):
    """GELU, exact (erf) or tanh approximation (ONNX opset 20)."""
    xd = x.astype(np.float64)
    if approximate == "tanh":
        y = 0.5 * xd * (1 + np.tanh(math.sqrt(2 / math.pi) * (xd + 0.044715 * xd ** 3)))
    else:
        y = 0.5 * xd * (1 + np.vectorize(math.erf, otypes=[np.float64])(xd / math.sqrt(2))) if x.size else xd
    return y.astype(x.dtype)


@op("PRelu", inputs=2, infer=infer_broadcast, elementwise=True)
def prelu(x, slope):
    """PRelu: slope broadcasts unidirectionally against x."""
    return np.where(x < 0, x * slope, x).astype(x.dtype)


@op("Clip", inputs=(1, 3), infer=infer_unary, elementwise=True)
def clip(x, lo=None, hi=None):
    """Clip with optional min and max inputs (opset 11+)."""
    y = x
    if lo is not None:
        y = np.maximum(y, lo.astype(x.dtype))
    if hi is not None:
        y = np.minimum(y, hi.astype(x.dtype))
    return y


def _binary(name, fn):
    op(name, inputs=2, infer=infer_broadcast, elementwise=True)(fn)


def _int_div(a, b):
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(a / b).astype(a.dtype)  # ONNX integer Div truncates toward zero
    return (a / b).astype(a.dtype)


_binary("Add", lambda a, b: (a + b).astype(a.dtype))
_binary("Sub", lambda a, b: (a - b).astype(a.dtype))
_binary("Mul", lambda a, b: (a * b).astype(a.dtype))
_binary("Div", _int_div)
_binary("Pow", lambda a, b: np.power(a, b.astype(a.dtype) if np.issubdtype(a.dtype, np.floating) else b)
        .astype(a.dtype))
_binary("And", np.logical_and)
_binary("Or", np.logical_or)
_binary("Xor", np.logical_xor)


@op("Mod", attrs={"fmod": ("int", 0)}, inputs=2, infer=infer_broadcast, elementwise=True)
def mod(a, b, *, fmod):
    return (np.fmod(a, b) if fmod else np.mod(a, b)).astype(a.dtype)


def _variadic(name, fn):
    def kernel(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out.astype(xs[0].dtype)

    op(name, inputs=(1, -1), infer=infer_broadcast, elementwise=True)(kernel)


_variadic("Max", np.maximum)
_variadic("Min", np.minimum)
_variadic("Sum", np.add)


@op("Mean", inputs=(1, -1), infer=infer_broadcast, elementwise=True)
def mean(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return (out / len(xs)).astype(xs[0].dtype)


def _compare(name, fn):
    op(name, inputs=2, infer=infer_compare, elementwise=True)(fn)


_compare("Equal", np.equal)
_compare("Less", np.less)
_compare("Greater", np.greater)
_compare("LessOrEqual", np.less_equal)
_compare("GreaterOrEqual", np.greater_equal)


def infer_where(ctx: InferContext) -> list[TensorType | None]:
    types = [ctx.type(i) for i in range(3)]
    if any(t is None for t in types):
        return [None]
    try:
        shape = broadcast_shapes(*(t.shape for t in types))
    except ValueError as e:
        raise ctx.fail(str(e)) from None
    return [TensorType(types[1].dtype, shape)]


@op("Where", inputs=3, infer=infer_where, elementwise=True)
def where(cond, a, b):
    return np.where(cond, a, b).astype(a.dtype)
