"""Transpose and Reshape cancellation, written as rewrite rules."""
from __future__ import annotations

import numpy as np

from aiacc.core.passes.manager import register_pass
from aiacc.core.passes.rewrite import Const, Op, Opt, RewritePass, Rule, RuleSet, Var


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

# -- Transposes moved across Reshapes and row-wise products so that they meet and compose --------------
# (torch's batch_first=False attention: Transpose -> MatMul -> Reshape -> Transpose on the way in,
#  Transpose -> Reshape -> MatMul -> Transpose on the way out; each move below lets two Transposes compose)

def axis_groups(a: tuple, b: tuple) -> list[tuple[list[int], list[int]]] | None:
    """The finest pairing of consecutive axis groups of shapes a and b with equal element counts (a Reshape
    from a to b only splits or merges inside each group); None when a dimension is not static."""
    if not all(isinstance(d, int) and d > 0 for d in tuple(a) + tuple(b)):
        return None
    groups, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        ga, gb, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                if i == len(a):
                    return None
                ga.append(i)
                pa *= a[i]
                i += 1
            else:
                if j == len(b):
                    return None
                gb.append(j)
                pb *= b[j]
                j += 1
        groups.append((ga, gb))
    rest_a, rest_b = list(range(i, len(a))), list(range(j, len(b)))
    if any(a[k] != 1 for k in rest_a) or any(b[k] != 1 for k in rest_b) or not groups:
        return None
    groups[-1][0].extend(rest_a)  # trailing size-1 axes join the last group
    groups[-1][1].extend(rest_b)
    return groups


def _consecutive(axes: list[int]) -> bool:
    return all(y == x + 1 for x, y in zip(axes, axes[1:]))


def _single_reader(v, op: str):
    """The one node reading v when it is an `op` (and v is no graph output), else None."""
    users = v.users()
    if len(v.uses) == 1 and not v.is_graph_output and users[0].op == op and users[0].domain == "":
        return users[0]
    return None


def _transposed_input(v):
    """v is a Transpose output, or a Reshape of one, read only along that chain."""
    p = v.producer
    if p is None or p.domain != "":
        return False
    if p.op == "Transpose":
        return True
    return p.op == "Reshape" and p.inputs[0].producer is not None and p.inputs[0].producer.op == "Transpose" \
        and len(p.inputs[0].uses) == 1


# Reshape(Transpose(y, p), s) -> Transpose(Reshape(y, s'), p') when a Transpose reads the result
def _check_reshape_of_transpose(m):
    y, t_out, out = m["y"], m.node("t").output, m.root.output
    if y.shape is None or t_out.shape is None or out.shape is None:
        return "shapes are unknown"
    if _single_reader(out, "Transpose") is None:
        return "no Transpose reads the Reshape: moving the Transpose would not let it compose"
    groups = axis_groups(tuple(t_out.shape), tuple(out.shape))
    if groups is None:
        return f"the Reshape {list(t_out.shape)} -> {list(out.shape)} is not static or not axis-grouped"
    perm = _perm(m.node("t"), len(y.shape))
    for ga, _ in groups:
        if not _consecutive([perm[k] for k in ga]):
            return "the Transpose splits an axis group the Reshape merges or splits"


def _rewrite_reshape_of_transpose(m, b):
    y, t_out, out = m["y"], m.node("t").output, m.root.output
    perm = _perm(m.node("t"), len(y.shape))
    groups = axis_groups(tuple(t_out.shape), tuple(out.shape))
    # order the groups as they lie in y
    in_y = sorted(range(len(groups)), key=lambda g: perm[groups[g][0][0]])
    new_shape, start = [], {}
    for g in in_y:
        start[g] = len(new_shape)
        ga, gb = groups[g]
        if len(ga) == 1 and len(gb) == 1 and perm[ga[0]] == len(new_shape):
            new_shape.append(0)  # an axis kept in place: copy it (the batch stays free to change)
        else:
            new_shape += [out.shape[k] for k in gb]
    new_perm = [start[g] + k for g in range(len(groups)) for k in range(len(groups[g][1]))]
    r = b.op("Reshape", y, b.const(np.asarray(new_shape, dtype=np.int64), "shape"), name=m.root.name)
    return b.op("Transpose", r, perm=new_perm, name=m.node("t").name)


