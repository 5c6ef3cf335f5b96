"""Index tensors outside their axis: eager torch raises on `weight[ids]` (IndexError outside -n..n-1: a negative
index counts from the end), `torch.index_select` (IndexError outside 0..n-1, a negative index too) and
`torch.gather` (RuntimeError outside 0..n-1), while the IR's Gather reads a negative index from the end and the Mod
the converters wrap negative indices with turns a too-large index into another entry. The converters check an index
computed from the inputs at run time (aiacc::ValueGuard with its own message, import_ops.indexing.check_index, the
embedding ids' mechanism), so every backend raises a GuardError naming the node; in-range indices equal torch.
Fixed indices (constants, an arange) get no check; `torch.take_along_dim`, which eager takes modulo the size (never an
error), gets none either, and answers as eager."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import aiacc
from aiacc.core.ops.guard import guards_of, without_input_checks
from aiacc.core.stats import graph_stats, node_flops
from aiacc.errors import GuardError

N = 10  # the size of the indexed axis


class TableIndex(nn.Module):
    """`weight[ids]` on a parameter (aten.index.Tensor under torch.export)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(N, 4))

    def forward(self, ids):
        return self.weight[ids] * 2


class ColumnIndex(nn.Module):
    """`x[:, ids]`: an index tensor on the second axis of an input."""

    def forward(self, x, ids):
        return x[:, ids] + 1


class IndexSelect(nn.Module):
    def forward(self, x, ids):
        return torch.index_select(x, 1, ids) * 3


class Gather(nn.Module):
    def forward(self, x, ids):
        return torch.gather(x, 1, ids) - 1


X = torch.randn(3, N, generator=torch.Generator().manual_seed(1))
# per case: (model, example inputs, a fresh in-range input, out-of-range inputs, the node's message, torch's error)
CASES = {
    "table_index": (TableIndex, (torch.tensor([[1, -2, 9]]),), (torch.tensor([[0, 5, -10]]),),
                    [(torch.tensor([[10, 1, 1]]),), (torch.tensor([[1, -11, 1]]),)],
                    r"indexing \(node {node}\): an index is outside dimension 0's 10 entries .*indices must be in "
                    r"-10\.\.9\), where torch raises IndexError", IndexError, "getitem"),
    "column_index": (ColumnIndex, (X, torch.tensor([3, -1])), (X, torch.tensor([-10, 9])),
                     [(X, torch.tensor([0, 10])), (X, torch.tensor([-11, 0]))],
                     r"indexing \(node {node}\): an index is outside dimension 1's 10 entries .*indices must be in "
                     r"-10\.\.9\)", IndexError, "getitem"),
    "index_select": (IndexSelect, (X, torch.tensor([1, 2, 9])), (X, torch.tensor([0, 0, 8])),
                     [(X, torch.tensor([-1, 0, 0])), (X, torch.tensor([10, 0, 0]))],
                     r"index_select \(node {node}\): an index is outside dimension 1's 10 entries .*indices must "
                     r"be in 0\.\.9\), where torch raises an error", (IndexError, RuntimeError), "index_select"),
    "gather": (Gather, (X, torch.tensor([[1], [2], [9]])), (X, torch.tensor([[0], [4], [8]])),
               [(X, torch.tensor([[-1], [0], [0]])), (X, torch.tensor([[10], [0], [0]]))],
               r"gather \(node {node}\): an index is outside dimension 1's 10 entries .*indices must be in 0\.\.9\), "
               r"where torch raises RuntimeError", RuntimeError, "gather"),
}


def _quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


