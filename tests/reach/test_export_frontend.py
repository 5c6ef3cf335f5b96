"""The torch.export frontend (aiacc/plugins/torch/export_frontend.py) and frontend= choice: models torch.fx
cannot translate whole (a custom autograd Function as BLOOM's GeLU, nn.LSTM, Funnel's shape arithmetic) come
out with 0 opaque nodes through torch.export, optimized and equal to the original on an input aiacc never saw;
"auto" keeps torch.fx's translation where it is whole and says why it switches; ModelOutput / dict return
types, **kwargs forwards, tied weights and buffers, dynamic batch. AIACC_REACH_FULL=1 adds the transformers
sweep (BERT, GPT-2, Llama, T5 encoder, BART, ViT, DeBERTa-v2 through torch.export; ~40 s)."""
from __future__ import annotations

import dataclasses
import os
import warnings

import pytest
import torch
from torch import nn
from torch.utils import _pytree as pytree

import aiacc
from aiacc.errors import AiaccWarning, FallbackError, GuardError, OptionError, UnsupportedError
from tests.reach import _models as M
from tests.reach.test_reach import needs_hf, needs_timm


FULL = os.environ.get("AIACC_REACH_FULL", "") not in ("", "0")


def _call(model, inputs):
    with torch.no_grad():
        return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def assert_equal_outputs(model, fast, fresh, tol=1e-4):
    """Same return type and structure, every tensor within tol of the output's magnitude; the max error."""
    expected, actual = _call(model, fresh), _call(fast, fresh)
    assert type(actual) is type(expected)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    a_leaves, a_spec = pytree.tree_flatten(actual)
    assert a_spec == e_spec
    worst = 0.0
    for i, (p, q) in enumerate(zip(e_leaves, a_leaves)):
        if not isinstance(p, torch.Tensor):
            assert p == q
            continue
        assert p.shape == q.shape, f"output {i}: {tuple(q.shape)} != {tuple(p.shape)}"
        scale = float(p.abs().max()) or 1.0
        err = float((p.double() - q.double()).abs().max()) / scale
        assert err <= tol, f"output {i}: relative max error {err:.3g} > {tol}"
        worst = max(worst, err)
    return worst


def _opaque(graph):
    return [n.op for n in graph if n.is_opaque]


# ------------------------------------------------------------------------------------------ small models
class _CubeGelu(torch.autograd.Function):
    """A custom autograd Function (BLOOM's GeLU is one): torch.fx keeps it as an opaque call."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.sigmoid(1.702 * x)


class _CustomFn(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return _CubeGelu.apply(self.fc(x)) + 1


@dataclasses.dataclass
class _Out:
    logits: torch.Tensor
    hidden: torch.Tensor


pytree.register_dataclass(_Out)


class _Tied(nn.Module):
    """Tied weights (one Parameter used by two layers), a buffer, a **kwargs forward with optional
    arguments, a dataclass return."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 20, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("offset", torch.linspace(0, 1, 8))

    def forward(self, input_ids, attention_mask=None, scale=None, **kwargs):
        h = self.embed(input_ids) + self.offset
        if attention_mask is not None:
            h = h * attention_mask[..., None].to(h.dtype)
        if scale is not None:
            h = h * scale
        return _Out(logits=self.head(h), hidden=h)


