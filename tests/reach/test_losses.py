"""Losses computed inside a forward (transformers' heads called with labels=): cross entropy with ignored
targets, label smoothing, class weights, probability targets and class-dim layouts; NLL, MSE, L1, smooth L1,
Huber, BCE and BCE-with-logits; as functions, as installed modules and as modules the forward creates. Each
becomes IR under both frontends (torch.fx and torch.export) and equals torch's value within 1e-5 on a fresh
input."""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import aiacc
from aiacc.errors import ShapeError
from tests.reach import _models as M
from tests.reach.test_reach import check_whole_and_verified, needs_hf

G = torch.Generator().manual_seed(0)


def _targets(shape, classes, ignored=True):
    t = torch.randint(0, classes, shape, generator=G)
    if ignored:
        t.view(-1)[::3] = -100  # every third target ignored, as transformers' padded labels
    return t


class _Fn(nn.Module):
    def __init__(self, fn, **kw):
        super().__init__()
        self.fn, self.kw = fn, kw

    def forward(self, x, t):
        return self.fn(x, t, **self.kw)


class _Created(nn.Module):
    """The loss module made in the forward, as transformers' heads do (`loss_fct = CrossEntropyLoss()`)."""

    def __init__(self, cls, **kw):
        super().__init__()
        self.cls, self.kw = cls, kw

    def forward(self, x, t):
        if x.dim() == t.dim() + 1:  # class scores per token: flattened to rows, as transformers' heads do
            x, t = x.view(-1, x.shape[-1]), t.view(-1)
        return self.cls(**self.kw)(x, t)


def _cases():
    w = torch.rand(5, generator=G) + 0.5
    logits2, logits4 = (lambda: torch.randn(6, 5, generator=G)), (lambda: torch.randn(2, 5, 3, 4, generator=G))
    ids2, ids4 = (lambda: _targets((6,), 5)), (lambda: _targets((2, 3, 4), 5))
    probs = lambda: torch.softmax(torch.randn(6, 5, generator=G), -1)  # noqa: E731
    real = lambda: torch.randn(4, 3, generator=G)  # noqa: E731
    unit = lambda: torch.rand(4, 3, generator=G)  # noqa: E731
    return {
        "ce_mean_ignored": (_Fn(F.cross_entropy), logits2, ids2),
        "ce_smoothing": (_Fn(F.cross_entropy, label_smoothing=0.1), logits2, ids2),
        "ce_weight_smoothing": (_Fn(F.cross_entropy, weight=w, label_smoothing=0.2), logits2, ids2),
        "ce_class_dim_1_none": (_Fn(F.cross_entropy, reduction="none"), logits4, ids4),
        "ce_class_dim_1_sum_weight": (_Fn(F.cross_entropy, reduction="sum", weight=w), logits4, ids4),
        "ce_ignore_index_0": (_Fn(F.cross_entropy, ignore_index=0), logits2, lambda: _targets((6,), 5, False)),
        "ce_probabilities": (_Fn(F.cross_entropy, label_smoothing=0.1), logits2, probs),
        "ce_unbatched": (_Fn(F.cross_entropy), lambda: torch.randn(5, generator=G),
                         lambda: torch.tensor(2)),
        "ce_module_installed": (nn.CrossEntropyLoss(weight=w, label_smoothing=0.05), logits2, ids2),
        "ce_module_created": (_Created(nn.CrossEntropyLoss), lambda: torch.randn(2, 3, 5, generator=G),
                              lambda: _targets((2, 3), 5)),
        "nll_sum": (_Fn(lambda x, t, **k: F.nll_loss(x.log_softmax(1), t, **k), reduction="sum"), logits4, ids4),
        "mse": (_Fn(F.mse_loss), real, real),
        "mse_created": (_Created(nn.MSELoss), real, real),
        "l1_none": (_Fn(F.l1_loss, reduction="none"), real, real),
        "mse_weighted": (_Fn(F.mse_loss, weight=torch.rand(4, 3, generator=G)), real, real),
        "huber_weighted": (_Fn(F.huber_loss, weight=torch.rand(4, 3, generator=G)), real, real),
        "smooth_l1": (_Fn(F.smooth_l1_loss, beta=0.5), real, real),
        "huber_sum": (nn.HuberLoss(reduction="sum", delta=0.7), real, real),
        "bce_logits": (_Fn(F.binary_cross_entropy_with_logits), lambda: 4 * torch.randn(4, 3, generator=G), unit),
        "bce_logits_pos_weight": (nn.BCEWithLogitsLoss(pos_weight=torch.tensor([1.0, 2.0, 0.5])), real, unit),
        "bce": (_Fn(lambda p, t, **k: F.binary_cross_entropy(p.sigmoid(), t, **k)), real, unit),
    }


