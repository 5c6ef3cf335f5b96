"""The exported module behaves like a torch module: same signature, state_dict keys and output structure;
.to(), torch.save / torch.load and torch.jit.trace work; the batch size may change."""
from __future__ import annotations

import inspect
import io

import pytest
import torch
from torch import nn

import aiacc
from tests.plugins.torch._helpers import assert_close_rel
from tests.zoo.torch_models import ZOO


@pytest.fixture(scope="module")
def resnet():
    model, inputs = ZOO["resnet18"]()
    return model, inputs, aiacc.optimize(model, inputs, level=0)


def test_state_dict_keys_and_signature_match(resnet):
    model, inputs, fast = resnet
    # every parameter and buffer keeps its name; inference does not read the batch counters
    extra = set(model.state_dict()) - set(fast.state_dict())
    assert set(fast.state_dict()) <= set(model.state_dict())
    assert extra and all(k.endswith("num_batches_tracked") for k in extra)
    assert list(inspect.signature(fast.forward).parameters) == list(inspect.signature(model.forward).parameters)


def test_torch_save_and_load(resnet):
    model, inputs, fast = resnet
    buf = io.BytesIO()
    torch.save(fast, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    with torch.no_grad():
        assert_close_rel(model(*inputs), loaded(*inputs))


def test_jit_trace(resnet):
    model, inputs, fast = resnet
    with torch.no_grad():
        traced = torch.jit.trace(fast, inputs)
        assert_close_rel(model(*inputs), traced(*inputs))


def test_to_dtype_and_device(resnet):
    model, inputs, fast = resnet
    fast64 = aiacc.optimize(model, inputs, level=2).to(torch.float64)
    assert all(t.dtype == torch.float64 for t in fast64.state_dict().values() if t.is_floating_point())
    with torch.no_grad():
        out = fast64(inputs[0].double())
        assert out.dtype == torch.float64
        assert_close_rel(model(*inputs).double(), out, 1e-5)
    if torch.cuda.is_available():
        gpu = aiacc.optimize(model, inputs).to("cuda")
        with torch.no_grad():
            assert_close_rel(model(*inputs), gpu(inputs[0].cuda()).cpu(), 1e-4)


def test_other_batch_size(resnet):
    model, _, fast = resnet
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        assert_close_rel(model(x), fast(x))


def test_dict_output_and_keyword_inputs():
    model, (ids,) = ZOO["bert_encoder"]()
    fast = aiacc.optimize(model, {"input_ids": ids})
    with torch.no_grad():
        out = fast(input_ids=ids)
        expected = model(ids)
    assert isinstance(out, dict) and list(out) == list(expected)
    assert_close_rel(expected, out)


class _Defaults(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, scale: float = 2.0, extra=None):
        y = self.fc(x) * scale
        return (y, y + 1) if extra is None else y


def test_non_tensor_arguments_keep_their_defaults():
    model = _Defaults().eval()
    x = torch.randn(2, 4)
    fast = aiacc.optimize(model, (x,))
    params = inspect.signature(fast.forward).parameters
    assert list(params) == ["x", "scale", "extra"] and params["scale"].default == 2.0
    with torch.no_grad():
        out = fast(x)
        assert isinstance(out, tuple) and len(out) == 2
        assert_close_rel(model(x), out)
