"""Ops timm's newer ViTs (gemma4_vit's rotary position grid) brought up: torch.meshgrid ("ij" and "xy"),
flip / fliplr / flipud, and x.to(other) (other's dtype). Each becomes IR under both frontends and equals
torch on a fresh input."""
from __future__ import annotations

import warnings

import pytest
import torch
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
