"""Public Caffe deploy nets (the model zoos' own prototxt files, tests/reach/caffe_nets/): with random weights
written as a caffemodel, each loads, optimizes and saves back, and on an input optimize never saw aiacc's
forward (of the original and of the optimized net) and OpenCV dnn on the saved-back files equal OpenCV dnn
on the original files within 1e-4 of each blob's magnitude, with the original's output blob names.

CI runs caffe_nets.CI (every file format and layer kind of the zoo); the larger nets that repeat them (VGG-16/19,
ResNet-101/152, AlexNet and CaffeNet in their other formats) run in `benchmarks/caffe_reach.py`, the same
check on all of them."""
from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from aiacc.plugins.caffe import opencv_layer
from aiacc.plugins.caffe.schema import pb
from tests.reach import caffe_nets as C

needs_cv = pytest.mark.skipif(not opencv_layer.available(), reason="OpenCV (cv2) is not installed")
SSD_TYPES = {"PriorBox", "DetectionOutput"}  # Permute is a Transpose in the IR (saved back as Permute)


@needs_cv
@pytest.mark.parametrize("name", C.CI)
def test_public_net_loads_optimizes_saves_and_equals_opencv(name, tmp_path):
    r = C.check(name, str(tmp_path))
    assert r.outputs_after == r.outputs, "the saved-back net renamed the outputs"
    ssd = name.startswith("mobilenet-ssd")
    # only the SSD fork's layers stay opaque (OpenCV runs them); everything else is IR the passes work on
    assert set(r.opaque) == (SSD_TYPES if ssd else set()), r.opaque
    if ssd:  # the heads' Permute layers became Transposes and were written back as Permute layers
        types = [layer.type for layer in r.models["original"].net.layer]
        assert r.ops_removed.get("Transpose", 0) == 0 and types.count("Permute") == 12
        assert [n.op for n in r.models["aiacc"].graph].count("Transpose") == 12
    assert len(r.compared) > len(r.outputs)  # the logits / head blobs too, not only a (saturable) Softmax
    for what, err in r.errors.items():
        assert err <= C.RTOL, f"{name}: {what}: max relative error {err:.3g} over {r.compared}"
    layers = r.models["original"].net.layer  # V1 upgraded
    writer, after_conv = {}, 0
    for layer in layers:
        after_conv += layer.type == "BatchNorm" and writer.get(layer.bottom[0]) == "Convolution"
        writer.update((t, layer.type) for t in layer.top)
    # every BatchNorm (with its Scale) right after a convolution folds into it (DenseNet's after a Concat,
    # followed by ReLU, cannot); every Dropout goes
    assert r.ops_removed.get("BatchNormalization", 0) == after_conv
    assert r.ops_removed.get("Dropout", 0) == [layer.type for layer in layers].count("Dropout")
    assert r.layers_after < r.layers or not after_conv


@needs_cv
def test_densenet_pool1_ceil_mode_false_is_read_and_written_back(tmp_path):
    """DenseNet-Caffe's pool1 says `ceil_mode: false` (the forks' and OpenCV's field): 112 -> 56, not 57, and
    the saved-back net says it the same way, so OpenCV reads it (check() compared it with OpenCV)."""
    r = C.check("densenet121", str(tmp_path))
    assert max(r.errors.values()) <= C.RTOL
    saved = text_format.Parse((tmp_path / "densenet121.opt.prototxt").read_text(), pb.NetParameter())
    pools = [layer for layer in saved.layer if layer.type == "Pooling" and layer.pooling_param.HasField("ceil_mode")]
    assert len(pools) == 1 and not pools[0].pooling_param.ceil_mode
    assert not pools[0].pooling_param.HasField("round_mode")
    g = r.models["aiacc"].graph
    assert [list(n.output.shape) for n in g if n.op == "MaxPool"] == [[1, 64, 56, 56]]


