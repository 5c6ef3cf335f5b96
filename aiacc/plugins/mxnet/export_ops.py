"""The IR -> MXNet lowerings, registered in the exporter's table (`exporter.lowerings`, keyed
by the node's qualified op: "Conv", "aiacc::FusedConv").

Each lowering takes the `Emitter` and an IR node and returns one symbol reference per IR output: the
aiacc fused ops (convolution / Gemm with their activation), convolutions, normalization, activations,
elementwise, matrix, pooling and shape ops, and the ops the importer produces from less common MXNet ops
(Resize from UpSampling / BilinearResize2D, Pad, Tile, ArgMax / ArgMin, Mod). Each raises UnsupportedError
naming the node where MXNet has no equivalent form.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from aiacc.core.ir import Node, Value, const_value
from aiacc.errors import UnsupportedError
from aiacc.plugins.mxnet.exporter import Emitter, Ref, lowerings
from aiacc.plugins.mxnet.importer import SELU_ALPHA, SELU_GAMMA


# -- helpers ----------------------------------------------------------------------------------------

def _spatial_pads(node: Node, n: int) -> tuple[list[int], list[int] | None]:
    """(symmetric pads, None) or (zeros, [begin..., end...]) when the pads are asymmetric."""
    if node.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID", None):
        from aiacc.core.ops.nn import window_params

        x = node.inputs[0]
        kernel = list(node.attr("kernel_shape") or node.inputs[1].shape[2:])
        _, _, pads = window_params(x.shape[2:], kernel, dict(node.attrs))
    else:
        pads = list(node.attr("pads") or [0] * (2 * n)) if node.attr("auto_pad", "NOTSET") != "VALID" \
            else [0] * (2 * n)
    begin, end = pads[:n], pads[n:]
    if begin == end:
        return begin, None
    return [0] * n, pads


def _explicit_pad(em: Emitter, node: Node, x: Ref, pads: list[int], value: float) -> Ref:
    n = len(pads) // 2
    if n + 2 not in (4, 5):
        raise UnsupportedError(f"node {node.name} ({node.op}): MXNet pads only 4-d and 5-d tensors explicitly")
    width = [0, 0, 0, 0]
    for i in range(n):
        width += [pads[i], pads[n + i]]
    return em.op("Pad", f"{node.name}_pad", [x], mode="constant", pad_width=tuple(width), constant_value=value)


def _rank(v: Value) -> int | None:
    return None if v.shape is None else len(v.shape)


def _need_static(node: Node, v: Value) -> tuple[int, ...]:
    if v.shape is None or not all(isinstance(d, int) for d in v.shape):
        raise UnsupportedError(f"node {node.name} ({node.qualified_op}): %{v.name} needs a static shape to be "
                               f"lowered to MXNet, it has {v.type}")
    return tuple(v.shape)


# -- lowerings --------------------------------------------------------------------------------------

def _activation(em: Emitter, node: Node, r: Ref, name: str) -> Ref:
    """The `activation` of an aiacc fused node applied to `r` (see aiacc.core.ops.fused.ACTIVATIONS)."""
    act = node.attr("activation", "") or ""
    params = list(node.attr("activation_params") or [])
    if not act:
        return r
    if act in ("Relu", "Sigmoid", "Tanh"):
        return em.op("Activation", name, [r], act_type=act.lower())
    if act == "LeakyRelu":
        return em.op("LeakyReLU", name, [r], act_type="leaky", slope=float((params or [0.01])[0]))
    if act == "Elu":
        return em.op("LeakyReLU", name, [r], act_type="elu", slope=float((params or [1.0])[0]))
    if act == "HardSigmoid":
        alpha, beta = (params + [0.2, 0.5][len(params):])[:2]
        return em.op("hard_sigmoid", name, [r], alpha=float(alpha), beta=float(beta))
    if act == "HardSwish":
        return em.op("elemwise_mul", name, [r, em.op("hard_sigmoid", f"{name}_gate", [r], alpha=1 / 6, beta=0.5)])
    if act == "Clip":
        lo, hi = (params + [-np.inf, np.inf][len(params):])[:2]
        big = float(np.finfo(np.float32).max)
        return em.op("clip", name, [r], a_min=max(float(lo), -big), a_max=min(float(hi), big))
    if act == "Gelu":
        return em.op("LeakyReLU", name, [r], act_type="gelu")
    if act == "GeluTanh":
        return _gelu_tanh(em, r, name)
    raise UnsupportedError(f"node {node.name} ({node.qualified_op}): activation {act} has no MXNet form")


@lowerings.register("aiacc::FusedConv")
def _fused_conv(em: Emitter, node: Node) -> Ref:
    """Convolution (BatchNorm already folded into its weights) + residual add + Activation."""
    act = node.attr("activation", "") or ""
    r = _conv(em, node, name=f"{node.name}_conv")
    residual = node.inputs[3] if len(node.inputs) > 3 else None
    if residual is not None:
        r = em.op("elemwise_add", f"{node.name}_add" if act else node.name, [r, em.ref(residual)])
    return _activation(em, node, r, node.name)


@lowerings.register("aiacc::FusedGemm")
def _fused_gemm(em: Emitter, node: Node) -> Ref:
    return _activation(em, node, _gemm(em, node, name=f"{node.name}_fc"), node.name)


@lowerings.register("Conv")
def _conv(em: Emitter, node: Node, name: str | None = None) -> Ref:
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    wshape = _need_static(node, w)
    n = len(wshape) - 2
    pad, explicit = _spatial_pads(node, n)
    xr = em.ref(x)
    if explicit:
        xr = _explicit_pad(em, node, xr, explicit, 0.0)
    ins = [xr, em.ref(w)] + ([em.ref(b)] if b is not None else [])
    return em.op("Convolution", name or node.name, ins, kernel=tuple(node.attr("kernel_shape") or wshape[2:]),
                 stride=tuple(node.attr("strides") or [1] * n), dilate=tuple(node.attr("dilations") or [1] * n),
                 pad=tuple(pad), num_filter=wshape[0], num_group=node.attr("group", 1), no_bias=b is None,
                 layout={1: "NCW", 2: "NCHW", 3: "NCDHW"}.get(n))


@lowerings.register("ConvTranspose")
def _deconv(em: Emitter, node: Node) -> Ref:
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    wshape = _need_static(node, w)
    n = len(wshape) - 2
    if node.attr("output_shape") or node.attr("auto_pad", "NOTSET") not in ("NOTSET", None):
        raise UnsupportedError(f"node {node.name} (ConvTranspose): output_shape/auto_pad have no MXNet form")
    pads = list(node.attr("pads") or [0] * (2 * n))
    if pads[:n] != pads[n:]:
        raise UnsupportedError(f"node {node.name} (ConvTranspose): asymmetric pads {pads} have no MXNet form")
    group = node.attr("group", 1)
    ins = [em.ref(x), em.ref(w)] + ([em.ref(b)] if b is not None else [])
    return em.op("Deconvolution", node.name, ins, kernel=tuple(node.attr("kernel_shape") or wshape[2:]),
                 stride=tuple(node.attr("strides") or [1] * n), dilate=tuple(node.attr("dilations") or [1] * n),
                 pad=tuple(pads[:n]), adj=tuple(node.attr("output_padding") or [0] * n),
                 num_filter=wshape[1] * group, num_group=group, no_bias=b is None)


@lowerings.register("BatchNormalization")
def _bn(em: Emitter, node: Node) -> Ref:
    x, scale, bias, mean, var = node.inputs[:5]
    if node.attr("training_mode", 0):
        # MXNet's BatchNorm uses batch statistics under autograd.record(train_mode=True) and updates the
        # moving mean/var aux states in place: the IR's new-statistics outputs must have no other reader
        if any(v.uses or v.is_graph_output for v in node.outputs[1:]) or \
                any(v.const is not None for v in (mean, var)):
            raise UnsupportedError(f"node {node.name} (BatchNormalization): training mode lowers to MXNet only "
                                   f"on variable moving statistics updated in place")
        y = em.op("BatchNorm", node.name, [em.ref(x), em.ref(scale), em.ref(bias), em.ref(mean, aux=True),
                                           em.ref(var, aux=True)],
                  eps=float(node.attr("epsilon", 1e-5)), momentum=float(node.attr("momentum", 0.9)),
                  fix_gamma=False, use_global_stats=False, axis=1)
        return [y, None, None]
    return em.op("BatchNorm", node.name, [em.ref(x), em.ref(scale), em.ref(bias), em.ref(mean, aux=True),
                                          em.ref(var, aux=True)],
                 eps=float(node.attr("epsilon", 1e-5)), momentum=float(node.attr("momentum", 0.9)),
                 fix_gamma=False, use_global_stats=True, axis=1)


_ACT = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Softplus": "softrelu", "Softsign": "softsign"}


@lowerings.register(*_ACT)
def _act(em: Emitter, node: Node) -> Ref:
    return em.op("Activation", node.name, [em.ref(node.inputs[0])], act_type=_ACT[node.op])


@lowerings.register("LeakyRelu")
def _leaky(em: Emitter, node: Node) -> Ref:
    return em.op("LeakyReLU", node.name, [em.ref(node.inputs[0])], act_type="leaky",
                 slope=float(node.attr("alpha", 0.01)))


@lowerings.register("Elu")
def _elu(em: Emitter, node: Node) -> Ref:
    return em.op("LeakyReLU", node.name, [em.ref(node.inputs[0])], act_type="elu",
                 slope=float(node.attr("alpha", 1.0)))


@lowerings.register("Selu")
def _selu(em: Emitter, node: Node) -> Ref:
    alpha, gamma = float(node.attr("alpha")), float(node.attr("gamma"))
    x = em.ref(node.inputs[0])
    if abs(alpha - SELU_ALPHA) < 1e-6 and abs(gamma - SELU_GAMMA) < 1e-6:
        return em.op("LeakyReLU", node.name, [x], act_type="selu")
    elu = em.op("LeakyReLU", f"{node.name}_elu", [x], act_type="elu", slope=alpha)
    return em.op("_mul_scalar", node.name, [elu], scalar=gamma)


@lowerings.register("Gelu")
def _gelu(em: Emitter, node: Node) -> Ref:
    x = em.ref(node.inputs[0])
    if node.attr("approximate", "none") != "tanh":
        return em.op("LeakyReLU", node.name, [x], act_type="gelu")
    return _gelu_tanh(em, x, node.name)


def _gelu_tanh(em: Emitter, x: Ref, n: str) -> Ref:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))"""
    x3 = em.op("_power_scalar", f"{n}_cube", [x], scalar=3.0)
    inner = em.op("elemwise_add", f"{n}_inner", [x, em.op("_mul_scalar", f"{n}_c", [x3], scalar=0.044715)])
    t = em.op("tanh", f"{n}_tanh", [em.op("_mul_scalar", f"{n}_s", [inner], scalar=float(np.sqrt(2 / np.pi)))])
    half = em.op("_mul_scalar", f"{n}_half", [em.op("_plus_scalar", f"{n}_one", [t], scalar=1.0)], scalar=0.5)
    return em.op("elemwise_mul", n, [x, half])


