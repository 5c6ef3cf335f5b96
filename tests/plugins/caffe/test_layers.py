"""Layer semantics on small nets: against OpenCV dnn where it runs the layer, else against numpy; and
the legacy forms (V1 layers, net-level inputs, 4-d blobs)."""
import numpy as np
import pytest

import aiacc
from aiacc.plugins.caffe import CaffeModel
from aiacc.plugins.caffe.proto import array_to_blob

cv2 = pytest.importorskip("cv2")


def net(body: str, shape=(1, 4, 7, 7)) -> str:
    dims = " ".join(f"dim: {d}" for d in shape)
    return f'name: "t"\nlayer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ {dims} }} }} }}\n' + body


def run_both(tmp_path, text, seed=0, blobs=None):
    """(aiacc outputs, OpenCV outputs of the same last layers, model) for prototxt `text`."""
    model = CaffeModel.from_text(text)
    for layer, arrays in (blobs or {}).items():
        for a in arrays:
            array_to_blob(np.asarray(a, np.float32), model.layer(layer).blobs.add())
    model.fill_random(seed)
    prototxt, caffemodel = str(tmp_path / "m.prototxt"), str(tmp_path / "m.caffemodel")
    model.save(prototxt, caffemodel)
    model = CaffeModel.load(prototxt, caffemodel)
    rng = np.random.default_rng(seed + 1)
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in model.inputs.items()}
    ours = model.forward(**feeds)
    cv = cv2.dnn.readNetFromCaffe(prototxt, caffemodel)
    cv.enableWinograd(False)
    for k, v in feeds.items():
        cv.setInput(v, k)
    writers = [[layer.name for layer in model.net.layer if b in layer.top][-1] for b in model.outputs]
    theirs = dict(zip(model.outputs, cv.forward(writers)))
    return ours, theirs, model, feeds