reshape_of_transpose = Rule(
    "reshape_of_transpose", Op("Reshape", Op("Transpose", Var("y"), name="t"), Var(), name="rs"),
    _rewrite_reshape_of_transpose, _check_reshape_of_transpose,
    doc="Reshape(Transpose(y)) that only splits/merges axes the Transpose keeps together is "
        "Transpose(Reshape(y)), when another Transpose follows (they then compose).")


# Transpose(Reshape(x, s), p) -> Reshape(Transpose(x, p''), s'') when x is a Transpose output
def _check_transpose_of_reshape(m):
    x, r_out, out = m["x"], m.node("rs").output, m.root.output
    if x.shape is None or r_out.shape is None or out.shape is None:
        return "shapes are unknown"
    if x.producer is None or x.producer.op != "Transpose" or x.producer.domain != "":
        return "the reshaped value is no Transpose output: moving the Transpose would not let it compose"
    groups = axis_groups(tuple(x.shape), tuple(r_out.shape))
    if groups is None:
        return f"the Reshape {list(x.shape)} -> {list(r_out.shape)} is not static or not axis-grouped"
    perm = _perm(m.root, len(r_out.shape))
    inv = [perm.index(k) for k in range(len(perm))]
    for _, gb in groups:
        if not _consecutive([inv[k] for k in gb]):
            return "the Transpose splits an axis group the Reshape merges or splits"


def _rewrite_transpose_of_reshape(m, b):
    x, r_out, out = m["x"], m.node("rs").output, m.root.output
    perm = _perm(m.root, len(r_out.shape))
    inv = [perm.index(k) for k in range(len(perm))]
    groups = axis_groups(tuple(x.shape), tuple(r_out.shape))
    order = sorted(range(len(groups)), key=lambda g: inv[groups[g][1][0]])  # groups as the output orders them
    xperm = [k for g in order for k in groups[g][0]]
    shape, pos = [], 0
    for g in order:
        ga, gb = groups[g]
        if len(ga) == 1 and len(gb) == 1 and len(shape) == pos:
            shape.append(0)  # an axis kept in place: copy it (the batch stays free to change)
        else:
            shape += [out.shape[inv[k]] for k in gb]
        pos += len(ga)
    t = b.op("Transpose", x, perm=xperm, name=m.root.name)
    return b.op("Reshape", t, b.const(np.asarray(shape, dtype=np.int64), "shape"), name=m.node("rs").name)


transpose_of_reshape = Rule(
    "transpose_of_reshape", Op("Transpose", Op("Reshape", Var("x"), Var(), name="rs"), name="t"),
    _rewrite_transpose_of_reshape, _check_transpose_of_reshape,
    doc="Transpose(Reshape(x)) that keeps each axis group the Reshape splits/merges together is "
        "Reshape(Transpose(x)), when x is itself a Transpose output (they then compose).")


# a leading-axis Transpose moves across a product with a weight matrix (it acts on rows only)
_ROWWISE = ("MatMul", "FusedMatMul")


def _is_rowwise(node) -> str | None:
    w = node.inputs[1]
    if w is None or w.shape is None or len(w.shape) != 2:
        return f"{node.qualified_op}<{node.name}> does not multiply by a weight matrix"
    return None


def _check_transpose_into_product(m):
    mm = m.root
    why = _is_rowwise(mm)
    if why:
        return why
    rank = len(m["x"].shape) if m["x"].shape is not None else None
    if rank is None or _perm(m.node("t"), rank)[-1] != rank - 1:
        return "the Transpose moves the last axis"
    out = mm.output
    nxt = _single_reader(out, "Transpose") or _single_reader(out, "Reshape")
    if nxt is None or (nxt.op == "Reshape" and _single_reader(nxt.output, "Transpose") is None):
        return "no Transpose follows the product: moving this one after it would not let it compose"


