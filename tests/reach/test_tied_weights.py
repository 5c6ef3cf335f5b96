"""Tied weights (one Parameter under two names: a language model's output projection is its input embedding,
as in transformers' BertForMaskedLM with tie_word_embeddings): traced as one model state, so in train mode
both uses read one graph input and its gradient is the sum of both uses'; the optimized module holds the one
Parameter under every name the original has (the same state_dict keys, parameters() lists it once), so an
optimizer step moves both uses, training equals the original's within test_train's tolerance, and inference
and torch.save / torch.load keep the tie."""
from __future__ import annotations

import io
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import aiacc
from tests.plugins.torch.test_train import assert_same
from tests.reach import _models as M
from tests.reach.test_reach import needs_hf


class TinyLM(nn.Module):
    """An embedding, a hidden layer and a decoder whose weight IS the embedding's (tied); the decoder's bias
    is tied too (a Parameter also held by the model as `bias`, as BERT's MLM head holds its decoder bias)."""

    def __init__(self, vocab=11, dim=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.hidden = nn.Linear(dim, dim)
        self.decoder = nn.Linear(dim, vocab)
        self.decoder.weight = self.emb.weight
        self.bias = nn.Parameter(torch.randn(vocab) * 0.1)
        self.decoder.bias = self.bias

    def forward(self, ids):
        return self.decoder(torch.tanh(self.hidden(self.emb(ids))))


def _ids(seed=1, vocab=11):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (3, 5), generator=g)


def _tiny(seed=0):
    torch.manual_seed(seed)
    return TinyLM().train()


def _lm_loss(logits, ids):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1))


def _optimize(model, x, mode):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return aiacc.optimize(model, x, mode=mode, framework_compile=False)


def _train(model, steps, call, loss):
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        loss(call(model)).backward()
        opt.step()


def _state(model, keys=None):
    return {k: v.detach().clone() for k, v in model.state_dict().items() if keys is None or k in keys}


def _assert_tied_like(fast, model):
    """fast holds each of the original's tied Parameters once, under all of the original's names."""
    assert set(model.state_dict()) <= set(fast.state_dict())  # beside them: aiacc's constants (buffers)
    ref_names, got_names = {}, {}
    for name, p in model.named_parameters(remove_duplicate=False):
        ref_names.setdefault(id(p), []).append(name)
    for name, p in fast.named_parameters(remove_duplicate=False):
        got_names.setdefault(id(p), []).append(name)
    assert sorted(map(sorted, ref_names.values())) == sorted(map(sorted, got_names.values()))


def test_trace_reads_one_state_value_for_the_tied_weight():
    model = _tiny()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, (_ids(),), mode="train")
    assert [n.op for n in graph if n.is_opaque] == []
    qualnames = sorted(q for q, _, _ in graph.meta["torch.state"].values())
    assert qualnames == ["bias", "emb.weight", "hidden.bias", "hidden.weight"]  # decoder.* are the same tensors
    assert graph.meta["torch.state_aliases"] == {"emb.weight": ["decoder.weight"], "bias": ["decoder.bias"]}


def test_train_steps_match_and_both_uses_see_one_updated_tensor():
    ids = _ids()
    call, loss = (lambda m: m(ids)), (lambda y: _lm_loss(y, ids))
    ref = _tiny()
    fast = _optimize(_tiny(), (ids,), "train")
    assert fast.aiacc_train_path == "aiacc graph"
    _assert_tied_like(fast, ref)
    assert fast.decoder.weight is fast.emb.weight and fast.decoder.bias is fast.bias
    # one backward: the tied gradient is the sum over both uses (the embedding's rows and the decoder's)
    loss(call(ref)).backward()
    loss(call(fast)).backward()
    torch.testing.assert_close(fast.emb.weight.grad, ref.emb.weight.grad, rtol=1e-5, atol=1e-5)
    untied = _tiny()
    untied.decoder.weight = nn.Parameter(untied.emb.weight.detach().clone())
    loss(call(untied)).backward()  # the same model untied: each use's own gradient
    torch.testing.assert_close(untied.emb.weight.grad + untied.decoder.weight.grad, ref.emb.weight.grad,
                               rtol=1e-5, atol=1e-6)
    assert (untied.decoder.weight.grad - ref.emb.weight.grad).abs().max() > 1e-3  # both uses contribute
    # three optimizer steps end with the same parameters as the original trained alike
    ref, fast = _tiny(), _optimize(_tiny(), (ids,), "train")
    _train(ref, 3, call, loss)
    _train(fast, 3, call, loss)
    assert_same(_state(ref), _state(fast, _state(ref)))
    assert fast.decoder.weight is fast.emb.weight
    torch.testing.assert_close(fast(ids), ref(ids), rtol=1e-5, atol=1e-5)


