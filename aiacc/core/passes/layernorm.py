"""LayerNormalization recognized from ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add."""
from __future__ import annotations

import numpy as np

from aiacc.core.passes.manager import register_pass
from aiacc.core.passes.rewrite import Const, Op, RewritePass, Rule, Scalar, Var

X = Var("x")
_D = Op("Sub", X, Op("ReduceMean", X, Const("axes1"), name="mean"), name="d")
_D2 = Var("d")
_VAR = Op("ReduceMean", Op(("Pow",), _D2, Scalar(2.0), name="sq") , Const("axes2"), name="var")
_VAR_MUL = Op("ReduceMean", Op("Mul", _D2, _D2, name="sq"), Const("axes2"), name="var")
_DENOMS = [Op("Sqrt", Op("Add", v, Scalar(name="eps"), name="veps"), name="std") for v in (_VAR, _VAR_MUL)]
_NORMS = [n for den in _DENOMS for n in (Op("Div", _D, den, name="norm"),
                                          Op("Mul", _D, Op("Reciprocal", den, name="rstd"), name="norm"))]
PATTERNS = ([Op("Add", Op("Mul", n, Var("scale"), name="scaled"), Var("bias"), name="y") for n in _NORMS]
            + [Op("Mul", n, Var("scale"), name="y") for n in _NORMS])


# TF's form (tf.nn.batch_normalization / Keras LayerNormalization as the TF importer sees it):
#   s = rsqrt(var + eps) * gamma;  y = x * s + (beta - mean * s)   (or + (-mean) * s + beta)
_MEAN = Op("ReduceMean", X, Const("axes1"), name="mean")
_DIFF = Op("Sub", X, _MEAN, name="d")
_TF_VARS = [Op("ReduceMean", Op("Mul", _DIFF, Var("d"), name="sq"), Const("axes2"), name="var"),
            Op("ReduceMean", Op("Pow", _DIFF, Scalar(2.0), name="sq"), Const("axes2"), name="var")]
_TF_VEPS = [Op("Add", v, Scalar(name="eps"), name="veps") for v in _TF_VARS]
_TF_RSTDS = [r for ve in _TF_VEPS for r in (Op("Reciprocal", Op("Sqrt", ve, name="std"), name="rstd"),
                                             Op("Pow", ve, Scalar(-0.5), name="rstd"),
                                             Op("Div", Scalar(1.0), Op("Sqrt", ve, name="std"), name="rstd"))]


def _tf_patterns():
    out = []
    for rstd in _TF_RSTDS:
        for s in (Op("Mul", rstd, Var("scale"), name="s"), rstd):
            xs = Op("Mul", X, s, name="xs")
            shifts = [Op("Add", Op("Mul", Op("Neg", _MEAN, name="neg"), s, name="ms"), Var("bias"), name="shift"),
                      Op("Sub", Var("bias"), Op("Mul", _MEAN, s, name="ms"), name="shift")]
            out += [Op("Add", xs, sh, name="y") for sh in shifts]
            out += [Op("Add", xs, Op("Mul", Op("Neg", _MEAN, name="neg"), s, name="ms"), name="y"),
                    Op("Sub", xs, Op("Mul", _MEAN, s, name="ms"), name="y")]
    return out


TF_PATTERNS = _tf_patterns()


def _axis(m):
    """The first normalized axis, or a reason string."""
    x = m["x"]
    if x.shape is None:
        return "the rank of x is unknown"
    r = len(x.shape)
    a1 = sorted(int(a) % r for a in m.const("axes1").reshape(-1))
    a2 = sorted(int(a) % r for a in m.const("axes2").reshape(-1))
    if a1 != a2:
        return f"the two ReduceMeans reduce different axes ({a1} and {a2})"
    if not a1 or a1 != list(range(r - len(a1), r)):
        return f"axes {a1} are not the trailing axes of a rank-{r} tensor"
    for n in ("mean", "var"):
        if not m.node(n).attr("keepdims", 1):
            return f"ReduceMean<{m.node(n).name}> drops the reduced axes (keepdims=0)"
    return a1[0]


