"""Scaled dot-product attention recognized from MatMul / scale / mask / Softmax / MatMul."""
from __future__ import annotations

import itertools

from aiacc.core.passes.manager import register_pass
from aiacc.core.passes.rewrite import Op, RewritePass, Rule, Scalar, Var


def _qk(k_form):
    if k_form == "transpose":
        return Op("MatMul", Var("q"), Op("Transpose", Var("k"), name="kt", shared=True), name="qk")
    return Op("MatMul", Var("q"), Var("kt_raw"), name="qk")


def _scaled(qk, scale_form):
    if scale_form == "div":
        return Op("Div", qk, Scalar(name="c"), name="scaled")
    if scale_form == "mul":
        return Op("Mul", qk, Scalar(name="c"), name="scaled")
    return qk


def _patterns():
    out = []
    for mask, scale, k in itertools.product((True, False), ("div", "mul", None), ("transpose", "raw")):
        s = _scaled(_qk(k), scale)
        if mask:
            s = Op("Add", s, Var("mask"), name="masked")
        out.append(Op("MatMul", Op("Softmax", s, name="softmax"), Var("v"), name="pv"))
    return out


def _check(m):
    q = m["q"]
    if q.shape is None or len(q.shape) < 2:
        return "the rank of q is unknown or below 2"
    rank = len(m.node("softmax").output.shape or ())
    axis = m.node("softmax").attr("axis", -1)
    if rank == 0 or axis % rank != rank - 1:
        return f"Softmax<{m.node('softmax').name}> normalizes axis {axis}, not the last axis"
    if m.get("k") is not None:
        kt = m.node("kt")
        r = len(m["k"].shape) if m["k"].shape is not None else None
        perm = kt.attr("perm")
        if r is None or perm is None or list(perm) != list(range(r - 2)) + [r - 1, r - 2]:
            return f"Transpose<{kt.name}> does not swap just the last two axes"
    if "c" in m:
        c = m.scalar("c")
        if c == 0.0:
            return "the scale divides by zero"
    mask = m.get("mask")
    if mask is not None and mask.dtype != q.dtype:
        return f"the additive mask is {mask.dtype}, not {q.dtype}"


def _rewrite(m, b):
    scale = 1.0
    if "c" in m:
        c = m.scalar("c")
        scale = 1.0 / c if m.node("scaled").op == "Div" else c
    if m.get("k") is not None:
        k, kt = m["k"], 0
    else:
        k, kt = m["kt_raw"], 1
    ins = [m["q"], k, m["v"]] + ([m["mask"]] if m.get("mask") is not None else [])
    return b.node("Attention", ins, {"scale": float(scale), "k_transposed": kt}, domain="aiacc",
                  name=m.root.name).output


RULE = Rule("sdpa", _patterns(), _rewrite, _check,
            doc="Softmax(q @ k^T * scale + mask) @ v is aiacc::Attention(q, k, v, mask).")

register_pass(RewritePass("attention_recognition", [RULE], level=3, doc="""
Recognize scaled dot-product attention: MatMul(q, Transpose(k) or k^T), optionally divided or multiplied
by a scalar, optionally plus an additive mask, Softmax over the last axis, MatMul with v; replace it by
aiacc::Attention(q, k, v, mask) {scale, k_transposed}.

Assumes: the Softmax normalizes the last axis and the Transpose swaps only the last two axes.
Guarantees: the same function (a division by c becomes a multiplication by 1/c: float rounding only);
the intermediate scores are read by nothing else.
""".strip()))
