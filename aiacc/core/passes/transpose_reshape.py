"""Transpose and Reshape cancellation, written as rewrite rules."""
from __future__ import annotations

import numpy as np

from aiacc.core.passes.manager import register_pass
from aiacc.core.passes.rewrite import Const, Op, RewritePass, Rule, RuleSet, Var


def _perm(node, rank):
    p = node.attr("perm")
    return list(range(rank))[::-1] if p is None else [int(i) for i in p]


def _rank(m, name):
    v = m[name]
    return None if v.shape is None else len(v.shape)


# -- Transpose(Transpose(x, p1), p2) -> Transpose(x, p1[p2]) or x ----------------------------------
def _check_tt(m):
    if _rank(m, "x") is None:
        return "the rank of the transposed value is unknown"


def _rewrite_tt(m, b):
    rank = _rank(m, "x")
    p1 = _perm(m.node("t1"), rank)
    p2 = _perm(m.root, rank)
    q = [p1[i] for i in p2]
    if q == list(range(rank)):
        return m["x"]
    return b.op("Transpose", m["x"], perm=q)


transpose_transpose = Rule(
    "transpose_transpose", Op("Transpose", Op("Transpose", Var("x"), name="t1", shared=True), name="t2"),
    _rewrite_tt, _check_tt, doc="Transpose(Transpose(x, p1), p2) is Transpose(x, p1[p2]); x when that is the identity.")


# -- Transpose with the identity permutation ---------------------------------------------------------
def _check_t_identity(m):
    rank = _rank(m, "x")
    if rank is None:
        return "the rank of the transposed value is unknown"
    if _perm(m.root, rank) != list(range(rank)):
        return f"perm {_perm(m.root, rank)} is not the identity"


transpose_identity = Rule("transpose_identity", Op("Transpose", Var("x"), name="t"), lambda m, b: m["x"],
                          _check_t_identity, doc="A Transpose by the identity permutation is its input.")


# -- Reshape(Reshape(x, s1), s2) -> Reshape(x, s2') ---------------------------------------------------
def _rewrite_rr(m, b):
    s2 = [int(d) for d in m.const("s2").reshape(-1)]
    if m.root.attr("allowzero", 0) == 0 and 0 in s2:
        mid = m["mid"].shape
        s2 = [mid[i] if d == 0 else d for i, d in enumerate(s2)]
        if any(not isinstance(d, int) for d in s2):
            from aiacc.core.passes.rewrite import RuleFailure
            raise RuleFailure("the outer Reshape copies a dimension (0) whose size is unknown")
    return b.op("Reshape", m["x"], b.const(np.asarray(s2, dtype=np.int64), "shape"))


def _check_rr(m):
    s2 = m.const("s2").reshape(-1)
    if m.root.attr("allowzero", 0) == 0 and (s2 == 0).any():
        mid = m["mid"].shape
        if mid is None or any(not isinstance(mid[i], int) for i in np.flatnonzero(s2 == 0) if i < len(mid)):
            return "the outer Reshape copies a dimension (0) whose size is unknown"


reshape_reshape = Rule(
    "reshape_reshape", Op("Reshape", Op("Reshape", Var("x"), Var(), name="mid", shared=True), Const("s2"),
                          name="r2"),
    _rewrite_rr, _check_rr, doc="Reshape(Reshape(x, s1), s2) is Reshape(x, s2) (0 entries of s2 resolved).")


# -- Reshape to the shape the value already has ------------------------------------------------------
def _check_r_identity(m):
    a, out = m["x"].type, m.root.output.type
    if a is None or out is None or a.shape is None or out.shape is None:
        return "input or output shape unknown"
    if a.shape != out.shape or any(d is None for d in a.shape):
        return f"reshape {list(a.shape)} -> {list(out.shape)} is not provably the identity"
    if sum(1 for d in a.shape if isinstance(d, str)) > 1:
        return "two symbolic dimensions: the identity cannot be proved"


reshape_identity = Rule("reshape_identity", Op("Reshape", Var("x"), Var(), name="r"), lambda m, b: m["x"],
                        _check_r_identity, doc="A Reshape whose output shape equals its input shape is its input.")

