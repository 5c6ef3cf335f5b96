"""backend="onnxruntime" runs transformers' attention as onnxruntime's fused kernels (aiacc.backends.ort_fusions):
one com.microsoft.Attention per layer for BERT, DistilBERT, GPT-2 (packed c_attn projection cut by Split) and
ViT, MultiHeadAttention where q and k/v come from different inputs; outputs equal the original's within 1e-4
on an input aiacc never saw. No timing is asserted (benchmarks/reach.py --speed measures it)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")

import aiacc  # noqa: E402
from aiacc.backends.onnxruntime import OrtGraphRunner  # noqa: E402
from tests.reach import _models as M  # noqa: E402


def _rel_err(expected, got) -> float:
    from torch.utils import _pytree as pytree

    a = [t for t in pytree.tree_leaves(expected) if isinstance(t, torch.Tensor)]
    b = [t for t in pytree.tree_leaves(got) if isinstance(t, torch.Tensor)]
    assert len(a) == len(b) and a
    return max(float((x - y).abs().max() / max(float(x.abs().max()), 1e-12)) for x, y in zip(a, b))


def _optimize(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return aiacc.optimize(model, x, backend="onnxruntime")


@pytest.mark.parametrize("name", ["bert", "distilbert", "gpt2", "vit"])
def test_transformers_attention_runs_fused_and_equal(name):
    model, x, fresh = M.hf_speed_model(name, "small", seq=32, image=64)
    model.eval()
    fast = _optimize(model, x)
    layers = M.SPEED_SIZES["small"][3]
    assert fast.runner.fused_ops == {"Attention": layers}  # one packed-QKV attention kernel per layer
    # and they are what the session runs once onnxruntime's own optimizers have been over the graph: each
    # layer one Attention, no Softmax left, and LayerNorm as onnxruntime's kernels (plain or fused with the
    # residual Add: SkipLayerNormalization), never decomposed
    ops = fast.runner.optimized_ops()
    assert ops.get("Attention") == layers and "Softmax" not in ops, ops
    assert ops.get("LayerNormalization", 0) + ops.get("SkipLayerNormalization", 0) >= 2 * layers, ops
    assert not {"ReduceMean", "Pow", "Sqrt", "Erf"} & set(ops), ops
    with torch.no_grad():
        assert _rel_err(model(**fresh), fast(**fresh)) <= 1e-4


class CrossAttention(torch.nn.Module):
    """q from x, k and v from another input: no shared projection input, so MultiHeadAttention."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (torch.nn.Linear(d, d) for _ in range(3))

    def split(self, t):
        b, s, d = t.shape
        return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x, memory, bias):
        q, k, v = self.split(self.q(x)), self.split(self.k(memory)), self.split(self.v(memory))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return y.transpose(1, 2).reshape(x.shape)


def test_cross_attention_runs_as_multihead_attention_with_its_bias():
    torch.manual_seed(0)
    model = CrossAttention().eval()
    x, memory, bias = torch.randn(1, 8, 32), torch.randn(1, 12, 32), torch.randn(1, 1, 8, 12)
    fast = _optimize(model, (x, memory, bias))
    assert fast.runner.fused_ops == {"MultiHeadAttention": 1}
    x2, m2, b2 = torch.randn(1, 8, 32), torch.randn(1, 12, 32), torch.randn(1, 1, 8, 12)
    with torch.no_grad():
        assert _rel_err(model(x2, m2, b2), fast(x2, m2, b2)) <= 1e-4


def test_fusions_off_gives_the_plain_graph_with_equal_outputs():
    model, x, _ = M.hf_speed_model("bert", "small", seq=16)
    model.eval()
    fast = _optimize(model, x)
    plain = OrtGraphRunner(fast.graph, fusions=False)
    assert plain.fused_ops == {} and fast.runner.fused_ops
    feeds = {k: v.numpy() for k, v in x.items()}
    for a, b in zip(plain.run(feeds), fast.runner.run(feeds)):
        assert np.abs(a - b).max() <= 1e-4 * max(np.abs(a).max(), 1e-12)


def test_direct_binding_matches_the_signature_binding():
    """The call path that skips inspect.Signature binds what bind_inputs binds, and a call it cannot take
    (a missing input) still gets bind_inputs' error."""
    from aiacc.errors import ShapeError
    from aiacc.plugins.torch.importer import bind_inputs

    model, x, _ = M.hf_speed_model("bert", "small", seq=16)
    model.eval()
    fast = _optimize(model, x)
    assert fast._direct is not None
    slow = bind_inputs(fast.signature, (), dict(x))
    expect = {name: slow[e[1]] for e in fast.signature for name in e[2]}
    for args, kwargs in (((), dict(x)), ((x["input_ids"],), {"attention_mask": x["attention_mask"]}),
                         ((x["input_ids"], x["attention_mask"]), {})):
        got = {name: t for t, name in fast.input_leaves(args, kwargs)}
        assert got.keys() == expect.keys() and all(got[k] is expect[k] for k in got)
    with pytest.raises(ShapeError):
        fast.input_leaves((), {"input_ids": x["input_ids"]})