@pytest.mark.parametrize("name", ["caffenet-v1-2014", "googlenet-input_shape-2015", "alexnet"])
def test_reshape_sets_the_batch_in_each_input_form(name):
    """input_dim (V1), input_shape and Input-layer nets, declared at batch 10, reshaped to one image."""
    from aiacc.plugins.caffe.model import CaffeModel

    model = CaffeModel.load(C.path(name))
    declared = C.declared_inputs(model.net)
    assert [s[0] for s in declared.values()] == [10]
    small = model.reshape(data=(1,) + tuple(declared["data"][1:]))
    assert C.declared_inputs(small.net)["data"][0] == 1 and C.declared_inputs(model.net)["data"][0] == 10
    assert [layer.name for layer in small.net.layer] == [layer.name for layer in model.net.layer]
    from aiacc.errors import ShapeError
    with pytest.raises(ShapeError, match="no input blob 'image'"):
        model.reshape(image=(1, 3, 4, 4))


def test_lrn_follows_caffes_formula_with_k():
    """Caffe's LRN: x / (k + alpha/n * sum over n channels of x^2)^beta. The zoo's nets use k = 1; with another k
    aiacc follows Caffe (OpenCV 4.11 reads no `k` from a Caffe LRN and uses 1, so it is no reference here)."""
    from aiacc.plugins.caffe.model import CaffeModel

    text = """name: "lrn" input: "data" input_shape { dim: 1 dim: 7 dim: 3 dim: 3 }
    layer { name: "norm" type: "LRN" bottom: "data" top: "norm"
            lrn_param { local_size: 5 alpha: 0.3 beta: 0.75 k: 2 } }"""
    x = np.random.default_rng(0).standard_normal((1, 7, 3, 3)).astype(np.float32)
    (got,) = CaffeModel.from_text(text).forward(data=x).values()
    sq = np.pad(x.astype(np.float64) ** 2, ((0, 0), (2, 2), (0, 0), (0, 0)))
    window = sum(sq[:, i:i + 7] for i in range(5))
    want = x / (2 + 0.3 / 5 * window) ** 0.75
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@needs_cv
@pytest.mark.parametrize("kind", ["ReLU6", "DepthwiseConvolution", "ConvolutionDepthwise"])
def test_forks_mobilenet_layer_types(kind, tmp_path):
    """MobileNet ports' layer types: an in-place ReLU6 (no rule: opaque, OpenCV runs it, its in-place top
    included) and the depthwise convolution types (a grouped Convolution, translated), equal to OpenCV."""
    import cv2

    import aiacc
    from aiacc.plugins.caffe.model import CaffeModel

    conv = kind if "Depthwise" in kind else "Convolution"
    act = "ReLU6" if kind == "ReLU6" else "ReLU"
    text = f"""name: "t" input: "data" input_shape {{ dim: 1 dim: 4 dim: 6 dim: 6 }}
    layer {{ name: "dw" type: "{conv}" bottom: "data" top: "dw" convolution_param {{ num_output: 4 kernel_size: 3 group: 4 }} }}
    layer {{ name: "act" type: "{act}" bottom: "dw" top: "dw" }}
    layer {{ name: "pw" type: "Convolution" bottom: "dw" top: "pw" convolution_param {{ num_output: 3 kernel_size: 1 }} }}"""
    model = CaffeModel.from_text(text).fill_random(seed=0) if "Depthwise" not in kind else None
    if model is None:  # fill_random knows Convolution's blobs: fill the Convolution twin, then rename the type
        model = CaffeModel.from_text(text.replace(kind, "Convolution")).fill_random(seed=0)
        model.net.layer[0].type = kind
        model.invalidate()
    assert [n.op for n in aiacc.trace(model) if n.is_opaque] == (["ReLU6"] if kind == "ReLU6" else [])
    x = np.random.default_rng(1).standard_normal((1, 4, 6, 6)).astype(np.float32) * 10  # past ReLU6's 6
    fast = aiacc.optimize(model, x)
    fast.save(tmp_path / "o.prototxt", tmp_path / "o.caffemodel")
    cv_model = model
    if kind != "ReLU6":  # OpenCV knows no depthwise type: the reference is the same layer as a Convolution
        cv_model = CaffeModel.from_text(text.replace(kind, "Convolution"), model.to_caffemodel())
    cv_model.save(tmp_path / "ref.prototxt", tmp_path / "ref.caffemodel")
    ref = cv2.dnn.readNetFromCaffe(str(tmp_path / "ref.prototxt"), str(tmp_path / "ref.caffemodel"))
    ref.enableWinograd(False)
    ref.setInput(x, "data")
    want = ref.forward("pw")
    for got in (model.forward(data=x)["pw"], fast.forward(data=x)["pw"]):
        assert C.rel_err(want, got) <= C.RTOL
