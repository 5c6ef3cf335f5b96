"""ONNX zoo: ResNet-50, MobileNetV2 and the BERT-style encoder as onnx.ModelProto built with onnx.helper
(random weights, fixed seeds; onnx is imported when a model is built). Inputs are {input name: array}.

`resnet50_onnx` and `bert_encoder_onnx` are the builders (their defaults are the small example sizes that
`aiacc example resnet50|bert` writes, aiacc.examples); `resnet50`, `mobilenet_v2` and `bert_encoder` give
(model, feeds) at the catalogue's sizes. See aiacc.zoo.
"""
from __future__ import annotations

import math
import os

import numpy as np


class _Builder:
    """Tiny helper over onnx.helper: named initializers and nodes with fresh names."""

    def __init__(self, seed: int, dtype=np.float32):
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.rng = np.random.default_rng(seed)
        self.dtype = dtype
        self.nodes: list = []
        self.inits: list = []
        self.counter = 0

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(self.numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op: str, inputs: list[str], name: str | None = None, n_out: int = 1, **attrs) -> str | list[str]:
        self.counter += 1
        name = name or f"{op.lower()}_{self.counter}"
        outs = [name] if n_out == 1 else [f"{name}_{i}" for i in range(n_out)]
        self.nodes.append(self.helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, name, inputs, outputs, opset=17):
        graph = self.helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
        model = self.helper.make_model(graph, producer_name="aiacc.examples",
                                       opset_imports=[self.helper.make_opsetid("", opset)])
        model.ir_version = 8
        return model


def _save(model, path):
    if path is not None:
        import onnx

        onnx.save(model, os.fspath(path))
    return model


