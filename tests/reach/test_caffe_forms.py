"""More public Caffe deploy nets, written from their public definitions (tests/reach/caffe_nets/forms, each
file's header names its source; reduced so each runs in about a second): every one loads, optimizes and saves
back, and aiacc's forward and OpenCV on the saved-back files equal OpenCV on the original within 1e-4 (the
check of tests/reach/caffe_nets). Where OpenCV cannot run a layer, aiacc's numpy kernel is checked against
Caffe's formula in numpy, and where nothing can run one (a Python layer, YOLO's Region) the error names the
layer and says why. Fields the schema does not declare (the forks' `*_param`) are kept and written back."""
from __future__ import annotations

import numpy as np
import pytest

import aiacc
from aiacc.errors import KernelError, ShapeError
from aiacc.plugins.caffe import opencv_layer
from aiacc.plugins.caffe.model import CaffeModel
from aiacc.plugins.caffe.proto import parse_prototxt, to_prototxt
from tests.reach import caffe_nets as C

needs_cv = pytest.mark.skipif(not opencv_layer.available(), reason="OpenCV (cv2) is not installed")

# net -> the layer types that stay opaque (OpenCV runs them); every other layer is IR the passes work on
OPENCV_NETS = {
    "res10-ssd-face": {"Normalize", "PriorBox", "DetectionOutput"},  # Permute: a Transpose in the IR
    "fcn8s": {"Crop"},
    "fcn32s": {"Crop"},
    "hed": {"Crop"},
    "age-net": set(),
    "colorization": set(),
    "openpose-coco": set(),
    "se-resnext": {"Axpy"},
    "shufflenet": {"ShuffleChannel"},
    "yolo": {"Reorg"},
    "faster-rcnn-opencv": {"Proposal", "ROIPooling"},
    "bvlc-layers": {"Exp", "AbsVal", "Log", "BNLL", "MVN", "Swish"},
}


@needs_cv
@pytest.mark.parametrize("name", sorted(OPENCV_NETS))
def test_public_form_loads_optimizes_saves_and_equals_opencv(name, tmp_path):
    r = C.check(name, str(tmp_path))
    assert r.outputs_after == r.outputs, "the saved-back net renamed the outputs"
    assert set(r.opaque) == OPENCV_NETS[name], r.opaque
    for what, err in r.errors.items():
        assert err <= C.RTOL, f"{name}: {what}: max relative error {err:.3g} over {r.compared}"


FORK_NET = """name: "forks"
input: "data" input_shape { dim: 1 dim: 6 dim: 4 dim: 4 }
layer { name: "shuffle" type: "ShuffleChannel" bottom: "data" top: "shuffle"
  shuffle_channel_param {
    group: 3  # a comment with a brace }
  }
  fork_note: "x}"
}
layer { name: "pool" type: "Pooling" bottom: "shuffle" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv" type: "Convolution" bottom: "pool" top: "conv" convolution_param { num_output: 2 kernel_size: 1 } engine_x: CUDNN }
"""


def test_fields_the_schema_lacks_are_kept_verbatim_and_written_back():
    """A fork's parameter message and stray scalar fields of a layer: each is kept as its text on its layer (a
    brace inside a string or a comment is no brace), and to_prototxt writes the same net back. Outside a layer,
    inside a known message, or within a letter of a declared field (a typo), it stays a ParseError."""
    from aiacc.errors import ParseError

    net = parse_prototxt(FORK_NET)
    kept = {layer.name: list(layer.aiacc_unknown_text) for layer in net.layer}
    assert kept == {"shuffle": ["shuffle_channel_param {\n    group: 3  # a comment with a brace }\n  }",
                                'fork_note: "x}"'],
                    "pool": [], "conv": ["engine_x: CUDNN"]}
    text = to_prototxt(net)
    assert "aiacc_unknown_text" not in text and 'fork_note: "x}"' in text
    assert parse_prototxt(text) == net
    for bad, line in (('name: "n"\nfork_net_field: 1', "line 2"),
                      (FORK_NET.replace("stride: 2 }", "stride: 2 fork_extra: 1 }"), "line 9"),
                      (FORK_NET.replace("convolution_param {", "convolution_parm {"), "line 10")):
        with pytest.raises(ParseError, match=f"{line}.*no field named"):
            parse_prototxt(bad)


