"""BatchNormalization folded into the Conv / ConvTranspose / Gemm / MatMul that feeds it."""
from __future__ import annotations

import numpy as np

from aiacc.core.passes.manager import register_pass
from aiacc.core.passes.rewrite import Const, Op, Opt, RewritePass, Rule, Var


def _bn_params(m):
    """(inv, shift) in float64: BN(y) = y * inv + shift."""
    eps = float(m.root.attr("epsilon", 1e-5))
    scale, bias, mean, var = (m.const(k).astype(np.float64) for k in ("scale", "bias", "mean", "var"))
    inv = scale / np.sqrt(var + eps)
    return inv, bias - mean * inv


def _check(m):
    bn, lin = m.root, m.node("lin")
    if bn.attr("training_mode", 0):
        return f"BatchNormalization<{bn.name}> is in training mode (it normalizes with batch statistics)"
    for extra in bn.outputs[1:]:
        if extra.uses or extra.is_graph_output:
            return f"BatchNormalization<{bn.name}> running statistics output %{extra.name} is read"
    w = m.const("w")
    if w is None:
        return f"the weight %{m['w'].name} of {lin.qualified_op}<{lin.name}> is not a constant"
    if w.dtype.kind != "f":
        return f"the weight of {lin.name} is {w.dtype.name}, not floating point"
    if m["b"] is not None and m.const("b") is None:
        return f"the bias %{m['b'].name} of {lin.name} is not a constant"
    out = lin.output
    if out.shape is None:
        return f"the rank of %{out.name} is unknown"
    c = m.const("scale").size
    if lin.op == "Conv":
        if w.shape[0] != c:
            return f"{c} BatchNorm channels, {w.shape[0]} conv output channels"
    elif lin.op == "ConvTranspose":
        if w.shape[1] * lin.attr("group", 1) != c:
            return f"{c} BatchNorm channels, {w.shape[1] * lin.attr('group', 1)} ConvTranspose output channels"
    elif lin.op == "Gemm":
        n = w.shape[0] if lin.attr("transB", 0) else w.shape[1]
        if n != c:
            return f"{c} BatchNorm channels, {n} Gemm output columns"
        b = m.const("b")
        if b is not None and b.ndim == 2 and b.shape[0] != 1 and not isinstance(out.shape[0], int):
            return "a matrix C with an unknown batch size"
    else:  # MatMul
        if len(out.shape) != 2 or w.ndim != 2:
            return (f"MatMul<{lin.name}> output has rank {len(out.shape)}: BatchNorm normalizes axis 1, "
                    "which is the MatMul's last axis only for rank 2")
        if w.shape[1] != c:
            return f"{c} BatchNorm channels, {w.shape[1]} MatMul output columns"


