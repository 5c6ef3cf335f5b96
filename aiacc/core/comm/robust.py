"""Planning under an uncertain contention estimate.

The compute slowdown `cs` (ClusterSpec.compute_slowdown: how much slower backward runs while an
all-reduce is in flight, on cores that gloo shares) is measured on a loaded machine and varies between
measurements (1.2-2.5x between probe runs on the testbed). This module

- reads `cs` off a training step: `slowdown_from_span` inverts the simulator's own contention rule on
  a step whose backward ran with buckets in flight, given the same backward measured with none in
  flight (so the estimate is in the units the planner uses);
- pools several estimates (`pool_slowdowns`: their median, and the range of the plausible ones);
- picks, among a few finalist plans, the one whose predicted step is good across that range
  (`robust_pick`: least worst-case regret), instead of the best at one point estimate.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from aiacc.core.comm.cost import CostModel
from aiacc.core.comm.errors import CommError
from aiacc.core.comm.plan import Plan
from aiacc.core.comm.simulate import simulate
from aiacc.core.comm.spec import ClusterSpec, ModelSpec

from aiacc.core.comm.contention import SLOWDOWN_CAP  # noqa: F401 (the largest slowdown any estimate reports)
MIN_SENSITIVITY = 0.15  # a step whose simulated backward moves less than this fraction over [1, cap] tells
# nothing that the load of the moment (5-10% between steps on a shared core) would not swamp


def with_slowdown(cluster: ClusterSpec, cs: float) -> ClusterSpec:
    """`cluster` with compute slowdown `cs` (at least 1) as a point estimate (no range)."""
    return dataclasses.replace(cluster, compute_slowdown=float(max(1.0, cs)), compute_slowdown_range=None)


def backward_span(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel | None = None) -> float:
    """Simulated seconds from the end of the first backward layer to the end of the last (the span a
    step's gradient hooks see: from the first gradient ready to the last)."""
    res = simulate(model, cluster, plan, cost, validate=False, sync="step")
    ends = [e.end for e in res.events if e.lane == "compute" and e.name.startswith("backward ")]
    return float(ends[-1] - ends[0]) if ends else 0.0


def slowdown_from_span(model: ModelSpec, cluster: ClusterSpec, plan: Plan, span_s: float,
                       cost: CostModel | None = None, tol: float = 1e-3) -> float | None:
    """The compute slowdown at which the simulator's backward span (`backward_span`) of `plan` on
    `model` (layer times measured with nothing in flight) equals `span_s`, the span measured with the
    plan's buckets in flight beside backward: bisection on [1, SLOWDOWN_CAP] (the span grows with the
    slowdown); 1 where the step was no slower than compute alone. None where the plan keeps backward
    nearly free of communication (its span moves less than MIN_SENSITIVITY over that range: the step
    says nothing about contention), or where the step was slower than even SLOWDOWN_CAP explains (a
    load spike on the shared core, which an estimate at the cap would take for contention)."""
    if not span_s > 0:
        raise CommError(f"contention from a step: the measured backward span must be positive, got {span_s}")
    cost = cost or CostModel(cluster, compression=plan.compression)
    lo, hi = 1.0, SLOWDOWN_CAP
    s_lo = backward_span(model, with_slowdown(cluster, lo), plan, cost)
    s_hi = backward_span(model, with_slowdown(cluster, hi), plan, cost)
    if s_hi - s_lo <= MIN_SENSITIVITY * max(s_lo, 1e-12):
        return None
    if span_s <= s_lo:
        return 1.0
    if span_s >= s_hi:  # more than any slowdown up to the cap explains: the load of the moment, not contention
        return None
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if backward_span(model, with_slowdown(cluster, mid), plan, cost) < span_s:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def pool_slowdowns(estimates: Sequence[float]) -> tuple[float, tuple[float, float]]:
    """(median, (low, high)) of several compute-slowdown estimates: the median is the point estimate;
    the range is the interquartile one where there are at least 4 estimates (one wild probe run does not
    stretch it), else from the smallest to the largest. Each estimate is clipped to [1, SLOWDOWN_CAP]."""
    xs = np.clip(np.asarray([float(x) for x in estimates], dtype=float), 1.0, SLOWDOWN_CAP)
    if xs.size == 0:
        raise CommError("pool_slowdowns: no contention estimate to pool")
    med = float(np.median(xs))
    lo, hi = (np.percentile(xs, 25), np.percentile(xs, 75)) if xs.size >= 4 else (xs.min(), xs.max())
    return med, (float(min(lo, med)), float(max(hi, med)))


def slowdown_grid(cluster: ClusterSpec) -> tuple[float, ...]:
    """The compute slowdowns a robust choice is judged at: the cluster's range's ends and its point
    estimate (just the point estimate without a range)."""
    rng = cluster.compute_slowdown_range
    if rng is None:
        return (cluster.compute_slowdown,)
    return tuple(sorted({float(rng[0]), float(cluster.compute_slowdown), float(rng[1])}))


def regret_table(model: ModelSpec, cluster: ClusterSpec, plans: Sequence[Plan], grid: Sequence[float],
                 sync: str = "step", cost: CostModel | None = None) -> np.ndarray:
    """times[i, j]: the simulated step of plans[i] at compute slowdown grid[j]."""
    return np.array([[simulate(model, with_slowdown(cluster, cs), p, cost, validate=False, sync=sync).iteration_s
                      for cs in grid] for p in plans])


def robust_pick(times: np.ndarray, prefer: Sequence[int] = ()) -> int:
    """The row of `times` (plans x slowdowns) with the least worst-case regret: the largest ratio, over
    the slowdowns, of its step to the best plan's step at that slowdown. Ties (within 1e-9) go to the
    first index of `prefer` among them, else to the lowest index."""
    if times.ndim != 2 or times.size == 0:
        raise CommError(f"robust_pick needs a plans x slowdowns table, got shape {times.shape}")
    regret = (times / times.min(axis=0, keepdims=True)).max(axis=1)
    best = float(regret.min())
    tied = [i for i in range(len(regret)) if regret[i] <= best + 1e-9]
    return next((i for i in prefer if i in tied), tied[0])
