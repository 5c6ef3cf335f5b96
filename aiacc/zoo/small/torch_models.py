"""PyTorch models at test size, built in code (no torchvision, no downloads), random weights from fixed
seeds: ResNet-18 and -50, MobileNetV2, a BERT-style encoder and an MLP.

Every factory returns (model, example_inputs) with small inputs so a forward takes milliseconds on 2 cores;
`ZOO` maps a name to its factory. ResNet, MobileNetV2, the BERT encoder and the random init are the bundled
models' (aiacc.zoo.torch_models), built smaller here. The test zoo (tests/zoo/torch_models.py) adds a model
with opaque parts.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from aiacc.zoo import torch_models as bundled
from aiacc.zoo.torch_models import Bottleneck, MobileNetV2, ResNet

# the bundled models' random init: He-style weights, random BatchNorm statistics (so folding is really
# tested); returns the model in eval mode
_init = bundled._init


# ------------------------------------------------------------------------------------------------ ResNet
class BasicBlock(nn.Module):
    """ResNet-18/34's block (two 3x3 convolutions), for aiacc.zoo.torch_models.ResNet."""

    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.downsample = None
        if stride != 1 or cin != width:
            self.downsample = nn.Sequential(nn.Conv2d(cin, width, 1, stride, bias=False), nn.BatchNorm2d(width))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


def resnet18(batch: int = 2, size: int = 64, base: int = 16):
    torch.manual_seed(0)
    return _init(ResNet(BasicBlock, [2, 2, 2, 2], num_classes=10, base=base), 1), (torch.randn(batch, 3, size, size),)


def resnet50(batch: int = 2, size: int = 64, base: int = 16):
    torch.manual_seed(0)
    return _init(ResNet(Bottleneck, [3, 4, 6, 3], num_classes=10, base=base), 2), (torch.randn(batch, 3, size, size),)


# ------------------------------------------------------------------------------------------------ MobileNetV2
def mobilenet_v2(batch: int = 2, size: int = 64, width: float = 0.5):
    torch.manual_seed(0)
    return _init(MobileNetV2(num_classes=10, width=width), 3), (torch.randn(batch, 3, size, size),)


# ------------------------------------------------------------------------------------------------ BERT-style
class BertEncoder(bundled.BertEncoder):
    """The bundled BERT-style encoder, small, with LayerNorm eps 1e-5; returns a dict (hidden states and
    the pooled first token) so the tests cover dict outputs."""

    def __init__(self, vocab: int = 100, dim: int = 64, heads: int = 4, layers: int = 2, ff: int = 128,
                 max_len: int = 64, dropout: float = 0.1):
        super().__init__(vocab, dim, heads, layers, ff, max_len, dropout, eps=1e-5)

    def forward(self, input_ids):
        h, pooled = super().forward(input_ids)
        return {"last_hidden_state": h, "pooled": pooled}


def bert_encoder(batch: int = 2, seq: int = 16, **kw):
    torch.manual_seed(0)
    model = _init(BertEncoder(**kw), 4)
    return model, (torch.randint(0, 100, (batch, seq), generator=torch.Generator().manual_seed(5)),)


# ------------------------------------------------------------------------------------------------ MLP
class MLP(nn.Module):
    """Linear / ReLU / Dropout / GELU / LayerNorm; returns a tuple (logits, hidden)."""

    def __init__(self, din: int = 32, hidden: int = 64, dout: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(din, hidden)
        self.drop = nn.Dropout(0.25)
        self.fc2 = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.fc3 = nn.Linear(hidden, dout)

    def forward(self, x):
        h = self.drop(F.relu(self.fc1(x)))
        h = self.norm(F.gelu(self.fc2(h)) + h)
        return self.fc3(h), h


def mlp(batch: int = 4):
    torch.manual_seed(0)
    return _init(MLP(), 5), (torch.randn(batch, 32),)


ZOO = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
    "bert_encoder": bert_encoder,
    "mlp": mlp,
}