CASES = _cases()


def _check_whole_and_equal(case, frontend, rtol, atol, graph_check=None):
    """Trace `case` (model, input maker, target maker) through `frontend`: no opaque node (and `graph_check(model,
    graph)` if given); then the optimized model equals torch on a fresh input within rtol/atol."""
    model, x, t = case
    model.eval()
    example, fresh = (x(), t()), (x(), t())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, example, frontend=frontend)
        assert [n.op for n in graph if n.is_opaque] == [], graph.meta.get("torch.opaque_reasons")
        if graph_check is not None:
            graph_check(model, graph)
        fast = aiacc.optimize(model, example, frontend=frontend)
    with torch.no_grad():
        expected, actual = model(*fresh), fast(*fresh)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("frontend", ["fx", "export"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_becomes_ir_and_equals_torch(name, frontend):
    _check_whole_and_equal(CASES[name], frontend, rtol=1e-5, atol=1e-6)


def _weighted_cases():
    """Every loss taking weight=, with each reduction. torch 2.13's own rules: l1 / mse "mean" is
    sum(weight * err) / sum(weight), huber's, bce's and bce-with-logits' the mean of weight * err, cross entropy /
    NLL divide by the summed class weight of the targets. Weights in [0.1, 1.1): a plain mean would differ."""
    real = lambda: torch.randn(4, 3, generator=G)  # noqa: E731
    unit = lambda: torch.rand(4, 3, generator=G)  # noqa: E731
    elementwise = torch.rand(4, 3, generator=G) + 0.1
    classes = torch.rand(5, generator=G) + 0.1
    losses = {
        "l1": (F.l1_loss, elementwise, real, real),
        "mse": (F.mse_loss, elementwise, real, real),
        "huber": (lambda x, t, **k: F.huber_loss(x, t, delta=0.5, **k), elementwise, real, real),
        "bce": (lambda p, t, **k: F.binary_cross_entropy(p.sigmoid(), t, **k), elementwise, real, unit),
        "bce_logits": (F.binary_cross_entropy_with_logits, elementwise, real, unit),
        "ce": (F.cross_entropy, classes, lambda: torch.randn(6, 5, generator=G), lambda: _targets((6,), 5)),
        "nll": (lambda x, t, **k: F.nll_loss(x.log_softmax(1), t, **k), classes,
                lambda: torch.randn(2, 5, 3, generator=G), lambda: _targets((2, 3), 5)),
    }
    return {f"{name}_{reduction}": (_Fn(fn, weight=w, reduction=reduction), x, t)
            for name, (fn, w, x, t) in losses.items() for reduction in ("none", "sum", "mean")}


WEIGHTED = _weighted_cases()


@pytest.mark.parametrize("frontend", ["fx", "export"])
@pytest.mark.parametrize("name", sorted(WEIGHTED))
def test_weighted_loss_equals_torch(name, frontend):
    def weight_reached_the_ir(model, graph):  # fx once recorded F.l1_loss(weight=w) without it
        w = model.kw["weight"].numpy()
        assert any(v.const is not None and v.const.shape == w.shape and np.array_equal(v.const, w)
                   for n in graph for v in n.inputs if v is not None)
    _check_whole_and_equal(WEIGHTED[name], frontend, rtol=1e-6, atol=1e-6, graph_check=weight_reached_the_ir)


@pytest.mark.parametrize("fn", [F.l1_loss, F.mse_loss, F.huber_loss], ids=lambda f: f.__name__)
def test_a_weight_of_another_size_than_the_input_is_an_error_naming_the_node(fn):
    # torch raises ValueError("Weights and input must have the same size.") rather than broadcasting
    model = _Fn(fn, weight=torch.rand(3, generator=G)).eval()
    x = (torch.randn(4, 3, generator=G), torch.randn(4, 3, generator=G))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ShapeError, match=fr"op {fn.__name__} .*Weights and input must have the same"):
            aiacc.trace(model, x)


def test_every_target_ignored_is_nan_as_in_torch():
    model = _Fn(F.cross_entropy).eval()
    x, t = torch.randn(3, 4, generator=G), torch.full((3,), -100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = aiacc.optimize(model, (x, _targets((3,), 4, False)))
    assert torch.isnan(model(x, t)) and torch.isnan(fast(x, t))


def test_the_legacy_size_average_and_reduce_flags_choose_the_reduction():
    class Legacy(nn.Module):
        def forward(self, x, t, ids):
            return (F.mse_loss(x, t, size_average=False), F.l1_loss(x, t, reduce=False),
                    F.cross_entropy(x, ids, size_average=False))

    def inputs():
        return torch.randn(4, 3, generator=G), torch.randn(4, 3, generator=G), _targets((4,), 3)
    model, example, fresh = Legacy().eval(), inputs(), inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, example, frontend="fx")
        fast = aiacc.optimize(model, example, frontend="fx")
        expected = model(*fresh)
    assert [n.op for n in graph if n.is_opaque] == []
    assert [tuple(e.shape) for e in expected] == [(), (4, 3), ()]  # sum, none, sum
    for e, a in zip(expected, fast(*fresh)):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


@needs_hf
@pytest.mark.parametrize("head", sorted(M._HF_HEADS))
def test_transformers_heads_with_labels_are_whole_and_verified(head):
    check_whole_and_verified(*M.hf_with_labels(head))


@needs_hf
@pytest.mark.parametrize("how", ["keyword", "config"])
def test_return_dict_false_returns_the_same_tuple(how):
    # a tuple stays a tuple with the original's length: the loss first, None fields skipped (no attentions),
    # the hidden states a nested tuple
    model, x, fresh = M.hf_with_labels("seq_cls")
    extra = {"output_hidden_states": True}
    if how == "keyword":
        extra["return_dict"] = False
    else:
        model.config.return_dict = False
    x, fresh = {**x, **extra}, {**fresh, **extra}
    with torch.no_grad():
        expected = model(**fresh)
    assert isinstance(expected, tuple) and len(expected) == 3  # (loss, logits, hidden_states)
    check_whole_and_verified(model, x, fresh)


# -- margin losses: F.multi_margin_loss and F.multilabel_soft_margin_loss, weighted, every reduction ---------------
def _margin_cases():
    """multi_margin_loss (p 1 and 2, a margin, class weights w[y]: "mean" is the plain mean over the rows) and
    multilabel_soft_margin_loss (weights broadcast over the classes, summed over the classes / C), with each
    reduction; their module forms; a 1-D input (one row; a 0-d or [1] target gives a loss of its shape)."""
    scores = lambda: torch.randn(6, 5, generator=G)  # noqa: E731
    labels = lambda: torch.randint(0, 5, (6,), generator=G)  # noqa: E731
    multi = lambda: (torch.rand(6, 5, generator=G) > 0.5).float()  # noqa: E731
    classes = torch.rand(5, generator=G) + 0.1
    cases = {}
    for reduction in ("none", "sum", "mean"):
        for p in (1, 2):
            cases[f"multi_margin_p{p}_{reduction}"] = (
                _Fn(F.multi_margin_loss, p=p, margin=0.7, weight=classes, reduction=reduction), scores, labels)
        cases[f"multilabel_soft_margin_{reduction}"] = (
            _Fn(F.multilabel_soft_margin_loss, weight=classes, reduction=reduction), scores, multi)
        cases[f"multi_margin_1d_{reduction}"] = (
            _Fn(F.multi_margin_loss, weight=classes, reduction=reduction), lambda: 0.3 * torch.randn(5, generator=G),
            lambda: torch.randint(0, 5, (), generator=G))
    cases["multi_margin_unweighted"] = (_Fn(F.multi_margin_loss), scores, labels)
    cases["multi_margin_1d_target_1"] = (_Fn(F.multi_margin_loss, reduction="none"),
                                         lambda: 0.3 * torch.randn(5, generator=G),
                                         lambda: torch.randint(0, 5, (1,), generator=G))
    cases["multilabel_soft_margin_unweighted_3d"] = (_Fn(F.multilabel_soft_margin_loss),
                                                     lambda: torch.randn(2, 3, 5, generator=G),
                                                     lambda: (torch.rand(2, 3, 5, generator=G) > 0.5).float())
    cases["multi_margin_module"] = (nn.MultiMarginLoss(p=2, margin=1.3, weight=classes, reduction="sum"),
                                    scores, labels)
    cases["multilabel_soft_margin_module"] = (nn.MultiLabelSoftMarginLoss(weight=classes), scores, multi)
    return cases


MARGIN = _margin_cases()


@pytest.mark.parametrize("frontend", ["fx", "export"])
@pytest.mark.parametrize("name", sorted(MARGIN))
def test_margin_loss_becomes_ir_and_equals_torch(name, frontend):
    _check_whole_and_equal(MARGIN[name], frontend, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(MARGIN))
def test_margin_loss_gradients_equal_torch(name):
    model, x, t = MARGIN[name]
    model.train()
    example, fresh = (x(), t()), (x(), t())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, example, mode="train")
        assert [n.op for n in graph if n.is_opaque] == [], graph.meta.get("torch.opaque_reasons")
        fast = aiacc.optimize(model, example, mode="train", framework_compile=False)
    grads = []
    for m in (model, fast):
        inp = fresh[0].clone().requires_grad_()
        out = m(inp, fresh[1])
        # a fixed random cotangent, so "none" outputs weigh their elements differently
        out.backward(torch.rand(out.shape, generator=torch.Generator().manual_seed(3)))
        grads.append((out.detach(), inp.grad))
    (ref_out, ref_grad), (got_out, got_grad) = grads
    torch.testing.assert_close(got_out, ref_out, rtol=1e-5, atol=1e-5)
    assert float(ref_grad.abs().sum()) > 0  # the loss depends on the input (margins not all satisfied)
    torch.testing.assert_close(got_grad, ref_grad, rtol=1e-5, atol=1e-5)


