"""The measured model spec lists layers in the order they run, not the order their modules were registered:
the simulator (and so the plan) takes backward to run the layers last to first. A post-norm transformer
layer registers norm1 after linear2 although backward produces norm1's gradient after linear1's; in
registration order the plan took it as ready tens of ms early and held the first bucket for it."""
import pytest

torch = pytest.importorskip("torch")

from aiacc.plugins.torch.distributed import median_spec, profile_backward, spec_from_stamps  # noqa: E402


class Registered(torch.nn.Module):
    """`late` is registered first but runs last in forward (so its gradient is ready first in backward)."""

    def __init__(self):
        super().__init__()
        self.late = torch.nn.Linear(8, 8)
        self.early = torch.nn.Linear(8, 8)
        self.mid = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.late(torch.tanh(self.mid(torch.tanh(self.early(x)))))


def test_profiled_layers_follow_the_backward_order_not_the_registration_order():
    torch.manual_seed(0)
    model, x = Registered(), torch.randn(4, 8)
    spec = profile_backward(model, lambda m: m(x).square().sum())
    assert [l.name for l in spec.layers] == ["early", "mid", "late"]  # forward order
    ready = [g.name for g, _, _ in spec.backward_order()]
    assert ready[:2] == ["late.weight", "late.bias"] and ready[-2:] == ["early.weight", "early.bias"]
    # the profile's gaps become the layers' backward times in that order
    named = list(model.named_parameters())
    stamps = {"late.weight": 1.0, "late.bias": 1.0, "mid.weight": 1.5, "mid.bias": 1.5, "early.weight": 3.5,
              "early.bias": 3.5}
    s = spec_from_stamps(named, stamps, backward_start=0.75)
    assert [(l.name, l.backward_s) for l in s.layers] == [("early", 2.0), ("mid", 0.5), ("late", 0.25)]
    # profiles are combined layer by layer by name, whatever order each lists them in
    other = spec_from_stamps(named, {**stamps, "mid.weight": 4.0, "mid.bias": 4.0}, backward_start=0.75)
    assert [l.name for l in other.layers] == ["mid", "early", "late"]
    both = median_spec([s, other, s])
    assert [(l.name, l.backward_s) for l in both.layers] == [("early", 2.0), ("mid", 0.5), ("late", 0.25)]
