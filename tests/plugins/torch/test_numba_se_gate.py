"""Squeeze-excite's gate folded into the projection GEMM and its 1x1 FC convolutions as inner products
(plugins/torch/se_gate.py): level 3 only, measured, equal to level 2, the gated GEMM really runs, the module
saves and loads."""

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import aiacc  # noqa: E402
from tests.plugins.torch._helpers import assert_kernel_runs_and_reloads, conv_stack, image_batch  # noqa: E402
from aiacc.plugins.torch import se_gate  # noqa: E402


class _SEBlock(nn.Module):
    """expand 1x1 -> BN -> SiLU -> SE (pool, fc, SiLU, fc, sigmoid, mul) -> project 1x1 -> BN (+ residual)."""

    def __init__(self, c=8, mid=24, gate=nn.Sigmoid):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU())
        self.fc1, self.fc2, self.gate = nn.Conv2d(mid, 4, 1), nn.Conv2d(4, mid, 1), gate()
        self.project = nn.Sequential(nn.Conv2d(mid, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        y = self.expand(x)
        s = self.gate(self.fc2(F.silu(self.fc1(F.adaptive_avg_pool2d(y, 1)))))
        return x + self.project(y * s)


def _model(gate=nn.Sigmoid):
    return conv_stack(*[lambda: _SEBlock(gate=gate)] * 2)


_x = image_batch


@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
@pytest.mark.parametrize("gate_batch", [1, 3])
def test_function_equals_multiply_then_conv(layout, gate_batch):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 12, 5, 6, generator=g)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    gate = torch.rand(gate_batch, 12, 1, 1, generator=g)
    w, b, r = torch.randn(7, 12, 1, 1, generator=g), torch.randn(7, generator=g), torch.randn(3, 7, 5, 6, generator=g)
    with torch.no_grad():
        for bias in (b, None):
            for res in (r, None):
                for attr in ("none", "relu"):
                    ref = F.conv2d(x * gate, w, bias) + (0 if res is None else res)
                    ref = ref.relu() if attr == "relu" else ref
                    got = se_gate.se_gated_conv1x1(x, gate, w, bias, res, attr, [], None)
                    assert (got - ref).abs().max().item() < 1e-5
                    assert got.is_contiguous(memory_format=torch.channels_last) == (layout == "channels_last")


@pytest.mark.parametrize("gate", [nn.Sigmoid, nn.Hardsigmoid])
def test_level3_runs_the_gated_gemm_equal_to_level2(monkeypatch, gate):
    monkeypatch.setenv(se_gate.MODE_ENV, "on")
    # the fx forward: where the TorchScript executor timed faster (a loaded machine), its traced graph calls
    # aten::baddbmm directly and the counter below never sees the call
    monkeypatch.setenv("AIACC_TORCHSCRIPT", "off")
    model, x = _model(gate), _x()
    l2 = aiacc.optimize(model, x, level=2)
    l3 = aiacc.optimize(model, x, level=3)
    assert "se_gated_conv1x1" not in l2.code
    assert l3.code.count("se_gated_conv1x1(") == 2
    assert "conv1x1_as_linear(" not in l3.code  # the gates' FC layers: level 2's F.linear (no candidate now)
    notes = [n for n in l3.aiacc_report["elementwise_fusion"].notes if "se gate" in n]
    assert len(notes) == 2, l3.aiacc_report["elementwise_fusion"].notes
    calls = []
    real = torch.baddbmm
    monkeypatch.setattr(torch, "baddbmm", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert_kernel_runs_and_reloads(l2, l3, x, lambda: len(calls), 2)  # the gated GEMM: once per block


def test_measured_choice_keeps_only_the_faster(monkeypatch):
    from aiacc.plugins.torch import numba_op

    model, x = _model(), _x(1)
    for times, kept in (((2.0, 1.0), False), ((1.0, 2.0), True)):
        monkeypatch.setattr(numba_op, "_time_pair", lambda f, u, t=times: t)  # the timer choose() reads
        m = aiacc.optimize(model, x, level=3)
        notes = m.aiacc_report["elementwise_fusion"].notes
        assert ("se_gated_conv1x1(" in m.code) is kept
        assert sum(n.endswith("kept: se gate in the GEMM 0.50x") for n in notes) == (2 if kept else 0), notes
        with torch.no_grad():
            assert (m(x) - model(x)).abs().max().item() < 1e-4


@pytest.fixture(autouse=True)
def _no_whole_network_guard(monkeypatch):
    """These tests fake the per-node timer to pick a form; level 3's whole-network guard (level3_guard.py,
    tested in test_numba_level3_guard.py) would time the whole module for real and might undo that pick."""
    monkeypatch.setenv("AIACC_LEVEL3_GUARD", "off")