# ------------------------------------------------------------------------------------------------ ResNet-50
def resnet50_onnx(path: str | os.PathLike | None = None, *, image_size: int = 224, num_classes: int = 1000,
                  layers: tuple[int, ...] = (3, 4, 6, 3), batch: int | str = "N", seed: int = 0):
    """ResNet-50 v1.5 as an ONNX ModelProto (Conv+BatchNormalization+Relu bottlenecks, MaxPool,
    GlobalAveragePool, Flatten, Gemm) with He-initialised random weights; written to `path` if given."""
    from onnx import TensorProto

    b = _Builder(seed)
    rng = b.rng

    def conv_bn(x, cin, cout, k, stride, name, relu=True):
        w = rng.standard_normal((cout, cin, k, k)).astype(np.float32) * math.sqrt(2.0 / (cin * k * k))
        y = b.node("Conv", [x, b.init(f"{name}.weight", w)], name=f"{name}.conv", kernel_shape=[k, k],
                   strides=[stride, stride], pads=[k // 2] * 4)
        params = [b.init(f"{name}.bn.{p}", v) for p, v in (
            ("scale", rng.uniform(0.5, 1.0, cout).astype(np.float32)),
            ("bias", rng.uniform(-0.1, 0.1, cout).astype(np.float32)),
            ("mean", rng.uniform(-0.1, 0.1, cout).astype(np.float32)),
            ("var", rng.uniform(0.5, 1.5, cout).astype(np.float32)))]
        y = b.node("BatchNormalization", [y, *params], name=f"{name}.bn", epsilon=1e-5)
        return b.node("Relu", [y], name=f"{name}.relu") if relu else y

    x = "input"
    y = conv_bn(x, 3, 64, 7, 2, "stem")
    y = b.node("MaxPool", [y], name="stem.pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, (blocks, width) in enumerate(zip(layers, (64, 128, 256, 512))):
        for i in range(blocks):
            stride = 2 if i == 0 and stage > 0 else 1
            name = f"layer{stage + 1}.{i}"
            out = conv_bn(y, cin, width, 1, 1, f"{name}.a")
            out = conv_bn(out, width, width, 3, stride, f"{name}.b")
            out = conv_bn(out, width, width * 4, 1, 1, f"{name}.c", relu=False)
            short = conv_bn(y, cin, width * 4, 1, stride, f"{name}.down", relu=False) \
                if i == 0 else y
            y = b.node("Relu", [b.node("Add", [out, short], name=f"{name}.add")], name=f"{name}.relu")
            cin = width * 4
    y = b.node("GlobalAveragePool", [y], name="pool")
    y = b.node("Flatten", [y], name="flatten", axis=1)
    fc_w = rng.standard_normal((num_classes, cin)).astype(np.float32) / math.sqrt(cin)
    y = b.node("Gemm", [y, b.init("fc.weight", fc_w), b.init("fc.bias", np.zeros(num_classes, np.float32))],
               name="fc", transB=1)
    inp = b.helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, image_size, image_size])
    out = b.helper.make_tensor_value_info(y, TensorProto.FLOAT, [batch, num_classes])
    return _save(b.model("resnet50", [inp], [out]), path)


# ------------------------------------------------------------------------------------------------ BERT
def bert_encoder_onnx(path: str | os.PathLike | None = None, *, vocab: int = 1000, hidden: int = 64,
                      heads: int = 4, layers: int = 2, ffn: int = 128, max_len: int = 64, seed: int = 0):
    """A BERT-style encoder as an ONNX ModelProto: word + position embeddings (Gather, dynamic Slice),
    LayerNorm, `layers` x [multi-head self-attention with an additive padding mask, residual + LayerNorm,
    erf-GELU feed-forward, residual + LayerNorm], and a tanh pooler on the first token.
    Inputs: input_ids int64[N, S], attention_mask int64[N, S]."""
    from onnx import TensorProto

    b = _Builder(seed)
    rng = b.rng
    d = hidden // heads

    def weight(name, *shape, scale=None):
        scale = scale if scale is not None else 1.0 / math.sqrt(shape[0])
        return b.init(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def const(name, array):
        return b.init(name, np.asarray(array))

    def linear(x, cin, cout, name):
        y = b.node("MatMul", [x, weight(f"{name}.weight", cin, cout)], name=f"{name}.matmul")
        return b.node("Add", [y, b.init(f"{name}.bias", (rng.standard_normal(cout) * 0.02).astype(np.float32))],
                      name=f"{name}.add")

    def layer_norm(x, name):
        return b.node("LayerNormalization", [x, b.init(f"{name}.gamma", np.ones(hidden, np.float32)),
                                             b.init(f"{name}.beta", np.zeros(hidden, np.float32))],
                      name=name, axis=-1, epsilon=1e-12)

    # embeddings: word (Gather) + position (Slice of the table to the sequence length)
    word = b.node("Gather", [weight("embeddings.word", vocab, hidden, scale=0.5), "input_ids"], name="emb.word")
    seq = b.node("Shape", ["input_ids"], name="emb.seq_len", start=1, end=2)
    pos = b.node("Slice", [weight("embeddings.position", max_len, hidden, scale=0.5), const("emb.zero", [0]),
                           seq, const("emb.axis0", [0])], name="emb.position")
    x = layer_norm(b.node("Add", [word, pos], name="emb.add"), "emb.ln")
    # additive mask: (1 - mask) * -10000, shaped [N, 1, 1, S]
    m = b.node("Cast", ["attention_mask"], name="mask.cast", to=TensorProto.FLOAT)
    m = b.node("Sub", [const("mask.one", np.float32(1.0)), m], name="mask.invert")
    m = b.node("Mul", [m, const("mask.big", np.float32(-10000.0))], name="mask.scale")
    mask = b.node("Unsqueeze", [m, const("mask.axes", np.array([1, 2], np.int64))], name="mask.unsqueeze")
    split_heads = const("shape.heads", np.array([0, 0, heads, d], np.int64))
    merge_heads = const("shape.merge", np.array([0, 0, hidden], np.int64))
    inv_sqrt_d = const("attn.scale", np.float32(1.0 / math.sqrt(d)))
    sqrt2 = const("gelu.sqrt2", np.float32(math.sqrt(2.0)))
    one = const("gelu.one", np.float32(1.0))
    half = const("gelu.half", np.float32(0.5))
    for i in range(layers):
        p = f"layer{i}"

        def heads_of(t, name, perm):
            t = b.node("Reshape", [t, split_heads], name=f"{name}.split")
            return b.node("Transpose", [t], name=f"{name}.transpose", perm=perm)

        q = heads_of(linear(x, hidden, hidden, f"{p}.q"), f"{p}.q", [0, 2, 1, 3])
        k = heads_of(linear(x, hidden, hidden, f"{p}.k"), f"{p}.k", [0, 2, 3, 1])
        v = heads_of(linear(x, hidden, hidden, f"{p}.v"), f"{p}.v", [0, 2, 1, 3])
        s = b.node("MatMul", [q, k], name=f"{p}.scores")
        s = b.node("Mul", [s, inv_sqrt_d], name=f"{p}.scaled")
        s = b.node("Add", [s, mask], name=f"{p}.masked")
        a = b.node("Softmax", [s], name=f"{p}.softmax", axis=-1)
        ctx = b.node("MatMul", [a, v], name=f"{p}.context")
        ctx = b.node("Transpose", [ctx], name=f"{p}.context.transpose", perm=[0, 2, 1, 3])
        ctx = b.node("Reshape", [ctx, merge_heads], name=f"{p}.context.merge")
        attn = linear(ctx, hidden, hidden, f"{p}.out")
        x = layer_norm(b.node("Add", [attn, x], name=f"{p}.attn.residual"), f"{p}.attn.ln")
        h = linear(x, hidden, ffn, f"{p}.ffn.in")
        g = b.node("Erf", [b.node("Div", [h, sqrt2], name=f"{p}.gelu.div")], name=f"{p}.gelu.erf")
        g = b.node("Mul", [b.node("Mul", [h, b.node("Add", [g, one], name=f"{p}.gelu.add")], name=f"{p}.gelu.mul"),
                           half], name=f"{p}.gelu")
        h = linear(g, ffn, hidden, f"{p}.ffn.out")
        x = layer_norm(b.node("Add", [h, x], name=f"{p}.ffn.residual"), f"{p}.ffn.ln")
    last = b.node("Identity", [x], name="last_hidden_state")
    cls = b.node("Gather", [x, const("pool.index", np.array(0, np.int64))], name="pool.first", axis=1)
    pooled = b.node("Tanh", [linear(cls, hidden, hidden, "pool.dense")], name="pooled")
    inputs = [b.helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["N", "S"]),
              b.helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["N", "S"])]
    outputs = [b.helper.make_tensor_value_info(last, TensorProto.FLOAT, ["N", "S", hidden]),
               b.helper.make_tensor_value_info(pooled, TensorProto.FLOAT, ["N", hidden])]
    return _save(b.model("bert_encoder", inputs, outputs), path)




