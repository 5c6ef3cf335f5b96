"""The building blocks the issue lists translate to IR ops (no opaque node) and come back equal."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import aiacc
from tests.plugins.torch._helpers import assert_close_rel


class Ops(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(4, 6, 3, padding=1)
        self.ct = nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)
        self.bn1 = nn.BatchNorm1d(6)
        self.acts = nn.ModuleList([nn.ReLU6(), nn.LeakyReLU(0.2), nn.Hardswish(), nn.SiLU(), nn.GELU(), nn.Sigmoid(),
                                   nn.Tanh()])
        self.pools = nn.ModuleList([nn.MaxPool2d(2), nn.AvgPool2d(3, 1, 1), nn.AdaptiveAvgPool2d((2, 2)),
                                    nn.AdaptiveMaxPool2d(1)])
        self.emb = nn.Embedding(10, 8)
        self.ln = nn.LayerNorm(8)
        self.mha = nn.MultiheadAttention(8, 2)

    def forward(self, x, seq, ids):
        a = self.bn1(self.c1(seq))  # (N, 6, L)
        for act in self.acts:
            a = act(a) + a * 0.5
        y = self.ct(x)  # (N, 3, 16, 16)
        pooled = [torch.flatten(p(y), 1) for p in self.pools]
        z = torch.cat(pooled, dim=1)
        e = self.ln(self.emb(ids))  # (N, T, 8)
        q = e.permute(1, 0, 2)  # (T, N, 8)
        att, w = self.mha(q, q, q)
        m = torch.matmul(e, e.transpose(1, 2)) / 3.0 - 1
        s = F.softmax(m.view(m.size(0), -1), dim=-1)
        return a.reshape(a.shape[0], -1), z, att, w, s


def test_every_listed_building_block_translates():
    torch.manual_seed(0)
    model = Ops().eval()
    inputs = (torch.randn(2, 4, 8, 8), torch.randn(2, 4, 7), torch.randint(0, 10, (2, 5)))
    graph = aiacc.trace(model, inputs)
    assert [n.qualified_op for n in graph if n.is_opaque] == []
    ops = set(graph.op_histogram())
    assert {"Conv", "ConvTranspose", "BatchNormalization", "Clip", "LeakyRelu", "HardSwish", "Sigmoid", "Gelu",
            "Tanh", "MaxPool", "AveragePool", "GlobalMaxPool", "Gather", "LayerNormalization", "Softmax",
            "Transpose", "MatMul", "Concat", "Reshape", "Flatten"} <= ops
    for level in (0, 2):
        fast = aiacc.optimize(model, inputs, level=level)
        with torch.no_grad():
            assert_close_rel(model(*inputs), fast(*inputs), 1e-5)


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_with_masks(batch_first):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=batch_first).eval()
    x = torch.randn(2, 5, 8) if batch_first else torch.randn(5, 2, 8)
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    mask = torch.triu(torch.full((5, 5), float("-inf")), 1)
    fast = aiacc.optimize(mha, {"query": x, "key": x, "value": x, "key_padding_mask": kpm, "attn_mask": mask})
    with torch.no_grad():
        assert_close_rel(mha(x, x, x, key_padding_mask=kpm, attn_mask=mask),
                         fast(x, x, x, key_padding_mask=kpm, attn_mask=mask), 1e-5)


def test_transformer_encoder_layer_norm_first_relu_in_train_mode():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, 0.1, norm_first=True).train()
    x = torch.randn(5, 2, 8)
    fast = aiacc.optimize(layer, (x,))
    torch.manual_seed(7)
    a = layer(x)
    torch.manual_seed(7)
    b = fast(x)
    assert_close_rel(a, b, 1e-5)
