"""A communication plan: which gradient pieces travel together, and in what order.

A `Piece` is a contiguous range of one gradient's flattened elements (a whole tensor, or a partition of
a large one). A `Bucket` is one all-reduce message made of pieces. A `Plan` lists the buckets and says
how the network picks the next one: "fifo" (in list order) or "priority" (the ready bucket with the
smallest priority number first; the priority is the forward index of the earliest layer it feeds).
The same plan object drives the simulator and the real executor.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from aiacc.core.comm.errors import CommError
from aiacc.core.comm.spec import ModelSpec

COMPRESSIONS = {"none": None, "fp16": "float16"}


@dataclass(frozen=True)
class Piece:
    grad: str
    start: int
    stop: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Bucket:
    pieces: tuple[Piece, ...]
    priority: int = 0
    not_before: float = 0.0  # seconds after backward starts (e.g. a Horovod cycle tick)

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.pieces)


@dataclass(frozen=True)
class Plan:
    strategy: str
    buckets: tuple[Bucket, ...]
    scheduling: str = "fifo"
    compression: str = "none"
    notes: str = ""
    params: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.scheduling not in ("fifo", "priority"):
            raise CommError(f"plan {self.strategy}: unknown scheduling {self.scheduling!r}")
        if self.compression not in COMPRESSIONS:
            raise CommError(f"plan {self.strategy}: unknown compression {self.compression!r}; "
                            f"expected one of {sorted(COMPRESSIONS)}")

    def wire_bytes(self, model: ModelSpec) -> list[int]:
        """Bytes each bucket puts on the wire."""
        size = {g.name: np.dtype(COMPRESSIONS[self.compression] or g.dtype).itemsize
                for l in model.layers for g in l.grads}
        return [sum(p.numel * size[p.grad] for p in b.pieces) for b in self.buckets]

    def validate(self, model: ModelSpec) -> None:
        """Raise CommError unless every element of every gradient is in exactly one piece."""
        numel = {g.name: g.numel for l in model.layers for g in l.grads}
        covered: dict[str, list[tuple[int, int]]] = {}
        for i, b in enumerate(self.buckets):
            if not b.pieces:
                raise CommError(f"plan {self.strategy}: bucket {i} is empty")
            for p in b.pieces:
                if p.grad not in numel:
                    raise CommError(f"plan {self.strategy}: bucket {i} names unknown gradient {p.grad}")
                if not 0 <= p.start < p.stop <= numel[p.grad]:
                    raise CommError(f"plan {self.strategy}: bucket {i} has piece [{p.start}, {p.stop}) "
                                    f"outside gradient {p.grad} of {numel[p.grad]} elements")
                covered.setdefault(p.grad, []).append((p.start, p.stop))
        for name, n in numel.items():
            spans = sorted(covered.get(name, []))
            pos = 0
            for s, e in spans:
                if s != pos:
                    what = "overlaps" if s < pos else f"misses elements [{pos}, {s}) of"
                    raise CommError(f"plan {self.strategy}: {what} gradient {name}")
                pos = e
            if pos != n:
                raise CommError(f"plan {self.strategy}: misses elements [{pos}, {n}) of gradient {name}")
