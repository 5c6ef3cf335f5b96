"""Every optimize option is checked: an unknown one is an OptionError (an aiacc error and a TypeError) naming
it, the closest known name and every option the plugin has; the known ones are declared in one place
(aiacc.plugins.base.OPTIONS and each plugin's `options`)."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import aiacc
from aiacc.errors import AiaccError, OptionError
from aiacc.plugins import get_plugin
from aiacc.plugins.base import OPTIONS

PLUGINS = ["torch", "tf", "mxnet", "caffe", "onnx"]


@pytest.mark.parametrize("name", PLUGINS)
def test_every_plugin_refuses_an_unknown_option_naming_it_and_listing_the_known(name):
    plugin = get_plugin(name)
    with pytest.raises(OptionError) as info:
        plugin.check_options({"levle": 1})
    msg = str(info.value)
    assert "'levle'" in msg and "did you mean 'level'?" in msg
    for option in plugin.known_options():
        assert option in msg
    assert isinstance(info.value, TypeError) and isinstance(info.value, AiaccError)
    plugin.check_options({k: None for k in plugin.known_options()})  # every declared one is accepted


def test_the_declared_options_include_those_other_work_relies_on():
    assert {"level", "passes", "disable", "backend", "providers", "verify", "debug", "strict", "mode",
            "progress"} <= set(OPTIONS)
    assert "memory_budget" in get_plugin("torch").known_options()
    assert "input_names" in get_plugin("mxnet").known_options()
    assert "memory_budget" not in get_plugin("caffe").known_options()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_aiacc_optimize_refuses_a_misspelt_option_before_doing_any_work():
    import torch

    model = torch.nn.Linear(3, 2).eval()
    x = torch.randn(2, 3)
    with pytest.raises(TypeError, match=r"unknown option 'verfy' \(did you mean 'verify'\?\).*memory_budget"):
        aiacc.optimize(model, (x,), verfy=False)
    with pytest.raises(OptionError, match="unknown option 'memory_limit'"):
        aiacc.optimize(model, (x,), memory_limit=10)
    fast = aiacc.optimize(model, (x,), level=1, verify=True, strict=True, progress=False)  # known ones work
    np.testing.assert_allclose(fast(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-6)


def test_the_onnx_plugin_refuses_a_framework_option_it_does_not_have():
    onnx = pytest.importorskip("onnx")
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])]))
    with pytest.raises(OptionError, match=r"\(ONNX\): unknown option 'memory_budget'"):
        aiacc.optimize(model, {"x": np.ones(2, np.float32)}, memory_budget=1)
