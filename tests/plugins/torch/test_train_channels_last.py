"""torch mode="train", a CNN's graph laid out channels-last (aiacc.plugins.torch.channels_last): with the layout
forced on, aiacc's parameters are stored channels-last under the original's names and shapes, the graph makes
its input channels-last, and one and three optimizer steps end with the original's parameters and BatchNorm
statistics within 1e-5; forced off it stays NCHW; measured, the report says which and the times, a bias
before a training BatchNorm keeps NCHW and the random-cotangent check refuses what differs; a graph
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
    assert line.startswith("kept NCHW: conv.bias feeds a BatchNorm on batch statistics")  # see below
    model = net()
    model.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)  # no gradient of rounding noise only
    fast = aiacc.optimize(model, (x,), mode="train", framework_compile=False)
    (line,) = fast.aiacc_report["channels_last"].notes
    kept = line.startswith("channels_last: ")
    assert kept or line.startswith("kept NCHW: channels_last ")
    assert "ms against" in line or "under random cotangents" in line
    assert bool(_contiguous_nodes(fast)) == kept == fast.conv.weight.is_contiguous(memory_format=torch.channels_last)


def test_a_bias_before_a_training_batchnorm_keeps_nchw(monkeypatch):
    """Its gradient is analytically zero (the normalization removes a constant shift), rounding noise that
    another arithmetic order cannot reproduce within 1e-5: measuring is not even tried, and the line says why."""
    monkeypatch.setenv(channels_last.ENV, "measure")
    x, _ = data()
    gm = aiacc.optimize(net(), (x,), mode="train", framework_compile=False, )
    assert channels_last.zero_gradient_biases(gm) == ["conv.bias"]
    model = net()
    model.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
    assert channels_last.zero_gradient_biases(aiacc.optimize(model, (x,), mode="train", framework_compile=False)) == []
    ref = net().eval()  # batch_norm on running statistics: the bias has a gradient
    with torch.no_grad():
        expected = ref(x)
    assert not channels_last.zero_gradient_biases(torch.fx.symbolic_trace(torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)).eval())) and expected.shape == (4, 5)


def test_random_cotangents_catch_what_the_mean_loss_hides(monkeypatch):
    """A layout whose results differ only where the step loss does not look is refused by the second
    check (random cotangents against every output), with the gradient named."""
    def same(a, b):
        assert (a, b) == (2.0, 2.0)  # the check's results, not the step's
        return "gradient of fc.weight differs by 1e-3"

    x, _ = data()
    model = net()
    model.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
    gm = aiacc.optimize(model, (x,), mode="train", framework_compile=False)  # NCHW: the default is off
    assert not _contiguous_nodes(gm)
    monkeypatch.setenv(channels_last.ENV, "measure")
    checked = []
    line = channels_last.choose(gm, (x,), lambda m: (lambda: 1.0), lambda a, b: "",
                                check_of=lambda m: (lambda: checked.append(m) or 2.0), same_check=same)
    assert line == ("kept NCHW: channels_last's step differs (under random cotangents: gradient of fc.weight "
                    "differs by 1e-3)")
    assert len(checked) == 2 and checked[0] is gm and checked[1] is not gm
    assert not _contiguous_nodes(gm)


def test_a_graph_without_a_convolution_is_left_alone():
    mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 4)).train()
    fast = aiacc.optimize(mlp, (torch.randn(2, 3, 4, 4),), mode="train", framework_compile=False)
    assert not _contiguous_nodes(fast)
    assert all(r.name != "channels_last" for r in fast.aiacc_report.records)
    assert not channels_last.applies(fast, (torch.randn(2, 3, 4, 4),))


@pytest.mark.parametrize("path", ["aiacc graph channels-last", "aiacc graph channels-last + torch.compile"])
def test_channels_last_candidates_are_built_and_train_like_the_original(monkeypatch, path):
    """Unset, the layout is not applied to aiacc's graph itself but offered to the measured step choice,
    eagerly and under torch.compile; pinned by name, either is what runs (its weights channels-last, the
    original's names and shapes), and three optimizer steps end with the original's parameters and
    BatchNorm statistics within 1e-5, the user's module untouched."""
    from aiacc.plugins.torch.training import CL_COMPILED, CL_GRAPH

    monkeypatch.delenv(channels_last.ENV, raising=False)
    x, y = data()
    ref = net()
    train(ref, ref.parameters(), 3, x, y)
    m = net()
    before = state(m)
    fast = aiacc.optimize(m, (x,), mode="train", framework_compile=path)
    assert fast.aiacc_train_path == path
    inner = getattr(fast, "_orig_mod", fast)
    assert isinstance(fast, torch.nn.Module) and (path == CL_GRAPH) == (inner is fast)
    assert _contiguous_nodes(inner) and inner.conv2.weight.is_contiguous(memory_format=torch.channels_last)
    train(fast, fast.parameters(), 3, x, y)
    got = {k.removeprefix("_orig_mod."): v for k, v in state(fast).items()}
    assert_same(state(ref), {k: got[k] for k in state(ref)})
    assert_same(before, state(m), tol=0)
    assert path in (CL_GRAPH, CL_COMPILED)


def test_channels_last_candidates_are_measured_unless_off(monkeypatch):
    """framework_compile='auto' measures both channels-last candidates (their times in the choice, the
    compile's seconds in its reason); AIACC_TRAIN_CHANNELS_LAST=off leaves them out."""
    from aiacc.plugins.torch.training import CL_COMPILED, CL_GRAPH

    monkeypatch.delenv(channels_last.ENV, raising=False)
    x, _ = data()
    choice = aiacc.optimize(net(), (x,), mode="train").aiacc_train_choice
    assert {CL_GRAPH, CL_COMPILED} <= set(choice.ms)
    assert CL_COMPILED in choice.build_s
    # the compile's seconds are said from 1 s on; a compile inductor already cached in this process (an earlier
    # test compiled the same graph) builds in well under a second, and is then rightly not mentioned
    assert (f"{CL_COMPILED} {choice.build_s[CL_COMPILED]:.1f} s" in choice.reason) \
        == (choice.build_s[CL_COMPILED] >= 1.0), (choice.build_s, choice.reason)
    monkeypatch.setenv(channels_last.ENV, "off")
    choice = aiacc.optimize(net(), (x,), mode="train").aiacc_train_choice
    assert not {CL_GRAPH, CL_COMPILED} & set(choice.ms)
