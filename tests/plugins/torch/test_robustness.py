"""The torch importer on architectures beyond the zoo: each small model translates to IR ops (or keeps the
named calls opaque), and its optimized forms equal the original: the IR on the reference executor, the
native export and the onnxruntime backend in eval (1e-5 relative), and in train mode the outputs, the
gradients of parameters and inputs, and the buffers after one backward pass. Weird models (control flow,
data-dependent shapes, in-place ops, odd output structures, keyword and integer inputs) never raise
anything but aiacc errors."""
from __future__ import annotations

import warnings
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import _pytree as pytree

import aiacc
from aiacc.core import run
from aiacc.errors import AiaccError
from aiacc.plugins.torch.translator import TRANSLATOR
from tests.plugins.torch._helpers import leaves

torch.set_num_threads(1)


class Fn(nn.Module):
    """A module around a function of its inputs (and optional submodules)."""

    def __init__(self, fn, **modules):
        super().__init__()
        self.fn = fn
        for k, m in modules.items():
            self.add_module(k, m)

    def forward(self, *xs):
        return self.fn(self, *xs)


def _clone(inputs):
    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, inputs)


def _call(model, inputs):
    inputs = _clone(inputs)
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def _train_step(model, inputs, seed=123):
    """Forward (seeded) and backward of a sum of squares; returns outputs and the float inputs' gradients."""
    inputs = pytree.tree_map(lambda t: t.clone().requires_grad_(t.is_floating_point())
                             if isinstance(t, torch.Tensor) else t, inputs)
    torch.manual_seed(seed)
    out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    loss = sum((t.float() ** 2).sum() for t in leaves(out) if t.is_floating_point())
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        loss.backward()
    return out, [t.grad for t in leaves(inputs) if t.requires_grad]


def close(expected, actual, rtol, what, atol=1e-7):
    """Every tensor leaf within rtol relative to its largest magnitude (plus atol, for gradients that are
    zero up to rounding, such as a normalization's input gradient under a scale-free loss)."""
    e, a = leaves(expected), leaves(actual)
    assert len(e) == len(a), f"{what}: {len(a)} tensors, expected {len(e)}"
    for i, (x, y) in enumerate(zip(e, a)):
        assert x.shape == y.shape, f"{what} {i}: shape {tuple(y.shape)} != {tuple(x.shape)}"
        scale = float(x.detach().abs().max()) if x.numel() else 0.0
        err = float((x.detach().double() - y.detach().double()).abs().max()) if x.numel() else 0.0
        assert err <= atol + rtol * scale, f"{what} {i}: max error {err:.3g} > {atol} + {rtol} * {scale:.3g}"


def check(model, inputs, opaque=(), train=True, backends=("native", "onnxruntime"), rtol=1e-5):
    """Assert the translation (opaque ops as listed) and every optimized form against the original."""
    torch.manual_seed(0)
    model.eval()
    graph = aiacc.trace(model, inputs)
    assert sorted(n.op for n in graph if n.is_opaque) == sorted(opaque), graph.meta.get("torch.opaque_reasons")
    with torch.no_grad():
        expected = _call(model, inputs)
    got = run(graph, TRANSLATOR.feeds(graph, inputs))
    ref = [torch.from_numpy(np.asarray(got[v.name])) for v in graph.outputs]
    close([t for t in leaves(expected)], ref, rtol, "reference executor")
    for backend in backends:
        fast = aiacc.optimize(model, inputs, backend=backend)
        with torch.no_grad():
            close(expected, _call(fast, inputs), rtol, f"{backend} output")
    if not train:
        return
    model.train()
    original = copy.deepcopy(model)
    fast = aiacc.optimize(model, inputs)
    out_a, in_grads_a = _train_step(original, inputs)
    out_b, in_grads_b = _train_step(fast, inputs)
    close(out_a, out_b, rtol, "train output")
    close(in_grads_a, in_grads_b, rtol, "input gradient", atol=1e-6)
    # state keeps its names (a model that is opaque as a whole sits under "model.")
    grads = {k.removeprefix("model."): p.grad for k, p in fast.named_parameters(remove_duplicate=False)}
    for name, p in original.named_parameters():
        if p.grad is None:
            assert grads[name] is None or float(grads[name].abs().max()) == 0.0, name
        else:
            close(p.grad, grads[name], rtol, f"gradient of {name}", atol=1e-6)
    buffers = {k.removeprefix("model."): b for k, b in fast.named_buffers(remove_duplicate=False)}
    for name, b in original.named_buffers():
        close(b, buffers[name], rtol, f"buffer {name}")


# ------------------------------------------------------------------------------------------- a U-Net
class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.d1 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.d2 = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.out = nn.Conv2d(16, 2, 1)

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(a)
        u = self.up(b)
        u2 = F.interpolate(b, scale_factor=2, mode="nearest")
        return (self.out(torch.cat([a, u], 1)) + u2.mean(1, keepdim=True),
                F.interpolate(x, size=(8, 8), mode="bilinear", align_corners=False))