@pytest.mark.parametrize("backend", ["native", "onnxruntime"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_an_index_outside_its_axis_raises_on_every_backend(case, backend):
    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    cls, example, fresh, bad_inputs, msg, torch_error, node = CASES[case]
    model = cls().eval()
    fast = _quiet(aiacc.optimize, model, example, **({} if backend == "native" else {"backend": backend}))
    with torch.no_grad():
        np.testing.assert_allclose(fast(*fresh).numpy(), model(*fresh).numpy(), rtol=1e-6, atol=1e-6)
        for bad in bad_inputs:
            with pytest.raises(torch_error):
                model(*bad)
            with pytest.raises(GuardError, match=msg.format(node=node)):
                fast(*bad)


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_frontend_checks_the_index_too(case):
    torch.manual_seed(0)
    cls, example, fresh, bad_inputs, msg, _, _ = CASES[case]
    model = cls().eval()
    fast = _quiet(aiacc.optimize, model, example, frontend="export")
    with torch.no_grad():
        np.testing.assert_allclose(fast(*fresh).numpy(), model(*fresh).numpy(), rtol=1e-6, atol=1e-6)
        for bad in bad_inputs:
            with pytest.raises(GuardError, match=msg.format(node=".*")):
                fast(*bad)


class FixedIndices(nn.Module):
    """Indices computed from constants only (a buffer like Swin's relative position index, an arange, a
    constant list): the example's run checked them; no run-time check."""

    def __init__(self):
        super().__init__()
        self.register_buffer("pos", torch.tensor([[0, 3], [9, 1]]))

    def forward(self, x):
        a = x[:, self.pos]
        b = torch.index_select(x, 1, torch.arange(4))
        c = torch.gather(x, 1, self.pos[:1].expand(x.shape[0], 2))
        return a.sum(-1) + b.sum(-1, keepdim=True) + c.sum(-1, keepdim=True)[..., None]


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_fixed_indices_get_no_check(frontend):
    model = FixedIndices().eval()
    graph = _quiet(aiacc.trace, model, (X,), frontend=frontend)
    assert guards_of(graph) == [] and not any(n.is_opaque for n in graph)
    fast = _quiet(aiacc.optimize, model, (X,), frontend=frontend)
    fresh = torch.randn(3, N)
    with torch.no_grad():
        np.testing.assert_allclose(fast(fresh).numpy(), model(fresh).numpy(), rtol=1e-6, atol=1e-6)


class TakeAlongDim(nn.Module):
    def forward(self, x, ids):
        return torch.take_along_dim(x, ids, 1) * 3


@pytest.mark.parametrize("backend", ["native", "onnxruntime"])
@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_take_along_dim_wraps_every_index_as_eager_and_needs_no_check(frontend, backend):
    """torch.take_along_dim takes the index modulo the size (its decomposition's remainder): 18 is entry 8
    and -13 entry 7, in eager and here, with no opaque node and no check (the Mod keeps it in range)."""
    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime")
    model = TakeAlongDim().eval()
    example = (X, torch.tensor([[1], [2], [9]]))
    graph = _quiet(aiacc.trace, model, example, frontend=frontend)
    assert guards_of(graph) == [] and not any(n.is_opaque for n in graph)
    fast = _quiet(aiacc.optimize, model, example, frontend=frontend,
                  **({} if backend == "native" else {"backend": backend}))
    wild = (X, torch.tensor([[18], [-13], [-1]]))
    with torch.no_grad():
        want = model(*wild).numpy()
        np.testing.assert_allclose(want[:, 0], 3 * X[[0, 1, 2], [8, 7, 9]].numpy(), rtol=1e-6)
        np.testing.assert_allclose(fast(*wild).numpy(), want, rtol=1e-6, atol=1e-6)


def test_take_along_dim_broadcasts_as_torch_and_checks_the_flattened_gather():
    """Off `dim` the index and the input broadcast; with dim None torch gathers the flattened tensors with
    no modulo (RuntimeError outside 0..numel-1), and so the optimized model checks it (GuardError)."""
    class Both(nn.Module):
        def forward(self, x, ids, flat):
            return torch.take_along_dim(x, ids, 2).sum() + torch.take_along_dim(x, flat).sum()

    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 5, generator=g)
    example = (x, torch.randint(0, 5, (1, 3, 4), generator=g), torch.randint(0, 30, (6,), generator=g))
    model = Both().eval()
    graph = _quiet(aiacc.trace, model, example)
    assert not any(n.is_opaque for n in graph) and len(guards_of(graph)) == 1  # the flattened gather's
    fast = _quiet(aiacc.optimize, model, example)
    fresh = (x, torch.randint(-7, 12, (1, 3, 4), generator=g), torch.randint(0, 30, (6,), generator=g))
    with torch.no_grad():
        np.testing.assert_allclose(fast(*fresh).numpy(), model(*fresh).numpy(), rtol=1e-5, atol=1e-5)
        bad = (x, fresh[1], torch.tensor([0, 1, 2, 3, 4, 30]))
        with pytest.raises(RuntimeError):
            model(*bad)
        with pytest.raises(GuardError, match=r"gather \(node .*\): an index is outside dimension 0's 30 entries"):
            fast(*bad)


class Lookup(nn.Module):
    """`weight[ids]`, then a Linear: the compute the check sits beside."""

    def __init__(self):
        super().__init__()
        self.weight, self.proj = nn.Parameter(torch.randn(N, 64)), nn.Linear(64, 64)

    def forward(self, ids):
        return self.proj(self.weight[ids])


def test_the_check_costs_no_measurable_flops_and_runs_before_the_lookup():
    """One check, of the input's index, at the graph's start (before the Gather); the guard counts 0 FLOPs and
    the graph with the check has at most 1% more FLOPs than without it."""
    graph = _quiet(aiacc.trace, Lookup().eval(), (torch.randint(0, N, (2, 16)),))
    (guard,) = guards_of(graph)
    assert guard.attrs["what"] == "indexing's indices on dimension 0 in -10..9" and node_flops(guard) == 0
    order = [n.op for n in graph]
    assert order.index("ValueGuard") < order.index("Gather")
    with_check = graph_stats(graph).flops
    without = graph_stats(_quiet(without_input_checks, graph, "test")).flops
    assert without > 0 and with_check - without <= 0.01 * without


def test_unsafe_index_gets_no_check():
    """aten._unsafe_index (upsampling's decomposition), which torch does not bounds-check: no check either."""
    from aiacc.plugins.torch.importer import ATEN

    class Up(nn.Module):
        def forward(self, x, ids):
            return torch.ops.aten._unsafe_index.Tensor(x, [None, ids]) * 2

    model = Up().eval()
    example = (X, torch.tensor([1, 2]))
    assert "_unsafe_index" in ATEN
    graph = _quiet(aiacc.trace, model, example, frontend="export")
    assert guards_of(graph) == [] and not any(n.is_opaque for n in graph)
    fast = _quiet(aiacc.optimize, model, example, frontend="export")
    with torch.no_grad():
        np.testing.assert_allclose(fast(X, torch.tensor([0, -3])).numpy(), model(X, torch.tensor([0, -3])).numpy(),
                                   rtol=1e-6)


# the writes by index: per op, the module's body, torch's error, the range the message names
WRITES = {
    "scatter": (lambda x, i: x.scatter(1, i, 1.0), RuntimeError, r"0\.\.9"),
    "scatter_add": (lambda x, i: x.scatter_add(1, i, torch.ones_like(x)), RuntimeError, r"0\.\.9"),
    "scatter_reduce": (lambda x, i: x.scatter_reduce(1, i, torch.ones_like(x), "amax"), RuntimeError, r"0\.\.9"),
    "index_add": (lambda x, i: x.index_add(1, i[0], torch.ones(3, 2)), RuntimeError, r"0\.\.9"),
    "index_copy": (lambda x, i: x.index_copy(1, i[0], torch.ones(3, 2)), IndexError, r"0\.\.9"),
    "index_put": (lambda x, i: x.index_put((torch.tensor([0, 2]), i[0]), torch.tensor(5.0)), IndexError,
                  r"-10\.\.9"),
}


class Write(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x, ids):
        return self.body(x.clone(), ids) * 2


@pytest.mark.parametrize("backend", ["native", "onnxruntime"])
@pytest.mark.parametrize("op", sorted(WRITES))
def test_a_write_outside_its_axis_raises(op, backend):
    """scatter / scatter_add / scatter_reduce / index_add (0..n-1) and index_put (-n..n-1): an index outside
    raises a GuardError naming the op where torch raises, instead of writing another entry (the converters
    wrap the index modulo the size)."""
    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime")
    body, torch_error, allowed = WRITES[op]
    model = Write(body).eval()
    example = (X, torch.tensor([[1, 2], [3, 4], [5, 9]]))
    fast = _quiet(aiacc.optimize, model, example, **({} if backend == "native" else {"backend": backend}))
    fresh = (X, torch.tensor([[0, 9], [9, 0], [4, 4]]) if op != "index_put" else torch.tensor([[-1, 3]] * 3))
    with torch.no_grad():
        np.testing.assert_allclose(fast(*fresh).numpy(), model(*fresh).numpy(), rtol=1e-6, atol=1e-6)
        for bad in ([[10, 1]] * 3, [[1, -11]] * 3) + (() if op == "index_put" else ([[-1, 0]] * 3,)):
            bad = (X, torch.tensor(bad))
            with pytest.raises(torch_error):
                model(*bad)
            with pytest.raises(GuardError, match=rf"{op} \(node .*\): an index is outside dimension 1's 10 entries "
                                                 rf".*indices must be in {allowed}\)"):
                fast(*bad)


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_index_copy_refuses_a_negative_index_as_eager_and_index_fill_takes_it_as_eager(frontend):
    """Eager's index_copy raises IndexError on a negative index (0..n-1), index_fill counts it from the end
    (-n..n-1): the same under both frontends (torch.export would decompose index_copy into index_put, which
    accepts -n..n-1; aiacc translates index_copy itself)."""
    copy_model = Write(WRITES["index_copy"][0]).eval()
    fill_model = Write(lambda x, i: x.index_fill(1, i[0], 3.0)).eval()
    example = (X, torch.tensor([[1, 2], [3, 4], [5, 9]]))
    negative = (X, torch.tensor([[-1, 3]] * 3))
    fast_copy = _quiet(aiacc.optimize, copy_model, example, frontend=frontend)
    fast_fill = _quiet(aiacc.optimize, fill_model, example, frontend=frontend)
    with torch.no_grad():
        with pytest.raises(IndexError):
            copy_model(*negative)
        with pytest.raises(GuardError, match=r"index_copy \(node .*indices must be in 0\.\.9\)"):
            fast_copy(*negative)
        np.testing.assert_allclose(fast_fill(*negative).numpy(), fill_model(*negative).numpy())
        too_low = (X, torch.tensor([[-11, 3]] * 3))
        with pytest.raises(IndexError):
            fill_model(*too_low)
        with pytest.raises(GuardError, match=r"index_fill \(node .*indices must be in -10\.\.9\)"):
            fast_fill(*too_low)
        fresh = (X, torch.tensor([[0, 9]] * 3))
        np.testing.assert_allclose(fast_copy(*fresh).numpy(), copy_model(*fresh).numpy(), rtol=1e-6)
