"""Training under a memory budget (aiacc.plugins.torch.memory): activation checkpointing chosen by aiacc.
Memory is measured with the CPU allocator's own counters (torch profiler memory events)."""
import pytest

torch = pytest.importorskip("torch")

from aiacc.core.memory_checkpoint import MemoryBudgetError  # noqa: E402
from aiacc.errors import UnsupportedError  # noqa: E402
from aiacc.plugins.torch.memory import measure_training_memory, plan_training_memory, profile_units  # noqa: E402

torch.set_num_threads(2)


class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1 = torch.nn.Conv2d(c, c, 3, padding=1)
        self.b1 = torch.nn.BatchNorm2d(c)
        self.c2 = torch.nn.Conv2d(c, c, 3, padding=1)
        self.b2 = torch.nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


class ResNetish(torch.nn.Module):
    def __init__(self, c=16, n=6):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, c, 3, padding=1)
        self.blocks = torch.nn.Sequential(*[Block(c) for _ in range(n)])
        self.fc = torch.nn.Linear(c, 10)

    def forward(self, x):
        return self.fc(self.blocks(torch.relu(self.stem(x))).mean((2, 3)))


class MLPish(torch.nn.Module):
    """Pre-norm residual MLP layers with dropout: the recompute must replay the same dropout masks."""

    def __init__(self, d=64, n=8):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Sequential(
            torch.nn.LayerNorm(d), torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Dropout(0.1),
            torch.nn.Linear(4 * d, d)) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def _grads(model, x, seed=0):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = model(x)
    out.pow(2).mean().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.fixture
def resnetish():
    torch.manual_seed(0)
    return ResNetish().train(), torch.randn(2, 3, 32, 32)


def test_half_budget_lowers_measured_memory_and_keeps_gradients(resnetish):
    model, x = resnetish
    original = measure_training_memory(model, x)
    budget = original["held"] // 2
    small = plan_training_memory(model, x, memory_budget=budget)
    plan = small.aiacc_memory_plan
    assert plan.segments and plan.memory <= budget
    # the estimate of the original is the allocator's figure (within the loss and the output)
    assert abs(plan.baseline - original["held"]) <= 0.02 * original["held"]
    measured = measure_training_memory(small, x)
    assert measured["held"] <= budget
    assert measured["peak"] < 0.8 * original["peak"]
    out0, g0 = _grads(model, x)
    out1, g1 = _grads(small, x)  # shares the parameters: .grad lands on the same tensors
    torch.testing.assert_close(out1, out0, rtol=0, atol=0)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)


def test_batchnorm_statistics_are_updated_once_per_step(resnetish):
    model, x = resnetish
    small = plan_training_memory(model, x, memory_budget=measure_training_memory(model, x)["held"] // 2)
    start = {k: b.clone() for k, b in model.named_buffers()}
    _grads(model, x)
    after_original = {k: b.clone() for k, b in model.named_buffers()}
    with torch.no_grad():
        for k, b in model.named_buffers():
            b.copy_(start[k])
    _grads(small, x)
    for k, b in model.named_buffers():
        torch.testing.assert_close(b, after_original[k], rtol=0, atol=0, msg=k)


def test_dropout_masks_replayed_in_recompute():
    torch.manual_seed(0)
    model, x = MLPish().train(), torch.randn(64, 64)
    _, _, units = profile_units(model, x)
    baseline = sum(u.saved for u in units)
    small = plan_training_memory(model, x, memory_budget=baseline // 2)
    assert small.aiacc_memory_plan.segments
    out0, g0 = _grads(model, x, seed=3)
    out1, g1 = _grads(small, x, seed=3)
    torch.testing.assert_close(out1, out0, rtol=0, atol=0)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
    assert measure_training_memory(small, x)["held"] < 0.6 * measure_training_memory(model, x)["held"]


def test_unreachable_budget_names_the_smallest_figure(resnetish):
    model, x = resnetish
    with pytest.raises(MemoryBudgetError, match=r"cannot be met: the smallest activation memory .* is [\d.]+ MiB") \
            as info:
        plan_training_memory(model, x, memory_budget=1000)
    smallest = info.value.smallest
    assert 1000 < smallest
    small = plan_training_memory(model, x, memory_budget=smallest)  # the figure given is reachable
    assert small.aiacc_memory_plan.memory <= smallest
    assert measure_training_memory(small, x)["held"] <= smallest


def test_generous_budget_recomputes_nothing(resnetish):
    model, x = resnetish
    small = plan_training_memory(model, x, memory_budget=1 << 40)
    assert small.aiacc_memory_plan.segments == [] and small.aiacc_memory_plan.recompute == 0
    assert not any(name.startswith("aiacc_checkpoint") for name, _ in small.named_children())


def test_untraceable_module_is_refused():
    class Dynamic(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x  # data-dependent control flow

    with pytest.raises(UnsupportedError, match="Dynamic"):
        plan_training_memory(Dynamic(), torch.randn(3), memory_budget=1 << 20)


def test_aiacc_optimize_train_with_memory_budget(resnetish):
    import aiacc

    model, x = resnetish
    original = measure_training_memory(model, x)
    budget = original["held"] // 2
    fast = aiacc.optimize(model, x, mode="train", memory_budget=budget)
    assert fast.aiacc_memory_plan.segments and fast.aiacc_memory_plan.memory <= budget
    assert measure_training_memory(fast, x)["held"] <= budget
    out0, _ = _grads(model, x)
    out1, _ = _grads(fast, x)
    torch.testing.assert_close(out1, out0, rtol=1e-5, atol=1e-6)
    ref = dict(model.named_parameters())
    got = dict(fast.named_parameters())
    assert set(got) == set(ref)
    for name, p in got.items():
        torch.testing.assert_close(p.grad, ref[name].grad, rtol=1e-5, atol=1e-6, msg=name)
    with pytest.raises(MemoryBudgetError, match="cannot be met"):
        aiacc.optimize(model, x, mode="train", memory_budget=1000)
