"""aiacc.plugins.torch.inplace: relu -> relu_ and a + b -> a.add_(b) in the training graph only where autograd
allows (a fresh single-use tensor whose producer's backward does not read it, of the sum's shape), checked by
one step against the graph before; a rewrite autograd refuses is put back."""
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from aiacc.plugins.torch import inplace  # noqa: E402
from aiacc.plugins.torch.training import _arrays, _step_of  # noqa: E402
from aiacc.plugins.train_choice import same_results  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(4, 4, 3, 3) * 0.3)
        self.w2 = torch.nn.Parameter(torch.randn(4, 4, 3, 3) * 0.3)
        self.g = torch.nn.Parameter(torch.ones(4))
        self.b = torch.nn.Parameter(torch.zeros(4))
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("var", torch.ones(4))

    def forward(self, x):
        h = torch.relu(F.batch_norm(F.conv2d(x, self.w1, padding=1), self.mean, self.var, self.g, self.b, True))
        y = F.conv2d(h, self.w2, padding=1) + x        # the residual: may run in place on the conv's output
        s = torch.sigmoid(y)                           # sigmoid's backward reads its output: stays as it is
        return torch.relu(s) + torch.relu(y).sum()     # y has two users: neither relu runs in place on it


def rewrite(gm, x):
    step = (lambda m: _step_of(m, (x,), {}))
    return inplace.make_inplace(gm, (x,), {}, step, lambda a, b: same_results(a, b, 1e-6, 0.0, 1e-6), _arrays)


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_only_valid_nodes_run_in_place_and_the_step_is_unchanged():
    x = torch.randn(2, 4, 6, 6)
    gm, ref = torch.fx.symbolic_trace(Block()), torch.fx.symbolic_trace(Block())
    lines = rewrite(gm, x)
    assert lines == ["1 relu -> relu_, 1 add -> add_ (the inputs' producers do not save them for backward; "
                     "one step checked equal)"]
    t = targets(gm)
    assert t.count(torch.relu_) == 1 and t.count(torch.Tensor.add_) == 1 and t.count(torch.relu) == 2
    assert same_results(_arrays(_step_of(ref, (x,), {})()), _arrays(_step_of(gm, (x,), {})()), 0, 0, 0) == ""
    assert torch.equal(gm.mean, torch.zeros(4))  # recording shapes and checking ran steps: buffers put back


def test_a_rewrite_autograd_refuses_is_put_back(monkeypatch):
    monkeypatch.setattr(inplace, "FRESH", inplace.FRESH | {torch.sigmoid})  # wrongly: sigmoid saves its output
    x = torch.randn(2, 4, 6, 6)
    gm = torch.fx.symbolic_trace(Block())
    lines = rewrite(gm, x)
    assert len(lines) == 1 and lines[0].startswith("not applied: the step changed")
    assert torch.relu_ not in targets(gm) and torch.Tensor.add_ not in targets(gm)
    _step_of(gm, (x,), {})()  # the graph as it was trains
