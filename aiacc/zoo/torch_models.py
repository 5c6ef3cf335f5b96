"""PyTorch zoo: ResNet-50, MobileNetV2 and a BERT-style encoder written in code (torchvision's layouts, no
torchvision), random weights from fixed seeds. See aiacc.zoo for sizes. The classes take their sizes as
arguments: the test-size catalogue (aiacc.zoo.small.torch_models) builds its small versions from them."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _init(model: nn.Module, seed: int) -> nn.Module:
    """He-style random weights from `seed` and random BatchNorm statistics (so folding them is real)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * (2.0 / p[0].numel()) ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if name.endswith("weight") else 0.0))
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) * 0.5 + 0.75)
    return model.eval()


def _images(batch: int, size: int, seed: int):
    return (torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed)),)


# ------------------------------------------------------------------------------------------------ ResNet-50
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

    def forward(self, x):  # torchvision's order: the projection shortcut runs after the main branch
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += x if self.downsample is None else self.downsample(x)
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision's ResNet layout: 7x7 stem, four stages of `block`s (`layers` per stage, widths base *
    1, 2, 4, 8), global pooling, classifier. `block` is a class with `expansion` and (cin, width, stride)."""

    def __init__(self, block=Bottleneck, layers=(3, 4, 6, 3), num_classes: int = 1000, base: int = 64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, base, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(base)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin, stages = base, []
        for i, n in enumerate(layers):
            width, blocks = base * 2 ** i, []
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
        return self.fc(torch.flatten(self.avgpool(x), 1))


class ResNet50(ResNet):
    """torchvision's ResNet-50 v1.5: [3, 4, 6, 3] bottlenecks (stride in the 3x3 convolution)."""

    def __init__(self, num_classes: int = 1000, base: int = 64):
        super().__init__(Bottleneck, (3, 4, 6, 3), num_classes, base)


def resnet50(batch: int = 1, size: int = 224, num_classes: int = 1000):
    """ResNet-50 and a (batch, 3, size, size) image batch."""
    return _init(ResNet50(num_classes), 2), _images(batch, size, 10)


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
    """torchvision's MobileNetV2 (width 1.0): inverted residuals, depthwise convs, ReLU6."""

    CFG = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
           (6, 320, 1, 1)]

    def __init__(self, num_classes: int = 1000, width: float = 1.0):
        super().__init__()
        cin = int(32 * width)
        features = [ConvBNReLU(3, cin, stride=2)]
        for t, c, n, s in self.CFG:
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


def mobilenet_v2(batch: int = 1, size: int = 224, num_classes: int = 1000, width: float = 1.0):
    """MobileNetV2 and a (batch, 3, size, size) image batch."""
    return _init(MobileNetV2(num_classes, width), 3), _images(batch, size, 11)


# ------------------------------------------------------------------------------------------------ BERT-style
class BertEncoder(nn.Module):
    """Token + position embeddings, LayerNorm, nn.TransformerEncoder (GELU, batch_first, post-norm), a tanh
    pooler on the first token. Returns (last hidden state, pooled). `eps`: every LayerNorm's epsilon."""

    def __init__(self, vocab: int = 8192, hidden: int = 256, heads: int = 4, layers: int = 4, ffn: int = 1024,
                 max_len: int = 512, dropout: float = 0.1, eps: float = 1e-12):
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(max_len, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(hidden, heads, ffn, dropout, activation="gelu", batch_first=True,
                                           layer_norm_eps=eps)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.pooler = nn.Linear(hidden, hidden)

    def forward(self, input_ids):
        positions = torch.arange(input_ids.size(1), device=input_ids.device)
        x = self.dropout(self.norm(self.tokens(input_ids) + self.positions(positions)))
        h = self.encoder(x)
        return h, torch.tanh(self.pooler(h[:, 0]))


def bert_encoder(batch: int = 1, seq: int = 128, vocab: int = 8192, hidden: int = 256, heads: int = 4,
                 layers: int = 4, ffn: int = 1024):
    """The BERT-style encoder and (batch, seq) int64 token ids."""
    model = BertEncoder(vocab, hidden, heads, layers, ffn, max_len=max(512, seq))
    # embeddings and linear layers: He-style init keeps activations O(1) through the post-norm layers
    _init(model, 4)
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(5))
    return model, (ids,)
