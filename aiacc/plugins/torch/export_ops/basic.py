"""IR op -> torch calls, one lowering per op (ONNX semantics in, torch.nn.functional out).

A lowering, registered in exporter.LOWERINGS under the op's qualified name ("Conv", "aiacc::FusedConv"),
gets the Builder and an LNode (see exporter.py) and returns the fx value of each output.
Constant inputs that torch takes as Python values (shapes, axes, clip bounds, dropout ratios) are read
at export time; everything else stays a tensor so gradients flow.
"""
from __future__ import annotations

import math
import operator

import numpy as np
import torch
import torch.nn.functional as F

from aiacc.core.ops import get_schema
from aiacc.core.ops.fused import parse_program
from aiacc.core.ops.nn import convtranspose_pads, window_params
from aiacc.core.ops.tensor import constant
from aiacc.errors import UnsupportedError
from aiacc.plugins.torch import fastpath
from aiacc.plugins.torch.exporter import LOWERINGS, LNode, arg, linear, resolved_attrs

# ------------------------------------------------------------------------------------------------ elementwise
_UNARY = {
    "Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Exp": torch.exp, "Log": torch.log,
    "Sqrt": torch.sqrt, "Abs": torch.abs, "Neg": torch.neg, "Erf": torch.erf, "Reciprocal": torch.reciprocal,
    "Floor": torch.floor, "Ceil": torch.ceil, "Round": torch.round, "Sign": torch.sign, "Sin": torch.sin,
    "Cos": torch.cos, "Not": torch.logical_not, "HardSwish": F.hardswish, "Softsign": F.softsign, "Mish": F.mish,
    "Softplus": F.softplus, "Selu": F.selu, "Identity": None,
}


def _unary(op):
    fn = _UNARY[op]

    def lower(b, n: LNode):
        x = n.arg(0)
        if fn is None:
            return x
        if op == "Selu" and (n.attr("alpha") != 1.6732632423543772 or n.attr("gamma") != 1.0507009873554805):
            return n.attr("gamma") * b.call(torch.where, b.call(operator.gt, x, 0), x,
                                            n.attr("alpha") * b.call(torch.expm1, x))
        return b.call(fn, x)
    return lower


for _op in _UNARY:
    LOWERINGS.add(_op, _unary(_op))


@LOWERINGS.register("LeakyRelu")
def _leaky(b, n):
    return b.call(F.leaky_relu, n.arg(0), n.attr("alpha", 0.01))


@LOWERINGS.register("Elu")
def _elu(b, n):
    return b.call(F.elu, n.arg(0), n.attr("alpha", 1.0))


@LOWERINGS.register("Gelu")
def _gelu(b, n):
    return b.call(F.gelu, n.arg(0), approximate=n.attr("approximate", "none"))


@LOWERINGS.register("HardSigmoid")
def _hardsigmoid(b, n):
    alpha, beta = n.attr("alpha", 0.2), n.attr("beta", 0.5)
    if abs(alpha - 1 / 6) < 1e-7 and beta == 0.5:
        return b.call(F.hardsigmoid, n.arg(0))
    return b.call(torch.clamp, b.call(operator.add, b.call(operator.mul, n.arg(0), alpha), beta), 0.0, 1.0)


@LOWERINGS.register("Clip")
def _clip(b, n):
    lo = n.scalar(1) if n.n_inputs > 1 and n.values[1] is not None else None
    hi = n.scalar(2) if n.n_inputs > 2 and n.values[2] is not None else None
    if lo == 0 and hi == 6:
        return b.call(F.relu6, n.arg(0))
    if lo == 0 and hi is None:
        return b.call(torch.relu, n.arg(0))
    return b.call(torch.clamp, n.arg(0), lo, hi)


@LOWERINGS.register("PRelu")
def _prelu(b, n):
    x = n.arg(0)
    return b.call(torch.where, b.call(operator.lt, x, 0), b.call(operator.mul, x, n.arg(1)), x)


_BINARY = {"Add": operator.add, "Sub": operator.sub, "Mul": operator.mul, "Pow": torch.pow,
           "And": torch.logical_and, "Or": torch.logical_or, "Xor": torch.logical_xor,
           "Equal": torch.eq, "Less": torch.lt, "Greater": torch.gt, "LessOrEqual": torch.le,
           "GreaterOrEqual": torch.ge}


