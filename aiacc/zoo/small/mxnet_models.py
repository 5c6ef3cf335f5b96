"""MXNet models at test size: Gluon model_zoo ResNet-50 v1 ("resnet50_v1", the bundled "resnet50" with a
64x64 input) and MobileNetV2 1.0 (pretrained=False), a BERT-style encoder with an attention mask written with
the bundled Gluon blocks, and an MLP. Random weights from fixed seeds (BatchNorm statistics included, so
folding them is not a no-op); small inputs so a forward takes milliseconds. The test zoo
(tests/zoo/mxnet_models.py) adds a net with an op aiacc keeps opaque and a Symbol-level net.

Every builder returns (model, example_inputs) where example_inputs is a tuple of numpy arrays; the
model is a Gluon HybridBlock.
"""
from __future__ import annotations

import numpy as np

from aiacc.plugins.mxnet._import import import_mxnet
from aiacc.zoo import mxnet_models as bundled

mx = import_mxnet()
nn = mx.gluon.nn


# random weights from a fixed seed (BatchNorm statistics and PReLU slopes included), as the bundled models
_init = bundled.init


def resnet50_v1(batch: int = 1, size: int = 64):
    from mxnet.gluon.model_zoo import vision

    x = np.random.default_rng(1).standard_normal((batch, 3, size, size)).astype("float32")
    return _init(vision.get_model("resnet50_v1", pretrained=False), (x,), 11), (x,)


def mobilenet_v2(batch: int = 1, size: int = 64):
    from mxnet.gluon.model_zoo import vision

    x = np.random.default_rng(2).standard_normal((batch, 3, size, size)).astype("float32")
    return _init(vision.get_model("mobilenetv2_1.0", pretrained=False), (x,), 12), (x,)


class SelfAttention(bundled.SelfAttention):
    """The bundled multi-head self-attention (one Dense for q|k|v split three ways, batch_dot), with an
    attention mask: softmax over masked scores."""

    def hybrid_forward(self, F, x, mask):
        qkv = self.qkv(x)                                             # B, S, 3H
        q, k, v = F.split(qkv, num_outputs=3, axis=-1)               # SliceChannel
        q, k, v = self.split_heads(F, q), self.split_heads(F, k), self.split_heads(F, v)  # B*heads, S, H/heads
        scores = F.batch_dot(q, k, transpose_b=True) * self.scale    # _mul_scalar
        # mask: B, S (1 = keep) -> additive bias B*heads, 1, S
        bias = (1 - mask) * -10000.0                                  # _rminus_scalar, _mul_scalar
        bias = F.broadcast_axis(F.expand_dims(bias, axis=1), axis=1, size=self.heads)  # B, heads, S
        bias = F.reshape(bias, shape=(-3, -2))                                           # B*heads, S
        scores = F.broadcast_add(scores, F.expand_dims(bias, axis=1))
        att = F.softmax(scores, axis=-1)
        ctx = F.batch_dot(att, v)                                     # B*heads, S, H/heads
        ctx = F.reshape(ctx, shape=(-4, -1, self.heads, 0, 0))        # B, heads, S, H/heads
        ctx = F.transpose(ctx, axes=(0, 2, 1, 3))
        ctx = F.reshape(ctx, shape=(0, 0, -1))
        return self.proj(ctx)


class EncoderLayer(bundled.EncoderLayer):
    """The bundled encoder layer with the masked attention above and LayerNorm eps 1e-5."""

    attention_class = SelfAttention

    def __init__(self, hidden: int, heads: int, ffn: int, **kw):
        super().__init__(hidden, heads, ffn, eps=1e-5, **kw)

    def hybrid_forward(self, F, x, mask):
        x = self.ln1(x + self.drop(self.attn(x, mask)))
        return self.ln2(x + self.drop(self.ffn2(self.act(self.ffn1(x)))))


class BertEncoder(mx.gluon.HybridBlock):
    """Token + position embeddings, LayerNorm, N encoder layers, a pooled tanh head."""

    def __init__(self, vocab=50, hidden=32, heads=4, ffn=64, layers=2, max_len=16, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.tok = nn.Embedding(vocab, hidden)
            self.position_weight = self.params.get("position_weight", shape=(max_len, hidden))
            self.ln = nn.LayerNorm()
            self.layers = nn.HybridSequential()
            for _ in range(layers):
                self.layers.add(EncoderLayer(hidden, heads, ffn))
            self.pool = nn.Dense(hidden, activation="tanh")

    def hybrid_forward(self, F, tokens, mask, position_weight):
        x = self.tok(tokens)                                          # B, S, H
        pos = F.slice_axis(position_weight, axis=0, begin=0, end=8)  # the first S positions (S = 8)
        x = self.ln(F.broadcast_add(x, F.expand_dims(pos, axis=0)))
        for layer in self.layers:
            x = layer(x, mask)
        first = F.slice_axis(x, axis=1, begin=0, end=1)              # B, 1, H
        return x, self.pool(first)                                    # Dense flattens B, 1, H -> B, H


def bert_encoder(batch: int = 2, seq: int = 8):
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 50, (batch, seq)).astype("float32")
    mask = np.ones((batch, seq), dtype="float32")
    mask[1, seq - 3:] = 0
    return _init(BertEncoder(), (tokens, mask), 13), (tokens, mask)


class MLP(mx.gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.body = nn.HybridSequential()
            self.body.add(nn.Dense(64), nn.BatchNorm(), nn.LeakyReLU(0.1), nn.Dropout(0.2),
                          nn.Dense(48, activation="tanh"), nn.PReLU(), nn.Dense(32), nn.ELU(0.7), nn.SELU(),
                          nn.Dense(24, activation="softrelu"), nn.Swish(), nn.Dense(10))

    def hybrid_forward(self, F, x):
        return F.log_softmax(self.body(x) / 2.0, axis=-1)


def mlp(batch: int = 4, features: int = 20):
    x = np.random.default_rng(4).standard_normal((batch, features)).astype("float32")
    return _init(MLP(), (x,), 14), (x,)


ZOO = {"resnet50_v1": resnet50_v1, "mobilenet_v2": mobilenet_v2, "bert_encoder": bert_encoder, "mlp": mlp}
