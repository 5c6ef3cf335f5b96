"""The constructs of models nobody here wrote, in small modules: tensor indexing, gather, integer cumsum,
division rounding modes, control flow on tensor metadata, **kwargs forwards given a subset of inputs,
returned dict subclasses, results cached in Python state, a converter that crashes."""
from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils import _pytree as pytree

import aiacc
from aiacc.plugins.torch.importer import FUNCTIONS
from tests.plugins.torch._helpers import assert_close_rel


def _opaque(graph):
    return [n.op for n in graph if n.is_opaque]


def _check(model, inputs, fresh):
    graph = aiacc.trace(model, inputs)
    assert _opaque(graph) == [], graph.meta.get("torch.opaque_reasons")
    fast = aiacc.optimize(model, inputs)
    call = (lambda m: m(**fresh)) if isinstance(fresh, dict) else (lambda m: m(*fresh))
    with torch.no_grad():
        expected, actual = call(model), call(fast)
    assert type(actual) is type(expected)
    assert_close_rel(expected, actual, 1e-5)
    return fast


class _Indexing(nn.Module):
    def forward(self, x, i, j):
        a = x[i]                                  # one index tensor on axis 0
        b = x[:, j]                               # one on axis 1 (negative entries count from the end)
        c = x[i[:, None], j[None, :]]             # broadcast leading index tensors
        return a.sum() + b.sum() + c * 2


def test_tensor_indexing():
    x = torch.randn(5, 7)
    i, j = torch.tensor([0, 4, 2]), torch.tensor([-1, 3])
    _check(_Indexing(), (x, i, j), (torch.randn(5, 7), torch.tensor([1, 1, 3]), torch.tensor([6, -7])))


class _Gather(nn.Module):
    def forward(self, x, idx):
        return torch.gather(x, 1, idx) + x.gather(0, idx[:2, :3].clamp(max=1))[:1].sum()


def test_gather():
    x = torch.randn(3, 4)
    idx = torch.randint(0, 4, (3, 5))
    _check(_Gather(), (x, idx), (torch.randn(3, 4), torch.randint(0, 4, (3, 5))))


class _IntCumsum(nn.Module):
    def forward(self, mask):  # RoBERTa's position ids
        return (torch.cumsum(mask, dim=1) * mask).long() + mask.cumsum(0)


def test_integer_cumsum():
    m = torch.randint(0, 2, (3, 6))
    _check(_IntCumsum(), (m,), (torch.randint(0, 2, (3, 6)),))


class _Div(nn.Module):
    def forward(self, a, b, ia, ib):
        return (torch.div(a, b, rounding_mode="floor"), torch.div(a, b, rounding_mode="trunc"),
                torch.div(ia, ib, rounding_mode="floor"), torch.div(ia, ib, rounding_mode="trunc"),
                torch.div(ia, 3, rounding_mode="floor"))


def test_div_rounding_modes():
    def feed():
        b = torch.randn(4, 5)
        ib = torch.randint(1, 5, (4, 5)) * (torch.randint(0, 2, (4, 5)) * 2 - 1)
        return torch.randn(4, 5) * 5, b, torch.randint(-20, 20, (4, 5)), ib
    _check(_Div(), feed(), feed())


class _MetaControlFlow(nn.Module):
    def forward(self, x, mask):
        if x.dim() == 3 and x.shape[-1] % 2 == 0:
            x = x * 2
        if mask.dtype != torch.bool:
            mask = mask > 0
        fill = torch.finfo(x.dtype).min
        return x.masked_fill(~mask[..., None], fill) if False else torch.where(mask[..., None], x, fill)


def test_conditions_on_shape_dtype_and_rank_are_fixed_on_the_example():
    x, m = torch.randn(2, 3, 4), torch.randint(0, 2, (2, 3))
    _check(_MetaControlFlow(), (x, m), (torch.randn(2, 3, 4), torch.randint(0, 2, (2, 3))))


