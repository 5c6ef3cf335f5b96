"""Which CPU kernel runs a float32 linear of the torch inference export, chosen per product shape by timing.

Two kernels compute act(x @ W^T + b) on a weight packed once (fastpath.linear runs either):
- "onednn": oneDNN's inner product (torch.ops.mkldnn._linear_pointwise) with the activation as a post-op;
- "mkl": MKL's packed sgemm (torch.ops.mkl._mkl_linear, what inductor's freezing uses for float32 linears)
  with the activation run after it.
Measured here (2 cores, AVX-512): MKL's packed sgemm 3-10% faster on transformer-sized products (128 x 768 x
2304 ... 3072), which made a 4-layer BERT-base 0.88x -> 0.79x of onnxruntime's latency; but which wins
depends on the machine's BLAS and the shape, so each distinct (rows, in, out, activation) is timed once per
process, both kernels interleaved on random data of that shape, and MKL is chosen only when it is clearly
faster (MKL_BELOW of oneDNN's median). AIACC_LINEAR_KERNEL=onednn|mkl forces one kernel (measurements, bisection).
"""
from __future__ import annotations

import os
import statistics

import torch

from aiacc.plugins.timing import interleaved_times
from aiacc.plugins.torch import fastpath

ONEDNN, MKL = "onednn", "mkl"
MKL_BELOW = 0.97  # MKL is chosen when its median is at most this fraction of oneDNN's
ROUNDS, MAX_ROUNDS, MAX_SECONDS = 5, 15, 0.4
ENV = "AIACC_LINEAR_KERNEL"

_CHOSEN: dict[tuple, tuple[str, str]] = {}  # (rows, in, out, attr, scalars, algorithm, bias) -> (kernel, why)


def mkl_available() -> bool:
    """Whether this torch has MKL's packed linear (CPU builds with MKL: x86 wheels)."""
    return fastpath.MKL_LINEAR


def choose(rows: int, in_features: int, out_features: int, attr: str, scalars: list, algorithm: str | None,
           bias: bool) -> tuple[str, str]:
    """(kernel, why: the timing or what decided) for a float32 linear of that shape with post-op `attr` (a
    fastpath onednn_activation name)."""
    forced = os.environ.get(ENV, "").strip().lower()
    if not mkl_available():
        return ONEDNN, "MKL's packed linear is not in this torch"
    if forced in (ONEDNN, MKL):
        return forced, f"{ENV}={forced}"
    if min(rows, in_features, out_features) <= 0:
        return ONEDNN, "empty product"
    key = (rows, in_features, out_features, attr, tuple(scalars), algorithm, bias)
    if key not in _CHOSEN:
        _CHOSEN[key] = _measure(rows, in_features, out_features, attr, scalars, algorithm, bias)
    return _CHOSEN[key]


def _measure(rows, in_features, out_features, attr, scalars, algorithm, bias) -> tuple[str, str]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, in_features, generator=g)
    w = torch.randn(out_features, in_features, generator=g) / in_features ** 0.5
    b = torch.randn(out_features, generator=g) if bias else None
    fns = {k: (lambda k=k: fastpath.linear(x, w, b, attr, scalars, algorithm, kernel=k)) for k in (ONEDNN, MKL)}
    with torch.no_grad():
        times = interleaved_times(fns, rounds=ROUNDS, warmup=2, max_rounds=MAX_ROUNDS, max_seconds=MAX_SECONDS,
                                  ambiguous=1 - MKL_BELOW)
    ratio = statistics.median(times[MKL]) / statistics.median(times[ONEDNN])
    return (MKL if ratio <= MKL_BELOW else ONEDNN), f"mkl timed {ratio:.2f}x of onednn"


def summary(choices: list[tuple[tuple, str, str]]) -> list[str]:
    """Report lines for an export's choices [((rows, in, out), kernel, why)], one line per distinct choice:
    '4 x [128 x 768] -> 2304: mkl (mkl timed 0.93x of onednn)'."""
    counts: dict[tuple, int] = {}
    for choice in choices:
        counts[choice] = counts.get(choice, 0) + 1
    return [f"{n} x [{shape[0]} x {shape[1]}] -> {shape[2]}: {kernel} ({why})"
            for (shape, kernel, why), n in counts.items()]
