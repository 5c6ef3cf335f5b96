"""Training under a memory budget: which stretches of the forward pass to recompute (activation
checkpointing), framework-free.

The forward pass is cut into *units* at cut points, where exactly one tensor flows from everything before
to everything after (a ResNet block output, a transformer layer output). A unit i has:

- `saved`: the activation bytes its ops keep for the backward pass,
- `input`: the bytes of the tensor(s) entering it (what a checkpointed segment starting at i keeps),
- `cost`: what running it again costs (FLOPs, or any additive measure).

A plan keeps some units as they are and groups the others into checkpointed segments (contiguous runs).
Its activation memory, in the spirit of Chen et al. 2016 ("Training deep nets with sublinear memory
cost") with the backward pass's order taken into account:

    memory = max(held at the end of the forward pass,
                 max over segments s of (held before s + input of s + saved of s's units))

where a kept unit holds its saved bytes and a segment holds only its input; the second term is the
backward pass recomputing s while everything before s is still held. Its extra compute is the sum of the
segments' costs. `plan_checkpoints` finds the plan of least recompute whose memory fits the budget by
dynamic programming over (unit position, bytes held so far), exact on bytes bucketed to 1/`resolution` of
the budget and rounded up, so a plan found always fits. A budget below the smallest memory any plan
reaches is refused with that figure.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from aiacc.errors import AiaccError


class MemoryBudgetError(AiaccError):
    """A memory budget no checkpointing plan can meet; the message gives the smallest achievable figure."""

    def __init__(self, message: str, smallest: int):
        super().__init__(message)
        self.smallest = smallest


@dataclass(frozen=True)
class Unit:
    """One stretch of the forward pass between two cut points."""

    name: str
    saved: int
    input: int
    cost: float
    checkpointable: bool = True


@dataclass
class CheckpointPlan:
    """Which units to recompute: `segments` are (first, last) unit indices, inclusive."""

    units: list[Unit]
    segments: list[tuple[int, int]]
    memory: int  # activation bytes of the plan (the model above)
    baseline: int  # activation bytes with nothing recomputed
    recompute: float  # cost of the recomputed units
    total_cost: float  # cost of the whole forward pass
    budget: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def recompute_fraction(self) -> float:
        return self.recompute / self.total_cost if self.total_cost else 0.0

    def summary(self) -> str:
        mib = 1 << 20
        segs = ", ".join(f"{self.units[a].name}..{self.units[b].name}" if a != b else self.units[a].name
                         for a, b in self.segments) or "none"
        return (f"activation memory {self.memory / mib:.2f} MiB (original {self.baseline / mib:.2f} MiB, budget "
                f"{'-' if self.budget is None else f'{self.budget / mib:.2f} MiB'}); recomputes "
                f"{100 * self.recompute_fraction:.1f}% of the forward pass; checkpointed: {segs}")


def plan_memory_of(units: Sequence[Unit], segments: Sequence[tuple[int, int]]) -> int:
    """The activation memory of a plan (see the module docstring)."""
    first = {a: b for a, b in segments}
    kept = 0  # held at this point of the forward pass
    peak = 0
    i = 0
    while i < len(units):
        if i in first:
            b = first[i]
            # the backward pass recomputes this segment while everything before it is still held
            peak = max(peak, kept + units[i].input + sum(u.saved for u in units[i:b + 1]))
            kept += units[i].input
            i = b + 1
        else:
            kept += units[i].saved
            i += 1
    return max(peak, kept)


def smallest_memory(units: Sequence[Unit], resolution: int = 1024) -> tuple[int, list[tuple[int, int]]]:
    """The least activation memory a plan reaches (to within 1/resolution), and one such plan."""
    units = list(units)
    hi = plan_memory_of(units, [])
    best = (hi, [])
    lo = max((u.input for u in units), default=0)
    while hi - lo > max(hi // (4 * resolution), 1):
        mid = (lo + hi) // 2
        segs = _least_recompute(units, mid, resolution)
        if segs is None:
            lo = mid
        else:
            mem = plan_memory_of(units, segs)
            best = min(best, (mem, segs), key=lambda t: t[0])
            hi = min(mid, mem)
    return best


def plan_checkpoints(units: Sequence[Unit], budget: int, resolution: int = 1024) -> CheckpointPlan:
    """The plan of least recompute whose activation memory is at most `budget` bytes.

    Raises MemoryBudgetError (with the smallest achievable figure) when no plan fits.
    """
    units = list(units)
    baseline = plan_memory_of(units, [])
    total_cost = float(sum(u.cost for u in units))
    if budget >= baseline:
        return CheckpointPlan(units, [], baseline, baseline, 0.0, total_cost, budget, ["the budget needs no recompute"])
    segs = _least_recompute(units, budget, resolution)
    if segs is None or plan_memory_of(units, segs) > budget:
        smallest, smallest_segs = smallest_memory(units, resolution)
        if smallest <= budget:  # the bucketed search is conservative near the limit
            segs = smallest_segs
        else:
            mib = 1 << 20
            raise MemoryBudgetError(
                f"memory_budget of {budget / mib:.2f} MiB cannot be met: the smallest activation memory reachable "
                f"by recomputing ({len(smallest_segs)} checkpointed segments) is {smallest / mib:.2f} MiB "
                f"({smallest} bytes; the original needs {baseline / mib:.2f} MiB)", smallest)
    rc = float(sum(u.cost for a, b in segs for u in units[a:b + 1]))
    return CheckpointPlan(units, segs, plan_memory_of(units, segs), baseline, rc, total_cost, budget)


def _least_recompute(units: Sequence[Unit], budget: int, resolution: int) -> list[tuple[int, int]] | None:
    """Segments of least recompute whose memory is at most `budget`, by DP over (unit position, bytes
    held so far in buckets of budget/resolution, rounded up). A segment (i..j) may start in bucket m only
    if m's bytes + its input + its units' saved bytes fit the budget (its recompute in the backward pass)."""
    n = len(units)
    q = max(budget / resolution, 1.0)
    k = int(budget // q) + 1  # buckets 0..k-1; bucket m holds at most m*q bytes

    def buckets(b: int) -> int:
        return int(np.ceil(b / q - 1e-9))

    inf = np.inf
    dp = np.full((n + 1, k), inf)
    dp[0, 0] = 0.0
    # back pointers: the position a state came from, and whether the units from there on were a segment
    src = np.full((n + 1, k), -1, dtype=np.int64)
    seg_kind = np.zeros((n + 1, k), dtype=bool)
    keep_w = [buckets(u.saved) for u in units]
    seg_w = [buckets(u.input) for u in units]
    for i in range(n):
        row = dp[i]
        if not np.isfinite(row).any():
            continue
        w = keep_w[i]
        if w < k:  # keep unit i
            cand = np.full(k, inf)
            cand[w:] = row[:k - w]
            better = cand < dp[i + 1]
            dp[i + 1][better] = cand[better]
            src[i + 1][better] = i
            seg_kind[i + 1][better] = False
        if not units[i].checkpointable:
            continue
        w = seg_w[i]
        if w >= k:
            continue
        s, cost = units[i].input, 0.0
        for j in range(i, n):
            if not units[j].checkpointable:
                break
            s += units[j].saved
            cost += units[j].cost
            limit = int((budget - s) // q)  # start buckets m with m*q + s <= budget
            if limit < 0:
                break
            shifted = np.full(k, inf)
            top = min(limit + 1, k - w)
            shifted[w:w + top] = row[:top]
            cand = shifted + cost
            better = cand < dp[j + 1]
            dp[j + 1][better] = cand[better]
            src[j + 1][better] = i
            seg_kind[j + 1][better] = True
    last = dp[n]
    if not np.isfinite(last).any():
        return None
    m = int(np.argmin(last))
    segs, pos = [], n
    while pos > 0:
        prev = int(src[pos][m])
        if seg_kind[pos][m]:
            segs.append((prev, pos - 1))
            m -= seg_w[prev]
        else:
            m -= keep_w[prev]
        pos = prev
    return list(reversed(segs))


__all__ = ["Unit", "CheckpointPlan", "plan_checkpoints", "plan_memory_of", "smallest_memory", "MemoryBudgetError"]
