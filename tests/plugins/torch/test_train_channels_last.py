"""torch mode="train", a CNN's graph laid out channels-last (aiacc.plugins.torch.channels_last): with the layout
forced on, aiacc's parameters are stored channels-last under the original's names and shapes, the graph makes
its input channels-last, and one and three optimizer steps end with the original's parameters and BatchNorm
statistics within 1e-5; forced off it stays NCHW; measured, the report says which and the times; a graph
without a convolution on a 4-D input is left alone."""
import pytest

torch = pytest.importorskip("torch")

import aiacc  # noqa: E402
from aiacc.plugins.torch import channels_last  # noqa: E402
from tests.plugins.torch.test_train import assert_same, data, net, state, train  # noqa: E402


def _contiguous_nodes(gm):
    return [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "contiguous"]


@pytest.mark.parametrize("steps", [1, 3])
def test_forced_on_trains_like_the_original(monkeypatch, steps):
    monkeypatch.setenv(channels_last.ENV, "on")
    x, y = data()
    ref = net()
    train(ref, ref.parameters(), steps, x, y)
    fast = aiacc.optimize(net(), (x,), mode="train", framework_compile=False)
    weights = {n: p for n, p in fast.named_parameters() if p.dim() == 4}
    assert set(weights) == {"conv.weight", "conv2.weight"}
    assert all(p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
               for p in weights.values())
    assert len(_contiguous_nodes(fast)) == 1  # the input, once, at the graph's entry
    assert fast.aiacc_report["channels_last"].notes == [f"channels_last ({channels_last.ENV}=on)"]
    train(fast, fast.parameters(), steps, x, y)
    got = state(fast)
    assert_same(state(ref), {k: got[k] for k in state(ref)})
    assert int(got["bn.num_batches_tracked"]) == steps
    assert all(p.grad.shape == p.shape for p in fast.parameters())


def test_forced_off_and_measured(monkeypatch):
    x, _ = data()
    monkeypatch.setenv(channels_last.ENV, "off")
    fast = aiacc.optimize(net(), (x,), mode="train", framework_compile=False)
    assert not _contiguous_nodes(fast) and fast.conv.weight.is_contiguous()
    assert fast.aiacc_report["channels_last"].notes == [f"kept NCHW ({channels_last.ENV}=off)"]
    monkeypatch.delenv(channels_last.ENV)  # the default is off too: the layout is opt-in
    fast = aiacc.optimize(net(), (x,), mode="train", framework_compile=False)
    assert fast.aiacc_report["channels_last"].notes == [f"kept NCHW ({channels_last.ENV}=off)"]
    monkeypatch.setenv(channels_last.ENV, "measure")
    fast = aiacc.optimize(net(), (x,), mode="train", framework_compile=False)
    (line,) = fast.aiacc_report["channels_last"].notes
    kept = line.startswith("channels_last: ")
    assert kept or line.startswith("kept NCHW: channels_last ")
    assert "ms against" in line
    assert bool(_contiguous_nodes(fast)) == kept == fast.conv.weight.is_contiguous(memory_format=torch.channels_last)


def test_a_graph_without_a_convolution_is_left_alone():
    mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 4)).train()
    fast = aiacc.optimize(mlp, (torch.randn(2, 3, 4, 4),), mode="train", framework_compile=False)
    assert not _contiguous_nodes(fast)
    assert all(r.name != "channels_last" for r in fast.aiacc_report.records)
    assert not channels_last.applies(fast, (torch.randn(2, 3, 4, 4),))