CASES = {
    # Caffe rounds pooled sizes up and drops a last window that would start in the padding
    "pool_ceil_overhang": net('layer { name: "p" type: "Pooling" bottom: "data" top: "p" '
                              'pooling_param { pool: MAX kernel_size: 2 stride: 2 pad: 1 } }', (1, 2, 5, 5)),
    "ave_pool_padding_divisor": net('layer { name: "p" type: "Pooling" bottom: "data" top: "p" '
                                    'pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }', (1, 2, 8, 9)),
    "ave_pool_hw": net('layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param '
                       '{ pool: AVE kernel_h: 2 kernel_w: 3 stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 0 } }'),
    "conv_per_axis": net('layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param '
                         '{ num_output: 6 kernel_size: 3 kernel_size: 2 pad: 2 pad: 1 stride: 1 stride: 2 '
                         'dilation: 2 dilation: 1 group: 2 } }'),
    "deconv_group": net('layer { name: "d" type: "Deconvolution" bottom: "data" top: "d" convolution_param '
                        '{ num_output: 6 kernel_size: 3 stride: 2 pad: 1 group: 2 bias_term: false } }'),
    "inner_product_axis2": net('layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
                               'inner_product_param { num_output: 5 axis: 2 } }', (2, 3, 4, 5)),
    "prelu_shared": net('layer { name: "pr" type: "PReLU" bottom: "data" top: "pr" '
                        'prelu_param { channel_shared: true } }'),
    "flatten_axis2": net('layer { name: "f" type: "Flatten" bottom: "data" top: "f" flatten_param { axis: 2 } }'),
    "reshape_axis": net('layer { name: "r" type: "Reshape" bottom: "data" top: "r" '
                        'reshape_param { shape { dim: 7 dim: -1 } axis: 2 num_axes: 2 } }'),
    "softmax_axis": net('layer { name: "s" type: "Softmax" bottom: "data" top: "s" softmax_param { axis: 2 } }'),
    "scale_two_bottoms": net(
        'layer { name: "sl" type: "Slice" bottom: "data" top: "a" top: "b" slice_param { axis: 3 slice_point: 1 } }\n'
        'layer { name: "f" type: "Flatten" bottom: "a" top: "g" flatten_param { axis: 2 } }\n'
        'layer { name: "ig" type: "Pooling" bottom: "b" top: "b2" pooling_param { pool: MAX kernel_size: 1 } }\n'
        'layer { name: "sc" type: "Scale" bottom: "b2" bottom: "g" top: "sc" scale_param { axis: 0 } }'),
    "power_elu_sigmoid": net(
        'layer { name: "p" type: "Power" bottom: "data" top: "p" power_param { power: 3 scale: -0.5 shift: 0.2 } }\n'
        'layer { name: "e" type: "ELU" bottom: "p" top: "e" }\n'
        'layer { name: "s" type: "Sigmoid" bottom: "e" top: "s" }'),
    "lrn_across": net('layer { name: "n" type: "LRN" bottom: "data" top: "n" '
                      'lrn_param { local_size: 3 alpha: 0.5 beta: 0.6 } }'),
    "lrn_within": net('layer { name: "n" type: "LRN" bottom: "data" top: "n" '
                      'lrn_param { local_size: 3 alpha: 0.5 beta: 0.6 norm_region: WITHIN_CHANNEL } }'),
    "legacy_input_dim": 'name: "t" input: "data" input_dim: 1 input_dim: 2 input_dim: 5 input_dim: 5\n'
                        'layer { name: "r" type: "ReLU" bottom: "data" top: "r" relu_param { negative_slope: 0.2 } }',
    "v1_layers": 'name: "t" input: "data" input_shape { dim: 1 dim: 3 dim: 6 dim: 6 }\n'
                 'layers { name: "c" type: CONVOLUTION bottom: "data" top: "c" '
                 'convolution_param { num_output: 4 kernel_size: 3 } }\n'
                 'layers { name: "r" type: RELU bottom: "c" top: "c" }\n'
                 'layers { name: "p" type: POOLING bottom: "c" top: "p" pooling_param { pool: AVE kernel_size: 2 stride: 2 } }\n'
                 'layers { name: "ip" type: INNER_PRODUCT bottom: "p" top: "ip" inner_product_param { num_output: 3 } }',
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_matches_opencv(tmp_path, case):
    ours, theirs, model, _ = run_both(tmp_path, CASES[case])
    for blob, actual in ours.items():
        expected = np.asarray(theirs[blob])
        assert actual.size == expected.size, f"{blob}: {actual.shape} vs OpenCV {expected.shape}"
        expected = expected.reshape(actual.shape)
        err = float(np.max(np.abs(actual - expected)))
        assert err <= 1e-4 * max(float(np.max(np.abs(expected))), 1e-6), f"{case} {blob}: error {err}"
    # and the exported net computes the same on aiacc
    again = aiacc.plugins.caffe.export(aiacc.trace(model))
    rng = np.random.default_rng(1)
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in model.inputs.items()}
    for (blob, a), b in zip(model.forward(**feeds).items(), again.forward(**feeds).values()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=f"{case}: exported {blob}")


def test_pool_ceil_rounding_size():
    model = CaffeModel.from_text(CASES["pool_ceil_overhang"]).fill_random()
    # ceil((5 + 2 - 2) / 2) + 1 = 4, but the 4th window would start in the end padding: 3
    assert model.graph.outputs[0].shape == (1, 2, 3, 3)
    model = CaffeModel.from_text(net('layer { name: "p" type: "Pooling" bottom: "data" top: "p" '
                                     'pooling_param { pool: MAX kernel_size: 3 stride: 2 } }', (1, 1, 8, 8)))
    assert model.graph.outputs[0].shape == (1, 1, 4, 4)  # ceil((8 - 3) / 2) + 1, floor would give 3