def test_condition_on_tensor_data_is_guarded_and_a_count_read_from_it_is_not_fixed():
    class DataFlow(nn.Module):
        def forward(self, x):
            return x + 1 if x.sum() > 0 else x - 1

    class DataCount(nn.Module):
        def forward(self, x):
            for _ in range(int((x > 0).sum())):
                x = x * 2
            return x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        branch = aiacc.trace(DataFlow(), (torch.ones(2),))
        count = aiacc.trace(DataCount(), (torch.ones(2),))
    # a branch: the example's way, behind a value guard (tests/reach/test_value_guard.py); never unguarded
    assert _opaque(branch) == [] and [n.op for n in branch if n.op == "ValueGuard"] == ["ValueGuard"]
    assert len(_opaque(count)) == 1  # the whole forward: a count is never specialized on the example's data


class _Output(collections.OrderedDict):
    """Like transformers' ModelOutput: a dict subclass registered with torch's pytree."""


pytree.register_pytree_node(_Output, lambda d: (list(d.values()), list(d.keys())),
                            lambda values, keys: _Output(zip(keys, values)))


class _KwargsModel(nn.Module):
    """A transformers-like forward: optional inputs, **kwargs, and a decorator-style keyword it adds itself."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def _forward(self, input_ids, attention_mask=None, token_type_ids=None, use_cache=None, **kwargs):
        assert use_cache is False
        h = self.lin(input_ids)
        if attention_mask is not None:
            h = h * attention_mask[..., None]
        return _Output(last_hidden_state=h)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, **kwargs):
        kwargs.setdefault("use_cache", False)  # would clash if use_cache came in positionally
        return self._forward(input_ids, attention_mask, token_type_ids, **kwargs)


def test_kwargs_forward_gets_only_the_given_inputs_and_keeps_its_return_type():
    feed = {"input_ids": torch.randn(2, 3, 4), "attention_mask": torch.ones(2, 3)}
    fresh = {"input_ids": torch.randn(2, 3, 4), "attention_mask": torch.tensor([[1.0, 0, 1], [0, 1, 1]])}
    fast = _check(_KwargsModel().eval(), feed, fresh)
    assert isinstance(fast(**fresh), _Output)


class _Caching(nn.Module):
    """timm's LeViT caches a tensor computed in forward in a dict of the module."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(4, 4))
        self.cache = {}

    def forward(self, x):
        if "b" not in self.cache:
            self.cache["b"] = self.bias[:, torch.tensor([3, 0, 1, 2])]
        return x @ self.cache["b"]


def test_a_forward_caching_in_python_state_traces_twice():
    model = _Caching().eval()
    x = torch.randn(2, 4)
    aiacc.trace(model, (x,))
    assert model.cache == {}  # no proxy of the trace left behind
    _check(model, (x,), (torch.randn(2, 4),))


def test_a_crashing_converter_leaves_its_node_opaque_with_a_warning(monkeypatch):
    def broken(imp, *args, **kwargs):
        raise TypeError("unexpected keyword argument")
    monkeypatch.setitem(FUNCTIONS._entries, torch.tanh, broken)

    class M(nn.Module):
        def forward(self, x):
            return torch.tanh(x + 1) * 2
    x = torch.randn(3)
    with pytest.warns(RuntimeWarning, match="converter failed: TypeError"):
        graph = aiacc.trace(M(), (x,))
    assert _opaque(graph) == ["tanh"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = aiacc.optimize(M(), (x,))
    assert torch.allclose(fast(x), M()(x))


class _Roll(nn.Module):
    def forward(self, x):  # Swin's shifted windows
        return torch.roll(x, shifts=(-2, 3), dims=(1, 2)) + x.roll(1, 3)


def test_roll():
    _check(_Roll(), (torch.randn(2, 5, 6, 3),), (torch.randn(2, 5, 6, 3),))


class _FloatCumsum(nn.Module):
    def forward(self, x):  # EdgeNeXt's positional encoding: running sums of a mask along H and W
        return torch.cumsum(x, dim=1) + x.cumsum(-1, dtype=torch.float64).float()


def test_float_cumsum_is_the_irs_cumsum():
    x = torch.randn(2, 7, 5)
    graph = aiacc.trace(_FloatCumsum(), (x,))
    assert [n.op for n in graph].count("CumSum") == 2
    _check(_FloatCumsum(), (x,), (torch.randn(2, 7, 5),))


EINSUMS = [("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("bhid,bhjd->bhij", [(2, 3, 4, 5), (2, 3, 6, 5)]),
           ("ij->ji", [(3, 4)]), ("ijk->", [(2, 3, 4)]), ("bi,bi->b", [(3, 5), (3, 5)]),
           ("i,j->ij", [(3,), (4,)]), ("ij,jk", [(3, 4), (4, 5)]), ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
           ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]), ("bnhwk,nhk->bnhw", [(2, 3, 4, 4, 5), (3, 4, 5)]),
           ("bxyd,zd->bxyz", [(2, 3, 3, 4), (6, 4)])]


