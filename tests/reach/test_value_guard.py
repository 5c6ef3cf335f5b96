"""Value guards: a Python branch on tensor data (`if x.sum() > 0:`, `if mask.any().item():`) is traced on the
example's value instead of being kept opaque, and guarded: the optimized module answers like the original
where the branch goes the example's way and raises GuardError (never a wrong answer) where it does not; the
guard survives the passes, serialization and torch.save / torch.load; ONNX refuses it by name."""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import aiacc
from aiacc.core import serialize
from aiacc.core.ir import Graph
from aiacc.core.ops.guard import guards_of
from aiacc.core.passes.constant_folding import fold_constants
from aiacc.core.passes.cse import eliminate_common_subexpressions
from aiacc.core.passes.dce import eliminate_dead_code
from aiacc.core.passes.manager import PassContext
from aiacc.core.runtime.executor import run
from aiacc.errors import AiaccWarning, FallbackError, GuardError, UnsupportedError

GUARD_MSG = "specialised on the example's value of"


class SumBranch(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        else:
            return x - 1


class ItemBranch(nn.Module):
    def forward(self, x, mask):
        flag = (mask > 1).any().item()
        if flag:
            return x + 10
        return torch.relu(x) * 3


def _sum_case():
    g = torch.Generator().manual_seed(0)
    return SumBranch().eval(), (torch.rand(2, 5, generator=g) + 0.1,), (torch.rand(2, 5, generator=g) + 0.1,), \
        (-torch.rand(2, 5, generator=g) - 0.1,)


def _item_case():
    g = torch.Generator().manual_seed(0)
    x, fresh = torch.randn(2, 6, generator=g), torch.randn(2, 6, generator=g)
    ones = torch.ones(2, 6, dtype=torch.int64)
    other = ones.clone()
    other[1, 3] = 2  # a value > 1: the branch the example did not take
    return ItemBranch().eval(), (x, ones), (fresh, ones), (fresh, other)


CASES = {"sum": _sum_case, "item": _item_case}


def _optimize(model, x, **kw):
    with pytest.warns(AiaccWarning, match=GUARD_MSG):
        return aiacc.optimize(model, x, **kw)


@pytest.mark.parametrize("case", sorted(CASES))
def test_trace_has_one_guard_and_no_opaque_node(case):
    model, x, _, _ = CASES[case]()
    with pytest.warns(AiaccWarning, match=GUARD_MSG) as said:
        graph = aiacc.trace(model, x)
    assert [n.op for n in graph if n.is_opaque] == []
    guards = guards_of(graph)
    assert len(guards) == 1
    expected = case == "sum"  # x.sum() > 0 is True on the example; (mask > 1).any() is False
    assert guards[0].attrs["expected"] == int(expected)
    assert "if" in guards[0].attrs["what"]  # the source line of the branch
    assert graph.meta["torch.value_guards"] == [(guards[0].attrs["what"], expected)]
    assert sum(GUARD_MSG in str(w.message) for w in said) == 1  # once per trace


@pytest.mark.parametrize("case", sorted(CASES))
def test_optimized_answers_like_the_original_and_raises_on_the_other_branch(case):
    model, x, fresh, other = CASES[case]()
    fast = _optimize(model, x)
    with torch.no_grad():
        torch.testing.assert_close(fast(*fresh), model(*fresh), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(fast(*x), model(*x), rtol=1e-6, atol=1e-6)
        with pytest.raises(GuardError, match=GUARD_MSG + r".*if.*this call gives"):
            fast(*other)
    assert any(GUARD_MSG in m for m in fast.aiacc_report.fallbacks)


@pytest.mark.parametrize("case", sorted(CASES))
def test_saved_and_loaded_module_keeps_the_guard(case):
    model, x, fresh, other = CASES[case]()
    fast = _optimize(model, x)
    buf = io.BytesIO()
    torch.save(fast, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    with torch.no_grad():
        torch.testing.assert_close(loaded(*fresh), model(*fresh), rtol=1e-6, atol=1e-6)
        with pytest.raises(GuardError, match=GUARD_MSG):
            loaded(*other)


def test_aiacc_runtime_runs_the_guard():
    model, x, fresh, other = _sum_case()
    fast = _optimize(model, x, backend="aiacc")
    with torch.no_grad():
        torch.testing.assert_close(fast(*fresh), model(*fresh), rtol=1e-6, atol=1e-6)
        with pytest.raises(GuardError, match=r"node value_guard \(aiacc::ValueGuard\)"):
            fast(*other)


@pytest.mark.parametrize("backend", ["onnxruntime", "auto"])
def test_onnxruntime_runs_the_guard_on_aiacc_kernels_between_sessions(backend):
    pytest.importorskip("onnxruntime")
    model, x, fresh, other = _sum_case()
    fast = _optimize(model, x, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(fast(*fresh), model(*fresh), rtol=1e-6, atol=1e-6)
        with pytest.raises(GuardError, match=GUARD_MSG):
            fast(*other)


def test_strict_refuses_the_specialisation():
    model, x, _, _ = _sum_case()
    with pytest.raises(FallbackError, match=GUARD_MSG):
        aiacc.optimize(model, x, strict=True)


# ------------------------------------------------------------------------------------------- the IR op
def _guarded_graph(expected=1):
    g = Graph("guarded")
    x = g.add_input("x", "float32", (3,))
    total = g.op("ReduceSum", x, g.add_initializer("axes", np.array([0], dtype=np.int64)), keepdims=0)
    cond = g.op("Greater", total, g.add_initializer("zero", np.array(0.0, dtype=np.float32)))
    g.add_node("ValueGuard", [cond], {"expected": expected, "what": "`if x.sum() > 0:`"}, domain="aiacc")
    g.add_output(g.op("Relu", x))
    return g


def test_passes_keep_the_guard_after_serialization():
    g = serialize.from_dict(*serialize.to_dict(_guarded_graph()))  # node.meta does not survive this
    g2 = g.copy()
    eliminate_dead_code(g2)
    eliminate_common_subexpressions(g2)
    fold_constants(g2, PassContext())
    assert len(guards_of(g2)) == 1
    assert run(g2, {"x": np.ones(3, np.float32)})["relu"].tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(GuardError, match=r"node .* \(aiacc::ValueGuard\).*`if x.sum\(\) > 0:` \(True\)"):
        run(g2, {"x": -np.ones(3, np.float32)})


def test_constant_condition_is_not_folded_away():
    g = Graph("const")
    x = g.add_input("x", "float32", (2,))
    cond = g.add_initializer("c", np.array(False))
    g.add_node("ValueGuard", [cond], {"expected": 1, "what": "a constant"}, domain="aiacc")
    g.add_output(g.op("Relu", x))
    fold_constants(g, PassContext())
    eliminate_dead_code(g)
    assert len(guards_of(g)) == 1
    with pytest.raises(GuardError, match="a constant"):
        run(g, {"x": np.ones(2, np.float32)})


def test_onnx_export_refuses_the_guard():
    from aiacc.core.onnx import to_onnx

    with pytest.raises(UnsupportedError, match=r"node \w+ \(aiacc::ValueGuard, guarding `if x.sum\(\) > 0:`\)"):
        to_onnx(_guarded_graph())


def test_guard_of_several_elements_is_an_error():
    g = Graph("wide")
    x = g.add_input("x", "bool", (2,))
    g.add_node("ValueGuard", [x], {"expected": 1}, domain="aiacc")
    g.add_output(g.op("Not", x))
    with pytest.raises(GuardError, match="2 elements"):
        run(g, {"x": np.array([True, True])})


def test_guards_under_torch_compile_stay_in_the_graph_and_still_refuse():
    """torch.compile of an optimized module (the training step's compiled candidate): a guard is an assert
    dynamo keeps in its graph (bool() of a tensor would break the graph in two at every guard), and a call
    the guard refuses still raises, with the guard's text: a branch guard and a loss's target check."""
    import torch._dynamo as dynamo
    import torch.nn.functional as F

    class Loss(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(5, 5)

        def forward(self, x, t):
            return F.cross_entropy(self.lin(x), t)

    model, x, fresh, other = _sum_case()
    torch.manual_seed(0)
    loss, lx, lt = Loss().eval(), torch.randn(3, 5), torch.tensor([0, 4, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast, fast_loss = aiacc.optimize(model, x), aiacc.optimize(loss, (lx, lt))
    for m, args, bad, text in ((fast, fresh, other, GUARD_MSG), (fast_loss, (lx, lt), (lx, torch.tensor([0, 9, 1])),
                                                                "a target is neither in the classes 0..4")):
        dynamo.reset()
        assert dynamo.explain(m)(*args).graph_break_count == 0
        compiled = torch.compile(m)
        with torch.no_grad():
            assert torch.allclose(compiled(*args), m(*args))
            with pytest.raises(RuntimeError, match=text):
                compiled(*bad)
