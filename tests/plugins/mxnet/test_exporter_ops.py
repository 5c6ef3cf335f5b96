"""IR ops the importer never produces but passes and other frontends do: each lowered to MXNet and run as
a gluon.SymbolBlock must match the reference executor."""
import numpy as np
import pytest

from aiacc.core import Graph, run
from aiacc.errors import UnsupportedError
from aiacc.plugins.mxnet._import import import_mxnet
from aiacc.plugins.mxnet.exporter import export_symbol
from aiacc.plugins.mxnet.translator import MXNetTranslator

from tests.plugins.mxnet.conftest import rel_err

mx = import_mxnet()
RNG = np.random.default_rng(0)


def rand(*shape, positive=False):
    a = RNG.standard_normal(shape).astype("float32")
    return np.abs(a) + 0.1 if positive else a


def check(g: Graph, feeds: dict):
    g.verify()
    expected = list(run(g, feeds).values())
    block = MXNetTranslator().export(g)
    got = MXNetTranslator().run(block, [feeds[v.name] for v in g.inputs])
    assert len(got) == len(expected)
    for a, e in zip(got, expected):
        assert a.shape == e.shape
        assert rel_err(a, e) < 1e-4, (a, e)
    return export_symbol(g)[0]


def graph(*shapes):
    g = Graph("t")
    xs = [g.add_input(f"x{i}", "float32", s) for i, s in enumerate(shapes)]
    return g, xs