def test_unet_with_interpolate_translates_and_round_trips():
    """F.interpolate(size=None, ...) once lost a tensor slot of its opaque call (None marked the slots)."""
    torch.manual_seed(0)
    check(UNet(), (torch.randn(2, 3, 16, 16),))


def test_opaque_call_with_none_arguments_round_trips():
    """An opaque call (torch.kthvalue here: topk now translates) whose arguments include None keeps every
    tensor in its place."""
    def fn(m, x, k):
        return torch.kthvalue(x * 2, 2, dim=-1, keepdim=True, out=None).values + k

    check(Fn(fn), (torch.randn(2, 3, 5), torch.randn(2, 3, 2)), opaque=["kthvalue"])


# ------------------------------------------------------------------------------------------- resampling
INTERPOLATIONS = [
    ((2, 3, 6, 5), dict(scale_factor=2, mode="nearest")),
    ((2, 3, 6, 5), dict(size=(9, 7), mode="nearest")),
    ((2, 3, 6, 5), dict(size=(4, 3), mode="nearest")),
    ((2, 3, 6, 5), dict(scale_factor=(2, 3), mode="nearest-exact")),
    ((2, 3, 6, 5), dict(size=(9, 8), mode="nearest-exact")),
    ((2, 3, 6, 5), dict(scale_factor=2, mode="bilinear", align_corners=False)),
    ((2, 3, 6, 5), dict(scale_factor=2, mode="bilinear", align_corners=True)),
    ((2, 3, 6, 5), dict(size=(4, 9), mode="bilinear", align_corners=False)),
    ((2, 3, 6, 5), dict(size=(1, 3), mode="bilinear", align_corners=True)),
    ((2, 3, 6, 5), dict(size=(1, 1), mode="bilinear", align_corners=False)),
    ((2, 3, 6, 5), dict(scale_factor=1.5, mode="bilinear", align_corners=False, recompute_scale_factor=True)),
    # fractional factors used as given (torch's output floor(in * factor), sampled at 1 / factor)
    ((2, 3, 8, 6), dict(scale_factor=0.5, mode="bilinear", align_corners=False)),
    ((2, 3, 8, 12), dict(scale_factor=(0.5, 0.25), mode="bilinear", align_corners=False, recompute_scale_factor=False)),
    ((2, 3, 6, 5), dict(scale_factor=1.5, mode="bilinear", align_corners=False)),
    ((2, 3, 6, 5), dict(scale_factor=2.5, mode="nearest")),
    ((2, 3, 7, 5), dict(scale_factor=0.5, mode="nearest")),
    ((2, 3, 6, 5), dict(scale_factor=1.5, mode="bicubic", align_corners=False)),
    ((2, 3, 6, 5), dict(size=(8, 7), mode="bicubic", align_corners=False)),
    ((2, 3, 6, 5), dict(scale_factor=2, mode="bicubic", align_corners=True)),
    ((2, 3, 6, 5), dict(size=(3, 2), mode="area")),
    ((2, 3, 7), dict(scale_factor=2, mode="linear", align_corners=False)),
    ((2, 3, 7), dict(size=5, mode="nearest")),
    ((1, 2, 3, 4, 5), dict(scale_factor=2, mode="trilinear", align_corners=False)),
    ((1, 2, 3, 4, 5), dict(size=(4, 4, 4), mode="nearest")),
]


@pytest.mark.parametrize("shape,kwargs", INTERPOLATIONS, ids=[str(k) for _, k in INTERPOLATIONS])
def test_interpolate(shape, kwargs):
    torch.manual_seed(0)
    model = Fn(lambda m, x: F.interpolate(m.conv(x), **kwargs) * 2,
               conv=[nn.Conv1d, nn.Conv2d, nn.Conv3d][len(shape) - 3](shape[1], 2, 1))
    check(model, (torch.randn(*shape),))


def test_upsample_modules():
    torch.manual_seed(0)
    model = Fn(lambda m, x: m.a(x) + m.b(x) + m.c(x) + m.d(x), a=nn.Upsample(scale_factor=2),
               b=nn.Upsample(size=(8, 10), mode="bilinear"), c=nn.UpsamplingNearest2d(scale_factor=2),
               d=nn.UpsamplingBilinear2d(size=(8, 10)))
    check(model, (torch.randn(2, 3, 4, 5),), train=False)
    graph = aiacc.trace(model, (torch.randn(2, 3, 4, 5),))
    assert graph.op_histogram().get("Resize") == 4