@lowerings.register("PRelu")
def _prelu(em: Emitter, node: Node) -> Ref:
    x, slope = node.inputs
    c = const_value(slope)
    rank = _rank(x)
    if c is not None and rank is not None:
        flat = c.reshape(-1)
        channels = x.shape[1] if rank > 1 else None
        if flat.size == 1 or (c.ndim >= rank - 1 and flat.size == channels
                              and c.shape[-(rank - 1)] == channels if rank > 1 else False):
            gamma = em.param(f"{node.name}_gamma", flat)
            return em.op("LeakyReLU", node.name, [em.ref(x), gamma], act_type="prelu")
    # general slope: max(x, 0) + slope * min(x, 0)
    xr = em.ref(x)
    pos = em.op("relu", f"{node.name}_pos", [xr])
    neg = em.op("_minimum_scalar", f"{node.name}_neg", [xr], scalar=0.0)
    return em.op("broadcast_add", node.name,
                 [pos, em.op("broadcast_mul", f"{node.name}_scaled", [neg, em.ref(slope)])])


@lowerings.register("HardSigmoid")
def _hard_sigmoid(em: Emitter, node: Node) -> Ref:
    return em.op("hard_sigmoid", node.name, [em.ref(node.inputs[0])], alpha=float(node.attr("alpha", 0.2)),
                 beta=float(node.attr("beta", 0.5)))