def test_inference_and_save_load_keep_the_tie():
    ids = _ids()
    model = _tiny().eval()
    fast = _optimize(model, (ids,), "inference")
    other = _ids(seed=7)
    with torch.no_grad():
        torch.testing.assert_close(fast(other), model(other), rtol=1e-5, atol=1e-5)
    for mode in ("inference", "train"):
        m = _tiny().train(mode == "train")
        opt = _optimize(m, (ids,), mode)
        buf = io.BytesIO()
        torch.save(opt, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        with torch.no_grad():
            torch.testing.assert_close(loaded(other), m(other), rtol=1e-5, atol=1e-5)
        if mode == "train":
            assert loaded.decoder.weight is loaded.emb.weight  # still one Parameter after the round trip
            _assert_tied_like(loaded, m)
            # a loaded module trains like the original
            call, loss = (lambda mm: mm(ids)), (lambda y: _lm_loss(y, ids))
            _train(loaded, 2, call, loss)
            _train(m, 2, call, loss)
            assert_same(_state(m), _state(loaded, _state(m)))


def _mlm(train: bool):
    tr = M.transformers()
    config = tr.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           vocab_size=100, max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)  # tie_word_embeddings: the default, True
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = tr.BertForMaskedLM(config).train(train)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    return model


@needs_hf
def test_bert_for_masked_lm_tied_trains_like_the_original():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 100, (2, 16), generator=g)
    x = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    labels = torch.randint(0, 100, (2, 16), generator=g)
    call, loss = (lambda m: m(**x)), (lambda out: _lm_loss(out.logits, labels))
    ref = _mlm(True)
    fast = _optimize(_mlm(True), x, "train")
    assert fast.aiacc_train_path == "aiacc graph"
    _assert_tied_like(fast, ref)
    _train(ref, 2, call, loss)
    _train(fast, 2, call, loss)
    assert_same(_state(ref), _state(fast, _state(ref)))


@needs_hf
def test_bert_for_masked_lm_tied_inference():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 100, (2, 16), generator=g)
    model = _mlm(False)
    fast = _optimize(model, {"input_ids": ids}, "inference")
    other = torch.randint(1, 100, (2, 16), generator=g)
    with torch.no_grad():
        torch.testing.assert_close(fast(input_ids=other).logits, model(input_ids=other).logits,
                                   rtol=1e-4, atol=1e-4)
    buf = io.BytesIO()
    torch.save(fast, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=other).logits, model(input_ids=other).logits,
                                   rtol=1e-4, atol=1e-4)


class _OpaqueDecoder(nn.Module):
    """A decoder holding the tied weight, kept opaque (a loop whose trip count is read from the data)."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, h):
        for _ in range(int((h > 5).sum())):  # never taken (tanh's range); no trace holds the count
            h = h + 1
        return h @ self.weight.t()


class _OpaqueTied(nn.Module):
    """The tied weight read by the translated graph (the embedding) and by two opaque calls; with
    `graph_reads=False` only by the two opaque calls (no model state of the graph holds it)."""

    def __init__(self, graph_reads=True):
        super().__init__()
        self.graph_reads = graph_reads
        self.emb = nn.Embedding(11, 11)
        self.dec = _OpaqueDecoder(self.emb.weight)
        self.dec2 = _OpaqueDecoder(self.emb.weight)

    def forward(self, ids):
        h = torch.tanh(self.emb(ids)) if self.graph_reads else F.one_hot(ids, 11).float()
        return self.dec(h) + self.dec2(torch.tanh(self.dec(h * 0.5)))


@pytest.mark.parametrize("graph_reads", [True, False])
def test_opaque_calls_holding_the_tied_weight_train_the_same_tensor(graph_reads):
    ids = _ids()
    call, loss = (lambda m: m(ids)), (lambda y: _lm_loss(y, ids))
    torch.manual_seed(0)
    ref = _OpaqueTied(graph_reads).train()
    torch.manual_seed(0)
    model = _OpaqueTied(graph_reads).train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, (ids,), mode="train")
    assert sum(n.is_opaque for n in graph) == 3  # dec twice, dec2
    fast = _optimize(model, (ids,), "train")
    assert len(list(fast.parameters())) == len(list(ref.parameters())) == 1  # the opaque copies share it
    _train(ref, 3, call, loss)
    _train(fast, 3, call, loss)
    (p,), (q,) = list(ref.parameters()), list(fast.parameters())
    assert float((p - q).abs().max()) <= 1e-5 * max(1.0, float(p.abs().max()))
    with torch.no_grad():
        torch.testing.assert_close(fast(ids), ref(ids), rtol=1e-5, atol=1e-5)