def _rewrite_transpose_into_product(m, b):
    mm = m.root
    ins = [m["x"]] + list(mm.inputs[1:])
    y = b.node(mm.op, ins, dict(mm.attrs), domain=mm.domain, name=mm.name).output
    return b.op("Transpose", y, perm=_perm(m.node("t"), len(m["x"].shape)), name=m.node("t").name)


transpose_through_product = Rule(
    "transpose_through_product",
    [Op("MatMul", Op("Transpose", Var("x"), name="t"), Var("w"), name="mm"),
     Op("FusedMatMul", Op("Transpose", Var("x"), name="t"), Var("w"), Opt("bias"), domain="aiacc", name="mm")],
    _rewrite_transpose_into_product, _check_transpose_into_product,
    doc="(x^p) W is (x W)^p for a Transpose p of the leading axes, moved after the product when a Transpose "
        "follows (directly or after a Reshape) to compose with.")


def _check_product_of_transposed(m):
    mm = m.node("mm")
    why = _is_rowwise(mm)
    if why:
        return why
    out = mm.output
    rank = len(out.shape) if out.shape is not None else None
    if rank is None or _perm(m.root, rank)[-1] != rank - 1:
        return "the Transpose moves the last axis"
    if not _transposed_input(m["x"]):
        return "the product's input is no Transpose (or Reshape of one) to compose with"


def _rewrite_product_of_transposed(m, b):
    mm = m.node("mm")
    t = b.op("Transpose", m["x"], perm=_perm(m.root, len(mm.output.shape)), name=m.root.name)
    return b.node(mm.op, [t] + list(mm.inputs[1:]), dict(mm.attrs), domain=mm.domain, name=mm.name).output


product_then_transpose = Rule(
    "product_then_transpose",
    [Op("Transpose", Op("MatMul", Var("x"), Var("w"), name="mm"), name="t"),
     Op("Transpose", Op("FusedMatMul", Var("x"), Var("w"), Opt("bias"), domain="aiacc", name="mm"), name="t")],
    _rewrite_product_of_transposed, _check_product_of_transposed,
    doc="(x W)^p is (x^p) W for a Transpose p of the leading axes, moved before the product when its input "
        "is a Transpose (or a Reshape of one) to compose with.")

RULES = RuleSet([transpose_transpose, transpose_identity, reshape_reshape, reshape_identity])

# the rules that change the layout of intermediate values (which a training-mode Dropout would see: torch
# draws its mask in the memory order of its input), with the cancellations they enable
PROPAGATION_RULES = RuleSet([tensordot_matmul, transposed_product, reshape_of_transpose, transpose_of_reshape,
                             transpose_through_product, product_then_transpose, transpose_transpose,
                             transpose_identity, reshape_reshape, reshape_identity])

register_pass(RewritePass("transpose_reshape_cancellation", RULES, level=1, doc="""
Cancel data-movement chains: Transpose∘Transpose composes into one Transpose (or nothing), a Transpose by
the identity permutation and a Reshape to the shape a value already has disappear, Reshape∘Reshape becomes
one Reshape.

Assumes: shapes inferred by the IR are right; a Reshape with several symbolic dimensions is never assumed
to be the identity.
Guarantees: the data and shape of every graph output are unchanged; inner nodes read elsewhere stay.
""".strip()))

register_pass(RewritePass("transpose_propagation", PROPAGATION_RULES, level=2, modes=("inference",), doc="""
Move Transposes to where they cancel: across Reshapes that keep their axis groups and across products with
a weight matrix (which act on rows only), when that lets them compose with another Transpose (torch's
batch_first=False attention loses two Transposes per layer); (A B)^T of two transposed operands becomes
B^T A^T (one Transpose fewer; TF's lowering of Keras attention); TF's Tensordot (Reshape to a matrix,
MatMul, Reshape back) becomes one batched MatMul. The cancellations of transpose_reshape_cancellation run
in the same fixed point.

Assumes: inference mode (a training-mode Dropout draws its mask in the memory order of its input, which
these moves change); shapes inferred by the IR are right; Reshapes moved are fully static.
Guarantees: the data and shape of every graph output are unchanged; a kept axis is copied (0) in the new
Reshape shapes so the batch size stays free; a Transpose moves only where it then composes.
""".strip()))
