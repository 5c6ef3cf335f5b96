"""Reading and writing Caffe's files: .prototxt (text NetParameter) and .caffemodel (binary NetParameter).

The schema is caffe.proto beside this file; caffe_pb2.py is generated from it once, at development time,
and committed (so users need no protoc). To regenerate after editing caffe.proto, from the repository root:

    python -m venv /tmp/protoc && /tmp/protoc/bin/pip install grpcio-tools
    /tmp/protoc/bin/python -m grpc_tools.protoc -I. --python_out=. aiacc/plugins/caffe/caffe.proto

The generated module needs a protobuf runtime of the same major version as the protoc that wrote it
(grpcio-tools 1.85 writes 7.x gencode, which the installed protobuf 7.x runtime accepts); with another
major, schema.py builds the same classes from the descriptor embedded in caffe_pb2.py.

This module also normalizes what older files say in other ways: legacy V1 `layers` are upgraded to V2
`layer`s, legacy net-level `input`/`input_shape`/`input_dim` fields are read as inputs, and blobs with the
legacy 4-d num/channels/height/width shape are read like `shape` ones.
"""
from __future__ import annotations

import os
from typing import Iterable

import numpy as np
from google.protobuf import text_format
from google.protobuf.message import DecodeError

from aiacc.errors import ParseError, UnsupportedError
from aiacc.plugins.caffe.schema import pb
from aiacc.plugins.caffe.unknown_fields import parse_keeping_unknown, placeholder, restore

NetParameter = pb.NetParameter
LayerParameter = pb.LayerParameter
BlobProto = pb.BlobProto


# ------------------------------------------------------------------------------------------------
# files
# ------------------------------------------------------------------------------------------------
def parse_prototxt(text: str, filename: str = "<prototxt>") -> pb.NetParameter:
    """Parse a prototxt; a syntax error becomes a ParseError giving the file, line and column. Fields of a
    layer the schema does not declare are kept as text (aiacc.plugins.caffe.unknown_fields)."""
    net = pb.NetParameter()
    try:
        parse_keeping_unknown(text, net)  # a fork's fields are kept as text, as OpenCV skips them
    except text_format.ParseError as e:
        where = f"line {e.GetLine()}, column {e.GetColumn()}" if e.GetLine() else "unknown line"
        message = str(e)
        # protobuf prefixes the message with "line:col : "; keep only the reason
        if e.GetLine() and message.startswith(f"{e.GetLine()}:"):
            message = message.split(" : ", 1)[-1]
        raise ParseError(f"{filename}: {where}: {message}") from None
    upgrade_net(net, filename)
    return net


def parse_caffemodel(data: bytes, filename: str = "<caffemodel>") -> pb.NetParameter:
    """Parse a binary caffemodel (a NetParameter holding the layers' blobs)."""
    net = pb.NetParameter()
    try:
        net.ParseFromString(data)
    except DecodeError as e:
        raise ParseError(f"{filename}: not a binary Caffe NetParameter ({e})") from None
    upgrade_net(net, filename)
    return net


def read_prototxt(path: str | os.PathLike) -> pb.NetParameter:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ParseError(f"cannot read prototxt {os.fspath(path)}: {e.strerror}") from None
    except UnicodeDecodeError as e:  # a binary file (a .caffemodel?) under a .prototxt name
        raise ParseError(f"{os.fspath(path)}: not a text prototxt: byte {e.start} is not UTF-8 (a binary file, "
                         f"perhaps a .caffemodel, named .prototxt?)") from None
    return parse_prototxt(text, os.fspath(path))


def read_caffemodel(path: str | os.PathLike) -> pb.NetParameter:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ParseError(f"cannot read caffemodel {os.fspath(path)}: {e.strerror}") from None
    return parse_caffemodel(data, os.fspath(path))


def to_prototxt(net: pb.NetParameter) -> str:
    """The net's structure as prototxt text (blobs left out)."""
    bare = pb.NetParameter()
    for desc, value in net.ListFields():
        if desc.name != "layer":
            _copy_field(bare, desc, value)
    kept: list[str] = []
    for layer in net.layer:  # field by field, leaving the blobs (copying them first took seconds for VGG)
        target = bare.layer.add()
        for desc, value in layer.ListFields():
            if desc.name == "aiacc_unknown_text":  # written back verbatim where the placeholders stand
                target.aiacc_unknown_text.extend(placeholder(len(kept) + i) for i in range(len(value)))
                kept += list(value)
            elif desc.name != "blobs":
                _copy_field(target, desc, value)
    return restore(text_format.MessageToString(bare), kept)


