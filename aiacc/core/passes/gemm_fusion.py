"""MatMul + Add into Gemm or aiacc::FusedMatMul, and an activation after them into the fused op."""
from __future__ import annotations

import numpy as np

from aiacc.core.passes.activations import FUSIBLE_ACTIVATIONS, check_activation_fusion, with_activation
from aiacc.core.passes.manager import register_pass
from aiacc.core.passes.rewrite import Const, Op, Opt, RewritePass, Rule, RuleSet, Var


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
    return check_activation_fusion(m, "gemm")


def _rewrite_act(m, b):
    g = m.node("gemm")
    return b.node("FusedGemm", [m["a"], m["b"], m["c"]], with_activation(g, m.root), domain="aiacc",
                  name=g.name).output


gemm_activation = Rule(
    "gemm_activation",
    [Op(FUSIBLE_ACTIVATIONS, Op("Gemm", Var("a"), Var("b"), Opt("c"), name="gemm"), Opt("lo"), Opt("hi"), name="act"),
     Op(FUSIBLE_ACTIVATIONS, Op("FusedGemm", Var("a"), Var("b"), Opt("c"), domain="aiacc", name="gemm"), Opt("lo"),
        Opt("hi"), name="act")],
    _rewrite_act, _check_act, doc="act(Gemm(a, b, c)) is FusedGemm(a, b, c, activation=act).")

# -- batched MatMul (a of rank >= 3, a weight matrix) + bias vector -> FusedMatMul ------------------------
def _bias_vector(c, n, rank):
    """The addend as an [n] vector when it varies only along the last axis of a rank-`rank` product
    (a constant of shape [n], [1, n], [1, 1, n], ... or a scalar), else a reason."""
    if c.ndim > rank:
        return f"addend of rank {c.ndim} broadcasts the rank-{rank} product to a larger rank"
    if any(d != 1 for d in c.shape[:-1]) or (c.ndim and c.shape[-1] not in (1, n)):
        return f"addend of shape {list(c.shape)} is not a bias over the {n} output columns"
    return np.ascontiguousarray(np.broadcast_to(c.reshape(-1), (n,)))


def _check_matmul_bias(m):
    a, w, c = m["a"], m["b"], m["c"]
    if a.shape is None or w.shape is None or c.shape is None:
        return "operand shapes are unknown"
    if len(w.shape) != 2:
        return f"the right operand has rank {len(w.shape)}; FusedMatMul takes a weight matrix"
    if len(a.shape) < 3:
        return "a matrix times a matrix is a Gemm (matmul_add_to_gemm)"
    n = w.shape[1]
    if c.dtype != a.dtype:
        return f"addend dtype {c.dtype} differs from {a.dtype}"
    cc = m.const("c")
    if cc is None:
        if len(c.shape) != 1 or c.shape[0] != n or not isinstance(n, int):
            return f"a non-constant addend of shape {list(c.shape)} is not a bias vector of {n} entries"
        return None
    if not isinstance(n, int):
        return "the number of output columns is unknown"
    why = _bias_vector(cc, n, len(a.shape))
    return why if isinstance(why, str) else None


def _rewrite_matmul_bias(m, b):
    c = m["c"]
    cc = m.const("c")
    if cc is not None and (cc.ndim != 1 or cc.shape[0] != m["b"].shape[1]):
        c = b.const(_bias_vector(cc, m["b"].shape[1], len(m["a"].shape)), "bias")
    return b.node("FusedMatMul", [m["a"], m["b"], c], {}, domain="aiacc", name=m.node("mm").name).output


matmul_bias = Rule("matmul_bias", Op("Add", Op("MatMul", Var("a"), Var("b"), name="mm"), Var("c"), name="add"),
                   _rewrite_matmul_bias, _check_matmul_bias,
                   doc="MatMul(a, W) + bias (a of rank >= 3, W a matrix, bias along the last axis) is "
                       "FusedMatMul(a, W, bias).")


# -- Reshape(MatMul) + bias: the bias moves before the Reshape when it splits only the last axis --------
def _split_last_axis(prod_shape, out_shape):
    """None when a Reshape from prod_shape to out_shape keeps the leading axes and splits the last one, else
    a reason. Both are static enough to tell: the leading dims equal, the trailing product equal."""
    r = len(prod_shape)
    lead_in, lead_out = list(prod_shape[:-1]), list(out_shape[:r - 1])
    if len(out_shape) < r:
        return f"the Reshape to {list(out_shape)} merges axes of the product {list(prod_shape)}"
    if lead_in != lead_out and not _same_but_one_unknown(lead_in, lead_out):
        return f"the Reshape to {list(out_shape)} changes the leading axes of the product {list(prod_shape)}"
    tail = out_shape[r - 1:]
    if not all(isinstance(d, int) for d in tail) or int(np.prod(tail)) != prod_shape[-1]:
        return f"the Reshape to {list(out_shape)} does not split the last axis ({prod_shape[-1]}) of the product"
    return None