# ------------------------------------------------------------------------------------------- normalization
def test_group_and_instance_norm():
    torch.manual_seed(0)
    # side by side, not chained: a normalization after another cancels the first one's scale, leaving
    # gradients that are rounding noise
    model = Fn(lambda m, x: m.in1(x * 3) + m.gn1(x) * m.gn2(x) + m.in2(x + 1) + F.group_norm(x, 2) + F.instance_norm(x),
               gn1=nn.GroupNorm(2, 6), gn2=nn.GroupNorm(3, 6, affine=False), in1=nn.InstanceNorm2d(6, affine=True),
               in2=nn.InstanceNorm2d(6))
    for p in model.parameters():
        nn.init.normal_(p)
    check(model, (torch.randn(2, 6, 5, 4),))


def test_instance_norm_with_running_stats_in_eval():
    torch.manual_seed(0)
    model = Fn(lambda m, x: m.n(x), n=nn.InstanceNorm1d(4, affine=True, track_running_stats=True))
    model.n.running_mean.normal_()
    model.n.running_var.uniform_(0.5, 2)
    check(model, (torch.randn(2, 4, 6),), train=False)
    assert "BatchNormalization" in aiacc.trace(model.eval(), (torch.randn(2, 4, 6),)).op_histogram()


def test_normalize_and_layer_norm_without_bias():
    torch.manual_seed(0)
    model = Fn(lambda m, x: F.normalize(m.ln(x), dim=-1) + F.layer_norm(x, (8,)),
               ln=nn.LayerNorm(8, bias=False))
    check(model, (torch.randn(3, 4, 8),))


# ------------------------------------------------------------------------------------------- activations
def test_activations():
    torch.manual_seed(0)
    mods = nn.ModuleList([nn.PReLU(), nn.PReLU(4, 0.1), nn.ELU(0.5), nn.SELU(), nn.CELU(0.7), nn.Softplus(),
                          nn.Softplus(2.0, 3.0), nn.Mish(), nn.Hardsigmoid(), nn.LogSigmoid(), nn.Tanhshrink(),
                          nn.Threshold(0.1, -2.0), nn.Softsign(), nn.Hardtanh(-0.5, 0.5)])
    with torch.no_grad():
        mods[1].weight.uniform_(-1, 1)

    def fn(m, x):
        outs = [a(x) for a in m.mods]
        outs += [F.glu(x, 1), m.sm2(x), m.lsm(x), m.smin(x), torch.rsqrt(x.abs() + 1), torch.exp(x).log(),
                 x.pow(2), torch.pow(x, 3), 2 ** x, x.sign() * x.square(), torch.log1p(x.abs()), x.expm1()]
        return [o.flatten(1) for o in outs]

    model = Fn(fn, mods=mods, sm2=nn.Softmax2d(), lsm=nn.LogSoftmax(dim=1), smin=nn.Softmin(dim=-1))
    check(model, (torch.randn(2, 4, 3, 5) * 3,))


# ------------------------------------------------------------------------------------------- pooling
def test_pooling():
    torch.manual_seed(0)
    model = Fn(lambda m, x: [m.a(x), m.b(x), m.c(x), m.d(x), m.e(x), F.avg_pool2d(x, 3, 2, 1, True, False),
                             F.max_pool2d(x, 2, 1, 0, 2), F.adaptive_max_pool2d(x, 1), F.adaptive_avg_pool2d(x, (2, 3))],
               a=nn.AdaptiveAvgPool2d((3, 4)), b=nn.AdaptiveMaxPool2d((2, 3)), c=nn.MaxPool2d(3, 2, 1, dilation=2,
                                                                                           ceil_mode=True),
               d=nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), e=nn.AdaptiveAvgPool2d((None, 1)))
    check(model, (torch.randn(2, 3, 7, 9),))


def test_pooling_1d_3d_and_conv3d():
    torch.manual_seed(0)
    model = Fn(lambda m, x, v: (m.p1(x), m.p2(x), F.avg_pool1d(x, 2), m.pool3(m.conv3(v))),
               p1=nn.AdaptiveAvgPool1d(5), p2=nn.AdaptiveMaxPool1d(4), conv3=nn.Conv3d(2, 3, 3, padding=1),
               pool3=nn.MaxPool3d(2))
    check(model, (torch.randn(2, 4, 12), torch.randn(1, 2, 4, 4, 4)))


def test_max_pool_with_indices_stays_opaque():
    torch.manual_seed(0)
    model = Fn(lambda m, x: m.p(x)[0] * 2 + m.p(x)[1].float(), p=nn.MaxPool2d(2, return_indices=True))
    check(model, (torch.randn(2, 3, 4, 4),), opaque=["MaxPool2d", "MaxPool2d"])