@lowerings.register("HardSwish")
def _hard_swish(em: Emitter, node: Node) -> Ref:
    x = em.ref(node.inputs[0])
    hs = em.op("hard_sigmoid", f"{node.name}_gate", [x], alpha=1 / 6, beta=0.5)
    return em.op("elemwise_mul", node.name, [x, hs])


@lowerings.register("Mish")
def _mish(em: Emitter, node: Node) -> Ref:
    x = em.ref(node.inputs[0])
    sp = em.op("Activation", f"{node.name}_softplus", [x], act_type="softrelu")
    return em.op("elemwise_mul", node.name, [x, em.op("tanh", f"{node.name}_tanh", [sp])])


_UNARY = {"Erf": "erf", "Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Neg": "negative", "Abs": "abs",
          "Reciprocal": "reciprocal", "Floor": "floor", "Ceil": "ceil", "Round": "rint", "Sign": "sign",
          "Sin": "sin", "Cos": "cos", "Not": "logical_not"}


@lowerings.register(*_UNARY)
def _unary(em: Emitter, node: Node) -> Ref:
    return em.op(_UNARY[node.op], node.name, [em.ref(node.inputs[0])])


@lowerings.register("Identity")
def _identity(em: Emitter, node: Node) -> Ref:
    return em.ref(node.inputs[0]) if not node.output.is_graph_output \
        else em.op("_copy", node.name, [em.ref(node.inputs[0])])


@lowerings.register("Dropout")
def _dropout(em: Emitter, node: Node) -> list[Ref]:
    ratio = const_value(node.inputs[1]) if len(node.inputs) > 1 else None
    p = 0.5 if ratio is None else float(ratio)
    out = em.op("Dropout", node.name, [em.ref(node.inputs[0])], p=p)
    return [out] + [None] * (len(node.outputs) - 1)


@lowerings.register("Clip")
def _clip(em: Emitter, node: Node) -> Ref:
    x = node.inputs[0]
    lo = node.inputs[1] if len(node.inputs) > 1 else None
    hi = node.inputs[2] if len(node.inputs) > 2 else None
    lo_c, hi_c = const_value(lo), const_value(hi)
    if (lo is None or lo_c is not None) and (hi is None or hi_c is not None):
        big = float(np.finfo(np.float32).max)
        return em.op("clip", node.name, [em.ref(x)], a_min=-big if lo is None else float(lo_c),
                     a_max=big if hi is None else float(hi_c))
    r = em.ref(x)
    if lo is not None:
        r = em.op("broadcast_maximum", f"{node.name}_lo", [r, em.ref(lo)])
    if hi is not None:
        r = em.op("broadcast_minimum", node.name, [r, em.ref(hi)])
    return r


_BIN = {"Add": ("elemwise_add", "broadcast_add", "_plus_scalar", "_plus_scalar"),
        "Sub": ("elemwise_sub", "broadcast_sub", "_minus_scalar", "_rminus_scalar"),
        "Mul": ("elemwise_mul", "broadcast_mul", "_mul_scalar", "_mul_scalar"),
        "Div": ("elemwise_div", "broadcast_div", "_div_scalar", "_rdiv_scalar"),
        "Pow": ("_power", "broadcast_power", "_power_scalar", "_rpower_scalar"),
        "Max": ("_maximum", "broadcast_maximum", "_maximum_scalar", "_maximum_scalar"),
        "Min": ("_minimum", "broadcast_minimum", "_minimum_scalar", "_minimum_scalar")}


def _binary_refs(em: Emitter, name: str, op: str, a: Value, b: Value) -> Ref:
    same, bcast, scalar_r, scalar_l = _BIN[op]
    out_shape = None
    if a.shape is not None and b.shape is not None:
        try:
            out_shape = tuple(np.broadcast_shapes(tuple(d if isinstance(d, int) else 2 for d in a.shape),
                                                  tuple(d if isinstance(d, int) else 2 for d in b.shape)))
        except ValueError:
            out_shape = None
    ca, cb = const_value(a), const_value(b)
    if cb is not None and cb.size == 1 and a.shape is not None and len(a.shape) >= cb.ndim \
            and (a.dtype is None or np.issubdtype(np.dtype(a.dtype), np.floating)):
        return em.op(scalar_r, name, [em.ref(a)], scalar=float(cb.reshape(())))
    if ca is not None and ca.size == 1 and b.shape is not None and len(b.shape) >= ca.ndim \
            and (b.dtype is None or np.issubdtype(np.dtype(b.dtype), np.floating)):
        return em.op(scalar_l, name, [em.ref(b)], scalar=float(ca.reshape(())))
    if a.shape is not None and a.shape == b.shape and all(isinstance(d, int) for d in a.shape):
        return em.op(same, name, [em.ref(a), em.ref(b)])
    del out_shape
    return em.op(bcast, name, [em.ref(a), em.ref(b)])


