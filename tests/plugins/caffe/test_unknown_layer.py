"""A layer type aiacc does not translate stays opaque: it survives optimize and export byte for byte, and
runs when a kernel is registered for it."""
import numpy as np
import pytest

import aiacc
from aiacc.errors import KernelError
from aiacc.plugins.caffe import CaffeModel, register_layer, unregister_layer
from tests.zoo import caffe_models as zoo


def channel_gate(layer, x, gate):
    """The zoo's Python layer: scale each channel by its gate, but never below the floor in param_str."""
    floor = eval(layer.python_param.param_str)["floor"]  # noqa: S307 (test data written above)
    return x * np.maximum(gate, floor).reshape(1, -1, 1, 1)


@pytest.fixture
def gate_kernel():
    register_layer("Python", channel_gate)
    yield
    unregister_layer("Python")


def _layer_bytes(model, name):
    return model.layer(name).SerializeToString()


def test_unknown_layer_round_trips_byte_identical(tmp_path):
    model = zoo.build("unknown")
    g = aiacc.trace(model)
    node = [n for n in g if n.domain == "caffe"]
    assert [n.op for n in node] == ["Python"] and node[0].is_opaque
    exported = aiacc.plugins.caffe.export(g)
    assert _layer_bytes(exported, "custom") == _layer_bytes(model, "custom")  # incl. its blob
    prototxt, caffemodel = zoo.write(exported, str(tmp_path), "unknown")
    reloaded = CaffeModel.load(prototxt, caffemodel)
    assert _layer_bytes(reloaded, "custom") == _layer_bytes(model, "custom")
    # the in-place ReLU after it stays in place
    relu = reloaded.layer("relu")
    assert list(relu.bottom) == list(relu.top) == ["custom"]


def test_forward_without_a_kernel_is_a_clear_error():
    model = zoo.build("unknown")
    with pytest.raises(KernelError, match="'custom'.*'Python'.*register_layer"):
        model.forward(data=np.zeros((1, 4, 6, 6), np.float32))


def test_optimize_works_around_it(gate_kernel, tmp_path):
    model = zoo.build("unknown")
    x = np.random.default_rng(0).standard_normal((1, 4, 6, 6)).astype(np.float32)
    out = model.forward(data=x)["pool"]
    # reference in numpy: conv (through the ONNX kernel), gate, relu, 2x2 max pool
    g = model.graph.copy()
    g.outputs = [[n for n in g if n.name == "conv1"][0].output]
    conv = aiacc.core.run(g, {"data": x})["conv1"]
    gate = model.graph.initializers["custom/blob0"].const
    y = np.maximum(channel_gate(model.layer("custom"), conv, gate), 0)
    np.testing.assert_allclose(out, y.reshape(1, 4, 3, 2, 3, 2).max(axis=(3, 5)), rtol=1e-5, atol=1e-6)

    fast = aiacc.optimize(model, {"data": x}, level=2)
    assert _layer_bytes(fast, "custom") == _layer_bytes(model, "custom")
    np.testing.assert_allclose(fast.forward(data=x)["pool"], out, rtol=1e-5, atol=1e-6)
