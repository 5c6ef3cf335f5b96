"""Public Caffe deploy nets, and the check that tests/reach/test_caffe_public.py and benchmarks/caffe_reach.py
run on each.

The .prototxt files here are the model zoos' own deploy nets, copied verbatim under a header naming the
repository, commit and path they come from (BVLC/caffe, KaimingHe/deep-residual-networks, DeepScale/SqueezeNet,
shicai/MobileNet-Caffe, shicai/DenseNet-Caffe, chuanqi305/MobileNet-SSD, davidgengenbach/vgg-caffe), in
every format they were published in: V1 `layers` with enum types and `input`/`input_dim` headers (the 2014
BVLC nets, VGG-16), `input_shape` (2015 BVLC, MobileNet-SSD), `Input` layers (current BVLC, VGG-19), the
forks' fields (DenseNet's `ceil_mode`, the SSD fork's Permute/PriorBox/DetectionOutput). VGG-16's file is
written in the form of its gist (which is not reachable from here; see its header).

`check(name, workdir)` does what a user with the file and a caffemodel does: random weights (seeded, a
caffemodel written with aiacc's schema), load, trace, optimize, save back (prototxt + caffemodel), and
compares on an input optimize never saw: aiacc's forward of the original and of the optimized net, and
OpenCV dnn on the saved-back files, each against OpenCV dnn on the original files (Winograd off). It
compares the net's outputs and the bottoms of the layers that write them (a classifier's logits before its
Softmax, an SSD head's location/confidence blobs before DetectionOutput), as random weights can saturate
a Softmax and hide errors.
"""
from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# name -> prototxt file (all of them: the benchmark sweep)
NETS = {
    "alexnet": "bvlc_alexnet.prototxt",
    "caffenet": "bvlc_reference_caffenet.prototxt",
    "caffenet-v1-2014": "bvlc_reference_caffenet_v1_2014.prototxt",
    "googlenet": "bvlc_googlenet.prototxt",
    "googlenet-v1-2014": "bvlc_googlenet_v1_2014.prototxt",
    "googlenet-input_shape-2015": "bvlc_googlenet_input_shape_2015.prototxt",
    "vgg16": "VGG_ILSVRC_16_layers_deploy.prototxt",
    "vgg19": "VGG_ILSVRC_19_layers_deploy.prototxt",
    "resnet50": "ResNet-50-deploy.prototxt",
    "resnet101": "ResNet-101-deploy.prototxt",
    "resnet152": "ResNet-152-deploy.prototxt",
    "squeezenet-1.0": "squeezenet_v1.0.prototxt",
    "squeezenet-1.1": "squeezenet_v1.1.prototxt",
    "mobilenet-v1": "mobilenet_v1.prototxt",
    "mobilenet-v2": "mobilenet_v2.prototxt",
    "densenet121": "DenseNet_121.prototxt",
    "mobilenet-ssd": "MobileNetSSD_deploy.prototxt",
    "mobilenet-ssd-bn": "MobileNetSSD_deploy_bn.prototxt",
}

# the CI sample: every format and layer kind above (V1 + input_dim, Input layers, input_shape, LRN, group
# and depthwise convolution, ceil/floor/global pooling, Concat, Eltwise, Dropout, BatchNorm+Scale, the SSD
# head), leaving out the nets that only repeat them at a larger size (VGG, ResNet-101/152, AlexNet's twins)
CI = ["caffenet-v1-2014", "googlenet-v1-2014", "squeezenet-1.1", "mobilenet-v1", "mobilenet-v2", "resnet50",
      "densenet121", "mobilenet-ssd", "mobilenet-ssd-bn"]

# name -> prototxt file under forms/: nets written here from the public definitions of more public deploy nets
# (each file's header names its source), reduced in size (a second or less each), covering their layer types
# and parameter forms: SSD detectors, FCN/HED (Deconvolution, Crop), segmentation with the forks' Upsample,
# OpenPose, age/gender, colorization, SE-ResNeXt/Inception-BN, ShuffleNet, YOLO, Faster R-CNN, BVLC's layers
FORMS = {
    "res10-ssd-face": "res10_ssd_face.prototxt",
    "fcn8s": "fcn8s.prototxt",
    "fcn32s": "fcn32s.prototxt",
    "hed": "hed.prototxt",
    "age-net": "age_net.prototxt",
    "colorization": "colorization.prototxt",
    "openpose-coco": "openpose_coco.prototxt",
    "se-resnext": "se_resnext.prototxt",
    "shufflenet": "shufflenet.prototxt",
    "segnet": "segnet.prototxt",
    "yolo": "yolov2_tiny.prototxt",
    "faster-rcnn-opencv": "faster_rcnn_opencv.prototxt",
    "faster-rcnn-python": "faster_rcnn_python.prototxt",
    "bvlc-layers": "bvlc_layers.prototxt",
}

