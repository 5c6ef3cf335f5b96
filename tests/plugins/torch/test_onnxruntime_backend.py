"""backend='onnxruntime': the optimized graph in an onnxruntime session, wrapped in an nn.Module."""
from __future__ import annotations

import pytest
import torch

import aiacc
from tests.plugins.torch._helpers import assert_close_rel
from tests.zoo.torch_models import ZOO

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("name", ["resnet18", "bert_encoder", "mlp", "with_opaque"])
def test_onnxruntime_backend_matches(name):
    model, inputs = ZOO[name]()
    fast = aiacc.optimize(model, inputs, backend="onnxruntime")
    assert isinstance(fast, torch.nn.Module)
    with torch.no_grad():
        expected = model(*inputs)
    actual = fast(*inputs)
    assert type(actual) is type(expected)
    assert_close_rel(expected, actual, 1e-4)
    if name == "with_opaque":
        assert fast.runner.num_opaque == 2  # the custom Function and the data-dependent branch run in torch


def test_onnxruntime_backend_refuses_training():
    model, inputs = ZOO["mlp"]()
    model.train()
    with pytest.raises(aiacc.AiaccError, match="inference only"):
        aiacc.optimize(model, inputs, backend="onnxruntime")
