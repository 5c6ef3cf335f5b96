"""AveragePool with pads torch's pools cannot take (asymmetric, or over half the window) lowers exactly."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import aiacc
from aiacc.plugins.torch.export_ops import nn as nn_lowerings
from tests.plugins.torch._helpers import assert_close_rel


class PaddedAvg(nn.Module):
    """A zero pad on the bottom/right before an average pool (NASNet's reduction cells): folded, the pool's
    pads are [0, 0, 1, 1], which torch's symmetric `padding=` cannot express."""

    def __init__(self, count_include_pad: bool, ceil_mode: bool):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.pad = nn.ZeroPad2d((0, 1, 0, 1))
        self.pool = nn.AvgPool2d(3, stride=2, padding=0, ceil_mode=ceil_mode, count_include_pad=count_include_pad)

    def forward(self, x):
        return self.pool(self.pad(self.conv(x)))


class PaddedAvg1d3d(nn.Module):
    """The same folded pad on a 1-d and a 3-d pool."""

    def forward(self, x1, x3):
        a = F.avg_pool1d(F.pad(x1, (0, 1)), 3, 2, count_include_pad=False)
        b = F.avg_pool3d(F.pad(x3, (0, 1, 1, 0, 0, 1)), 2, 2, count_include_pad=False)
        return a.sum() + b


def _count_padded_lowerings(monkeypatch) -> list:
    """Record each AveragePool lowered with explicit pads (so the tests prove that path ran)."""
    calls = []
    original = nn_lowerings._padded_avg_pool

    def recording(b, n, *args):
        calls.append(n.name)
        return original(b, n, *args)

    monkeypatch.setattr(nn_lowerings, "_padded_avg_pool", recording)
    return calls


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_folded_asymmetric_average_pool_matches_torch(count_include_pad, ceil_mode, monkeypatch):
    calls = _count_padded_lowerings(monkeypatch)
    torch.manual_seed(0)
    model = PaddedAvg(count_include_pad, ceil_mode).eval()
    x = torch.randn(2, 3, 9, 10)
    fast = aiacc.optimize(model, (x,), verify=True)
    assert not fast.aiacc_report.fallbacks
    assert calls, "the pool was not lowered through the explicit-pad path"
    x2 = torch.randn(2, 3, 9, 10)
    with torch.no_grad():
        assert_close_rel(fast(x2), model(x2), 1e-5, "asymmetric AveragePool")


def test_folded_asymmetric_average_pool_1d_and_3d(monkeypatch):
    calls = _count_padded_lowerings(monkeypatch)
    torch.manual_seed(0)
    model = PaddedAvg1d3d().eval()
    x1, x3 = torch.randn(2, 3, 9), torch.randn(1, 2, 5, 6, 7)
    fast = aiacc.optimize(model, (x1, x3), verify=True)
    assert not fast.aiacc_report.fallbacks
    assert len(calls) == 2, calls
    with torch.no_grad():
        assert_close_rel(fast(x1, x3), model(x1, x3), 1e-5, "1-d/3-d pad + AveragePool")
