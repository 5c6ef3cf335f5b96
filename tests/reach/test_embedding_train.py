"""An embedding with padding_idx in train mode (BERT's word embedding): the row padding_idx gets no gradient,
so the importer writes aiacc::Embedding (the lookup, Gather's forward, with that row's gradient dropped)
instead of leaving the table opaque; inference keeps the plain Gather. The optimized module's loss and
gradients equal the original's, the padding row's gradient exactly zero; exporters without the op get its
forward (a Gather)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import aiacc
from aiacc.core.ir import Graph
from aiacc.core.onnx import to_onnx
from aiacc.core.ops.fused import decompose_all
from aiacc.core.runtime.executor import run
from aiacc.core.stats import graph_stats
from aiacc.core.translate import decompose_fused
from aiacc.errors import ShapeError
from tests.reach import _models as M
from tests.reach.test_reach import needs_hf


class _Tables(nn.Module):
    """nn.Embedding(padding_idx=0) and F.embedding with a negative padding_idx (torch: + num_embeddings),
    into a linear layer and a loss."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4, padding_idx=0)
        self.table = nn.Parameter(torch.randn(7, 4))
        self.fc = nn.Linear(4, 3)

    def forward(self, ids):
        y = self.emb(ids) + F.embedding(ids % 7, self.table, padding_idx=-1)
        return self.fc(y).square().mean()


IDS = torch.tensor([[0, 3, 5, 0], [6, 2, 9, 8]])  # 0: emb's padding row; 6 (6 % 7): the table's


def _trace_and_optimize(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, x, mode="train")
        fast = aiacc.optimize(model, x, mode="train", framework_compile=False)
    return graph, fast


