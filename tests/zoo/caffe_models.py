"""The Caffe test zoo: the catalogue's test-size nets (aiacc.zoo.small.caffe_models, re-exported) and a net
with a Python layer, which only the tests need (aiacc keeps it opaque; OpenCV cannot run it).
"""
from __future__ import annotations

from aiacc.zoo.small import caffe_models as small
from aiacc.zoo.small.caffe_models import ALEXNET, LENET, OPENCV_MODELS, RESNET, SQUEEZENET, write  # noqa: F401

# A Python layer (OpenCV cannot run it): aiacc keeps it opaque and puts it back unchanged.
UNKNOWN = """
name: "WithPythonLayer"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 4 dim: 6 dim: 6 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }
layer { name: "custom" type: "Python" bottom: "conv1" top: "custom"
        python_param { module: "my_layers" layer: "ChannelGate" param_str: "{'floor': 0.25}" }
        param { lr_mult: 0 } }
layer { name: "relu" type: "ReLU" bottom: "custom" top: "custom" }
layer { name: "pool" type: "Pooling" bottom: "custom" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
"""

PROTOTXTS = {**small.PROTOTXTS, "unknown": UNKNOWN}


def build(name: str, seed: int = 0):
    """The zoo net `name` (one of PROTOTXTS) as a CaffeModel with random weights."""
    if name != "unknown":
        return small.build(name, seed)
    import numpy as np

    from aiacc.plugins.caffe import CaffeModel
    from aiacc.plugins.caffe.proto import array_to_blob

    model = CaffeModel.from_text(UNKNOWN, name=f"<zoo {name}>")
    # the Python layer carries one blob of its own (a per-channel gate)
    gate = np.random.default_rng(seed + 1).uniform(0.5, 1.5, (4,)).astype(np.float32)
    array_to_blob(gate, model.layer("custom").blobs.add())
    return model.fill_random(seed)