# ------------------------------------------------------------------------------------------- reductions
def test_reductions():
    torch.manual_seed(0)

    def fn(m, x, y):
        v, i = x.max(dim=2)
        return [v, i, torch.max(x, 1, keepdim=True).values, torch.max(x), torch.max(x, y), x.min(-1)[0],
                torch.min(x, dim=0).indices, torch.minimum(x, y), x.amax(dim=(1, 2)), torch.amin(x, 0, True),
                x.argmax(), torch.argmin(x, dim=1, keepdim=True), x.mean((0, 2)), x.sum(-1, keepdim=True),
                x.std(1), x.var(dim=(0, 2), unbiased=False), torch.std(x, dim=-1, correction=0, keepdim=True),
                *torch.var_mean(x, 1), x.sum(), x.mean()]

    check(Fn(fn), (torch.randn(3, 4, 5), torch.randn(3, 4, 5)))


# ------------------------------------------------------------------------------------------- shapes
def test_padding():
    torch.manual_seed(0)
    model = Fn(lambda m, x: [F.pad(x, (1, 2)), F.pad(x, (1, 1, 2, 0), value=0.5), F.pad(x, (2, 1, 1, 2), "reflect"),
                             F.pad(x, (1, 1, 1, 1), "replicate"), F.pad(x, (1, 2, 0, 1), "circular"), m.a(x), m.b(x),
                             m.c(x), m.d(x), F.pad(x, (-1, 0, 1, -1))],
               a=nn.ZeroPad2d((1, 0, 2, 1)), b=nn.ReflectionPad2d(1), c=nn.ReplicationPad2d((0, 1, 2, 0)),
               d=nn.ConstantPad1d(2, -1.0))
    check(model, (torch.randn(2, 3, 4, 5),))


def test_split_stack_and_repeat():
    torch.manual_seed(0)

    def fn(m, x):
        a, b = torch.split(x, [2, 4], dim=1)
        c = x.chunk(3, dim=-1)
        d = torch.unbind(x, 2)
        s = torch.stack([a.sum(1), b.mean(1)], dim=-1)
        return [a * 2, b, *c, *d, s, x[:, :1].expand(-1, 4, -1), x.repeat(1, 2, 1), x.repeat(2, 1, 1, 1),
                torch.tile(x, (2,)), x.repeat_interleave(2, dim=1), torch.movedim(x, 0, -1), x.swapaxes(0, 1),
                torch.broadcast_to(x[:, :1], (2, 6, 3)), torch.cat(x.split(2, 1), dim=2)]

    check(Fn(fn), (torch.randn(2, 6, 3),))


def test_indexing_and_views():
    torch.manual_seed(0)

    def fn(m, x):
        n = x.size(0)
        y = x.contiguous().view(x.size(0), -1, x.shape[-1])
        return [x[:, ::2, 1:, None], x[..., -1], x[None, ..., ::3], x[1], x[-1, :, -2:], y.view(n, -1),
                torch.flatten(x, 1, 2), x.flatten(2), x.flatten(), x.unsqueeze(-1).squeeze(), x[:, :1].squeeze(1),
                x.reshape(-1, x.size(-1)).t(), x.permute(2, 0, 1), x.transpose(-1, -2),
                x + torch.arange(x.size(-1)).float(), x.view_as(x.transpose(1, 2)), x.type_as(y)]

    check(Fn(fn), (torch.randn(2, 4, 6),))


def test_where_masks_clamp_and_comparisons():
    torch.manual_seed(0)

    def fn(m, x, y):
        mask = x > 0.2
        return [torch.where(mask, x, y), torch.where(x < y, 1.0, x), x.masked_fill(~mask, -1.0),
                x.masked_fill(mask & (y > 0), 0.0), x.clamp(-0.5, 0.5), x.clamp(min=y), torch.clamp(x, y - 1, y + 1),
                x.clamp_min(0.1), (x >= y).float(), (x != y).to(torch.float32) + (x == x).float(),
                torch.logical_or(mask, y < 0).float(), torch.maximum(x, y) - torch.minimum(x, y),
                torch.zeros_like(x) + torch.ones_like(y) * 2 + torch.full_like(x, 3.0)]

    check(Fn(fn), (torch.randn(2, 3, 4), torch.randn(2, 3, 4)))


def test_embedding_with_padding_idx():
    torch.manual_seed(0)
    model = Fn(lambda m, ids: m.fc(m.emb(ids) + F.embedding(ids, m.emb.weight, padding_idx=1)),
               emb=nn.Embedding(10, 4, padding_idx=0), fc=nn.Linear(4, 2))
    ids = torch.tensor([[0, 3, 5, 0], [1, 2, 9, 0]])
    check(model, (ids,))
    # training: aiacc::Embedding, the lookup whose padding row gets no gradient (tests/reach/test_embedding_train.py)
    graph = aiacc.trace(model.train(), (ids,))
    assert [n.op for n in graph if n.is_opaque] == []
    assert sorted(n.attrs["padding_idx"] for n in graph.find_nodes("Embedding", "aiacc")) == [0, 1]