@lowerings.register(*(op for op in _BIN if op not in ("Max", "Min")))  # Max and Min are variadic: below
def _binary(em: Emitter, node: Node) -> Ref:
    folded = em.fold.get(id(node))
    if folded is not None and len(folded) == 3:  # MatMul(x, Transpose(W)) + b on values -> FullyConnected
        return _fc_on_values(em, node.name, *folded)
    if folded is not None:  # MatMul + bias -> FullyConnected
        mm, bias = folded
        w = const_value(mm.inputs[1])
        return em.op("FullyConnected", node.name,
                     [em.ref(mm.inputs[0]), em.param(f"{mm.name}_weight", w.T), em.param(f"{node.name}_bias", bias)],
                     num_hidden=w.shape[1], no_bias=False, flatten=False)
    return _binary_refs(em, node.name, node.op, node.inputs[0], node.inputs[1])


@lowerings.register("Sum", "Max", "Min", "Mean")
def _variadic(em: Emitter, node: Node) -> Ref:
    ins = [v for v in node.inputs if v is not None]
    if len(ins) == 2 and node.op != "Mean":
        return _binary_refs(em, node.name, node.op, ins[0], ins[1])
    if len(ins) == 1:
        return em.ref(ins[0]) if not node.output.is_graph_output else em.op("_copy", node.name, [em.ref(ins[0])])
    if node.op in ("Sum", "Mean") and all(v.shape == ins[0].shape and v.shape is not None for v in ins):
        s = em.op("add_n", node.name if node.op == "Sum" else f"{node.name}_sum", [em.ref(v) for v in ins],
                  num_args=len(ins))
        return s if node.op == "Sum" else em.op("_div_scalar", node.name, [s], scalar=float(len(ins)))
    _, bcast, _, _ = _BIN["Add" if node.op in ("Sum", "Mean") else node.op]
    r = em.ref(ins[0])
    for k, v in enumerate(ins[1:]):
        r = em.op(bcast, f"{node.name}_{k}", [r, em.ref(v)])
    return r if node.op != "Mean" else em.op("_div_scalar", node.name, [r], scalar=float(len(ins)))


def _fc_on_values(em: Emitter, name: str, mm: Node, bias: Value | None, w: Value) -> Ref:
    """FullyConnected(flatten=False) reading the weight W (N, K) and bias as they are (trained values)."""
    ins = [em.ref(mm.inputs[0]), em.ref(w)] + ([em.ref(bias)] if bias is not None else [])
    return em.op("FullyConnected", name, ins, num_hidden=w.shape[0], no_bias=bias is None, flatten=False)


@lowerings.register("MatMul")
def _matmul(em: Emitter, node: Node) -> Ref:
    folded = em.fold.get(id(node))
    if folded is not None and folded[0] == "transpose_b":  # a @ Transpose(b) of the last two axes
        return em.op("batch_dot", node.name, [em.ref(node.inputs[0]), em.ref(folded[1])], transpose_b=True)
    if folded is not None:  # MatMul(x, Transpose(W)) on a value W -> FullyConnected without bias
        return _fc_on_values(em, node.name, *folded)
    a, b = node.inputs
    ra, rb = _rank(a), _rank(b)
    if ra is None or rb is None:
        raise UnsupportedError(f"node {node.name} (MatMul): operand ranks must be known to lower it to MXNet")
    w = const_value(b)
    if rb == 2 and ra >= 2 and w is not None:  # FullyConnected keeps the weight (N, K), like Dense
        return em.op("FullyConnected", node.name, [em.ref(a), em.param(f"{node.name}_weight", w.T)],
                     num_hidden=w.shape[1], no_bias=True, flatten=False)
    if rb == 2 and ra >= 2:
        return em.op("dot", node.name, [em.ref(a), em.ref(b)])
    if ra == rb and ra >= 3:
        sa, sb = a.shape[:-2], b.shape[:-2]
        if sa == sb:
            return em.op("batch_dot", node.name, [em.ref(a), em.ref(b)])
        batch = tuple(np.broadcast_shapes(_need_static(node, a)[:-2], _need_static(node, b)[:-2]))
        ar = em.op("broadcast_to", f"{node.name}_a", [em.ref(a)], shape=batch + tuple(a.shape[-2:]))
        br = em.op("broadcast_to", f"{node.name}_b", [em.ref(b)], shape=batch + tuple(b.shape[-2:]))
        return em.op("batch_dot", node.name, [ar, br])
    raise UnsupportedError(f"node {node.name} (MatMul): operands of rank {ra} and {rb} have no MXNet form")


