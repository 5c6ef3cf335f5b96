"""aiacc Caffe plugin: Caffe nets (.prototxt + .caffemodel) to the aiacc IR and back.

    from aiacc.plugins.caffe import CaffeModel
    model = CaffeModel.load("deploy.prototxt", "weights.caffemodel")
    fast = aiacc.optimize(model, {"data": image})      # a CaffeModel again
    fast.save("fast.prototxt", "fast.caffemodel")      # loads in Caffe and OpenCV dnn
    ort = aiacc.optimize(model, {"data": image}, backend="onnxruntime")   # OrtCaffeModel: same forward()

There is no Caffe runtime: files are read and written with protobuf through the schema in caffe.proto
(caffe_pb2.py is generated from it), and CaffeModel.forward runs on aiacc's reference executor.
Submodules: proto (files, legacy upgrades, blobs), importer (layers -> IR), exporter (IR -> layers),
model (CaffeModel), ort (OrtCaffeModel, backend='onnxruntime'), translator (the plugin API), files (the CLI's entry points).
"""
from __future__ import annotations

from typing import Any

from aiacc.plugins.base import optimize_model
from aiacc.plugins.caffe.importer import register_layer, unregister_layer  # noqa: F401
from aiacc.plugins.caffe.model import CaffeModel  # noqa: F401
from aiacc.plugins.caffe.ort import OrtCaffeModel  # noqa: F401
from aiacc.plugins.caffe.translator import CaffeTranslator

_translator = CaffeTranslator()


def trace(model: CaffeModel, example_inputs: Any = None, **options: Any):
    """Translate a CaffeModel into an aiacc IR Graph."""
    return _translator.trace(model, example_inputs, **options)


def optimize(model: CaffeModel, example_inputs: Any = None, **options: Any) -> CaffeModel:
    """Optimize a CaffeModel; returns a CaffeModel (see aiacc.optimize for the options)."""
    return optimize_model(_translator, model, example_inputs, **options)


def export(graph, **options: Any) -> CaffeModel:
    """Turn an IR graph into a CaffeModel."""
    return _translator.export(graph, **options)


__all__ = ["CaffeModel", "OrtCaffeModel", "CaffeTranslator", "register_layer", "unregister_layer", "trace", "optimize", "export"]