def _binary(op):
    fn = _BINARY[op]

    def lower(b, n: LNode):
        a, c = n.scalar(0), n.scalar(1)
        if not isinstance(a, torch.fx.Node) and not isinstance(c, torch.fx.Node):
            a = n.arg(0)  # two constants: keep tensors so the dtype is right
        if not isinstance(a, torch.fx.Node) and op in ("Pow", "And", "Or", "Xor") or \
                not isinstance(c, torch.fx.Node) and op in ("And", "Or", "Xor"):
            a, c = n.arg(0), n.arg(1)
        return b.call(fn, a, c)
    return lower


for _op in _BINARY:
    LOWERINGS.add(_op, _binary(_op))


@LOWERINGS.register("Div")
def _div(b, n):
    dtype = n.outputs[0].dtype
    a, c = n.scalar(0), n.scalar(1)
    if not isinstance(a, torch.fx.Node):
        a = n.arg(0)
    if dtype is not None and np.dtype(dtype).kind in "iu":
        return b.call(torch.div, a, c, rounding_mode="trunc")
    return b.call(operator.truediv, a, c)


@LOWERINGS.register("Mod")
def _mod(b, n):
    return b.call(torch.fmod if n.attr("fmod") else torch.remainder, n.arg(0), n.arg(1))


def _variadic(fn):
    def lower(b, n):
        out = n.arg(0)
        for i in range(1, n.n_inputs):
            out = b.call(fn, out, n.arg(i))
        return out
    return lower


LOWERINGS.add("Max", _variadic(torch.maximum))
LOWERINGS.add("Min", _variadic(torch.minimum))
LOWERINGS.add("Sum", _variadic(operator.add))


@LOWERINGS.register("Mean")
def _mean(b, n):
    return b.call(operator.truediv, _variadic(operator.add)(b, n), float(n.n_inputs))


@LOWERINGS.register("Where")
def _where(b, n):
    return b.call(torch.where, n.arg(0), n.scalar(1), n.scalar(2)) if isinstance(n.scalar(1), torch.fx.Node) \
        or isinstance(n.scalar(2), torch.fx.Node) else b.call(torch.where, n.arg(0), n.arg(1), n.arg(2))


@LOWERINGS.register("Cast")
def _cast(b, n):
    return b.method("to", n.arg(0), getattr(torch, np.dtype(n.attr("to")).name))


@LOWERINGS.register("Softmax")
def _softmax(b, n):
    return b.call(torch.softmax, n.arg(0), n.attr("axis", -1))


@LOWERINGS.register("LogSoftmax")
def _log_softmax(b, n):
    return b.call(torch.log_softmax, n.arg(0), n.attr("axis", -1))


@LOWERINGS.register("Dropout")
def _dropout(b, n):
    ratio = n.scalar(1) if n.n_inputs > 1 and n.values[1] is not None else 0.5
    training = n.const(2) if n.n_inputs > 2 and n.values[2] is not None else np.bool_(False)
    if training is None:
        raise UnsupportedError(f"node {n.name}: Dropout with a non-constant training_mode")
    if len(n.outputs) > 1 and n.outputs[1].uses:
        raise UnsupportedError(f"node {n.name}: Dropout's mask output has no torch counterpart")
    if not bool(training) or ratio == 0:
        return [n.arg(0), None]
    return [b.call(F.dropout, n.arg(0), float(ratio), True), None]


# ------------------------------------------------------------------------------------------------ shapes
@LOWERINGS.register("Reshape")
def _reshape(b, n):
    target = n.ints(1)
    if target is None:
        return b.call(torch.reshape, n.arg(0), b.method("tolist", n.arg(1)))
    x = n.arg(0)
    if not n.attr("allowzero"):
        target = [b.method("size", x, i) if t == 0 else t for i, t in enumerate(target)]
    return b.method("reshape", x, *target)


@LOWERINGS.register("Flatten")
def _flatten(b, n):
    axis = n.attr("axis", 1)
    shape = n.shape(0)
    rank = len(shape) if shape is not None else None
    if axis < 0 and rank is not None:
        axis += rank
    if axis == 0:
        return b.method("reshape", n.arg(0), 1, -1)
    y = b.call(torch.flatten, n.arg(0), axis)
    return y if axis == 1 else b.call(torch.flatten, y, 0, axis - 1)


