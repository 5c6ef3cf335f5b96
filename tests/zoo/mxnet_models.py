"""MXNet test models: Gluon model_zoo ResNet-50 v1 and MobileNetV2 1.0 (pretrained=False), a BERT-style
encoder written with Gluon blocks, an MLP, a net with an op aiacc keeps opaque, and a Symbol-level net
covering the rest of the importer's ops. Random weights from fixed seeds (BatchNorm statistics included, so
folding them is not a no-op); small inputs so a forward takes milliseconds.

Every builder returns (model, example_inputs) where example_inputs is a tuple of numpy arrays; the
model is a Gluon HybridBlock, except `symbol_ops` which returns a (Symbol, arg_params, aux_params) triple.
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


class WithOpaque(mx.gluon.HybridBlock):
    """Conv -> smooth_l1 (an op aiacc does not translate) -> BatchNorm -> ReLU -> pool -> Dense."""

    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.conv = nn.Conv2D(8, 3, padding=1)
            self.bn = nn.BatchNorm()
            self.conv2 = nn.Conv2D(8, 3, padding=1, use_bias=False)
            self.bn2 = nn.BatchNorm()
            self.out = nn.Dense(5)

    def hybrid_forward(self, F, x):
        y = F.smooth_l1(self.conv(x), scalar=1.5)
        y = F.relu(self.bn(y))
        y = F.relu(self.bn2(self.conv2(y)))
        return self.out(F.Pooling(y, global_pool=True, pool_type="avg", kernel=(1, 1)))


def with_opaque(batch: int = 2, size: int = 12):
    x = np.random.default_rng(5).standard_normal((batch, 3, size, size)).astype("float32")
    return _init(WithOpaque(), (x,), 15), (x,)


def symbol_ops(batch: int = 2):
    """A (Symbol, arg_params, aux_params) triple covering the importer's remaining ops: grouped and dilated
    convolution, Deconvolution, pooling conventions, Concat, SliceChannel, Reshape codes, clip, scalars..."""
    S = mx.sym
    rng = np.random.default_rng(6)
    data = S.var("data")
    c1 = S.Convolution(data, num_filter=8, kernel=(3, 3), pad=(1, 1), name="c1")
    bn = S.BatchNorm(c1, fix_gamma=True, eps=1e-3, name="bn")                   # fix_gamma: gamma held at 1
    a = S.Activation(bn, act_type="relu", name="a")
    g = S.Convolution(a, num_filter=8, kernel=(3, 3), pad=(2, 2), dilate=(2, 2), num_group=4, name="g")
    sig = S.Activation(g, act_type="sigmoid", name="sig")
    p_full = S.Pooling(sig, kernel=(3, 3), stride=(2, 2), pool_type="avg", pooling_convention="full",
                       count_include_pad=False, name="pfull")                 # 12 -> 6
    p_max = S.Pooling(a, kernel=(2, 2), stride=(2, 2), pool_type="max", name="pmax")  # 12 -> 6
    p_pad = S.Pooling(a, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="avg", name="ppad")  # 12 -> 6
    cat = S.Concat(p_full, p_max, p_pad, dim=1, name="cat")                      # 24 channels
    parts = S.SliceChannel(cat, num_outputs=3, axis=1, name="parts")
    mixed = S.elemwise_add(parts[0], parts[2], name="mix") * parts[1]
    mixed = S.clip(mixed, a_min=-0.5, a_max=0.8, name="clip")
    up = S.Deconvolution(mixed, num_filter=4, kernel=(2, 2), stride=(2, 2), no_bias=False, name="up")  # 12
    t = S.tanh(up, name="t")
    t = S.Activation(t, act_type="softsign", name="ss")
    r = S.reshape(t, shape=(0, -3, -2), name="r1")                               # B, 4*12, 12
    r = S.reshape(r, shape=(-4, 2, -1, -2), name="r2")                           # 2, B/2... (B=2) -> 2, 1, 48, 12
    r = S.reshape(r, shape=(-1, 0), reverse=True, name="r3")                     # -> ?, 12
    r = S.reshape(r, shape=(batch, -1), name="r4")
    tr = S.transpose(S.reshape(r, shape=(0, 4, -1)), axes=(0, 2, 1), name="tr")  # B, 144, 4
    e = S.expand_dims(tr, axis=1, name="e")                                      # B, 1, 144, 4
    sl = S.slice_axis(e, axis=2, begin=10, end=None, name="sl")                  # B, 1, 134, 4
    sq = S.squeeze(sl, axis=1, name="sq")
    fc = S.FullyConnected(sq, num_hidden=6, flatten=False, name="fc_nf")         # B, 134, 6
    fc = S.LeakyReLU(fc, act_type="leaky", slope=0.2, name="lrelu")
    s = 3.0 - (fc / 2.0 + 1.0) * 0.5                                             # scalar ops
    s = S.sqrt(S.abs(s) + 0.1) ** 2.0 - S.exp(S.negative(S.abs(s)))
    s = 1.0 / (S.abs(s) + 1.0)
    bc = S.broadcast_mul(s, S.var("scale", shape=(1, 1, 6)), name="bcast")
    fc2 = S.FullyConnected(bc, num_hidden=5, name="fc2")                         # flatten=True
    out = S.softmax(fc2, axis=-1, name="prob")
    shapes = {"data": (batch, 3, 12, 12)}
    arg_shapes, _, aux_shapes = out.infer_shape(**shapes)
    args = {n: mx.nd.array(rng.normal(0, 0.3, s).astype("float32"))
            for n, s in zip(out.list_arguments(), arg_shapes) if n != "data"}
    aux = {n: mx.nd.array(rng.uniform(0.5, 1.5, s).astype("float32") if n.endswith("var")
                          else rng.normal(0, 0.1, s).astype("float32"))
           for n, s in zip(out.list_auxiliary_states(), aux_shapes)}
    x = rng.standard_normal(shapes["data"]).astype("float32")
    return (out, args, aux), (x,)


ZOO = {"resnet50_v1": resnet50_v1, "mobilenet_v2": mobilenet_v2, "bert_encoder": bert_encoder, "mlp": mlp,
       "with_opaque": with_opaque, "symbol_ops": symbol_ops}
