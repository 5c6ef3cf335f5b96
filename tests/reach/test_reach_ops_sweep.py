"""Constructs the widened reach sweep (benchmarks/reach.py --full) found opaque, in small modules: vector
norms (ConvNeXt-V2's GRN, F.normalize in cosine attention), any / all, Tensor.unfold windows, weight-norm parametrized convolutions
(Wav2Vec2 / HuBERT's positional convolution), FNet's `torch.fft.fftn(x).real` and the grouped
mixture-of-experts forward of transformers (sort, histc, its grouped_mm op), and the slice writes
torch.export functionalizes (slice_scatter, select_scatter, copy). Each traces with no
opaque node and the optimized module equals the original on a fresh input; what stays opaque says why."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import aiacc
from tests.plugins.torch._helpers import assert_close_rel, assert_translates_whole_and_equal


class _Norms(nn.Module):
    def forward(self, x):
        g = torch.norm(x, p=2, dim=(1, 2), keepdim=True)  # ConvNeXt-V2's global response norm
        y = x * (g / (g.mean(dim=-1, keepdim=True) + 1e-6))
        y = y + torch.nn.functional.normalize(x, dim=-1) + torch.linalg.vector_norm(x, ord=1, dim=-1, keepdim=True)
        y = y + x.norm(dim=-1, keepdim=True) + torch.linalg.vector_norm(x, float("inf"), dim=1, keepdim=True)
        y = y + torch.linalg.vector_norm(x, 3, dim=(-2, -1), keepdim=True) + x.norm()
        flags = (x > 0.5).any(dim=-1, keepdim=True) | torch.all(x > -1.0, 1, keepdim=True) | x.any()  # Longformer's
        return y * flags.to(y.dtype)


class _WeightNormConv(nn.Module):
    """Wav2Vec2's positional convolution: a grouped Conv1d with weight_norm over its kernel axis (dim=2),
    as nn.utils.parametrizations.weight_norm makes it, beside one normalized over its output channels."""

    def __init__(self):
        super().__init__()
        wn = nn.utils.parametrizations.weight_norm
        self.pos = wn(nn.Conv1d(8, 8, 5, padding=2, groups=2), name="weight", dim=2)
        self.lin = wn(nn.Linear(8, 6))

    def forward(self, x):
        return self.lin((x + self.pos(x)).transpose(1, 2))


class _FNetMixing(nn.Module):
    """FNet's token mixing (2-d DFT over sequence and hidden, its real part), a 1-d DFT of a DFT with the
    "ortho" scaling, and an imaginary part."""

    def forward(self, x):
        a = torch.fft.fftn(x, dim=(1, 2)).real
        b = torch.fft.fft(torch.fft.fft(x, dim=-1), dim=-2, norm="ortho").real
        return a + b + torch.imag(torch.fft.fft2(x, norm="forward")) + torch.real(x)


class _GroupedExperts(nn.Module):
    """transformers' grouped mixture-of-experts forward (Mixtral, Qwen-MoE...): route with topk, sort the
    (token, expert) pairs by expert, count them per expert with histc, one grouped product over the sorted
    rows, and the inverse permutation written with index_put."""

    def __init__(self, experts=4, hidden=8, top_k=2):
        super().__init__()
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.w = nn.Parameter(torch.randn(experts, hidden, 6) * 0.3)
        self.experts, self.top_k = experts, top_k

    def forward(self, x):
        weights, ids = torch.topk(self.gate(x).softmax(-1), self.top_k, dim=-1)
        ids_g, perm = torch.sort(ids.reshape(-1))
        rows = x[perm // self.top_k]
        counts = torch.histc(ids_g.float(), bins=self.experts, min=0, max=self.experts - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        y = grouped_mm(rows, self.w, offsets) * weights.reshape(-1)[perm].unsqueeze(-1)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.size(0))
        return y[inv].view(x.shape[0], self.top_k, -1).sum(1), torch.argsort(x, dim=-1, descending=True)


def grouped_mm(x, w, offs):
    """transformers' own fallback op where it is installed (what its MoE models call on CPU), else the
    same loop (a function the importer has no converter for would stay opaque: the test then fails)."""
    try:
        from tests.reach import _models as M

        M.transformers()
        import transformers.integrations.moe  # noqa: F401  (registers torch.ops.transformers.*)

        return torch.ops.transformers.grouped_mm_fallback(x, w, offs=offs)
    except ImportError:
        pytest.skip("transformers is not installed")


class _Windows(nn.Module):
    """timm HaloNet's halo windows: Tensor.unfold twice (overlapping windows with a step)."""

    def forward(self, x):
        kv = torch.nn.functional.pad(x, [1, 1, 1, 1]).unfold(2, 4, 2).unfold(3, 4, 2)  # (N, C, 3, 3, 4, 4)
        return kv.reshape(x.shape[0], x.shape[1], 9, 16).sum(-1) + x.unfold(-1, 6, 6).sum(-1).mean()


