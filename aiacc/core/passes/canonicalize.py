"""Canonicalization: one form for the idioms different importers use for the same computation.

Four importers translating the same architecture give four different, equally correct graphs: TF's Dense is
MatMul + BiasAdd where torch's Linear is Gemm, Keras freezes BatchNorm into Mul + Add, Keras' Tensordot
flattens a 3-D input around a 2-D MatMul, TF's Flatten runs in NHWC, Caffe's pooling rounds up... This
pass rewrites all of them into one form, so that `canonical_text` of the results can be compared:

    layout      a Transpose right after a graph input (TF's NHWC -> NCHW) or right before a graph output
                becomes part of the input/output layout: the input takes the transposed type and the
                canonical graph is fed NCHW (recorded in graph.meta["canonical_layout"])
    cleanup     Identity / inference Dropout removed, constants folded (e.g. torch's Transpose of a weight),
                common subexpressions merged, dead code removed
    linear      Reshape(x, [-1, K]) -> MatMul(W) -> Reshape(back) (Tensordot) is MatMul(x, W);
                Transpose -> flattening Reshape -> MatMul(const W) is Flatten -> MatMul(W with permuted rows);
                a 2-D MatMul(x, const W) + Add(const b) is Gemm(x, W^T, b, transB=1) (W as [out, in]);
                Gemm(transB=0) with a constant B is Gemm(transB=1) with B^T
    conv        Conv + Add(per-channel or scalar constant) is Conv with that bias (added to its own constant
                bias); a zero Pad on spatial axes before a Conv goes into the Conv's pads (a Pad read by
                other nodes too stays for them)
    batchnorm   inference BatchNormalization with constant parameters, and a per-channel Mul + Add on a
                4-D tensor (Keras' frozen BatchNorm), are both BatchNormalization in affine form:
                scale = gamma / sqrt(var + eps), bias = beta - mean * scale, mean 0, var 1, epsilon 0
    pooling     ReduceMean over the spatial axes of a 4-D tensor (keepdims) and an AveragePool covering
                the whole input are GlobalAveragePool; ceil_mode=1 that changes no output size is 0
    reshapes    Reshape / Squeeze / Flatten producing [d0, d1*d2*...] is Flatten(axis=1); a Reshape that
                changes nothing is removed; Reshape targets are written with 0 for copied dims and -1 for the
                one symbolic dim
    arithmetic  the constant operand of Add/Mul/Max/Min goes second; Div by a float constant is Mul by its
                reciprocal; GELU and LayerNorm written out (including Keras' forms) become Gelu and
                LayerNormalization
    attributes  negative axes made positive; attributes equal to their schema default dropped (Conv and
                pooling pads/strides/dilations of all zeros/ones included)

Each idiom is a rule on the rewrite engine (pattern, check with a reason, rewrite), grouped into the rule sets
of `PHASES`, which every round runs in order after the cleanup passes, to a fixed point; the Conv rules are
conv_fusion's and pad_folding's, GELU and LayerNorm the recognizers'. `RULES.explain(graph, node)` says why
each rule rooted at a node's op does not fire there. The layout step and the attribute normalization (run
once at the end) are graph-wide, not patterns.

Optionally (`input_shapes=`) symbolic input dims are specialized to concrete sizes and every type re-inferred,
so an importer that keeps the batch symbolic and one that fixes it compare equal.

Assumes: inference mode (BatchNorm statistics are constants). Guarantees: the same function up to float
rounding (reciprocals, folded BatchNorm, transposed weights); the input/output layout changes recorded in
graph.meta["canonical_layout"] are the only interface change.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from aiacc.core.ir import Graph, Node, TensorType, Value, const_value
from aiacc.core.passes import conv_fusion, gelu, layernorm, pad_folding
from aiacc.core.passes.manager import Pass, PassContext, get_pass, register_pass
from aiacc.core.passes.rewrite import Builder, Const, Match, Op, Opt, Rule, RuleSet, Var

FLOATS = ("float16", "float32", "float64")


# ------------------------------------------------------------------------------------------------ helpers
def _shape(v: Value | None):
    return None if v is None or v.type is None else v.shape


def _static(v: Value | None):
    s = _shape(v)
    return tuple(s) if s is not None and all(isinstance(d, int) for d in s) else None


def _replace(g: Graph, node: Node, new: Value) -> None:
    """Readers of node's single output read `new`; node is erased when unused (graph outputs keep names)."""
    old = node.output
    name = old.name
    was_output = old.is_graph_output
    old.replace_all_uses_with(new)
    if not old.uses and not old.is_graph_output:
        g.erase(node)
        if was_output and new.producer is not None and not g.has_value(name) and \
                sum(o is new for o in g.outputs) == 1:
            new.name = name


