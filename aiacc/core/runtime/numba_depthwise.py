"""numba kernel for depthwise 2-D convolution (groups == channels, one filter per channel) with its bias and
activation fused, on channels-last (NHWC) float32 memory.

Why (benchmarks/elementwise.py nets, 2 threads): oneDNN's depthwise convolution costs 150-240 us per call at
batch 1 on 10-40 us of arithmetic (its per-call set-up), which is most of a MobileNetV3/EfficientNet block's
depthwise time. This kernel has almost no set-up: per output pixel the inner loop runs over the channels,
contiguous in NHWC, as one vertical multiply-add per filter tap (the taps unrolled in generated source, so
the accumulator stays in a register and LLVM vectorizes the channel loop with ymm FMAs on AVX2; fastmath is
limited to 'contract', i.e. a*b+c may become one FMA, nothing is reassociated). Interior pixels are computed
UNROLL (2) at a time, so each weight and each shared input column is loaded once for both and their FMA chains
run side by side (measured at batch 8, benchmarks/elementwise.py nets' layers: 0.80x of the one-pixel loop's
time on MobileNetV3's, 0.85x on EfficientNet's). Border pixels run a checked loop; rows outside the image read
a zero row.

    mod = depthwise_kernel(kh, kw, sh, sw, ACTS["hardswish"])   # once per size, stride, act (numba cache=True)
    depthwise(mod, x, w, b, out, ph, pw, p0, p1)
        # x [N, H, W, C], w [KH, KW, C], b [C], out [N, OH, OW, C] (float32, C-contiguous)

`ACTS`: the activations the kernel applies itself (others run after it, in the caller). Parallel over output
rows from `PARALLEL_MIN_MACS` multiply-adds on (a parallel launch costs more than a small convolution).
Without numba, importing this module raises ImportError.
"""
from __future__ import annotations

import os

import numba  # noqa: F401  (ImportError without numba: the callers fall back)
import numpy as np

from aiacc.core.runtime.numba_kernels import _PARALLEL_LOCK, _configure_threading, _load_module

_configure_threading()

# LLVM's loop vectorizer versions a loop on run-time overlap checks, one per (stored array, loaded array) pair,
# and leaves it scalar past this many ("too many memory checks needed"); every output / input column and weight
# tap of the unrolled loop is its own pointer (their distances are multiples of the run-time channel count)
_MAX_CHECKS = 128

# activation -> code; params: hardtanh (lo, hi), leaky_relu (slope,)
ACTS = {"none": 0, "relu": 1, "hardswish": 3, "hardsigmoid": 5, "leaky_relu": 7, "hardtanh": 8}
_ACT_SRC = {0: "{v}", 1: "max({v}, 0.0)", 3: "{v} * min(max({v} + 3.0, 0.0), 6.0) * (1.0 / 6.0)",
            5: "min(max({v} * (1.0 / 6.0) + 0.5, 0.0), 1.0)", 7: "({v} if {v} >= 0.0 else {v} * p0)",
            8: "min(max({v}, p0), p1)"}

# From this many multiply-adds on a call runs the prange variant (measured on the 2-core machine: a parallel
# launch costs ~30-100 us under load, a batch-1 7x7x576 5x5 depthwise convolution is ~80 us serial).
PARALLEL_MIN_MACS = int(os.environ.get("AIACC_DEPTHWISE_PARALLEL_MIN", "3000000"))