@lowerings.register("Gemm")
def _gemm(em: Emitter, node: Node, name: str | None = None) -> Ref:
    a, b = node.inputs[0], node.inputs[1]
    c = node.inputs[2] if len(node.inputs) > 2 else None
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    ta, tb = node.attr("transA", 0), node.attr("transB", 0)
    w = const_value(b)
    cc = const_value(c)
    if not ta and w is not None and alpha == 1.0 and (c is None or (cc is not None and beta == 1.0)):
        weight = w if tb else w.T
        n = weight.shape[0]
        if c is None or cc.size == n:
            ins = [em.ref(a), em.param(f"{node.name}_weight", weight)]
            if c is not None:
                ins.append(em.param(f"{node.name}_bias", np.broadcast_to(cc, (n,)) if cc.size == n and cc.ndim
                                    else np.full((n,), float(cc.reshape(-1)[0]), dtype=cc.dtype)))
            return em.op("FullyConnected", name or node.name, ins, num_hidden=n, no_bias=c is None, flatten=True)
    n = b.shape[0] if b.shape is not None and len(b.shape) == 2 else None
    if not ta and tb and w is None and alpha == 1.0 and isinstance(n, int) and \
            (c is None or (cc is None and beta == 1.0 and c.shape == (n,))):
        # a trained weight (N, K) and bias (mode='train'): MXNet's Dense as it is, one GEMM each way
        ins = [em.ref(a), em.ref(b)] + ([em.ref(c)] if c is not None else [])
        return em.op("FullyConnected", name or node.name, ins, num_hidden=n, no_bias=c is None, flatten=True)
    r = em.op("dot", f"{node.name}_dot" if alpha != 1.0 or c is not None else name or node.name,
              [em.ref(a), em.ref(b)], transpose_a=bool(ta), transpose_b=bool(tb))
    if alpha != 1.0:
        r = em.op("_mul_scalar", f"{node.name}_alpha" if c is not None else name or node.name, [r], scalar=alpha)
    if c is None:
        return r
    cr = em.ref(c)
    if beta != 1.0:
        cr = em.op("_mul_scalar", f"{node.name}_beta", [cr], scalar=beta)
    return em.op("broadcast_add", name or node.name, [r, cr])


def _pool(em: Emitter, node: Node, pool_type: str) -> Ref:
    kernel = list(node.attr("kernel_shape"))
    n = len(kernel)
    if any(d != 1 for d in (node.attr("dilations") or [1] * n)):
        raise UnsupportedError(f"node {node.name} ({node.op}): dilated pooling has no MXNet form")
    if len(node.outputs) > 1 and node.outputs[1].uses:
        raise UnsupportedError(f"node {node.name} (MaxPool): the indices output has no MXNet form")
    pad, explicit = _spatial_pads(node, n)
    x = em.ref(node.inputs[0])
    attrs: dict[str, Any] = {}
    if explicit:
        if pool_type == "avg" and not node.attr("count_include_pad", 0):
            raise UnsupportedError(f"node {node.name} (AveragePool): asymmetric pads without count_include_pad "
                                   f"have no MXNet form")
        x = _explicit_pad(em, node, x, explicit, float("-inf") if pool_type == "max" else 0.0)
    if pool_type == "avg":
        attrs["count_include_pad"] = bool(node.attr("count_include_pad", 0))
    out = em.op("Pooling", node.name, [x], pool_type=pool_type, kernel=tuple(kernel),
                stride=tuple(node.attr("strides") or [1] * n), pad=tuple(pad),
                pooling_convention="full" if node.attr("ceil_mode", 0) else "valid",
                layout={1: "NCW", 2: "NCHW", 3: "NCDHW"}.get(n), **attrs)
    return [out] + [None] * (len(node.outputs) - 1)


@lowerings.register("MaxPool")
def _maxpool(em: Emitter, node: Node):
    return _pool(em, node, "max")


@lowerings.register("AveragePool")
def _avgpool(em: Emitter, node: Node):
    return _pool(em, node, "avg")


