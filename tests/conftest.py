"""Shared test settings: deterministic seeds and a small thread count (CI has 2 cores)."""
import os

import numpy as np
import pytest

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture
def rng():
    """A numpy Generator with a fixed seed."""
    return np.random.default_rng(0)
