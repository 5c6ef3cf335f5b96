"""aiacc Caffe plugin: Caffe nets (.prototxt + .caffemodel) to the aiacc IR and back.

    from aiacc.plugins.caffe import CaffeModel
    model = CaffeModel.load("deploy.prototxt", "weights.caffemodel")
    fast = aiacc.optimize(model, {"data": image})      # a CaffeModel again
    fast.save("fast.prototxt", "fast.caffemodel")      # loads in Caffe and OpenCV dnn
    ort = aiacc.optimize(model, {"data": image}, backend="onnxruntime")   # OrtCaffeModel: same forward()

There is no Caffe runtime: files are read and written with protobuf through the schema in caffe.proto
(caffe_pb2.py is generated from it), and CaffeModel.forward runs on aiacc's reference executor.
Submodules: proto (files, legacy upgrades, blobs), unknown_fields (the forks' fields kept as text), importer
(layers -> IR), layer_kernels (numpy kernels of opaque layers OpenCV cannot run), exporter (IR -> layers),
model (CaffeModel), ort (OrtCaffeModel, backend='onnxruntime'), translator (the Plugin; `plugin` here), files (the
CLI's entry points). Import-light: CaffeModel, OrtCaffeModel, register_layer and unregister_layer are
imported (with protobuf) on first use.
"""
from __future__ import annotations

import importlib
from typing import Any

from aiacc.plugins.caffe.translator import PLUGIN as plugin

trace, optimize, export = plugin.trace, plugin.optimize, plugin.export

# the Caffe classes users construct, imported (with protobuf) only when asked for
_LAZY = {"CaffeModel": "aiacc.plugins.caffe.model", "OrtCaffeModel": "aiacc.plugins.caffe.ort",
         "register_layer": "aiacc.plugins.caffe.importer", "unregister_layer": "aiacc.plugins.caffe.importer",
         "CaffeTranslator": "aiacc.plugins.caffe.translator"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["plugin", "trace", "optimize", "export", "CaffeModel", "OrtCaffeModel", "register_layer",
           "unregister_layer"]