CV_FORK_NET = """name: "cv_forks"
input: "data" input_shape { dim: 1 dim: 6 dim: 4 dim: 4 }
layer { name: "shuffle" type: "ShuffleChannel" bottom: "data" top: "shuffle" shuffle_channel_param { group: 3 } }
layer { name: "interp" type: "Interp" bottom: "shuffle" top: "interp" interp_param { zoom_factor: 2 } }
layer { name: "conv" type: "Convolution" bottom: "interp" top: "conv" convolution_param { num_output: 2 kernel_size: 1 } }
"""


def test_a_known_layer_with_a_field_the_schema_lacks_stays_opaque_saying_which():
    """What the schema cannot read may change what a layer computes: the layer is not translated from the
    fields it could read, it stays opaque with the reason (and OpenCV, which skips the same fields, runs it)."""
    graph = aiacc.trace(CaffeModel.from_text(FORK_NET).fill_random(seed=0))
    reasons = {n.name: n.attrs.get("reason", "") for n in graph if n.is_opaque}
    assert set(reasons) == {"shuffle", "conv"}
    assert reasons["conv"] == "fields aiacc's Caffe schema does not declare: engine_x"
    assert reasons["shuffle"].endswith("shuffle_channel_param, fork_note")


@needs_cv
def test_layers_with_fork_fields_run_in_opencv_and_save_back(tmp_path):
    """The forks' ShuffleChannel and Interp (their *_param unknown to BVLC's schema) stay opaque, OpenCV (which
    knows those fields) runs them, and the saved-back net, their text written back, equals OpenCV."""
    import cv2

    model = CaffeModel.from_text(CV_FORK_NET).fill_random(seed=0)
    assert {n.name for n in aiacc.trace(model) if n.is_opaque} == {"shuffle", "interp"}
    x = np.random.default_rng(1).standard_normal((1, 6, 4, 4)).astype(np.float32)
    fast = aiacc.optimize(model, x)
    fast.save(tmp_path / "o.prototxt", tmp_path / "o.caffemodel")
    model.save(tmp_path / "ref.prototxt", tmp_path / "ref.caffemodel")
    assert "shuffle_channel_param { group: 3 }" in (tmp_path / "o.prototxt").read_text()
    ref = cv2.dnn.readNetFromCaffe(str(tmp_path / "ref.prototxt"), str(tmp_path / "ref.caffemodel"))
    ref.setInput(x, "data")
    want = ref.forward("conv")
    back = cv2.dnn.readNetFromCaffe(str(tmp_path / "o.prototxt"), str(tmp_path / "o.caffemodel"))
    back.setInput(x, "data")
    for got in (fast.forward(data=x)["conv"], back.forward("conv")):
        assert want.shape == (1, 2, 7, 7) and C.rel_err(want, got) <= C.RTOL
    # the channel shuffle took effect (group 3 read from the kept text): not the identity
    plain = CaffeModel.from_text(CV_FORK_NET.replace("group: 3", "group: 1"), model.to_caffemodel())
    assert C.rel_err(want, plain.forward(data=x)["conv"]) > 1e-3


def _one(layer_text: str, shape, blobs=()):
    net = f'name: "t" input: "x" input_shape {{ {" ".join(f"dim: {d}" for d in shape)} }}\n{layer_text}'
    model = CaffeModel.from_text(net)
    for layer in model.net.layer:
        for b in blobs:
            from aiacc.plugins.caffe.proto import array_to_blob
            array_to_blob(np.asarray(b, np.float32), layer.blobs.add())
    model.invalidate()
    return model