def _copy_field(target, desc, value) -> None:
    """Set one field of `target` (a message of the same type) to `value`."""
    repeated = desc.is_repeated if hasattr(desc, "is_repeated") else desc.label == desc.LABEL_REPEATED  # older protobuf
    if repeated:
        getattr(target, desc.name).extend(value)
    elif desc.message_type is not None:
        getattr(target, desc.name).CopyFrom(value)
    else:
        setattr(target, desc.name, value)


# ------------------------------------------------------------------------------------------------
# legacy forms
# ------------------------------------------------------------------------------------------------
_V1_TYPES = {
    "ABSVAL": "AbsVal", "ACCURACY": "Accuracy", "ARGMAX": "ArgMax", "BNLL": "BNLL", "CONCAT": "Concat",
    "CONTRASTIVE_LOSS": "ContrastiveLoss", "CONVOLUTION": "Convolution", "DATA": "Data",
    "DECONVOLUTION": "Deconvolution", "DROPOUT": "Dropout", "DUMMY_DATA": "DummyData",
    "EUCLIDEAN_LOSS": "EuclideanLoss", "ELTWISE": "Eltwise", "EXP": "Exp", "FLATTEN": "Flatten",
    "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output", "HINGE_LOSS": "HingeLoss", "IM2COL": "Im2col",
    "IMAGE_DATA": "ImageData", "INFOGAIN_LOSS": "InfogainLoss", "INNER_PRODUCT": "InnerProduct", "LRN": "LRN",
    "MEMORY_DATA": "MemoryData", "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss", "MVN": "MVN",
    "POOLING": "Pooling", "POWER": "Power", "RELU": "ReLU", "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss", "SILENCE": "Silence", "SOFTMAX": "Softmax",
    "SOFTMAX_LOSS": "SoftmaxWithLoss", "SPLIT": "Split", "SLICE": "Slice", "TANH": "TanH",
    "WINDOW_DATA": "WindowData", "THRESHOLD": "Threshold",
}

# V1 fields copied as they are (same message type in LayerParameter)
_V1_COPIED = ("bottom", "top", "name", "include", "exclude", "blobs", "loss_weight", "aiacc_unknown_text")


def upgrade_v1_layer(v1: pb.V1LayerParameter, where: str) -> pb.LayerParameter:
    """A V1 (`layers { type: CONVOLUTION ... }`) layer as a V2 LayerParameter."""
    if v1.HasField("layer"):
        raise UnsupportedError(f"{where}: layer {v1.name!r} uses the V0 layer format (a `layer` field inside "
                               f"`layers`); upgrade the net with Caffe's upgrade_net_proto_text tool first")
    layer = pb.LayerParameter()
    for field in _V1_COPIED:
        value = getattr(v1, field)
        if field in ("name",):
            if v1.HasField(field):
                setattr(layer, field, value)
        else:
            getattr(layer, field).extend(value)
    type_name = pb.V1LayerParameter.LayerType.Name(v1.type)
    if type_name == "NONE":
        raise ParseError(f"{where}: V1 layer {v1.name!r} has no type")
    layer.type = _V1_TYPES[type_name]
    for desc, value in v1.ListFields():
        if desc.name.endswith("_param") and desc.name in pb.LayerParameter.DESCRIPTOR.fields_by_name:
            getattr(layer, desc.name).CopyFrom(value)
    for i, lr in enumerate(v1.blobs_lr):
        spec = layer.param[i] if i < len(layer.param) else layer.param.add()
        spec.lr_mult = lr
    for i, decay in enumerate(v1.weight_decay):
        spec = layer.param[i] if i < len(layer.param) else layer.param.add()
        spec.decay_mult = decay
    for i, name in enumerate(v1.param):
        spec = layer.param[i] if i < len(layer.param) else layer.param.add()
        spec.name = name
    return layer


def upgrade_net(net: pb.NetParameter, where: str) -> None:
    """Upgrade V1 layers in place; a net mixing V1 and V2 layers is refused, as Caffe does."""
    if not net.layers:
        return
    if net.layer:
        raise ParseError(f"{where}: the net mixes V1 `layers` and V2 `layer` definitions")
    upgraded = [upgrade_v1_layer(v1, where) for v1 in net.layers]
    del net.layers[:]
    net.layer.extend(upgraded)


