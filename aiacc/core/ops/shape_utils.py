"""Shape arithmetic shared by the inference rules, aware of symbolic dimensions."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from aiacc.core.ir import Dim, TensorType


def broadcast_shapes(*shapes: Sequence[Dim] | None) -> tuple[Dim, ...] | None:
    """Numpy broadcasting with symbols: equal symbols match, 1 broadcasts, unknown stays unknown.

    Raises ValueError on sizes that cannot broadcast.
    """
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for k in range(rank):
        dims = [s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0]
        concrete = {d for d in dims if isinstance(d, int) and d != 1}
        symbols = {d for d in dims if isinstance(d, str)}
        if len(concrete) > 1:
            raise ValueError(f"shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast")
        if concrete:
            out.append(concrete.pop())
        elif len(symbols) == 1 and None not in dims:
            out.append(symbols.pop())
        elif not symbols and None not in dims:
            out.append(1)
        else:
            out.append(None)
    return tuple(out)


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def conv_output_size(size: Dim, kernel: int, stride: int, pad_begin: int, pad_end: int, dilation: int,
                     ceil_mode: bool = False) -> Dim:
    """Output length of a sliding window (convolution or pooling)."""
    if not isinstance(size, int):
        return None
    effective = dilation * (kernel - 1) + 1
    span = size + pad_begin + pad_end - effective
    if span < 0:
        raise ValueError(f"window of {effective} is larger than the padded input of {size + pad_begin + pad_end}")
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad_begin:
        out -= 1  # the last window would start inside the end padding
    return out


def auto_pads(auto_pad: str, sizes: Sequence[Dim], kernel: Sequence[int], strides: Sequence[int],
              dilations: Sequence[int]) -> list[int] | None:
    """Explicit pads [b1..bn, e1..en] for SAME_UPPER / SAME_LOWER; None when a size is unknown."""
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        if not isinstance(size, int):
            return None
        out = -(-size // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        small, big = total // 2, total - total // 2
        if auto_pad == "SAME_UPPER":
            begins.append(small)
            ends.append(big)
        else:
            begins.append(big)
            ends.append(small)
    return begins + ends


def same_type(t: TensorType | None) -> TensorType | None:
    return t


def numel(shape: Sequence[Dim]) -> int | None:
    if any(not isinstance(d, int) for d in shape):
        return None
    return int(np.prod(shape, dtype=np.int64))
