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

Faster still, the 64-bit numbers come from aiacc's numba MT19937 (aiacc.core.runtime.mt19937) continuing the
default generator's own state (read with torch.get_rng_state, written back with set_rng_state), which twists
and tempers the state in blocks and writes the noise in one pass (torch's random_ draws element by element
through the generator object): ~2.5x less time per mask. It is used once a self-check on first use (a forked
RNG: the same words and the same state afterwards as random_, across a twist) passed; otherwise, or without
numba, the random_ form above. Like any read-modify-write of the generator it is not atomic against another
thread drawing from the default generator at the same moment (aiacc's own draws take a lock).
"""
from __future__ import annotations

import math
import threading

import numpy as np
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
    scale = torch.ones((), dtype=x.dtype).div_(keep)
    thr = math.ceil(keep * 2.0 ** 53)
    if _engine() is not None:
        return x * _mt_noise(x, thr, scale)
    # empty_like lays the draws out as F.dropout's empty_like(x) noise, so they fill the elements in the
    # order bernoulli_ fills that noise
    bits = torch.empty_like(x, dtype=torch.int64).random_()
    noise = torch.where(bits.bitwise_and_(_LOW53) < thr, scale, torch.zeros((), dtype=x.dtype))
    return x * noise


# torch's CPU generator state (CPUGeneratorImplState): the legacy THGeneratorState first, in it `left` (int32)
# at byte 8, `next` (uint64) at 16 and the 624 state words (one per uint64) from 24
_STATE_BYTES, _LEFT, _NEXT, _WORDS = 5056, 8, 16, 24
_LOCK = threading.Lock()
_ENGINE: list = []  # [module or None] once checked


def _engine():
    """aiacc.core.runtime.mt19937 when it continues torch's default generator exactly (checked once), else
    None."""
    if not _ENGINE:
        _ENGINE.append(_checked_engine())
    return _ENGINE[0]


def _checked_engine():
    try:
        from aiacc.core.runtime import mt19937
    except ImportError:
        return None
    with torch.random.fork_rng(devices=[]):
        try:
            if torch.get_rng_state().numel() != _STATE_BYTES:
                return None
            for seed, first in ((0, 0), (12345, 311)):  # a fresh seed, then a state mid-block; both twist
                torch.manual_seed(seed)
                torch.empty(first, dtype=torch.int64).random_()
                start = torch.get_rng_state()
                want = torch.empty(700, dtype=torch.int64).random_().numpy().view(np.uint64)
                after = torch.get_rng_state()
                torch.set_rng_state(start)
                w = np.empty(1400, np.uint32)
                _draw_words(mt19937, w)
                got = ((w[0::2].astype(np.uint64) << np.uint64(32)) | w[1::2]) & np.uint64((1 << 63) - 1)
                if not (np.array_equal(got, want) and torch.equal(torch.get_rng_state(), after)):
                    return None
        except Exception:  # noqa: BLE001 - any surprise in the state's layout: the random_ form
            return None
    return mt19937


def _draw_words(mt19937, out: np.ndarray) -> None:
    """The default generator's next out.size 32-bit words into `out`, the generator advanced past them."""
    state = torch.get_rng_state().numpy()  # a copy
    left = int(state[_LEFT:_LEFT + 4].view(np.int32)[0])
    nxt = int(state[_NEXT:_NEXT + 8].view(np.uint64)[0])
    words = state[_WORDS:_WORDS + 624 * 8].view(np.uint64).astype(np.uint32)
    nxt, left = mt19937.words(words, nxt, left, out)
    state[_LEFT:_LEFT + 4].view(np.int32)[0] = left
    state[_NEXT:_NEXT + 8].view(np.uint64)[0] = nxt
    state[_WORDS:_WORDS + 624 * 8].view(np.uint64)[:] = words
    torch.set_rng_state(torch.from_numpy(state))


@torch.compiler.disable  # numpy and the generator's state: one opaque call under torch.compile
def _mt_noise(x: torch.Tensor, thr: int, scale: torch.Tensor) -> torch.Tensor:
    """F.dropout's noise for x (scale where kept, else 0) in empty_like(x)'s layout, filled in memory order
    as bernoulli_ fills it (empty_like gives a dense tensor), from aiacc's MT19937."""
    noise = torch.empty_like(x)
    n = noise.numel()
    flat = noise.as_strided((n,), (1,), noise.storage_offset()).numpy()
    w = np.empty(2 * n, np.uint32)
    with _LOCK:
        _draw_words(_ENGINE[0], w)
    _ENGINE[0].keep_noise(w, np.uint64(thr), float(scale), flat)
    return noise