@LOWERINGS.register("Transpose")
def _transpose(b, n):
    perm = n.attr("perm")
    if perm is None:
        perm = list(range(len(n.shape(0))))[::-1]
    return b.method("permute", n.arg(0), *perm)


@LOWERINGS.register("Squeeze")
def _squeeze(b, n):
    axes = n.ints(1) if n.n_inputs > 1 and n.values[1] is not None else None
    if axes is None:
        return b.call(torch.squeeze, n.arg(0))
    return b.call(torch.squeeze, n.arg(0), tuple(axes))


@LOWERINGS.register("Unsqueeze")
def _unsqueeze(b, n):
    axes = n.ints(1)
    rank = len(n.outputs[0].shape) if n.outputs[0].shape is not None else None
    y = n.arg(0)
    for a in sorted(a % rank if rank else a for a in axes):
        y = b.call(torch.unsqueeze, y, a)
    return y


@LOWERINGS.register("Concat")
def _concat(b, n):
    return b.call(torch.cat, n.args, n.attr("axis", 0))


@LOWERINGS.register("Gather")
def _gather(b, n):
    axis = n.attr("axis", 0)
    idx = n.const(1)
    data = n.arg(0)
    if idx is not None and idx.ndim == 0:
        return b.call(torch.select, data, axis, int(idx))
    if idx is not None and idx.ndim == 1 and idx.size > 0 and (idx >= 0).all() \
            and np.array_equal(idx, np.arange(idx[0], idx[0] + idx.size)):
        return b.call(torch.narrow, data, axis, int(idx[0]), int(idx.size))
    shape = n.shape(0)
    if axis == 0 and shape is not None and len(shape) == 2:
        return b.call(F.embedding, n.arg(1), data)  # the embedding-table lookup, with its fast backward
    index = n.arg(1)
    flat = b.call(torch.index_select, data, axis, b.method("reshape", index, -1))
    out_shape = n.outputs[0].shape
    if out_shape is None or not all(isinstance(d, int) for d in out_shape):
        raise UnsupportedError(f"node {n.name}: Gather with a dynamic output shape")
    return b.method("reshape", flat, *out_shape)


@LOWERINGS.register("Expand")
def _expand(b, n):
    out = n.outputs[0].shape
    if out is None or not all(isinstance(d, int) for d in out):
        raise UnsupportedError(f"node {n.name}: Expand to a dynamic shape")
    return b.method("expand", n.arg(0), *out)


@LOWERINGS.register("Shape")
def _shape(b, n):
    t = b.call(torch._shape_as_tensor, n.arg(0))
    start, end = n.attr("start", 0), n.attr("end")
    return b.call(operator.getitem, t, slice(start, end))


@LOWERINGS.register("Constant")
def _constant(b, n):

    return b.constant(np.asarray(constant(**{k: n.attrs.get(k) for k in
                                             ("value", "value_float", "value_floats", "value_int", "value_ints")})))


@LOWERINGS.register("Slice")
def _slice(b, n):
    starts, ends = n.ints(1), n.ints(2)
    axes = n.ints(3) if n.n_inputs > 3 and n.values[3] is not None else list(range(len(starts or [])))
    steps = n.ints(4) if n.n_inputs > 4 and n.values[4] is not None else [1] * len(starts or [])
    shape = n.shape(0)
    if starts is None or ends is None or axes is None or steps is None or shape is None:
        raise UnsupportedError(f"node {n.name}: Slice with non-constant parameters")
    index = [slice(None)] * len(shape)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        if sp <= 0:
            raise UnsupportedError(f"node {n.name}: Slice with a non-positive step")
        index[ax % len(shape)] = slice(st, None if en >= 2 ** 31 - 1 else en, sp)
    return b.call(operator.getitem, n.arg(0), tuple(index))


