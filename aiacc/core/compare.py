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
