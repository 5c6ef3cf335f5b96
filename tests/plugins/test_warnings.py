"""No silent fallbacks: whatever aiacc does less than asked is warned once per cause (AiaccWarning), listed in
the pass report's `fallbacks`, and refused with strict=True (FallbackError)."""
from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest

import aiacc
from aiacc.errors import AiaccError, AiaccWarning, FallbackError, UnsupportedError

torch = pytest.importorskip("torch")
nn = torch.nn


def _aiacc_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, AiaccWarning)]


def _optimize(model, x, **options):
    """aiacc.optimize, returning (result, the AiaccWarnings it gave)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = aiacc.optimize(model, (x,), **options)
    return fast, _aiacc_warnings(caught)


class DataDependent(nn.Module):
    """No trace holds a loop whose trip count is read from a tensor's values with int() (a value guard fixes
    which way a branch goes, not a count)."""

    def forward(self, x):
        for _ in range(int((x > 0).sum())):
            x = x * 0.9
        return x - 1


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.branchy = DataDependent()
        self.second = nn.Linear(4, 3)

    def forward(self, x):
        return self.second(torch.relu(self.branchy(self.first(x))))


def test_an_untraceable_model_is_one_opaque_call_warned_reported_and_refused_by_strict():
    model, x = DataDependent().eval(), torch.randn(2, 4)
    fast, said = _optimize(model, x)
    assert len(said) == 1, said
    assert "torch.fx cannot trace DataDependent" in said[0] and "whole model" in said[0] and "opaque" in said[0]
    assert "int()" in said[0] and "Proxy" in said[0]  # why: the error of int() on a traced value
    assert fast.aiacc_report.fallbacks == [said[0][len("aiacc: "):]]
    assert "fallbacks: torch.fx cannot trace DataDependent" in str(fast.aiacc_report)
    assert torch.allclose(fast(x), model(x))
    with pytest.raises(FallbackError, match="whole model.*strict=True"):
        aiacc.optimize(model, (x,), strict=True)


def test_an_untraceable_submodule_goes_opaque_with_a_warning_naming_it():
    model, x = Outer().eval(), torch.randn(2, 4)
    fast, said = _optimize(model, x)
    assert len(said) == 1, said
    assert "submodule branchy (DataDependent) is kept opaque" in said[0]
    assert fast.aiacc_report.fallbacks and "branchy" in fast.aiacc_report.fallbacks[0]
    assert torch.allclose(fast(x), model(x), atol=1e-6)
    with pytest.raises(FallbackError, match="branchy"):
        aiacc.optimize(model, (x,), strict=True)
    assert issubclass(FallbackError, AiaccError) and issubclass(FallbackError, UnsupportedError)


def _bn_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())


def test_a_fresh_module_in_train_mode_says_it_gets_training_semantics():
    model, x = _bn_net(), torch.randn(2, 3, 8, 8)
    assert model.training  # as built
    fast, said = _optimize(model, x)
    assert len(said) == 1, said
    assert "is in train mode" in said[0] and "training semantics" in said[0] and "model.eval()" in said[0]
    assert fast.aiacc_report.mode == "train"
    assert fast.aiacc_report.fallbacks == [said[0][len("aiacc: "):]]
    with pytest.raises(FallbackError, match="train mode"):
        aiacc.optimize(_bn_net(), (x,), strict=True)
    # saying the mode, or eval(), is no fallback: no warning, and strict accepts it
    for m, opts in ((_bn_net(), {"mode": "train"}), (_bn_net().eval(), {})):
        fast, said = _optimize(m, x, strict=True, **opts)
        assert said == [] and fast.aiacc_report.fallbacks == []
    assert "BatchNormalization" not in fast.aiacc_report.ops_after  # inference: the BatchNorm is folded


def test_each_cause_is_warned_once_per_optimize(monkeypatch):
    from aiacc.plugins.torch.importer import FUNCTIONS

    def broken(imp, *args, **kwargs):
        raise TypeError("unexpected keyword argument")
    monkeypatch.setitem(FUNCTIONS._entries, torch.tanh, broken)

    class Tanhs(nn.Module):
        def forward(self, x):
            return torch.tanh(torch.tanh(torch.tanh(x) + 1) * 2)
    model, x = Tanhs().eval(), torch.randn(3)
    fast, said = _optimize(model, x)
    assert len(said) == 1 and "stays opaque: its converter failed: TypeError" in said[0], said
    assert len(fast.aiacc_report.fallbacks) == 1
    assert torch.allclose(fast(x), model(x))
    with pytest.raises(FallbackError, match="converter failed"):
        aiacc.optimize(model, (x,), strict=True)


def test_a_clean_model_gives_no_warning_and_passes_strict():
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2)).eval(), torch.randn(3, 4)
    fast, said = _optimize(model, x, strict=True)
    assert said == [] and fast.aiacc_report.fallbacks == []
    np.testing.assert_allclose(fast(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_mxnet_converter_fallback_is_an_aiacc_warning_and_strict_refuses_it(monkeypatch):
    if importlib.util.find_spec("mxnet") is None:
        pytest.skip("mxnet is not installed")
    from aiacc.plugins.mxnet._import import import_mxnet

    mx = import_mxnet()
    from aiacc.core.translate import OpTable
    from aiacc.plugins.mxnet import importer

    def broken(ctx):
        raise IndexError("converter bug")
    table = OpTable("mxnet import (test)")
    table.update(importer.converters)
    table.add("Activation", broken, replace=True)
    monkeypatch.setattr(importer, "converters", table)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(3, activation="tanh"))
    net.initialize()
    x = mx.nd.array(np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = aiacc.optimize(net, [x.asnumpy()])
    said = _aiacc_warnings(caught)
    assert len(said) == 1 and "kept opaque: its converter failed (IndexError" in said[0], said
    assert fast.aiacc_report.fallbacks
    with pytest.raises(FallbackError, match="converter failed"):
        aiacc.optimize(net, [x.asnumpy()], strict=True)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_train_mode_module_with_mode_inference_is_verified_in_eval_semantics():
    """A module left in train mode, optimized with mode='inference': traced and verified against the original
    in eval mode (BatchNorm's running statistics, no Dropout), with a warning and a report line saying so; the
    module's own train flags are restored."""
    import torch

    from aiacc.errors import AiaccWarning

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.Dropout(0.5), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2))
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    model.train()
    x = torch.randn(2, 3, 8, 8)
    with pytest.warns(AiaccWarning, match="eval semantics"):
        fast = aiacc.optimize(model, (x,), mode="inference", strict=True, progress=False)
    assert model.training and all(m.training for m in model.modules())  # the user's mode is kept
    assert not fast.training
    assert any(line.startswith("mode: ") and "eval semantics" in line for line in fast.aiacc_report.interface)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)
    assert fast.aiacc_report["batchnorm_folding"].removed > 0  # eval semantics: BatchNorm folded


