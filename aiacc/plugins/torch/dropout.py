"""Dropout for aiacc's exported torch graphs: the same masks as torch's F.dropout from the same RNG state, drawn
faster on CPU.

torch's CPU dropout draws its mask with bernoulli_(1 - p), which takes one 64-bit draw of the default
generator per element, makes a double uniform of its low 53 bits and keeps the element where that is below
1 - p; a BERT-style encoder's training step spends a fifth of its time there. `dropout` draws the same 64-bit
numbers with random_() on an int64 tensor of the input's layout (random_ keeps the low 63 bits, so the low 53
are the same) and compares them with ceil((1 - p) * 2**53) as integers, which is the same test exactly: the
mask, the scaled noise (1 / (1 - p) in the input's dtype, as F.dropout's noise.div_), the output, its
gradient (the product's backward) and the generator's state afterwards are all torch's own, so a seed
reproduces the original model's masks. Elsewhere (CUDA, other dtypes, p outside (0, 1), eval mode) it is
F.dropout itself. tests/plugins/torch/test_train_dropout.py checks the masks and the state against F.dropout.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

_LOW53 = (1 << 53) - 1
# dtypes whose CPU bernoulli_ draws a double uniform per element (checked by the test against F.dropout)
_DTYPES = (torch.float32, torch.float64)


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """F.dropout(x, p, training) with the same result and RNG use, its mask drawn faster on CPU."""
    if not (training and 0.0 < p < 1.0 and x.device.type == "cpu" and x.dtype in _DTYPES and x.numel()):
        return F.dropout(x, p, training)
    keep = 1.0 - p
    # empty_like lays the draws out as F.dropout's empty_like(x) noise, so they fill the elements in the
    # order bernoulli_ fills that noise
    bits = torch.empty_like(x, dtype=torch.int64).random_()
    scale = torch.ones((), dtype=x.dtype).div_(keep)
    noise = torch.where(bits.bitwise_and_(_LOW53) < math.ceil(keep * 2.0 ** 53), scale,
                        torch.zeros((), dtype=x.dtype))
    return x * noise
