"""Ops timm's newer ViTs (gemma4_vit's rotary position grid) brought up: torch.meshgrid ("ij" and "xy"),
flip / fliplr / flipud, x.to(other) (other's dtype), and naflexvit's antialiased interpolate. Each becomes IR
under both frontends and equals torch on a fresh input."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import aiacc

G = torch.Generator().manual_seed(0)


class _Grid(nn.Module):
    def forward(self, x, ids):
        h, w = x.shape[-2:]
        ys, xs = torch.meshgrid(torch.arange(h, dtype=x.dtype), torch.arange(w, dtype=x.dtype), indexing="ij")
        gx, gy = torch.meshgrid([torch.arange(w, dtype=x.dtype), torch.arange(h, dtype=x.dtype)], indexing="xy")
        pos = torch.stack([ys, xs, gx, gy], 0)  # (4, h, w)
        flipped = x.flip(-1) + torch.flip(x, dims=(1, 2)) + x.fliplr() + torch.flipud(x)
        return flipped * pos.sum(0) + ids.to(x) + x.flip([0, 2]).to(ids).to(x)


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_meshgrid_flip_and_to_tensor_become_ir(frontend):
    def inputs():
        return torch.randn(3, 4, 5, generator=G), torch.randint(0, 9, (3, 4, 5), generator=G)
    model, example, fresh = _Grid().eval(), inputs(), inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, example, frontend=frontend)
        assert [n.op for n in graph if n.is_opaque] == [], graph.meta.get("torch.opaque_reasons")
        fast = aiacc.optimize(model, example, frontend=frontend)
    torch.testing.assert_close(fast(*fresh), model(*fresh))


class _Antialiased(nn.Module):
    def forward(self, x):
        return (F.interpolate(x, size=(5, 7), mode="bilinear", antialias=True),
                F.interpolate(x, scale_factor=0.5, mode="bicubic", antialias=True, align_corners=False),
                F.interpolate(x, size=(13, 9), mode="bilinear", antialias=True, align_corners=True))


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_antialiased_interpolate_becomes_two_matmuls(frontend):
    # naflexvit's position-embedding resize; torch's antialiased filter is separable, so each axis is a
    # fixed matrix (torch's own interpolate of the identity basis)
    model = _Antialiased().eval()
    example, fresh = torch.randn(2, 3, 12, 16, generator=G), torch.randn(2, 3, 12, 16, generator=G)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, (example,), frontend=frontend)
        assert [n.op for n in graph if n.is_opaque] == [], graph.meta.get("torch.opaque_reasons")
        assert "MatMul" in [n.op for n in graph] and "Resize" not in [n.op for n in graph]
        fast = aiacc.optimize(model, (example,), frontend=frontend)
    for e, a in zip(model(fresh), fast(fresh)):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