@lowerings.register("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(em: Emitter, node: Node) -> Ref:
    n = (_rank(node.inputs[0]) or 4) - 2
    return em.op("Pooling", node.name, [em.ref(node.inputs[0])], global_pool=True, kernel=(1,) * n,
                 pool_type="avg" if node.op == "GlobalAveragePool" else "max")


@lowerings.register("LRN")
def _lrn(em: Emitter, node: Node) -> Ref:
    return em.op("LRN", node.name, [em.ref(node.inputs[0])], alpha=float(node.attr("alpha")),
                 beta=float(node.attr("beta")), knorm=float(node.attr("bias")), nsize=int(node.attr("size")))


@lowerings.register("Flatten")
def _flatten(em: Emitter, node: Node) -> Ref:
    axis = node.attr("axis", 1)
    x = node.inputs[0]
    if axis == 1:
        return em.op("Flatten", node.name, [em.ref(x)])
    return em.op("reshape", node.name, [em.ref(x)], shape=_need_static(node, node.output))


@lowerings.register("Reshape")
def _reshape(em: Emitter, node: Node) -> Ref:
    target = const_value(node.inputs[1])
    if target is None:
        raise UnsupportedError(f"node {node.name} (Reshape): a computed target shape has no MXNet form")
    spec = [int(t) for t in target.reshape(-1)]
    if node.attr("allowzero", 0) and 0 in spec:
        spec = list(_need_static(node, node.output))
    return em.op("reshape", node.name, [em.ref(node.inputs[0])], shape=tuple(spec))


@lowerings.register("Transpose")
def _transpose(em: Emitter, node: Node) -> Ref:
    perm = node.attr("perm")
    return em.op("transpose", node.name, [em.ref(node.inputs[0])], axes=tuple(perm) if perm else ())


def _axes_of(node: Node, i: int) -> list[int] | None:
    if len(node.inputs) <= i or node.inputs[i] is None:
        return node.attrs.get("axes")
    c = const_value(node.inputs[i])
    if c is None:
        raise UnsupportedError(f"node {node.name} ({node.op}): computed axes have no MXNet form")
    return [int(a) for a in c.reshape(-1)]


@lowerings.register("Squeeze")
def _squeeze(em: Emitter, node: Node) -> Ref:
    axes = _axes_of(node, 1)
    return em.op("squeeze", node.name, [em.ref(node.inputs[0])], axis=None if axes is None else tuple(axes))


@lowerings.register("Unsqueeze")
def _unsqueeze(em: Emitter, node: Node) -> Ref:
    axes = _axes_of(node, 1)
    rank = _rank(node.output)
    if rank is None:
        raise UnsupportedError(f"node {node.name} (Unsqueeze): needs a known output rank")
    r = em.ref(node.inputs[0])
    axes = sorted(a % rank for a in axes)
    for k, a in enumerate(axes):
        r = em.op("expand_dims", node.name if k == len(axes) - 1 else f"{node.name}_{k}", [r], axis=a)
    return r


@lowerings.register("Concat")
def _concat(em: Emitter, node: Node) -> Ref:
    ins = [v for v in node.inputs if v is not None]
    return em.op("Concat", node.name, [em.ref(v) for v in ins], dim=node.attr("axis"), num_args=len(ins))


@lowerings.register("Split")
def _split(em: Emitter, node: Node) -> list[Ref]:
    x = node.inputs[0]
    rank = _rank(x)
    axis = node.attr("axis", 0) % rank
    sizes = [o.shape[axis] if o.shape is not None else None for o in node.outputs]
    if any(not isinstance(s, int) for s in sizes):
        raise UnsupportedError(f"node {node.name} (Split): part sizes must be known")
    # in training, one slice_axis per part: SliceChannel's backward (a concat of the parts' gradients) measured
    # twice as slow on CPU as slice_axis's, e.g. q|k|v of an encoder's projection (benchmarks/training.py)
    if len(set(sizes)) == 1 and not em.graph.meta.get("mxnet.training"):
        return em.op_multi("SliceChannel", node.name, [em.ref(x)], len(sizes), num_outputs=len(sizes), axis=axis)
    outs, start = [], 0
    for k, s in enumerate(sizes):
        outs.append(em.op("slice_axis", f"{node.name}_{k}", [em.ref(x)], axis=axis, begin=start, end=start + s))
        start += s
    return outs


@lowerings.register("Slice")
def _slice(em: Emitter, node: Node) -> Ref:
    x = node.inputs[0]
    shape = _need_static(node, x)
    vals = [const_value(v) if len(node.inputs) > i and node.inputs[i] is not None else None
            for i, v in ((1, node.inputs[1]), (2, node.inputs[2]),
                         (3, node.inputs[3] if len(node.inputs) > 3 else None),
                         (4, node.inputs[4] if len(node.inputs) > 4 else None))]
    starts, ends, axes, steps = vals
    if starts is None or ends is None or (len(node.inputs) > 3 and node.inputs[3] is not None and axes is None) \
            or (len(node.inputs) > 4 and node.inputs[4] is not None and steps is None):
        raise UnsupportedError(f"node {node.name} (Slice): computed bounds have no MXNet form")
    starts, ends = starts.reshape(-1).tolist(), ends.reshape(-1).tolist()
    axes = list(range(len(starts))) if axes is None else [int(a) % len(shape) for a in axes.reshape(-1)]
    steps = [1] * len(starts) if steps is None else steps.reshape(-1).tolist()
    begin, end, step = [None] * len(shape), [None] * len(shape), [None] * len(shape)
    for a, s, e, st in zip(axes, starts, ends, steps):
        # resolve to concrete in-range indices (MXNet rejects ONNX's INT64_MAX sentinels)
        s2, e2, st2 = slice(int(s), int(e), int(st)).indices(shape[a])
        begin[a], step[a] = s2, st2
        end[a] = None if e2 < 0 else e2
    if all(st in (None, 1) for st in step) and sum(b is not None for b in begin) == 1:
        a = next(i for i, b in enumerate(begin) if b is not None)
        return em.op("slice_axis", node.name, [em.ref(x)], axis=a, begin=begin[a],
                     end=shape[a] if end[a] is None else end[a])
    return em.op("slice", node.name, [em.ref(x)], begin=tuple(begin), end=tuple(end), step=tuple(step))


@lowerings.register("Gather")
def _gather(em: Emitter, node: Node) -> Ref:
    data, idx = node.inputs
    axis = node.attr("axis", 0)
    w = const_value(data)
    # Embedding reads float indices: look through the importer's Cast
    src = idx.producer.inputs[0] if idx.producer is not None and idx.producer.op == "Cast" else idx
    if node.meta.get("mxnet_op") == "Embedding" and w is not None and w.ndim == 2 and axis == 0 \
            and src.dtype in ("float32", "float16", "float64"):
        return em.op("Embedding", node.name, [em.ref(src), em.ref(data)], input_dim=w.shape[0],
                     output_dim=w.shape[1], dtype=np.dtype(w.dtype).name)
    return em.op("take", node.name, [em.ref(data), em.ref(idx)], axis=axis, mode="wrap")


@lowerings.register("Softmax", "LogSoftmax")
def _softmax(em: Emitter, node: Node) -> Ref:
    return em.op("softmax" if node.op == "Softmax" else "log_softmax", node.name, [em.ref(node.inputs[0])],
                 axis=node.attr("axis", -1))


@lowerings.register("LayerNormalization")
def _layernorm(em: Emitter, node: Node) -> Ref:
    x, scale = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    rank = _rank(x)
    axis = node.attr("axis", -1) % rank
    eps = float(node.attr("epsilon", 1e-5))
    if len(node.outputs) > 1 and any(o.uses for o in node.outputs[1:]):
        raise UnsupportedError(f"node {node.name} (LayerNormalization): mean/inv-std outputs have no MXNet form")
    d = x.shape[-1]
    if axis != rank - 1:
        raise UnsupportedError(f"node {node.name} (LayerNormalization): normalizing over axes {axis}..{rank - 1} "
                               f"has no MXNet form (LayerNorm normalizes one axis)")
    cs, cb = const_value(scale), const_value(bias)
    g = em.param(f"{node.name}_gamma", np.broadcast_to(cs, (d,)).astype(cs.dtype)) if cs is not None \
        and cs.size in (1, d) else em.ref(scale)
    if bias is None:
        b = em.param(f"{node.name}_beta", np.zeros((d,), dtype=x.dtype or "float32"))
    else:
        b = em.param(f"{node.name}_beta", np.broadcast_to(cb, (d,)).astype(cb.dtype)) if cb is not None \
            and cb.size in (1, d) else em.ref(bias)
    data = em.ref(x)
    if em.graph.meta.get("mxnet.training") and _extension_layer_norm(em, node, [x, scale, bias]):
        # a variable's gradient may be accumulated (grad_req='add'), which lib_api's operators cannot do:
        # an identity in front makes MXNet write or add the operator's gradient itself (ext/layer_norm.cc)
        wrapped = [em.op("_copy", f"{node.name}_{k}", [r]) if em.nodes[r[0]].op == "null" else r
                   for k, r in (("data", data), ("gamma", g), ("beta", b))]
        from aiacc.plugins.mxnet.extension import LAYER_NORM_OP

        out = em.op(LAYER_NORM_OP, node.name, wrapped, eps=eps)
    else:
        out = em.op("LayerNorm", node.name, [data, g, b], axis=-1, eps=eps)
    return [out] + [None] * (len(node.outputs) - 1)


def _extension_layer_norm(em: Emitter, node: Node, inputs: list) -> bool:
    """Whether a training graph's LayerNorm lowers to aiacc's extension operator: float32 only (its kernel's
    type), and only where the library loads; where it does not, MXNet's LayerNorm runs and the reason is a
    reported fallback."""
    if any(v is not None and v.dtype not in (None, "float32") for v in inputs):
        return False
    from aiacc.errors import fallback
    from aiacc.plugins.mxnet.extension import load

    reason = load()
    if reason is not None:
        fallback("mxnet.extension_ops", f"node {node.name} (LayerNormalization) trains with MXNet's own LayerNorm, "
                 f"whose CPU backward is ~20x slower: {reason}")
        return False
    return True


@lowerings.register("Cast")
def _cast(em: Emitter, node: Node) -> Ref:
    return em.op("Cast", node.name, [em.ref(node.inputs[0])], dtype=np.dtype(node.attr("to")).name)


@lowerings.register("Shape")
def _shape(em: Emitter, node: Node) -> Ref:
    r = em.op("shape_array", node.name if node.attr("start", 0) == 0 and node.attr("end") is None
              else f"{node.name}_full", [em.ref(node.inputs[0])])
    if node.attr("start", 0) == 0 and node.attr("end") is None:
        return r
    return em.op("slice_axis", node.name, [r], axis=0, begin=node.attr("start", 0), end=node.attr("end"))


@lowerings.register("Constant")
def _constant(em: Emitter, node: Node) -> Ref:
    if const_value(node.output) is None:  # value_float / value_ints / ... forms: the op computes the array
        return em.param(node.output.name, node.schema.run(node, [])[0])
    return em.ref(node.output)


@lowerings.register("Expand")
def _expand(em: Emitter, node: Node) -> Ref:
    x = node.inputs[0]
    out = _need_static(node, node.output)
    r = em.ref(x)
    rank = _rank(x)
    if rank is None:
        raise UnsupportedError(f"node {node.name} (Expand): needs a known input rank")
    if rank < len(out):
        r = em.op("reshape", f"{node.name}_rank", [r], shape=(1,) * (len(out) - rank) + _need_static(node, x))
    return em.op("broadcast_to", node.name, [r], shape=out)


@lowerings.register("Where")
def _where(em: Emitter, node: Node) -> Ref:
    out = _need_static(node, node.output)
    refs = []
    for k, v in enumerate(node.inputs):
        r = em.ref(v)
        if k == 0 and v.dtype == "bool":  # MXNet's where takes a numeric condition
            src = v.producer.inputs[0] if v.producer is not None and v.producer.op == "Cast" else None
            r = em.ref(src) if src is not None and src.dtype == node.output.dtype \
                else em.op("Cast", f"{node.name}_cond", [r], dtype=node.output.dtype or "float32")
            v = src if src is not None and src.dtype == node.output.dtype else v
        if v.shape != out:
            s = _need_static(node, v)
            if len(s) < len(out):
                r = em.op("reshape", f"{node.name}_r{k}", [r], shape=(1,) * (len(out) - len(s)) + s)
            r = em.op("broadcast_to", f"{node.name}_b{k}", [r], shape=out)
        refs.append(r)
    return em.op("where", node.name, refs)


_CMP = {"Equal": "broadcast_equal", "Less": "broadcast_lesser", "Greater": "broadcast_greater",
        "LessOrEqual": "broadcast_lesser_equal", "GreaterOrEqual": "broadcast_greater_equal"}


@lowerings.register(*_CMP)
def _compare(em: Emitter, node: Node) -> Ref:
    r = em.op(_CMP[node.op], f"{node.name}_f", [em.ref(node.inputs[0]), em.ref(node.inputs[1])])
    return em.op("Cast", node.name, [r], dtype="bool")


_REDUCE = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min"}


@lowerings.register(*_REDUCE)
def _reduce(em: Emitter, node: Node) -> Ref:
    axes = _axes_of(node, 1)
    if axes is None and node.attr("noop_with_empty_axes", 0):
        return em.ref(node.inputs[0])
    return em.op(_REDUCE[node.op], node.name, [em.ref(node.inputs[0])],
                 axis=None if not axes else tuple(axes), keepdims=bool(node.attr("keepdims", 1)))


# -- the ops the importer makes from less common MXNet ops ---------------------------------------

def _fail(node: Node, why: str) -> UnsupportedError:
    return UnsupportedError(f"node {node.name} ({node.qualified_op}): {why}")


def _input(node: Node, i: int):
    return node.inputs[i] if len(node.inputs) > i else None


@lowerings.register("Resize")
def _resize(em: Emitter, node: Node) -> Ref:
    """Nearest resizing of the two spatial axes by one integer factor: MXNet's UpSampling; bilinear
    resizing (align_corners or half_pixel coordinates) of NCHW: MXNet's BilinearResize2D."""
    x = node.inputs[0]
    shape = _need_static(node, x)
    out = _need_static(node, node.output)
    mode = node.attr("mode", "nearest")
    ctm = node.attr("coordinate_transformation_mode", "half_pixel")
    roi = const_value(_input(node, 1))
    if mode == "linear" and ctm in ("align_corners", "half_pixel") and len(shape) == 4 and out[:2] == shape[:2] \
            and not node.attr("antialias", 0) and node.attr("axes") is None and (roi is None or not roi.size):
        return em.op("_contrib_BilinearResize2D", node.name, [em.ref(x)], height=out[2], width=out[3],
                     align_corners=ctm == "align_corners")
    nearest = node.attr("nearest_mode", "round_prefer_floor")
    # with an integer factor s these all pick input pixel floor(i / s)
    exact = (ctm == "asymmetric" and nearest == "floor") or \
        (ctm in ("half_pixel", "pytorch_half_pixel") and nearest in ("round_prefer_floor", "round_prefer_ceil"))
    if mode != "nearest" or not exact or len(shape) != 4 or node.attr("axes") is not None:
        raise _fail(node, f"only nearest (asymmetric/floor or half_pixel) and linear (align_corners or half_pixel) "
                          f"resizing of NCHW have an MXNet form, got mode={mode}, "
                          f"coordinate_transformation_mode={ctm}, nearest_mode={nearest}")
    if out[:2] != shape[:2] or out[2] % shape[2] or out[3] % shape[3] or out[2] // shape[2] != out[3] // shape[3]:
        raise _fail(node, f"MXNet's UpSampling scales both spatial axes by one integer factor, "
                          f"{list(shape)} -> {list(out)} is not such a resize")
    if roi is not None and roi.size:
        raise _fail(node, "a region of interest has no MXNet form")
    return em.op("UpSampling", node.name, [em.ref(x)], scale=out[2] // shape[2], sample_type="nearest",
                 num_args=1)


@lowerings.register("Pad")
def _pad(em: Emitter, node: Node) -> Ref:
    x = node.inputs[0]
    rank = len(_need_static(node, x))
    mode = node.attr("mode", "constant")
    pads = const_value(_input(node, 1))
    value = const_value(_input(node, 2))
    axes = const_value(_input(node, 3))
    if pads is None or (_input(node, 2) is not None and value is None) \
            or (_input(node, 3) is not None and axes is None):
        raise _fail(node, "computed pads have no MXNet form")
    pads = [int(p) for p in pads.reshape(-1)]
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes.reshape(-1)]
    width = [0] * (2 * rank)
    for k, a in enumerate(axes):
        width[2 * a], width[2 * a + 1] = pads[k], pads[len(axes) + k]
    if mode not in ("constant", "edge", "reflect") or rank not in (4, 5) or any(width[:4]) or min(width) < 0:
        raise _fail(node, f"MXNet pads only the spatial axes of 4-d and 5-d tensors (constant, edge or reflect), "
                          f"got mode={mode} pads={pads} on rank {rank}")
    attrs = {"mode": mode, "pad_width": tuple(width)}
    if mode == "constant":
        attrs["constant_value"] = 0.0 if value is None or value.size == 0 else float(value.reshape(-1)[0])
    return em.op("Pad", node.name, [em.ref(x)], **attrs)


