"""Depthwise convolutions as one numba kernel (plugins/torch/numba_op_depthwise.py, core/runtime/
numba_depthwise.py): equal to the convolution for every filter size, stride, padding, layout, bias and
activation, serial and parallel; level 3 only, measured, equal to level 2, the kernel really runs, the module
saves and loads; autograd runs the torch ops."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import aiacc  # noqa: E402
from aiacc.core.runtime import numba_depthwise as nd  # noqa: E402
from aiacc.plugins.torch import numba_op_depthwise as dw  # noqa: E402
from tests.plugins.torch._helpers import (  # noqa: E402
    assert_kernel_runs_and_reloads, assert_timed_choice, conv_stack, image_batch)

_ACTS = {"none": lambda y: y, "relu": torch.relu, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid,
         "hardtanh": lambda y: F.hardtanh(y, -0.5, 0.75), "leaky_relu": lambda y: F.leaky_relu(y, 0.2),
         "swish": F.silu}
_SCALARS = {"hardtanh": [-0.5, 0.75], "leaky_relu": [0.2]}


def _close(got, ref):
    assert got.shape == ref.shape
    err = (got - ref).abs().max().item()
    assert err <= 1e-5 * max(1.0, ref.abs().max().item()), err


def _check(x, w, b, stride, pad, acts):
    """depthwise_conv equals F.conv2d + act for both layouts, with and without bias; returns the call count."""
    c = x.shape[1]
    runs = 0
    with torch.no_grad():
        for layout in ("channels_last", "nchw"):
            xl = x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else x
            for bias in (b, None):
                for attr in acts:
                    ref = _ACTS[attr](F.conv2d(x, w, bias, stride, pad, 1, c))
                    got = dw.depthwise_conv(xl, w, bias, list(stride), [pad, pad], attr, _SCALARS.get(attr, []))
                    runs += 1
                    _close(got, ref)
                    assert got.is_contiguous(memory_format=torch.channels_last)
    return runs


# (one activation per geometry, every activation on one geometry: each (size, stride, activation) is its own
# generated kernel, compiled once)
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("k,stride,pad,hw", [(3, (1, 1), 1, (9, 7)), (3, (2, 2), 1, (10, 11)), (5, (1, 1), 2, (6, 8)),
                                             (5, (2, 1), 2, (9, 5)), (3, (1, 1), 0, (5, 6)), (3, (2, 2), 1, (1, 1))])
def test_equals_the_convolution(monkeypatch, parallel, k, stride, pad, hw):
    monkeypatch.setattr(nd, "PARALLEL_MIN_MACS", 0 if parallel else 1 << 62)
    g = torch.Generator().manual_seed(k * 10 + stride[0])
    x = torch.randn(2, 12, *hw, generator=g)
    w, b = torch.randn(12, 1, k, k, generator=g), torch.randn(12, generator=g)
    before = nd.CALLS.count
    runs = _check(x, w, b, stride, pad, ["hardswish"])
    assert nd.CALLS.count == before + runs  # every call ran the kernel


@pytest.mark.parametrize("unroll", [1, 2])
@pytest.mark.parametrize("k,stride,width", [(3, 1, 8), (3, 1, 9), (5, 1, 11), (5, 2, 13), (3, 2, 12)])
def test_interior_columns_in_pairs_equal_one_at_a_time(k, stride, width, unroll):
    """The unrolled interior loop (two output columns per step, an odd one left for the one-column loop) gives
    the convolution; unroll 1 is the one-column loop alone."""
    g = torch.Generator().manual_seed(k + stride + width)
    x = torch.randn(2, 20, 7, width, generator=g)
    w, b = torch.randn(20, 1, k, k, generator=g), torch.randn(20, generator=g)
    ref = F.hardswish(F.conv2d(x, w, b, stride, k // 2, 1, 20))
    mod = nd.depthwise_kernel(k, k, stride, stride, nd.ACTS["hardswish"], unroll)
    out = torch.empty(2, ref.shape[2], ref.shape[3], 20)
    wn = w[:, 0].permute(1, 2, 0).contiguous().numpy()
    nd.depthwise(mod, x.permute(0, 2, 3, 1).contiguous().numpy(), wn, b.numpy(), out.numpy(), k // 2, k // 2)
    _close(out.permute(0, 3, 1, 2), ref)
    assert f"while ow + {unroll} <= hi" in nd._source(k, k, stride, stride, 3, unroll) or unroll == 1


def test_unroll_is_capped_where_the_loop_would_stay_scalar():
    """A 7x7 filter two columns at a time needs more run-time overlap checks than LLVM vectorizes behind: it
    runs one column at a time; 3x3 and 5x5 run two."""
    assert nd.depthwise_kernel(7, 7, 1, 1, 0, 2) is nd.depthwise_kernel(7, 7, 1, 1, 0, 1)
    assert nd.depthwise_kernel(5, 5, 1, 1, 0, 2) is not nd.depthwise_kernel(5, 5, 1, 1, 0, 1)
    assert nd.depthwise_kernel(3, 3, 2, 2, 0) is nd.depthwise_kernel(3, 3, 2, 2, 0, 2)  # the default


def test_every_activation():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 20, 6, 9, generator=g)
    w, b = torch.randn(20, 1, 3, 3, generator=g), torch.randn(20, generator=g)
    before = nd.CALLS.count
    runs = _check(x, w, b, (1, 1), 1, list(_ACTS))
    assert nd.CALLS.count == before + runs


def test_autograd_runs_the_torch_ops():
    torch.manual_seed(0)
    x = torch.randn(1, 4, 5, 5, requires_grad=True)
    w = torch.randn(4, 1, 3, 3, requires_grad=True)
    before = nd.CALLS.count
    y = dw.depthwise_conv(x, w, None, [1, 1], [1, 1], "relu", [], None)
    y.sum().backward()
    assert nd.CALLS.count == before and x.grad is not None and w.grad is not None
    assert torch.allclose(y, torch.relu(F.conv2d(x, w, None, 1, 1, 1, 4)))


def test_prepared_weight_follows_in_place_updates():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 6, 5, 5, generator=g).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(6, 1, 3, 3, generator=g), torch.randn(6, generator=g)
    with torch.no_grad():
        _close(dw.depthwise_conv(x, w, b, [1, 1], [1, 1]), F.conv2d(x, w, b, 1, 1, 1, 6))
        w.mul_(2.0)  # the cached [KH, KW, C] weight must be re-made (version counter)
        b.add_(1.0)
        _close(dw.depthwise_conv(x, w, b, [1, 1], [1, 1]), F.conv2d(x, w, b, 1, 1, 1, 6))


class _Block(nn.Module):
    """expand 1x1 -> BN -> HardSwish -> depthwise 3x3 -> BN -> HardSwish -> depthwise 5x5 stride 2 -> BN -> SiLU
    -> project 1x1 -> BN."""

    def __init__(self, c=8, mid=16):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.Hardswish(),
                                  nn.Conv2d(mid, mid, 3, padding=1, groups=mid, bias=False), nn.BatchNorm2d(mid),
                                  nn.Hardswish(),
                                  nn.Conv2d(mid, mid, 5, stride=2, padding=2, groups=mid, bias=False),
                                  nn.BatchNorm2d(mid), nn.SiLU(), nn.Conv2d(mid, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return self.body(x)


def _model():
    return conv_stack(_Block)


def test_level3_runs_the_kernel_equal_to_level2(monkeypatch):
    monkeypatch.setenv(dw.MODE_ENV, "on")
    model, x = _model(), image_batch()
    l2 = aiacc.optimize(model, x, level=2)
    l3 = aiacc.optimize(model, x, level=3)
    assert "depthwise_conv" not in l2.code
    assert l3.code.count("depthwise_conv(") == 2  # both depthwise convolutions
    notes = [n for n in l3.aiacc_report["elementwise_fusion"].notes if WHAT_ON in n]
    assert len(notes) == 2, l3.aiacc_report["elementwise_fusion"].notes
    _, got = assert_kernel_runs_and_reloads(l2, l3, x, lambda: nd.CALLS.count, 2)  # once per depthwise conv
    with torch.no_grad():
        _close(got, model(x))


WHAT_ON = f"kept: {dw.WHAT} ({dw.MODE_ENV}=on)"


def test_measured_choice_keeps_only_the_faster(monkeypatch):
    monkeypatch.delenv(dw.MODE_ENV, raising=False)
    assert_timed_choice(monkeypatch, _model(), image_batch(1), "depthwise_conv(", dw.WHAT, 2)


def test_off_leaves_level2s_convolution(monkeypatch):
    monkeypatch.setenv(dw.MODE_ENV, "off")
    m = aiacc.optimize(_model(), image_batch(), level=3)
    assert "depthwise_conv(" not in m.code
    assert sum(n.endswith(f"dropped: {dw.MODE_ENV}=off") for n in m.aiacc_report["elementwise_fusion"].notes) == 2


@pytest.fixture(autouse=True)
def _no_whole_network_guard(monkeypatch):
    """These tests fake the per-node timer to pick a form; level 3's whole-network guard (level3_guard.py,
    tested in test_numba_level3_guard.py) would time the whole module for real and might undo that pick."""
    monkeypatch.setenv("AIACC_LEVEL3_GUARD", "off")
