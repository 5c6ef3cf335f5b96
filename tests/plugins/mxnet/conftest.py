"""Shared fixtures for the MXNet plugin tests: the zoo models, built once per session."""
import numpy as np
import pytest

try:  # mxnet needs numpy's removed aliases restored first: import it the plugin's way
    from aiacc.plugins.mxnet._import import import_mxnet

    import_mxnet()
except ImportError:  # pragma: no cover - mxnet not installed
    pytest.skip("mxnet is not installed", allow_module_level=True)


@pytest.fixture(scope="session")
def zoo():
    """name -> (model, example_inputs), built on first use."""
    from tests.zoo import mxnet_models

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = mxnet_models.ZOO[name]()
        return cache[name]

    return get


def rel_err(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-30))
