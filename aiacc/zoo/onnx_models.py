"""ONNX zoo: ResNet-50 and the BERT-style encoder of aiacc.examples, and MobileNetV2, as onnx.ModelProto
built with onnx.helper (random weights, fixed seeds). Inputs are {input name: array}. See aiacc.zoo."""
from __future__ import annotations

import math

import numpy as np

from aiacc.examples import _Builder, bert_encoder_onnx, resnet50_onnx


def _images(batch: int, size: int, seed: int, name: str = "input") -> dict[str, np.ndarray]:
    return {name: np.random.default_rng(seed).standard_normal((batch, 3, size, size)).astype(np.float32)}


def resnet50(batch: int = 1, size: int = 224, num_classes: int = 1000):
    """ResNet-50 v1.5 (symbolic batch) and {"input": (batch, 3, size, size)}."""
    return resnet50_onnx(image_size=size, num_classes=num_classes), _images(batch, size, 10)


def mobilenet_v2(batch: int = 1, size: int = 224, num_classes: int = 1000, seed: int = 3):
    """MobileNetV2 (width 1.0: Conv + BatchNormalization + Clip(0, 6), depthwise convs, residual Adds,
    GlobalAveragePool, Gemm) with a symbolic batch, and {"input": (batch, 3, size, size)}."""
    from onnx import TensorProto

    b = _Builder(seed)
    rng = b.rng
    six, zero = b.init("relu6.max", np.float32(6.0)), b.init("relu6.min", np.float32(0.0))

    def conv_bn(x, cin, cout, k, stride, name, groups=1, relu6=True):
        w = rng.standard_normal((cout, cin // groups, k, k)).astype(np.float32) * math.sqrt(2.0 / (cin // groups * k * k))
        y = b.node("Conv", [x, b.init(f"{name}.weight", w)], name=f"{name}.conv", kernel_shape=[k, k],
                   strides=[stride, stride], pads=[k // 2] * 4, group=groups)
        params = [b.init(f"{name}.bn.{p}", v) for p, v in (
            ("scale", rng.uniform(0.5, 1.5, cout).astype(np.float32)),
            ("bias", rng.normal(0, 0.1, cout).astype(np.float32)),
            ("mean", rng.normal(0, 0.1, cout).astype(np.float32)),
            ("var", rng.uniform(0.5, 1.5, cout).astype(np.float32)))]
        y = b.node("BatchNormalization", [y, *params], name=f"{name}.bn", epsilon=1e-5)
        return b.node("Clip", [y, zero, six], name=f"{name}.relu6") if relu6 else y

    y = conv_bn("input", 3, 32, 3, 2, "stem")
    cin = 32
    cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
           (6, 320, 1, 1)]
    for stage, (t, c, n, s) in enumerate(cfg):
        for i in range(n):
            name, stride, hidden = f"block{stage}.{i}", s if i == 0 else 1, cin * t
            h = conv_bn(y, cin, hidden, 1, 1, f"{name}.expand") if t != 1 else y
            h = conv_bn(h, hidden, hidden, 3, stride, f"{name}.dw", groups=hidden)
            h = conv_bn(h, hidden, c, 1, 1, f"{name}.project", relu6=False)
            y = b.node("Add", [y, h], name=f"{name}.add") if stride == 1 and cin == c else h
            cin = c
    y = conv_bn(y, cin, 1280, 1, 1, "last")
    y = b.node("Flatten", [b.node("GlobalAveragePool", [y], name="pool")], name="flatten", axis=1)
    fc_w = rng.standard_normal((num_classes, 1280)).astype(np.float32) / math.sqrt(1280)
    y = b.node("Gemm", [y, b.init("fc.weight", fc_w), b.init("fc.bias", np.zeros(num_classes, np.float32))],
               name="fc", transB=1)
    inp = b.helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, size, size])
    out = b.helper.make_tensor_value_info(y, TensorProto.FLOAT, ["N", num_classes])
    return b.model("mobilenet_v2", [inp], [out]), _images(batch, size, 11)


def bert_encoder(batch: int = 1, seq: int = 128, vocab: int = 8192, hidden: int = 256, heads: int = 4,
                 layers: int = 4, ffn: int = 1024):
    """The BERT-style encoder of aiacc.examples (with an attention mask input) and its feeds: random token
    ids and a mask that pads the last quarter of every sequence."""
    model = bert_encoder_onnx(vocab=vocab, hidden=hidden, heads=heads, layers=layers, ffn=ffn,
                              max_len=max(512, seq))
    rng = np.random.default_rng(5)
    mask = np.ones((batch, seq), np.int64)
    mask[:, seq - seq // 4:] = 0
    return model, {"input_ids": rng.integers(0, vocab, (batch, seq), dtype=np.int64), "attention_mask": mask}
