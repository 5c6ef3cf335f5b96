"""Stochastic depth however the model calls it: torchvision's StochasticDepth module, its stochastic_depth
function imported by name into the user's module (fx.wrap patches the name only where torchvision binds
it, so fx used to trace into the body: an in-place draw on a constant), and timm's DropPath / drop_path.
In train mode each is Dropout on a ones mask: the exported model draws exactly the original's mask under
the same seed, at the traced batch size and at another one; in eval mode it is gone."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import aiacc
from tests.reach import _models as M
from tests.reach.test_reach import needs_timm, needs_tv


stochastic_depth = drop_path = DropPath = None  # bound by _net, as `from torchvision.ops import ...` binds them


class _Net(nn.Module):
    """Calls the functions through this module's globals, the way a user's module that imported them by
    name does (fx.wrap patched only torchvision's own global)."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.conv = nn.Conv2d(3, 3, 1)
        if how == "timm_module":
            self.dp = DropPath(0.3)
        elif how == "timm_noscale":
            self.dp = DropPath(0.3, scale_by_keep=False)

    def forward(self, x):
        y = self.conv(x)
        if self.how == "tv_function_row":
            return x + stochastic_depth(y, 0.4, "row", self.training)
        if self.how == "tv_function_batch":
            return x + stochastic_depth(y, 0.4, "batch", self.training)
        if self.how == "timm_function":
            return x + drop_path(y, 0.3, self.training)
        return x + self.dp(y)


def _net(how):
    global stochastic_depth, drop_path, DropPath
    stochastic_depth = M.torchvision().ops.stochastic_depth
    if how.startswith("timm"):
        M.timm()  # first: it imports torchvision the way this environment needs
        from timm import layers
        drop_path, DropPath = layers.drop_path, layers.DropPath
    return _Net(how)


CASES = [pytest.param("tv_function_row", marks=needs_tv), pytest.param("tv_function_batch", marks=needs_tv),
         pytest.param("timm_function", marks=needs_timm), pytest.param("timm_module", marks=needs_timm),
         pytest.param("timm_noscale", marks=needs_timm)]


@pytest.mark.parametrize("how", CASES)
def test_drop_path_in_training_draws_the_originals_mask(how):
    model = _net(how).train()
    x = torch.randn(8, 3, 4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, (x,), mode="train")
    assert [n.op for n in graph if n.is_opaque] == [], graph.meta.get("torch.opaque_reasons")
    assert "Dropout" in [n.op for n in graph]
    exported = aiacc.export(graph, "torch")
    outs = []
    for seed, batch in ((1, 8), (2, 8), (3, 5)):  # batch 5: the row mask takes its size from the input
        fresh = torch.randn(batch, 3, 4, 4)
        torch.manual_seed(seed)
        expected = model(fresh)
        torch.manual_seed(seed)
        outs.append(exported(fresh))
        assert torch.equal(outs[-1], expected)
    assert not torch.equal(outs[0], outs[1]) or how == "tv_function_batch"  # a fresh mask on every call
    model.eval()
    graph = aiacc.trace(model, (x,))
    assert [n.op for n in graph if n.is_opaque] == [] and "Dropout" not in [n.op for n in graph]
    fast = aiacc.optimize(model, (x,))
    fresh = torch.randn(8, 3, 4, 4)
    with torch.no_grad():
        assert torch.allclose(fast(fresh), model(fresh), atol=1e-5)


@needs_tv
def test_optimize_in_train_mode_with_the_function_imported_by_name():
    """The bug: optimize(mode='train') of a model calling stochastic_depth by name failed."""
    model = _net("tv_function_row").train()
    x = torch.randn(8, 3, 4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = aiacc.optimize(model, (x,), mode="train", framework_compile=False)
    fresh = torch.randn(8, 3, 4, 4)
    torch.manual_seed(7)
    expected = model(fresh)
    torch.manual_seed(7)
    assert torch.allclose(fast(fresh), expected, atol=1e-5)


@needs_timm
def test_timm_model_with_drop_path_rate_trains_whole():
    model = M.timm().create_model("convnext_atto", pretrained=False, num_classes=10, drop_path_rate=0.2).train()
    x = torch.randn(2, 3, 32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, (x,), mode="train")
    assert [n.op for n in graph if n.is_opaque] == [], graph.meta.get("torch.opaque_reasons")
    exported = aiacc.export(graph, "torch")
    torch.manual_seed(1)
    expected = model(x)
    torch.manual_seed(1)
    assert torch.allclose(exported(x), expected, atol=1e-5)
