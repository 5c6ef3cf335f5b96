"""What fx or the converters cannot translate stays opaque, holds the original callable, and comes back
unchanged: a custom autograd Function keeps its own backward, a data-dependent submodule its control flow."""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

import aiacc
from aiacc.core import run
from tests.plugins.torch._helpers import assert_close_rel, assert_same_training_step
from tests.zoo.torch_models import ZOO, ScaledRelu


def test_opaque_nodes_hold_the_original_callables():
    model, inputs = ZOO["with_opaque"]()
    graph = aiacc.trace(model, inputs)
    opaque = {n.op: n for n in graph if n.is_opaque}
    assert set(opaque) == {"ScaledRelu.apply", "DataDependent"}
    assert opaque["DataDependent"].meta["torch.callable"] is model.branch
    assert opaque["ScaledRelu.apply"].meta["torch.callable"].__self__ is ScaledRelu
    reasons = graph.meta["torch.opaque_reasons"]
    assert "int()" in reasons["branch"]  # the loop's trip count read from the data
    # the rest is translated
    assert {"Conv", "BatchNormalization", "ReduceMean", "Relu", "Gemm"} <= {n.op for n in graph}


def test_reference_executor_runs_opaque_nodes_through_their_kernels():
    model, inputs = ZOO["with_opaque"]()
    graph = aiacc.trace(model, inputs)
    out = run(graph, {"x": inputs[0].numpy()})
    with torch.no_grad():
        expected = model(*inputs).numpy()
    np.testing.assert_allclose(list(out.values())[0], expected, rtol=1e-5, atol=1e-6)


def test_custom_backward_survives_training_round_trip():
    model, inputs = ZOO["with_opaque"]()
    model.train()
    reference = copy.deepcopy(model)
    fast = aiacc.optimize(model, inputs)
    assert_same_training_step(reference, fast, inputs)
    # the custom backward (3x) is what ran: the plain autograd of relu(x)*2 gives other conv gradients
    inlined = copy.deepcopy(model)
    inlined.forward = lambda x: inlined.fc(torch.relu(inlined.branch((inlined.bn(inlined.conv(x)).clamp(min=0) * 2)
                                                                     .mean(dim=(2, 3)))))
    torch.manual_seed(123)
    (inlined(*inputs) ** 2).sum().backward()
    assert not torch.allclose(inlined.conv.weight.grad, fast.conv.weight.grad)


class _Unknown(nn.Module):
    """An op no converter knows (torch.logcumsumexp; torch.cumsum was one until the IR had CumSum), between
    two translated layers."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 3)

    def forward(self, x):
        return self.b(torch.logcumsumexp(self.a(x), dim=1))


def test_unknown_function_is_opaque_and_optimized_around():
    model = _Unknown().eval()
    x = torch.randn(4, 6)
    graph = aiacc.trace(model, (x,))
    assert [n.op for n in graph if n.is_opaque] == ["logcumsumexp"]
    fast = aiacc.optimize(model, (x,))
    with torch.no_grad():
        assert_close_rel(model(x), fast(x))


class _Untraceable(nn.Module):
    """A loop whose trip count is read from the data with int(): no trace holds it (a value guard fixes which
    way a branch goes, not a count)."""

    def forward(self, x):
        for _ in range(int((x > 0).sum())):
            x = x + 1
        return x - 1


def test_whole_model_untraceable_becomes_one_opaque_call():
    model = _Untraceable()
    x = torch.randn(3, 3)
    graph = aiacc.trace(model, (x,))
    assert len(graph) == 1 and graph.nodes[0].is_opaque
    fast = aiacc.optimize(model, (x,))
    for sign in (1, -1):
        assert torch.equal(fast(sign * x.abs()), model(sign * x.abs()))