# ------------------------------------------------------------------------------------------- weird models
class Branchy(nn.Module):
    """Python control flow on a tensor value in the top-level forward: traced on the example's value, guarded."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:
            return y * 2
        return -y


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        picked = y[y > 0]  # data-dependent shape
        return y.relu() * 2, picked.sum(), torch.nonzero(y > 0).shape[0] * 0 + y.mean()


class InPlace(nn.Module):
    """In-place ops on an input and on intermediates that are read again afterwards."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        x = x * 1.0
        x.add_(1)
        y = self.fc(x)
        z = y
        z.mul_(2)
        y += 1  # in place: z is y
        w = self.act(y)  # relu in place: y, z and w are all relu(2 fc(x + 1) + 1)
        return y + w + z, x


class Structured(nn.Module):
    """Returns a list, a nested dict, None and a constant; takes keyword inputs and a default."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x, extra=None, scale: float = 2.0, mask=None):
        y = self.fc(x) * scale
        out = {"list": [y, y.relu()], "nested": {"z": y.sum(-1), "none": None}, "const": 3}
        if extra is not None:
            out["extra"] = extra + 1
        if mask is not None:
            out["masked"] = y.masked_fill(mask, 0.0)
        return out


class TokenModel(nn.Module):
    """Token ids with a bool attention mask, as in a BERT-style encoder."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.pos = nn.Parameter(torch.randn(1, 6, 8) * 0.1)
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask):
        h = self.emb(input_ids) + self.pos[:, :input_ids.size(1)]
        h = self.layer(h, src_key_padding_mask=~attention_mask)
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return self.head((h * m).sum(1) / m.sum(1))


class ReturnsNone(nn.Module):
    def forward(self, x):
        return None


