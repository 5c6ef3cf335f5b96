"""backend="onnxruntime" for Caffe: aiacc.optimize returns an OrtCaffeModel whose forward() equals the
original CaffeModel's within 1e-4 relative; opaque layers run between onnxruntime sessions."""
import numpy as np
import pytest

import aiacc
from aiacc.errors import ShapeError
from aiacc.plugins.caffe import CaffeModel, OrtCaffeModel, register_layer, unregister_layer
from tests.zoo import caffe_models as zoo

pytest.importorskip("onnxruntime")


def _inputs(model, seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in model.inputs.items()}


def _assert_close(expected: dict, actual: dict):
    assert list(actual) == list(expected)
    for name, e in expected.items():
        a = actual[name]
        assert a.shape == e.shape, name
        scale = float(np.max(np.abs(e)))
        assert float(np.max(np.abs(a - e))) <= 1e-4 * scale + 1e-6, name


@pytest.mark.parametrize("name", ["lenet", "resnet", "squeezenet", "alexnet"])
def test_optimized_net_runs_in_onnxruntime(name):
    model = zoo.build(name)
    x = _inputs(model)
    fast = aiacc.optimize(model, x, backend="onnxruntime")
    assert isinstance(fast, OrtCaffeModel)
    assert fast.runner.num_opaque == 0 and len(fast.runner.sessions) == 1
    assert fast.outputs == model.outputs
    _assert_close(model.forward(**x), fast.forward(**x))
    # other inputs than the example ones, passed positionally
    y = _inputs(model, seed=1)
    _assert_close(model.forward(**y), fast.forward(*y.values()))


def test_resnet_is_fused_before_it_reaches_onnxruntime():
    model = zoo.build("resnet")
    fast = aiacc.optimize(model, _inputs(model), backend="onnxruntime")
    ops = [n.op for n in fast.graph]
    assert "BatchNormalization" not in ops
    assert len(ops) < len(model.graph.nodes)


def channel_gate(layer, x, gate):
    floor = eval(layer.python_param.param_str)["floor"]  # noqa: S307 (test data)
    return x * np.maximum(gate, floor).reshape(1, -1, 1, 1)


@pytest.fixture
def gate_kernel():
    register_layer("Python", channel_gate)
    yield
    unregister_layer("Python")


def test_opaque_layer_runs_between_sessions(gate_kernel):
    model = zoo.build("unknown")
    x = _inputs(model)
    fast = aiacc.optimize(model, x, backend="onnxruntime")
    kinds = ["ort" if s.graph is not None else s.node.op for s in fast.runner.segments]
    assert kinds == ["ort", "Python", "ort"]
    _assert_close(model.forward(**x), fast.forward(**x))


def test_to_caffe_gives_the_same_net_as_files(tmp_path):
    model = zoo.build("resnet")
    x = _inputs(model)
    fast = aiacc.optimize(model, x, backend="onnxruntime")
    native = fast.to_caffe()
    assert isinstance(native, CaffeModel)
    prototxt, caffemodel = zoo.write(native, str(tmp_path), "resnet")
    _assert_close(model.forward(**x), CaffeModel.load(prototxt, caffemodel).forward(**x))


def test_bad_inputs_name_the_blob():
    model = zoo.build("lenet")
    fast = aiacc.optimize(model, _inputs(model), backend="onnxruntime")
    with pytest.raises(ShapeError, match="no input blob 'image'"):
        fast.forward(image=np.zeros((2, 1, 28, 28), np.float32))
    with pytest.raises(ShapeError, match=r"'data' has shape \[2, 1, 14, 14\]"):
        fast.forward(data=np.zeros((2, 1, 14, 14), np.float32))


def test_unknown_backend_is_refused():
    model = zoo.build("lenet")
    with pytest.raises(aiacc.AiaccError, match="no backend 'tensorrt'"):
        aiacc.optimize(model, _inputs(model), backend="tensorrt")
