"""Lowerings of aiacc's fused ops (domain "aiacc") to the fastest torch form: oneDNN convolution / linear with the
activation as a post-op (summing into a dead residual in place), F.scaled_dot_product_attention, the
FusedElementwise program as the numba op (aiacc/plugins/torch/numba_op.py) where measured faster, else op by op,
and aiacc::Embedding as F.embedding with its padding_idx.

A lowering, registered in exporter.LOWERINGS under the op's qualified name ("Conv", "aiacc::FusedConv"),
gets the Builder and an LNode (see exporter.py) and returns the fx value of each output. Constant inputs
that torch takes as Python values (shapes, axes, clip bounds, dropout ratios) are read at export time;
everything else stays a tensor so gradients flow.
"""
from __future__ import annotations

import math
import operator

import torch
import torch.nn.functional as F

from aiacc.core.ops import get_schema
from aiacc.core.ops.fused import parse_program
from aiacc.errors import UnsupportedError
from aiacc.plugins.torch import fastpath
from aiacc.plugins.torch.export_ops.nn import conv, gemm, gemm_is_linear, transposed_constant
from aiacc.plugins.torch.exporter import LOWERINGS, LNode, linear


_ACT_INPLACE = {"Relu": F.relu_, "Sigmoid": torch.sigmoid_, "Tanh": torch.tanh_}


def activation(b, y, act: str, params, inplace: bool):
    """Apply a fused-op activation; in place where torch has an in-place form and it is safe."""
    if not act:
        return y
    params = list(params or [])
    if act in _ACT_INPLACE and inplace:
        return b.call(_ACT_INPLACE[act], y)
    if act == "Relu":
        return b.call(torch.relu, y)
    if act == "Sigmoid":
        return b.call(torch.sigmoid, y)
    if act == "Tanh":
        return b.call(torch.tanh, y)
    if act == "LeakyRelu":
        return b.call(F.leaky_relu, y, params[0] if params else 0.01, inplace)
    if act == "Elu":
        return b.call(F.elu, y, params[0] if params else 1.0, inplace)
    if act == "HardSigmoid":
        alpha, beta = (params + [0.2, 0.5][len(params):])[:2]
        return b.call(torch.clamp, b.call(operator.add, b.call(operator.mul, y, alpha), beta), 0.0, 1.0)
    if act == "HardSwish":
        return b.call(F.hardswish, y, inplace)
    if act == "Clip":
        lo, hi = (params + [-math.inf, math.inf][len(params):])[:2]
        if lo == 0 and hi == 6:
            return b.call(F.relu6, y, inplace)
        return b.call(torch.clamp_ if inplace else torch.clamp, y, None if lo == -math.inf else lo,
                      None if hi == math.inf else hi)
    if act == "Gelu":
        return b.call(F.gelu, y)
    if act == "GeluTanh":
        return b.call(F.gelu, y, approximate="tanh")
    raise UnsupportedError(f"unknown fused activation {act!r}")


# ops whose output is a fresh tensor (never a view of an input) in their lowering
_FRESH = {("aiacc", "FusedConv"), ("", "Conv"), ("", "Relu"), ("", "Add"), ("", "MaxPool"), ("", "AveragePool"),
          ("", "BatchNormalization"), ("", "Clip")}
# readers that only read (their outputs do not alias the input)
_READERS = {("aiacc", "FusedConv"), ("", "Conv"), ("", "MaxPool"), ("", "AveragePool"), ("", "GlobalAveragePool"),
            ("", "BatchNormalization")}


def _residual_is_dead_after(b, value, node) -> bool:
    """Whether `node` may overwrite `value`: a fresh tensor made by a known op, not a graph output, and
    read otherwise only by earlier nodes that alias nothing."""
    p = value.producer if value is not None else None
    if p is None or value.const is not None or value.is_graph_output or p.schema is None \
            or (p.domain, p.op) not in _FRESH or value.dtype != "float32":
        return False
    order = b.__dict__.setdefault("_order", {id(x): i for i, x in enumerate(b.ir)})
    if id(node) not in order:
        return False
    for user, _ in value.uses:
        if user is node:
            continue
        if (user.domain, user.op) not in _READERS or order.get(id(user), 1 << 60) > order[id(node)]:
            return False
    return sum(1 for u, _ in value.uses if u is node) == 1


