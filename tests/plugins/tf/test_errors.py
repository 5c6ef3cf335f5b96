"""Bad input gets a clear aiacc error naming what is wrong."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import aiacc  # noqa: E402
import aiacc.plugins.tf as tfplugin  # noqa: E402
from aiacc.core import Graph  # noqa: E402
from aiacc.core.ir import TensorType  # noqa: E402
from aiacc.errors import AiaccError, ShapeError, UnsupportedError  # noqa: E402
from tests.zoo import tf_models as zoo  # noqa: E402


def test_non_tf_object():
    with pytest.raises(UnsupportedError, match="does not know what framework"):
        aiacc.optimize(object(), np.zeros(3))
    with pytest.raises(UnsupportedError, match="builtins.dict is not a Keras model, tf.Module"):
        tfplugin.trace({"not": "a model"}, np.zeros(3))


def test_module_without_tf_function():
    class Plain(tf.Module):
        def __call__(self, x):
            return x * 2

    with pytest.raises(UnsupportedError, match="Plain has no tf.function __call__"):
        aiacc.trace(Plain(), np.zeros((2, 2), np.float32))


def test_wrong_input_shape_for_keras_model():
    model, _ = zoo.mlp()
    bad = np.zeros((3, 21), np.float32)
    with pytest.raises(ShapeError, match=r"expects shape \[None, 20\], the example input has shape \[3, 21\]"):
        aiacc.optimize(model, bad)


def test_wrong_rank_and_dtype_for_signature():
    module, _ = zoo.mlp_module()
    with pytest.raises(ShapeError, match=r"expects shape \[None, 8\], the example input has shape \[8\]"):
        aiacc.trace(module, np.zeros(8, np.float32))
    with pytest.raises(ShapeError, match="expects dtype float32, the example input is int32"):
        aiacc.trace(module, np.zeros((2, 8), np.int32))
    with pytest.raises(ShapeError, match="takes 1 inputs, 2 example inputs were given"):
        aiacc.trace(module, (np.zeros((2, 8), np.float32), np.zeros((2, 8), np.float32)))


def test_unsupported_input_dtype():
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def lengths(s):
        return tf.strings.length(s)

    with pytest.raises(UnsupportedError, match="dtype string is not supported"):
        aiacc.trace(lengths)


def test_unsupported_intermediate_dtype_names_the_node():
    @tf.function(input_signature=[tf.TensorSpec([4], tf.float32)])
    def magnitude(x):
        return tf.abs(tf.complex(x, x))

    with pytest.raises(UnsupportedError, match=r"TF node Complex \(Complex\) output 0: dtype complex64"):
        aiacc.trace(magnitude)


def test_tf_function_without_signature_needs_examples():
    @tf.function
    def double(x):
        return x * 2

    with pytest.raises(UnsupportedError, match="has no input_signature: pass example inputs"):
        aiacc.trace(double)


def test_export_refuses_ops_without_a_tf_lowering():
    g = Graph("custom")
    x = g.add_input("x", "float32", ("N", 4))
    node = g.add_node("Frobnicate", [x], domain="custom.vendor", name="frob",
                      output_types=[TensorType("float32", ("N", 4))])
    g.add_output(node.output)
    with pytest.raises(UnsupportedError, match=r"node frob \(custom.vendor::Frobnicate\) has no TensorFlow lowering"):
        aiacc.export(g, "tf")


def test_unknown_backend():
    model, x = zoo.mlp()
    with pytest.raises(AiaccError, match="no backend 'tensorrt-9'"):
        aiacc.optimize(model, x, backend="tensorrt-9")