def _source(kh: int, kw: int, sh: int, sw: int, act: int, unroll: int = 1) -> str:
    """Generated module: `rows(x, w, b, out, zero, ph, pw, p0, p1, r0, r1)` computes output rows r0..r1 (of
    the N*OH rows), `run_serial(x, w, b, out, zero, ph, pw, p0, p1)` all of them, `run_parallel(..., nt)`
    all of them in one chunk per thread (the prange body is only a call, so it compiles in seconds)."""
    taps = [(i, j) for i in range(kh) for j in range(kw)]
    ln = ["import numba", "from numba import prange", "",
          "_JIT = dict(fastmath={'contract'}, error_model='numpy', nogil=True, boundscheck=False, cache=True)", ""]
    a = ln.append
    a("@numba.njit(**_JIT)")
    a("def rows(x, w, b, out, zero, ph, pw, p0, p1, r0, r1):")
    a("    N, H, W, C = x.shape")
    a("    OH, OW = out.shape[1], out.shape[2]")
    a(f"    lo = min(OW, max(0, (pw + {sw} - 1) // {sw}))")  # first column whose taps are all inside
    a(f"    hi = max(lo, min(OW, (W - {kw} + pw) // {sw} + 1))")  # one past the last such column
    for i, j in taps:
        a(f"    w{i}_{j} = w[{i}, {j}]")
    a("    for r in range(r0, r1):")
    a("        n = r // OH")
    a("        oh = r - n * OH")
    a(f"        ih = oh * {sh} - ph")
    for i in range(kh):
        a(f"        r{i} = x[n, ih + {i}] if 0 <= ih + {i} < H else zero")
    a("        orow = out[n, oh]")
    # border columns (left of lo, from hi on): the taps outside the row are skipped
    a("        for q in range(lo + OW - hi):")
    a("            ow = q if q < lo else hi + q - lo")
    a("            o = orow[ow]")
    a("            for c in range(C):")
    a("                o[c] = b[c]")
    a(f"            for j in range({kw}):")
    a(f"                iw = ow * {sw} - pw + j")
    a("                if iw < 0 or iw >= W:")
    a("                    continue")
    for i in range(kh):
        a(f"                xi{i} = r{i}[iw]")
        a(f"                wi{i} = w[{i}, j]")
    a("                for c in range(C):")
    a("                    o[c] += " + " + ".join(f"xi{i}[c] * wi{i}[c]" for i in range(kh)))
    if act:
        a("            for c in range(C):")
        a("                v = o[c]")
        a("                o[c] = " + _ACT_SRC[act].format(v="v"))
    # interior columns, `unroll` at a time: every tap inside; per channel each weight is loaded once for the
    # outputs and each input column once for the outputs whose taps cover it (5x5, stride 1, 2 outputs: 30
    # input + 25 weight loads for 50 multiply-adds instead of 100 loads), and the outputs' FMA chains are
    # independent (the one-output loop below is one dependent chain of KH*KW FMAs per channel). The unroll is
    # capped so the loop stays under _MAX_CHECKS (depthwise_kernel).
    if unroll > 1:
        a("        ow = lo")
        a(f"        while ow + {unroll} <= hi:")
        a(f"            iw = ow * {sw} - pw")
        a("            for c in range(C):")
        a("                bc = b[c]")
        used = sorted({(i, u * sw + j) for i, j in taps for u in range(unroll)})
        for i, m in used:
            a(f"                t{i}_{m} = r{i}[iw + {m}, c]")
        for i, j in taps:
            a(f"                k{i}_{j} = w[{i}, {j}, c]")
        for u in range(unroll):
            a(f"                v{u} = bc + " + " + ".join(f"t{i}_{u * sw + j} * k{i}_{j}" for i, j in taps))
        for u in range(unroll):
            a(f"                orow[ow + {u}, c] = " + _ACT_SRC[act].format(v=f"v{u}"))
        a(f"            ow += {unroll}")
        a("        for ow in range(ow, hi):")
    else:
        a("        for ow in range(lo, hi):")
    a(f"            iw = ow * {sw} - pw")
    a("            o = orow[ow]")
    for i, j in taps:
        a(f"            x{i}_{j} = r{i}[iw + {j}]")
    a("            for c in range(C):")
    a("                v = b[c] + " + " + ".join(f"x{i}_{j}[c] * w{i}_{j}[c]" for i, j in taps))
    a("                o[c] = " + _ACT_SRC[act].format(v="v"))
    a("")
    a("@numba.njit(**_JIT)")
    a("def run_serial(x, w, b, out, zero, ph, pw, p0, p1):")
    a("    rows(x, w, b, out, zero, ph, pw, p0, p1, 0, out.shape[0] * out.shape[1])")
    a("")
    a("@numba.njit(parallel=True, **_JIT)")
    a("def run_parallel(x, w, b, out, zero, ph, pw, p0, p1, nt):")
    a("    total = out.shape[0] * out.shape[1]")
    a("    nt = max(1, min(nt, total))")
    a("    step = (total + nt - 1) // nt")
    a("    for t in prange(nt):")
    a("        rows(x, w, b, out, zero, ph, pw, p0, p1, t * step, min(total, (t + 1) * step))")
    return "\n".join(ln) + "\n"


# interior output columns per step of the generated loop (1: the one-output loop only)
UNROLL = int(os.environ.get("AIACC_DEPTHWISE_UNROLL", "2"))
_KERNELS: dict[tuple, object] = {}


def depthwise_kernel(kh: int, kw: int, sh: int, sw: int, act: int = 0, unroll: int | None = None):
    """The generated module (run_parallel, run_serial) for one filter size, stride, ACTS code and number of
    interior output columns computed together (`unroll`, default UNROLL), loaded once (each compiled on its
    first call, or loaded from numba's cache)."""
    unroll = max(1, int(UNROLL if unroll is None else unroll))
    while unroll > 1 and unroll * (kh * ((unroll - 1) * sw + kw) + kh * kw + 1) > _MAX_CHECKS:
        unroll -= 1  # more columns at a time would leave the loop scalar (7x7 filters: one at a time)
    key = (int(kh), int(kw), int(sh), int(sw), int(act), unroll)
    mod = _KERNELS.get(key)
    if mod is None:
        mod = _KERNELS[key] = _load_module(_source(*key))
    return mod


class _Calls:
    """How many depthwise convolutions ran the compiled kernel in this process (tests check it ran)."""
    count = 0


CALLS = _Calls()
_ZEROS: dict[tuple, np.ndarray] = {}


def depthwise(mod, x: np.ndarray, w: np.ndarray, b: np.ndarray, out: np.ndarray, ph: int, pw: int,
              p0: float = 0.0, p1: float = 0.0) -> np.ndarray:
    """out = act(depthwise_conv(x, w) + b): x [N, H, W, C], w [KH, KW, C], b [C], out [N, OH, OW, C] (the
    output size fixes the bottom/right padding), float32 C-contiguous; `mod` from depthwise_kernel (its act
    with params p0, p1). Returns out."""
    _, h, wd, c = x.shape
    zero = _ZEROS.get((wd, c))
    if zero is None:
        zero = _ZEROS[(wd, c)] = np.zeros((wd, c), np.float32)  # the row read above / below the image
    kh, kw = w.shape[:2]
    macs = out.size * kh * kw
    if macs >= PARALLEL_MIN_MACS and out.shape[0] * out.shape[1] > 1:
        with _PARALLEL_LOCK:
            mod.run_parallel(x, w, b, out, zero, ph, pw, p0, p1, numba.get_num_threads())
    else:
        mod.run_serial(x, w, b, out, zero, ph, pw, p0, p1)
    CALLS.count += 1
    return out