def legacy_inputs(net: pb.NetParameter, where: str) -> list[tuple[str, list[int] | None]]:
    """Inputs declared by the net-level `input` fields: (name, shape or None)."""
    names = list(net.input)
    if not names:
        if net.input_shape or net.input_dim:
            raise ParseError(f"{where}: input_shape/input_dim given without input names")
        return []
    if net.input_shape:
        if len(net.input_shape) != len(names):
            raise ParseError(f"{where}: {len(names)} inputs but {len(net.input_shape)} input_shape entries")
        return [(n, [int(d) for d in s.dim]) for n, s in zip(names, net.input_shape)]
    if net.input_dim:
        if len(net.input_dim) != 4 * len(names):
            raise ParseError(f"{where}: {len(names)} inputs need {4 * len(names)} input_dim values, "
                             f"got {len(net.input_dim)}")
        dims = [int(d) for d in net.input_dim]
        return [(n, dims[4 * i:4 * i + 4]) for i, n in enumerate(names)]
    return [(n, None) for n in names]


# ------------------------------------------------------------------------------------------------
# blobs
# ------------------------------------------------------------------------------------------------
def blob_shape(blob: pb.BlobProto) -> tuple[list[int], bool]:
    """(shape, legacy): the blob's shape, and whether it came from the legacy 4-d fields."""
    if blob.HasField("shape"):
        return [int(d) for d in blob.shape.dim], False
    legacy = [blob.num, blob.channels, blob.height, blob.width]
    if any(legacy):
        return [int(d) for d in legacy], True
    n = len(blob.double_data) or len(blob.data)
    return [n], True


def blob_to_array(blob: pb.BlobProto, where: str) -> np.ndarray:
    """A blob's data as a float32 array of its declared shape."""
    shape, _ = blob_shape(blob)
    if len(blob.double_data):
        data = np.asarray(blob.double_data, dtype=np.float64).astype(np.float32)
    else:
        data = np.asarray(blob.data, dtype=np.float32)
    count = int(np.prod(shape, dtype=np.int64))
    if data.size != count:
        raise ParseError(f"{where}: blob declares shape {shape} ({count} values) but holds {data.size} values")
    return data.reshape(shape)


def array_to_blob(array: np.ndarray, blob: pb.BlobProto | None = None) -> pb.BlobProto:
    """A float32 BlobProto (with the modern `shape` field) holding `array`."""
    blob = blob or pb.BlobProto()
    blob.Clear()
    a = np.asarray(array, dtype=np.float32)
    blob.shape.dim.extend(int(d) for d in a.shape)
    if a.size:
        # `data` (field 5) as its packed wire form, merged: 3x faster than extending the field with a list of
        # Python floats, which made writing an AlexNet/VGG-sized caffemodel take seconds per layer
        raw = np.ascontiguousarray(a, dtype="<f4").tobytes()
        blob.MergeFromString(_DATA_TAG + _varint(len(raw)) + raw)
    return blob


_DATA_TAG = bytes([(5 << 3) | 2])  # BlobProto.data: field 5, length-delimited (packed floats)


def _varint(n: int) -> bytes:
    """Protobuf's base-128 varint encoding of a non-negative integer."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def merge_weights(net: pb.NetParameter, weights: pb.NetParameter) -> None:
    """Copy blobs from a caffemodel into the layers of `net` with the same name (as Caffe's
    CopyTrainedLayersFrom: layers of the caffemodel that the net lacks are ignored)."""
    by_name = {layer.name: layer for layer in weights.layer if layer.blobs}
    for layer in net.layer:
        source = by_name.get(layer.name)
        if source is not None:
            del layer.blobs[:]
            layer.blobs.extend(source.blobs)


def layer_phase_ok(layer: pb.LayerParameter, phase: int = pb.TEST, stages: Iterable[str] = (),
                   level: int = 0) -> bool:
    """Whether Caffe would include the layer in a net of the given state (its include/exclude rules)."""
    stages = set(stages)

    def meets(rule: pb.NetStateRule) -> bool:
        if rule.HasField("phase") and rule.phase != phase:
            return False
        if rule.HasField("min_level") and level < rule.min_level:
            return False
        if rule.HasField("max_level") and level > rule.max_level:
            return False
        if any(s not in stages for s in rule.stage):
            return False
        if any(s in stages for s in rule.not_stage):
            return False
        return True

    if layer.include:
        return any(meets(r) for r in layer.include)
    return not any(meets(r) for r in layer.exclude)
