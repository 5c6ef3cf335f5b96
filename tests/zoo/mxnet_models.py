"""The MXNet test zoo: the catalogue's test-size models (aiacc.zoo.small.mxnet_models, re-exported) and two
nets only the tests need: one with an op aiacc keeps opaque, and a Symbol-level net covering the rest of the
importer's ops. Builders return (model, example_inputs), example_inputs a tuple of numpy arrays; the model is
a Gluon HybridBlock, except `symbol_ops` which returns a (Symbol, arg_params, aux_params) triple.
"""
from __future__ import annotations

import numpy as np

from aiacc.zoo.small import mxnet_models as small
from aiacc.zoo.small.mxnet_models import (MLP, BertEncoder, EncoderLayer, SelfAttention, bert_encoder,  # noqa: F401
                                          mlp, mobilenet_v2, mx, nn, resnet50_v1)

_init = small._init


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


ZOO = {**small.ZOO, "with_opaque": with_opaque, "symbol_ops": symbol_ops}