CASES = {
    "unfold_windows": (_Windows, lambda: (torch.randn(2, 3, 6, 6),)),
    "grouped_experts": (_GroupedExperts, lambda: (torch.randn(10, 8),)),
    "norms": (_Norms, lambda: (torch.randn(2, 6, 8),)),
    "weight_norm_parametrization": (_WeightNormConv, lambda: (torch.randn(2, 8, 12),)),
    "fft_real_part": (_FNetMixing, lambda: (torch.randn(2, 6, 8),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_translates_whole_and_equal(name):
    torch.manual_seed(0)
    cls, feed = CASES[name]
    assert_translates_whole_and_equal(cls().eval(), feed(), feed())


def test_weight_norm_gets_gradients_in_train_mode():
    # traced through the parametrization: the weight is computed from original0 / original1 in the graph
    torch.manual_seed(0)
    model = _WeightNormConv().train()
    x = torch.randn(2, 8, 12)
    graph = aiacc.trace(model, (x,), mode="train")
    assert [n.op for n in graph if n.is_opaque] == []
    names = {q for q, _, _ in graph.meta["torch.state"].values()}
    assert "pos.parametrizations.weight.original0" in names and "pos.parametrizations.weight.original1" in names


class _SliceWrites(nn.Module):
    """In-place writes into slices (BEiT's relative position table, ViT-MAE's token shuffle), which
    torch.export functionalizes into aten.slice_scatter / select_scatter / copy."""

    def forward(self, x, z):
        y = torch.zeros(x.shape[0], 7, x.shape[2])
        y[:, 1:5] = x
        y[:, 0] = z
        y[:, ::3] = y[:, ::3] * 2.0
        t = torch.empty_like(x)
        t.copy_(z.unsqueeze(1))
        return y, t + x


def test_export_slice_writes_translate():
    model = _SliceWrites().eval()
    feed = lambda: (torch.randn(2, 4, 3), torch.randn(2, 3))  # noqa: E731
    x, fresh = feed(), feed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, x, frontend="export")
        assert [n.op for n in graph if n.is_opaque] == [], graph.meta.get("torch.opaque_reasons")
        fast = aiacc.optimize(model, x, frontend="export")
    with torch.no_grad():
        assert_close_rel(model(*fresh), fast(*fresh), 1e-6)


class _ComplexUse(nn.Module):
    def forward(self, x):
        return torch.fft.fft(x).abs()  # the magnitude needs complex arithmetic the IR lacks


def test_fft_used_as_complex_stays_opaque_with_its_reason():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(_ComplexUse().eval(), (torch.randn(2, 8),), frontend="fx")
    assert [n for n in graph if n.is_opaque]
    reasons = " ".join(graph.meta["torch.opaque_reasons"].values())
    assert "no complex tensors" in reasons