@pytest.mark.skipif(importlib.util.find_spec("mxnet") is None, reason="mxnet is not installed")
def test_mxnet_variable_without_a_parameter_warns_instead_of_becoming_a_silent_input(tmp_path):
    from aiacc.errors import collecting_fallbacks
    from aiacc.plugins import get_plugin
    from aiacc.plugins.mxnet._import import import_mxnet

    mx = import_mxnet()
    data = mx.sym.var("data")
    net = mx.sym.FullyConnected(mx.sym.Activation(data, act_type="relu"), num_hidden=3, name="fc1")
    net.save(str(tmp_path / "m-symbol.json"))
    mx.nd.save(str(tmp_path / "m-0000.params"), {"arg:fc1_bias": mx.nd.zeros(3)})  # fc1_weight is missing
    plugin = get_plugin("mxnet")
    with pytest.warns(AiaccWarning, match=r"variable 'fc1_weight' \(read by .*fc1.*\) has no value in the "
                                          r"parameters: it is loaded as an extra model input"):
        g = plugin.load_file(str(tmp_path / "m-symbol.json"))
    assert [v.name for v in g.inputs] == ["data", "fc1_weight"]
    with pytest.raises(FallbackError, match="fc1_weight"), collecting_fallbacks(strict=True):
        plugin.load_file(str(tmp_path / "m-symbol.json"))
    # the data input alone (a variable no layer reads as a parameter) loads without a warning
    mx.nd.save(str(tmp_path / "m-0000.params"), {"arg:fc1_bias": mx.nd.zeros(3), "arg:fc1_weight": mx.nd.ones((3, 4))})
    with warnings.catch_warnings():
        warnings.simplefilter("error", AiaccWarning)
        assert [v.name for v in plugin.load_file(str(tmp_path / "m-symbol.json")).inputs] == ["data"]
