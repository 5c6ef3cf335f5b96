"""Caffe zoo: ResNet-50 (the layout of Kaiming He's ResNet-50-deploy.prototxt) and MobileNetV2 (the layout
of the widely used MobileNet-Caffe port: depthwise convolutions as grouped Convolution, ReLU in place of
ReLU6, which BVLC Caffe lacks), prototxt written here, random weights (fixed seed) filled in code.

Each builder returns (CaffeModel, {"data": image batch}). Caffe has no BERT-style encoder (see aiacc.zoo).
"""
from __future__ import annotations

import numpy as np

from aiacc.errors import UnsupportedError


class PrototxtWriter:
    """Writes a Caffe net's prototxt layer by layer: an Input layer for `input_shape`, then `layer()` and
    the helpers for the layers the zoo nets use. conv_bn() emits the Convolution + BatchNorm + Scale
    (+ ReLU) quartet of BVLC-era nets. The test zoo (tests/zoo/shared_arch.py) writes its nets with it."""

    def __init__(self, name: str, input_shape, input_name: str = "data"):
        dims = " ".join(f"dim: {d}" for d in input_shape)
        self.lines = [f'name: "{name}"',
                      f'layer {{ name: "{input_name}" type: "Input" top: "{input_name}" '
                      f"input_param {{ shape {{ {dims} }} }} }}"]

    def add(self, text: str) -> None:
        self.lines.append(f"layer {{ {text} }}")

    def layer(self, name: str, type_: str, bottom: str, top: str, params: str = "") -> None:
        """One layer with one bottom and one top (`params`: its *_param text)."""
        self.add(f'name: "{name}" type: "{type_}" bottom: "{bottom}" top: "{top}"' + (f" {params}" if params else ""))

    def conv(self, name: str, bottom: str, top: str, cout: int, k: int, stride: int = 1, pad: int = 0,
             group: int = 1, bias: bool = True) -> None:
        group_txt = f" group: {group}" if group > 1 else ""
        self.layer(name, "Convolution", bottom, top, f"convolution_param {{ num_output: {cout} kernel_size: {k} "
                   f"stride: {stride} pad: {pad}{group_txt} bias_term: {'true' if bias else 'false'} }}")

    def batchnorm_scale(self, blob: str, bn: str, scale: str, eps: float = 1e-5) -> None:
        """BatchNorm (normalization only, in place) followed by Scale (the affine part)."""
        self.layer(bn, "BatchNorm", blob, blob, f"batch_norm_param {{ use_global_stats: true eps: {eps} }}")
        self.layer(scale, "Scale", blob, blob, "scale_param { bias_term: true }")

    def inner_product(self, name: str, bottom: str, top: str, n: int) -> None:
        self.layer(name, "InnerProduct", bottom, top, f"inner_product_param {{ num_output: {n} }}")

    def conv_bn(self, bottom: str, name: str, cout: int, k: int, stride: int = 1, pad: int = 0, group: int = 1,
                relu: bool = True, bn: str | None = None, scale: str | None = None, bias: bool = False) -> str:
        self.conv(name, bottom, name, cout, k, stride, pad, group, bias)
        self.batchnorm_scale(name, bn or f"{name}/bn", scale or f"{name}/scale")
        if relu:
            self.layer(f"{name}_relu", "ReLU", name, name)
        return name

    def head(self, bottom: str, num_classes: int) -> None:
        self.layer("pool5", "Pooling", bottom, "pool5", "pooling_param { pool: AVE global_pooling: true }")
        self.inner_product(f"fc{num_classes}", "pool5", f"fc{num_classes}", num_classes)
        self.layer("prob", "Softmax", f"fc{num_classes}", "prob")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _model(text: str, name: str, seed: int):
    from aiacc.plugins.caffe import CaffeModel

    return CaffeModel.from_text(text, name=f"<aiacc.zoo {name}>").fill_random(seed)


def _images(batch: int, size: int, seed: int) -> dict[str, np.ndarray]:
    return {"data": np.random.default_rng(seed).standard_normal((batch, 3, size, size)).astype(np.float32)}


