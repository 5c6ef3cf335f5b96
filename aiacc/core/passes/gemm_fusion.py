"""MatMul + Add into Gemm, and Gemm + activation into aiacc::FusedGemm."""
from __future__ import annotations

from aiacc.core.passes.activations import FUSIBLE_ACTIVATIONS, activation_attrs, activation_of
from aiacc.core.passes.manager import register_pass
from aiacc.core.passes.rewrite import Op, Opt, RewritePass, Rule, RuleSet, Var


def _check_matmul_add(m):
    a, bb, c = m["a"], m["b"], m["c"]
    if a.shape is None or bb.shape is None or c.shape is None:
        return "operand shapes are unknown"
    if len(a.shape) != 2 or len(bb.shape) != 2:
        return f"Gemm needs matrices; MatMul operands have ranks {len(a.shape)} and {len(bb.shape)}"
    out = (a.shape[0], bb.shape[1])
    if len(c.shape) > 2:
        return f"addend of rank {len(c.shape)} does not broadcast to a matrix"
    cs = (1,) * (2 - len(c.shape)) + tuple(c.shape)
    for k in range(2):
        if cs[k] != 1 and cs[k] != out[k]:
            return f"addend of shape {list(c.shape)} does not broadcast to the product's {list(out)} (Gemm's C " \
                   "broadcasts one way only)"
    if c.dtype != a.dtype:
        return f"addend dtype {c.dtype} differs from {a.dtype}"


matmul_add = Rule("matmul_add_to_gemm", Op("Add", Op("MatMul", Var("a"), Var("b"), name="mm"), Var("c"), name="add"),
                  lambda m, b: b.op("Gemm", m["a"], m["b"], m["c"], name=m.node("mm").name), _check_matmul_add,
                  doc="MatMul(a, b) + c (matrices, c broadcasting to the product) is Gemm(a, b, c).")


def _check_act(m):
    act = activation_of(m.root)
    if isinstance(act, str):
        return act
    g = m.node("gemm")
    if g.domain == "aiacc" and g.attr("activation", ""):
        return f"FusedGemm<{g.name}> already has activation {g.attr('activation')}"


def _rewrite_act(m, b):
    g = m.node("gemm")
    attrs = {k: v for k, v in g.attrs.items() if k not in ("activation", "activation_params")}
    attrs.update(activation_attrs(m.root))
    return b.node("FusedGemm", [m["a"], m["b"], m["c"]], attrs, domain="aiacc", name=g.name).output


gemm_activation = Rule(
    "gemm_activation",
    [Op(FUSIBLE_ACTIVATIONS, Op("Gemm", Var("a"), Var("b"), Opt("c"), name="gemm"), Opt("lo"), Opt("hi"), name="act"),
     Op(FUSIBLE_ACTIVATIONS, Op("FusedGemm", Var("a"), Var("b"), Opt("c"), domain="aiacc", name="gemm"), Opt("lo"),
        Opt("hi"), name="act")],
    _rewrite_act, _check_act, doc="act(Gemm(a, b, c)) is FusedGemm(a, b, c, activation=act).")

RULES = RuleSet([matmul_add, gemm_activation])

register_pass(RewritePass("gemm_fusion", RULES, level=2, doc="""
Turn MatMul + Add into Gemm when both operands are matrices and the addend broadcasts to the product, and
fuse a following activation into aiacc::FusedGemm.

Assumes: the MatMul (Gemm) output is read only by the Add (activation).
Guarantees: the same numerics as the separate ops; batched (rank > 2) MatMuls are left alone.
""".strip()))
