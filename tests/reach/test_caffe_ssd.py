"""A MobileNet-SSD-style Caffe deploy net (tests/reach/mobilenet_ssd_tiny.prototxt: depthwise convs with
BatchNorm/Scale/ReLU, the SSD fork's Normalize, Permute, Flatten(axis), PriorBox and DetectionOutput;
random weights) loads with the fork's fields, keeps the SSD layers opaque with OpenCV's shape inference and
kernels, optimizes around the head, saves back with those layers intact and equals OpenCV within 1e-4."""
from __future__ import annotations

import os

import numpy as np
import pytest
from google.protobuf import text_format

import aiacc
from aiacc.plugins.caffe import opencv_layer
from aiacc.plugins.caffe.schema import pb

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOTXT = os.path.join(HERE, "mobilenet_ssd_tiny.prototxt")
SSD_TYPES = {"Normalize", "Permute", "PriorBox", "DetectionOutput"}
OPAQUE = SSD_TYPES - {"Permute"}  # Permute is a Transpose in the IR (written back as Permute)

needs_cv = pytest.mark.skipif(not opencv_layer.available(), reason="OpenCV (cv2) is not installed")


def test_the_schema_has_the_ssd_forks_fields():
    fields = pb.LayerParameter.DESCRIPTOR.fields_by_name
    assert {k: fields[k].number for k in ("permute_param", "prior_box_param", "detection_output_param",
                                          "norm_param")} == {"permute_param": 202, "prior_box_param": 203,
                                                             "detection_output_param": 204, "norm_param": 206}
    net = text_format.Parse(open(PROTOTXT).read(), pb.NetParameter())
    by_name = {layer.name: layer for layer in net.layer}
    assert list(by_name["conv1_mbox_loc_perm"].permute_param.order) == [0, 2, 3, 1]
    d = by_name["detection_out"].detection_output_param
    assert (d.num_classes, d.nms_param.top_k, d.keep_top_k, d.code_type) == (3, 20, 10, pb.PriorBoxParameter.CENTER_SIZE)
    assert by_name["conv1_norm"].norm_param.scale_filler.value == 20 and not by_name["conv1_norm"].norm_param.across_spatial
    assert by_name["conv1_mbox_priorbox"].prior_box_param.offset == 0.5


@needs_cv
def test_mobilenet_ssd_loads_optimizes_saves_and_equals_opencv(tmp_path):
    from aiacc.plugins.caffe.model import CaffeModel
    from aiacc.core.runtime.executor import run
    from aiacc.plugins.caffe.translator import opencv_runner

    model = CaffeModel.load(PROTOTXT).fill_random(seed=0)
    graph = aiacc.trace(model)
    opaque = [n for n in graph if n.is_opaque]
    assert {n.op for n in opaque} == OPAQUE and graph.find_nodes("Transpose")
    # OpenCV's shape inference typed every opaque layer, so the Flatten/Concat/Softmax after them translated
    assert all(v.type is not None and v.type.is_static for n in opaque for v in n.outputs)
    assert graph.find_nodes("Softmax")
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    fast = aiacc.optimize(model, x)
    assert len(fast.graph) < len(graph) and not fast.graph.find_nodes("BatchNormalization")
    fast.save(tmp_path / "o.prototxt", tmp_path / "o.caffemodel")
    saved = text_format.Parse((tmp_path / "o.prototxt").read_text(), pb.NetParameter())
    kept = {layer.type: layer for layer in saved.layer if layer.type in SSD_TYPES}
    assert set(kept) == SSD_TYPES
    assert kept["DetectionOutput"].detection_output_param.nms_param.nms_threshold == pytest.approx(0.45)
    assert list(kept["Permute"].permute_param.order) == [0, 2, 3, 1]
    for y in (x, np.random.default_rng(2).standard_normal((1, 3, 32, 32)).astype(np.float32)):
        (want,) = opencv_runner(model, {"data": y})()
        (got,) = opencv_runner(CaffeModel.load(tmp_path / "o.prototxt", tmp_path / "o.caffemodel"), {"data": y})()
        assert want.shape == got.shape and (want[..., 2] > 0.3).any()  # real detections, not an empty head
        assert np.abs(want - got).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))
        # and aiacc's own executor (OpenCV running just the SSD layers) agrees
        out = run(fast.graph, {fast.graph.inputs[0].name: y})
        mine = out[fast.graph.outputs[0].name]
        assert np.abs(np.asarray(mine) - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))