class _AtenOps(nn.Module):
    """The ATen ops the issue lists, in one forward: masks from triu/tril and masked_fill, attention with a
    mask, gather, index, cumsum, div with rounding modes, where, arange, expand, einsum, flip."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x, ids):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, 4).permute(2, 0, 3, 1, 4)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k).masked_fill(~causal, -1e4).triu(-1)
        pos = torch.arange(t).expand(b, t)
        g = torch.gather(x, 1, ids[..., None].expand(b, t, 8))
        h = torch.div(pos, 2, rounding_mode="floor") + torch.div(ids, 3, rounding_mode="trunc")
        picked = x[:, ids[0]]
        out = y.transpose(1, 2).reshape(b, t, 8) + g + picked.flip(1) + torch.cumsum(x, dim=1)
        return torch.where(out > 0, out, out * 0.1), scores.softmax(-1), h


class _Lstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(32, 4)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.fc(y)


class _Flat(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return {"out": self.fc(torch.relu(self.conv(x)).view(x.size(0), -1))}


def _seeded(cls):
    torch.manual_seed(0)
    return cls().eval()


def test_auto_uses_export_where_fx_keeps_a_custom_function_opaque():
    model, x, fresh = _seeded(_CustomFn), (torch.randn(3, 8),), (torch.randn(3, 8),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _opaque(aiacc.trace(model, x, frontend="fx")) == ["_CubeGelu.apply"]
    with pytest.warns(AiaccWarning, match="translated with torch.export instead"):
        graph = aiacc.trace(model, x)
    assert graph.meta["torch.frontend"] == "export" and _opaque(graph) == []
    with pytest.warns(AiaccWarning, match="torch.export instead"):
        fast = aiacc.optimize(model, x)
    assert any("torch.export instead" in m for m in fast.aiacc_report.fallbacks)
    assert_equal_outputs(model, fast, fresh)
    # the switch is a choice made for the user: strict=True refuses it, frontend='export' asks for it
    with pytest.raises(FallbackError, match="torch.fx leaves 1 opaque"):
        aiacc.optimize(model, x, strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AiaccWarning)
        fast = aiacc.optimize(model, x, frontend="export", strict=True)
    assert_equal_outputs(model, fast, fresh)


def test_auto_keeps_fx_when_it_is_whole_and_frontend_is_validated():
    model, x = _seeded(_Flat), (torch.randn(2, 3, 8, 8),)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AiaccWarning)
        assert aiacc.trace(model, x).meta["torch.frontend"] == "fx"
    with pytest.raises(OptionError, match="frontend='onnx' is not one of"):
        aiacc.optimize(model, x, frontend="onnx")
    with pytest.raises(OptionError, match="frontend"):
        aiacc.trace(model, x, frontend=None)
    with pytest.raises(UnsupportedError, match="inference only"):
        aiacc.trace(model, x, frontend="export", mode="train")


def test_export_dynamic_batch_dict_output():
    model, x = _seeded(_Flat), (torch.randn(2, 3, 8, 8),)
    graph = aiacc.trace(model, x, frontend="export")
    assert _opaque(graph) == [] and graph.meta["torch.export"]["dynamic_batch"]
    fast = aiacc.optimize(model, x, frontend="export")
    assert "runs at other sizes" in fast.aiacc_report.interface[0]
    assert_equal_outputs(model, fast, (torch.randn(5, 3, 8, 8),))


def test_export_tied_weights_buffer_kwargs_dataclass_and_untraced_keywords():
    model = _seeded(_Tied)
    g = torch.Generator().manual_seed(1)
    feed = lambda b: {"input_ids": torch.randint(0, 20, (b, 6), generator=g),  # noqa: E731
                      "attention_mask": torch.ones(b, 6, dtype=torch.int64)}
    x = feed(2)
    graph = aiacc.trace(model, x, frontend="export")
    assert _opaque(graph) == []
    # the tied weight is one value of the graph, used by the embedding and the head
    assert sorted(q for q, kind, _ in graph.meta["torch.state"].values()) == ["embed.weight", "offset"]
    fast = aiacc.optimize(model, x, frontend="export")
    assert_equal_outputs(model, fast, feed(2))
    assert isinstance(_call(fast, feed(2)), _Out)
    # a keyword the example did not pass was never traced: an aiacc error, not an ignored argument
    with pytest.raises(UnsupportedError, match="without scale="):
        fast(**feed(2), scale=torch.tensor(2.0))
    assert_equal_outputs(model, fast, {**feed(2), "scale": None})


def test_export_translates_the_aten_ops_models_use():
    model = _seeded(_AtenOps)
    g = torch.Generator().manual_seed(2)
    feed = lambda: (torch.randn(2, 5, 8, generator=g), torch.randint(0, 5, (2, 5), generator=g))  # noqa: E731
    x = feed()
    graph = aiacc.trace(model, x, frontend="export")
    assert _opaque(graph) == [], graph.meta["torch.opaque_reasons"]
    fast = aiacc.optimize(model, x, frontend="export")
    assert_equal_outputs(model, fast, feed())


def test_lstm_through_export_decompositions():
    # aten.lstm has no aten converter: it is decomposed with PyTorch's own decomposition
    model, x, fresh = _seeded(_Lstm), (torch.randn(2, 5, 8),), (torch.randn(2, 5, 8),)
    graph = aiacc.trace(model, x, frontend="export")
    assert _opaque(graph) == [] and "aten.lstm.input" in graph.meta["torch.export"]["decomposed"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = aiacc.optimize(model, x, frontend="export")
    assert_equal_outputs(model, fast, fresh)


class _DataBranch(nn.Module):
    """A loop count read from tensor data (int() of a tensor; a value guard fixes a branch's direction, not a
    count): torch.fx keeps the submodule opaque and torch.export cannot capture it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.gate = _Gate()

    def forward(self, x):
        return self.gate(self.fc(x))


class _Gate(nn.Module):
    def forward(self, x):
        for _ in range(int((x > 0).sum()) % 3):
            x = x * 2
        return x - 1


def test_both_frontends_fail_keeps_fx_opaque_regions_with_both_reasons():
    model, x = _seeded(_DataBranch), (torch.randn(2, 8),)
    with pytest.warns(AiaccWarning, match=r"submodule gate \(_Gate\) is kept opaque.*torch.export was tried too: "
                                          r"it failed: torch.export cannot capture"):
        graph = aiacc.trace(model, x)
    assert graph.meta["torch.frontend"] == "fx" and _opaque(graph) == ["_Gate"]
    with pytest.raises(UnsupportedError, match="torch.export"):
        aiacc.trace(model, x, frontend="export")


