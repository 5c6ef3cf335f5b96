"""PyTorch models the tests share, built in code (no torchvision, no downloads), random weights from fixed
seeds: ResNet-18 and -50, MobileNetV2, a BERT-style encoder, an MLP, and a model with opaque parts (a
custom autograd Function and a submodule with Python control flow on tensor values).

Every factory returns (model, example_inputs) with small inputs so the tests stay fast on 2 cores;
`ZOO` maps a name to its factory.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _init(model: nn.Module, seed: int) -> nn.Module:
    """Deterministic weights, and non-trivial BatchNorm statistics so folding them is really tested."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) * (2.0 / fan_in) ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if name.endswith("weight") else 0.0))
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) * 0.5 + 0.75)
    return model


# ------------------------------------------------------------------------------------------------ ResNet
class BasicBlock(nn.Module):
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


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        out = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != out:
            self.downsample = nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision's ResNet layout (stem, four stages, global pooling, classifier)."""

    def __init__(self, block, layers, num_classes: int = 10, base: int = 64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, base, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(base)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = base
        stages = []
        for i, n in enumerate(layers):
            width = base * 2 ** i
            blocks = []
            for j in range(n):
                blocks.append(block(cin, width, 2 if j == 0 and i > 0 else 1))
                cin = width * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet18(batch: int = 2, size: int = 64, base: int = 16):
    torch.manual_seed(0)
    return _init(ResNet(BasicBlock, [2, 2, 2, 2], base=base), 1).eval(), (torch.randn(batch, 3, size, size),)


def resnet50(batch: int = 2, size: int = 64, base: int = 16):
    torch.manual_seed(0)
    return _init(ResNet(Bottleneck, [3, 4, 6, 3], base=base), 2).eval(), (torch.randn(batch, 3, size, size),)


# ------------------------------------------------------------------------------------------------ MobileNetV2
class ConvBNReLU(nn.Sequential):
    def __init__(self, cin, cout, kernel=3, stride=1, groups=1):
        super().__init__(nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers = [] if expand == 1 else [ConvBNReLU(cin, hidden, 1)]
        layers += [ConvBNReLU(hidden, hidden, stride=stride, groups=hidden),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 10, width: float = 0.5):
        super().__init__()
        cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
               (6, 320, 1, 1)]
        cin = int(32 * width)
        features = [ConvBNReLU(3, cin, stride=2)]
        for t, c, n, s in cfg:
            cout = max(8, int(c * width))
            for i in range(n):
                features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        last = 1280 if width <= 1.0 else int(1280 * width)
        features.append(ConvBNReLU(cin, last, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

    def forward(self, x):
        x = self.features(x)
        x = F.adaptive_avg_pool2d(x, 1).reshape(x.shape[0], -1)
        return self.classifier(x)


def mobilenet_v2(batch: int = 2, size: int = 64, width: float = 0.5):
    torch.manual_seed(0)
    return _init(MobileNetV2(width=width), 3).eval(), (torch.randn(batch, 3, size, size),)


# ------------------------------------------------------------------------------------------------ BERT-style
class BertEncoder(nn.Module):
    """Token + position embeddings, LayerNorm, nn.TransformerEncoder (GELU, batch_first), a tanh pooler.
    Returns a dict (hidden states and the pooled first token)."""

    def __init__(self, vocab: int = 100, dim: int = 64, heads: int = 4, layers: int = 2, ff: int = 128,
                 max_len: int = 64, dropout: float = 0.1):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(max_len, dim)
        self.norm = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(dim, heads, ff, dropout, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.pooler = nn.Linear(dim, dim)

    def forward(self, input_ids):
        positions = torch.arange(input_ids.size(1), device=input_ids.device)
        x = self.dropout(self.norm(self.tokens(input_ids) + self.positions(positions)))
        h = self.encoder(x)
        return {"last_hidden_state": h, "pooled": torch.tanh(self.pooler(h[:, 0]))}


def bert_encoder(batch: int = 2, seq: int = 16, **kw):
    torch.manual_seed(0)
    model = _init(BertEncoder(**kw), 4).eval()
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
    return _init(MLP(), 5).eval(), (torch.randn(batch, 32),)


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
    """Python control flow on a tensor value: fx cannot trace it."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        if x.mean() > 0:
            return x * self.scale
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
    return _init(WithOpaque(), 6).eval(), (torch.randn(batch, 3, size, size),)


ZOO = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
    "bert_encoder": bert_encoder,
    "mlp": mlp,
    "with_opaque": with_opaque,
}
