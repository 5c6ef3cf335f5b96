"""Per-channel constant scales and shifts folded into the Conv / ConvTranspose / FusedConv / Gemm / MatMul
that produces them.

Batch normalization reaches the IR in pieces: Keras 3 and TF lower it to `x * s + t` (Mul and Add by
per-channel constants), Caffe writes BatchNorm + Scale, MXNet and ONNX exporters sometimes emit the Mul and
Add themselves, a Caffe Eltwise with coefficients multiplies a conv output by a scalar. Each rule below
folds one such op into the linear op feeding it; run to a fixed point they absorb a whole chain
`Conv -> Add(bias) -> Mul(s) -> Add(t)` one op at a time (each rewrite leaves a linear op the next one can
take).
"""
from __future__ import annotations

import numpy as np

from aiacc.core.passes.manager import register_pass
from aiacc.core.passes.rewrite import Const, Op, Opt, RewritePass, Rule, RuleSet, Var

LINEAR_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
_LIN = Op(LINEAR_OPS, Var("x"), Var("w"), Opt("b"), name="lin")
_FUSED_LIN = Op("FusedConv", Var("x"), Var("w"), Opt("b"), Opt("r"), domain="aiacc", name="lin")


def _channel_axis(lin, rank: int) -> int:
    return 1 if lin.op in ("Conv", "ConvTranspose", "FusedConv") else rank - 1


def _channels(lin, w: np.ndarray) -> int:
    """The number of output channels (the size of the channel axis) of a linear op with weight w."""
    if lin.op in ("Conv", "FusedConv"):
        return w.shape[0]
    if lin.op == "ConvTranspose":
        return w.shape[1] * lin.attr("group", 1)
    if lin.op == "Gemm":
        return w.shape[0] if lin.attr("transB", 0) else w.shape[1]
    return w.shape[-1]  # MatMul


def per_channel(c: np.ndarray, rank: int, axis: int, channels: int) -> np.ndarray | str:
    """`c` as a float64 vector of `channels` entries when an elementwise op with `c` acts per channel along
    `axis` of a rank-`rank` value (without broadcasting the value to a larger shape), else a reason."""
    if c.ndim > rank:
        return f"constant of rank {c.ndim} broadcasts beyond the rank-{rank} output"
    full = (1,) * (rank - c.ndim) + tuple(c.shape)
    for k, d in enumerate(full):
        if k != axis and d != 1:
            return f"constant of shape {list(c.shape)} varies along axis {k}, not only the channel axis {axis}"
    if full[axis] not in (1, channels):
        return f"constant of shape {list(c.shape)} is not per-channel for {channels} channels"
    return np.broadcast_to(c.reshape(-1).astype(np.float64), (channels,))


def _check_common(m):
    """The checks every folding shares; returns (lin node, weight array, channel vector) or a reason."""
    lin = m.node("lin")
    out = lin.output
    w = m.const("w")
    if w is None:
        return f"the weight %{m['w'].name} of {lin.qualified_op}<{lin.name}> is not a constant"
    if w.dtype.kind != "f":
        return f"the weight of {lin.name} is {w.dtype.name}, not floating point"
    if lin.op == "MatMul" and w.ndim != 2:
        return f"MatMul<{lin.name}> has a weight of rank {w.ndim} (only a 2-D right operand folds)"
    if m.get("b") is not None and m.const("b") is None:
        return f"the bias %{m['b'].name} of {lin.name} is not a constant"
    if out.shape is None:
        return f"the rank of %{out.name} is unknown"
    c = m.const("c")
    if c.dtype != w.dtype:
        return f"the constant is {c.dtype.name}, the weight {w.dtype.name}"
    if lin.domain == "aiacc" and lin.attr("activation", ""):
        return f"FusedConv<{lin.name}> applies {lin.attr('activation')} before the {m.root.op}"
    rank = len(out.shape)
    vec = per_channel(c, rank, _channel_axis(lin, rank), _channels(lin, w))
    if isinstance(vec, str):
        return vec
    return lin, w, vec


# -- Mul / Div by a per-channel constant: scale the weight (and the bias) -------------------------------
def _check_scale(m):
    got = _check_common(m)
    if isinstance(got, str):
        return got
    lin, _, vec = got
    if m.get("r") is not None:
        return f"FusedConv<{lin.name}> adds a residual the {m.root.op} would scale too"
    others = [u for u in m["w"].users() if u is not lin]
    if others:
        return (f"the weight %{m['w'].name} is shared with {others[0].qualified_op}<{others[0].name}>: "
                "scaling it would duplicate it")
    if m.root.op == "Div" and not np.all(vec != 0):
        return "the divisor has zeros"