# ------------------------------------------------------------------------------------------ real models
@needs_hf
def test_bloom_custom_gelu_through_export():
    model, x, fresh = M.hf_model("bloom")
    with pytest.warns(AiaccWarning, match="GeLUFunction|gelufunction"):
        fast = aiacc.optimize(model, x)
    assert any("torch.export instead (0 opaque" in m for m in fast.aiacc_report.fallbacks)
    assert_equal_outputs(model, fast, fresh)
    with pytest.raises(UnsupportedError, match="without past_key_values="):
        fast(**fresh, past_key_values=object())


def _funnel():
    tr = M.transformers()
    torch.manual_seed(0)
    config = tr.FunnelConfig(vocab_size=100, block_sizes=[1, 1], block_repeats=[1, 1], d_model=32, n_head=2,
                             d_head=16, d_inner=64, num_decoder_layers=1, max_position_embeddings=64)
    g = torch.Generator().manual_seed(0)

    def feed():
        return {"input_ids": torch.randint(0, 100, (2, 16), generator=g),
                "attention_mask": torch.ones(2, 16, dtype=torch.int64)}
    return tr.FunnelModel(config).eval(), feed(), feed()


@needs_hf
@pytest.mark.skipif(not FULL, reason="~15 s: AIACC_REACH_FULL=1")
def test_funnel_through_export():
    model, x, fresh = _funnel()
    graph = aiacc.trace(model, x, frontend="export")
    assert _opaque(graph) == [], graph.meta["torch.opaque_reasons"]
    fast = aiacc.optimize(model, x, frontend="export")
    assert_equal_outputs(model, fast, fresh)


@needs_timm
def test_timm_sequencer_lstm_through_export():
    timm = M.timm()
    torch.manual_seed(0)
    # one stage on a 4 x 4 grid: the decomposed LSTM is unrolled over the grid's rows and columns
    model = timm.models.sequencer.Sequencer2d(num_classes=10, layers=(1,), patch_sizes=(4,), embed_dims=(16,),
                                              hidden_sizes=(8,), mlp_ratios=(2.0,), img_size=16).eval()
    g = torch.Generator().manual_seed(0)
    x, fresh = (torch.randn(2, 3, 16, 16, generator=g),), (torch.randn(2, 3, 16, 16, generator=g),)
    graph = aiacc.trace(model, x, frontend="export")
    assert _opaque(graph) == [], graph.meta["torch.opaque_reasons"]
    fast = aiacc.optimize(model, x, frontend="export")
    assert_equal_outputs(model, fast, fresh)


@needs_hf
@pytest.mark.skipif(not FULL, reason="~20 s: AIACC_REACH_FULL=1")
def test_longformer_data_dependent_global_attention_is_value_guarded():
    # `is_global_attn = ....any().item()` branches on data: torch.export refuses it; torch.fx answers it with
    # the example's value (no global token) and a value guard, so the model traces whole and a call with a
    # global token (attention_mask 2) raises GuardError instead of giving the local-only answer
    tr = M.transformers()
    torch.manual_seed(0)
    config = tr.LongformerConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, attention_window=[4, 4], max_position_embeddings=80,
                                 pad_token_id=1)
    model = tr.LongformerModel(config).eval()
    g = torch.Generator().manual_seed(0)

    def feed():
        return {"input_ids": torch.randint(2, 100, (2, 16), generator=g),
                "attention_mask": torch.ones(2, 16, dtype=torch.int64)}
    x, fresh = feed(), feed()
    with pytest.warns(AiaccWarning, match="specialised on the example.s value of `if is_global_attn:`"):
        graph = aiacc.trace(model, x)
    assert graph.meta["torch.frontend"] == "fx"
    assert _opaque(graph) == [], graph.meta["torch.opaque_reasons"]
    assert [n.attrs["expected"] for n in graph if n.op == "ValueGuard"] == [0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = aiacc.optimize(model, x)
    assert_equal_outputs(model, fast, fresh)
    glob = dict(fresh, attention_mask=fresh["attention_mask"].clone())
    glob["attention_mask"][0, 0] = 2  # a global token: the branch the example did not take
    with pytest.raises(GuardError, match="specialised on the example.s value of `if is_global_attn:`"):
        _call(fast, glob)


HF_SWEEP = ["bert", "gpt2", "llama", "t5_encoder", "bart", "vit", "deberta_v2"]


@needs_hf
@pytest.mark.skipif(not FULL, reason="the transformers sweep through torch.export: AIACC_REACH_FULL=1")
@pytest.mark.parametrize("name", HF_SWEEP)
def test_transformers_through_export(name):
    model, x, fresh = M.hf_model(name)
    graph = aiacc.trace(model, x, frontend="export")
    assert _opaque(graph) == [], graph.meta["torch.opaque_reasons"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = aiacc.optimize(model, x, frontend="export")
    assert_equal_outputs(model, fast, fresh)
