"""One Caffe layer aiacc does not translate (the SSD fork's Permute, PriorBox, Normalize, DetectionOutput, ...),
run by OpenCV's dnn, the Caffe runtime at hand: a net of just that layer (its bottoms as net inputs, its
blobs as weights) is built in memory, and OpenCV's own shape inference (Net.getLayersShapes) gives the
layer's output shapes, so the layers after it can be translated. The reference executor runs the layer
through the same one-layer net. The layer itself is written back unchanged by the exporter.
"""
from __future__ import annotations

import importlib.util
from typing import Callable, Sequence

import numpy as np

from aiacc.errors import KernelError, ShapeError
from aiacc.plugins.caffe.proto import to_prototxt
from aiacc.plugins.caffe.schema import pb


def available() -> bool:
    """True when OpenCV (cv2) is installed."""
    return importlib.util.find_spec("cv2") is not None


def _one_layer_net(layer: pb.LayerParameter, shapes: Sequence[Sequence[int]]):
    """(prototxt bytes, caffemodel bytes) of a net holding only `layer`, its bottoms as inputs."""
    net = pb.NetParameter(name=f"aiacc_{layer.name}")
    for bottom, shape in dict(zip(layer.bottom, shapes)).items():  # a blob read twice (Axpy) is one input
        net.input.append(bottom)
        net.input_shape.add().dim.extend(int(d) for d in shape)
    one = net.layer.add()
    one.CopyFrom(layer)
    del one.top[:]
    one.top.extend(_tops(layer))
    weights = net.SerializeToString()
    return to_prototxt(net).encode(), weights  # blobs left out, the fields aiacc's schema lacks written back


def _tops(layer: pb.LayerParameter) -> list[str]:
    """The layer's tops in the one-layer net: an in-place top (also a bottom, hence a net input there) gets a
    name of its own, or OpenCV would answer the input when asked for it."""
    return [f"{t}/aiacc_top{i}" if t in layer.bottom else t for i, t in enumerate(layer.top)]


def _read(layer: pb.LayerParameter, shapes):
    import cv2

    proto, weights = _one_layer_net(layer, shapes)
    try:
        net = cv2.dnn.readNetFromCaffe(np.frombuffer(proto, np.uint8), np.frombuffer(weights, np.uint8))
    except cv2.error as e:
        raise ShapeError(f"layer {layer.name!r} ({layer.type}): OpenCV dnn cannot read it: "
                         f"{str(e).strip().splitlines()[-1]}") from None
    net.enableWinograd(False)
    return net


def output_shapes(layer: pb.LayerParameter, shapes: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """The shapes of `layer`'s tops for bottoms of `shapes`, by OpenCV's shape inference."""
    import cv2

    net = _read(layer, shapes)
    try:
        lid = net.getLayerId(layer.name)
        unique = list(dict(zip(layer.bottom, shapes)).values())
        ids, _, outs = net.getLayersShapes([np.asarray(s, np.int32) for s in unique])
        outs = outs[[int(i) for i in np.asarray(ids).reshape(-1)].index(lid)]
    except cv2.error as e:
        raise ShapeError(f"layer {layer.name!r} ({layer.type}): OpenCV cannot infer its output shapes: "
                         f"{str(e).strip().splitlines()[-1]}") from None
    return [tuple(int(d) for d in np.asarray(s).reshape(-1)) for s in outs]


def kernel(layer: pb.LayerParameter, shapes: Sequence[Sequence[int]]) -> Callable[..., list[np.ndarray]]:
    """A numpy kernel running `layer` in OpenCV (a one-layer net, read once)."""
    net = _read(layer, shapes)
    # OpenCV's forward() takes layer names: a one-top layer by its own name (its top may be in place)
    tops = [layer.name] if len(layer.top) == 1 else _tops(layer)

    def run(*arrays):
        for name, a in zip(layer.bottom, arrays):
            net.setInput(np.ascontiguousarray(a, dtype=np.float32), name)
        try:
            outs = net.forward(tops) if len(tops) > 1 else [net.forward(tops[0])]
        except Exception as e:  # noqa: BLE001 - cv2.error: name the layer
            raise KernelError(f"Caffe layer {layer.name!r} ({layer.type}) failed in OpenCV dnn: "
                              f"{str(e).strip().splitlines()[-1]}") from None
        return [np.array(o) for o in outs]
    return run
