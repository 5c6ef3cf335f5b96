"""The one output comparator: are a model's (or graph's) outputs the same as a reference's?

Used wherever aiacc checks that an optimization preserved numerics: the pass manager's debug mode
(reference executor before and after each pass), `aiacc.optimize(verify=True)` (the original model
against the optimized one) and the plugins' `optimize_file`.

The rule, for each output pair (expected, actual):
- the count, the shapes and the dtypes must be the same;
- integer and boolean outputs must be equal element for element;
- floating outputs agree when max |expected - actual| <= atol + rtol * max |finite expected|, where an
  element counts as equal when both sides hold the same value, including the same infinity, or both hold
  NaN (a NaN the original computes is not an error of the optimization); a NaN or infinity on one side
  only never agrees.
- where that fails and the plugin can run both models in float64 (`Plugin.float64_outputs`),
  `recheck_float64` decides: the float64 outputs must agree, and the optimized float32 outputs be no
  farther from the float64 result than the rule's tolerance plus a multiple of the original's own float32
  error (a model that amplifies float32 rounding is not refused for rounding differently).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def compare_outputs(expected: Sequence[np.ndarray], actual: Sequence[np.ndarray], rtol: float,
                    atol: float) -> str | None:
    """None when `actual` agrees with `expected` (see the module docstring for the rule), else a sentence
    naming the first output that differs and how ("output 2 differs by 0.031 ...")."""
    if len(expected) != len(actual):
        return f"{len(actual)} outputs instead of {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, actual)):
        e, a = np.asarray(e), np.asarray(a)
        if e.shape != a.shape:
            return f"output {i} has shape {list(a.shape)} instead of {list(e.shape)}"
        if e.dtype != a.dtype:
            return f"output {i} has dtype {a.dtype.name} instead of {e.dtype.name}"
        if e.dtype.kind in "fc":
            if not e.size:
                continue
            err, scale = float_error(e, a)
            if not np.isfinite(err) or err > atol + rtol * scale:
                return f"output {i} differs by {err:.3g} (max |expected| {scale:.3g}, rtol={rtol}, atol={atol})"
        elif not np.array_equal(e, a):
            return f"output {i} differs"
    return None


def float_error(expected: np.ndarray, actual: np.ndarray) -> tuple[float, float]:
    """(max absolute difference, max |finite expected| (at least 1e-30)) of two same-shape floating arrays;
    elements equal on both sides (the same infinity, or NaN on both) count as no difference, a NaN or an
    infinity on one side only makes the difference NaN or infinite."""
    e, a = np.asarray(expected), np.asarray(actual)
    with np.errstate(invalid="ignore", over="ignore"):
        same = (np.isnan(e) & np.isnan(a)) | (e == a)
        finite = np.isfinite(e)
        scale = max(float(np.max(np.abs(e[finite]))) if finite.any() else 0.0, 1e-30)
        wide = np.complex128 if "c" in (e.dtype.kind, a.dtype.kind) else np.float64
        diff = np.where(same, 0.0, np.abs(e.astype(wide) - a.astype(wide)))
    return (float(np.max(diff)) if diff.size else 0.0), scale


NOISE_FACTOR = 16.0  # how much farther from float64 than the original the optimized float32 output may be


def recheck_float64(expected: Sequence[np.ndarray], actual: Sequence[np.ndarray], truth: Sequence[np.ndarray],
                    actual64: Sequence[np.ndarray], rtol: float, atol: float,
                    noise_factor: float = NOISE_FACTOR) -> str | None:
    """Decide a float32 comparison that failed (`expected`: the original's float32 outputs, `actual`: the
    optimized model's) with both models run in float64 (`truth`: the original's, `actual64`: the optimized
    one's). None (they agree) when
    - the float64 outputs agree by `compare_outputs` (the optimized computation is the same function: a wrong
      rewrite differs in float64 as much as in float32), and
    - every floating float32 output of the optimized model is no farther from `truth` than atol + rtol * scale
      + `noise_factor` times the original's own float32 distance from `truth` (the float64 run may take other
      kernels; this bounds what only the float32 path does).
    An ill-conditioned model (cancellation, attention softmaxes amplifying rounding) makes two correct float32
    evaluation orders differ by more than rtol; its float64 runs still agree. Else a sentence saying why not."""
    problem = compare_outputs(truth, actual64, rtol, atol)
    if problem:
        return f"in float64 too: {problem}"
    for i, (e, a, t) in enumerate(zip(expected, actual, truth)):
        e, a, t = np.asarray(e), np.asarray(a), np.asarray(t)
        if e.dtype.kind not in "fc" or not e.size:
            continue
        if e.shape != a.shape or t.shape != e.shape:
            return f"output {i} has shape {list(a.shape)} instead of {list(e.shape)}"
        own, scale = float_error(t, e)
        err, _ = float_error(t, a)
        bound = atol + rtol * scale + noise_factor * own
        if not np.isfinite(err) or err > bound:
            return (f"output {i} of the optimized model is {err:.3g} from the float64 result, the original's own "
                    f"float32 error is {own:.3g} (allowed: {bound:.3g})")
    return None
