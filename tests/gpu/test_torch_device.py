"""The torch native export follows .to(device) / .to(dtype): every tensor it holds is a registered parameter
or buffer (no numpy array, no unregistered tensor attribute, no tensor literal in the fx graph), and
factory calls (torch.arange, torch.full) are made on the device the module runs on. Checked on CPU with
the meta device (every tensor moves, the forward runs on meta inputs with the right shapes) and float64;
on CUDA (skipped without one): optimize on a CUDA model, .to("cuda") after optimize."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import _pytree as pytree

import aiacc
from aiacc.core import parse
from tests.plugins.torch._helpers import assert_close_rel, leaves

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device (torch.cuda.is_available() is False)")


# ------------------------------------------------------------------------------------------------ models
class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))) + x)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(2))
        self.block = Block(8)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        y = self.block(self.stem(x))
        y = F.interpolate(y, scale_factor=2.0, mode="nearest")
        return self.head(F.adaptive_avg_pool2d(y, 1).flatten(1))


class Encoder(nn.Module):
    """A BERT-shaped layer: embeddings with position ids from torch.arange, attention, LayerNorm, GELU."""

    def __init__(self, vocab=50, d=16, heads=2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(32, d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff1, self.ff2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads, self.d = heads, d

    def forward(self, ids):
        b, s = ids.shape
        pos = torch.arange(s, device=ids.device).unsqueeze(0)
        x = self.tok(ids) + self.pos(pos)
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / (self.d // self.heads) ** 0.5, -1) @ v
        x = self.ln1(x + self.out(att.transpose(1, 2).reshape(b, s, self.d)))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class Unknown(nn.Module):
    """An opaque submodule (iterates over a tensor, which torch.fx cannot trace) holding a buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("shift", torch.full((5,), 0.5))

    def forward(self, x):
        return torch.stack([row + self.shift for row in x])


