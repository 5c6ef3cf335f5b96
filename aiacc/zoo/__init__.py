"""The bundled example models: ResNet-50, MobileNetV2 and a BERT-style encoder for every framework aiacc
supports, built in code with random weights from fixed seeds (no downloads).

    from aiacc import zoo
    model, example_inputs = zoo.build("torch", "resnet50")            # batch 1, 224x224
    model, example_inputs = zoo.build("tf", "bert_encoder", batch=8)

One module per framework (torch_models, tf_models, mxnet_models, caffe_models, onnx_models); each has
`resnet50(batch, size)`, `mobilenet_v2(batch, size)` and `bert_encoder(batch, seq, ...)` returning
(model, example_inputs) in that framework's natural form:

    torch   an nn.Module in eval mode (written here, no torchvision); inputs: a tuple of tensors
    tf      keras.applications ResNet50 / MobileNetV2 (weights=None) and a Keras encoder; inputs: a numpy
            array (NHWC images, int32 token ids)
    mxnet   Gluon model_zoo resnet50_v1 / mobilenetv2_1.0 (pretrained=False) and a Gluon encoder, all
            HybridBlocks; inputs: a tuple of numpy arrays
    caffe   a CaffeModel (prototxt written here, weights filled in code); inputs: {blob name: array}.
            Caffe has no BERT: BVLC Caffe has no layer for a product of two activations or LayerNorm.
    onnx    an onnx.ModelProto; inputs: {input name: array}

Sizes: images are 224x224 by default. The BERT-style encoder is BERT-base's shape scaled down so a
forward stays quick on a laptop CPU: 4 layers, hidden 256, 4 heads, feed-forward 1024, vocabulary
8192, sequence 128 (BERT-base: 12 layers, 768, 12 heads, 3072, 30522). Every builder takes these as
keyword arguments. The ImageNet models have 1000 classes; BatchNorm statistics are random (not the
identity) so that folding them changes real numbers.

The catalogue has two more parts, which tests and benchmarks share with the demo: `aiacc.zoo.small` (the
same architectures at test size, plus small nets of each framework; the test zoo in tests/zoo re-exports
them) and `aiacc.zoo.ir_models` (reference networks built directly as IR graphs, FULL and SMALL sizes).
`aiacc.examples` writes the ONNX builders' models as files. Names are the same everywhere; ALIASES maps the
other names a model goes by ("bert" is bert_encoder).

Importing this package imports no framework: a framework is imported when one of its models is built.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from aiacc.errors import UnsupportedError

FRAMEWORKS = ("torch", "tf", "mxnet", "caffe", "onnx")
MODELS = ("resnet50", "mobilenet_v2", "bert_encoder")

# the Python package each framework's models need (caffe needs only protobuf, which aiacc depends on)
_PACKAGES = {"torch": "torch", "tf": "tensorflow", "mxnet": "mxnet", "caffe": "google.protobuf", "onnx": "onnx"}

# other names the same models go by: `aiacc example bert` is the catalogue's bert_encoder
ALIASES = {"bert": "bert_encoder"}

# models a framework cannot express, with the reason
UNAVAILABLE = {("caffe", "bert_encoder"): "BVLC Caffe has no layer for a product of two activations "
                                           "(attention scores) nor LayerNorm"}


def installed(framework: str) -> bool:
    """Whether the framework's package is installed (found without importing it)."""
    if framework not in _PACKAGES:
        raise UnsupportedError(f"unknown framework {framework!r} (known: {', '.join(FRAMEWORKS)})")
    try:
        return importlib.util.find_spec(_PACKAGES[framework]) is not None
    except (ImportError, ValueError):
        return False


def module(framework: str):
    """The zoo module of `framework` (imports the framework)."""
    if framework not in FRAMEWORKS:
        raise UnsupportedError(f"unknown framework {framework!r} (known: {', '.join(FRAMEWORKS)})")
    return importlib.import_module(f"aiacc.zoo.{framework}_models")


def canonical_name(model: str) -> str:
    """The catalogue's name for `model` (an alias such as "bert" resolved)."""
    return ALIASES.get(model, model)


def has(framework: str, model: str) -> bool:
    """Whether the zoo has `model` (or an alias of it) for `framework`."""
    model = canonical_name(model)
    return model in MODELS and (framework, model) not in UNAVAILABLE


def build(framework: str, model: str, *, batch: int = 1, **kw: Any):
    """(model, example_inputs) of bundled `model` for `framework`; size= (images) or seq= (BERT) and the
    builder's other keyword arguments pass through. Aliases (ALIASES) are accepted."""
    model = canonical_name(model)
    if model not in MODELS:
        raise UnsupportedError(f"unknown zoo model {model!r} (known: {', '.join(MODELS)})")
    if (framework, model) in UNAVAILABLE:
        raise UnsupportedError(f"no {model} for {framework}: {UNAVAILABLE[framework, model]}")
    return getattr(module(framework), model)(batch=batch, **kw)
