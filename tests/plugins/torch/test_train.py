"""torch mode="train": the optimized module (its own parameters, under the original's names, starting from
the original's values) trained with an optimizer over its parameters: one and three optimizer steps end
with the same parameters and BatchNorm statistics as the original trained alike, whether the step runs on
aiacc's exported graph, (framework_compile=True) under torch.compile, or on a copy of the original module
(chosen when it measures fastest); the measured choice is recorded, warned and in the report."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import aiacc  # noqa: E402
from aiacc.errors import AiaccError, OptionError  # noqa: E402


class Net(torch.nn.Module):
    """Conv + BatchNorm + ReLU with a residual, Linear + GELU + LayerNorm: the fusions training keeps."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8, momentum=0.3)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.fc = torch.nn.Linear(8 * 8 * 8, 16)
        self.ln = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        h = h + torch.relu(self.conv2(h))
        h = self.ln(torch.nn.functional.gelu(self.fc(h.flatten(1))))
        return self.head(h)


def net(seed=0):
    torch.manual_seed(seed)
    return Net().train()


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g)


def train(model, params, steps, x, y):
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same(ref, got, tol=1e-5):
    assert ref.keys() == got.keys()
    for k in ref:
        a, b = ref[k].double().numpy(), got[k].double().numpy()
        scale = max(1.0, float(np.abs(a).max()))
        assert float(np.abs(a - b).max()) <= tol * scale, (k, float(np.abs(a - b).max()))


@pytest.mark.parametrize("steps", [1, 3])
def test_steps_end_with_the_same_parameters_and_bn_statistics(steps):
    x, y = data()
    ref = net()
    train(ref, ref.parameters(), steps, x, y)
    m = net()
    fast = aiacc.optimize(m, (x,), mode="train", framework_compile=False)
    assert fast.aiacc_train_path == "aiacc graph"
    train(fast, fast.parameters(), steps, x, y)
    got = state(fast)
    assert_same(state(ref), {k: got[k] for k in state(ref)})
    assert not torch.allclose(got["bn.running_mean"], torch.zeros(8))  # the statistics moved
    assert int(got["bn.num_batches_tracked"]) == steps
    # the stem's and conv2's ReLUs ran in place (h + relu(...) does not: relu's backward reads h)
    assert fast.aiacc_report["inplace"].notes[0].startswith("2 relu -> relu_, 0 add -> add_")


def test_under_torch_compile_three_steps_match_and_the_choice_is_said():
    x, y = data()
    ref = net()
    train(ref, ref.parameters(), 3, x, y)
    m = net()
    fast = aiacc.optimize(m, (x,), mode="train", framework_compile=True)
    assert fast.aiacc_train_path == "aiacc graph + torch.compile"
    train(fast, fast.parameters(), 3, x, y)
    got = {k.removeprefix("_orig_mod."): v for k, v in state(fast).items()}
    assert_same(state(ref), {k: got[k] for k in state(ref)})


def test_auto_measures_both_candidates_and_keeps_the_original_untouched():
    x, _ = data()
    m = net()
    before = state(m)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = aiacc.optimize(m, (x,), mode="train")
    choice = fast.aiacc_train_choice
    assert set(choice.ms) == {"aiacc graph", "aiacc graph + torch.compile", "original module (eager)",
                              "original module + torch.compile", "aiacc graph channels-last",
                              "aiacc graph channels-last + torch.compile"}
    assert choice.path in choice.ms and choice.reason
    said = [str(w.message) for w in caught if "runs the step as" in str(w.message)]
    assert bool(said) == (choice.path != "aiacc graph")
    for text in said:  # the warning gives every candidate's measured time
        assert all(f"{k} {v:.1f} ms" in text for k, v in choice.ms.items())
    notes = fast.aiacc_report["train_step"].notes
    assert notes[0] == f"runs: {choice.path}" and all(any(n.startswith(k) for n in notes) for k in choice.ms)
    # measuring ran steps, but parameters, BatchNorm statistics and gradients are as they were
    got = {k.removeprefix("_orig_mod."): v for k, v in state(fast).items()}
    assert_same(before, {k: got[k] for k in before}, tol=0)
    assert all(p.grad is None for p in fast.parameters())


def test_the_original_module_runs_when_it_measures_fastest_and_trains_the_same(monkeypatch):
    """aiacc's graph made slow and the compiler refusing: the step runs a copy of the original module
    (never slower than eager by choice), says so with the times, and trains as the original does."""
    import time

    from aiacc.plugins.torch import training

    real = training._step_of

    def step_of(module, args, kwargs):
        step = real(module, args, kwargs)
        if isinstance(module, torch.fx.GraphModule):
            return lambda: (time.sleep(0.03), step())[1]
        return step

    def refuse(module):
        raise RuntimeError("compiler refused the graph")

    monkeypatch.setattr(training, "_step_of", step_of)
    monkeypatch.setattr(training, "_compiled", refuse)
    x, y = data()
    m = net()
    before = state(m)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = aiacc.optimize(m, (x,), mode="train")
    said = [str(w.message) for w in caught]
    choice = fast.aiacc_train_choice
    assert fast.aiacc_train_path == "original module (eager)" and type(fast) is Net and fast is not m
    assert choice.ms["aiacc graph"] > choice.ms["original module (eager)"]
    assert "aiacc graph + torch.compile failed" in choice.reason
    assert any("runs the step as original module (eager)" in s and "aiacc graph " in s for s in said)
    assert fast.aiacc_report["train_step"].notes[0] == "runs: original module (eager)"
    ref = net()
    train(ref, ref.parameters(), 3, x, y)
    train(fast, fast.parameters(), 3, x, y)
    assert_same(state(ref), state(fast))
    assert_same(before, state(m), tol=0)  # the user's module is not the one trained


def test_bad_framework_compile_value_is_refused():
    x, _ = data()
    with pytest.raises(OptionError, match="framework_compile"):
        aiacc.optimize(net(), (x,), mode="train", framework_compile="sometimes")
    assert issubclass(OptionError, AiaccError)


class Scaled(torch.nn.Module):
    """A forward taking a 0-d float tensor beside the batch (a temperature, a loss weight)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 3)

    def forward(self, x, temperature):
        return self.fc(x) / temperature


def test_a_zero_dimensional_float_input_is_measured_and_trains_the_same():
    # the choice's noise floor perturbs every floating input: a 0-d one must stay a tensor
    torch.manual_seed(0)
    ref = Scaled().train()
    m = Scaled().train()
    m.load_state_dict(ref.state_dict())
    x, t, y = torch.randn(4, 6), torch.tensor(0.5), torch.tensor([0, 1, 2, 0])
    fast = aiacc.optimize(m, (x, t), mode="train")
    for model in (ref, fast):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x, t), y).backward()
        opt.step()
    got = {k.removeprefix("_orig_mod."): v for k, v in state(fast).items()}
    assert_same(state(ref), {k: got[k] for k in state(ref)})
