"""aiacc.core.compare: the one output comparator of the pass manager's debug mode and of the plugins'
verification (aiacc.optimize(verify=True), optimize_file)."""
from __future__ import annotations

import numpy as np
import pytest

from aiacc.core.compare import compare_outputs, float_error, recheck_float64

F = np.float32


def test_equal_outputs_agree():
    e = [np.array([1.0, -2.0], F), np.arange(3), np.array([True, False])]
    assert compare_outputs(e, [a.copy() for a in e], 1e-4, 1e-5) is None


def test_count_shape_and_dtype_are_reported():
    x = np.ones((2, 3), F)
    assert compare_outputs([x, x], [x], 1e-4, 1e-5) == "1 outputs instead of 2"
    assert compare_outputs([x], [np.ones((3, 2), F)], 1e-4, 1e-5) == "output 0 has shape [3, 2] instead of [2, 3]"
    assert compare_outputs([x], [x.astype(np.float64)], 1e-4, 1e-5) == \
        "output 0 has dtype float64 instead of float32"
    assert compare_outputs([np.arange(3)], [np.arange(3).astype(np.int32)], 0, 0) == \
        "output 0 has dtype int32 instead of int64"


def test_tolerance_is_atol_plus_rtol_times_the_largest_expected_magnitude():
    e = np.array([100.0, 1.0], np.float64)
    inside = e + np.array([0.0, 0.0101])   # 0.0101 <= 1e-3 + 1e-4 * 100 = 0.011
    outside = e + np.array([0.0, 0.0111])  # 0.0111 > 0.011
    assert compare_outputs([e], [inside], 1e-4, 1e-3) is None
    problem = compare_outputs([e], [outside], 1e-4, 1e-3)
    assert problem.startswith("output 0 differs by 0.0111 (max |expected| 100")


def test_nan_and_infinity_agree_only_in_the_same_place():
    e = np.array([np.nan, np.inf, -np.inf, 1.0], F)
    assert compare_outputs([e], [e.copy()], 1e-4, 1e-5) is None
    for i, bad in ((0, 1.0), (1, -np.inf), (3, np.nan), (3, np.inf)):
        a = e.copy()
        a[i] = bad
        assert compare_outputs([e], [a], 1e-4, 1e-5).startswith("output 0 differs by"), (i, bad)
    # the original's infinities do not widen the tolerance: the scale is the largest finite magnitude (1.0)
    a = e.copy()
    a[3] = 1.001
    assert compare_outputs([e], [a], 1e-4, 1e-5).startswith("output 0 differs by 0.001 (max |expected| 1,")


def test_exact_dtypes_must_be_equal():
    assert compare_outputs([np.array([1, 2])], [np.array([1, 3])], 1.0, 1.0) == "output 0 differs"
    assert compare_outputs([np.array([True])], [np.array([False])], 1.0, 1.0) == "output 0 differs"


def test_empty_and_complex_outputs():
    assert compare_outputs([np.zeros((0, 3), F)], [np.zeros((0, 3), F)], 1e-4, 1e-5) is None
    e = np.array([1 + 1j, 2 - 1j], np.complex64)
    assert compare_outputs([e], [e.copy()], 1e-4, 1e-5) is None
    assert compare_outputs([e], [e + 0.5j], 1e-4, 1e-5).startswith("output 0 differs by 0.5")


def test_float_error_gives_difference_and_scale():
    err, scale = float_error(np.array([2.0, -4.0, np.nan]), np.array([2.5, -4.0, np.nan]))
    assert err == pytest.approx(0.5) and scale == 4.0
    assert float_error(np.array([np.inf]), np.array([np.inf])) == (0.0, 1e-30)


# -- recheck_float64: a failed float32 comparison decided by both models run in float64 -------------------
def _cancelling(seed=0):
    """float32 outputs of two correct evaluation orders of x + 1e5 - 1e5 (the float64 result is x): each
    rounds to the float32 spacing at 1e5 (0.0078), far beyond rtol of outputs near 1."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(64)
    truth = x.copy()
    original = ((x.astype(F) + F(1e5)) - F(1e5)).astype(F)  # the cancellation, in float32
    optimized = x.astype(F)  # the constants folded first: (1e5 - 1e5) = 0
    return truth, original, optimized


def test_recheck_accepts_a_correct_rewrite_of_an_ill_conditioned_computation():
    truth, original, optimized = _cancelling()
    assert compare_outputs([original], [optimized], 1e-4, 1e-5) is not None  # the float32 check refuses it
    assert recheck_float64([original], [optimized], [truth], [truth.copy()], 1e-4, 1e-5) is None


def test_recheck_refuses_a_rewrite_that_differs_in_float64():
    truth, original, optimized = _cancelling()
    wrong64 = truth * (1 + 1e-3)  # a real change of the function: float64 shows it as float32 did
    why = recheck_float64([original], [optimized], [truth], [wrong64], 1e-4, 1e-5)
    assert why is not None and why.startswith("in float64 too: output 0 differs by")


def test_recheck_refuses_float32_outputs_far_beyond_the_originals_own_error():
    truth, original, _ = _cancelling()
    own = float(np.abs(original.astype(np.float64) - truth).max())
    # float64 agrees (the float64 run may take other kernels), but the float32 result is 40x the original's error
    bad32 = (truth + 40 * own).astype(F)
    why = recheck_float64([original], [bad32], [truth], [truth.copy()], 1e-4, 1e-5)
    assert why is not None and "from the float64 result, the original's own float32 error is" in why
    # within the allowance (atol + rtol * scale + 16x the original's error) it is accepted
    ok32 = (truth + 8 * own).astype(F)
    assert recheck_float64([original], [ok32], [truth], [truth.copy()], 1e-4, 1e-5) is None


def test_recheck_keeps_the_shape_and_nan_rules():
    truth, original, optimized = _cancelling()
    nan = optimized.copy()
    nan[3] = np.nan
    assert "output 0" in recheck_float64([original], [nan], [truth], [truth.copy()], 1e-4, 1e-5)
    assert recheck_float64([original], [optimized], [truth], [truth[:10]], 1e-4, 1e-5) == \
        "in float64 too: output 0 has shape [10] instead of [64]"
