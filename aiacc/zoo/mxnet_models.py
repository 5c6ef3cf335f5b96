"""MXNet zoo: Gluon model_zoo resnet50_v1 and mobilenetv2_1.0 (pretrained=False) and a BERT-style encoder
written with Gluon blocks, all HybridBlocks, random weights from fixed seeds. Inputs are tuples of numpy
arrays (NCHW images; token ids as float32, as Gluon's Embedding takes them). See aiacc.zoo for sizes.
`init`/`randomize` are shared with the test-size catalogue (aiacc.zoo.small.mxnet_models)."""
from __future__ import annotations

import numpy as np

from aiacc.plugins.mxnet._import import import_mxnet

mx = import_mxnet()
nn = mx.gluon.nn


def randomize(block, seed: int) -> None:
    """Random parameters from `seed`: weights ~ N(0, 1/fan_in); BatchNorm statistics and affine random,
    PReLU slopes in [0.05, 0.3]."""
    rng = np.random.default_rng(seed)
    for name, p in sorted(block.collect_params().items()):
        shape = p.shape
        if name.endswith(("running_var", "moving_var", "gamma")):
            v = rng.uniform(0.5, 1.5, shape)
        elif name.endswith(("running_mean", "moving_mean", "beta", "bias")):
            v = rng.normal(0, 0.1, shape)
        elif name.endswith("alpha"):  # PReLU slopes
            v = rng.uniform(0.05, 0.3, shape)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
            v = rng.normal(0, 1.0 / np.sqrt(max(fan_in, 1)), shape)
        p.set_data(mx.nd.array(v.astype(p.dtype or "float32")))


def init(block, example, seed: int):
    """Initialize `block`, run it once on the `example` arrays (deferred shapes) and randomize it."""
    block.initialize(mx.init.Xavier())
    block(*[mx.nd.array(a) for a in example])  # resolve deferred shapes
    randomize(block, seed)
    mx.nd.waitall()
    return block


def _images(batch: int, size: int, seed: int) -> tuple[np.ndarray]:
    return (np.random.default_rng(seed).standard_normal((batch, 3, size, size)).astype("float32"),)


def resnet50(batch: int = 1, size: int = 224, num_classes: int = 1000):
    """Gluon model_zoo resnet50_v1 and a (batch, 3, size, size) image batch."""
    from mxnet.gluon.model_zoo import vision

    x = _images(batch, size, 10)
    return init(vision.get_model("resnet50_v1", pretrained=False, classes=num_classes), x, 11), x


def mobilenet_v2(batch: int = 1, size: int = 224, num_classes: int = 1000):
    """Gluon model_zoo mobilenetv2_1.0 and a (batch, 3, size, size) image batch."""
    from mxnet.gluon.model_zoo import vision

    x = _images(batch, size, 11)
    return init(vision.get_model("mobilenetv2_1.0", pretrained=False, classes=num_classes), x, 12), x


class SelfAttention(mx.gluon.HybridBlock):
    """Multi-head self-attention: one Dense for q|k|v split three ways, batch_dot, softmax."""

    def __init__(self, hidden: int, heads: int, **kw):
        super().__init__(**kw)
        self.heads = heads
        self.scale = 1.0 / np.sqrt(hidden // heads)
        with self.name_scope():
            self.qkv = nn.Dense(3 * hidden, flatten=False)
            self.proj = nn.Dense(hidden, flatten=False)

    def split_heads(self, F, t):
        """B, S, H -> B*heads, S, H/heads."""
        t = F.transpose(F.reshape(t, shape=(0, 0, self.heads, -1)), axes=(0, 2, 1, 3))
        return F.reshape(t, shape=(-3, -2))

    def hybrid_forward(self, F, x):
        q, k, v = F.split(self.qkv(x), num_outputs=3, axis=-1)
        q, k, v = self.split_heads(F, q), self.split_heads(F, k), self.split_heads(F, v)
        att = F.softmax(F.batch_dot(q, k, transpose_b=True) * self.scale, axis=-1)
        ctx = F.reshape(F.batch_dot(att, v), shape=(-4, -1, self.heads, 0, 0))  # B, heads, S, H/heads
        ctx = F.reshape(F.transpose(ctx, axes=(0, 2, 1, 3)), shape=(0, 0, -1))
        return self.proj(ctx)


class EncoderLayer(mx.gluon.HybridBlock):
    """Post-LN encoder layer: attention (`attention_class`), Add+LayerNorm, Dense-GELU-Dense, Add+LayerNorm;
    `eps`: the LayerNorms' epsilon."""

    attention_class = SelfAttention

    def __init__(self, hidden: int, heads: int, ffn: int, eps: float = 1e-12, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.attn = self.attention_class(hidden, heads)
            self.drop = nn.Dropout(0.1)
            self.ln1 = nn.LayerNorm(epsilon=eps)
            self.ffn1 = nn.Dense(ffn, flatten=False)
            self.act = nn.GELU()
            self.ffn2 = nn.Dense(hidden, flatten=False)
            self.ln2 = nn.LayerNorm(epsilon=eps)

    def hybrid_forward(self, F, x):
        x = self.ln1(x + self.drop(self.attn(x)))
        return self.ln2(x + self.drop(self.ffn2(self.act(self.ffn1(x)))))


class BertEncoder(mx.gluon.HybridBlock):
    """Token + position embeddings, LayerNorm, N encoder layers, a tanh pooler on the first token;
    returns (last hidden state, pooled). The sequence length is fixed at construction."""

    def __init__(self, seq: int, vocab: int, hidden: int, heads: int, ffn: int, layers: int, **kw):
        super().__init__(**kw)
        self.seq = seq
        with self.name_scope():
            self.tok = nn.Embedding(vocab, hidden)
            self.position_weight = self.params.get("position_weight", shape=(max(512, seq), hidden))
            self.ln = nn.LayerNorm(epsilon=1e-12)
            self.layers = nn.HybridSequential()
            for _ in range(layers):
                self.layers.add(EncoderLayer(hidden, heads, ffn))
            self.pool = nn.Dense(hidden, activation="tanh")

    def hybrid_forward(self, F, tokens, position_weight):
        pos = F.slice_axis(position_weight, axis=0, begin=0, end=self.seq)
        x = self.ln(F.broadcast_add(self.tok(tokens), F.expand_dims(pos, axis=0)))
        for layer in self.layers:
            x = layer(x)
        return x, self.pool(F.slice_axis(x, axis=1, begin=0, end=1))  # Dense flattens B, 1, H -> B, H


def bert_encoder(batch: int = 1, seq: int = 128, vocab: int = 8192, hidden: int = 256, heads: int = 4,
                 layers: int = 4, ffn: int = 1024):
    """The BERT-style encoder and (batch, seq) token ids (float32)."""
    tokens = np.random.default_rng(5).integers(0, vocab, (batch, seq)).astype("float32")
    model = BertEncoder(seq, vocab, hidden, heads, ffn, layers)
    return init(model, (tokens,), 13), (tokens,)
