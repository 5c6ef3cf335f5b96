"""Embedding ids outside the table: torch raises IndexError on an id < 0 or >= rows, while onnxruntime's Gather and
aiacc's kernel read a negative id as a row counted from the end (-1: the last row). The torch converters check the
ids at run time (aiacc::ValueGuard with its own message, import_ops.nn.check_ids), so every backend raises a
GuardError naming the embedding node and the table size; in-range ids equal torch. Ids the graph computes from
constants (an arange of position ids, a constant) get no check, and the check sits before the lookup, so
onnxruntime runs the model after it as one session."""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import aiacc
from aiacc.core.ops.guard import guards_of
from aiacc.errors import GuardError

ROWS = 10
MSG = r"embedding \(node {node}\): an id is outside the table's 10 rows .*ids must be in 0\.\.9"


class Module(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(ROWS, 4)

    def forward(self, ids):
        return self.tok(ids) * 2


class Function(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(ROWS, 4))

    def forward(self, ids):
        return F.embedding(ids, self.table) + 1


class WithPositions(nn.Module):
    """Token ids from the input (checked), position ids an arange and a constant id (not checked)."""

    def __init__(self):
        super().__init__()
        self.tok, self.pos, self.kind = nn.Embedding(ROWS, 4), nn.Embedding(8, 4), nn.Embedding(2, 4)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        return self.tok(ids) + self.pos(pos) + self.kind(torch.zeros_like(pos))


CASES = {"module": (Module, "tok"), "function": (Function, "embedding"), "positions": (WithPositions, "tok")}
GOOD, FRESH = torch.tensor([[1, 2, 3, 9]]), torch.tensor([[0, 9, 5, 4]])
BAD = [torch.tensor([[1, -1, 3, 2]]), torch.tensor([[1, 10, 3, 2]]), torch.tensor([[1, 2, 3, -7]])]


def _optimize(model, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return aiacc.optimize(model, (GOOD,), **kw)


@pytest.mark.parametrize("backend", ["native", "onnxruntime", "aiacc"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_an_id_outside_the_table_raises_on_every_backend(case, backend):
    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    cls, node = CASES[case]
    model = cls().eval()
    fast = _optimize(model, **({} if backend == "native" else {"backend": backend}))
    with torch.no_grad():
        np.testing.assert_allclose(fast(FRESH).numpy(), model(FRESH).numpy(), rtol=1e-6, atol=1e-6)
        for bad in BAD:
            with pytest.raises(IndexError):
                model(bad)
            with pytest.raises(GuardError, match=MSG.format(node=node)):
                fast(bad)


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_frontend_checks_the_ids_too(case):
    torch.manual_seed(0)
    cls, _ = CASES[case]
    model = cls().eval()
    fast = _optimize(model, frontend="export")
    with torch.no_grad():
        np.testing.assert_allclose(fast(FRESH).numpy(), model(FRESH).numpy(), rtol=1e-6, atol=1e-6)
        for bad in BAD:
            with pytest.raises(GuardError, match=r"embedding \(node .*\): an id is outside the table's 10 rows"):
                fast(bad)


def test_fixed_ids_get_no_check_and_the_check_runs_before_the_lookup():
    """The arange position ids and the zeros kind ids are computed from constants: one check, of the input's
    ids, and it is placed at the graph's start, before every lookup."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(WithPositions().eval(), (GOOD,))
    guards = guards_of(graph)
    assert [g.attrs["what"] for g in guards] == ["embedding's ids in 0..9"]
    order = [n.op for n in graph]
    assert order.index("ValueGuard") < order.index("Gather")
    assert all(v.is_graph_input or v.is_constant for n in graph if n.op in ("GreaterOrEqual", "Less")
               for v in n.inputs)


def test_onnxruntime_runs_the_model_after_the_check_as_one_session():
    """The check splits onnxruntime's graph before the embedding: its conditions, the guard, then the whole
    model (lookup, Add and LayerNorm together, which onnxruntime fuses)."""
    pytest.importorskip("onnxruntime")

    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.e, self.norm = nn.Embedding(ROWS, 8), nn.LayerNorm(8)

        def forward(self, ids, x):
            return self.norm(self.e(ids) + x)

    torch.manual_seed(0)
    model = Embed().eval()
    x = torch.randn(1, 4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = aiacc.optimize(model, (GOOD, x), backend="onnxruntime")
    segs = fast.runner.segments
    assert [s.node.op if s.node is not None else "session" for s in segs] == ["session", "ValueGuard", "session"]
    assert "Gather" in [n.op for n in segs[2].graph] and "Gather" not in [n.op for n in segs[0].graph]
    with torch.no_grad():
        np.testing.assert_allclose(fast(FRESH, x).numpy(), model(FRESH, x).numpy(), rtol=1e-5, atol=1e-5)


def test_training_lookup_with_padding_checks_the_ids():
    """mode='train' with a padding_idx is aiacc::Embedding (the lookup whose padding row gets no gradient):
    its ids are checked the same (run here on the reference kernels)."""
    from aiacc.core.runtime.executor import run

    torch.manual_seed(0)
    model = nn.Embedding(ROWS, 4, padding_idx=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, (GOOD,), mode="train")
    assert "Embedding" in [n.op for n in graph if n.domain == "aiacc"]
    feeds = {v.name: model.weight.detach().numpy() for v in graph.inputs if v.dtype == "float32"}  # the weight
    (name,) = [v.name for v in graph.inputs if v.dtype == "int64"]
    out = run(graph, {**feeds, name: FRESH.numpy()})[graph.outputs[0].name]
    np.testing.assert_allclose(out, model(FRESH).detach().numpy(), rtol=1e-6)
    for bad in BAD:
        with pytest.raises(GuardError, match=r"embedding \(node .*\): an id is outside the table's 10 rows"):
            run(graph, {**feeds, name: bad.numpy()})


def test_saved_module_keeps_the_check():
    torch.manual_seed(0)
    fast = _optimize(Module().eval())
    buf = io.BytesIO()
    torch.save(fast, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    with pytest.raises(GuardError, match=MSG.format(node="tok")):
        loaded(BAD[0])


def test_onnx_export_leaves_the_check_out_warned():
    """ONNX has no run-time check: the written model leaves the ids check out (warned, naming it) rather than
    refuse the model, and answers in-range ids as torch; a branch guard is still refused (test_value_guard)."""
    ort = pytest.importorskip("onnxruntime")
    from aiacc.core.onnx import to_onnx
    from aiacc.errors import AiaccWarning

    torch.manual_seed(0)
    model = Module().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, (GOOD,))
    assert len(guards_of(graph)) == 1
    with pytest.warns(AiaccWarning, match=r"ONNX has no run-time check: .*1 check\(s\) .*\(tok_ids\)"):
        proto = to_onnx(graph)
    assert len(guards_of(graph)) == 1  # the graph itself keeps it
    assert {n.op_type for n in proto.graph.node} == {"Gather", "Mul"}  # the check's nodes are gone too
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {graph.inputs[0].name: FRESH.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(got, model(FRESH).numpy(), rtol=1e-6)
