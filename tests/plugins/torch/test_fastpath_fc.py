"""fastpath.conv2d of a [N, C, 1, 1] map by a 1x1 kernel (squeeze-excite's FC layers) runs as F.linear:
the same numbers as F.conv2d and the activation, every post-op, a layout oneDNN's readers accept."""
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from aiacc.plugins.torch import fastpath  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")

_ACTS = [("none", [], None, lambda y: y), ("relu", [], None, F.relu), ("sigmoid", [], None, torch.sigmoid),
         ("hardswish", [], None, F.hardswish), ("swish", [], None, F.silu), ("hardsigmoid", [], None, F.hardsigmoid),
         ("hardtanh", [0.0, 6.0], None, F.relu6), ("gelu", [], "tanh", lambda y: F.gelu(y, approximate="tanh"))]


@pytest.mark.parametrize("attr,scalars,algorithm,ref", _ACTS, ids=[f"{a[0]}-{a[2]}" for a in _ACTS])
@pytest.mark.parametrize("batch", [1, 4])
def test_fc_conv_runs_as_linear(monkeypatch, attr, scalars, algorithm, ref, batch):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 12, 1, 1, generator=g).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(5, 12, 1, 1, generator=g), torch.randn(5, generator=g)
    calls = []
    real = F.linear
    monkeypatch.setattr(F, "linear", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad():
        for bias in (b, None):
            want = ref(real(x.reshape(batch, 12), w.reshape(5, 12), bias)).view(batch, 5, 1, 1)
            assert (F.conv2d(x, w, bias) - real(x.reshape(batch, 12), w.reshape(5, 12), bias).view(batch, 5, 1, 1)
                    ).abs().max() < 1e-5
            got = fastpath.conv2d(x, w, bias, [1, 1], [0, 0], [1, 1], 1, attr, scalars, algorithm)
            assert got.shape == (batch, 5, 1, 1) and got.is_contiguous(memory_format=torch.channels_last)
            assert (got - want).abs().max().item() < 1e-5
    assert len(calls) == 2


def test_other_convs_of_a_1x1_map_stay_on_onednn(monkeypatch):
    calls = []
    real = F.linear
    monkeypatch.setattr(F, "linear", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(2, 8, 1, 1)
    with torch.no_grad():
        for w, pad, groups in ((torch.randn(4, 8, 1, 1), [1, 1], 1), (torch.randn(8, 2, 1, 1), [0, 0], 4),
                               (torch.randn(4, 8, 3, 3), [1, 1], 1)):
            got = fastpath.conv2d(x, w, None, [1, 1], pad, [1, 1], groups)
            assert (got - F.conv2d(x, w, None, 1, pad, 1, groups)).abs().max().item() < 1e-5
    assert not calls
