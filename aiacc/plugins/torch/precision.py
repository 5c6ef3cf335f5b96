"""torch native bf16/fp16: aiacc's exported module with its parameters and buffers cast, float32 at the
boundary (inputs cast in, outputs cast back), so callers see the interface of the float32 model.

Casting the weights was measured against torch.autocast(cpu, bfloat16) around the float32 module in
benchmarks/precision.py (``--models digits``): the cast module runs its convolutions and matrix products
directly in bf16 without per-call weight casts; autocast re-casts each weight on every call.
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class CastModule(nn.Module):
    """`inner` in `dtype`: float inputs are cast to it, float outputs back to float32."""

    def __init__(self, inner: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.inner = copy.deepcopy(inner).to(dtype)
        self.dtype = dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        def down(t):
            return t.to(self.dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

        def up(t):
            return t.float() if isinstance(t, torch.Tensor) and t.dtype == self.dtype else t

        with torch.no_grad():
            out = self.inner(*pytree.tree_map(down, args), **pytree.tree_map(down, kwargs))
        return pytree.tree_map(up, out)


class AutocastModule(nn.Module):
    """`inner` (float32) run under torch.autocast("cpu", dtype): the alternative CastModule was measured
    against."""

    def __init__(self, inner: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.inner, self.dtype = inner, dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad(), torch.autocast("cpu", dtype=self.dtype):
            out = self.inner(*args, **kwargs)
        return pytree.tree_map(lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point()
                               else t, out)


def cast_module(module: nn.Module, precision: str, autocast: bool = False) -> nn.Module:
    """The float32 module `module` running in `precision` ("bf16" or "fp16")."""
    dtype = _DTYPES[precision]
    return AutocastModule(module, dtype) if autocast else CastModule(module, dtype)
