"""TF -> IR: the traced graphs of the zoo models compute what TF computes (on the reference executor),
CNNs become NCHW IR with one layout change at the input, and untranslated ops stay opaque."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import aiacc  # noqa: E402
from aiacc.core import parse, run  # noqa: E402
from aiacc.plugins.tf import translator  # noqa: E402
from tests.zoo import tf_models as zoo  # noqa: E402


def _close(expected, actual, rtol=1e-4):
    for e, a in zip(expected, actual):
        scale = max(float(np.max(np.abs(e))), 1e-30)
        assert e.shape == a.shape
        assert float(np.max(np.abs(e - a))) <= 1e-5 + rtol * scale


def _run_ir(graph, example):
    xs = example if isinstance(example, (list, tuple)) else [example]
    outs = run(graph, {v.name: x for v, x in zip(graph.inputs, xs)})
    return [outs[v.name] for v in graph.outputs]


@pytest.mark.parametrize("name", ["mlp", "small_cnn", "bert_encoder", "mlp_module", "opaque_function"])
def test_traced_graph_matches_tf(name):
    model, x = zoo.TF_ZOO[name]()
    graph = aiacc.trace(model, x)
    graph.verify()
    _close(translator.run(model, x), _run_ir(graph, x))


def test_cnn_is_nchw_with_one_transpose_at_the_input():
    model, x = zoo.small_cnn()
    graph = aiacc.trace(model, x)
    (inp,) = graph.inputs
    assert inp.shape == ("N", 24, 24, 3)  # the graph input keeps TF's NHWC signature
    first = inp.users()
    assert [n.op for n in first] == ["Transpose"] and first[0].attrs["perm"] == [0, 3, 1, 2]
    convs = graph.find_nodes("Conv")
    assert convs and all(n.inputs[1].shape[1:] in ((3, 3, 3), (3, 5, 5), (1, 3, 3), (24, 1, 1), (16, 1, 1),
                                                   (12, 1, 1))
                         for n in convs)
    assert convs[0].inputs[0].shape == ("N", 3, 24, 24)
    # the concat of the two conv branches is on the channel axis of NCHW
    assert graph.find_nodes("Concat")[0].attrs["axis"] == 1


def test_bert_shape_arithmetic_folds_into_constant_reshapes():
    model, x = zoo.bert_encoder()
    graph = aiacc.trace(model, x)
    hist = graph.op_histogram()
    assert not any(op in hist for op in ("Shape", "ReduceProd", "Slice")), hist
    for node in graph.find_nodes("Reshape"):
        assert node.inputs[1].const is not None and list(node.inputs[1].const).count(-1) <= 1
    assert hist["MatMul"] == 16  # q, k, v, out projections, scores, context, 2 ffn per layer


def test_opaque_op_keeps_its_node_def_and_text_round_trips():
    model, x = zoo.opaque_function()
    graph = aiacc.trace(model, x)
    (cumsum,) = [n for n in graph if n.is_opaque]
    assert (cumsum.domain, cumsum.op, cumsum.attrs["tf_op"]) == ("tf", "Cumsum", "Cumsum")
    assert cumsum.meta["node_def"].op == "Cumsum"
    text = str(graph)
    again = parse(text, {k: v.const for k, v in graph.initializers.items()})
    assert str(again) == text


def test_dynamic_batch_stays_symbolic():
    model, x = zoo.mlp()
    graph = aiacc.trace(model, x)
    assert graph.inputs[0].shape == ("N", 20)
    x5 = np.random.default_rng(1).standard_normal((5, 20)).astype(np.float32)
    _close(translator.run(model, x5), _run_ir(graph, x5))


def test_keras_model_without_example_inputs_uses_its_input_shapes():
    model, x = zoo.mlp()
    graph = aiacc.trace(model)
    assert graph.inputs[0].shape == ("N", 20) and graph.inputs[0].dtype == "float32"


def test_concrete_function_and_tf_function_without_signature():
    rng = np.random.default_rng(0)
    w = tf.constant(rng.standard_normal((4, 3)).astype(np.float32))

    @tf.function
    def f(x):
        return tf.nn.sigmoid(tf.matmul(x, w))

    x = rng.standard_normal((2, 4)).astype(np.float32)
    g1 = aiacc.trace(f, x)
    assert g1.inputs[0].shape == (2, 4)
    cf = f.get_concrete_function(tf.TensorSpec([None, 4], tf.float32))
    g2 = aiacc.trace(cf)
    assert g2.inputs[0].shape == ("N", 4)
    _close([f(x).numpy()], _run_ir(g2, x))