def _same_but_one_unknown(a, b):
    """Leading dims equal except one dimension that both sides leave unknown/symbolic (it is then the same
    size: the element counts of the other axes agree)."""
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    return len(diff) == 1 and not isinstance(a[diff[0]], int) and not isinstance(b[diff[0]], int)


def _check_reshape_bias(m):
    a, w = m["a"], m["b"]
    mm, rs = m.node("mm").output, m.node("rs").output
    if w.shape is None or len(w.shape) != 2 or mm.shape is None or rs.shape is None or a.shape is None:
        return "the product's shapes are unknown or the right operand is not a matrix"
    why = _split_last_axis(tuple(mm.shape), tuple(rs.shape))
    if why:
        return why
    cc = m.const("c")
    k = len(rs.shape) - len(mm.shape) + 1  # trailing axes the last axis was split into
    tail = tuple(rs.shape[-k:])
    if cc.ndim > len(rs.shape) or any(d != 1 for d in cc.shape[:max(cc.ndim - k, 0)]):
        return f"addend of shape {list(cc.shape)} varies along axes the Reshape did not split"
    c_tail = (1,) * (k - min(cc.ndim, k)) + tuple(cc.shape[-k:] if cc.ndim else ())
    if any(d not in (1, t) for d, t in zip(c_tail, tail)):
        return f"addend of shape {list(cc.shape)} does not broadcast over {list(tail)}"
    if cc.dtype.name != a.dtype:
        return f"addend dtype {cc.dtype.name} differs from {a.dtype}"


def _rewrite_reshape_bias(m, b):
    mm, rs = m.node("mm"), m.node("rs")
    k = len(rs.output.shape) - len(mm.output.shape) + 1
    tail = tuple(rs.output.shape[-k:])
    cc = m.const("c")
    c_tail = cc.reshape(cc.shape[-k:] if cc.ndim >= k else cc.shape)
    vec = np.ascontiguousarray(np.broadcast_to(c_tail, tail)).reshape(-1)
    a = m["a"]
    if len(a.shape) == 2:
        y = b.op("Gemm", a, m["b"], b.const(vec, "bias"), name=mm.name)
    else:
        y = b.node("FusedMatMul", [a, m["b"], b.const(vec, "bias")], {}, domain="aiacc", name=mm.name).output
    return b.node("Reshape", [y, rs.inputs[1]], dict(rs.attrs), name=rs.name).output


reshape_bias = Rule(
    "matmul_reshape_bias",
    Op("Add", Op("Reshape", Op("MatMul", Var("a"), Var("b"), name="mm"), Var(), name="rs"), Const("c"), name="add"),
    _rewrite_reshape_bias, _check_reshape_bias,
    doc="Reshape(MatMul(a, W)) + c, where the Reshape splits the last axis and c varies only along the split "
        "axes, is Reshape(Gemm or FusedMatMul(a, W, c flattened)) (Keras einsum dense layers).")


# -- Reshape(MatMul(Reshape(x) to a matrix, W) [+ bias]) back to x's leading axes: one batched product -----
def _unflatten_reason(x, flat, out, w):
    """None when `flat` is x of rank >= 3 flattened to [prod(leading), K] and `out` the [.., N] product
    reshaped back to x's leading axes, else a reason."""
    if x.shape is None or flat.shape is None or out.shape is None or w.shape is None:
        return "shapes are unknown"
    if len(x.shape) < 3:
        return f"the flattened operand has rank {len(x.shape)}; a matrix product is already a Gemm"
    if len(w.shape) != 2 or len(flat.shape) != 2:
        return "the product is not a matrix times a weight matrix"
    lead = list(x.shape[:-1])
    if flat.shape[1] != x.shape[-1] or not all(isinstance(d, int) for d in lead + [flat.shape[0]]) \
            or int(np.prod(lead)) != flat.shape[0]:
        return f"the Reshape to {list(flat.shape)} does not merge only the leading axes of {list(x.shape)}"
    if list(out.shape) != lead + [w.shape[1]]:
        return f"the Reshape to {list(out.shape)} does not restore the leading axes {lead} of the operand"
    return None