def _scaled_weight(lin, w: np.ndarray, s: np.ndarray) -> np.ndarray:
    w64 = w.astype(np.float64)
    if lin.op in ("Conv", "FusedConv"):
        return w64 * s.reshape((-1,) + (1,) * (w.ndim - 1))
    if lin.op == "ConvTranspose":
        g = lin.attr("group", 1)
        cin, mg = w.shape[0], w.shape[1]
        return (w64.reshape(g, cin // g, mg, -1) * s.reshape(g, 1, mg, 1)).reshape(w.shape)
    if lin.op == "Gemm" and lin.attr("transB", 0):
        return w64 * s[:, None]
    return w64 * s[None, :]  # Gemm (B is [K, N]) and MatMul


def _rewrite_scale(m, b):
    lin = m.node("lin")
    w = m.const("w")
    s = _check_common(m)[2]
    if m.root.op == "Div":
        s = 1.0 / s
    dt = w.dtype
    ins = [m["x"], b.const(_scaled_weight(lin, w, s).astype(dt), "w")]
    bias = m.const("b")
    if bias is not None:  # a Gemm's C may be a matrix, a row or a column: scaling its columns works for all
        ins.append(b.const(np.asarray(bias.astype(np.float64) * s).astype(dt), "b"))
    return b.node(lin.op, ins, dict(lin.attrs), domain=lin.domain, name=lin.name).output


scale_into_linear = Rule(
    "scale_into_linear",
    [Op(("Mul", "Div"), _LIN, Const("c"), name="op"), Op(("Mul", "Div"), _FUSED_LIN, Const("c"), name="op")],
    _rewrite_scale, _check_scale,
    doc="Conv/ConvTranspose/FusedConv/Gemm/MatMul(x, W, b) * s (per output channel) is the op with W*s, b*s.")


# -- Add / Sub of a per-channel constant: shift the bias -----------------------------------------------
def _check_shift(m):
    lin = m.node("lin")
    if lin.op == "MatMul":
        return "MatMul has no bias input (gemm_fusion turns MatMul + Add into Gemm or FusedMatMul)"
    got = _check_common(m)
    if isinstance(got, str):
        return got


def _rewrite_shift(m, b):
    lin = m.node("lin")
    w = m.const("w")
    t = _check_common(m)[2]
    root = m.root
    if root.op == "Sub":  # the pattern matches lin - c only (Sub does not commute)
        t = -t
    dt = w.dtype
    old = m.const("b")
    attrs = dict(lin.attrs)
    if lin.op == "Gemm":
        beta = float(lin.attr("beta", 1.0))
        new_b = (0.0 if old is None else beta * old.astype(np.float64)) + t
        attrs["beta"] = 1.0
    else:
        new_b = (0.0 if old is None else old.astype(np.float64)) + t
    ins = [m["x"], m["w"], b.const(np.asarray(new_b).astype(dt), "b")]
    if m.get("r") is not None:
        ins.append(m["r"])
    return b.node(lin.op, ins, attrs, domain=lin.domain, name=lin.name).output


shift_into_linear = Rule(
    "shift_into_linear",
    [Op(("Add", "Sub"), _LIN, Const("c"), name="op"), Op(("Add", "Sub"), _FUSED_LIN, Const("c"), name="op")],
    _rewrite_shift, _check_shift,
    doc="Conv/ConvTranspose/FusedConv/Gemm(x, W, b) + t (per output channel) is the op with bias b + t.")

RULES = RuleSet([scale_into_linear, shift_into_linear])

register_pass(RewritePass("affine_folding", RULES, level=2, modes=("inference",), doc="""
Fold a multiplication (or division) by a per-output-channel constant into the weights and bias of the
Conv, ConvTranspose, FusedConv (without activation or residual), Gemm or MatMul (2-D constant weight)
producing it, and an addition (or subtraction) of one into their bias. Scalars count as per-channel.
Chains such as Keras/TF batch norm (Conv, Add bias, Mul s, Add t) or Caffe BatchNorm+Scale fold op by op.

Assumes: inference mode (the weights are constants, not trained); the linear op's output is read only by
the folded op; the constant has the weight's dtype and varies only along the output-channel axis (axis 1
for convolutions, the last axis for Gemm/MatMul) without enlarging the output.
Guarantees: the same outputs up to float rounding (folded constants computed in float64); non-constant
weights, shared outputs, FusedConv activations and constants that vary along other axes are left alone
(rule.explain says why).
""".strip()))