# -- Reshape(MatMul(Reshape(x, [-1, H]), W), [..., N]) -> MatMul(x, W) ----------------------------------
def _check_tensordot(m):
    x, w = m["x"], m["w"]
    if x.shape is None or w.shape is None or m.node("flat").output.shape is None:
        return "shapes are unknown"
    if len(w.shape) != 2 or len(x.shape) < 3:
        return "not a batched row-major product (x of rank >= 3 flattened to a matrix times a matrix)"
    flat = m.node("flat").output.shape
    if len(flat) != 2 or not isinstance(x.shape[-1], int) or flat[1] != x.shape[-1]:
        return f"the inner Reshape to {list(flat)} does not flatten the leading axes of {list(x.shape)}"
    target = [int(d) for d in m.const("s2").reshape(-1)]
    if len(target) != len(x.shape) or target[-1] != w.shape[1]:
        return f"the outer Reshape to {target} does not restore the leading axes of {list(x.shape)}"
    if m.root.attr("allowzero", 0) == 0 and 0 in target:
        return "the outer Reshape copies a dimension (0)"
    minus = 0
    for t, d in zip(target[:-1], x.shape[:-1]):
        if t == -1:
            minus += 1
        elif t != d:
            return f"the outer Reshape to {target} does not restore the leading axes of {list(x.shape)}"
    if minus > 1:
        return "the outer Reshape has several -1 entries"


tensordot_matmul = Rule(
    "tensordot_matmul",
    Op("Reshape", Op("MatMul", Op("Reshape", Var("x"), Var(), name="flat"), Var("w"), name="mm"), Const("s2"),
       name="unflat"),
    lambda m, b: b.op("MatMul", m["x"], m["w"], name=m.node("mm").name), _check_tensordot,
    doc="Reshape(MatMul(Reshape(x, [-1, H]), W), x's leading axes + [N]) is MatMul(x, W) (TF Tensordot).")

# -- Transpose(MatMul(Transpose(a), Transpose(b)), swap last two) -> MatMul(b', a') ----------------------
def _swap_last(rank):
    return list(range(rank - 2)) + [rank - 1, rank - 2]


def _check_transposed_product(m):
    ta, tb = m.node("ta"), m.node("tb")
    a, b = m["a"], m["b"]
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape) or len(a.shape) < 2:
        return "operand ranks are unknown, below 2 or different"
    r = len(a.shape)
    if _perm(m.root, r) != _swap_last(r):
        return f"the outer Transpose {_perm(m.root, r)} does not just swap the last two axes"
    if _perm(ta, r) is None or _perm(tb, r) is None:
        return "operand permutations are unknown"


def _rewrite_transposed_product(m, b):
    r = len(m["a"].shape)
    sw = _swap_last(r)
    qa = [_perm(m.node("ta"), r)[i] for i in sw]
    qb = [_perm(m.node("tb"), r)[i] for i in sw]
    new_a = m["a"] if qa == list(range(r)) else b.op("Transpose", m["a"], perm=qa, name=m.node("ta").name)
    new_b = m["b"] if qb == list(range(r)) else b.op("Transpose", m["b"], perm=qb, name=m.node("tb").name)
    return b.op("MatMul", new_b, new_a, name=m.node("mm").name)


transposed_product = Rule(
    "transposed_product",
    Op("Transpose", Op("MatMul", Op("Transpose", Var("a"), name="ta"), Op("Transpose", Var("b"), name="tb"),
                       name="mm"), name="t"),
    _rewrite_transposed_product, _check_transposed_product,
    doc="(A B)^T = B^T A^T: a Transpose of a product of two Transposes becomes a product of two Transposes "
        "(one Transpose fewer; TF lowers Keras attention's einsum this way).")

RULES = RuleSet([transpose_transpose, transpose_identity, reshape_reshape, reshape_identity, tensordot_matmul,
                 transposed_product])

register_pass(RewritePass("transpose_reshape_cancellation", RULES, level=1, doc="""
Cancel data-movement chains: Transpose∘Transpose composes into one Transpose (or nothing), a Transpose by
the identity permutation and a Reshape to the shape a value already has disappear, Reshape∘Reshape becomes
one Reshape, (A B)^T of two transposed operands becomes B^T A^T (one Transpose fewer); TF's Tensordot (Reshape to a matrix, MatMul, Reshape back) becomes one batched MatMul.

Assumes: shapes inferred by the IR are right; a Reshape with several symbolic dimensions is never assumed
to be the identity.
Guarantees: the data and shape of every graph output are unchanged; inner nodes read elsewhere stay.
""".strip()))
