"""Lowerings of elementwise ops: activations, arithmetic (with torch's type rules), Where, Cast, softmax, dropout.

A lowering, registered in exporter.LOWERINGS under the op's qualified name ("Conv", "aiacc::FusedConv"),
gets the Builder and an LNode (see exporter.py) and returns the fx value of each output. Constant inputs
that torch takes as Python values (shapes, axes, clip bounds, dropout ratios) are read at export time;
everything else stays a tensor so gradients flow.
"""
from __future__ import annotations

import operator

import numpy as np
import torch
import torch.nn.functional as F

from aiacc.errors import UnsupportedError
from aiacc.plugins.torch.dropout import dropout
from aiacc.plugins.torch.exporter import LOWERINGS


_UNARY = {
    "Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Exp": torch.exp, "Log": torch.log,
    "Sqrt": torch.sqrt, "Abs": torch.abs, "Neg": torch.neg, "Erf": torch.erf, "Reciprocal": torch.reciprocal,
    "Floor": torch.floor, "Ceil": torch.ceil, "Round": torch.round, "Sign": torch.sign, "Sin": torch.sin,
    "Cos": torch.cos, "Not": torch.logical_not, "HardSwish": F.hardswish, "Softsign": F.softsign, "Mish": F.mish,
    "Softplus": F.softplus, "Selu": F.selu, "Identity": None,
}


def _unary(op):
    fn = _UNARY[op]

    def lower(b, n: LNode):
        x = n.arg(0)
        if fn is None:
            return x
        if op == "Selu" and (n.attr("alpha") != 1.6732632423543772 or n.attr("gamma") != 1.0507009873554805):
            return n.attr("gamma") * b.call(torch.where, b.call(operator.gt, x, 0), x,
                                            n.attr("alpha") * b.call(torch.expm1, x))
        return b.call(fn, x)
    return lower


for _op in _UNARY:
    LOWERINGS.add(_op, _unary(_op))


@LOWERINGS.register("LeakyRelu")
def _leaky(b, n):
    return b.call(F.leaky_relu, n.arg(0), n.attr("alpha", 0.01))


@LOWERINGS.register("Elu")
def _elu(b, n):
    return b.call(F.elu, n.arg(0), n.attr("alpha", 1.0))


@LOWERINGS.register("Gelu")
def _gelu(b, n):
    return b.call(F.gelu, n.arg(0), approximate=n.attr("approximate", "none"))


@LOWERINGS.register("HardSigmoid")
def _hardsigmoid(b, n):
    alpha, beta = n.attr("alpha", 0.2), n.attr("beta", 0.5)
    if abs(alpha - 1 / 6) < 1e-7 and beta == 0.5:
        return b.call(F.hardsigmoid, n.arg(0))
    return b.call(torch.clamp, b.call(operator.add, b.call(operator.mul, n.arg(0), alpha), beta), 0.0, 1.0)


@LOWERINGS.register("Clip")
def _clip(b, n):
    lo = n.scalar(1) if n.n_inputs > 1 and n.values[1] is not None else None
    hi = n.scalar(2) if n.n_inputs > 2 and n.values[2] is not None else None
    if lo == 0 and hi == 6:
        return b.call(F.relu6, n.arg(0))
    if lo == 0 and hi is None:
        return b.call(torch.relu, n.arg(0))
    return b.call(torch.clamp, n.arg(0), lo, hi)


@LOWERINGS.register("PRelu")
def _prelu(b, n):
    x = n.arg(0)
    return b.call(torch.where, b.call(operator.lt, x, 0), b.call(operator.mul, x, n.arg(1)), x)


_BINARY = {"Add": operator.add, "Sub": operator.sub, "Mul": operator.mul, "Pow": torch.pow,
           "And": torch.logical_and, "Or": torch.logical_or, "Xor": torch.logical_xor,
           "Equal": torch.eq, "Less": torch.lt, "Greater": torch.gt, "LessOrEqual": torch.le,
           "GreaterOrEqual": torch.ge}


def _binary(op):
    fn = _BINARY[op]

    def lower(b, n: LNode):
        a, c = n.scalar(0), n.scalar(1)
        if not isinstance(a, torch.fx.Node) and not isinstance(c, torch.fx.Node):
            a = n.arg(0)  # two constants: keep tensors so the dtype is right
        if not isinstance(a, torch.fx.Node) and op in ("Pow", "And", "Or", "Xor") or \
                not isinstance(c, torch.fx.Node) and op in ("And", "Or", "Xor"):
            a, c = n.arg(0), n.arg(1)
        return b.call(fn, a, c)
    return lower


for _op in _BINARY:
    LOWERINGS.add(_op, _binary(_op))


@LOWERINGS.register("Div")
def _div(b, n):
    dtype = n.outputs[0].dtype
    a, c = n.scalar(0), n.scalar(1)
    if not isinstance(a, torch.fx.Node):
        a = n.arg(0)
    if dtype is not None and np.dtype(dtype).kind in "iu":
        return b.call(torch.div, a, c, rounding_mode="trunc")
    return b.call(operator.truediv, a, c)


@LOWERINGS.register("Mod")
def _mod(b, n):
    return b.call(torch.fmod if n.attr("fmod") else torch.remainder, n.arg(0), n.arg(1))


def _variadic(fn):
    def lower(b, n):
        out = n.arg(0)
        for i in range(1, n.n_inputs):
            out = b.call(fn, out, n.arg(i))
        return out
    return lower


LOWERINGS.add("Max", _variadic(torch.maximum))
LOWERINGS.add("Min", _variadic(torch.minimum))
LOWERINGS.add("Sum", _variadic(operator.add))


@LOWERINGS.register("Mean")
def _mean(b, n):
    return b.call(operator.truediv, _variadic(operator.add)(b, n), float(n.n_inputs))


@LOWERINGS.register("Where")
def _where(b, n):
    return b.call(torch.where, n.arg(0), n.scalar(1), n.scalar(2)) if isinstance(n.scalar(1), torch.fx.Node) \
        or isinstance(n.scalar(2), torch.fx.Node) else b.call(torch.where, n.arg(0), n.arg(1), n.arg(2))


@LOWERINGS.register("Cast")
def _cast(b, n):
    return b.method("to", n.arg(0), getattr(torch, np.dtype(n.attr("to")).name))


@LOWERINGS.register("Softmax")
def _softmax(b, n):
    return b.call(torch.softmax, n.arg(0), n.attr("axis", -1))


@LOWERINGS.register("LogSoftmax")
def _log_softmax(b, n):
    return b.call(torch.log_softmax, n.arg(0), n.attr("axis", -1))


@LOWERINGS.register("Dropout")
def _dropout(b, n):
    ratio = n.scalar(1) if n.n_inputs > 1 and n.values[1] is not None else 0.5
    training = n.const(2) if n.n_inputs > 2 and n.values[2] is not None else np.bool_(False)
    if training is None:
        raise UnsupportedError(f"node {n.name}: Dropout with a non-constant training_mode")
    if len(n.outputs) > 1 and n.outputs[1].uses:
        raise UnsupportedError(f"node {n.name}: Dropout's mask output has no torch counterpart")
    if not bool(training) or ratio == 0:
        return [n.arg(0), None]
    # F.dropout's masks and RNG use, drawn faster on CPU (aiacc.plugins.torch.dropout)
    return [b.call(dropout, n.arg(0), float(ratio), True), None]