@pytest.mark.parametrize("runtime", ["aiacc", "onnxruntime"])
def test_layers_opencv_cannot_run_follow_caffes_formulas(runtime):
    """Threshold, Clip, Reduction (each operation), ArgMax (over an axis and top-k with values), Tile, and
    InnerProduct with transpose (OpenCV reads its (K, N) weights as (N, K)) against Caffe's formulas."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    x[0, 0, 0, :2] = 7.0  # a tie: Caffe's top-k puts the larger index first
    cases = [
        ('threshold_param { threshold: 0.25 }', "Threshold", (x > 0.25).astype(np.float32)),
        ('clip_param { min: -0.5 max: 0.75 }', "Clip", np.clip(x, -0.5, 0.75)),
        ('reduction_param { operation: SUM axis: 2 coeff: 0.5 }', "Reduction", 0.5 * x.sum((2, 3))),
        ('reduction_param { operation: ASUM axis: 1 }', "Reduction", np.abs(x).sum((1, 2, 3))),
        ('reduction_param { operation: SUMSQ axis: -1 }', "Reduction", (x * x).sum(3)),
        ('reduction_param { operation: MEAN axis: 0 }', "Reduction", np.asarray(x.mean())),
        ('argmax_param { axis: 1 }', "ArgMax", x.argmax(1)[:, None].astype(np.float32)),
        ('argmax_param { axis: 3 top_k: 2 out_max_val: true }', "ArgMax", -np.sort(-x, 3)[..., :2]),
        ('tile_param { axis: 1 tiles: 2 }', "Tile", np.concatenate([x, x], 1)),
    ]
    flat = x.reshape(2, -1)
    # Caffe sorts (value, index) pairs by std::greater: of equal values the larger index comes first
    top2 = np.asarray([sorted(range(60), key=lambda i: (-row[i], -i))[:2] for row in flat])
    assert list(top2[0]) == [1, 0]  # the tie at x[0, 0, 0, :2]
    cases.append(('argmax_param { top_k: 2 out_max_val: true }', "ArgMax",
                  np.stack([top2, np.take_along_axis(flat, top2, 1)], 1).astype(np.float32)))
    for param, kind, want in cases:
        model = _one(f'layer {{ name: "l" type: "{kind}" bottom: "x" top: "y" {param} }}', x.shape)
        model.runtime = runtime
        (got,) = model.forward(x=x).values()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=param)
    w, b = rng.standard_normal((60, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    model = _one('layer { name: "l" type: "InnerProduct" bottom: "x" top: "y" '
                 'inner_product_param { num_output: 4 transpose: true } }', x.shape, [w, b])
    np.testing.assert_allclose(model.forward(x=x)["y"], flat @ w + b, rtol=1e-5, atol=1e-5)


def test_embed_and_nearest_upsample_follow_caffe():
    """Embed (rows of its (input_dim, num_output) weights plus bias; non-integer ids refused) and the YOLO
    ports' Upsample without a mask (nearest neighbour), kept in the saved net."""
    w, b = np.arange(12, dtype=np.float32).reshape(4, 3), np.asarray([0.5, -1, 2], np.float32)
    model = _one('layer { name: "e" type: "Embed" bottom: "x" top: "y" embed_param { num_output: 3 input_dim: 4 } }',
                 (2, 2), [w, b])
    ids = np.asarray([[0, 3], [2, 2]], np.float32)
    np.testing.assert_array_equal(model.forward(x=ids)["y"], w[ids.astype(int)] + b)
    with pytest.raises(KernelError, match="'e' \\(Embed\\).*integers in \\[0, 4\\)"):
        model.forward(x=ids + 0.5)
    filled = CaffeModel.from_text(model.to_prototxt()).fill_random(seed=0)  # fill_random knows its blobs
    assert [list(bl.shape.dim) for bl in filled.net.layer[0].blobs] == [[4, 3], [3]]
    up = _one('layer { name: "u" type: "Upsample" bottom: "x" top: "y" upsample_param { scale: 2 } }', (1, 2, 3, 3))
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 3)).astype(np.float32)
    np.testing.assert_array_equal(up.forward(x=x)["y"], x.repeat(2, 2).repeat(2, 3))
    assert "upsample_param { scale: 2 }" in aiacc.optimize(up, x).to_prototxt()