def resnet50_prototxt(batch: int = 1, size: int = 224, num_classes: int = 1000) -> str:
    """ResNet-50 (v1: stride in the first 1x1 of a stage) as prototxt, layer names as in He's release."""
    net = PrototxtWriter("ResNet-50", (batch, 3, size, size))
    net.conv_bn("data", "conv1", 64, 7, 2, 3, bn="bn_conv1", scale="scale_conv1", bias=True)
    net.add('name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" '
            "pooling_param { pool: MAX kernel_size: 3 stride: 2 }")
    x, cin = "pool1", 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        for i in range(blocks):
            tag = f"{stage + 2}{chr(ord('a') + i)}"
            stride = 2 if i == 0 and stage > 0 else 1

            def cb(bottom, branch, cout, k, s=1, pad=0, relu=True):
                return net.conv_bn(bottom, f"res{tag}_{branch}", cout, k, s, pad, relu=relu,
                                   bn=f"bn{tag}_{branch}", scale=f"scale{tag}_{branch}")

            short = cb(x, "branch1", width * 4, 1, stride, relu=False) if i == 0 else x
            y = cb(x, "branch2a", width, 1, stride)
            y = cb(y, "branch2b", width, 3, 1, 1)
            y = cb(y, "branch2c", width * 4, 1, relu=False)
            net.add(f'name: "res{tag}" type: "Eltwise" bottom: "{short}" bottom: "{y}" top: "res{tag}"')
            net.add(f'name: "res{tag}_relu" type: "ReLU" bottom: "res{tag}" top: "res{tag}"')
            x, cin = f"res{tag}", width * 4
    net.head(x, num_classes)
    return net.text()


def mobilenet_v2_prototxt(batch: int = 1, size: int = 224, num_classes: int = 1000) -> str:
    """MobileNetV2 (width 1.0) as prototxt: expand 1x1, depthwise 3x3 (group = channels), linear 1x1."""
    net = PrototxtWriter("MobileNetV2", (batch, 3, size, size))
    x = net.conv_bn("data", "conv1", 32, 3, 2, 1)
    cin = 32
    cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
           (6, 320, 1, 1)]
    for stage, (t, c, n, s) in enumerate(cfg):
        for i in range(n):
            name = f"conv{stage + 2}_{i + 1}"
            stride = s if i == 0 else 1
            hidden = cin * t
            y = net.conv_bn(x, f"{name}/expand", hidden, 1) if t != 1 else x
            y = net.conv_bn(y, f"{name}/dwise", hidden, 3, stride, 1, group=hidden)
            y = net.conv_bn(y, f"{name}/linear", c, 1, relu=False)
            if stride == 1 and cin == c:
                net.add(f'name: "block_{stage + 2}_{i + 1}" type: "Eltwise" bottom: "{x}" bottom: "{y}" '
                        f'top: "block_{stage + 2}_{i + 1}"')
                y = f"block_{stage + 2}_{i + 1}"
            x, cin = y, c
    x = net.conv_bn(x, "conv9", 1280, 1)
    net.head(x, num_classes)
    return net.text()


def resnet50(batch: int = 1, size: int = 224, num_classes: int = 1000):
    """ResNet-50 as a CaffeModel and {"data": (batch, 3, size, size) images}."""
    return _model(resnet50_prototxt(batch, size, num_classes), "resnet50", 2), _images(batch, size, 10)


def mobilenet_v2(batch: int = 1, size: int = 224, num_classes: int = 1000):
    """MobileNetV2 as a CaffeModel and {"data": (batch, 3, size, size) images}."""
    return _model(mobilenet_v2_prototxt(batch, size, num_classes), "mobilenet_v2", 3), _images(batch, size, 11)


def bert_encoder(batch: int = 1, seq: int = 128, **kw):
    """Not available: BVLC Caffe cannot express attention (see aiacc.zoo.UNAVAILABLE)."""
    from aiacc.zoo import UNAVAILABLE

    raise UnsupportedError(f"no bert_encoder for caffe: {UNAVAILABLE['caffe', 'bert_encoder']}")
