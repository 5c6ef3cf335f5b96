"""Caffe nets at test size (LeNet, a ResNet-style net, SqueezeNet, AlexNet): prototxt text written here,
random weights (fixed seeds) filled in code. The test zoo (tests/zoo/caffe_models.py) adds a net with a
Python layer.

Each builder returns a CaffeModel with weights; `write(model, dir)` saves NAME.prototxt + NAME.caffemodel
for the runtimes that read files (OpenCV dnn). Input sizes are small so a forward takes milliseconds.
LRN layers use k=1 because OpenCV 4.11's LRN ignores k.
"""
from __future__ import annotations

import os

LENET = """
name: "LeNet"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 1 dim: 28 dim: 28 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 6 kernel_size: 5 stride: 1 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
        convolution_param { num_output: 10 kernel_h: 3 kernel_w: 5 pad_h: 1 pad_w: 2 } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2"
        pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1" inner_product_param { num_output: 32 } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "drop1" type: "Dropout" bottom: "ip1" top: "ip1" dropout_param { dropout_ratio: 0.3 } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "ip2" top: "prob" }
"""

RESNET = """
name: "ResNetMini"
input: "data"
input_shape { dim: 1 dim: 3 dim: 16 dim: 16 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1 stride: 2 bias_term: false } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" batch_norm_param { eps: 0.001 } }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "res2a_branch2a" type: "Convolution" bottom: "conv1" top: "res2a_branch2a"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1 bias_term: false } }
layer { name: "bn2a_branch2a" type: "BatchNorm" bottom: "res2a_branch2a" top: "res2a_branch2a" }
layer { name: "scale2a_branch2a" type: "Scale" bottom: "res2a_branch2a" top: "res2a_branch2a"
        scale_param { bias_term: true } }
layer { name: "res2a_branch2a_relu" type: "ReLU" bottom: "res2a_branch2a" top: "res2a_branch2a" }
layer { name: "res2a_branch2b" type: "Convolution" bottom: "res2a_branch2a" top: "res2a_branch2b"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1 bias_term: false dilation: 1 } }
layer { name: "bn2a_branch2b" type: "BatchNorm" bottom: "res2a_branch2b" top: "res2a_branch2b" }
layer { name: "scale2a_branch2b" type: "Scale" bottom: "res2a_branch2b" top: "res2a_branch2b"
        scale_param { bias_term: true } }
layer { name: "res2a" type: "Eltwise" bottom: "conv1" bottom: "res2a_branch2b" top: "res2a" }
layer { name: "res2a_relu" type: "ReLU" bottom: "res2a" top: "res2a" }
layer { name: "res3a_branch1" type: "Convolution" bottom: "res2a" top: "res3a_branch1"
        convolution_param { num_output: 16 kernel_size: 1 stride: 2 } }
layer { name: "res3a_branch2a" type: "Convolution" bottom: "res2a" top: "res3a_branch2a"
        convolution_param { num_output: 16 kernel_size: 3 pad: 2 dilation: 2 stride: 2 } }
layer { name: "res3a_prelu" type: "PReLU" bottom: "res3a_branch2a" top: "res3a_branch2a" }
layer { name: "res3a" type: "Eltwise" bottom: "res3a_branch1" bottom: "res3a_branch2a" top: "res3a"
        eltwise_param { operation: SUM coeff: 0.5 coeff: -1.5 } }
layer { name: "res3a_max" type: "Eltwise" bottom: "res3a" bottom: "res3a_branch1" top: "res3a_max"
        eltwise_param { operation: MAX } }
layer { name: "res3a_prod" type: "Eltwise" bottom: "res3a_max" bottom: "res3a_branch2a" top: "res3a_prod"
        eltwise_param { operation: PROD } }
layer { name: "res3a_elu" type: "ELU" bottom: "res3a_prod" top: "res3a_elu" elu_param { alpha: 0.7 } }
layer { name: "pool5" type: "Pooling" bottom: "res3a_elu" top: "pool5" pooling_param { pool: AVE global_pooling: true } }
layer { name: "fc" type: "InnerProduct" bottom: "pool5" top: "fc" inner_product_param { num_output: 5 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""

SQUEEZENET = """
name: "SqueezeMini"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 17 dim: 17 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 8 kernel_size: 3 stride: 2 } }
layer { name: "relu_conv1" type: "ReLU" bottom: "conv1" top: "conv1" relu_param { negative_slope: 0.1 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "fire2/squeeze1x1" type: "Convolution" bottom: "pool1" top: "fire2/squeeze1x1"
        convolution_param { num_output: 4 kernel_size: 1 } }
layer { name: "fire2/relu_squeeze1x1" type: "ReLU" bottom: "fire2/squeeze1x1" top: "fire2/squeeze1x1" }
layer { name: "fire2/expand1x1" type: "Convolution" bottom: "fire2/squeeze1x1" top: "fire2/expand1x1"
        convolution_param { num_output: 6 kernel_size: 1 } }
layer { name: "fire2/relu_expand1x1" type: "ReLU" bottom: "fire2/expand1x1" top: "fire2/expand1x1" }
layer { name: "fire2/expand3x3" type: "Convolution" bottom: "fire2/squeeze1x1" top: "fire2/expand3x3"
        convolution_param { num_output: 6 kernel_size: 3 pad: 1 } }
layer { name: "fire2/relu_expand3x3" type: "ReLU" bottom: "fire2/expand3x3" top: "fire2/expand3x3" }
layer { name: "fire2/concat" type: "Concat" bottom: "fire2/expand1x1" bottom: "fire2/expand3x3" top: "fire2/concat" }
layer { name: "slice" type: "Slice" bottom: "fire2/concat" top: "part_a" top: "part_b" top: "part_c"
        slice_param { axis: 1 slice_point: 3 slice_point: 8 } }
layer { name: "sig" type: "Sigmoid" bottom: "part_a" top: "sig" }
layer { name: "tanh" type: "TanH" bottom: "part_b" top: "tanh" }
layer { name: "pow" type: "Power" bottom: "part_c" top: "pow" power_param { power: 2 scale: 0.5 shift: 1.5 } }
layer { name: "concat2" type: "Concat" bottom: "sig" bottom: "tanh" bottom: "pow" top: "concat2" concat_param { axis: 1 } }
layer { name: "split" type: "Split" bottom: "concat2" top: "s1" top: "s2" }
layer { name: "gate" type: "Scale" bottom: "s1" top: "gated" scale_param { bias_term: true } }
layer { name: "conv10" type: "Convolution" bottom: "gated" top: "conv10" convolution_param { num_output: 5 kernel_size: 1 } }
layer { name: "pool10" type: "Pooling" bottom: "conv10" top: "pool10" pooling_param { pool: AVE global_pooling: true } }
layer { name: "flat" type: "Flatten" bottom: "pool10" top: "flat" }
layer { name: "prob" type: "Softmax" bottom: "flat" top: "prob" }
layer { name: "side" type: "Reshape" bottom: "s2" top: "side" reshape_param { shape { dim: 0 dim: -1 dim: 4 } } }
"""

ALEXNET = """
name: "AlexMini"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 35 dim: 35 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 12 kernel_size: 5 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "norm1" type: "LRN" bottom: "conv1" top: "norm1" lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 k: 1 } }
layer { name: "pool1" type: "Pooling" bottom: "norm1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
        convolution_param { num_output: 16 pad: 2 kernel_size: 5 group: 2 } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "norm2" type: "LRN" bottom: "conv2" top: "norm2" lrn_param { local_size: 3 alpha: 0.001 beta: 0.75 k: 1 } }
