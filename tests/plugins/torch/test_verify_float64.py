"""verify's float64 re-check (Plugin.outputs_agree): a model whose float32 rounding is amplified beyond the
tolerance is not refused for a correct optimization that rounds differently (timm's visformer_tiny was:
batchnorm_folding moved its output by 3e-4 of its scale, its float64 runs agree to 3e-6), and a wrong
optimization still is."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import aiacc
from aiacc.core.compare import compare_outputs
from aiacc.core.passes.manager import FunctionPass
from aiacc.errors import VerificationError
from aiacc.plugins import get_plugin
from tests.core.passes.helpers import scale_first_conv_weight


class Cancelling(torch.nn.Module):
    """Conv whose bias 1e5 the BatchNorm's running mean takes away again: in float32 the conv output rounds
    to the spacing of floats at 1e5 (0.0078) before the subtraction, so the original is that far from the
    exact result, while the folded conv (bias 1e5 - 1e5 = 0, computed in float64) is not."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        with torch.no_grad():
            self.conv.bias.fill_(1e5)
            self.bn.running_mean.fill_(1e5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
        self.eval()

    def forward(self, x):
        return self.bn(self.conv(x))


def _x(seed=1):
    return (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(seed)),)


def test_a_correct_fold_of_an_ill_conditioned_model_verifies():
    model, x = Cancelling(), _x()
    plain = aiacc.optimize(model, x, level=0)  # translated only: the same float32 rounding as the original
    fast = aiacc.optimize(model, x)  # refused by the float32 comparison alone before the re-check
    assert [n.op for n in fast.graph.nodes if n.op == "call_function" and "batch_norm" in str(n.target)] == []
    plugin = get_plugin("torch")
    expected, got = plugin.run(model, x), plugin.run(fast, x)
    assert compare_outputs(expected, got, plugin.rtol, plugin.atol) is not None  # float32 alone: refused
    truth = plugin.float64_outputs(model, x)
    # the folded model is the more accurate one: the float32 difference is the original's rounding
    assert np.abs(got[0] - truth[0]).max() < np.abs(expected[0] - truth[0]).max() / 10
    assert plugin.outputs_agree(model, fast, x) is None
    assert plugin.outputs_agree(model, plain, x) is None
    assert plugin.outputs_agree(model, fast, _x(2)) is None  # an input it was not optimized on


def test_a_wrong_pass_is_still_refused_with_the_float64_verdict():
    model, x = Cancelling(), _x()
    bad = FunctionPass("scale_conv_weight", scale_first_conv_weight, level=2)
    with pytest.raises(VerificationError, match=r"float64 re-check: in float64 too: output 0 differs by"):
        aiacc.optimize(model, x, passes=[bad])


def test_float64_outputs_leave_the_models_alone():
    model, x = Cancelling(), _x()
    fast = aiacc.optimize(model, x)
    plugin = get_plugin("torch")
    for m in (model, fast):
        out64 = plugin.float64_outputs(m, x)
        assert [o.dtype for o in out64] == [np.float64]
        assert all(p.dtype == torch.float32 for p in m.parameters()) and m(*x).dtype == torch.float32
    assert x[0].dtype == torch.float32
    assert plugin.float64_outputs(lambda t: t, x) is None  # not an nn.Module: no re-check


def test_a_model_that_cannot_run_in_float64_keeps_the_float32_verdict_and_says_why():
    class Float32Only(Cancelling):
        def forward(self, x):
            if x.dtype != torch.float32:
                raise TypeError("float32 only")
            return super().forward(x)

    model, x = Float32Only(), _x()
    with pytest.raises(VerificationError, match=r"the float64 re-check could not run: TypeError: float32 only"):
        aiacc.optimize(model, x, passes=[FunctionPass("scale_conv_weight", scale_first_conv_weight, level=2)])