RTOL = 1e-4  # of the compared blob's magnitude

# inputs that random numbers would make meaningless: Faster R-CNN's im_info is (height, width, scale)
FEEDS = {"faster-rcnn-opencv": {"im_info": np.array([[32.0, 32.0, 1.0]], np.float32)}}


def path(name: str) -> str:
    """The prototxt file of a net of NETS or FORMS."""
    return os.path.join(HERE, NETS[name]) if name in NETS else os.path.join(HERE, "forms", FORMS[name])


@dataclass
class Result:
    """What check() found for one net."""

    name: str
    layers: int = 0  # layers of the original (after V1 upgrade, TEST phase)
    layers_after: int = 0  # layers of the saved-back net
    opaque: list = field(default_factory=list)  # layer types kept opaque (OpenCV runs them)
    nodes: int = 0
    nodes_after: int = 0
    ops_removed: dict = field(default_factory=dict)  # IR op -> count, original graph minus optimized graph
    outputs: list = field(default_factory=list)
    outputs_after: list = field(default_factory=list)  # the saved-back net's output blob names
    errors: dict = field(default_factory=dict)  # "what vs OpenCV" -> max relative error over compared blobs
    compared: list = field(default_factory=list)  # blob names compared
    seconds: float = 0.0
    models: dict = field(default_factory=dict)  # the CaffeModels and OpenCV nets (for the benchmark's timing)
    inputs: dict = field(default_factory=dict)  # the input check() compared on


def _writer(net, blob: str):
    """The last layer (of the TEST phase) writing `blob`."""
    from aiacc.plugins.caffe.proto import layer_phase_ok

    last = None
    for layer in net.layer:
        if layer_phase_ok(layer) and blob in layer.top:
            last = layer
    return last


def compared_blobs(net, outputs: list[str]) -> list[tuple[str, str]]:
    """(blob, the layer name OpenCV calls it by): the outputs first, then the bottoms of the layers writing
    them (net inputs left out)."""
    inputs = set(net.input) | {t for layer in net.layer if layer.type == "Input" for t in layer.top}
    out = [(blob, _writer(net, blob).name) for blob in outputs]
    for blob in outputs:
        for b in _writer(net, blob).bottom:
            w = _writer(net, b)
            if b not in inputs and w is not None and b not in [x for x, _ in out]:
                out.append((b, w.name))
    return out


def declared_inputs(net) -> dict[str, list[int]]:
    """The input blobs' shapes as the file declares them (net-level input fields or Input layers)."""
    from aiacc.plugins.caffe.proto import legacy_inputs

    shapes = dict(legacy_inputs(net, "<net>"))
    for layer in net.layer:
        if layer.type == "Input":
            given = list(layer.input_param.shape)
            for i, top in enumerate(layer.top):
                shapes[top] = [int(d) for d in given[min(i, len(given) - 1)].dim]
    return shapes


def _opencv(prototxt: str, caffemodel: str):
    import cv2

    net = cv2.dnn.readNetFromCaffe(prototxt, caffemodel)
    net.enableWinograd(False)  # Winograd changes the numbers beyond 1e-4
    return net


def opencv_forward(net, feeds: dict, layer_names: list[str]) -> list[np.ndarray]:
    """OpenCV dnn's values of the named layers' outputs."""
    for k, v in feeds.items():
        net.setInput(v, k)
    return [np.array(o) for o in net.forward(layer_names)]


def opencv_names(cv_net, net, pairs: list[tuple[str, str]]) -> list[str]:
    """The names OpenCV gives the layers writing the compared blobs: a repeated layer name gets _1, _2... (HED
    names all its Crop layers "crop"), and OpenCV names some layers by their top (a Convolution whose top
    differs from its name and feeds a Crop)."""
    from aiacc.plugins.caffe.proto import layer_phase_ok

    seen: dict[str, int] = {}
    named: dict[str, str] = {}  # blob -> the OpenCV name of its last writer
    for layer in net.layer:
        if not layer_phase_ok(layer) or layer.type == "Input":
            continue
        k = seen.get(layer.name, 0)
        seen[layer.name] = k + 1
        name = layer.name if k == 0 else f"{layer.name}_{k}"
        if cv_net.getLayerId(name) < 0 and layer.top and cv_net.getLayerId(layer.top[0]) >= 0:
            name = layer.top[0]
        for t in layer.top:
            named[t] = name
    return [named.get(blob, layer) for blob, layer in pairs]


