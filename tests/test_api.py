"""The top-level API: framework detection and dispatch (aiacc/__init__.py, aiacc/plugins/__init__.py)."""
import numpy as np
import pytest

import aiacc
from aiacc.errors import UnsupportedError
from aiacc.plugins import framework_of


def test_unknown_object_gets_a_clear_error():
    with pytest.raises(UnsupportedError, match="does not know what framework a builtins.dict"):
        aiacc.optimize({"not": "a model"}, None)


def test_detects_torch_module():
    torch = pytest.importorskip("torch")
    assert framework_of(torch.nn.Linear(2, 3)) == "torch"


def test_detects_keras_model_tf_function_and_restored_savedmodel(tmp_path):
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    assert framework_of(model) == "tf"
    fn = tf.function(lambda x: x * 2.0)
    assert framework_of(fn) == "tf"

    class Doubler(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
        def __call__(self, x):
            return x * 2.0

    assert framework_of(Doubler()) == "tf"
    tf.saved_model.save(Doubler(), str(tmp_path / "sm"))
    assert framework_of(tf.saved_model.load(str(tmp_path / "sm"))) == "tf"


def test_detects_mxnet_block_symbol_and_triple():
    from aiacc.plugins.mxnet._import import import_mxnet

    mx = import_mxnet()
    assert framework_of(mx.gluon.nn.Dense(2)) == "mxnet"
    sym = mx.sym.Variable("data")
    assert framework_of(sym) == "mxnet"
    assert framework_of((sym, {}, {})) == "mxnet"


def test_detects_onnx_model():
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph)
    assert framework_of(model) == "onnx"
    g = aiacc.trace(model)
    out = aiacc.core.run(g, {"x": np.array([-1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(out["y"], [0.0, 2.0])


def test_optimize_onnx_model_returns_onnx_that_matches():
    ort = pytest.importorskip("onnxruntime")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    scale = numpy_helper.from_array(rng.uniform(0.5, 1.5, 4).astype(np.float32), "s")
    bias = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    mean = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "m")
    var = numpy_helper.from_array(rng.uniform(0.5, 1.5, 4).astype(np.float32), "v")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [w, scale, bias, mean, var])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    fast = aiacc.optimize(model, [x])
    assert isinstance(fast, onnx.ModelProto)
    ops = [n.op_type for n in fast.graph.node]
    assert "BatchNormalization" not in ops
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    np.testing.assert_allclose(run(fast), run(model), rtol=1e-4, atol=1e-5)