def _images(batch: int, size: int, seed: int, name: str = "input") -> dict[str, np.ndarray]:
    return {name: np.random.default_rng(seed).standard_normal((batch, 3, size, size)).astype(np.float32)}


def resnet50(batch: int = 1, size: int = 224, num_classes: int = 1000):
    """ResNet-50 v1.5 (symbolic batch) and {"input": (batch, 3, size, size)}."""
    return resnet50_onnx(image_size=size, num_classes=num_classes), _images(batch, size, 10)


def mobilenet_v2(batch: int = 1, size: int = 224, num_classes: int = 1000, seed: int = 3):
    """MobileNetV2 (width 1.0: Conv + BatchNormalization + Clip(0, 6), depthwise convs, residual Adds,
    GlobalAveragePool, Gemm) with a symbolic batch, and {"input": (batch, 3, size, size)}."""
    from onnx import TensorProto

    b = _Builder(seed)
    rng = b.rng
    six, zero = b.init("relu6.max", np.float32(6.0)), b.init("relu6.min", np.float32(0.0))

    def conv_bn(x, cin, cout, k, stride, name, groups=1, relu6=True):
        w = rng.standard_normal((cout, cin // groups, k, k)).astype(np.float32) * math.sqrt(2.0 / (cin // groups * k * k))
        y = b.node("Conv", [x, b.init(f"{name}.weight", w)], name=f"{name}.conv", kernel_shape=[k, k],
                   strides=[stride, stride], pads=[k // 2] * 4, group=groups)
        params = [b.init(f"{name}.bn.{p}", v) for p, v in (
            ("scale", rng.uniform(0.5, 1.5, cout).astype(np.float32)),
            ("bias", rng.normal(0, 0.1, cout).astype(np.float32)),
            ("mean", rng.normal(0, 0.1, cout).astype(np.float32)),
            ("var", rng.uniform(0.5, 1.5, cout).astype(np.float32)))]
        y = b.node("BatchNormalization", [y, *params], name=f"{name}.bn", epsilon=1e-5)
        return b.node("Clip", [y, zero, six], name=f"{name}.relu6") if relu6 else y

    y = conv_bn("input", 3, 32, 3, 2, "stem")
    cin = 32
    cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
           (6, 320, 1, 1)]
    for stage, (t, c, n, s) in enumerate(cfg):
        for i in range(n):
            name, stride, hidden = f"block{stage}.{i}", s if i == 0 else 1, cin * t
            h = conv_bn(y, cin, hidden, 1, 1, f"{name}.expand") if t != 1 else y
            h = conv_bn(h, hidden, hidden, 3, stride, f"{name}.dw", groups=hidden)
            h = conv_bn(h, hidden, c, 1, 1, f"{name}.project", relu6=False)
            y = b.node("Add", [y, h], name=f"{name}.add") if stride == 1 and cin == c else h
            cin = c
    y = conv_bn(y, cin, 1280, 1, 1, "last")
    y = b.node("Flatten", [b.node("GlobalAveragePool", [y], name="pool")], name="flatten", axis=1)
    fc_w = rng.standard_normal((num_classes, 1280)).astype(np.float32) / math.sqrt(1280)
    y = b.node("Gemm", [y, b.init("fc.weight", fc_w), b.init("fc.bias", np.zeros(num_classes, np.float32))],
               name="fc", transB=1)
    inp = b.helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, size, size])
    out = b.helper.make_tensor_value_info(y, TensorProto.FLOAT, ["N", num_classes])
    return b.model("mobilenet_v2", [inp], [out]), _images(batch, size, 11)


def bert_encoder(batch: int = 1, seq: int = 128, vocab: int = 8192, hidden: int = 256, heads: int = 4,
                 layers: int = 4, ffn: int = 1024):
    """The BERT-style encoder of aiacc.examples (with an attention mask input) and its feeds: random token
    ids and a mask that pads the last quarter of every sequence."""
    model = bert_encoder_onnx(vocab=vocab, hidden=hidden, heads=heads, layers=layers, ffn=ffn,
                              max_len=max(512, seq))
    rng = np.random.default_rng(5)
    mask = np.ones((batch, seq), np.int64)
    mask[:, seq - seq // 4:] = 0
    return model, {"input_ids": rng.integers(0, vocab, (batch, seq), dtype=np.int64), "attention_mask": mask}
