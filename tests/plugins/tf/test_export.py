"""IR -> TF on graphs built directly in the IR (NCHW, as the ONNX bridge or the passes leave them):
the exported tf.Module computes what the reference executor computes, aiacc fused ops lower to the TF
chains Grappler fuses (or to their decomposition), and NCHW graphs pay for their layout only at the inputs."""
import collections

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import aiacc  # noqa: E402
from aiacc.core import Graph, run  # noqa: E402
from aiacc.core.passes import run_passes  # noqa: E402
from tests.zoo import ir_models  # noqa: E402


def _close(e, a, rtol=1e-4):
    assert e.shape == a.shape
    assert float(np.max(np.abs(e - a))) <= 1e-5 + rtol * max(float(np.max(np.abs(e))), 1e-30)


def _ops(module):
    return collections.Counter(op.type for op in module.__call__.get_concrete_function().graph.get_operations())


def _check(graph, feeds, rtol=1e-4):
    """The TF module aiacc exports for `graph`, checked equal to the reference run on `feeds` (rtol)."""
    expected = run(graph, feeds)
    module = aiacc.export(graph, "tf")
    out = module(*[feeds[v.name] for v in graph.inputs])
    outs = out if isinstance(out, (list, tuple)) else [out]
    for v, o in zip(graph.outputs, outs):
        _close(expected[v.name], np.asarray(o), rtol)
    return module


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "inception"])
@pytest.mark.parametrize("level", [0, 2])
def test_ir_cnns_export(name, level):
    graph = {"resnet50": lambda: ir_models.resnet50(size=32, width=8, layers=(1, 1, 1, 1), classes=10),
             "mobilenet_v2": lambda: ir_models.mobilenet_v2(size=32, width_mult=0.35, classes=10),
             "inception": lambda: ir_models.inception(size=32, scale=0.125, classes=10)}[name]()
    run_passes(graph, level=level)
    module = _check(graph, ir_models.example_feeds(graph, batch=2))
    ops = _ops(module)
    assert ops["Transpose"] == 1, ops  # the NCHW graph input, once; everything after runs NHWC
    if level == 2 and graph.find_nodes("FusedConv", "aiacc"):
        assert ops["Conv2D"] + ops["DepthwiseConv2dNative"] == len(graph.find_nodes("FusedConv", "aiacc")) + \
            len(graph.find_nodes("Conv"))


@pytest.mark.parametrize("level", [0, 2])
def test_ir_bert_export(level):
    graph = ir_models.bert_encoder(seq=8, hidden=16, heads=2, layers=1, vocab=20)
    run_passes(graph, level=level)
    _check(graph, ir_models.example_feeds(graph, batch=2))


def _conv_graph(activation, params, residual=True):
    rng = np.random.default_rng(0)
    g = Graph("fused")
    x = g.add_input("x", "float32", ("N", 4, 8, 8))
    w = g.add_initializer("w", rng.standard_normal((6, 4, 3, 3)).astype(np.float32))
    b = g.add_initializer("b", rng.standard_normal(6).astype(np.float32))
    r = g.add_input("r", "float32", ("N", 6, 4, 4)) if residual else None
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "activation": activation}
    if params is not None:
        attrs["activation_params"] = params
    y = g.op("FusedConv", x, w, b, r, domain="aiacc", **attrs)
    g.add_output(g.op("Relu", y))
    feeds = {"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32)}
    if residual:
        feeds["r"] = rng.standard_normal((2, 6, 4, 4)).astype(np.float32)
    return g, feeds


@pytest.mark.parametrize("activation,params", [("Relu", None), ("Clip", [0.0, 6.0]), ("LeakyRelu", [0.2]),
                                               ("Sigmoid", None), ("", None), ("GeluTanh", None)])
def test_fused_conv_lowering(activation, params):
    graph, feeds = _conv_graph(activation, params)
    module = _check(graph, feeds)
    ops = _ops(module)
    assert ops["Conv2D"] == 1 and ops["BiasAdd"] == 1
    if not activation.startswith("Gelu"):  # tf.nn.gelu has adds of its own
        assert ops["AddV2"] == 1  # the residual
    assert ops["Transpose"] == 3  # x and r come in NCHW; the output goes back to NCHW


def test_fused_gemm_attention_and_elementwise():
    rng = np.random.default_rng(1)
    g = Graph("fused2")
    a = g.add_input("a", "float32", ("N", 8))
    w = g.add_initializer("w", rng.standard_normal((8, 12)).astype(np.float32))
    c = g.add_initializer("c", rng.standard_normal(12).astype(np.float32))
    h = g.op("FusedGemm", a, w, c, domain="aiacc", activation="Gelu")
    q = g.op("Reshape", h, g.add_initializer("s", np.array([0, 3, 4], np.int64)))
    att = g.op("Attention", q, q, q, domain="aiacc", scale=0.5)
    y = g.op("FusedElementwise", att, g.add_initializer("k", np.float32(2.0)), domain="aiacc",
             program="t0=Mul(i0,i1);t1=Tanh(t0)")
    g.add_output(y)
    module = _check(g, {"a": rng.standard_normal((3, 8)).astype(np.float32)})
    ops = _ops(module)
    assert ops["MatMul"] == 1 and ops["BiasAdd"] == 1 and ops["Softmax"] == 1