@LOWERINGS.register("aiacc::FusedConv")
def _fused_conv(b, n):
    act, params = n.attr("activation", ""), n.attr("activation_params")
    residual = n.arg(3) if n.n_inputs > 3 and n.values[3] is not None else None
    shape = n.shape(1)
    epilogue = n.meta.get("torch.conv_epilogue")  # its only reader's SiLU, measured faster as the post-op
    if b.inference and epilogue is not None and not act and residual is None and shape is not None \
            and len(shape) == 4:
        return conv(b, n, onednn=epilogue)
    if b.inference and residual is None and shape is not None and len(shape) == 4:
        onednn = fastpath.onednn_activation(act, params)
        if onednn is not None:  # the activation runs as oneDNN's post-op
            return conv(b, n, onednn=onednn)
    if b.inference and residual is not None and shape is not None and len(shape) == 4 \
            and _residual_is_dead_after(b, n.values[3], n.outputs[0].producer):
        onednn = fastpath.onednn_activation(act, params)
        if onednn is not None and onednn[0] in ("none", "relu"):  # conv, sum into the residual, ReLU: one call
            return conv(b, n, onednn=onednn, residual=residual)
    y = conv(b, n)
    if residual is not None:
        # the conv output is fresh: accumulate in place (autograd handles add_ on a non-leaf)
        y = b.method("add_", y, residual) if b.inplace_ok else b.call(operator.add, y, residual)
    return activation(b, y, act, params, b.inplace_ok)


@LOWERINGS.register("aiacc::FusedGemm")
def _fused_gemm(b, n):
    act, params = n.attr("activation", ""), n.attr("activation_params")
    if b.inference and gemm_is_linear(n):
        onednn = fastpath.onednn_activation(act, params)
        if onednn is not None:
            return gemm(b, n, onednn)
    y = gemm(b, n)
    return activation(b, y, act, params, b.inplace_ok)


@LOWERINGS.register("aiacc::FusedMatMul")
def _fused_matmul(b, n):
    """act(x @ W + bias) as a linear with W^T (a constant W is transposed once, at export)."""
    act, params = n.attr("activation", ""), n.attr("activation_params")
    w = n.values[1]
    if w is not None and w.const is not None:
        weight = transposed_constant(b, w)
    else:
        weight = b.method("t", n.arg(1))
    bias = n.arg(2) if n.n_inputs > 2 and n.values[2] is not None else None
    onednn = fastpath.onednn_activation(act, params) if b.inference else None
    if onednn is not None:
        return linear(b, n.arg(0), weight, bias, onednn, node=n)
    y = linear(b, n.arg(0), weight, bias, node=n)
    return activation(b, y, act, params, b.inplace_ok)


@LOWERINGS.register("aiacc::Attention")
def _attention(b, n):
    q, k, v = n.arg(0), n.arg(1), n.arg(2)
    if n.attr("k_transposed"):
        k = b.method("transpose", k, -1, -2)
    mask = n.arg(3) if n.n_inputs > 3 and n.values[3] is not None else None
    if mask is not None and n.values[3].dtype != n.values[0].dtype:
        raise UnsupportedError(f"node {n.name}: aiacc::Attention mask of dtype {n.values[3].dtype}")
    return b.call(F.scaled_dot_product_attention, q, k, v, attn_mask=mask, scale=float(n.attr("scale", 1.0)))


@LOWERINGS.register("aiacc::Embedding")
def _embedding(b, n):
    """F.embedding with its padding_idx: the lookup whose padding row gets a zero gradient, as the
    original nn.Embedding's."""
    return b.call(F.embedding, n.arg(1), n.arg(0), padding_idx=int(n.attr("padding_idx")))