layer { name: "pool2" type: "Pooling" bottom: "norm2" top: "pool2" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "conv3" type: "Convolution" bottom: "pool2" top: "conv3"
        convolution_param { num_output: 8 pad: 1 kernel_size: 3 group: 4 } }
layer { name: "relu3" type: "ReLU" bottom: "conv3" top: "conv3" }
layer { name: "up" type: "Deconvolution" bottom: "conv3" top: "up"
        convolution_param { num_output: 4 kernel_size: 4 stride: 2 pad: 1 } }
layer { name: "fc6" type: "InnerProduct" bottom: "up" top: "fc6" inner_product_param { num_output: 24 } }
layer { name: "relu6" type: "ReLU" bottom: "fc6" top: "fc6" }
layer { name: "drop6" type: "Dropout" bottom: "fc6" top: "fc6" dropout_param { dropout_ratio: 0.5 } }
layer { name: "fc8" type: "InnerProduct" bottom: "fc6" top: "fc8" inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "fc8" top: "prob" }
"""

PROTOTXTS = {"lenet": LENET, "resnet": RESNET, "squeezenet": SQUEEZENET, "alexnet": ALEXNET}

# nets OpenCV dnn can run (all of these)
OPENCV_MODELS = ("lenet", "resnet", "squeezenet", "alexnet")


def build(name: str, seed: int = 0):
    """The net `name` (one of PROTOTXTS) as a CaffeModel with random weights."""
    from aiacc.plugins.caffe import CaffeModel

    return CaffeModel.from_text(PROTOTXTS[name], name=f"<zoo {name}>").fill_random(seed)


def write(model, directory: str, name: str) -> tuple[str, str]:
    """Save NAME.prototxt and NAME.caffemodel in `directory`; returns both paths."""
    prototxt = os.path.join(directory, f"{name}.prototxt")
    caffemodel = os.path.join(directory, f"{name}.caffemodel")
    model.save(prototxt, caffemodel)
    return prototxt, caffemodel
