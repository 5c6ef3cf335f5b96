"""Bad input gets an aiacc error naming the op that fails and the shapes involved."""
from __future__ import annotations

import pytest
import torch

import aiacc
from aiacc.errors import AiaccError, ShapeError, UnsupportedError
from aiacc.plugins import torch as aiacc_torch
from tests.zoo.torch_models import ZOO


def test_non_module_is_refused():
    with pytest.raises(UnsupportedError, match="torch.nn.Module"):
        aiacc_torch.trace(lambda x: x, (torch.randn(2),))
    with pytest.raises(UnsupportedError):
        aiacc_torch.optimize(object(), (torch.randn(2),))
    with pytest.raises(AiaccError):
        aiacc.optimize(object(), (torch.randn(2),))


def test_wrong_shape_names_the_first_failing_op_and_shapes():
    model, _ = ZOO["resnet18"]()
    bad = torch.randn(2, 4, 64, 64)  # 4 channels where conv1 expects 3
    with pytest.raises(ShapeError) as info:
        aiacc.optimize(model, (bad,))
    msg = str(info.value)
    assert "conv1 (Conv2d)" in msg and "float32[2, 4, 64, 64]" in msg


def test_wrong_dtype_names_the_op():
    model, _ = ZOO["mlp"]()
    with pytest.raises(ShapeError) as info:
        aiacc.trace(model, (torch.randint(0, 5, (4, 32)),))
    msg = str(info.value)
    assert "fc1 (Linear)" in msg and "int64[4, 32]" in msg


def test_wrong_inner_shape_names_a_later_op():
    model, _ = ZOO["mlp"]()
    with pytest.raises(ShapeError, match=r"fc1 \(Linear\).*float32\[4, 31\]"):
        aiacc.trace(model, (torch.randn(4, 31),))


def test_example_inputs_that_do_not_bind_to_forward():
    model, (x,) = ZOO["mlp"]()
    with pytest.raises(ShapeError, match="does not accept the example inputs"):
        aiacc.trace(model, (x, x))
    with pytest.raises(ShapeError, match="needs example inputs"):
        aiacc.trace(model, None)


def test_tracing_has_no_side_effects():
    model, inputs = ZOO["resnet18"]()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    aiacc.trace(model, inputs)
    assert torch.equal(rng, torch.get_rng_state())
    for k, v in model.state_dict().items():
        assert torch.equal(before[k], v), k
