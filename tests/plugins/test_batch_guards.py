"""Batch sizes in TF and MXNet: verify runs the original and the optimized model at a second batch size. A
model that runs there says so in the report; one specialized to its example's batch size says that, and
calling it with another size is an aiacc ShapeError naming the input and the size it was built for (never
a wrong answer, nor an error from inside TF, MXNet or onnxruntime). Both backends each."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import aiacc
from aiacc.errors import ShapeError
from tests.plugins._guard_helpers import optimize_quietly as _optimize, rand as _rand

needs_tf = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="tensorflow is not installed")
needs_mxnet = pytest.mark.skipif(importlib.util.find_spec("mxnet") is None, reason="mxnet is not installed")

RUNS = "batch: traced at 1, runs at other sizes (checked at batch 5: same outputs)"


# ------------------------------------------------------------------------------------------------ TF
@needs_tf
@pytest.mark.parametrize("backend", ["native", "onnxruntime"])
def test_keras_functional_model_traced_at_batch_1_runs_at_batch_5(backend):
    import tensorflow as tf

    tf.keras.utils.set_random_seed(3)
    inp = tf.keras.Input((6, 6, 2), name="image")
    h = tf.keras.layers.Conv2D(3, 3, padding="same", activation="relu")(inp)
    h = tf.keras.layers.Flatten()(h)
    model = tf.keras.Model(inp, tf.keras.layers.Dense(4)(h))
    fast = _optimize(model, [_rand(1, 6, 6, 2)], backend=backend)
    assert fast.aiacc_report.interface == [RUNS]
    x5 = _rand(5, 6, 6, 2, seed=1)
    np.testing.assert_allclose(np.asarray(fast(x5)), model(x5).numpy(), rtol=1e-4, atol=1e-5)


def _scorer(signature):
    import tensorflow as tf

    class Scorer(tf.Module):
        def __init__(self):
            self.w = tf.Variable(tf.reshape(tf.range(12, dtype=tf.float32) / 10.0, [4, 3]))

        @tf.function(input_signature=signature)
        def __call__(self, x):
            return tf.nn.softmax(tf.reshape(x, [-1, 4]) @ self.w)
    return Scorer()


@needs_tf
def test_tf_module_with_a_dynamic_signature_runs_at_any_batch():
    import tensorflow as tf

    model = _scorer([tf.TensorSpec([None, 4], tf.float32, name="feat")])
    fast = _optimize(model, [_rand(1, 4)])
    assert fast.aiacc_report.interface == [RUNS]
    assert fast.__call__.input_signature[0].shape.as_list() == [None, 4]
    x5 = _rand(5, 4, seed=1)
    np.testing.assert_allclose(fast(x5).numpy(), model(x5).numpy(), rtol=1e-5, atol=1e-6)


@needs_tf
@pytest.mark.parametrize("backend", ["native", "onnxruntime"])
def test_tf_function_without_signature_is_specialized_and_says_so(backend):
    """A tf.function without an input_signature is traced at the example's shapes (aiacc.trace's contract):
    the optimized module takes that batch size only, says so, and any other is an aiacc ShapeError."""
    model, x1 = _scorer(None), _rand(1, 4)
    fast = _optimize(model, [x1], backend=backend)
    (line,) = fast.aiacc_report.interface
    assert line.startswith("batch: specialized to 1 (at batch 5: ")
    np.testing.assert_allclose(fast(x1).numpy(), model(x1).numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ShapeError, match=r"input 'x' of shape \[5, 4\]: its dimension 0 must be 1, the batch size"):
        fast(_rand(5, 4))


def _keras_batch_in_python():
    import tensorflow as tf

    class RowMajor(tf.keras.Model):  # x.shape[0] in Python: traceable only at a known batch size
        def __init__(self):
            super().__init__()
            self.fc = tf.keras.layers.Dense(3)

        def call(self, x):
            return self.fc(tf.reshape(x, [x.shape[0], -1]))
    tf.keras.utils.set_random_seed(0)
    return RowMajor()


@needs_tf
@pytest.mark.parametrize("backend", ["native", "onnxruntime"])
def test_tf_model_specialized_to_its_batch_refuses_another_size(backend, tmp_path):
    import tensorflow as tf

    model, x1 = _keras_batch_in_python(), _rand(1, 2, 4)
    fast = _optimize(model, [x1], backend=backend)
    (line,) = fast.aiacc_report.interface
    assert line.startswith("batch: specialized to 1 (at batch 5: ") and line.endswith(
        "calling it with another batch size is a ShapeError")
    np.testing.assert_allclose(np.asarray(fast(x1)), model(x1).numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ShapeError, match=r"input '\w+' of shape \[5, 2, 4\]: its dimension 0 must be 1"):
        fast(_rand(5, 2, 4))
    assert fast.__call__.input_signature[0].shape.as_list() == [1, 2, 4]  # the tf.function behind the guard
    if backend == "native":  # the guarded module still saves as a SavedModel callable like the original
        tf.saved_model.save(fast, str(tmp_path / "guarded"))
        loaded = tf.saved_model.load(str(tmp_path / "guarded"))
        np.testing.assert_allclose(loaded(x1).numpy(), model(x1).numpy(), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------ MXNet
def _mx():
    from aiacc.plugins.mxnet._import import import_mxnet

    return import_mxnet()


@needs_mxnet
def test_gluon_block_traced_at_batch_1_runs_at_batch_5_natively():
    mx = _mx()
    nn = mx.gluon.nn
    net = nn.HybridSequential()
    net.add(nn.Conv2D(4, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"), nn.Flatten(), nn.Dense(5))
    net.initialize(mx.init.Xavier(magnitude=2.0))
    net.hybridize()
    x1 = _rand(1, 2, 5, 5)
    net(mx.nd.array(x1))
    fast = _optimize(net, [x1])
    assert fast.aiacc_report.interface == [RUNS]
    x5 = mx.nd.array(_rand(5, 2, 5, 5, seed=1))
    np.testing.assert_allclose(fast(x5).asnumpy(), net(x5).asnumpy(), rtol=1e-4, atol=1e-5)


def _per_row_block():
    mx = _mx()

    class PerRow(mx.gluon.HybridBlock):  # each row plus its index: the importer's static shapes fold the index
        def hybrid_forward(self, F, x):
            return F.broadcast_add(x, F.reshape(F.contrib.arange_like(x, axis=0), shape=(-1, 1)))
    block = PerRow()
    block.initialize()
    block.hybridize()
    return block


@needs_mxnet
@pytest.mark.parametrize("backend", ["native", "onnxruntime"])
def test_gluon_block_specialized_to_its_batch_refuses_another_size(backend):
    mx = _mx()
    block, x1 = _per_row_block(), _rand(1, 4)
    fast = _optimize(block, [x1], backend=backend)
    (line,) = fast.aiacc_report.interface
    assert line.startswith("batch: specialized to 1 (at batch 5: ")
    np.testing.assert_allclose(fast(mx.nd.array(x1)).asnumpy(), block(mx.nd.array(x1)).asnumpy())
    with pytest.raises(ShapeError, match=r"input 'data' of shape \[5, 4\]: its dimension 0 must be 1, the batch "
                                         r"size the model was built for"):
        fast(mx.nd.array(_rand(5, 4)))


@needs_mxnet
def test_mxnet_symbol_triple_reports_its_batch_behaviour():
    mx = _mx()
    data = mx.sym.var("data")
    fc = mx.sym.FullyConnected(data, num_hidden=3, name="fc")
    sym = mx.sym.Activation(fc, act_type="tanh", name="act")
    args = {"fc_weight": mx.nd.array(_rand(3, 4)), "fc_bias": mx.nd.array(_rand(3, seed=2))}
    fast = _optimize((sym, args, {}), {"data": _rand(1, 4)})
    assert fast.aiacc_report.interface == [RUNS]
    x5 = _rand(5, 4, seed=1)
    want = np.tanh(x5 @ args["fc_weight"].asnumpy().T + args["fc_bias"].asnumpy())
    np.testing.assert_allclose(fast(mx.nd.array(x5)).asnumpy(), want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------ ONNX
needs_ort = pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="onnxruntime is not installed")


def _onnx_mlp():
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(_rand(4, 3), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@needs_ort
def test_onnx_dynamic_batch_survives_and_is_checked_at_another_size(monkeypatch):
    import onnxruntime as ort

    from aiacc.plugins.onnx.translator import PLUGIN

    checked = []
    run = PLUGIN.run
    monkeypatch.setattr(PLUGIN, "run", lambda m, x: checked.append(_first(x)) or run(m, x))
    model = _onnx_mlp()
    fast = _optimize(model, [_rand(1, 4)])
    assert checked == [1, 1, 5, 5]  # verify at the example's batch, then both models at batch 5
    assert fast.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    x5 = _rand(5, 4, seed=1)
    got = ort.InferenceSession(fast.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x5})
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x5})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


def _first(x):
    return int(np.shape(x[0] if isinstance(x, (list, tuple)) else x)[0])


@needs_ort
def test_onnx_guard_declares_the_batch_so_runtimes_refuse_other_sizes():
    import onnxruntime as ort

    from aiacc.plugins.onnx.translator import PLUGIN

    model = _onnx_mlp()
    assert PLUGIN.guard_batch(model, 1, "specialized")
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session.run(None, {"x": _rand(1, 4)})
    with pytest.raises(Exception, match=r"(?i)invalid dimensions for input: x"):
        session.run(None, {"x": _rand(5, 4)})


# ------------------------------------------------------------------------------------------------ Caffe
_NET = """name: "fixed"
layer { name: "in" type: "Input" top: "img" input_param { shape { dim: 1 dim: 2 dim: 5 dim: 5 } } }
layer { name: "cv" type: "Convolution" bottom: "img" top: "c" convolution_param { num_output: 3 kernel_size: 3 } }
layer { name: "act" type: "ReLU" bottom: "c" top: "feat" }
"""


@needs_ort
@pytest.mark.parametrize("backend", ["native", "onnxruntime"])
def test_caffe_net_declares_its_batch_and_both_nets_refuse_another(backend):
    from aiacc.plugins.caffe import CaffeModel

    net = CaffeModel.from_text(_NET).fill_random()
    fast = _optimize(net, {"img": _rand(1, 2, 5, 5)}, backend=backend)
    assert fast.aiacc_report.interface == ["batch: traced at 1; the original does not run at batch 5 either "
                                           "(ShapeError), so other sizes were not checked"]
    with pytest.raises(ShapeError, match=r"'img'.*\[5, 2, 5, 5\]"):
        fast.forward(img=_rand(5, 2, 5, 5))


@needs_mxnet
def test_gluon_reshape_fixed_at_the_example_batch_is_refused_before_mxnet_runs_it():
    """GroupNorm reshapes to (batch, groups, -1) and back: the exported symbol holds the example's batch in its
    Reshape targets, and MXNet's Reshape does not check element counts (its kernel crashed the process at
    another batch size). Shape inference finds it before anything runs."""
    mx = _mx()
    block = mx.gluon.nn.GroupNorm(num_groups=2)
    block.initialize()
    block.hybridize()
    x1 = _rand(2, 4, 3, 3)
    fast = _optimize(block, [x1])
    (line,) = fast.aiacc_report.interface
    assert line.startswith("batch: specialized to 2 (at batch 6: ")
    np.testing.assert_allclose(fast(mx.nd.array(x1)).asnumpy(), block(mx.nd.array(x1)).asnumpy(), rtol=1e-4,
                               atol=1e-5)
    with pytest.raises(ShapeError, match=r"input 'data' of shape \[6, 4, 3, 3\]: its dimension 0 must be 2"):
        fast(mx.nd.array(_rand(6, 4, 3, 3)))


@needs_mxnet
def test_mxnet_file_specialized_to_its_batch_says_so_and_strict_refuses(tmp_path):
    from aiacc.errors import AiaccWarning, FallbackError, collecting_fallbacks
    from aiacc.plugins.mxnet.files import optimize_file

    mx = _mx()
    data = mx.sym.var("data", shape=(1, 4))
    per_row = mx.sym.broadcast_add(data, mx.sym.reshape(mx.sym.contrib.arange_like(data, axis=0), shape=(-1, 1)))
    per_row.save(str(tmp_path / "per_row-symbol.json"))
    with pytest.warns(AiaccWarning, match=r"holds only at batch 1"):
        report = optimize_file(str(tmp_path / "per_row-symbol.json"), str(tmp_path / "out"))
    assert report.verified.startswith("verified: ") and "; specialized to batch 1 (at batch 5: " in report.verified
    with pytest.raises(FallbackError, match=r"holds only at batch 1"), collecting_fallbacks(True):
        optimize_file(str(tmp_path / "per_row-symbol.json"), str(tmp_path / "out2"))