def _same_dim(a, b) -> bool:
    return a == b and a is not None


# ------------------------------------------------------------------------------------------ shapes/layout
def specialize_shapes(g: Graph, input_shapes: Mapping[str, Sequence[int]] | Sequence[Sequence[int]]) -> None:
    """Give graph inputs concrete shapes (by name, or positionally) and re-infer every node's output types."""
    from aiacc.core.ops import infer_node

    if not isinstance(input_shapes, Mapping):
        input_shapes = {v.name: s for v, s in zip(g.inputs, input_shapes)}
    for v in g.inputs:
        if v.name in input_shapes:
            v.type = TensorType(v.dtype, tuple(int(d) for d in input_shapes[v.name]))
    for node in g:
        if node.schema is None:
            continue
        for v, t in zip(node.outputs, infer_node(node)):
            if t is not None:
                v.type = t


def _io_layout(g: Graph) -> int:
    """Transposes at graph inputs/outputs become the canonical graph's layout."""
    n = 0
    layout = g.meta.setdefault("canonical_layout", {})
    for v in g.inputs:
        users = v.users()
        if not users or v.is_graph_output or any(u.op != "Transpose" or u.domain for u in users):
            continue
        perms = {tuple(u.attr("perm") or ()) for u in users}
        if len(perms) != 1 or v.shape is None or len(next(iter(perms))) != len(v.shape):
            continue
        perm = next(iter(perms))
        v.type = TensorType(v.dtype, tuple(v.shape[p] for p in perm))
        for u in users:
            _replace(g, u, v)
        layout[v.name] = {"input_perm": list(perm)}  # canonical input = framework input.transpose(perm)
        n += 1
    for i, o in enumerate(list(g.outputs)):
        p = o.producer
        if p is None or p.op != "Transpose" or p.domain or p.inputs[0] is None:
            continue
        src = p.inputs[0]
        if src.producer is None or src.is_graph_output:
            continue
        perm = [int(a) for a in (p.attr("perm") or range(len(src.shape or ()))[::-1])]
        inv = [perm.index(k) for k in range(len(perm))]
        g.outputs[i] = src
        if not o.uses and not o.is_graph_output:
            name = o.name
            g.erase(p)
            src.name = name if not g.has_value(name) else src.name
        layout[src.name] = {"output_perm": inv}  # canonical output = framework output.transpose(inv)
        n += 1
    return n


# ------------------------------------------------------------------------------------------------- rules
# Every rule below is a pattern, a check that says why it does not fire, and a rewrite (aiacc.core.passes.
# rewrite). Patterns fix the operand order (commute=False): constants are moved second first, and the
# canonical form is stated for that order. A rule that changes its root node in place (an attribute, an
# input) returns the root's own outputs, which the engine counts as a rewrite that replaces nothing.
def _in_place(m: Match):
    return m.root.outputs


# --------------------------------------------------------------------------------------------- arithmetic
def _check_commute(m: Match):
    if const_value(m["b"]) is not None:
        return "both operands are constants (constant folding's job)"


