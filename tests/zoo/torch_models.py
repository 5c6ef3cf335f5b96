"""The PyTorch test zoo: the catalogue's test-size models (aiacc.zoo.small.torch_models, re-exported) and a
model with opaque parts only the tests need (a custom autograd Function and a submodule with Python control
flow on tensor values). `ZOO` maps a name to its factory; factories return (model, example_inputs).
"""
from __future__ import annotations

import torch
from torch import nn

from aiacc.zoo.small import torch_models as small
from aiacc.zoo.small.torch_models import (MLP, BasicBlock, BertEncoder, bert_encoder, mlp,  # noqa: F401
                                          mobilenet_v2, resnet18, resnet50)

_init = small._init


# ------------------------------------------------------------------------------------------------ opaque parts
class ScaledRelu(torch.autograd.Function):
    """relu(x) * 2 with a deliberately different backward (3x the relu gradient), so a test can tell
    whether the custom backward survived the round trip."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0) * 2

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x > 0).to(grad.dtype) * 3


class DataDependent(nn.Module):
    """Python control flow on a tensor value that no trace holds: a loop whose trip count is read from the
    data with int() (a value guard fixes which way a branch goes, not a count), so it stays opaque."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        for _ in range(1 + int((x > 0).sum()) % 2):
            x = x * self.scale
        return x - self.scale


class WithOpaque(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.branch = DataDependent(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = ScaledRelu.apply(self.bn(self.conv(x)))
        x = self.branch(x.mean(dim=(2, 3)))
        return self.fc(torch.relu(x))


def with_opaque(batch: int = 2, size: int = 16):
    torch.manual_seed(0)
    return _init(WithOpaque(), 6), (torch.randn(batch, 3, size, size),)


ZOO = {**small.ZOO, "with_opaque": with_opaque}