def _param_ok(m, key, axis):
    v = m.get(key)
    if v is None:
        return None
    x = m["x"]
    norm_shape = tuple(x.shape[axis:])
    if v.shape is None:
        return f"the shape of {key} %{v.name} is unknown"
    shape = tuple(v.shape)
    while len(shape) > len(norm_shape) and shape[0] == 1:
        shape = shape[1:]
    if len(shape) > len(norm_shape):
        return f"{key} %{v.name} of shape {list(v.shape)} varies over non-normalized axes"
    c = m.const(key)
    if c is None and shape != norm_shape:
        return f"{key} %{v.name} of shape {list(v.shape)} is not the normalized shape {list(norm_shape)}"
    if c is not None and any(isinstance(n, int) and s not in (1, n) for s, n in zip(shape[::-1], norm_shape[::-1])):
        return f"{key} of shape {list(v.shape)} does not broadcast over {list(norm_shape)}"
    if c is not None and any(not isinstance(n, int) for n in norm_shape):
        return "the normalized shape is not static"
    if v.dtype != x.dtype:
        return f"{key} dtype {v.dtype} differs from {x.dtype}"
    return None


def _check(m):
    if m["x"].dtype not in ("float16", "float32", "float64"):
        return f"%{m['x'].name} is not floating point"
    axis = _axis(m)
    if isinstance(axis, str):
        return axis
    for key in ("scale", "bias"):
        why = _param_ok(m, key, axis)
        if why:
            return why
    if m.get("scale") is None and not all(isinstance(d, int) for d in m["x"].shape[axis:]):
        return "no scale and the normalized shape is not static (LayerNormalization needs a scale input)"


def _param(m, b, key, axis):
    v = m.get(key)
    c = m.const(key)
    if v is None:
        return None
    if c is None:
        return v
    norm_shape = tuple(m["x"].shape[axis:])
    if tuple(c.shape) == norm_shape:
        return v
    return b.const(np.ascontiguousarray(np.broadcast_to(c.reshape(c.shape[-len(norm_shape):] if c.ndim > len(norm_shape)
                                                                   else c.shape), norm_shape)), key)


def _rewrite(m, b):
    axis = _axis(m)
    r = len(m["x"].shape)
    scale = _param(m, b, "scale", axis)
    if scale is None:  # no gamma: LayerNormalization's scale input is required, ones do nothing
        scale = b.const(np.ones(tuple(m["x"].shape[axis:]), dtype=m["x"].dtype), "scale")
    return b.node("LayerNormalization",
                  [m["x"], scale, _param(m, b, "bias", axis)],
                  {"axis": axis - r, "epsilon": m.scalar("eps")}, name=m.root.name).output


RULE = Rule("layernorm", PATTERNS, _rewrite, _check,
            doc="(x - mean) / sqrt(var + eps) * scale + bias over trailing axes is LayerNormalization.")
TF_RULE = Rule("layernorm_scale_shift", TF_PATTERNS, _rewrite, _check,
               doc="x * s + (bias - mean * s) with s = scale / sqrt(var + eps) over trailing axes is "
                   "LayerNormalization (TF's batch_normalization arithmetic).")

register_pass(RewritePass("layernorm_recognition", [RULE, TF_RULE], level=2, doc="""
Recognize layer normalization written out as ReduceMean, Sub, Pow (or Mul), ReduceMean, Add(eps), Sqrt,
Div (or Mul by Reciprocal), Mul(scale) and optionally Add(bias), reducing the trailing axes, and replace it
by LayerNormalization(x, scale, bias, axis, epsilon). TF's arithmetic is recognized too: s = scale *
rsqrt(var + eps) (Reciprocal of Sqrt, Pow -0.5, or 1 / Sqrt), y = x * s + (bias - mean * s) or
x * s + (-mean) * s + bias.

Assumes: both means reduce the same trailing axes with keepdims; scale and bias vary only over them.
Guarantees: the same function; LayerNormalization's kernel accumulates in float64, so results agree to
float rounding.
""".strip()))