@lowerings.register("Tile")
def _tile(em: Emitter, node: Node) -> Ref:
    reps = const_value(node.inputs[1])
    if reps is None:
        raise _fail(node, "computed repeats have no MXNet form")
    return em.op("tile", node.name, [em.ref(node.inputs[0])], reps=tuple(int(r) for r in reps.reshape(-1)))


@lowerings.register("ArgMax", "ArgMin")
def _argmax(em: Emitter, node: Node) -> Ref:
    if node.attr("select_last_index", 0):
        raise _fail(node, "select_last_index has no MXNet form")
    # MXNet returns the indices as floats; ONNX as int64
    r = em.op(node.op.lower(), f"{node.name}_f", [em.ref(node.inputs[0])], axis=node.attr("axis", 0),
              keepdims=bool(node.attr("keepdims", 1)))
    return em.op("Cast", node.name, [r], dtype=np.dtype(node.output.dtype or "int64").name)


@lowerings.register("Mod")
def _mod(em: Emitter, node: Node) -> Ref:
    """Python-style remainder (the sign of the divisor), as MXNet's mod computes it."""
    if node.attr("fmod", 0):
        raise _fail(node, "fmod=1 (C-style remainder) has no MXNet form")
    a, b = node.inputs
    c = const_value(b)
    if c is not None and c.size == 1:
        return em.op("_mod_scalar", node.name, [em.ref(a)], scalar=float(c.reshape(-1)[0]))
    return em.op("broadcast_mod", node.name, [em.ref(a), em.ref(b)])