def test_segnet_max_pooling_mask_and_unpooling_follow_caffe(tmp_path):
    """SegNet/ENet: MAX Pooling with a mask top (each maximum's index h * W + w in its plane) and the fork's
    Upsample scattering by it (OpenCV 4.11 has no such layer: aiacc's kernels run them). The whole reduced
    SegNet loads, optimizes around them, saves back and gives the same answer as before optimizing."""
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 5)).astype(np.float32)
    pool = _one('layer { name: "p" type: "Pooling" bottom: "x" top: "p" top: "m" '
                'pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
                'layer { name: "u" type: "Upsample" bottom: "p" bottom: "m" top: "u" upsample_param { scale: 2 } }',
                x.shape)
    out = pool.forward(x=x)
    want_p = np.full((1, 2, 3, 3), -np.inf, np.float32)
    want_m = np.zeros((1, 2, 3, 3), np.float32)
    for c in range(2):
        for i in range(3):
            for j in range(3):  # Caffe: windows clipped to the image (ceil rounding), first maximum wins
                for h in range(2 * i, min(2 * i + 2, 5)):
                    for w in range(2 * j, min(2 * j + 2, 5)):
                        if x[0, c, h, w] > want_p[0, c, i, j]:
                            want_p[0, c, i, j], want_m[0, c, i, j] = x[0, c, h, w], h * 5 + w
    np.testing.assert_array_equal(out["u"].shape, (1, 2, 6, 6))
    unpooled = np.zeros((1, 2, 36), np.float32)
    for c in range(2):
        unpooled[0, c, want_m[0, c].astype(int).ravel()] = want_p[0, c].ravel()
    np.testing.assert_array_equal(out["u"], unpooled.reshape(1, 2, 6, 6))

    model = CaffeModel.load(C.path("segnet")).fill_random(seed=0)
    assert {n.op for n in aiacc.trace(model) if n.is_opaque} == {"Pooling", "Upsample"}
    y = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    fast = aiacc.optimize(model, y)
    fast.save(tmp_path / "o.prototxt", tmp_path / "o.caffemodel")
    back = CaffeModel.load(tmp_path / "o.prototxt", tmp_path / "o.caffemodel")
    fresh = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    want = model.forward(data=fresh)["conv_classifier"]
    for got in (fast.forward(data=fresh)["conv_classifier"], back.forward(data=fresh)["conv_classifier"]):
        assert C.rel_err(want, got) <= C.RTOL
    saved = parse_prototxt((tmp_path / "o.prototxt").read_text())  # upsample_param: kept as text
    assert [list(layer.top) for layer in saved.layer if layer.type == "Pooling"] == [["pool1", "pool1_mask"],
                                                                                   ["pool2", "pool2_mask"]]


def test_nets_nothing_here_can_run_say_which_layer_and_why():
    """py-faster-rcnn's Python proposal layer: the first layer needing its shape names it as the cause; YOLO
    v2's Region (region_param, which OpenCV cannot run from a Caffe file) loads and traces, and running it
    names the layer and the reason."""
    with pytest.raises(ShapeError, match="'fc6'.*'pool5'.*layer 'proposal' of type 'Python', a Python layer"):
        aiacc.trace(CaffeModel.load(C.path("faster-rcnn-python")).fill_random(seed=0))
    region = _one('layer { name: "region" type: "Region" bottom: "x" top: "y" '
                  'region_param { classes: 1 coords: 4 num: 2 softmax: true } }', (1, 12, 2, 2))
    assert [n.op for n in aiacc.trace(region) if n.is_opaque] == ["Region"]
    with pytest.raises(KernelError, match="'region'.*'Region'.*region_param"):
        region.forward(x=np.zeros((1, 12, 2, 2), np.float32))
