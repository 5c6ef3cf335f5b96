"""GELU recognized from its decomposed erf and tanh forms."""
from __future__ import annotations

import math

from aiacc.core.passes.manager import register_pass
from aiacc.core.passes.rewrite import Op, RewritePass, Rule, Scalar, Var

X = Var("x")


def _outer_forms(one_plus):
    """The three ways exporters associate 0.5 * x * (1 + f)."""
    return [
        Op("Mul", Op("Mul", X, Scalar(0.5)), one_plus, name="y"),
        Op("Mul", Op("Mul", X, one_plus), Scalar(0.5), name="y"),
        Op("Mul", X, Op("Mul", one_plus, Scalar(0.5)), name="y"),
    ]


# erf form: 0.5 * x * (1 + erf(x / sqrt(2)))
_ERF_ARGS = [Op("Div", X, Scalar(math.sqrt(2.0))), Op("Mul", X, Scalar(1 / math.sqrt(2.0)))]
# erfc form (TF's gelu: 0.5 * x * erfc(-x / sqrt 2), Erfc imported as 1 - erf): 1 - erf(-x / sqrt 2)
_NEG_ERF_ARGS = [Op("Mul", Op("Neg", X), Scalar(1 / math.sqrt(2.0))), Op("Div", Op("Neg", X), Scalar(math.sqrt(2.0))),
                 Op("Neg", Op("Mul", X, Scalar(1 / math.sqrt(2.0)))), Op("Neg", Op("Div", X, Scalar(math.sqrt(2.0)))),
                 Op("Mul", X, Scalar(-1 / math.sqrt(2.0))), Op("Div", X, Scalar(-math.sqrt(2.0)))]
_ONE_PLUS_ERF = ([Op("Add", Op("Erf", arg), Scalar(1.0)) for arg in _ERF_ARGS]
                 + [Op("Sub", Scalar(1.0), Op("Erf", arg)) for arg in _NEG_ERF_ARGS])
ERF_PATTERNS = [p for one_plus in _ONE_PLUS_ERF for p in _outer_forms(one_plus)]

# tanh form: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
_CUBES = [Op("Pow", X, Scalar(3.0)), Op("Mul", Op("Mul", X, X), X), Op("Mul", X, Op("Mul", X, X))]
_C = math.sqrt(2.0 / math.pi)


def _tanh_arg(cube):
    return Op("Mul", Op("Add", X, Op("Mul", cube, Scalar(0.044715))), Scalar(_C))


TANH_PATTERNS = [p for cube in _CUBES for p in _outer_forms(Op("Add", Op("Tanh", _tanh_arg(cube)), Scalar(1.0)))]


def _check(m):
    if m["x"].dtype is None or m["x"].dtype not in ("float16", "float32", "float64"):
        return f"%{m['x'].name} is not a floating-point tensor"


gelu_erf = Rule("gelu_erf", ERF_PATTERNS, lambda m, b: b.op("Gelu", m["x"], name=m.root.name), _check,
                doc="0.5 * x * (1 + erf(x / sqrt 2)) and 0.5 * x * (1 - erf(-x / sqrt 2)) are Gelu(x).")
gelu_tanh = Rule("gelu_tanh", TANH_PATTERNS,
                 lambda m, b: b.op("Gelu", m["x"], approximate="tanh", name=m.root.name), _check,
                 doc="0.5 * x * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) is Gelu(x, approximate=tanh).")

RULES = [gelu_erf, gelu_tanh]

register_pass(RewritePass("gelu_recognition", RULES, level=2, doc="""
Recognize GELU written out of elementwise ops (the erf form, TF's erfc form 0.5 x (1 - erf(-x / sqrt 2)),
and the tanh approximation, in the associations exporters produce, constants matched within 0.1%) and
replace it by one Gelu op.

Assumes: the constants are the GELU constants (0.5, 1, sqrt 2 or 1/sqrt 2; sqrt(2/pi), 0.044715, 3).
Guarantees: the same function; Gelu's kernel computes in float64, so results agree to float rounding.
""".strip()))