@LOWERINGS.register("Split")
def _split(b, n):
    axis = n.attr("axis", 0)
    sizes = n.ints(1) if n.n_inputs > 1 and n.values[1] is not None else None
    if sizes is None:
        dim = n.shape(0)[axis]
        k = len(n.outputs)
        num = n.attr("num_outputs")
        chunk = -(-dim // (num or k)) if num else dim // k
        sizes = [min(chunk, dim - chunk * i) for i in range(k)]
    parts = b.call(torch.split, n.arg(0), sizes, axis)
    return [b.call(operator.getitem, parts, i) for i in range(len(n.outputs))]


@LOWERINGS.register("Pad")
def _pad(b, n):
    pads = n.ints(1)
    shape = n.shape(0)
    if pads is None or shape is None:
        raise UnsupportedError(f"node {n.name}: Pad with non-constant pads")
    rank = len(shape)
    axes = n.ints(3) if n.n_inputs > 3 and n.values[3] is not None else list(range(rank))
    k = len(axes)
    widths = {a % rank: (pads[i], pads[k + i]) for i, a in enumerate(axes)}
    # F.pad lists (begin, end) from the last axis backwards, down to the first padded axis (reflect and
    # replicate accept only as many pairs as they pad trailing axes)
    first = min((a for a, w in widths.items() if w != (0, 0)), default=rank - 1)
    torch_pads = []
    for a in range(rank - 1, first - 1, -1):
        torch_pads += list(widths.get(a, (0, 0)))
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}[n.attr("mode")]
    value = n.scalar(2) if n.n_inputs > 2 and n.values[2] is not None else None
    if mode == "constant":
        return b.call(F.pad, n.arg(0), torch_pads, "constant", 0.0 if value is None else value)
    return b.call(F.pad, n.arg(0), torch_pads, mode)


def _reduce(fn, all_fn=None):
    def lower(b, n):
        axes = n.ints(1) if n.n_inputs > 1 and n.values[1] is not None else None
        keep = bool(n.attr("keepdims", 1))
        if not axes:
            if n.attr("noop_with_empty_axes", 0):
                return n.arg(0)
            axes = list(range(len(n.shape(0))))
        return b.call(fn, n.arg(0), tuple(axes), keep)
    return lower


LOWERINGS.add("ReduceMean", _reduce(torch.mean))
LOWERINGS.add("ReduceSum", _reduce(torch.sum))
LOWERINGS.add("ReduceMax", _reduce(torch.amax))
LOWERINGS.add("ReduceMin", _reduce(torch.amin))


# ------------------------------------------------------------------------------------------------ nn
def _sym_pads(n: LNode, pads: list[int], what: str) -> list[int]:
    k = len(pads) // 2
    if pads[:k] != pads[k:]:
        raise UnsupportedError(f"node {n.name}: {what} with asymmetric pads {pads} (add a Pad first)")
    return pads[:k]


def _conv_params(n: LNode):
    shape = n.shape(0)
    w = n.shape(1)
    kernel = list(n.attr("kernel_shape") or w[2:])
    strides, dilations, pads = window_params(shape[2:], kernel, dict(
        auto_pad=n.attr("auto_pad"), strides=n.attr("strides"), dilations=n.attr("dilations"), pads=n.attr("pads")))
    return kernel, strides, dilations, pads


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def conv(b, n: LNode, bias_arg=None, onednn=None, residual=None):
    """The convolution of a Conv-like node. In an inference export a 2-D convolution goes through
    fastpath.conv2d (oneDNN with a pre-packed weight, channels-last; `onednn` = (attr, scalars, algorithm)
    is its fused post-op); otherwise F.convNd."""
    kernel, strides, dilations, pads = _conv_params(n)
    k = len(kernel)
    x = n.arg(0)
    half = pads[:k]
    if pads[:k] != pads[k:]:
        torch_pads = []
        for i in range(k - 1, -1, -1):
            torch_pads += [pads[i], pads[k + i]]
        x = b.call(F.pad, x, torch_pads)
        half = [0] * k
    bias = n.arg(2) if bias_arg is None and n.n_inputs > 2 else bias_arg
    if b.inference and k == 2:
        b.uses_fastpath = True
        attr, scalars, algorithm = onednn or ("none", [], None)
        if residual is not None:
            return b.call(fastpath.conv2d_add_, x, n.arg(1), bias, strides, half, dilations, n.attr("group", 1),
                          residual, attr, scalars, algorithm)
        return b.call(fastpath.conv2d, x, n.arg(1), bias, strides, half, dilations, n.attr("group", 1),
                      attr, scalars, algorithm)
    if onednn is not None or residual is not None:
        raise UnsupportedError(f"node {n.name}: a fused post-op needs the 2-D inference convolution")
    return b.call(_CONV[k], x, n.arg(1), bias, strides, half, dilations, n.attr("group", 1))


