"""mode="train" on a model whose loss uses a tensor that is not the model's state: a plain tensor attribute
(`self.w = torch.tensor(...)`, handed to a `CrossEntropyLoss(weight=self.w)` the forward creates) or a
tensor the forward makes (fx lifts it as `_tensor_constant0`). torch.fx's GraphModule registers both as
buffers of its own; aiacc reads them as constants of the graph instead of looking them up as state of the
model (which failed: "the model has no parameter or buffer ..."). The optimized module's loss and
gradients equal the original's within 1e-5."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import aiacc
from tests.reach import _models as M
from tests.reach.test_reach import needs_hf

G = torch.Generator().manual_seed(0)


class _AttrWeight(nn.Module):
    """Class weights as a plain attribute, the loss module made in the forward (transformers' style)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 5)
        self.w = torch.rand(5, generator=G) + 0.5

    def forward(self, x, t):
        return nn.CrossEntropyLoss(weight=self.w)(self.fc(x), t)


class _MadeWeight(nn.Module):
    """Class weights the forward makes from a literal: fx lifts them as `_tensor_constant0`."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 5)

    def forward(self, x, t):
        w = torch.tensor([1.0, 2.0, 0.5, 3.0, 1.5])
        return F.cross_entropy(self.fc(x), t, weight=w, label_smoothing=0.1)


class _Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 5)
        self.scale = torch.full((5,), 0.7)  # a plain attribute of a submodule: fx names it `head.scale`

    def forward(self, x):
        return self.fc(x) * self.scale


class _SubmoduleAttr(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = _Head()
        self.register_buffer("w", torch.rand(5, generator=G) + 0.5)  # real state: stays a buffer

    def forward(self, x, t):
        return nn.CrossEntropyLoss(weight=self.w)(self.head(x), t)


def _check_train(model, x, fresh, opaque_ops=()):
    """Traced with no opaque node (or exactly `opaque_ops`) and no state the model lacks; the optimized
    module's (and aiacc's own export's) loss and parameter gradients equal the original's within 1e-5 on
    `fresh`."""
    call = (lambda m, a: m(**a)) if isinstance(x, dict) else (lambda m, a: m(*a))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, x, mode="train")
        opt = aiacc.optimize(model, x, mode="train")
    opaque = [n.op for n in graph if n.is_opaque]
    assert opaque == list(opaque_ops), f"opaque nodes {opaque}: {graph.meta.get('torch.opaque_reasons')}"
    state = {q for q, _, _ in graph.meta["torch.state"].values()}
    assert state <= {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    ref = call(model, fresh)
    ref.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    # what optimize chose (train choice may pick torch.compile: its names start `_orig_mod.`) and aiacc's own
    # module from the graph
    for got_model in (opt, aiacc.export(graph, "torch", original=model)):
        got = call(got_model, fresh)
        got.backward()
        got_grads = {n.removeprefix("_orig_mod."): p.grad for n, p in got_model.named_parameters()}
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        assert set(got_grads) == set(ref_grads)
        for n, g in ref_grads.items():
            torch.testing.assert_close(got_grads[n], g, rtol=1e-5, atol=1e-5, msg=lambda m: f"{n}: {m}")


@pytest.mark.parametrize("make", [_AttrWeight, _MadeWeight, _SubmoduleAttr], ids=lambda c: c.__name__)
def test_train_loss_with_constant_tensor(make):
    torch.manual_seed(0)
    model = make()
    x, t = torch.randn(6, 8, generator=G), torch.randint(0, 5, (6,), generator=G)
    # a fresh input: the constants are the same on every call, unlike the inputs
    fresh = (torch.randn(6, 8, generator=G), torch.randint(0, 5, (6,), generator=G))
    _check_train(model, (x, t), fresh)


class _WeightedHead(nn.Module):
    """A transformers classifier with a class-weighted loss made in the forward, weights a plain attribute."""

    def __init__(self, model, weight):
        super().__init__()
        self.model, self.weight = model, weight

    def forward(self, input_ids, attention_mask, labels):
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        return nn.CrossEntropyLoss(weight=self.weight)(logits.view(-1, logits.shape[-1]), labels.view(-1))


@needs_hf
def test_train_transformers_head_with_weighted_loss():
    model, x, fresh = M.hf_with_labels("seq_cls")
    for m in model.modules():  # no dropout: both sides' draws would differ
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    # all IR, loss included: the word embedding (padding_idx) is aiacc::Embedding in train mode
    _check_train(_WeightedHead(model, torch.tensor([0.5, 2.0, 1.0])).train(), x, fresh)
