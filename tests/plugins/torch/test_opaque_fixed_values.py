"""Python numbers an opaque call returns (`tolist()`, `item()`) that the trace hands to translated ops as
constants are checked on every call: a call where they differ raises GuardError instead of computing with
the example's numbers (JetMoE's `expert_size.tolist()` feeding a split gave outputs 0.39 off on a fresh
input, silently)."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import aiacc
from aiacc.errors import GuardError
from tests.plugins.torch._helpers import saved_and_loaded


class SplitByCount(nn.Module):
    """Rows routed to two experts by the sign of their first feature, as MoE layers do: the group sizes
    come from the data through `tolist()` and size a split."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.e0, self.e1 = nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x):
        route = (x[:, 0] > 0).long()
        order = torch.argsort(route, stable=True)
        sizes = torch.stack([(route == 0).sum(), (route == 1).sum()]).tolist()
        first, second = x[order].split(sizes, 0)
        y = torch.cat([self.e0(first), self.e1(second)], 0)
        return y[torch.argsort(order)] * 2


def _inputs(positive_rows: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 4, generator=g)
    x[:, 0] = x[:, 0].abs() + 0.1
    x[positive_rows:, 0] *= -1
    return x[torch.randperm(8, generator=g)]


def _optimize(model, x, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return aiacc.optimize(model, (x,), **kw)


@pytest.mark.parametrize("backend", ["native", "onnxruntime", "aiacc"])
def test_changed_count_raises_and_same_count_computes(backend):
    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime")
    model = SplitByCount().eval()
    x = _inputs(3, seed=0)
    graph = aiacc.trace(model, (x,))
    assert any(n.is_opaque and n.meta.get("torch.out_fixed") for n in graph), \
        "the example needs an opaque tolist() whose numbers the split uses"
    fast = _optimize(model, x, backend=backend)
    same_count = _inputs(3, seed=1)  # other values, the same group sizes
    with torch.no_grad():
        torch.testing.assert_close(fast(same_count), model(same_count), rtol=1e-5, atol=1e-6)
        with pytest.raises(GuardError, match=r"tolist at node .* returned the Python values \[3, 5\] where the "
                                             r"optimized graph was traced with \[5, 3\]"):
            fast(_inputs(5, seed=2))


def test_check_survives_save_and_load():
    model = SplitByCount().eval()
    x = _inputs(3, seed=0)
    loaded = saved_and_loaded(_optimize(model, x))
    with torch.no_grad():
        torch.testing.assert_close(loaded(_inputs(3, seed=3)), model(_inputs(3, seed=3)), rtol=1e-5, atol=1e-6)
        with pytest.raises(GuardError, match="constants of the trace"):
            loaded(_inputs(4, seed=4))


def test_numbers_of_a_call_without_tensor_inputs_are_not_checked():
    """A value the opaque call computes from no tensor (here a Python-level constant) cannot change."""
    from aiacc.plugins.torch.opaque import fixed_leaves

    assert fixed_leaves([3, 4.0, True, None, "s"], [], has_inputs=False) == ()
    assert fixed_leaves([3, 4.0, True, None, "s"], [], has_inputs=True) == ((0, 3), (1, 4.0), (2, True))


def test_the_specialisation_is_said_and_strict_refuses_it():
    from aiacc.errors import AiaccWarning, FallbackError

    model = SplitByCount().eval()
    x = _inputs(3, seed=0)
    with pytest.warns(AiaccWarning, match=r"tolist at node tolist returns Python values \[5, 3\] that the graph "
                                          r"after it uses as constants"):
        aiacc.optimize(model, (x,))
    with pytest.raises(FallbackError, match="specialised on the example's values"):
        aiacc.optimize(model, (x,), strict=True)