def test_bias_layer_against_numpy():
    # OpenCV dnn has no Bias layer: check it against numpy, with a learned and a second-bottom bias
    text = net('layer { name: "b" type: "Bias" bottom: "data" top: "b" }\n'
               'layer { name: "pool" type: "Pooling" bottom: "data" top: "g" pooling_param { pool: AVE global_pooling: true } }\n'
               'layer { name: "r" type: "Reshape" bottom: "g" top: "g2" reshape_param { shape { dim: 1 dim: 4 } } }\n'
               'layer { name: "b2" type: "Bias" bottom: "b" bottom: "g2" top: "b2" bias_param { axis: 0 } }')
    model = CaffeModel.from_text(text).fill_random(3)
    x = np.random.default_rng(0).standard_normal((1, 4, 7, 7)).astype(np.float32)
    bias = model.graph.initializers["b/bias"].const.reshape(4, 1, 1)
    expected = x + bias + x.mean(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(model.forward(data=x)["b2"], expected, rtol=1e-5, atol=1e-6)
    again = aiacc.plugins.caffe.export(aiacc.trace(model))
    np.testing.assert_allclose(again.forward(data=x)["b2"], expected, rtol=1e-5, atol=1e-6)


def test_legacy_4d_blob_shapes_are_accepted():
    text = net('layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 } }',
               (1, 2, 2, 2))
    model = CaffeModel.from_text(text)
    w = np.arange(24, dtype=np.float32).reshape(3, 8)
    for a, legacy in ((w, (1, 1, 3, 8)), (np.ones(3, np.float32), (1, 1, 1, 3))):
        blob = model.layer("ip").blobs.add()
        blob.num, blob.channels, blob.height, blob.width = legacy  # pre-`shape` Caffe files
        blob.data.extend(a.reshape(-1).tolist())
    x = np.random.default_rng(0).standard_normal((1, 2, 2, 2)).astype(np.float32)
    np.testing.assert_allclose(model.forward(data=x)["ip"], x.reshape(1, 8) @ w.T + 1, rtol=1e-5)


def test_inplace_layers_become_ssa_values():
    text = net('layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 kernel_size: 1 } }\n'
               'layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }\n'
               'layer { name: "drop" type: "Dropout" bottom: "c" top: "c" }')
    g = CaffeModel.from_text(text).fill_random().graph
    names = {n.name: n for n in g}
    assert names["relu"].inputs[0] is names["c"].outputs[0]
    assert names["drop"].inputs[0] is names["relu"].outputs[0]
    assert g.outputs == [names["drop"].outputs[0]]
    assert len({names[k].outputs[0].name for k in ("c", "relu", "drop")}) == 3


def test_train_only_layers_are_left_out():
    text = net('layer { name: "r" type: "ReLU" bottom: "data" top: "r" }\n'
               'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "r" bottom: "label" top: "loss" '
               'include { phase: TRAIN } }')
    model = CaffeModel.from_text(text)
    assert model.outputs == ["r"] and [n.op for n in model.graph] == ["Relu"]


def test_untranslatable_configuration_stays_opaque_with_the_reason():
    text = net('layer { name: "p" type: "Pooling" bottom: "data" top: "p" '
               'pooling_param { pool: STOCHASTIC kernel_size: 2 stride: 2 } }')
    model = CaffeModel.from_text(text)
    (node,) = model.graph.nodes
    assert node.domain == "caffe" and node.op == "Pooling" and "STOCHASTIC" in node.attrs["reason"]
    with pytest.raises(aiacc.errors.KernelError, match="'p'.*STOCHASTIC pooling"):
        model.forward(data=np.zeros((1, 4, 7, 7), np.float32))
    again = aiacc.plugins.caffe.export(aiacc.trace(model))
    assert again.layer("p").SerializeToString() == model.layer("p").SerializeToString()


def test_inner_product_transpose(tmp_path):
    # Caffe stores a transposed InnerProduct's weights as (K, N) and computes x @ W. OpenCV 4.11 ignores
    # `transpose` (it reads the blob as (N, K)), so check against numpy; the exporter writes (N, K)
    # weights without the flag, which OpenCV then runs correctly.
    text = net('layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
               'inner_product_param { num_output: 5 transpose: true } }', (2, 3, 2, 2))
    model = CaffeModel.from_text(text).fill_random()
    w, b = (model.graph.initializers[k].const for k in ("ip/weights", "ip/bias"))
    assert w.shape == (12, 5)
    x = np.random.default_rng(0).standard_normal((2, 3, 2, 2)).astype(np.float32)
    expected = x.reshape(2, 12) @ w + b
    np.testing.assert_allclose(model.forward(data=x)["ip"], expected, rtol=1e-5, atol=1e-6)
    exported = aiacc.plugins.caffe.export(aiacc.trace(model))
    assert not exported.layer("ip").inner_product_param.transpose
    prototxt, caffemodel = str(tmp_path / "t.prototxt"), str(tmp_path / "t.caffemodel")
    exported.save(prototxt, caffemodel)
    cv = cv2.dnn.readNetFromCaffe(prototxt, caffemodel)
    cv.setInput(x)
    np.testing.assert_allclose(cv.forward(), expected, rtol=1e-4, atol=1e-5)