class _OneHot(nn.Module):
    def forward(self, x, t):
        return F.one_hot(t, 5).to(x.dtype) * x


def _class_index_cases():
    """(model, ignore_index or None): the converters that pick the target's class with a
    one-hot, where a target outside the classes would pick none."""
    return {
        "cross_entropy": (_Fn(F.cross_entropy), -100),
        "cross_entropy_module": (nn.CrossEntropyLoss(ignore_index=2, reduction="sum"), 2),
        "nll_loss": (_Fn(lambda x, t, **kw: F.nll_loss(x.log_softmax(1), t, **kw), reduction="none"), -100),
        "multi_margin_loss": (_Fn(F.multi_margin_loss, margin=0.5), None),
        "one_hot": (_OneHot(), None),
    }


CLASS_INDEX = _class_index_cases()


@pytest.mark.parametrize("frontend", ["fx", "export"])
@pytest.mark.parametrize("name", sorted(CLASS_INDEX))
def test_a_target_outside_the_classes_raises_where_torch_raises(name, frontend):
    """torch raises on a class-index target outside 0..C-1 that is not ignore_index (IndexError 'Target 7 is out
    of bounds.', 'target out of range', 'Class values must be ...'): the optimized model raises a GuardError
    naming the op, never a loss that counts no class for it; targets in range, and ignore_index, still run and
    equal torch's."""
    from aiacc.errors import GuardError

    model, ignore = CLASS_INDEX[name]
    model.eval()
    x = torch.randn(4, 5, generator=G)
    good = torch.tensor([0, 4, 1, 3]) if ignore is None else torch.tensor([0, 4, ignore, 3])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, (x, good), frontend=frontend)
        assert [n.op for n in graph if n.is_opaque] == [], graph.meta.get("torch.opaque_reasons")
        fast = aiacc.optimize(model, (x, good), frontend=frontend)
    fresh = torch.randn(4, 5, generator=G)
    with torch.no_grad():
        np.testing.assert_allclose(fast(fresh, good).numpy(), model(fresh, good).numpy(), rtol=1e-5, atol=1e-6)
    op = name.replace("_module", "")
    for bad in (torch.tensor([0, 5, 1, 3]), torch.tensor([0, -1, 1, 3]), torch.tensor([0, 1, 1, 99])):
        with pytest.raises((IndexError, RuntimeError)):
            model(fresh, bad)
        with pytest.raises(GuardError, match=f"{op} .*a target is (not|neither) in the classes 0..4"):
            fast(fresh, bad)
    if frontend == "fx":  # the check is in the saved module's code too
        buf = io.BytesIO()
        torch.save(fast, buf)
        buf.seek(0)
        with pytest.raises(GuardError, match=op):
            torch.load(buf, weights_only=False)(fresh, torch.tensor([0, 5, 1, 3]))