@pytest.mark.parametrize("op,attrs", [("HardSwish", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
                                      ("Gelu", {"approximate": "tanh"}), ("Mish", {}), ("Round", {}),
                                      ("Selu", {"alpha": 1.5, "gamma": 1.1}), ("Softplus", {})])
def test_activations(op, attrs):
    g, (x,) = graph((2, 5))
    g.add_output(g.op(op, x, **attrs))
    check(g, {"x0": rand(2, 5) * 3})


def test_prelu_general_slope_and_clip_with_one_bound():
    g, (x,) = graph((2, 3, 4))
    y = g.op("PRelu", x, g.add_initializer("s", rand(3, 4)))
    g.add_output(g.op("Clip", y, g.add_initializer("lo", np.array(-0.2, np.float32))))
    check(g, {"x0": rand(2, 3, 4)})


@pytest.mark.parametrize("attrs,shapes", [({"alpha": 0.5, "beta": 2.0}, ((3, 4), (4, 5), (5,))),
                                          ({"transA": 1}, ((4, 3), (4, 5), (1, 5))),
                                          ({"transB": 1}, ((3, 4), (5, 4), None))])
def test_gemm(attrs, shapes):
    g, (a,) = graph(shapes[0])
    ins = [a, g.add_initializer("b", rand(*shapes[1]))] + ([g.add_initializer("c", rand(*shapes[2]))]
                                                           if shapes[2] else [])
    g.add_output(g.op("Gemm", *ins, **attrs))
    check(g, {"x0": rand(*shapes[0])})


def test_matmul_variants():
    g, (a, b, c) = graph((2, 3, 4), (1, 4, 5), (4, 6))
    y1 = g.op("MatMul", a, b)              # broadcast batch
    y2 = g.op("MatMul", a, c)              # N-d x non-constant 2-d
    g.add_output(y1)
    g.add_output(g.op("MatMul", y2, g.add_initializer("w", rand(6, 2))))  # constant weight -> FullyConnected
    sym = check(g, {"x0": rand(2, 3, 4), "x1": rand(1, 4, 5), "x2": rand(4, 6)})
    assert "FullyConnected" in [n.op for n in sym.nodes]


def test_asymmetric_pads_become_explicit_pad():
    g, (x,) = graph((1, 2, 7, 7))
    y = g.op("Conv", x, g.add_initializer("w", rand(3, 2, 3, 3)), pads=[0, 1, 1, 2], strides=[2, 2])
    y = g.op("MaxPool", y, kernel_shape=[2, 2], pads=[1, 0, 0, 1])
    g.add_output(g.op("AveragePool", y, kernel_shape=[2, 2], pads=[0, 0, 1, 1], count_include_pad=1))
    sym = check(g, {"x0": rand(1, 2, 7, 7)})
    assert [n.op for n in sym.nodes].count("Pad") == 3


def test_shape_ops():
    g, (x, m) = graph((2, 3, 4), (3, 1))
    f = g.op("Flatten", x, axis=2)                                        # (6, 4)
    e = g.op("Expand", m, g.add_initializer("shape", np.array([2, 3, 4], np.int64)))
    w = g.op("Where", g.op("Greater", x, e), x, g.add_initializer("z", np.zeros((4,), np.float32)))
    parts = g.add_node("Split", [x, g.add_initializer("split", np.array([1, 3], np.int64))], {"axis": 2},
                       outputs=2).outputs
    s = g.op("Slice", x, *[g.add_initializer(n, np.array(v, np.int64)) for n, v in
                           (("st", [2, 0]), ("en", [-100, 9]), ("ax", [2, 1]), ("sp", [-1, 2]))])
    for v in (f, w, parts[0], parts[1], s):
        g.add_output(v)
    check(g, {"x0": rand(2, 3, 4), "x1": rand(3, 1)})


def test_variadic_and_reductions():
    g, (a, b, c) = graph((2, 3), (2, 3), (3,))
    g.add_output(g.op("Sum", a, b, c))
    g.add_output(g.op("Mean", a, b))
    g.add_output(g.op("Max", a, b, c))
    g.add_output(g.op("ReduceMean", a))                                  # every axis
    g.add_output(g.op("ReduceSum", a, g.add_initializer("ax", np.array([1], np.int64)), keepdims=0))
    g.add_output(g.op("Shape", a))
    check(g, {"x0": rand(2, 3), "x1": rand(2, 3), "x2": rand(3)})


def test_layernorm_without_bias():
    g, (x,) = graph((2, 3, 6))
    g.add_output(g.op("LayerNormalization", x, g.add_initializer("s", rand(6)), axis=-1, epsilon=1e-3))
    check(g, {"x0": rand(2, 3, 6)})


def test_fused_ops_lowered():
    g, (x, q) = graph((1, 4, 6, 6), (2, 5, 8))
    w = g.add_initializer("w", rand(4, 4, 3, 3))
    conv = g.add_node("FusedConv", [x, w, g.add_initializer("b", rand(4)), x],
                      {"pads": [1, 1, 1, 1], "activation": "Clip", "activation_params": [0.0, 6.0]},
                      domain="aiacc").output
    gemm = g.add_node("FusedGemm", [g.op("Flatten", conv), g.add_initializer("gw", rand(144, 7)),
                                    g.add_initializer("gb", rand(7))], {"activation": "GeluTanh"},
                      domain="aiacc").output
    att = g.add_node("Attention", [q, q, q], {"scale": 0.35}, domain="aiacc").output
    ew = g.add_node("FusedElementwise", [att, q], {"program": "t0=Mul(i0,i1);t1=Sigmoid(t0)"},
                    domain="aiacc").output
    g.add_output(gemm)
    g.add_output(ew)
    sym = check(g, {"x0": rand(1, 4, 6, 6), "x1": rand(2, 5, 8)})
    ops = [n.op for n in sym.nodes]
    assert ops.count("Convolution") == 1 and "clip" in ops and "FullyConnected" in ops and "batch_dot" in ops


def test_op_without_mxnet_form_is_named():
    g, (x,) = graph((2, 3))
    g.add_output(g.add_node("Custom", [x], {}, domain="other", name="weird0",
                            output_types=[x.type]).output)
    with pytest.raises(UnsupportedError, match=r"node weird0 \(other::Custom\) has no MXNet form"):
        export_symbol(g)