def _rewrite_commute(m: Match, b: Builder):
    node = m.root
    node.set_input(0, m["b"])
    node.set_input(1, m["a"])
    return _in_place(m)


commute_constants = Rule(
    "commute_constants", Op(("Add", "Mul", "Max", "Min"), Const("a"), Var("b"), commute=False),
    _rewrite_commute, _check_commute, doc="c op x is x op c for commutative Add, Mul, Max and Min.")


def _check_div(m: Match):
    x, cv = m["x"], m.const("c")
    if cv.dtype.name not in FLOATS:
        return f"the divisor is {cv.dtype.name}, not floating point (integer division does not invert)"
    if x.dtype != cv.dtype.name:
        return f"the dividend is {x.dtype}, the divisor {cv.dtype.name}"
    if not np.all(cv != 0):
        return "the divisor has a zero"


def _rewrite_div(m: Match, b: Builder):
    cv = m.const("c")
    recip = b.const((1.0 / cv.astype(np.float64)).astype(cv.dtype), m["c"].name + "_reciprocal")
    return b.op("Mul", m["x"], recip, name=m.root.name)


div_by_constant = Rule("div_by_constant", Op("Div", Var("x"), Const("c")), _rewrite_div, _check_div,
                       doc="x / c (float constant without zeros) is x * (1 / c).")

ARITHMETIC = RuleSet([commute_constants, div_by_constant])


# ------------------------------------------------------------------------------------------------- linear
def _check_tensordot(m: Match):
    x, w, mm, r2 = m["x"], m["w"], m.node("mm"), m.root
    if w.shape is None or len(w.shape) != 2:
        return "the weight is not a matrix of known shape"
    xs, ms, ys = _shape(x), _shape(mm.output), _shape(r2.output)
    if xs is None or ms is None or len(xs) < 3:
        return "the flattened value is not of known rank >= 3"
    if ys is None or len(ys) != len(xs) or not all(_same_dim(a, b) for a, b in zip(xs[:-1], ys[:-1])):
        return f"the outer Reshape to {ys} does not restore the leading axes of {list(xs)}"
    if ys[-1] != w.shape[1] or xs[-1] != w.shape[0] or len(ms) != 2 or ms[1] != w.shape[1]:
        return f"{list(xs)} x {list(w.shape)} -> {ms} -> {ys} is not a row-wise product with the weight"


tensordot = Rule(
    "tensordot",
    Op("Reshape", Op("MatMul", Op("Reshape", Var("x"), Opt(), name="r1", shared=True), Const("w"), name="mm",
                     commute=False), Opt(), name="r2"),
    lambda m, b: b.op("MatMul", m["x"], m["w"], name=m.root.name), _check_tensordot,
    doc="Reshape(MatMul(Reshape(x, [-1, K]), W), lead + [out]) (Keras' Tensordot) is MatMul(x, W).")


def _flatten_readers(m: Match):
    """The MatMuls reading the flattened value, or why it is not read only by MatMuls with constant weights."""
    out = m.root.output
    users = out.users()
    if not users or out.is_graph_output:
        return "the flattened value is not read only by nodes"
    for u in users:
        if u.op != "MatMul" or u.domain or u.inputs[0] is not out or const_value(u.inputs[1]) is None \
                or u.inputs[1].shape is None or len(u.inputs[1].shape) != 2:
            return f"{u.qualified_op}<{u.name}> reading it is not a MatMul by a constant matrix"
    return users


def _check_transpose_flatten(m: Match):
    xs, perm = _static(m["x"]), m.node("t").attr("perm")
    if xs is None or len(xs) < 3:
        return "the transposed value is not of static rank >= 3"
    if perm is None:
        return "the Transpose has no explicit perm"
    if int(perm[0]) != 0:
        return "the Transpose moves the batch axis"
    fs = _shape(m.root.output)
    if fs is None or len(fs) != 2 or fs[1] != int(np.prod(xs[1:])) or fs[0] != xs[0]:
        return f"{fs} is not the transposed value flattened to rows"
    users = _flatten_readers(m)
    return users if isinstance(users, str) else None


