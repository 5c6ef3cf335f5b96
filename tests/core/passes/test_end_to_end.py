"""A ResNet-style graph through the whole pipeline."""
import numpy as np
import pytest

from aiacc.core import Graph, parse, run
from aiacc.core.ops.fused import decompose_all
from aiacc.core.passes import random_feeds, run_passes
from aiacc.core.runtime.numba_kernels import run_fast


def resnet_like(seed=0, width=8, classes=5):
    rng = np.random.default_rng(seed)
    g = Graph("resnet_like")
    x = g.add_input("x", "float32", ("N", 3, 16, 16))
    count = [0]

    def const(shape, scale=1.0, positive=False):
        count[0] += 1
        a = rng.uniform(0.5, 1.5, shape) if positive else rng.standard_normal(shape) * scale
        return g.add_initializer(f"p{count[0]}", a.astype(np.float32))

    def conv_bn(v, cin, cout, k, stride=1, relu=True):
        w = const((cout, cin, k, k), scale=(2.0 / (cin * k * k)) ** 0.5)
        y = g.op("Conv", v, w, pads=[k // 2] * 4, strides=[stride, stride])
        y = g.op("BatchNormalization", y, const(cout, positive=True), const(cout, 0.1), const(cout, 0.1),
                 const(cout, positive=True), epsilon=1e-5)
        return g.op("Relu", y) if relu else y

    def block(v, cin, cout, stride):
        y = conv_bn(v, cin, cout, 3, stride)
        y = conv_bn(y, cout, cout, 3, relu=False)
        short = v if stride == 1 and cin == cout else conv_bn(v, cin, cout, 1, stride, relu=False)
        return g.op("Relu", g.op("Add", y, short))

    y = conv_bn(x, 3, width, 3)
    y = g.op("MaxPool", y, kernel_shape=[2, 2], strides=[2, 2])
    y = block(y, width, width, 1)
    y = block(y, width, 2 * width, 2)
    y = g.op("GlobalAveragePool", y)
    y = g.op("Flatten", y)
    y = g.op("MatMul", y, const((2 * width, classes), 0.3))
    y = g.op("Add", y, const((classes,), 0.1))
    g.add_output(g.op("Softmax", y, name="probs"))
    g.verify()
    return g


def _relu_after_conv(g):
    return [n.name for n in g if n.op == "Relu" and n.inputs[0].producer is not None
            and n.inputs[0].producer.op in ("Conv", "FusedConv")]


def _rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30))


def test_resnet_like_level2():
    g = resnet_like()
    feeds = random_feeds(g)
    ref = run(g, feeds)["probs"]
    report = run_passes(g, level=2)
    g.verify()
    hist = g.op_histogram()
    assert "BatchNormalization" not in hist
    assert "Relu" not in hist and _relu_after_conv(g) == []
    assert hist["aiacc::FusedConv"] == 5 and hist["Conv"] == 1 and hist["Gemm"] == 1  # the 1x1 shortcut conv is the residual
    residual = [n for n in g if n.op == "FusedConv" and len(n.inputs) == 4]
    assert len(residual) == 2 and all(n.attrs["activation"] == "Relu" for n in residual)
    out = run(g, feeds)["probs"]
    assert _rel_err(ref, out) < 1e-4
    assert report["batchnorm_folding"].removed == 12 and report.nodes_after < report.nodes_before


def test_resnet_like_level3_and_debug_and_decompose():
    g = resnet_like(seed=1)
    feeds = random_feeds(g, seed=1)
    ref = run(g, feeds)["probs"]
    run_passes(g, level=3, debug=True, feeds=feeds)
    assert _rel_err(ref, run(g, feeds)["probs"]) < 1e-4
    assert _rel_err(ref, run_fast(g, feeds)["probs"]) < 1e-4
    weights = {k: v.const for k, v in g.initializers.items()}
    assert parse(str(g), weights).equals(g)  # fused ops round-trip through the text form
    decompose_all(g)
    g.verify()
    assert not any(n.domain == "aiacc" for n in g) and "BatchNormalization" not in g.op_histogram()
    assert _rel_err(ref, run(g, feeds)["probs"]) < 1e-4


@pytest.mark.parametrize("level", [0, 1])
def test_low_levels_keep_batchnorm(level):
    g = resnet_like()
    run_passes(g, level=level)
    assert g.op_histogram()["BatchNormalization"] == 6


def keras_resnet_stem(seed=0, width=8):
    """What the TF importer hands over for a Keras ResNet stem and one identity block: ZeroPadding2D in NHWC
    before the transpose to NCHW, Conv + BiasAdd, batch norm as Mul and Add by per-channel constants, a
    zero-padded MaxPool after the Relu."""
    rng = np.random.default_rng(seed)
    g = Graph("keras_stem")
    x = g.add_input("x", "float32", ("N", 16, 16, 3))

    def c(*shape, positive=False):
        a = rng.uniform(0.5, 1.5, shape) if positive else rng.standard_normal(shape) * 0.3
        return g.add_initializer(g.fresh_name("p"), a.astype(np.float32))

    def conv_bn(v, cin, cout, k, pads, relu=True):
        y = g.op("Conv", v, c(cout, cin, k, k), pads=pads)
        y = g.op("Add", y, c(1, cout, 1, 1))  # BiasAdd
        y = g.op("Add", g.op("Mul", y, c(1, cout, 1, 1, positive=True)), c(1, cout, 1, 1))  # batch norm
        return g.op("Relu", y) if relu else y

    p = g.op("Pad", x, g.add_initializer("pads", np.array([0, 3, 3, 0, 0, 3, 3, 0], np.int64)))
    y = conv_bn(g.op("Transpose", p, perm=[0, 3, 1, 2]), 3, width, 7, [0, 0, 0, 0])
    y = g.op("Pad", y, g.add_initializer("pads2", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)))
    y = g.op("MaxPool", y, kernel_shape=[3, 3], strides=[2, 2])
    z = conv_bn(y, width, width, 3, [1, 1, 1, 1])
    z = conv_bn(z, width, width, 3, [1, 1, 1, 1], relu=False)
    g.add_output(g.op("Relu", g.op("Add", z, y)))
    return g


@pytest.mark.parametrize("level", [2, 3])
def test_keras_resnet_stem_keeps_no_pad_mul_add_or_relu(level):
    g = keras_resnet_stem()
    feeds = random_feeds(g, seed=1)
    before = run(g, feeds)
    run_passes(g, level=level, debug=True, feeds=feeds)
    hist = g.op_histogram()
    assert hist == {"Transpose": 1, "aiacc::FusedConv": 3, "MaxPool": 1}, hist
    after = run(g, feeds)
    name = g.outputs[0].name
    np.testing.assert_allclose(after[name], before[name], rtol=1e-4, atol=1e-4)
