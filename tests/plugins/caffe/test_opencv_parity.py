"""The zoo nets run the same in aiacc and in OpenCV dnn (an independent Caffe runtime), before and after
export and optimization."""
import numpy as np
import pytest

import aiacc
from aiacc.plugins.caffe import CaffeModel
from tests.zoo import caffe_models as zoo

cv2 = pytest.importorskip("cv2")

RTOL = 1e-4

# a layer before the softmax of each net: softmax squashes differences, so compare its input too
PRE_SOFTMAX = {"lenet": "ip2", "resnet": "fc", "squeezenet": "conv10", "alexnet": "fc8"}


def last_writer(model: CaffeModel, blob: str) -> str:
    """The layer that writes a blob last (OpenCV addresses outputs by layer name)."""
    return [layer.name for layer in model.net.layer if blob in layer.top][-1]


def opencv_forward(prototxt, caffemodel, feeds, layer_names):
    net = cv2.dnn.readNetFromCaffe(prototxt, caffemodel)
    net.enableWinograd(False)
    for name, array in feeds.items():
        net.setInput(array, name)
    return [np.asarray(o) for o in net.forward(list(layer_names))]


def aiacc_layer_output(model: CaffeModel, layer: str, feeds) -> np.ndarray:
    """The output of the node translating `layer` (the node carries the layer's name)."""
    g = model.graph.copy()
    g.outputs = [g.nodes[[n.name for n in g].index(layer)].outputs[0]]
    return aiacc.core.run(g, feeds)[g.outputs[0].name]


def assert_close(actual, expected, what):
    actual, expected = np.asarray(actual), np.asarray(expected).reshape(np.shape(actual))
    scale = max(float(np.max(np.abs(expected))), 1e-6)
    err = float(np.max(np.abs(actual - expected)))
    assert err <= RTOL * scale, f"{what}: max error {err:.3g} > {RTOL} x {scale:.3g}"


def random_feeds(model, seed=1):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in model.inputs.items()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every OpenCV-runnable zoo net, written to files once."""
    d = tmp_path_factory.mktemp("caffe_zoo")
    return {name: zoo.write(zoo.build(name), str(d), name) for name in zoo.OPENCV_MODELS}


@pytest.mark.parametrize("name", zoo.OPENCV_MODELS)
def test_forward_matches_opencv(saved, name):
    prototxt, caffemodel = saved[name]
    model = CaffeModel.load(prototxt, caffemodel)
    feeds = random_feeds(model)
    ours = model.forward(**feeds)
    layers = [last_writer(model, b) for b in model.outputs] + [PRE_SOFTMAX[name]]
    theirs = opencv_forward(prototxt, caffemodel, feeds, layers)
    for blob, expected in zip(model.outputs, theirs):
        assert_close(ours[blob], expected, f"{name} output {blob}")
    assert_close(aiacc_layer_output(model, PRE_SOFTMAX[name], feeds), theirs[-1], f"{name} layer {PRE_SOFTMAX[name]}")


@pytest.mark.parametrize("name", zoo.OPENCV_MODELS)
def test_exported_files_load_in_opencv(saved, tmp_path, name):
    model = CaffeModel.load(*saved[name])
    exported = aiacc.plugins.caffe.export(aiacc.trace(model))
    # the same layers (legacy net inputs become an Input layer; Split is implicit in a Caffe net, since
    # any number of layers may read one blob)
    expected = [t for t in model.layer_types if t != "Split"]
    assert exported.layer_types == (expected if expected[0] == "Input" else ["Input"] + expected)
    prototxt, caffemodel = zoo.write(exported, str(tmp_path), name)
    feeds = random_feeds(model, seed=2)
    ours = model.forward(**feeds)
    theirs = opencv_forward(prototxt, caffemodel, feeds, [last_writer(exported, b) for b in exported.outputs])
    assert exported.outputs == model.outputs
    for blob, expected in zip(model.outputs, theirs):
        assert_close(ours[blob], expected, f"{name} exported output {blob}")


@pytest.mark.parametrize("name", zoo.OPENCV_MODELS)
def test_optimized_files_load_in_opencv(saved, tmp_path, name):
    model = CaffeModel.load(*saved[name])
    feeds = random_feeds(model, seed=3)
    fast = aiacc.optimize(model, feeds, level=2)  # verify=True: aiacc checks it against the original
    assert isinstance(fast, CaffeModel)
    assert "Dropout" not in fast.layer_types and "BatchNorm" not in fast.layer_types
    assert len(fast.net.layer) <= len(model.net.layer)
    prototxt, caffemodel = zoo.write(fast, str(tmp_path), name)
    reloaded = CaffeModel.load(prototxt, caffemodel)
    ours = model.forward(**feeds)
    theirs = opencv_forward(prototxt, caffemodel, feeds, [last_writer(reloaded, b) for b in reloaded.outputs])
    for blob, expected in zip(model.outputs, theirs):
        assert_close(ours[blob], expected, f"{name} optimized output {blob}")
    for blob, actual in reloaded.forward(**feeds).items():
        assert_close(actual, ours[blob], f"{name} optimized, reloaded, on aiacc: {blob}")


def test_resnet_batchnorm_and_scale_fold_into_convolutions(saved):
    model = CaffeModel.load(*saved["resnet"])
    fast = aiacc.optimize(model, random_feeds(model), level=2)
    assert model.layer_types.count("BatchNorm") == 3 and model.layer_types.count("Scale") == 3
    assert "BatchNorm" not in fast.layer_types and "Scale" not in fast.layer_types
    # the ReLUs after the folded convolutions work in place
    for layer in fast.net.layer:
        if layer.type == "ReLU":
            assert list(layer.top) == list(layer.bottom), layer
