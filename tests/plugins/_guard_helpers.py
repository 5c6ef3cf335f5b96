"""Shared by the TF and MXNet batch- and shape-guard tests (test_batch_guards.py, tf/ and mxnet/test_shape_guard.py)."""
from __future__ import annotations

import warnings

import numpy as np

import aiacc


def optimize_quietly(model, x, **kw):
    """aiacc.optimize with its warnings (fallback notices, framework deprecations) silenced: these tests
    assert on the result and the report, not on what was warned."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return aiacc.optimize(model, x, **kw)


def rand(*shape, seed=0):
    """A seeded standard-normal float32 array of `shape`."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