def test_control_flow_on_data_is_value_guarded_and_round_trips():
    # the branch is specialised on the example's value behind an aiacc::ValueGuard (tests/reach/test_value_guard.py)
    torch.manual_seed(0)
    x = (torch.randn(2, 4),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert [n.op for n in aiacc.trace(Branchy(), x) if n.op == "ValueGuard"] == ["ValueGuard"]
        check(Branchy(), x)


def test_data_dependent_shapes_stay_opaque():
    torch.manual_seed(0)
    model = DataDependent()
    graph = aiacc.trace(model, (torch.randn(3, 4),))
    assert any(n.is_opaque for n in graph)
    fast = aiacc.optimize(model, (torch.randn(3, 4),))
    x = torch.randn(3, 4)
    with torch.no_grad():
        close(model(x), fast(x), 1e-5, "output")


def test_in_place_ops_keep_their_effect_on_later_reads():
    torch.manual_seed(0)
    check(InPlace(), (torch.randn(3, 4),))


def test_setitem_on_an_intermediate():
    torch.manual_seed(0)

    def fn(m, x):
        y = m.fc(x)
        y[:, 0] = 0.0
        y[1:, 2:] = y[1:, 2:] * 3
        return y.relu()

    check(Fn(fn, fc=nn.Linear(4, 5)), (torch.randn(3, 4),))


def test_structured_outputs_and_keyword_inputs():
    torch.manual_seed(0)
    model = Structured()
    x, extra, mask = torch.randn(2, 4), torch.randn(2), torch.tensor([[True, False, True], [False] * 3])
    check(model, {"x": x, "extra": extra, "mask": mask})
    fast = aiacc.optimize(model.eval(), {"x": x, "extra": extra, "mask": mask})
    out = fast(x, extra=extra, mask=mask)
    assert out["const"] == 3 and out["nested"]["none"] is None and isinstance(out["list"], list)
    check(model, (x,))


def test_token_ids_with_bool_attention_mask():
    torch.manual_seed(0)
    model = TokenModel()
    ids = torch.randint(0, 20, (2, 6))
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    check(model, (ids, mask), rtol=1e-4)


def test_module_returning_none():
    model = ReturnsNone()
    fast = aiacc.optimize(model, (torch.randn(2),))
    assert fast(torch.randn(2)) is None


@pytest.mark.parametrize("make", [
    lambda: (Fn(lambda m, x: x.numpy().sum()), (torch.randn(2),)),
    lambda: (Fn(lambda m, x: int(x.sum()) * x), (torch.randn(2),)),
    lambda: (Fn(lambda m, x: [x] * len(x)), (torch.randn(2),)),
    lambda: (Fn(lambda m, x: x.view(-1, 3)), (torch.randn(2, 2),)),
    lambda: (Fn(lambda m, x, k: x * k), (torch.randn(2), torch.randn(3))),
    lambda: (Fn(lambda m, x: torch.randint(0, 5, x.shape) + x), (torch.randn(2),)),
    lambda: (Fn(lambda m, x: x.float() / 3), (torch.arange(6),)),
    lambda: (Fn(lambda m, x: x.to(torch.bfloat16).float()), (torch.randn(3),)),
    lambda: (Fn(lambda m, x: x + 1), ("not a tensor",)),
    lambda: (Fn(lambda m, x: x + 1), (torch.randn(2, dtype=torch.bfloat16),)),
])
def test_weird_models_raise_only_aiacc_errors(make):
    """Each either works (and then computes what the original computes) or raises an aiacc error."""
    model, inputs = make()
    for mode in ("eval", "train"):
        getattr(model, mode)()
        try:
            aiacc.trace(model, inputs)
            fast = aiacc.optimize(model, inputs)
        except AiaccError:
            continue
        with torch.no_grad():
            torch.manual_seed(1)
            expected = _call(model, inputs)
            torch.manual_seed(1)
            got = _call(fast, inputs)
        if isinstance(expected, torch.Tensor) and expected.dtype != torch.int64:
            close(expected, got, 1e-5, "output")


# ------------------------------------------------------------------------------------------- more layers
def test_rearrangements_and_lookups():
    torch.manual_seed(0)

    def fn(m, x, idx):
        y = m.ps(m.conv(x))  # (2, 2, 8, 8)
        return [y, m.pu(y), m.cs(x), m.uf(m.fl(x)), x.unflatten(1, (2, -1)), m.ident(x) * 2,
                torch.index_select(x, 1, idx), x.index_select(-1, idx), torch.addmm(m.b, x.flatten(1)[:, :5], m.w)]

    model = Fn(fn, conv=nn.Conv2d(4, 8, 1), ps=nn.PixelShuffle(2), pu=nn.PixelUnshuffle(2), cs=nn.ChannelShuffle(2),
               fl=nn.Flatten(2, 3), uf=nn.Unflatten(2, (4, 4)), ident=nn.Identity())
    model.w = nn.Parameter(torch.randn(5, 3))
    model.b = nn.Parameter(torch.randn(3))
    check(model, (torch.randn(2, 4, 4, 4), torch.tensor([0, 2, 3])))


class SkipUp(nn.Module):
    """A decoder step sized by its skip connection (`size=skip.shape[2:]`), channels unpacked from a shape."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(6, 3, 3, padding=1)

    def forward(self, x, skip):
        b, c, h, w = skip.shape
        up = F.interpolate(x, size=skip.shape[2:], mode="bilinear", align_corners=False)
        y = self.conv(torch.cat([up, skip], 1))
        return y.view(b, -1, h * w).mean(-1)


def test_interpolate_to_a_skip_connection_size():
    torch.manual_seed(0)
    check(SkipUp(), (torch.randn(2, 3, 4, 5), torch.randn(2, 3, 7, 9)))


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 6, batch_first=True)
        self.gru = nn.GRU(6, 5)
        self.fc = nn.Linear(5, 2)

    def forward(self, x):
        y, (h, c) = self.lstm(x)
        z, _ = self.gru(y.transpose(0, 1))
        return self.fc(z[-1]) + h.sum() + c.mean()


def test_recurrent_layers_translate_and_train():
    torch.manual_seed(0)  # nn.LSTM / nn.GRU unrolled by import_ops/rnn.py (they were opaque before)
    check(Recurrent(), (torch.randn(2, 5, 4),))


def test_exported_modules_with_opaque_and_in_place_calls_pickle(tmp_path):
    """Out-of-place wrappers, argument templates, resize lowerings and opaque aten ops survive torch.save /
    torch.load."""
    torch.manual_seed(0)

    def fn(m, x):
        y = m.conv(x)
        y[:, :, 0] = torch.flip(y[:, :, 0], [-1])  # a value written into a slice (its backward needs no input)
        y.cumsum_(1)  # an opaque in-place call
        return F.interpolate(y, scale_factor=2, mode="bilinear") + torch.kthvalue(y, 2, dim=1).values.sum()

    model = Fn(fn, conv=nn.Conv2d(3, 4, 1)).eval()
    x = torch.randn(1, 3, 4, 4)
    fast = aiacc.optimize(model, (x,))
    torch.save(fast, tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    with torch.no_grad():
        close(model(x.clone()), loaded(x), 1e-5, "reloaded output")
    # torch.export (functionalized: the in-place cumsum_ translates) leaves aten.kthvalue opaque, held by name
    # (an OpOverload does not pickle)
    check(model, (x,), opaque=["kthvalue.default"])


class CausalBlock(nn.Module):
    """GPT-style attention: sizes unpacked from x.size(), a causal-mask buffer sliced by a traced length."""

    def __init__(self, d=16, heads=2, t=8):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.register_buffer("mask", torch.tril(torch.ones(t, t)).view(1, 1, t, t))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / k.size(-1) ** 0.5)
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")).softmax(-1)
        return x + self.proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


class DropPath(nn.Module):
    """Stochastic depth: a random draw sized by the batch, and a bool mask times a float tensor."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x):
        y = self.conv(x)
        if not self.training:
            return x + y
        keep = torch.rand(x.shape[0], 1, 1, 1) >= 0.5
        return x + y * keep / 0.5 + torch.zeros(x.size(0), 3, 1, 1)


def test_causal_attention_with_a_sliced_mask_buffer():
    torch.manual_seed(0)
    check(CausalBlock(), (torch.randn(2, 6, 16),), rtol=1e-4)


def test_random_draws_stay_opaque_in_training():
    torch.manual_seed(0)
    model = DropPath()
    check(model, (torch.randn(4, 3, 2, 2),))
    graph = aiacc.trace(model.train(), (torch.randn(4, 3, 2, 2),))
    assert [n.op for n in graph if n.is_opaque] == ["rand"]  # drawn anew on every call, never a constant


# ------------------------------------------------------------------------------------------- reductions
class _IntegralSums(nn.Module):
    def forward(self, x):
        m = x > 0
        return (m.sum(), m.sum(1, keepdim=True), torch.sum(m.to(torch.int32), 0), x.sum(dtype=torch.float64),
                (x * 3).to(torch.int8).sum(0), m.float().sum() * 2)


@pytest.mark.parametrize("frontend", ["fx", "export"])
@pytest.mark.parametrize("backend", ["native", "onnxruntime", "aiacc"])
def test_sums_of_bool_and_integer_tensors_count_as_int64(frontend, backend):
    """torch sums bool and integer tensors as int64 (`(mask == 0).sum()` is a count) and `sum(dtype=)` casts
    first: the IR did a bool ReduceSum (an "any": True where torch counts 3) on every backend but native."""
    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime")
    model = _IntegralSums().eval()
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    graph = aiacc.trace(model, (x,), frontend=frontend)
    assert [v.dtype for v in graph.outputs] == ["int64", "int64", "int64", "float64", "int64", "float32"]
    fast = aiacc.optimize(model, (x,), backend=backend)
    fresh = torch.randn(5, 7, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for got, expected in zip(fast(fresh), model(fresh)):
            assert got.dtype == expected.dtype
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


class _ReassignsBuffer(nn.Module):
    """As transformers' CTRLModel: the forward reassigns a registered buffer (`self.pos_encoding =
    self.pos_encoding.to(device=..., dtype=...)`)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("pos", torch.arange(12.0).reshape(3, 4), persistent=False)

    def forward(self, x):
        self.pos = self.pos.to(device=x.device, dtype=x.dtype)
        return x * 2 + self.pos


def test_forward_that_reassigns_a_buffer():
    """fx's trace put a proxy into the module's buffer table; putting the table's proxies back deleted the
    whole table (`'CTRLModel' object has no attribute '_buffers'`). Now the entries get their tensors back."""
    model = _ReassignsBuffer().eval()
    check(model, (torch.randn(2, 3, 4),), train=False)
    assert isinstance(model.pos, torch.Tensor) and dict(model.named_buffers()).keys() == {"pos"}
    # torch.export writes the buffer back (copy_): dropped where the buffer already holds that dtype and device
    graph = aiacc.trace(model, (torch.randn(2, 3, 4),), frontend="export")
    assert not [n.op for n in graph if n.is_opaque], graph.meta.get("torch.opaque_reasons")


def test_forward_that_changes_a_buffer_keeps_the_write_back():
    """A forward that writes new values into its buffer changes the model's state: that write is kept (an
    opaque copy_), only a write of the value the buffer already holds is dropped."""
    class Decays(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("pos", torch.ones(3, 4))

        def forward(self, x):
            self.pos = self.pos.to(x.dtype) * 0.5
            return x + self.pos

    graph = aiacc.trace(Decays().eval(), (torch.randn(2, 3, 4),), frontend="export")
    assert [n.op for n in graph if n.is_opaque] == ["copy_.default"]


def test_split_with_sizes_under_torch_export():
    """torch.export records `x.split([a, b])` as aten.split_with_sizes, which had no converter (Jamba's mamba
    mixer kept it opaque)."""
    model = Fn(lambda m, x: torch.cat([p * (i + 1) for i, p in enumerate(m.conv(x).split([1, 3, 2], dim=1))], 1),
               conv=nn.Conv1d(3, 6, 1))
    x = torch.randn(2, 3, 5)
    graph = aiacc.trace(model.eval(), (x,), frontend="export")
    assert not [n.op for n in graph if n.is_opaque], graph.meta.get("torch.opaque_reasons")
    check(model, (x,))


@pytest.mark.parametrize("how", [3, 4, [2], [1, 4], [-2], [2, 5], [6], [4, 2, 9]], ids=str)
def test_tensor_split(how):
    """torch.tensor_split (Falcon-H1's mamba mixer) into sections or at indices, under both frontends."""
    model = Fn(lambda m, x: torch.cat([p * (i + 1) for i, p in enumerate(torch.tensor_split(m.conv(x), how, dim=1))], 1),
               conv=nn.Conv1d(3, 6, 1))
    x = torch.randn(2, 3, 5)
    for frontend in ("fx", "export"):
        graph = aiacc.trace(model.eval(), (x,), frontend=frontend)
        assert not [n.op for n in graph if n.is_opaque], graph.meta.get("torch.opaque_reasons")
    check(model, (x,))


_INDEX_FORMS = {
    "x[:, i, j]": lambda x, i, j: x[:, i, j],  # adjacent, after a full slice: the index dims in their place
    "x[:, :, i, j]": lambda x, i, j: x[:, :, i, j],
    "x[i, :, j]": lambda x, i, j: x[i, :, j],  # separated: the index dims first
    "x[:, i, :, j]": lambda x, i, j: x[:, i, :, j],
    "x[:, i[:, None], j]": lambda x, i, j: x[:, i[:, None], j],  # broadcast index tensors
}


@pytest.mark.parametrize("form", list(_INDEX_FORMS))
def test_index_tensors_on_later_axes(form):
    """Index tensors on axes that are not the leading ones (ViTDet's relative position tables under
    torch.export stayed opaque), placed as torch places the index dims, under both frontends."""
    fn = _INDEX_FORMS[form]

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("i", torch.tensor([2, 0, -1, 1]))

        def forward(self, x, j):
            return fn(x * 2, self.i, j) + 1

    x = torch.randn(3, 5, 4, 6)
    j = torch.tensor([1, 3, 0, -2])
    expected = M()(x, j)
    for frontend in ("fx", "export"):
        graph = aiacc.trace(M().eval(), (x, j), frontend=frontend)
        assert not [n.op for n in graph if n.is_opaque], graph.meta.get("torch.opaque_reasons")
    check(M(), (x, j), train=False)
    assert expected.shape == fn(x, torch.tensor([2, 0, -1, 1]), j).shape


class _Bfloat16Normalizer(nn.Module):
    """As RecurrentGemma: a float32 model with a bfloat16 buffer it reads only through a cast."""

    def __init__(self, cast):
        super().__init__()
        self.register_buffer("normalizer", torch.tensor(3.7, dtype=torch.bfloat16), persistent=False)
        self.cast = cast

    def forward(self, x):
        n = self.normalizer.type(x.dtype) if self.cast else self.normalizer
        return x * n + 1


def test_bfloat16_buffer_read_through_a_cast():
    """The IR has no bfloat16: a buffer read only through casts to float32 is its exact float32 value (the
    bfloat16 rounding of 3.7 kept); read directly, the model is still refused with a clear error."""
    model = _Bfloat16Normalizer(cast=True).eval()
    check(model, (torch.randn(2, 5),), train=False)
    graph = aiacc.trace(model, (torch.randn(2, 5),), frontend="export")
    assert not [n.op for n in graph if n.is_opaque], graph.meta.get("torch.opaque_reasons")
    with pytest.raises(aiacc.errors.UnsupportedError, match="bfloat16 tensors have no numpy dtype"):
        aiacc.trace(_Bfloat16Normalizer(cast=False).eval(), (torch.randn(2, 5),), frontend="fx")


def test_true_division_of_integer_tensors():
    """`int_tensor / int_tensor` (and by a Python int) is torch's default float dtype, as Ministral 3's
    position scaling computes it; it was left opaque."""
    model = Fn(lambda m, x, i: x * (i / (i.max() + 1)) + (i / 3) + torch.true_divide(i, i.max() + 2))
    x, i = torch.randn(2, 6), torch.tensor([[1, 5, 2, 7, 0, 3], [4, 4, 9, 1, 2, 8]])
    for frontend in ("fx", "export"):
        graph = aiacc.trace(model.eval(), (x, i), frontend=frontend)
        assert not [n.op for n in graph if n.is_opaque], graph.meta.get("torch.opaque_reasons")
    check(model, (x, i), train=False)


class _ScanIntoSlices(nn.Module):
    """As RecurrentGemma's RG-LRU scan: a recurrence that writes each step into a slice of a fresh tensor."""

    def __init__(self):
        super().__init__()
        self.decay = nn.Parameter(torch.tensor([0.5, 0.9, 0.7]))

    def forward(self, x):  # x [batch, time, 3]
        out = torch.zeros_like(x)
        h = torch.zeros_like(x[:, 0])
        for t in range(x.shape[1]):
            h = self.decay * h + x[:, t]
            out[:, t] = h
        return out * 2


def test_inplace_writes_into_views_under_torch_export():
    """torch.export's training IR keeps `out[:, t] = h` as aten.copy_ into a select view, which has no
    converter: the program is functionalized (slice/select_scatter) and translates whole."""
    model = _ScanIntoSlices().eval()
    x = torch.randn(2, 4, 3)
    graph = aiacc.trace(model, (x,), frontend="export")
    assert not [n.op for n in graph if n.is_opaque], graph.meta.get("torch.opaque_reasons")
    assert "functionalize" in graph.meta["torch.export"]["decomposed"]
    check(model, (x,), train=False)