def _check_unflatten_bias(m):
    why = _unflatten_reason(m["x"], m.node("flat").output, m.root.output, m["b"])
    if why:
        return why
    c, n = m["c"], m["b"].shape[1]
    if c.dtype != m["x"].dtype:
        return f"addend dtype {c.dtype} differs from {m['x'].dtype}"
    cc = m.const("c")
    if cc is None:
        if c.shape is None or list(c.shape) != [n]:
            return f"a non-constant addend of shape {c.shape} is not a bias vector of {n} entries"
        return None
    why = _bias_vector(cc, n, 2)
    return why if isinstance(why, str) else None


def _rewrite_unflatten_bias(m, b):
    c = m["c"]
    cc = m.const("c")
    if cc is not None and (cc.ndim != 1 or cc.shape[0] != m["b"].shape[1]):
        c = b.const(_bias_vector(cc, m["b"].shape[1], 2), "bias")
    return b.node("FusedMatMul", [m["x"], m["b"], c], {}, domain="aiacc", name=m.node("mm").name).output


unflatten_bias = Rule(
    "flattened_matmul_bias",
    Op("Reshape", Op("Add", Op("MatMul", Op("Reshape", Var("x"), Var(), name="flat"), Var("b"), name="mm"),
                     Var("c"), name="add"), Var(), name="rs"),
    _rewrite_unflatten_bias, _check_unflatten_bias,
    doc="Reshape(MatMul(Reshape(x, [M, K]), W) + bias, x's leading axes + [N]) (x of rank >= 3: GPT-2's "
        "Conv1D, torch.addmm on x.view(-1, K)) is FusedMatMul(x, W, bias): one batched product, whose "
        "activation then fuses too.")


def _check_unflatten(m):
    return _unflatten_reason(m["x"], m.node("flat").output, m.root.output, m["b"])


unflatten = Rule(
    "flattened_matmul",
    Op("Reshape", Op("MatMul", Op("Reshape", Var("x"), Var(), name="flat"), Var("b"), name="mm"), Var(), name="rs"),
    lambda m, b: b.op("MatMul", m["x"], m["b"], name=m.node("mm").name), _check_unflatten,
    doc="Reshape(MatMul(Reshape(x, [M, K]), W), x's leading axes + [N]) (x of rank >= 3) is MatMul(x, W).")


# -- (Fused)MatMul + activation -> FusedMatMul(activation) ------------------------------------------------
def _check_matmul_act(m):
    reason = check_activation_fusion(m, "mm")
    if reason:
        return reason
    w = m["b"]
    if w.shape is None or len(w.shape) != 2:
        return "the right operand is not a matrix"


def _rewrite_matmul_act(m, b):
    mm = m.node("mm")
    return b.node("FusedMatMul", [m["a"], m["b"], m.get("c")], with_activation(mm, m.root), domain="aiacc",
                  name=mm.name).output


matmul_activation = Rule(
    "matmul_activation",
    [Op(FUSIBLE_ACTIVATIONS, Op("FusedMatMul", Var("a"), Var("b"), Opt("c"), domain="aiacc", name="mm"), Opt("lo"),
        Opt("hi"), name="act"),
     Op(FUSIBLE_ACTIVATIONS, Op("MatMul", Var("a"), Var("b"), name="mm"), Opt("lo"), Opt("hi"), name="act")],
    _rewrite_matmul_act, _check_matmul_act,
    doc="act(FusedMatMul(a, W, bias)) and act(MatMul(a, W)) are FusedMatMul(a, W, bias, activation=act).")

RULES = RuleSet([unflatten_bias, unflatten, matmul_add, matmul_bias, reshape_bias, gemm_activation,
                 matmul_activation])

register_pass(RewritePass("gemm_fusion", RULES, level=2, doc="""
Turn MatMul + Add into Gemm when both operands are matrices and the addend broadcasts to the product; a
batched product (left operand of rank >= 3, e.g. BERT's [B, S, H] x [H, O]) plus a bias along its last
axis into aiacc::FusedMatMul (also when a Reshape that splits the last axis sits between, as Keras einsum
dense layers emit it, and when the product runs on the operand flattened to a matrix and reshaped back, as
GPT-2's Conv1D does); fuse a following activation into aiacc::FusedGemm / aiacc::FusedMatMul.

Assumes: the MatMul (Gemm) output is read only by the Add (activation).
Guarantees: the same numerics as the separate ops (the fused kernels run the very kernels they replace);
products whose right operand is not a matrix (attention scores) and addends that vary along other axes
are left alone.
""".strip()))
