"""1x1 convolutions as one GEMM on the activation's memory (plugins/torch/pointwise.py): equal to the
convolution for every layout, bias, residual and activation; level 3 only, measured, equal to level 2, the
GEMM really runs, the module saves and loads; autograd runs the torch ops."""

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import aiacc  # noqa: E402
from tests.plugins.torch._helpers import (  # noqa: E402
    assert_kernel_runs_and_reloads, assert_timed_choice, conv_stack, image_batch)
from aiacc.plugins.torch import pointwise  # noqa: E402

_ACTS = {"none": lambda y: y, "relu": torch.relu, "swish": F.silu, "hardswish": F.hardswish,
         "hardtanh": lambda y: F.hardtanh(y, -0.5, 0.75), "gelu": F.gelu}
_SCALARS = {"hardtanh": [-0.5, 0.75]}


@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
def test_equals_the_convolution(layout):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 12, 5, 6, generator=g)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(7, 12, 1, 1, generator=g), torch.randn(7, generator=g)
    r = torch.randn(2, 7, 5, 6, generator=g)
    before = pointwise.CALLS.count
    runs = 0
    with torch.no_grad():
        for bias in (b, None):
            for res in (r, r.contiguous(memory_format=torch.channels_last), None):
                for attr, act in _ACTS.items():
                    ref = act(F.conv2d(x, w, bias) + (0 if res is None else res))
                    keep = None if res is None else res.clone()
                    got = pointwise.conv1x1_gemm(x, w, bias, res, attr, _SCALARS.get(attr, []), None)
                    runs += 1
                    assert got.shape == ref.shape
                    assert (got - ref).abs().max().item() < 1e-5 * max(1.0, ref.abs().max().item()), (attr, bias)
                    assert got.is_contiguous(memory_format=torch.channels_last) == (layout == "channels_last")
                    assert res is None or torch.equal(res, keep)  # the residual is only read
    assert pointwise.CALLS.count == before + runs  # every call ran the GEMM form


def test_autograd_runs_the_torch_ops():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 4, 4, requires_grad=True)
    w = torch.randn(3, 6, 1, 1, requires_grad=True)
    before = pointwise.CALLS.count
    y = pointwise.conv1x1_gemm(x, w, None, None, "relu", [], None)
    y.sum().backward()
    assert pointwise.CALLS.count == before and x.grad is not None and w.grad is not None
    assert torch.allclose(y, torch.relu(F.conv2d(x, w)))


class _Block(nn.Module):
    """expand 1x1 -> BN -> HardSwish -> depthwise 3x3 -> BN -> ReLU -> project 1x1 -> BN (+ residual)."""

    def __init__(self, c=8, mid=24):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.Hardswish(),
                                  nn.Conv2d(mid, mid, 3, padding=1, groups=mid, bias=False), nn.BatchNorm2d(mid),
                                  nn.ReLU(), nn.Conv2d(mid, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.body(x)


def _model():
    return conv_stack(_Block, _Block)


_x = image_batch


def test_level3_runs_the_gemm_equal_to_level2(monkeypatch):
    monkeypatch.setenv(pointwise.MODE_ENV, "on")
    model, x = _model(), _x()
    l2 = aiacc.optimize(model, x, level=2)
    l3 = aiacc.optimize(model, x, level=3)
    assert "conv1x1_gemm" not in l2.code
    assert l3.code.count("conv1x1_gemm(") == 4  # expand and project of both blocks (the project with its residual)
    notes = [n for n in l3.aiacc_report["elementwise_fusion"].notes if "1x1 conv as GEMM" in n]
    assert len(notes) == 4 and all(n.endswith(f"kept: 1x1 conv as GEMM ({pointwise.MODE_ENV}=on)") for n in notes)
    assert_kernel_runs_and_reloads(l2, l3, x, lambda: pointwise.CALLS.count, 4)  # once per convolution


def test_measured_choice_keeps_only_the_faster(monkeypatch):
    monkeypatch.delenv(pointwise.MODE_ENV, raising=False)
    assert_timed_choice(monkeypatch, _model(), _x(1), "conv1x1_gemm(", "1x1 conv as GEMM", 4)


def test_off_leaves_level2s_convolution(monkeypatch):
    monkeypatch.setenv(pointwise.MODE_ENV, "off")
    m = aiacc.optimize(_model(), _x(), level=3)
    assert "conv1x1_gemm(" not in m.code
    assert sum(n.endswith(f"dropped: {pointwise.MODE_ENV}=off") for n in m.aiacc_report["elementwise_fusion"].notes) == 4


def test_prepared_weight_follows_in_place_updates():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 6, 4, 4, generator=g).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(5, 6, 1, 1, generator=g), torch.randn(5, generator=g)
    with torch.no_grad():
        first = pointwise.conv1x1_gemm(x, w, b)
        assert torch.allclose(first, F.conv2d(x, w, b), atol=1e-5)
        w.mul_(2.0)  # the cached transposed weight must be re-made (version counter)
        assert torch.allclose(pointwise.conv1x1_gemm(x, w, b), F.conv2d(x, w, b), atol=1e-5)
        w2 = w.clone()  # another tensor, same shape: not the cached entry
        w2.add_(1.0)
        assert torch.allclose(pointwise.conv1x1_gemm(x, w2, b), F.conv2d(x, w2, b), atol=1e-5)


@pytest.fixture(autouse=True)
def _no_whole_network_guard(monkeypatch):
    """These tests fake the per-node timer to pick a form; level 3's whole-network guard (level3_guard.py,
    tested in test_numba_level3_guard.py) would time the whole module for real and might undo that pick."""
    monkeypatch.setenv("AIACC_LEVEL3_GUARD", "off")
