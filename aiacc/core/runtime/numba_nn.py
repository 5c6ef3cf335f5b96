"""numba kernels for the window ops of aiacc's runtime: 2-d MaxPool / AveragePool (pads, ceil_mode,
dilations, count_include_pad: every form ONNX and Caffe give them) and cross-channel LRN, each written
straight into the output's arena view in one pass over the input (parallel over images x channels).

The numpy forms they replace make one pass per kernel tap (pooling) or float64 temporaries of the whole
tensor (LRN): measured on SqueezeNet 1.1 (batch 1, 2 threads), its three ceil-mode MaxPools took 125 of the
net's 159 ms in the reference kernel.

    ok = pool_into(node, [x], out)      # False: not a form these kernels take (the caller runs another)
    ok = lrn_into(node, [x], out)

Compiled with numba's cache=True (this module is a real file, so a fresh process loads the machine code).
Without numba, importing this module raises ImportError and the runtime keeps its numpy kernels.
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from aiacc.core.ir import Node
from aiacc.core.ops.nn import window_params
from aiacc.core.ops.shape_utils import conv_output_size
from aiacc.core.runtime.numba_kernels import _PARALLEL_LOCK, _configure_threading

_configure_threading()

_JIT = dict(parallel=True, fastmath=False, error_model="numpy", cache=True, nogil=True)


@numba.njit(inline="always")
def _span(o0, k, d, size):  # pragma: no cover - compiled
    """Taps k0 <= t < k1 of a window starting at o0 (stride d between taps) that fall inside [0, size)."""
    k0 = 0 if o0 >= 0 else (-o0 + d - 1) // d
    k1 = min(k, (size - o0 + d - 1) // d) if size > o0 else 0
    return k0, max(k0, k1)


@numba.njit(inline="always")
def _outs(tap, s, pad, size, n_out):  # pragma: no cover - compiled
    """Outputs o with 0 <= o * s - pad + tap < size, as a range [o0, o1)."""
    lo = pad - tap
    o0 = 0 if lo <= 0 else (lo + s - 1) // s
    hi = size - 1 + pad - tap
    o1 = 0 if hi < 0 else min(n_out, hi // s + 1)
    return o0, max(o0, o1)


@numba.njit(**_JIT)
def _max_pool2d(x, out, kh, kw, sh, sw, pt, pl, dh, dw):  # pragma: no cover - compiled
    # row by row: each tap is one pass along an output row (the loop the compiler vectorizes), the taps'
    # bounds computed, not tested per element; padding never wins (-inf) and NaN propagates as numpy's max
    n, c, h, w = x.shape
    oh, ow = out.shape[2], out.shape[3]
    for nc in prange(n * c):
        i = nc // c
        j = nc - i * c
        for oy in range(oh):
            orow = out[i, j, oy]
            orow[:] = -np.inf
            y0 = oy * sh - pt
            ky0, ky1 = _span(y0, kh, dh, h)
            for ky in range(ky0, ky1):
                xrow = x[i, j, y0 + ky * dh]
                for kx in range(kw):
                    o0, o1 = _outs(kx * dw, sw, pl, w, ow)
                    base = kx * dw - pl
                    for ox in range(o0, o1):
                        v = xrow[ox * sw + base]
                        m = orow[ox]
                        orow[ox] = v if (v > m or v != v) else m


@numba.njit(**_JIT)
def _avg_pool2d(x, out, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, include_pad):  # pragma: no cover - compiled
    n, c, h, w = x.shape
    oh, ow = out.shape[2], out.shape[3]
    for nc in prange(n * c):
        i = nc // c
        j = nc - i * c
        acc = np.zeros(ow, np.float64)
        for oy in range(oh):
            acc[:] = 0.0
            y0 = oy * sh - pt
            ky0, ky1 = _span(y0, kh, dh, h)
            for ky in range(ky0, ky1):
                xrow = x[i, j, y0 + ky * dh]
                for kx in range(kw):
                    o0, o1 = _outs(kx * dw, sw, pl, w, ow)
                    base = kx * dw - pl
                    for ox in range(o0, o1):
                        acc[ox] += xrow[ox * sw + base]
            # the divisor: taps inside the input, or inside the input with its explicit pads (never
            # ceil_mode's extra end)
            if include_pad:
                cy0, cy1 = _span(y0 + pt, kh, dh, h + pt + pb)
            else:
                cy0, cy1 = ky0, ky1
            for ox in range(ow):
                x0 = ox * sw - pl
                if include_pad:
                    cx0, cx1 = _span(x0 + pl, kw, dw, w + pl + pr)
                else:
                    cx0, cx1 = _span(x0, kw, dw, w)
                cnt = (cy1 - cy0) * (cx1 - cx0)
                out[i, j, oy, ox] = acc[ox] / cnt if cnt else np.nan


@numba.njit(**_JIT)
def _lrn(x, out, size, alpha, beta, bias):  # pragma: no cover - compiled
    # ONNX LRN: the window of `size` channels around each one (floor((size-1)/2) before), squares summed
    n, c = x.shape[0], x.shape[1]
    hw = x.shape[2]
    lo = (size - 1) // 2
    hi = size - 1 - lo
    scale = alpha / size
    for p in prange(n * c):  # one output channel per iteration: the inner loops run along memory
        i = p // c
        k = p - i * c
        acc = np.zeros(hw, np.float64)
        for t in range(max(0, k - lo), min(c, k + hi + 1)):
            for q in range(hw):
                v = np.float64(x[i, t, q])
                acc[q] += v * v
        if beta == 0.75:  # Caffe's default: d^0.75 as two square roots (a pow is ~10x their cost)
            for q in range(hw):
                d = bias + scale * acc[q]
                r = math.sqrt(d)
                out[i, k, q] = x[i, k, q] / (r * math.sqrt(r))
        else:
            for q in range(hw):
                out[i, k, q] = x[i, k, q] / (bias + scale * acc[q]) ** beta


def _plain(x: np.ndarray, out: np.ndarray) -> bool:
    return (x.dtype == out.dtype and x.dtype in (np.float32, np.float64) and x.flags.c_contiguous
            and out.flags.c_contiguous and not np.may_share_memory(x, out))


def pool_into(node: Node, args: list, out: np.ndarray) -> bool:
    """2-d MaxPool (one output) / AveragePool of a float32/64 NCHW input written into `out`; False for any
    other form (3-d, the indices output, an aliased output), which the caller runs another way."""
    x = args[0] if args else None
    kernel = node.attr("kernel_shape")
    if (x is None or x.ndim != 4 or kernel is None or len(kernel) != 2 or len(node.outputs) != 1
            or not _plain(x, out)):
        return False
    strides, dilations, pads = window_params(x.shape[2:], kernel, {
        "auto_pad": node.attr("auto_pad"), "strides": node.attr("strides"),
        "dilations": node.attr("dilations"), "pads": node.attr("pads")})
    ceil = bool(node.attr("ceil_mode", 0))
    want = tuple(conv_output_size(x.shape[2 + i], kernel[i], strides[i], pads[i], pads[2 + i], dilations[i], ceil)
                 for i in range(2))
    if out.shape != x.shape[:2] + want:
        return False
    with _PARALLEL_LOCK:
        if node.op == "MaxPool":
            _max_pool2d(x, out, kernel[0], kernel[1], strides[0], strides[1], pads[0], pads[1],
                        dilations[0], dilations[1])
        else:
            _avg_pool2d(x, out, kernel[0], kernel[1], strides[0], strides[1], pads[0], pads[1], pads[2], pads[3],
                        dilations[0], dilations[1], bool(node.attr("count_include_pad", 0)))
    return True


def lrn_into(node: Node, args: list, out: np.ndarray) -> bool:
    """LRN of a float32/64 input of rank >= 3 written into `out` (False: another form)."""
    x = args[0] if args else None
    size = node.attr("size")
    if x is None or x.ndim < 3 or size is None or x.shape != out.shape or not _plain(x, out):
        return False
    shape = (x.shape[0], x.shape[1], int(math.prod(x.shape[2:])))
    with _PARALLEL_LOCK:
        _lrn(x.reshape(shape), out.reshape(shape), int(size), float(node.attr("alpha", 1e-4)),
             float(node.attr("beta", 0.75)), float(node.attr("bias", 1.0)))
    return True


__all__ = ["pool_into", "lrn_into"]