@LOWERINGS.register("aiacc::FusedElementwise")
def _fused_elementwise(b, n):
    """In an inference export, one call of the numba op torch.ops.aiacc.fused_elementwise where
    numba_op.choose_fusions kept it (measured faster; node.meta[numba_op.META_KEY]), nothing where the
    convolution before it runs the program as its oneDNN post-op (a SiLU, numba_op.EPILOGUES, measured
    faster too); otherwise, and in training, the program's statements as torch ops (lower_program)."""
    if b.inference and n.meta.get("torch.fused_elementwise.form") == "epilogue" and n.n_inputs == 1:
        p = n.values[0].producer
        if p is not None and p.meta.get("torch.conv_epilogue") is not None:
            return n.arg(0)  # the convolution's post-op computed it (numba_op.EPILOGUES)
    args = [n.arg(k) for k in range(n.n_inputs)]
    decision = n.meta.get("torch.fused_elementwise")
    if b.inference and decision is not None and decision[0]:
        from aiacc.plugins.torch.numba_op import OP

        return b.call(OP, args, n.attr("program"))
    return lower_program(b, n.attr("program"), args, [n.const(k) for k in range(n.n_inputs)], n.outputs, n.name)


def _peepholes(stmts, const: set[str]) -> tuple[dict[str, tuple], set[str]]:
    """Statements the level-2 graph had as one torch call: Mul(x, Sigmoid(x)) -> F.silu(x) (level 2's
    export peephole), Add(Mul(x, c), d) with constant c, d (a decomposed BatchNorm) -> torch.addcmul(d, x, c).
    `const`: the inputs that are constants. Returns {target: (kind, operands)} and the targets absorbed."""
    uses: dict[str, int] = {}
    for _, _, args, _ in stmts:
        for a in args:
            uses[a] = uses.get(a, 0) + 1
    last = stmts[-1][0]
    by_target = {t: (op, args) for t, op, args, _ in stmts}
    special, skip = {}, set()
    for t, op, args, _ in stmts:
        if op == "Mul" and len(args) == 2:
            for x, s in ((args[0], args[1]), (args[1], args[0])):
                p = by_target.get(s)
                if p is not None and p[0] == "Sigmoid" and p[1] == [x] and uses.get(s) == 1 and s != last:
                    special[t], skip = ("silu", (x,)), skip | {s}
                    break
        elif op == "Add" and len(args) == 2:
            for m, d in ((args[0], args[1]), (args[1], args[0])):
                p = by_target.get(m)
                if p is not None and p[0] == "Mul" and uses.get(m) == 1 and m not in special and m != last \
                        and d in const and any(a in const for a in p[1]):
                    special[t], skip = ("addcmul", (d, *p[1])), skip | {m}
                    break
    return special, skip


def lower_program(b, program: str, args: list, consts: list, outputs=None, name: str = "fused"):
    """A FusedElementwise program as torch calls through `b` (the exporter's Builder, or anything with its
    call/method: numba_op times the same lowering eagerly): each statement by the op's own lowering,
    with the peepholes that keep it no worse than level 2's ops (_peepholes). consts[k]: input k as a
    numpy constant (read as a Python number where the op takes one) or None."""
    env = {f"i{k}": a for k, a in enumerate(args)}
    cenv = {f"i{k}": c for k, c in enumerate(consts)}
    stmts = parse_program(program)
    special, skip = _peepholes(stmts, {k for k, c in cenv.items() if c is not None})
    last = None
    for target, op_type, targs, attrs in stmts:
        if target in skip:
            continue
        if target in special:
            kind, ops = special[target]
            if kind == "silu":
                last = env[target] = b.call(F.silu, env[ops[0]])
                continue
            d, x, c = ops
            last = env[target] = b.call(torch.addcmul, env[d], env[x], env[c])
            cenv[target] = None
            continue
        last = env[target] = _lower_stmt(b, op_type, targs, attrs, env, cenv, outputs, f"{name}_{target}")
        cenv[target] = None
    return last


def _lower_stmt(b, op_type, targs, attrs, env, cenv, outputs, name):
    schema = get_schema(op_type)
    full = {k: spec.default for k, spec in schema.attrs.items()}
    full.update(attrs)
    sub = LNode(b, op_type, full, [], outputs or [], name, args=[env[a] for a in targs])
    # constant operands stay readable as Python numbers
    sub.const = (lambda cs: lambda i: cs[i] if i < len(cs) else None)([cenv.get(a) for a in targs])
    sub.values = [object()] * len(targs)  # every operand present
    sub.shape = (lambda i: None)
    out = LOWERINGS[op_type](b, sub)
    return out[0] if isinstance(out, list) else out
