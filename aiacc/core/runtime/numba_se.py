"""numba kernel for squeeze-excite's squeeze: global average pool, FC, activation, FC, gate activation in one
call, `gate[n, c] = act2(b2 + W2 @ act1(b1 + W1 @ mean_hw(x[n, c])))`.

A squeeze-excite block (EfficientNet's MBConv, MobileNetV3) computes its gate from a [N, C, H, W] map with a
pooling and two tiny fully connected layers ([C] -> [R] -> [C] per image): at batch 1 these are a few
thousand multiplies each, so the framework's per-op cost (four to six ops: the pool's sum and divide, two
convolutions on a 1x1 map with their set-up) is most of their time. This kernel reads the map once (channels-
last [N, H*W, C] or NCHW [N, C, H*W], float32), accumulates the mean in float64 and runs both layers on the
pooled vector, one call, no temporaries beyond two vectors per image.

    gate = np.empty((n, c), np.float32)
    se_squeeze(x3, channels_last, w1t, b1, w2t, b2, act1, act2, gate)   # acts: ACTS codes (+ params)

`ACTS` names the activations (oneDNN post-op names as the torch exporter spells them). Parallel over images
from `PARALLEL_MIN_ELEMENTS` elements on (the serial variant otherwise: a parallel launch costs more than a
batch-1 squeeze). Compiled with numba's cache=True (this module is a real file). Without numba, importing
this module raises ImportError.
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from aiacc.core.runtime.numba_kernels import _PARALLEL_LOCK, PARALLEL_MIN_ELEMENTS, _configure_threading

_configure_threading()

# activation name -> code the kernel switches on; "hardsigmoid" takes (alpha, beta), "leaky_relu" (slope,)
ACTS = {"none": 0, "relu": 1, "swish": 2, "hardswish": 3, "sigmoid": 4, "hardsigmoid": 5, "tanh": 6,
        "leaky_relu": 7}

_JIT = dict(fastmath=False, error_model="numpy", cache=True, nogil=True)


@numba.njit(inline="always")
def _act(v, code, p0, p1):  # pragma: no cover - compiled
    if code == 1:
        return v if v > 0.0 else 0.0
    if code == 2:
        return v / (1.0 + math.exp(-v))
    if code == 3:
        return v * min(max(v + 3.0, 0.0), 6.0) / 6.0
    if code == 4:
        return 1.0 / (1.0 + math.exp(-v))
    if code == 5:
        return min(max(v * p0 + p1, 0.0), 1.0)
    if code == 6:
        return math.tanh(v)
    if code == 7:
        return v if v >= 0.0 else v * p0
    return v


@numba.njit(inline="always")
def _one(x, i, last, w1t, b1, w2t, b2, a1, p1a, p1b, a2, p2a, p2b, out):  # pragma: no cover - compiled
    # image i: x[i] is [P, C] (channels-last) or [C, P]; the mean in float64, both layers in float64
    if last:
        p, c = x.shape[1], x.shape[2]
        s = np.zeros(c, np.float64)
        for q in range(p):
            for k in range(c):
                s[k] += x[i, q, k]
    else:
        c, p = x.shape[1], x.shape[2]
        s = np.zeros(c, np.float64)
        for k in range(c):
            acc = 0.0
            for q in range(p):
                acc += x[i, k, q]
            s[k] = acc
    # both layers as axpy loops over the weight's rows (independent lanes: they vectorize with fastmath off,
    # a dot-product reduction would not); w1t [C, R] and w2t [R, C] are the layers' transposed weights
    inv = 1.0 / p
    r = w1t.shape[1]
    h = np.zeros(r, np.float64)
    for k in range(c):
        sk = s[k] * inv
        for j in range(r):
            h[j] += w1t[k, j] * sk
    g = np.zeros(c, np.float64)
    for j in range(r):
        hj = _act(h[j] + b1[j], a1, p1a, p1b)
        for k in range(c):
            g[k] += w2t[j, k] * hj
    for k in range(c):
        out[i, k] = _act(g[k] + b2[k], a2, p2a, p2b)


@numba.njit(**_JIT)
def _squeeze_serial(x, last, w1t, b1, w2t, b2, a1, p1a, p1b, a2, p2a, p2b, out):  # pragma: no cover - compiled
    for i in range(x.shape[0]):
        _one(x, i, last, w1t, b1, w2t, b2, a1, p1a, p1b, a2, p2a, p2b, out)


@numba.njit(parallel=True, **_JIT)
def _squeeze_parallel(x, last, w1t, b1, w2t, b2, a1, p1a, p1b, a2, p2a, p2b, out):  # pragma: no cover - compiled
    for i in prange(x.shape[0]):
        _one(x, i, last, w1t, b1, w2t, b2, a1, p1a, p1b, a2, p2a, p2b, out)


class _Calls:
    """How many squeezes ran the compiled kernel in this process (tests check the kernel really ran)."""
    count = 0


CALLS = _Calls()


def se_squeeze(x: np.ndarray, channels_last: bool, w1t: np.ndarray, b1: np.ndarray, w2t: np.ndarray,
               b2: np.ndarray, act1: int, act2: int, out: np.ndarray, params1=(0.0, 0.0),
               params2=(0.0, 0.0)) -> np.ndarray:
    """Write squeeze-excite's gate into `out` [N, C]: x is float32 [N, H*W, C] when `channels_last` else
    [N, C, H*W] (C-contiguous); w1t [C, R] and w2t [R, C] the two layers' weights transposed, b1 [R], b2 [C]
    (float32, C-contiguous); act1 / act2 ACTS codes with their params. Returns out."""
    args = (x, bool(channels_last), w1t, b1, w2t, b2, int(act1), float(params1[0]), float(params1[1]),
            int(act2), float(params2[0]), float(params2[1]), out)
    if x.shape[0] > 1 and x.size >= PARALLEL_MIN_ELEMENTS:
        with _PARALLEL_LOCK:
            _squeeze_parallel(*args)
    else:
        _squeeze_serial(*args)
    CALLS.count += 1
    return out
