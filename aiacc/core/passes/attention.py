"""Scaled dot-product attention recognized from MatMul / scale / mask / Softmax / MatMul."""
from __future__ import annotations

import itertools

import numpy as np

from aiacc.core.passes.manager import register_pass
from aiacc.core.passes.rewrite import Op, Opt, RewritePass, Rule, RuleSet, Scalar, Var


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
    qk = m.node("qk")
    pending, _ = scale_after_scores.try_match(m.graph, qk)
    if pending is not None:
        return f"q or k of MatMul<{qk.name}> is scaled first: scale_after_scores moves the scale after it"
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


# -- pre-scaled q and k: the scale moves from an operand of the scores product to the scores ------------
def _feeds_softmax(v, steps: int = 3) -> bool:
    """v reaches a Softmax through at most `steps` single readers that are Mul/Div by a scalar or an Add."""
    for _ in range(steps + 1):
        if len(v.uses) != 1 or v.is_graph_output:
            return False
        user = v.uses[0][0]
        if user.domain != "":
            return False
        if user.op == "Softmax":
            return True
        if user.op not in ("Mul", "Div", "Add"):
            return False
        v = user.output
    return False


def _scaled_operands():
    """The scaled operand of the scores product, directly or under a Transpose/Reshape."""
    mul = Op(("Mul", "Div"), Var("x"), Scalar(name="s"), name="mul")
    return [mul, Op(("Transpose", "Reshape"), mul, Opt("shape"), name="mv")]


def _scale_patterns():
    out = []
    for opnd in _scaled_operands():
        out.append(Op("MatMul", opnd, Var("y"), name="mm"))
        out.append(Op("MatMul", Var("y"), opnd, name="mm"))
    return out


def _check_scale(m):
    if not _feeds_softmax(m.root.output):
        return f"MatMul<{m.root.name}> does not feed a Softmax: not an attention score"
    if m.node("mul").op == "Div" and m.scalar("s") == 0.0:
        return "the scale divides by zero"
    if m["x"].dtype not in ("float16", "float32", "float64"):
        return "the operand is not floating point"


def _rewrite_scale(m, b):
    mm, mul = m.root, m.node("mul")
    s = m.scalar("s")
    s = 1.0 / s if mul.op == "Div" else s
    x = m["x"]
    if m.get("mv") is not None:
        mv = m.node("mv")
        x = b.node(mv.op, [x] + list(mv.inputs[1:]), dict(mv.attrs), name=mv.name).output
    scaled = m.get("mv") if m.get("mv") is not None else m.node("mul").output
    ins = [x if v is scaled else v for v in mm.inputs]
    y = b.op("MatMul", *ins, name=mm.name)
    return b.op("Mul", y, b.const(np.asarray(s, dtype=x.dtype), "scale"), name=mul.name)


scale_after_scores = Rule(
    "scale_after_scores", _scale_patterns(), _rewrite_scale, _check_scale,
    doc="MatMul(q * s, k^T) feeding a Softmax is MatMul(q, k^T) * s (torch's MultiheadAttention and Keras "
        "MultiHeadAttention scale q before the product; some models scale both q and k by d^-1/4).")


def _check_merge(m):
    if m["x"].dtype not in ("float16", "float32", "float64"):
        return "the scores are not floating point"
    if any(m.node(n).op == "Div" and m.scalar(k) == 0.0 for n, k in (("inner", "s1"), ("y", "s2"))):
        return "a scale divides by zero"
    if not _feeds_softmax(m.root.output, steps=2):
        return "the scaled scores do not feed a Softmax"


def _rewrite_merge(m, b):
    s = 1.0
    for name, key in (("inner", "s1"), ("y", "s2")):
        c = m.scalar(key)
        s *= 1.0 / c if m.node(name).op == "Div" else c
    return b.op("Mul", m["x"], b.const(np.asarray(s, dtype=m["x"].dtype), "scale"), name=m.root.name)


merge_scales = Rule(
    "merge_scales",
    Op(("Mul", "Div"), Op(("Mul", "Div"), Op("MatMul", Var(), Var(), name="x"), Scalar(name="s1"), name="inner"),
       Scalar(name="s2"), name="y"),
    _rewrite_merge, _check_merge, doc="(scores * s1) * s2 is scores * (s1 s2) (q and k both scaled).")

RULES = RuleSet([scale_after_scores, merge_scales, RULE])

register_pass(RewritePass("attention_recognition", RULES, level=3, doc="""
Recognize scaled dot-product attention: MatMul(q, Transpose(k) or k^T), optionally divided or multiplied
by a scalar, optionally plus an additive mask, Softmax over the last axis, MatMul with v; replace it by
aiacc::Attention(q, k, v, mask) {scale, k_transposed}. A scale applied to q or k before the product (also
under a Transpose or Reshape, or to both with d^-1/4 each) is first moved after it, where the pattern
expects it, when the product feeds a Softmax.

Assumes: the Softmax normalizes the last axis and the Transpose swaps only the last two axes.
Guarantees: the same function (a division by c becomes a multiplication by 1/c: float rounding only);
the intermediate scores are read by nothing else.
""".strip()))
