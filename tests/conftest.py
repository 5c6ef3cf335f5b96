"""Shared test settings: deterministic seeds and a small thread count (CI has 2 cores)."""
import os

import numpy as np
import pytest

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

try:  # property-based tests: "ci" (bounded, reproducible) unless --hypothesis-profile=long is given
    from hypothesis import HealthCheck, settings

    _quiet = [HealthCheck.too_slow, HealthCheck.data_too_large]
    settings.register_profile("ci", max_examples=200, deadline=None, derandomize=True, suppress_health_check=_quiet)
    settings.register_profile("long", max_examples=3000, deadline=None, suppress_health_check=_quiet)
    settings.load_profile("ci")
except ImportError:  # hypothesis is a test dependency; without it the property tests skip
    pass


@pytest.fixture
def rng():
    """A numpy Generator with a fixed seed."""
    return np.random.default_rng(0)


def pytest_addoption(parser):
    """--update-goldens: rewrite tests/golden/* from the current code instead of comparing (see tests/golden)."""
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="rewrite the golden IR text files under tests/golden instead of comparing with them")


@pytest.fixture
def update_goldens(request) -> bool:
    from tests.golden import update_requested

    return update_requested(request.config)