def _rewrite_transpose_flatten(m: Match, b: Builder):
    """Flatten x as it is; each reading MatMul gets its weight rows permuted in place."""
    x = m["x"]
    xs = _static(x)
    perm = [int(p) for p in m.node("t").attr("perm")]
    ts = [xs[p] for p in perm]
    inv = [perm.index(i) for i in range(len(perm))]
    feat = int(np.prod(xs[1:]))
    flat_x = b.op("Flatten", x, axis=1, name=m.root.name)
    for u in _flatten_readers(m):
        wv = const_value(u.inputs[1])
        wr = wv.reshape(ts[1:] + [wv.shape[1]])
        w2 = np.ascontiguousarray(wr.transpose([inv[i] - 1 for i in range(1, len(xs))] + [len(xs) - 1]))
        u.set_input(0, flat_x)
        u.set_input(1, b.const(w2.reshape(feat, wv.shape[1]), u.inputs[1].name + "_rows"))
    return flat_x


transpose_flatten_matmul = Rule(
    "transpose_flatten_matmul", Op(("Reshape", "Flatten"), Op("Transpose", Var("x"), name="t"), Opt(), name="flat"),
    _rewrite_transpose_flatten, _check_transpose_flatten,
    doc="Transpose(x, perm) -> flatten to [N, F] -> MatMul(const W) is Flatten(x) -> MatMul(W with its rows "
        "permuted) (TF's Flatten reads NHWC; the canonical Flatten reads NCHW).")

LINEAR = RuleSet([tensordot, transpose_flatten_matmul])


# ----------------------------------------------------------------------------------------------- reshapes
def _check_noop_reshape(m: Match):
    xs, ys = _shape(m["x"]), _shape(m.root.output)
    if xs is None or ys is None:
        return "the input or output shape is unknown"
    if len(xs) != len(ys) or not all(_same_dim(a, b) for a, b in zip(xs, ys)):
        return f"{m.root.op} {list(xs)} -> {list(ys)} changes the shape"


noop_reshape = Rule("noop_reshape", Op(("Reshape", "Squeeze"), Var("x"), Opt(), name="r"),
                    lambda m, b: m["x"], _check_noop_reshape,
                    doc="A Reshape or Squeeze whose output has its input's shape is its input.")


def _check_flatten_rows(m: Match):
    node, x = m.root, m["x"]
    xs, ys = _shape(x), _shape(node.output)
    if xs is None or ys is None:
        return "the input or output shape is unknown"
    if len(ys) != 2 or len(xs) < 2 or not _same_dim(xs[0], ys[0]):
        return f"{list(xs)} -> {list(ys)} does not keep the first axis and flatten the rest"
    rest = xs[1:]
    if not all(isinstance(d, int) for d in rest) or ys[1] != int(np.prod(rest)):
        return f"{list(xs)} -> {list(ys)} does not flatten all axes after the first"
    if node.op == "Flatten" and int(node.attr("axis") if node.attr("axis") is not None else 1) % len(xs) == 1:
        return "already Flatten(axis=1)"


def _rewrite_flatten_rows(m: Match, b: Builder):
    x = m["x"]
    return x if len(x.shape) == 2 else b.op("Flatten", x, axis=1, name=m.root.name)


flatten_rows = Rule("flatten_rows", Op(("Reshape", "Squeeze", "Flatten"), Var("x"), Opt(), name="r"),
                    _rewrite_flatten_rows, _check_flatten_rows,
                    doc="Reshape / Squeeze / Flatten giving [d0, d1*d2*...] is Flatten(axis=1) (its input when "
                        "that is already a matrix).")


def _reshape_target(m: Match):
    """The canonical target of a Reshape: 0 for copied dims, concrete sizes, -1 for one symbolic dim."""
    xs, ys = _shape(m["x"]), _shape(m.root.output)
    new = []
    for k, d in enumerate(ys):
        if k < len(xs) and _same_dim(xs[k], d):
            new.append(0)
        elif isinstance(d, int):
            new.append(d)
        else:
            new.append(-1)
    return new