class _Einsum(nn.Module):
    def __init__(self, eq):
        super().__init__()
        self.eq = eq

    def forward(self, *xs):
        return torch.einsum(self.eq, *xs) * 2


@pytest.mark.parametrize("eq,shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
def test_static_einsum_becomes_matmuls(eq, shapes):
    def feed():
        return tuple(torch.randn(*s) for s in shapes)
    graph = aiacc.trace(_Einsum(eq), feed())
    assert "MatMul" in [n.op for n in graph] or len(shapes) == 1
    _check(_Einsum(eq), feed(), feed())


def test_einsum_with_a_diagonal_stays_opaque_and_correct():
    x = torch.randn(4, 4)
    assert _opaque(aiacc.trace(_Einsum("ii->i"), (x,))) != []
    fast = aiacc.optimize(_Einsum("ii->i"), (x,))
    y = torch.randn(4, 4)
    assert torch.allclose(fast(y), _Einsum("ii->i")(y))


def _stochastic_depth_net(mode):
    from tests.reach._models import torchvision

    ops = torchvision().ops

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 1)
            self.sd = ops.StochasticDepth(0.4, mode)

        def forward(self, x):
            return x + self.sd(self.conv(x))
    return Net()


@pytest.mark.parametrize("mode", ["row", "batch"])
def test_stochastic_depth_in_training_draws_torchs_mask(mode):
    """In train mode stochastic_depth is Dropout on a ones mask (one draw per sample or per batch) times x:
    with the same torch seed the exported model draws exactly torchvision's mask; in eval it is gone."""
    model = _stochastic_depth_net(mode).train()
    x = torch.randn(8, 3, 4, 4)
    graph = aiacc.trace(model, (x,), mode="train")
    assert _opaque(graph) == [] and "Dropout" in [n.op for n in graph]
    exported = aiacc.export(graph, "torch")
    fresh = torch.randn(8, 3, 4, 4)
    outs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        expected = model(fresh)
        torch.manual_seed(seed)
        outs.append(exported(fresh))
        assert torch.equal(outs[-1], expected)
    assert not torch.equal(outs[0], outs[1]) or mode == "batch"  # a fresh mask on every call
    model.eval()
    graph = aiacc.trace(model, (x,))
    assert _opaque(graph) == [] and "Dropout" not in [n.op for n in graph]
    _check(model, (x,), (fresh,))


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_kernel_follows_onnx(exclusive, reverse):
    from aiacc.core.ops.reduce import cumsum

    x = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    y = cumsum(x, np.int64(1), exclusive=exclusive, reverse=reverse)
    t = torch.from_numpy(x).flip(1) if reverse else torch.from_numpy(x)
    want = t.cumsum(1) - (t if exclusive else 0)
    want = want.flip(1) if reverse else want
    assert np.array_equal(y, want.numpy())
