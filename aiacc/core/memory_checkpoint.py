"""Training under a memory budget: which stretches of the forward pass to recompute (activation
checkpointing), framework-free.

The forward pass is cut into *units* at cut points, where exactly one tensor flows from everything before
to everything after (a ResNet block output, a transformer layer output). A unit i has:

- `saved`: the activation bytes its ops keep for the backward pass,
- `input`: the bytes of the tensor(s) entering it (what a checkpointed segment starting at i keeps),
- `cost`: what running it again costs (FLOPs, or any additive measure).

A plan keeps some units as they are and groups the others into checkpointed segments (contiguous runs).
Its activation memory (Chen et al. 2016, "Training deep nets with sublinear memory cost"):

    memory = sum(saved of kept units) + sum(input of each segment) + max(sum(saved) over a segment's units)

the last term being the segment recomputed during the backward pass; its extra compute is the sum of the
segments' costs. `plan_checkpoints` finds the plan of least recompute whose memory fits the budget by
dynamic programming over unit positions (exact on memory bucketed to 1/`resolution` of the budget,
rounded up so a plan found always fits), once per candidate value of the max term. A budget below
the smallest memory any plan reaches is refused with that figure.
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
    inside = set()
    total, peak = 0, 0
    for a, b in segments:
        total += units[a].input
        peak = max(peak, sum(u.saved for u in units[a:b + 1]))
        inside.update(range(a, b + 1))
    return total + peak + sum(u.saved for i, u in enumerate(units) if i not in inside)


def smallest_memory(units: Sequence[Unit]) -> tuple[int, list[tuple[int, int]]]:
    """The least activation memory any plan reaches, and one such plan."""
    best = (plan_memory_of(units, []), [])
    for cap in sorted({s for s in _segment_sums(units).values()}):
        segs = _min_kept(units, cap)
        if segs is not None:
            m = plan_memory_of(units, segs)
            if m < best[0]:
                best = (m, segs)
    return best


def _segment_sums(units: Sequence[Unit]) -> dict[tuple[int, int], int]:
    sums = {}
    for a in range(len(units)):
        if not units[a].checkpointable:
            continue
        s = 0
        for b in range(a, len(units)):
            if not units[b].checkpointable:
                break
            s += units[b].saved
            sums[(a, b)] = s
    return sums


def _min_kept(units: Sequence[Unit], cap: int) -> list[tuple[int, int]] | None:
    """Segments minimizing kept memory (kept units' saved + segment inputs) with every segment's saved
    total at most `cap` (a shortest path over positions)."""
    n = len(units)
    inf = float("inf")
    best = [inf] * (n + 1)
    choice: list[tuple[int, int] | None] = [None] * (n + 1)
    best[0] = 0
    for i in range(n):
        if best[i] == inf:
            continue
        # keep unit i
        if best[i] + units[i].saved < best[i + 1]:
            best[i + 1], choice[i + 1] = best[i] + units[i].saved, None
        if not units[i].checkpointable:
            continue
        s = 0
        for j in range(i, n):
            if not units[j].checkpointable:
                break
            s += units[j].saved
            if s > cap:
                break
            if best[i] + units[i].input < best[j + 1]:
                best[j + 1], choice[j + 1] = best[i] + units[i].input, (i, j)
    segs, k = [], n
    while k > 0:
        c = choice[k]
        if c is None:
            k -= 1
        else:
            segs.append(c)
            k = c[0]
    return list(reversed(segs))


def plan_checkpoints(units: Sequence[Unit], budget: int, resolution: int = 1024,
                     candidates: int = 48) -> CheckpointPlan:
    """The plan of least recompute whose activation memory is at most `budget` bytes.

    Raises MemoryBudgetError (with the smallest achievable figure) when no plan fits.
    """
    units = list(units)
    baseline = plan_memory_of(units, [])
    total_cost = float(sum(u.cost for u in units))
    if budget >= baseline:
        return CheckpointPlan(units, [], baseline, baseline, 0.0, total_cost, budget, ["the budget needs no recompute"])
    smallest, smallest_segs = smallest_memory(units)
    if budget < smallest:
        mib = 1 << 20
        raise MemoryBudgetError(
            f"memory_budget of {budget / mib:.2f} MiB cannot be met: the smallest activation memory reachable by "
            f"recomputing ({len(smallest_segs)} checkpointed segments) is {smallest / mib:.2f} MiB "
            f"({smallest} bytes; the original needs {baseline / mib:.2f} MiB)", smallest)
    sums = _segment_sums(units)
    caps = sorted({s for s in sums.values() if s <= budget})
    if len(caps) > candidates:  # the max term's candidates: spread over the range, always keep the extremes
        idx = np.unique(np.linspace(0, len(caps) - 1, candidates).round().astype(int))
        caps = [caps[i] for i in idx]
    best: tuple[float, int, list[tuple[int, int]]] | None = None
    for cap in caps:
        room = budget - cap
        if room < 0:
            continue
        segs = _least_recompute(units, cap, room, resolution)
        if segs is None:
            continue
        mem = plan_memory_of(units, segs)
        if mem > budget:  # cannot happen with rounding up, kept as a guard
            continue
        rc = float(sum(u.cost for a, b in segs for u in units[a:b + 1]))
        if best is None or (rc, mem) < (best[0], best[1]):
            best = (rc, mem, segs)
    if best is None:  # the bucketed search is conservative; the smallest plan always fits
        segs = smallest_segs
        best = (float(sum(u.cost for a, b in segs for u in units[a:b + 1])), smallest, segs)
    rc, mem, segs = best
    return CheckpointPlan(units, segs, mem, baseline, rc, total_cost, budget)


def _least_recompute(units: Sequence[Unit], cap: int, room: int, resolution: int) -> list[tuple[int, int]] | None:
    """Segments of least recompute with kept memory <= room and each segment's saved total <= cap."""
    n = len(units)
    q = max(room / resolution, 1.0)
    k = int(room // q) + 1  # buckets 0..k-1; kept memory rounded up to buckets

    def buckets(b: int) -> int:
        return int(np.ceil(b / q - 1e-9))

    inf = np.inf
    dp = np.full((n + 1, k), inf)
    dp[0, 0] = 0.0
    # back pointers: the position a state came from, and whether units from there on were a segment
    src = np.full((n + 1, k), -1, dtype=np.int64)
    seg_kind = np.zeros((n + 1, k), dtype=bool)
    keep_w = [buckets(u.saved) for u in units]
    seg_w = [buckets(u.input) for u in units]
    for i in range(n):
        row = dp[i]
        if not np.isfinite(row).any():
            continue
        # keep unit i
        w = keep_w[i]
        if w < k:
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
        s, cost = 0, 0.0
        shifted = np.full(k, inf)
        shifted[w:] = row[:k - w]
        for j in range(i, n):
            if not units[j].checkpointable:
                break
            s += units[j].saved
            cost += units[j].cost
            if s > cap:
                break
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