def _check_reshape_target(m: Match):
    if _shape(m["x"]) is None or _shape(m.root.output) is None:
        return "the input or output shape is unknown"
    new = _reshape_target(m)
    if new.count(-1) > 1:
        return "more than one symbolic dimension is new"
    if m.root.attr("allowzero"):
        return "allowzero=1 (0 would mean a zero-sized dim)"
    if [int(t) for t in m.const("shape").reshape(-1)] == new:
        return "the target is already canonical"


def _rewrite_reshape_target(m: Match, b: Builder):
    m.root.set_input(1, b.const(np.asarray(_reshape_target(m), dtype=np.int64), "reshape_shape"))
    return _in_place(m)


reshape_target = Rule("reshape_target", Op("Reshape", Var("x"), Const("shape"), name="r"), _rewrite_reshape_target,
                      _check_reshape_target, doc="Reshape targets are written with 0 for copied dims, concrete sizes "
                                                 "and -1 for the one symbolic dim.")

RESHAPES = RuleSet([noop_reshape, flatten_rows, reshape_target])


# --------------------------------------------------------------------------------------------------- gemm
def _check_matmul_add(m: Match):
    wv, xs, bv = m.const("w"), _shape(m["x"]), m.const("b")
    if wv.ndim != 2:
        return f"the weight has rank {wv.ndim}, not 2"
    if xs is None or len(xs) != 2:
        return "the input is not a matrix of known rank"
    if bv.dtype != wv.dtype or bv.size != wv.shape[1] or bv.ndim > 2 or (bv.ndim == 2 and bv.shape[0] != 1):
        return f"the addend of shape {list(bv.shape)} is not a bias over the {wv.shape[1]} output columns"


def _rewrite_matmul_add(m: Match, b: Builder):
    wt = b.const(np.ascontiguousarray(m.const("w").T), m["w"].name + "_t")
    bias = b.const(m.const("b").reshape(-1), m["b"].name + "_flat")
    return b.op("Gemm", m["x"], wt, bias, transB=1, name=m.root.name)


matmul_add_to_gemm = Rule(
    "matmul_add_to_gemm", Op("Add", Op("MatMul", Var("x"), Const("w"), name="mm", commute=False), Const("b"),
                             commute=False),
    _rewrite_matmul_add, _check_matmul_add,
    doc="A 2-D MatMul(x, const W) + const b is Gemm(x, W^T, b, transB=1) (W as [out, in]).")


def _rewrite_trans_b(m: Match, b: Builder):
    m.root.set_input(1, b.const(np.ascontiguousarray(m.const("b").T), m["b"].name + "_t"))
    m.root.attrs["transB"] = 1
    return _in_place(m)


gemm_trans_b = Rule("gemm_trans_b", Op("Gemm", Var("a"), Const("b"), Opt("c"), name="gemm"), _rewrite_trans_b,
                    lambda m: "already transB=1" if m.root.attr("transB") else None,
                    doc="Gemm(transB=0) with a constant B is Gemm(transB=1) with B^T.")

GEMM = RuleSet([matmul_add_to_gemm, gemm_trans_b])

# --------------------------------------------------------------------------------------------------- conv
# conv_fusion's and pad_folding's own rules: Conv + per-channel constant Add is Conv with that bias; a zero
# Pad of the spatial axes goes into the Conv's pads
CONV = RuleSet([conv_fusion.conv_add_bias, pad_folding.RULES["pad_into_conv"]])


# ---------------------------------------------------------------------------------------------- batchnorm
def _per_channel(v: Value, c: int, rank: int) -> np.ndarray | None:
    """The constant as a [C] vector when it broadcasts only over axis 1 of a rank-`rank` tensor."""
    a = const_value(v)
    if a is None:
        return None
    s = list(a.shape)
    while s and s[0] == 1 and len(s) > rank - 1:
        s = s[1:]
    if len(s) != rank - 1 or s[0] != c or any(d != 1 for d in s[1:]):
        return None
    return a.reshape(c)