def rel_err(want: np.ndarray, got: np.ndarray) -> float:
    """max |want - got| / max |want| (inf when the shapes differ)."""
    want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
    if want.shape != got.shape:
        return float("inf")
    return float(np.abs(want - got).max() / (np.abs(want).max() or 1.0))


def detections_err(want: np.ndarray, got: np.ndarray) -> float:
    """rel_err for DetectionOutput's rows (image, label, score, box): as sets, each row against the nearest
    row of the same image and label in the other. DetectionOutput sorts boxes by score, so boxes of scores
    equal to 1e-7 come out in either order; which boxes it keeps, and their values, are what it computes."""
    w = np.asarray(want, np.float64).reshape(-1, 7)
    g = np.asarray(got, np.float64).reshape(-1, 7)
    if w.shape != g.shape:
        return float("inf")
    if not len(w):
        return 0.0

    def far(a, b):
        worst = 0.0
        for row in a:
            same = b[(b[:, 0] == row[0]) & (b[:, 1] == row[1])]
            worst = max(worst, float(np.abs(same - row).max(axis=1).min()) if len(same) else float("inf"))
        return worst
    return max(far(w, g), far(g, w)) / (np.abs(w).max() or 1.0)


def saved_back(res: Result):
    """The CaffeModel check() read back from the saved-back files."""
    return res.models["saved back"]


def check(name: str, workdir: str, *, batch: int = 1, seed: int = 0) -> Result:
    """Load, optimize and save back the net `name` with random weights, comparing with OpenCV (see module)."""
    import aiacc
    from aiacc.plugins.caffe.model import CaffeModel

    t0 = time.perf_counter()
    res = Result(name)
    src = path(name)
    declared = CaffeModel.load(src)
    # the batch is the only change to the file's net (deploy nets declare 10 for oversampled crops)
    shapes = {k: (batch,) + tuple(v[1:]) for k, v in declared_inputs(declared.net).items()}
    weights = os.path.join(workdir, f"{name}.caffemodel")
    with open(weights, "wb") as f:
        f.write(declared.reshape(**shapes).fill_random(seed=seed).to_caffemodel())
    model = CaffeModel.load(src, weights).reshape(**shapes)
    graph = aiacc.trace(model)
    res.layers = len(model.net.layer)
    res.opaque = [n.op for n in graph if n.is_opaque]
    res.outputs = model.outputs
    rng = np.random.default_rng(seed + 1)
    seen = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    fresh = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    for feeds in (seen, fresh):
        feeds.update(FEEDS.get(name, {}))
    fast = aiacc.optimize(model, seen)
    out_proto, out_weights = os.path.join(workdir, f"{name}.opt.prototxt"), os.path.join(workdir, f"{name}.opt.caffemodel")
    fast.save(out_proto, out_weights)
    back = CaffeModel.load(out_proto, out_weights)
    res.layers_after = len(back.net.layer)
    res.nodes, res.nodes_after = len(graph), len(back.graph)
    res.ops_removed = dict(Counter(n.op for n in graph) - Counter(n.op for n in back.graph))
    res.outputs_after = back.outputs

    pairs = compared_blobs(model.net, model.outputs)
    saved = compared_blobs(back.net, back.outputs)
    if len(saved) != len(pairs):  # the last layers changed form: compare the outputs alone
        pairs, saved = pairs[:len(model.outputs)], saved[:len(back.outputs)]
    res.compared = [b for b, _ in pairs]
    cv_orig = _opencv(src, weights)
    want = opencv_forward(cv_orig, fresh, opencv_names(cv_orig, model.net, pairs))
    cv_back = _opencv(out_proto, out_weights)
    got = {
        "aiacc original vs OpenCV": list(CaffeModel(model.net, outputs=[b for b, _ in pairs]).forward(**fresh).values()),
        "aiacc optimized vs OpenCV": list(CaffeModel(back.net, outputs=[b for b, _ in saved]).forward(**fresh).values()),
        "OpenCV saved-back vs OpenCV": opencv_forward(cv_back, fresh, opencv_names(cv_back, back.net, saved)),
    }
    kinds = [_writer(model.net, b).type for b, _ in pairs]
    for what, values in got.items():
        res.errors[what] = max((detections_err if k == "DetectionOutput" else rel_err)(w, v)
                               for k, w, v in zip(kinds, want, values))
    res.models = {"original": model, "aiacc": fast, "opencv": cv_orig, "opencv saved-back": cv_back, "saved back": back}
    res.inputs = fresh
    res.seconds = time.perf_counter() - t0
    return res
