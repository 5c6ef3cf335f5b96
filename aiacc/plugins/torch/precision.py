"""torch native bf16/fp16: aiacc's exported float32 module run in reduced precision, float32 at the
boundary (callers see the interface of the float32 model).

bf16 runs the module under torch.autocast("cpu", bfloat16) (convolutions and matrix products in bf16,
the rest in float32); fp16 casts the parameters and buffers to float16 and casts inputs in and outputs
back. The two forms were measured against each other for bf16 (2 threads, this AVX2-only EPYC, median of
5 interleaved calls): BERT-style encoder seq 32: fp32 8.5 ms, weights cast 20.8 ms, autocast 10.3 ms;
MobileNetV2 64x64: fp32 11.8 ms, cast 130.5 ms, autocast 12.7 ms. Without AVX-512 BF16 / AMX, bf16 is
slower than float32 either way: benchmarks/precision.py --bf16 reports it.
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
    """`inner` (float32) run under torch.autocast("cpu", dtype), float outputs returned as float32."""

    def __init__(self, inner: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.inner, self.dtype = inner, dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad(), torch.autocast("cpu", dtype=self.dtype):
            out = self.inner(*args, **kwargs)
        return pytree.tree_map(lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point()
                               else t, out)


def cast_module(module: nn.Module, precision: str, autocast: bool | None = None) -> nn.Module:
    """The float32 module `module` running in `precision` ("bf16" or "fp16"); autocast None: the measured
    faster form (autocast for bf16, weights cast for fp16)."""
    dtype = _DTYPES[precision]
    if autocast is None:
        autocast = precision == "bf16"
    return AutocastModule(module, dtype) if autocast else CastModule(module, dtype)
