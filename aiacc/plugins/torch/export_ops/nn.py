"""Lowerings of the neural-network ops: convolution, batch normalization, pooling, LRN, MatMul / Gemm (oneDNN in
inference exports, see fastpath.py), LayerNormalization.

A lowering, registered in exporter.LOWERINGS under the op's qualified name ("Conv", "aiacc::FusedConv"),
gets the Builder and an LNode (see exporter.py) and returns the fx value of each output. Constant inputs
that torch takes as Python values (shapes, axes, clip bounds, dropout ratios) are read at export time;
everything else stays a tensor so gradients flow.
"""
from __future__ import annotations

import operator

import numpy as np

import torch
import torch.nn.functional as F

from aiacc.core.ops.nn import convtranspose_pads, window_params
from aiacc.errors import UnsupportedError
from aiacc.plugins.torch import fastpath
from aiacc.plugins.torch.exporter import LOWERINGS, arg, linear


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
    if b.inference and k == 2 and onednn is None and residual is None:
        onednn = n.meta.get("torch.conv_epilogue")  # its reader's SiLU as the post-op (numba_op.choose_fusions)
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
    ceil = bool(n.attr("ceil_mode", 0))
    if kind == "avg" and any(d != 1 for d in dilations):
        raise UnsupportedError(f"node {n.name}: dilated AveragePool")
    if pads[:k] != pads[k:] or any(p * 2 > kk for p, kk in zip(pads[:k], kernel)):
        # torch pools take one symmetric pad of at most half the window: pad explicitly instead
        torch_pads = []
        for i in range(k - 1, -1, -1):
            torch_pads += [pads[i], pads[k + i]]
        if kind == "avg":
            return _padded_avg_pool(b, n, x, shape, kernel, strides, torch_pads, ceil)
        x = b.call(F.pad, x, torch_pads, "constant", float("-inf"))
        half = [0] * k
    if kind == "max":
        if len(n.outputs) > 1 and n.outputs[1].uses:
            raise UnsupportedError(f"node {n.name}: MaxPool indices output")
        fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[k]
        return [b.call(fn, x, kernel, strides, half, dilations, ceil), None]
    fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[k]
    return b.call(fn, x, kernel, strides, half, ceil, bool(n.attr("count_include_pad", 0)))


def _padded_avg_pool(b, n, x, shape, kernel, strides, torch_pads, ceil):
    """AveragePool (undilated) with pads torch's pools cannot take: a window sum over the zero-padded input
    divided by a constant count of the elements each window holds (the pads among them only with
    count_include_pad), as the reference kernel divides."""
    k = len(kernel)
    fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[k]
    pad_counts = 1.0 if n.attr("count_include_pad", 0) else 0.0
    ones = F.pad(torch.ones((1, 1, *shape[2:]), dtype=torch.float64), torch_pads, "constant", pad_counts)
    # both pools divide each window by the same size, so their ratio is the window's sum over its count
    counts = fn(ones, kernel, strides, 0, ceil, True).numpy().astype(np.dtype(n.outputs[0].dtype or "float32"))
    padded = b.call(F.pad, x, torch_pads, "constant", 0.0)
    return b.call(torch.div, b.call(fn, padded, kernel, strides, 0, ceil, True), b.constant(counts))


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
    bias_ok = alpha == 1.0 and beta == 1.0 and (c is None or (c_shape is not None and len(c_shape) == 1))
    if n.attr("transB") and bias_ok:
        return linear(b, a, w, c, onednn, node=n)
    if not n.attr("transB") and bias_ok and b.inference and _const_matrix(n.values[1]) is not None:
        # a constant [K, N] weight (GPT-2's Conv1D) is transposed once, at export, so the product runs as
        # oneDNN's inner product on a prepacked weight rather than addmm
        return linear(b, a, transposed_constant(b, n.values[1]), c, onednn, node=n)
    if n.attr("transB"):
        w = b.method("t", w)
    if c is not None:
        return b.call(torch.addmm, c, a, w, beta=beta, alpha=alpha)
    y = b.call(torch.mm, a, w)
    return y if alpha == 1.0 else b.call(operator.mul, y, alpha)


LOWERINGS.add("Gemm", gemm)


def _const_matrix(v) -> np.ndarray | None:
    c = getattr(v, "const", None) if v is not None else None
    return c if c is not None and c.ndim == 2 else None


def transposed_constant(b, v):
    """The constant matrix `v` transposed, as one contiguous export constant shared by every reader."""
    key = ("T", id(v))
    if key not in b.env:
        b.env[key] = b.constant(np.ascontiguousarray(v.const.T))
    return b.env[key]


def gemm_is_linear(n: LNode, inference: bool = True) -> bool:
    """Whether `gemm` lowers the Gemm to a linear (so a fused post-op can run in it): W transposed, or in an
    inference export a constant W, which is transposed at export."""
    c_shape = n.shape(2) if n.n_inputs > 2 and n.values[2] is not None else None
    trans_b = bool(n.attr("transB")) or (inference and _const_matrix(n.values[1]) is not None)
    return trans_b and not n.attr("transA") and float(n.attr("alpha", 1.0)) == 1.0 \
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
