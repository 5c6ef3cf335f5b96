"""Converters for aten OpOverloads (programs from torch.export) whose arguments differ from the torch function
of the same name; the others reuse the torch converters (see importer.aten_converter)."""
from __future__ import annotations


import torch.nn.functional as F

from aiacc.plugins.torch.import_ops.common import tensor
from aiacc.plugins.torch.import_ops.elementwise import gelu, hardtanh, relu6, silu, softmax_like, unary
from aiacc.plugins.torch.import_ops.nn import (batch_norm, dropout, f_avgpool, f_bn, f_conv, f_linear, f_maxpool,
                                               layer_norm)
from aiacc.plugins.torch.import_ops.shape import expand, f_permute, flatten, view
from aiacc.plugins.torch.importer import ATEN, FUNCTIONS


def _aten_embedding(imp, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return imp.op("Gather", tensor(weight), tensor(indices), axis=0)


def _aten_bn_no_training(imp, x, weight, bias, running_mean, running_var, momentum, eps):
    y = batch_norm(imp, x, running_mean, running_var, weight, bias, False, momentum, eps)
    return (y, None, None)


def _aten_batch_norm(imp, x, weight, bias, running_mean, running_var, training, momentum, eps, cudnn=True):
    return f_bn(imp, x, running_mean, running_var, weight, bias, training, momentum, eps)


def _aten_dropout(imp, x, p, train):
    return dropout(imp, x, p, bool(train) and imp.training)


ATEN.update({
    "embedding": _aten_embedding,
    "_native_batch_norm_legit_no_training": _aten_bn_no_training,
    "batch_norm": _aten_batch_norm,
    "dropout": _aten_dropout,
    "linear": f_linear,
    "conv2d": f_conv(2), "conv1d": f_conv(1),
    "max_pool2d": f_maxpool(2), "avg_pool2d": f_avgpool(2),
    "adaptive_avg_pool2d": FUNCTIONS[F.adaptive_avg_pool2d],
    "gelu": gelu, "silu": silu, "hardswish": unary("HardSwish"), "relu6": relu6, "hardtanh": hardtanh,
    "layer_norm": lambda imp, x, shape, w=None, b=None, eps=1e-5, cudnn=True: layer_norm(imp, x, shape, w, b, eps),
    "softmax": softmax_like("Softmax"), "_softmax": lambda imp, x, dim, half: softmax_like("Softmax")(imp, x, dim),
    "view": view, "reshape": view, "flatten": flatten, "permute": f_permute, "expand": expand,
})  # scaled_dot_product_attention: the torch function's converter (same arguments)