LOWERINGS.add("Conv", conv)


@LOWERINGS.register("ConvTranspose")
def _convt(b, n):
    w = n.shape(1)
    kernel = list(n.attr("kernel_shape") or w[2:])
    k = len(kernel)

    strides = list(n.attr("strides") or [1] * k)
    dilations = list(n.attr("dilations") or [1] * k)
    pads, out_pad, _ = convtranspose_pads(list(n.shape(0)[2:]), kernel, strides, dilations, dict(
        auto_pad=n.attr("auto_pad"), pads=n.attr("pads"), output_padding=n.attr("output_padding"),
        output_shape=n.attr("output_shape")))
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[k]
    return b.call(fn, n.arg(0), n.arg(1), n.arg(2) if n.n_inputs > 2 else None, strides,
                  _sym_pads(n, pads, "ConvTranspose"), out_pad, n.attr("group", 1), dilations)


@torch.fx.node.has_side_effect
def count_batch(counter: torch.Tensor) -> None:
    """BatchNorm's num_batches_tracked += 1 (marked side-effectful so fx dead-code elimination keeps it)."""
    counter.add_(1)


@LOWERINGS.register("BatchNormalization")
def _bn(b, n):
    eps = float(n.attr("epsilon", 1e-5))
    if not n.attr("training_mode"):
        return b.call(F.batch_norm, n.arg(0), n.arg(3), n.arg(4), n.arg(1), n.arg(2), False, 0.0, eps)
    state = b.ir.meta.get("torch.state", {})
    has_stats = n.values[3] is not None and n.values[3].name in state
    mean = n.arg(3) if has_stats else None
    var = n.arg(4) if has_stats else None
    y = b.call(F.batch_norm, n.arg(0), mean, var, n.arg(1), n.arg(2), True, 1.0 - float(n.attr("momentum", 0.9)),
               eps)
    counter = n.meta.get("torch.num_batches_tracked")
    if counter is not None and b.ir.has_value(counter):
        b.call(count_batch, arg(b, b.ir.value(counter)))
    return [y, mean, var]


def _pool(b, n, kind):
    shape = n.shape(0)
    kernel = list(n.attr("kernel_shape"))
    k = len(kernel)
    strides, dilations, pads = window_params(shape[2:], kernel, dict(
        auto_pad=n.attr("auto_pad"), strides=n.attr("strides"), dilations=n.attr("dilations"), pads=n.attr("pads")))
    x = n.arg(0)
    half = pads[:k]
    if pads[:k] != pads[k:] or any(p * 2 > kk for p, kk in zip(pads[:k], kernel)):
        if kind == "avg":
            raise UnsupportedError(f"node {n.name}: AveragePool with asymmetric or oversized pads {pads}")
        torch_pads = []
        for i in range(k - 1, -1, -1):
            torch_pads += [pads[i], pads[k + i]]
        x = b.call(F.pad, x, torch_pads, "constant", float("-inf"))
        half = [0] * k
    ceil = bool(n.attr("ceil_mode", 0))
    if kind == "max":
        if len(n.outputs) > 1 and n.outputs[1].uses:
            raise UnsupportedError(f"node {n.name}: MaxPool indices output")
        fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[k]
        return [b.call(fn, x, kernel, strides, half, dilations, ceil), None]
    if any(d != 1 for d in dilations):
        raise UnsupportedError(f"node {n.name}: dilated AveragePool")
    fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[k]
    return b.call(fn, x, kernel, strides, half, ceil, bool(n.attr("count_include_pad", 0)))


LOWERINGS.add("MaxPool", lambda b, n: _pool(b, n, "max"))
LOWERINGS.add("AveragePool", lambda b, n: _pool(b, n, "avg"))


@LOWERINGS.register("GlobalAveragePool")
def _gap(b, n):
    rank = len(n.shape(0))
    if rank == 4:
        return b.call(F.adaptive_avg_pool2d, n.arg(0), 1)
    return b.call(torch.mean, n.arg(0), tuple(range(2, rank)), True)


@LOWERINGS.register("GlobalMaxPool")
def _gmp(b, n):
    return b.call(torch.amax, n.arg(0), tuple(range(2, len(n.shape(0)))), True)