def _affine_bn(b: Builder, x: Value, scale: np.ndarray, bias: np.ndarray, dtype) -> Value:
    """BatchNormalization(x) in affine form: scale, bias, mean 0, var 1, epsilon 0."""
    c = scale.shape[0]
    params = [b.const(scale.astype(dtype), "bn_scale"), b.const(bias.astype(dtype), "bn_bias"),
              b.const(np.zeros(c, dtype), "bn_mean"), b.const(np.ones(c, dtype), "bn_var")]
    return b.op("BatchNormalization", x, *params, epsilon=0.0, name=b.anchor.name)


def _check_bn(m: Match):
    node = m.root
    if len(node.outputs) != 1 or node.attr("training_mode"):
        return "training-mode BatchNormalization (batch statistics)"
    mean, var = m.const("mean"), m.const("var")
    if float(node.attr("epsilon")) == 0.0 and not np.any(mean) and np.all(var == 1):
        return "already in affine form"


def _rewrite_bn(m: Match, b: Builder):
    gamma, beta, mean, var = (m.const(k).astype(np.float64) for k in ("gamma", "beta", "mean", "var"))
    scale = gamma / np.sqrt(var + float(m.root.attr("epsilon")))
    return _affine_bn(b, m["x"], scale, beta - mean * scale, m.const("gamma").dtype)


batchnorm_affine = Rule(
    "batchnorm_affine",
    Op("BatchNormalization", Var("x"), Const("gamma"), Const("beta"), Const("mean"), Const("var"), name="bn"),
    _rewrite_bn, _check_bn,
    doc="Inference BatchNormalization with constant parameters is BatchNormalization in affine form: scale = "
        "gamma / sqrt(var + eps), bias = beta - mean * scale, mean 0, var 1, epsilon 0.")


def _channels(m: Match):
    x = m["x"]
    xs = _shape(x)
    if xs is None or len(xs) != 4 or not isinstance(xs[1], int) or x.dtype not in FLOATS:
        return None
    return xs[1]


def _check_mul_add(m: Match):
    c = _channels(m)
    if c is None:
        return "the input is not a float 4-D tensor with a known channel count"
    if _per_channel(m["s"], c, 4) is None:
        return "the factor is not per-channel"
    if _per_channel(m["t"], c, 4) is None:
        return "the addend is not per-channel"
    if _shape(m.root.output) != _shape(m["x"]):
        return "the Add broadcasts beyond the input's shape"


def _rewrite_mul_add(m: Match, b: Builder):
    c, x = _channels(m), m["x"]
    scale, bias = _per_channel(m["s"], c, 4), _per_channel(m["t"], c, 4)
    return _affine_bn(b, x, scale.astype(np.float64), bias.astype(np.float64), np.dtype(x.dtype))


mul_add_to_batchnorm = Rule(
    "mul_add_to_batchnorm",
    Op("Add", Op("Mul", Var("x"), Const("s"), name="mul", commute=False), Const("t"), commute=False),
    _rewrite_mul_add, _check_mul_add,
    doc="A per-channel Mul + Add on a 4-D tensor (Keras' frozen BatchNorm) is BatchNormalization in affine form.")

BATCHNORM = RuleSet([batchnorm_affine, mul_add_to_batchnorm])


# ------------------------------------------------------------------------------------------------ pooling
def _image(m: Match):
    xs = _shape(m["x"])
    return xs if xs is not None and len(xs) == 4 else None


def _check_reduce_mean(m: Match):
    if _image(m) is None:
        return "the input is not a 4-D tensor"
    axes = m.root.attr("axes")
    if axes is None and m["axes"] is not None:
        axes = const_value(m["axes"])
    if axes is None:
        return "the reduced axes are not known"
    if sorted(int(a) % 4 for a in np.asarray(axes).reshape(-1)) != [2, 3]:
        return "the reduced axes are not the spatial axes 2 and 3"


