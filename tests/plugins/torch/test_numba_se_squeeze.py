"""Squeeze-excite's squeeze (pool, FC, activation, FC, gate activation) as one numba kernel
(plugins/torch/se_gate.se_squeeze, core/runtime/numba_se.py): level 3 only, measured, equal to level 2, the
kernel really runs, the module saves and loads."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import aiacc  # noqa: E402
from tests.plugins.torch._helpers import (  # noqa: E402
    assert_kernel_runs_and_reloads, assert_timed_choice, conv_stack, image_batch)
from aiacc.core.runtime import numba_se  # noqa: E402
from aiacc.plugins.torch import se_gate  # noqa: E402


class _SEBlock(nn.Module):
    """expand 1x1 -> BN -> act -> SE (pool, fc, act, fc, gate, mul) -> project 1x1 -> BN (+ residual)."""

    def __init__(self, c=8, mid=24, act=nn.SiLU, gate=nn.Sigmoid):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, mid, 1, bias=False), nn.BatchNorm2d(mid), act())
        self.fc1, self.act, self.fc2, self.gate = nn.Conv2d(mid, 4, 1), act(), nn.Conv2d(4, mid, 1), gate()
        self.project = nn.Sequential(nn.Conv2d(mid, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        y = self.expand(x)
        s = self.gate(self.fc2(self.act(self.fc1(F.adaptive_avg_pool2d(y, 1)))))
        return x + self.project(y * s)


def _model(act=nn.SiLU, gate=nn.Sigmoid):
    return conv_stack(*[lambda: _SEBlock(act=act, gate=gate)] * 2)


_x = image_batch


_ACTS = {"none": lambda y: y, "relu": torch.relu, "swish": F.silu, "hardswish": F.hardswish,
         "sigmoid": torch.sigmoid, "hardsigmoid": F.hardsigmoid, "tanh": torch.tanh,
         "leaky_relu": lambda y: F.leaky_relu(y, 0.2)}


@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
@pytest.mark.parametrize("batch", [1, 3])
def test_function_equals_pool_and_convs(layout, batch):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(batch, 12, 5, 6, generator=g)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    w1, b1 = torch.randn(5, 12, 1, 1, generator=g), torch.randn(5, generator=g)
    w2, b2 = torch.randn(12, 5, 1, 1, generator=g), torch.randn(12, generator=g)
    before = numba_se.CALLS.count
    with torch.no_grad():
        for act1, act2 in (("relu", "hardsigmoid"), ("swish", "sigmoid"), ("hardswish", "tanh"),
                           ("leaky_relu", "none")):
            s1 = [0.2] if act1 == "leaky_relu" else []
            for bias1, bias2 in ((b1, b2), (None, None)):
                ref = _ACTS[act1](F.conv2d(F.adaptive_avg_pool2d(x, 1), w1, bias1))
                ref = _ACTS[act2](F.conv2d(ref, w2, bias2))
                got = se_gate.se_squeeze(x, w1, bias1, w2, bias2, act1, s1, act2, [])
                assert got.shape == (batch, 12, 1, 1)
                assert (got - ref).abs().max().item() < 1e-5 * max(1.0, ref.abs().max().item()), (act1, act2)
    assert numba_se.CALLS.count == before + 8  # every call ran the kernel


def test_autograd_runs_the_torch_ops():
    torch.manual_seed(0)  # unseeded, all three ReLU inputs could be negative: a zero gradient now and then
    x = torch.randn(2, 6, 4, 4, requires_grad=True)
    w1, w2 = torch.randn(3, 6, 1, 1), torch.randn(6, 3, 1, 1)
    before = numba_se.CALLS.count
    y = se_gate.se_squeeze(x, w1, None, w2, None, "relu", [], "sigmoid", [])
    y.sum().backward()
    assert numba_se.CALLS.count == before and x.grad is not None and x.grad.abs().sum() > 0


@pytest.mark.parametrize("act,gate", [(nn.SiLU, nn.Sigmoid), (nn.ReLU, nn.Hardsigmoid)])
def test_level3_runs_the_kernel_equal_to_level2(monkeypatch, act, gate):
    monkeypatch.setenv(se_gate.SQUEEZE_ENV, "on")
    model, x = _model(act, gate), _x()
    l2 = aiacc.optimize(model, x, level=2)
    l3 = aiacc.optimize(model, x, level=3)
    assert "se_squeeze" not in l2.code
    assert l3.code.count("se_squeeze(") == 2
    assert "adaptive_avg_pool2d" not in l3.code  # the pool is in the kernel
    notes = [n for n in l3.aiacc_report["elementwise_fusion"].notes if "se squeeze" in n]
    assert len(notes) == 2, l3.aiacc_report["elementwise_fusion"].notes
    assert_kernel_runs_and_reloads(l2, l3, x, lambda: numba_se.CALLS.count, 2)  # the kernel: once per block


def test_measured_choice_keeps_only_the_faster(monkeypatch):
    assert_timed_choice(monkeypatch, _model(nn.ReLU, nn.Hardsigmoid), _x(1), "se_squeeze(",
                        "se squeeze in one numba kernel", 2)


def test_pinned_fc_form_turns_the_squeeze_off(monkeypatch):
    monkeypatch.setenv(se_gate.MODE_ENV, "on")
    monkeypatch.delenv(se_gate.SQUEEZE_ENV, raising=False)
    m = aiacc.optimize(_model(), _x(), level=3)
    assert "se_squeeze(" not in m.code and "conv1x1_as_linear(" not in m.code
    assert m.code.count("adaptive_avg_pool2d(") == 2  # level 2's squeeze: the pool and the FC convolutions


@pytest.fixture(autouse=True)
def _no_whole_network_guard(monkeypatch):
    """These tests fake the per-node timer to pick a form; level 3's whole-network guard (level3_guard.py,
    tested in test_numba_level3_guard.py) would time the whole module for real and might undo that pick."""
    monkeypatch.setenv("AIACC_LEVEL3_GUARD", "off")
