"""Conv + bias + residual Add + activation into one aiacc::FusedConv."""
from __future__ import annotations

import numpy as np

from aiacc.core.passes.activations import FUSIBLE_ACTIVATIONS, check_activation_fusion, with_activation
from aiacc.core.passes.manager import register_pass
from aiacc.core.passes.rewrite import Const, Op, Opt, RewritePass, Rule, RuleSet, Var

_CONV = Op("Conv", Var("x"), Var("w"), Opt("b"), name="conv")


# -- Conv + Add(per-channel constant) -> Conv with that bias ------------------------------------------
def _check_bias(m):
    conv, c = m.node("conv"), m.const("c")
    out = conv.output
    if out.shape is None or m["w"].shape is None:
        return "the convolution's rank or weight shape is unknown"
    mch = m["w"].shape[0]
    if not isinstance(mch, int):
        return "the number of output channels is unknown"
    if c.ndim > len(out.shape):
        return f"constant of rank {c.ndim} broadcasts beyond the conv output rank {len(out.shape)}"
    full = (1,) * (len(out.shape) - c.ndim) + c.shape
    if any(d != 1 for k, d in enumerate(full) if k != 1) or full[1] not in (1, mch):
        return f"constant of shape {list(c.shape)} is not a per-channel bias for {mch} channels"
    if c.dtype.name != (out.dtype or c.dtype.name):
        return f"bias dtype {c.dtype.name} differs from the conv's {out.dtype}"
    if m["b"] is not None and m.const("b") is None:
        return "the conv's own bias is not a constant"


def _rewrite_bias(m, b):
    conv = m.node("conv")
    mch = m["w"].shape[0]
    c = np.broadcast_to(m.const("c").reshape(-1), (mch,)).astype(np.float64)
    old = m.const("b")
    new_b = (c + (0.0 if old is None else old.astype(np.float64))).astype(m.const("c").dtype)
    return b.node("Conv", [m["x"], m["w"], b.const(new_b, "b")], dict(conv.attrs), name=conv.name).output


conv_add_bias = Rule("conv_add_bias", Op("Add", _CONV, Const("c"), name="add"), _rewrite_bias, _check_bias,
                     doc="Conv(x, w, b) + per-channel constant c is Conv(x, w, b + c).")


# -- Conv + Add(Unsqueeze(1-D value)) -> Conv with that value as its bias --------------------------------
def _check_value_bias(m):
    out, v = m.node("conv").output, m["v"]
    if m["b"] is not None:
        return "the conv has a bias already"
    if out.shape is None or len(out.shape) != 4 or m["w"].shape is None or not isinstance(m["w"].shape[0], int):
        return "the conv is not 2-D with a known number of output channels"
    mch = m["w"].shape[0]
    if v.shape is None or tuple(v.shape) != (mch,) or v.dtype != out.dtype:
        return f"%{v.name} is not a {mch}-element {out.dtype} vector"
    if m["bias"].shape is None or tuple(m["bias"].shape) not in ((mch, 1, 1), (1, mch, 1, 1)):
        return "the added value does not broadcast as one number per output channel"


def _rewrite_value_bias(m, b):
    conv = m.node("conv")
    return b.node("Conv", [m["x"], m["w"], m["v"]], dict(conv.attrs), name=conv.name).output


conv_add_value_bias = Rule(
    "conv_add_value_bias",
    Op("Add", Op("Conv", Var("x"), Var("w"), Opt("b"), name="conv"),
       Op("Unsqueeze", Var("v"), Var("axes"), name="bias", shared=True), name="add"),
    _rewrite_value_bias, _check_value_bias,
    doc="Conv(x, w) + Unsqueeze(v) with v one value per output channel (a trained bias, a graph input: not a "
        "constant) is Conv(x, w, v), so training graphs keep the conv bias fusion.")


# -- Conv + residual Add -> FusedConv(x, w, b, residual) ----------------------------------------------
def _check_residual(m):
    out, r = m.node("conv").output, m["r"]
    if out.type is None or r.type is None or out.shape is None or r.shape is None:
        return "the shapes of the conv output or the residual are unknown"
    if tuple(out.shape) != tuple(r.shape) or any(d is None for d in out.shape):
        return (f"residual %{r.name} of shape {list(r.shape)} is not the conv output shape {list(out.shape)} "
                "(broadcasting adds are not residuals)")
    if out.dtype != r.dtype:
        return f"residual dtype {r.dtype} differs from {out.dtype}"
    if r.const is not None:
        return "the residual is a constant (conv_add_bias handles per-channel constants)"


def _rewrite_residual(m, b):
    conv = m.node("conv")
    return b.node("FusedConv", [m["x"], m["w"], m["b"], m["r"]], dict(conv.attrs), domain="aiacc",
                  name=conv.name).output


conv_residual = Rule("conv_residual", Op("Add", _CONV, Var("r"), name="add"), _rewrite_residual, _check_residual,
                     doc="Conv(x, w, b) + r (same shape) is FusedConv(x, w, b, r).")


# -- (Fused)Conv + activation -> FusedConv(activation) -------------------------------------------------
def _check_act(m):
    return check_activation_fusion(m, "conv")


def _rewrite_act(m, b):
    conv = m.node("conv")
    ins = [m["x"], m["w"], m["b"]] + ([m["r"]] if m.get("r") is not None else [])
    return b.node("FusedConv", ins, with_activation(conv, m.root), domain="aiacc", name=conv.name).output


_ACT_INPUTS = (Opt("lo"), Opt("hi"))
conv_activation = Rule(
    "conv_activation",
    [Op(FUSIBLE_ACTIVATIONS, _CONV, *_ACT_INPUTS, name="act"),
     Op(FUSIBLE_ACTIVATIONS, Op("FusedConv", Var("x"), Var("w"), Opt("b"), Opt("r"), domain="aiacc", name="conv"),
        *_ACT_INPUTS, name="act")],
    _rewrite_act, _check_act, doc="act(Conv(...)) and act(FusedConv(...) without activation) are FusedConv(act).")

RULES = RuleSet([conv_add_bias, conv_add_value_bias, conv_residual, conv_activation])

register_pass(RewritePass("conv_fusion", RULES, level=2, doc="""
Fuse a Conv with what follows it: a per-channel constant Add becomes its bias, and so does the Add of a
per-channel vector that is not a constant (Unsqueeze of a trained bias, in training graphs); an Add of a same-shaped
value becomes aiacc::FusedConv's residual input; a following activation (Relu, LeakyRelu, Elu, Sigmoid,
Tanh, HardSigmoid, HardSwish, Clip with constant bounds, Gelu) becomes its `activation` attribute.
FusedConv computes act(Conv(x, w, b) + residual).

Assumes: the conv output (and the intermediate Add) is read only by the fused successor.
Guarantees: the same numerics as the unfused ops (the FusedConv reference kernel runs those very kernels);
a conv output read twice is never fused.
""".strip()))