def _rewrite_reduce_mean(m: Match, b: Builder):
    gap = b.op("GlobalAveragePool", m["x"], name=m.root.name)
    keep = m.root.attr("keepdims")
    return gap if keep is None or keep else b.op("Flatten", gap, axis=1, name=m.root.name)


def _check_average_pool(m: Match):
    xs, node = _image(m), m.root
    if xs is None:
        return "the input is not a 4-D tensor"
    k = node.attr("kernel_shape")
    if k is None or not all(isinstance(d, int) for d in xs[2:]) or list(k) != list(xs[2:]):
        return f"the kernel {k} does not cover the input's spatial size {list(xs[2:])}"
    if any(node.attr("pads") or [0, 0, 0, 0]) or (node.attr("auto_pad") or "NOTSET") != "NOTSET":
        return "the pooling pads"


global_pool = [
    Rule("reduce_mean_global_pool", Op("ReduceMean", Var("x"), Opt("axes"), name="mean"), _rewrite_reduce_mean,
         _check_reduce_mean, doc="ReduceMean over the spatial axes of a 4-D tensor is GlobalAveragePool "
                                 "(then Flatten when keepdims=0)."),
    Rule("average_pool_global_pool", Op("AveragePool", Var("x"), name="pool"),
         lambda m, b: b.op("GlobalAveragePool", m["x"], name=m.root.name), _check_average_pool,
         doc="An AveragePool covering the whole input is GlobalAveragePool.")]


def _check_ceil_mode(m: Match):
    node = m.root
    if not node.attr("ceil_mode"):
        return "ceil_mode is 0"
    xs, k = _static(m["x"]), node.attr("kernel_shape")
    if xs is None or k is None or (node.attr("auto_pad") or "NOTSET") != "NOTSET":
        return "the input shape or the kernel is unknown, or auto_pad is set"
    r = len(k)
    strides = node.attr("strides") or [1] * r
    dil = node.attr("dilations") or [1] * r
    pads = node.attr("pads") or [0] * (2 * r)
    for i in range(r):
        if (xs[2 + i] + pads[i] + pads[i + r] - ((k[i] - 1) * dil[i] + 1)) % strides[i]:
            return f"rounding up changes the output size of spatial axis {i}"


def _rewrite_ceil_mode(m: Match, b: Builder):
    m.root.attrs["ceil_mode"] = 0
    return _in_place(m)


ceil_mode = Rule("ceil_mode", Op(("MaxPool", "AveragePool"), Var("x"), name="pool"), _rewrite_ceil_mode,
                 _check_ceil_mode, doc="ceil_mode=1 that changes no output size is ceil_mode=0.")

POOLING = RuleSet(global_pool + [ceil_mode])

# ------------------------------------------------------------------------------------- recognized forms
# GELU and LayerNorm written out: the recognizers' own rules (their patterns include TF's erfc GELU and the
# Keras/TF LayerNormalization scale-shift form)
RECOGNIZED = RuleSet(gelu.RULES + [layernorm.RULE, layernorm.TF_RULE])

#: the rule sets in the order each round runs them (rewrites of one set can enable or block another's:
#: a MatMul is flattened NCHW before it becomes a Gemm)
PHASES: tuple[tuple[str, RuleSet], ...] = (
    ("arithmetic", ARITHMETIC), ("linear", LINEAR), ("reshapes", RESHAPES), ("gemm", GEMM), ("conv", CONV),
    ("batchnorm", BATCHNORM), ("pooling", POOLING), ("recognized", RECOGNIZED))

#: every rule of canonicalize, for `RULES.explain(graph, node)` and `RULES["tensordot"].explain(...)`
RULES = sum((rs for _, rs in PHASES[1:]), PHASES[0][1])