@LOWERINGS.register("LRN")
def _lrn(b, n):
    return b.call(F.local_response_norm, n.arg(0), n.attr("size"), n.attr("alpha", 1e-4), n.attr("beta", 0.75),
                  n.attr("bias", 1.0))


@LOWERINGS.register("MatMul")
def _matmul(b, n):
    return b.call(torch.matmul, n.arg(0), n.arg(1))


def gemm(b, n: LNode, onednn=None):
    """Gemm; `onednn` (a fused post-op) is applied only when the Gemm becomes a linear (check with
    gemm_is_linear first)."""
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    a, w = n.arg(0), n.arg(1)
    c = n.arg(2) if n.n_inputs > 2 else None
    if n.attr("transA"):
        a = b.method("t", a)
    c_shape = n.shape(2) if n.n_inputs > 2 else None
    if n.attr("transB") and alpha == 1.0 and beta == 1.0 and (c is None or (c_shape is not None and len(c_shape) == 1)):
        return linear(b, a, w, c, onednn)
    if n.attr("transB"):
        w = b.method("t", w)
    if c is not None:
        return b.call(torch.addmm, c, a, w, beta=beta, alpha=alpha)
    y = b.call(torch.mm, a, w)
    return y if alpha == 1.0 else b.call(operator.mul, y, alpha)


LOWERINGS.add("Gemm", gemm)


def gemm_is_linear(n: LNode) -> bool:
    c_shape = n.shape(2) if n.n_inputs > 2 and n.values[2] is not None else None
    return bool(n.attr("transB")) and not n.attr("transA") and float(n.attr("alpha", 1.0)) == 1.0 \
        and float(n.attr("beta", 1.0)) == 1.0 and (n.n_inputs < 3 or n.values[2] is None
                                                    or (c_shape is not None and len(c_shape) == 1))


@LOWERINGS.register("LayerNormalization")
def _ln(b, n):
    if len(n.outputs) > 1 and any(o.uses for o in n.outputs[1:]):
        raise UnsupportedError(f"node {n.name}: LayerNormalization mean / inv-std outputs")
    shape = n.shape(0)
    axis = n.attr("axis", -1) % len(shape)
    normalized = list(shape[axis:])
    if not all(isinstance(d, int) for d in normalized):
        normalized = list(n.shape(1))
    bias = n.arg(2) if n.n_inputs > 2 else None
    return [b.call(F.layer_norm, n.arg(0), normalized, n.arg(1), bias, float(n.attr("epsilon", 1e-5))), None, None]


# ------------------------------------------------------------------------------------------------ aiacc fused
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
        key = ("T", id(w))
        if key not in b.env:
            b.env[key] = b.constant(np.ascontiguousarray(w.const.T))
        weight = b.env[key]
    else:
        weight = b.method("t", n.arg(1))
    bias = n.arg(2) if n.n_inputs > 2 and n.values[2] is not None else None
    onednn = fastpath.onednn_activation(act, params) if b.inference else None
    if onednn is not None:
        return linear(b, n.arg(0), weight, bias, onednn)
    y = linear(b, n.arg(0), weight, bias)
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


@LOWERINGS.register("aiacc::FusedElementwise")
def _fused_elementwise(b, n):
    """The program's statements as torch ops (torch fuses nothing here, but each op is one vectorized call)."""
    env = {f"i{k}": n.arg(k) for k in range(n.n_inputs)}
    consts = {f"i{k}": n.const(k) for k in range(n.n_inputs)}
    last = None
    for target, op_type, args, attrs in parse_program(n.attr("program")):
        schema = get_schema(op_type)
        full = {k: spec.default for k, spec in schema.attrs.items()}
        full.update(attrs)
        sub = LNode(b, op_type, full, [], n.outputs, f"{n.name}_{target}", args=[env[a] for a in args])
        # constant operands stay readable as Python numbers
        sub.const = (lambda cs: lambda i: cs[i] if i < len(cs) else None)([consts.get(a) for a in args])
        sub.values = [object()] * len(args)  # every operand present
        sub.shape = (lambda i: None)
        out = LOWERINGS[op_type](b, sub)
        last = env[target] = out[0] if isinstance(out, list) else out
        consts[target] = None
    return last