def _rewrite(m, b):
    lin = m.node("lin")
    w = m.const("w")
    dt = w.dtype
    inv, shift = _bn_params(m)
    w64 = w.astype(np.float64)
    bias = m.const("b")
    if lin.op == "Conv":
        w2 = w64 * inv.reshape((-1,) + (1,) * (w.ndim - 1))
        b2 = (0.0 if bias is None else bias.astype(np.float64)) * inv + shift
        return b.node("Conv", [m["x"], b.const(w2.astype(dt), "w"), b.const(b2.astype(dt), "b")],
                      dict(lin.attrs), name=lin.name).output
    if lin.op == "ConvTranspose":
        g = lin.attr("group", 1)
        cin, mg = w.shape[0], w.shape[1]
        w2 = (w64.reshape(g, cin // g, mg, -1) * inv.reshape(g, 1, mg, 1)).reshape(w.shape)
        b2 = (0.0 if bias is None else bias.astype(np.float64)) * inv + shift
        return b.node("ConvTranspose", [m["x"], b.const(w2.astype(dt), "w"), b.const(b2.astype(dt), "b")],
                      dict(lin.attrs), name=lin.name).output
    if lin.op == "Gemm":
        w2 = w64 * (inv[:, None] if lin.attr("transB", 0) else inv[None, :])
        beta = float(lin.attr("beta", 1.0))
        c2 = (0.0 if bias is None else beta * bias.astype(np.float64)) * inv + shift
        attrs = dict(lin.attrs, beta=1.0)
        return b.node("Gemm", [m["x"], b.const(w2.astype(dt), "w"), b.const(np.asarray(c2).astype(dt), "c")],
                      attrs, name=lin.name).output
    # MatMul (rank 2): x @ (w * inv) + shift as a Gemm
    return b.node("Gemm", [m["x"], b.const((w64 * inv[None, :]).astype(dt), "w"), b.const(shift.astype(dt), "c")],
                  {}, name=lin.name).output


RULE = Rule(
    "batchnorm_into_linear",
    Op("BatchNormalization", Op(("Conv", "ConvTranspose", "Gemm", "MatMul"), Var("x"), Var("w"), Opt("b"), name="lin"),
       Const("scale"), Const("bias"), Const("mean"), Const("var"), name="bn"),
    _rewrite, _check)

register_pass(RewritePass("batchnorm_folding", [RULE], level=2, modes=("inference",), doc="""
Fold an inference-mode BatchNormalization into the Conv, ConvTranspose, Gemm or (rank-2) MatMul whose only
reader it is: W' = W * s, b' = (b - mean) * s + beta with s = gamma / sqrt(var + eps), computed in float64.

Assumes: inference mode; the weights, the bias and the BatchNorm parameters are constants; the linear op's
output is read by the BatchNorm alone.
Guarantees: outputs equal the unfolded graph up to float rounding; training-mode BatchNorm, non-constant
weights and shared conv outputs are left alone (rule.explain says why).
""".strip()))


# -- a BatchNormalization with no linear op to fold into: Mul + Add by per-channel constants ------------
def _check_standalone(m):
    bn = m.root
    if bn.attr("training_mode", 0):
        return f"BatchNormalization<{bn.name}> is in training mode (it normalizes with batch statistics)"
    for extra in bn.outputs[1:]:
        if extra.uses or extra.is_graph_output:
            return f"BatchNormalization<{bn.name}> running statistics output %{extra.name} is read"
    x = m["x"]
    if x.shape is None or len(x.shape) < 2:
        return f"the rank of %{x.name} is unknown or below 2"
    if x.dtype not in ("float16", "float32", "float64"):
        return f"%{x.name} is not floating point"
    for k in ("scale", "bias", "mean", "var"):
        if m.const(k).dtype.kind != "f":
            return f"the BatchNorm {k} is not floating point"


def _rewrite_standalone(m, b):
    inv, shift = _bn_params(m)
    rank = len(m["x"].shape)
    shape = (-1,) + (1,) * (rank - 2)  # aligned to the trailing axes, the channel is axis 1
    dt = m["x"].dtype
    y = b.op("Mul", m["x"], b.const(inv.reshape(shape).astype(dt), "scale"), name=f"{m.root.name}_scale")
    return b.op("Add", y, b.const(shift.reshape(shape).astype(dt), "shift"), name=f"{m.root.name}_shift")


STANDALONE_RULE = Rule(
    "batchnorm_to_affine",
    Op("BatchNormalization", Var("x"), Const("scale"), Const("bias"), Const("mean"), Const("var"), name="bn"),
    _rewrite_standalone, _check_standalone,
    doc="An inference BatchNormalization is x * s + t with per-channel constants s, t.")

register_pass(RewritePass("batchnorm_decomposition", [STANDALONE_RULE], level=3, modes=("inference",), doc="""
Turn an inference-mode BatchNormalization that batchnorm_folding could not fold (no Conv/Gemm before it,
or one whose output is shared) into Mul and Add by per-channel constants, s = gamma / sqrt(var + eps) and
t = beta - mean * s computed in float64, so that affine_folding and elementwise fusion can take them.
Level 3: where nothing fuses them afterwards, two elementwise ops cost more than one BatchNorm kernel.

Assumes: inference mode; constant BatchNorm parameters; the running-statistics outputs are not read.
Guarantees: the same outputs up to float rounding; training-mode BatchNorm is left alone.
""".strip()))