# --------------------------------------------------------------------------------------------- attributes
_AXIS_OPS = {"Softmax", "LogSoftmax", "LayerNormalization", "Flatten", "Concat", "Gather", "Split", "Hardmax"}


def _normalize_attrs(g: Graph) -> int:
    n = 0
    for node in g:
        schema = node.schema
        if schema is None:
            continue
        x = node.inputs[0] if node.inputs else None
        rank = len(x.shape) if x is not None and x.shape is not None else None
        if node.op in _AXIS_OPS and "axis" in node.attrs and rank is not None and node.attrs["axis"] < 0:
            r = rank + 1 if node.op == "Flatten" else rank
            node.attrs["axis"] = int(node.attrs["axis"]) + r
            n += 1
        if node.op in ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"):
            for key, neutral in (("pads", 0), ("strides", 1), ("dilations", 1)):
                v = node.attrs.get(key)
                if v is not None and all(int(a) == neutral for a in v):
                    del node.attrs[key]
                    n += 1
            if node.op == "Conv" and "kernel_shape" not in node.attrs and node.inputs[1].shape is not None:
                node.attrs["kernel_shape"] = list(node.inputs[1].shape[2:])
                n += 1
        for key in list(node.attrs):
            spec = schema.attrs.get(key)
            if spec is None or spec.default is None:
                continue
            v, d = node.attrs[key], spec.default
            if isinstance(v, (list, tuple)) and isinstance(d, (list, tuple)):
                same = list(v) == list(d)
            elif isinstance(v, float) or isinstance(d, float):  # at float32 precision (protobuf fields)
                same = not isinstance(v, (list, tuple, np.ndarray, str)) and np.float32(v) == np.float32(d)
            else:
                same = not isinstance(v, (list, tuple, np.ndarray)) and v == d
            if same:
                del node.attrs[key]
                n += 1
    return n


# ----------------------------------------------------------------------------------------------- the pass
CLEANUP = ("identity_removal", "constant_folding", "cse", "dce")


def canonicalize(graph: Graph, *, input_shapes=None, ctx: PassContext | None = None) -> int:
    """Rewrite `graph` in place into the canonical form (see the module docstring); returns the number of
    rewrites. `input_shapes` ({input name: shape} or a list in input order, in the canonical layout, e.g.
NCHW for a TF image input) specializes symbolic dims."""
    ctx = ctx or PassContext("inference", 0)
    total = _io_layout(graph)
    if input_shapes is not None:  # canonical (post-layout) shapes
        specialize_shapes(graph, input_shapes)
    cleanup = [get_pass(n) for n in CLEANUP]
    for _ in range(20):  # to a fixed point (each round shrinks the graph or normalizes a node for good)
        changed = 0
        for p in cleanup:
            changed += int(p.run(graph, PassContext(ctx.mode, ctx.level)) or 0)
        for _name, rules in PHASES:
            changed += rules.run(graph, ctx)
        total += changed
        if not changed:
            break
    total += _normalize_attrs(graph)
    graph.remove_unused_initializers()
    return total


class Canonicalize(Pass):
    """Rewrite importer idioms into one canonical form (module docstring of aiacc.core.passes.canonicalize).

    Not part of any optimization level: run it by name (`run_passes(g, passes=["canonicalize"])`) or call
    `canonicalize(graph)`; the cross-framework tests apply it after every import before comparing IR text.

    Assumes: inference mode (BatchNorm statistics are constants).
    Guarantees: the same function up to float rounding; Transposes at graph inputs/outputs become the graph's
    layout, recorded in graph.meta["canonical_layout"] (the only interface change).
    """

    name = "canonicalize"
    level = 3  # the level it would belong to; it is not in PIPELINE, so no level runs it
    modes = ("inference",)

    def run(self, graph: Graph, ctx: PassContext) -> int:
        return canonicalize(graph, ctx=ctx)


register_pass(Canonicalize)