class WithOpaque(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.unknown = nn.Linear(4, 5), Unknown()

    def forward(self, x):
        return torch.tanh(self.unknown(self.lin(x))) * 2.0 + torch.ones(5)


def _models():
    torch.manual_seed(0)
    cnn = SmallCNN().eval()
    enc = Encoder().eval()
    opq = WithOpaque().eval()
    return {
        "cnn": (cnn, (torch.randn(2, 3, 16, 16),)),
        "encoder": (enc, (torch.randint(0, 50, (2, 7)),)),
        "opaque": (opq, (torch.randn(3, 4),)),
    }


MODELS = _models()


# ------------------------------------------------------------------------------------------------ helpers
def stray_tensors(module: nn.Module) -> list[str]:
    """Every tensor (or numpy array) the module holds that .to() would not move: a tensor attribute that is
    not a registered parameter or buffer, a numpy array attribute, a tensor or array literal in an fx graph."""
    found = []
    for mname, sub in module.named_modules():
        registered = set(sub._parameters) | set(sub._buffers)
        for key, val in vars(sub).items():
            if key in ("_parameters", "_buffers", "_modules") or key in registered:
                continue
            for leaf in pytree.tree_leaves(val) if isinstance(val, (list, tuple, dict)) else [val]:
                if isinstance(leaf, (torch.Tensor, np.ndarray)):
                    found.append(f"{mname or '<root>'}.{key}: {type(leaf).__name__}")
        graph = getattr(sub, "graph", None)
        if isinstance(graph, torch.fx.Graph):
            for node in graph.nodes:
                for leaf in pytree.tree_leaves((node.args, node.kwargs)):
                    if isinstance(leaf, (torch.Tensor, np.ndarray)):
                        found.append(f"{mname or '<root>'} fx node {node.name}: {type(leaf).__name__} literal")
    return found


def off_device(module: nn.Module, device: str) -> list[str]:
    return [f"{n}: {t.device}" for n, t in list(module.named_parameters()) + list(module.named_buffers())
            if t.device.type != device]


def _optimize(name, **options):
    model, inputs = MODELS[name]
    return model, inputs, aiacc.optimize(model, inputs, **options)


# ------------------------------------------------------------------------------------------------ CPU tests
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_tensor_is_registered(name):
    _, _, fast = _optimize(name)
    assert stray_tensors(fast) == []


@pytest.mark.parametrize("name", sorted(MODELS))
def test_to_float64_changes_every_floating_tensor(name):
    model, inputs, fast = _optimize(name)
    fast64 = fast.to(torch.float64)
    wrong = [n for n, t in list(fast64.named_parameters()) + list(fast64.named_buffers())
             if t.is_floating_point() and t.dtype != torch.float64]
    assert wrong == []
    xs = tuple(x.double() if x.is_floating_point() else x for x in inputs)
    with torch.no_grad():
        out = fast64(*xs)
        assert all(t.dtype == torch.float64 for t in leaves(out) if t.is_floating_point())
        assert_close_rel(model.double()(*xs), out, 1e-6)
    model.float()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_to_meta_moves_everything_and_runs(name):
    model, inputs, fast = _optimize(name)
    with torch.no_grad():
        expected = model(*inputs)
    meta = fast.to("meta")
    assert off_device(meta, "meta") == []
    assert stray_tensors(meta) == []
    with torch.no_grad():
        out = meta(*(x.to("meta") for x in inputs))
    got, want = leaves(out), leaves(expected)
    assert [t.device.type for t in got] == ["meta"] * len(want)
    assert [tuple(t.shape) for t in got] == [tuple(t.shape) for t in want]
    assert [t.dtype for t in got] == [t.dtype for t in want]


def test_train_mode_export_follows_to():
    torch.manual_seed(0)
    model = SmallCNN().train()
    x = torch.randn(2, 3, 16, 16)
    # aiacc's own export: with the default framework_compile="auto" the faster of it and torch.compile is
    # returned, chosen by timing, which would make this test depend on the machine's load
    fast = aiacc.optimize(model, (x,), mode="train", framework_compile=False)
    assert stray_tensors(fast) == []
    meta = fast.to("meta")
    assert off_device(meta, "meta") == []
    y = meta(x.to("meta"))
    assert y.device.type == "meta" and tuple(y.shape) == (2, 5)


def test_factory_calls_run_on_the_inputs_device():
    """Range and ConstantOfShape run when the forward runs (nothing folded them here): made on the device of
    the input (meta here), not on the default CPU."""
    from aiacc.plugins.torch import export_ops  # noqa: F401
    from aiacc.plugins.torch.exporter import export

    g = parse("""
    graph main(%x: float32[3]) {
      %zero: float32[] = const [0.0]
      %three: float32[] = const [3.0]
      %one: float32[] = const [1.0]
      %r: float32[3] = Range<range>(%zero, %three, %one)
      %shape: int64[1] = const [3]
      %f: float32[3] = ConstantOfShape<full>(%shape) {value=[2.0]}
      %y: float32[3] = Add<add>(%x, %r)
      return %y, %f
    }
    """)
    gm = export(g)
    assert "torch.arange" in gm.code and "torch.full" in gm.code
    with torch.no_grad():
        y, f = gm(torch.tensor([1.0, 1.0, 1.0]))
    assert y.tolist() == [1.0, 2.0, 3.0] and f.tolist() == [2.0, 2.0, 2.0]
    y, f = gm(torch.ones(3, device="meta"))
    assert y.device.type == "meta" and f.device.type == "meta"


# ------------------------------------------------------------------------------------------------ CUDA
@needs_cuda
@pytest.mark.parametrize("name", sorted(MODELS))
def test_optimize_a_cuda_model(name):
    model, inputs = MODELS[name]
    gpu_model = model.to("cuda")
    xs = tuple(x.cuda() for x in inputs)
    try:
        fast = aiacc.optimize(gpu_model, xs)
        assert off_device(fast, "cuda") == []
        with torch.no_grad():
            assert_close_rel(gpu_model(*xs), fast(*xs), 1e-4)
    finally:
        model.to("cpu")


@needs_cuda
@pytest.mark.parametrize("name", sorted(MODELS))
def test_to_cuda_after_optimize(name):
    model, inputs, fast = _optimize(name)
    gpu = fast.to("cuda")
    assert off_device(gpu, "cuda") == []
    with torch.no_grad():
        assert_close_rel(model(*inputs), gpu(*(x.cuda() for x in inputs)), 1e-4)