def _assert_same_training_step(model, fast, x, loss, padding_rows):
    """Loss and every parameter gradient of `fast` equal the original's within 1e-5; the padding rows'
    gradients (parameter name -> row) exactly zero."""
    call = (lambda m: m(**x)) if isinstance(x, dict) else (lambda m: m(*x))
    model.zero_grad()
    ref = loss(call(model))
    ref.backward()
    got = loss(call(fast))
    got.backward()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # every name of a shared parameter: fast may hold it under either (BERT's MLM decoder bias)
    ref_params, got_params = dict(model.named_parameters(remove_duplicate=False)), dict(fast.named_parameters())
    assert set(got_params) <= set(ref_params)
    covered = {id(ref_params[n]) for n in got_params}
    for name, p in model.named_parameters():
        assert id(p) in covered or p.grad is None, f"{name} is missing from the optimized module"
    for name, p in got_params.items():
        want = ref_params[name].grad
        if want is None:  # not on the loss's path (BertModel's pooler here)
            assert p.grad is None, name
            continue
        torch.testing.assert_close(p.grad, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")
    for name, row in padding_rows.items():
        assert ref_params[name].grad[row].abs().sum() == 0  # what the test is about: torch's own semantics
        assert torch.equal(got_params[name].grad[row], torch.zeros_like(got_params[name].grad[row])), name
        assert got_params[name].grad.abs().sum() > 0  # the other rows do get gradients


def test_embedding_padding_idx_trains_whole():
    torch.manual_seed(0)
    model = _Tables().train()
    graph, fast = _trace_and_optimize(model, (IDS,))
    assert [n.op for n in graph if n.is_opaque] == [], graph.meta.get("torch.opaque_reasons")
    lookups = [n for n in graph if n.qualified_op == "aiacc::Embedding"]
    assert sorted(n.attrs["padding_idx"] for n in lookups) == [0, 6]  # -1 of 7 rows is row 6
    assert "Gather" not in [n.op for n in graph]
    _assert_same_training_step(model, fast, (IDS,), lambda y: y, {"emb.weight": 0, "table": 6})


def test_inference_keeps_the_plain_gather():
    torch.manual_seed(0)
    model = _Tables().eval()
    graph = aiacc.trace(model, (IDS,))
    assert [n.op for n in graph].count("Gather") == 2 and not graph.find_nodes("Embedding", "aiacc")
    # a module in eval() inside a model traced in train mode is inference too
    outer = nn.Sequential(_Tables()).train()
    outer[0].emb.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(outer, (IDS,), mode="train")
    assert [n.qualified_op for n in graph].count("aiacc::Embedding") == 1  # F.embedding follows the mode
    assert [n.op for n in graph].count("Gather") == 1


def test_embedding_op_forward_decomposition_and_checks(tmp_path):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(_Tables().train(), (IDS,), mode="train")
    feeds = dict(graph.meta["torch.state_arrays"])
    (ids,) = [v for v in graph.inputs if v.name not in feeds]
    feeds[ids.name] = IDS.numpy()
    want = run(graph, feeds)
    # exporters without the op (ONNX, TF, MXNet, Caffe) get its forward: a Gather on axis 0
    plain, count = decompose_fused(graph)
    assert count == 2 and not plain.find_nodes("Embedding", "aiacc")
    assert [n.attrs["axis"] for n in plain if n.op == "Gather"] == [0, 0]
    got = run(plain, feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    copy = graph.copy()
    assert decompose_all(copy) == 2 and not copy.find_nodes("Embedding", "aiacc")
    # FLOPs (a lookup costs none) and the op histogram know it
    stats = graph_stats(graph)
    assert stats.op_histogram.get("aiacc::Embedding") == 2 and not any("emb" in n for n in stats.unknown_flops_nodes)
    model = to_onnx(graph)
    assert [p.op_type for p in model.graph.node].count("Gather") == 2 and {p.domain for p in model.graph.node} == {""}
    page = aiacc.view(graph, output=tmp_path / "view.html").read_text()
    assert "aiacc::Embedding" in page

    g = Graph("lookup")
    w = g.add_input("w", "float32", (5, 3))
    idx = g.add_input("idx", "int64", (2, 4))
    node = g.add_node("Embedding", [w, idx], {"padding_idx": 4}, domain="aiacc", name="emb")
    assert node.output.shape == (2, 4, 3) and node.output.dtype == "float32"
    with pytest.raises(ShapeError, match=r"node bad_row \(aiacc::Embedding\): padding_idx 5 is not a row"):
        g.add_node("Embedding", [w, idx], {"padding_idx": 5}, domain="aiacc", name="bad_row")
    flat = g.add_input("flat", "float32", (15,))
    with pytest.raises(ShapeError, match=r"node bad_table \(aiacc::Embedding\): the table must be a matrix"):
        g.add_node("Embedding", [flat, idx], {"padding_idx": 0}, domain="aiacc", name="bad_table")
    real = g.add_input("real", "float32", (2, 4))
    with pytest.raises(ShapeError, match=r"node bad_idx \(aiacc::Embedding\): the indices must be integers"):
        g.add_node("Embedding", [w, real], {"padding_idx": 0}, domain="aiacc", name="bad_idx")


def _bert(cls_name):
    tr = M.transformers()
    # dropout off: both sides would draw different masks; untied output weights: a train-mode trace of a tied
    # MLM head's decoder weight is a separate state value (not this test's subject)
    config = tr.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           vocab_size=100, max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, tie_word_embeddings=False)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(tr, cls_name)(config).train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 100, (2, 16), generator=g)
    ids[1, -3:] = config.pad_token_id  # a padded row: the padding token is looked up
    return model, {"input_ids": ids, "attention_mask": (ids != config.pad_token_id).long()}


@needs_hf
@pytest.mark.parametrize("cls_name, prefix, output", [("BertModel", "", "last_hidden_state"),
                                                       ("BertForMaskedLM", "bert.", "logits")])
def test_bert_trains_whole(cls_name, prefix, output):
    model, x = _bert(cls_name)
    graph, fast = _trace_and_optimize(model, x)
    assert [n.op for n in graph if n.is_opaque] == [], graph.meta.get("torch.opaque_reasons")
    assert len(graph.find_nodes("Embedding", "aiacc")) == 1  # the word embedding (padding_idx 0)
    _assert_same_training_step(model, fast, x, lambda out: getattr(out, output).square().mean(),
                               {f"{prefix}embeddings.word_embeddings.weight": 0})
