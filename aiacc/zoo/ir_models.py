"""Reference networks built directly as aiacc IR graphs (no framework): ResNet-50, MobileNetV2, a
DenseNet-style net, an Inception (GoogLeNet) style net and a BERT-style encoder.

Random weights from a fixed seed. The batch dimension is the symbol "N" (bind it, e.g. dims={"N": 1});
spatial size, depth and widths are parameters so tests can run small versions and benchmarks full ones.
Nodes are added in the order a framework tracer would emit them (branch by branch, layer by layer),
and Conv / BatchNormalization / Relu stay separate, as an importer produces them before any fusion.
"""
from __future__ import annotations

import numpy as np

from aiacc.core import Graph
from aiacc.core.ir import Value


class Builder:
    """A Graph plus a seeded generator and shorthands for the usual layers."""

    def __init__(self, name: str, seed: int = 0):
        self.g = Graph(name)
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def _w(self, prefix: str, shape, scale: float | None = None) -> Value:
        self.count += 1
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else int(shape[0])
        s = scale if scale is not None else np.sqrt(2.0 / max(fan_in, 1))
        return self.g.add_initializer(f"{prefix}{self.count}", (self.rng.standard_normal(shape) * s).astype(np.float32))

    def const(self, prefix: str, array) -> Value:
        self.count += 1
        return self.g.add_initializer(f"{prefix}{self.count}", np.asarray(array))

    def conv(self, x: Value, cout: int, k: int, stride: int = 1, pad: int | None = None, group: int = 1,
             bias: bool = False) -> Value:
        cin = x.shape[1]
        pad = k // 2 if pad is None else pad
        w = self._w("w", (cout, cin // group, k, k))
        b = self._w("b", (cout,), 0.1) if bias else None
        return self.g.op("Conv", x, w, b, pads=[pad] * 4, strides=[stride] * 2, group=group)

    def bn(self, x: Value) -> Value:
        c = x.shape[1]
        scale = self.const("gamma", (1 + 0.1 * self.rng.standard_normal(c)).astype(np.float32))
        shift = self.const("beta", (0.1 * self.rng.standard_normal(c)).astype(np.float32))
        mean = self.const("mean", (0.1 * self.rng.standard_normal(c)).astype(np.float32))
        var = self.const("var", (1 + 0.1 * self.rng.random(c)).astype(np.float32))
        return self.g.op("BatchNormalization", x, scale, shift, mean, var)

    def conv_bn(self, x: Value, cout: int, k: int, stride: int = 1, group: int = 1, act: str | None = "Relu",
                pad: int | None = None) -> Value:
        y = self.bn(self.conv(x, cout, k, stride, pad, group))
        if act == "Relu":
            y = self.g.op("Relu", y)
        elif act == "Relu6":
            y = self.g.op("Clip", y, self.const("lo", np.float32(0)), self.const("hi", np.float32(6)))
        return y

    def linear(self, x: Value, cout: int) -> Value:
        w = self._w("fc_w", (x.shape[-1], cout), np.sqrt(1.0 / x.shape[-1]))
        b = self._w("fc_b", (cout,), 0.02)
        return self.g.op("Add", self.g.op("MatMul", x, w), b)

    def head(self, x: Value, classes: int) -> Value:
        y = self.g.op("Flatten", self.g.op("GlobalAveragePool", x))
        w = self._w("fc_w", (classes, y.shape[1]), np.sqrt(1.0 / y.shape[1]))
        b = self._w("fc_b", (classes,), 0.02)
        return self.g.op("Gemm", y, w, b, transB=1)

    def done(self, *outputs: Value) -> Graph:
        for o in outputs:
            self.g.add_output(o)
        self.g.verify()
        return self.g


def resnet50(size: int = 224, classes: int = 1000, width: int = 64, layers=(3, 4, 6, 3), seed: int = 0) -> Graph:
    """ResNet-50 v1.5 (bottleneck blocks, stride on the 3x3)."""
    b = Builder("resnet50", seed)
    x = b.g.add_input("x", "float32", ("N", 3, size, size))
    y = b.conv_bn(x, width, 7, 2, pad=3)
    y = b.g.op("MaxPool", y, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = width
    for stage, n in enumerate(layers):
        mid = width * 2 ** stage
        for i in range(n):
            stride = 2 if (i == 0 and stage > 0) else 1
            h = b.conv_bn(y, mid, 1)
            h = b.conv_bn(h, mid, 3, stride)
            h = b.conv_bn(h, mid * 4, 1, act=None)
            short = b.conv_bn(y, mid * 4, 1, stride, act=None) if (stride != 1 or cin != mid * 4) else y
            y = b.g.op("Relu", b.g.op("Add", h, short))
            cin = mid * 4
    return b.done(b.head(y, classes))


def mobilenet_v2(size: int = 224, classes: int = 1000, width_mult: float = 1.0, seed: int = 0) -> Graph:
    """MobileNetV2: inverted residual blocks with depthwise convolutions and ReLU6."""
    b = Builder("mobilenet_v2", seed)

    def ch(c):
        return max(8, int(c * width_mult + 4) // 8 * 8)

    x = b.g.add_input("x", "float32", ("N", 3, size, size))
    y = b.conv_bn(x, ch(32), 3, 2, act="Relu6")
    cin = ch(32)
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            h = y
            if t != 1:
                h = b.conv_bn(h, cin * t, 1, act="Relu6")
            h = b.conv_bn(h, cin * t, 3, stride, group=cin * t, act="Relu6")
            h = b.conv_bn(h, ch(c), 1, act=None)
            y = b.g.op("Add", y, h) if (stride == 1 and cin == ch(c)) else h
            cin = ch(c)
    y = b.conv_bn(y, 1280, 1, act="Relu6")
    return b.done(b.head(y, classes))


def densenet(size: int = 224, classes: int = 1000, growth: int = 32, blocks=(6, 12, 24, 16), init: int = 64,
             bn_size: int = 4, seed: int = 0) -> Graph:
    """DenseNet (default: DenseNet-121): every layer reads the concatenation of all earlier features."""
    b = Builder("densenet", seed)
    x = b.g.add_input("x", "float32", ("N", 3, size, size))
    y = b.conv_bn(x, init, 7, 2, pad=3)
    y = b.g.op("MaxPool", y, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c = init
    for k, n in enumerate(blocks):
        feats = [y]
        for _ in range(n):
            cat = b.g.op("Concat", *feats, axis=1) if len(feats) > 1 else feats[0]
            h = b.g.op("Relu", b.bn(cat))
            h = b.conv(h, bn_size * growth, 1)
            h = b.g.op("Relu", b.bn(h))
            feats.append(b.conv(h, growth, 3))
            c += growth
        y = b.g.op("Concat", *feats, axis=1)
        if k != len(blocks) - 1:
            c //= 2
            y = b.conv(b.g.op("Relu", b.bn(y)), c, 1)
            y = b.g.op("AveragePool", y, kernel_shape=[2, 2], strides=[2, 2])
    y = b.g.op("Relu", b.bn(y))
    return b.done(b.head(y, classes))


# GoogLeNet's inception blocks: (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj)
_GOOGLENET = [("3a", 64, 96, 128, 16, 32, 32), ("3b", 128, 128, 192, 32, 96, 64), "pool",
              ("4a", 192, 96, 208, 16, 48, 64), ("4b", 160, 112, 224, 24, 64, 64), ("4c", 128, 128, 256, 24, 64, 64),
              ("4d", 112, 144, 288, 32, 64, 64), ("4e", 256, 160, 320, 32, 128, 128), "pool",
              ("5a", 256, 160, 320, 32, 128, 128), ("5b", 384, 192, 384, 48, 128, 128)]


def inception(size: int = 224, classes: int = 1000, config=None, scale: float = 1.0, seed: int = 0) -> Graph:
    """GoogLeNet (Inception v1, with batch norm): four branches per block, concatenated."""
    b = Builder("inception", seed)

    def ch(c):
        return max(4, int(round(c * scale)))

    x = b.g.add_input("x", "float32", ("N", 3, size, size))
    y = b.conv_bn(x, ch(64), 7, 2, pad=3)
    y = b.g.op("MaxPool", y, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y = b.conv_bn(y, ch(64), 1)
    y = b.conv_bn(y, ch(192), 3)
    y = b.g.op("MaxPool", y, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for block in (config or _GOOGLENET):
        if block == "pool":
            y = b.g.op("MaxPool", y, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
            continue
        _, c1, r3, c3, r5, c5, pp = block
        b1 = b.conv_bn(y, ch(c1), 1)
        b2 = b.conv_bn(b.conv_bn(y, ch(r3), 1), ch(c3), 3)
        b3 = b.conv_bn(b.conv_bn(y, ch(r5), 1), ch(c5), 3)  # torchvision uses 3x3 here too
        b4 = b.conv_bn(b.g.op("MaxPool", y, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]), ch(pp), 1)
        y = b.g.op("Concat", b1, b2, b3, b4, axis=1)
    return b.done(b.head(y, classes))


def bert_encoder(seq: int = 128, hidden: int = 768, heads: int = 12, layers: int = 12, ffn: int | None = None,
                 vocab: int = 1000, seed: int = 0) -> Graph:
    """A BERT-style encoder: token + position embeddings, then post-norm transformer layers.

    Input: token ids int64[N, seq]. Output: float32[N, seq, hidden].
    """
    ffn = ffn or 4 * hidden
    dh = hidden // heads
    b = Builder("bert_encoder", seed)
    g = b.g
    ids = g.add_input("ids", "int64", ("N", seq))
    emb = b.const("tok_emb", (b.rng.standard_normal((vocab, hidden)) * 0.02).astype(np.float32))
    pos = b.const("pos_emb", (b.rng.standard_normal((seq, hidden)) * 0.02).astype(np.float32))

    def layer_norm(x):
        gamma = b.const("ln_g", (1 + 0.05 * b.rng.standard_normal(hidden)).astype(np.float32))
        beta = b.const("ln_b", (0.05 * b.rng.standard_normal(hidden)).astype(np.float32))
        return g.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=1e-12)

    split = b.const("split_heads", np.array([0, 0, heads, dh], dtype=np.int64))
    merge = b.const("merge_heads", np.array([0, 0, hidden], dtype=np.int64))
    scale = b.const("scale", np.float32(1.0 / np.sqrt(dh)))
    x = layer_norm(g.op("Add", g.op("Gather", emb, ids, axis=0), pos))
    for _ in range(layers):
        q = g.op("Transpose", g.op("Reshape", b.linear(x, hidden), split), perm=[0, 2, 1, 3])
        k = g.op("Transpose", g.op("Reshape", b.linear(x, hidden), split), perm=[0, 2, 3, 1])
        v = g.op("Transpose", g.op("Reshape", b.linear(x, hidden), split), perm=[0, 2, 1, 3])
        att = g.op("Softmax", g.op("Mul", g.op("MatMul", q, k), scale), axis=-1)
        ctx = g.op("Reshape", g.op("Transpose", g.op("MatMul", att, v), perm=[0, 2, 1, 3]), merge)
        x = layer_norm(g.op("Add", x, b.linear(ctx, hidden)))
        h = g.op("Gelu", b.linear(x, ffn))
        x = layer_norm(g.op("Add", x, b.linear(h, hidden)))
    return b.done(x)


#: the zoo at benchmark size (bs1 inference shapes after binding N)
FULL = {
    "resnet50": lambda: resnet50(),
    "mobilenet_v2": lambda: mobilenet_v2(),
    "densenet": lambda: densenet(),
    "inception": lambda: inception(),
    "bert_encoder": lambda: bert_encoder(),
}

#: small versions for execution tests (same structure, fewer channels / pixels)
SMALL = {
    "resnet50": lambda: resnet50(size=64, width=16, classes=10),
    "mobilenet_v2": lambda: mobilenet_v2(size=64, width_mult=0.5, classes=10),
    "densenet": lambda: densenet(size=64, growth=12, blocks=(4, 6, 4), init=24, classes=10),
    "inception": lambda: inception(size=64, scale=0.25, classes=10),
    "bert_encoder": lambda: bert_encoder(seq=64, hidden=64, heads=4, layers=2, vocab=50),
}


def example_feeds(graph: Graph, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds for a zoo graph at batch size `batch`."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in graph.inputs:
        shape = tuple(batch if isinstance(d, str) else d for d in v.shape)
        if v.dtype == "int64":
            vocab = next(u for u, _ in v.uses).inputs[0].shape[0]
            feeds[v.name] = rng.integers(0, vocab, size=shape, dtype=np.int64)
        else:
            feeds[v.name] = rng.standard_normal(shape).astype(v.dtype)
    return feeds


def breadth_first(graph: Graph) -> Graph:
    """The same graph with its nodes in breadth-first (as-soon-as-possible) order, as some exporters emit
    them: every node as early as its inputs allow, so parallel branches advance side by side."""
    nodes = graph.nodes
    producer = {id(v): n for n in nodes for v in n.outputs}
    depth: dict[int, int] = {}
    for n in nodes:
        depth[id(n)] = 1 + max((depth[id(producer[id(v)])] for v in n.inputs
                                if v is not None and id(v) in producer), default=-1)
    order = sorted(range(len(nodes)), key=lambda i: (depth[id(nodes[i])], i))
    last = nodes[order[0]]  # the first node: depth 0, index 0
    for i in order[1:]:
        graph.move_after(nodes[i], last)
        last = nodes[i]
    graph.verify()
    return graph
