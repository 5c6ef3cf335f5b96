"""Choosing checkpoint segments under a memory budget (aiacc.core.memory_checkpoint), checked against
brute force over every plan of small chains."""
import numpy as np
import pytest

from aiacc.core.memory_checkpoint import (MemoryBudgetError, Unit, plan_checkpoints, plan_memory_of,
                                          smallest_memory)


def _all_plans(n):
    def rec(i):
        if i == n:
            yield []
            return
        yield from rec(i + 1)
        for j in range(i, n):
            for rest in rec(j + 1):
                yield [(i, j)] + rest
    yield from rec(0)


def _units(rng, n):
    return [Unit(f"u{i}", int(rng.integers(100, 1000)), int(rng.integers(10, 300)), float(rng.integers(1, 10)))
            for i in range(n)]


def test_memory_model():
    units = [Unit("a", 100, 10, 1), Unit("b", 200, 50, 2), Unit("c", 300, 60, 3)]
    assert plan_memory_of(units, []) == 600
    # checkpoint b..c: held = 100 + 50; recomputing it holds 100 + 50 + 500
    assert plan_memory_of(units, [(1, 2)]) == 650
    assert plan_memory_of(units, [(0, 0)]) == max(10 + 500, 10 + 100)


@pytest.mark.parametrize("seed", range(4))
def test_least_recompute_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    units = _units(rng, 8)
    plans = list(_all_plans(8))
    base = plan_memory_of(units, [])
    exact_smallest = min(plan_memory_of(units, p) for p in plans)
    smallest, segs = smallest_memory(units)
    assert plan_memory_of(units, segs) == smallest
    assert exact_smallest <= smallest <= exact_smallest * 1.002
    for frac in (0.8, 0.6, 0.5, 0.4):
        budget = int(frac * base)
        feasible = [sum(u.cost for a, b in p for u in units[a:b + 1]) for p in plans
                    if plan_memory_of(units, p) <= budget]
        if budget < smallest:
            with pytest.raises(MemoryBudgetError, match="cannot be met"):
                plan_checkpoints(units, budget)
            continue
        plan = plan_checkpoints(units, budget)
        assert plan.memory <= budget and plan.memory == plan_memory_of(units, plan.segments)
        assert plan.recompute >= min(feasible)
        # bytes are bucketed (rounded up) to 1/1024 of the budget: as good as the best plan that fits
        # with that slack to spare
        slack = len(units) * (budget / 1024 + 1)
        tighter = [sum(u.cost for a, b in p for u in units[a:b + 1]) for p in plans
                   if plan_memory_of(units, p) <= budget - slack]
        assert not tighter or plan.recompute <= min(tighter)


def test_unreachable_budget_reports_the_smallest_figure():
    units = _units(np.random.default_rng(7), 30)
    smallest, _ = smallest_memory(units)
    with pytest.raises(MemoryBudgetError) as info:
        plan_checkpoints(units, smallest // 2)
    assert info.value.smallest == smallest
    assert f"{smallest / 2 ** 20:.2f} MiB" in str(info.value)
    assert plan_checkpoints(units, smallest).memory <= smallest


def test_non_checkpointable_units_are_kept():
    units = [Unit("a", 500, 10, 1, checkpointable=False), Unit("b", 500, 10, 1), Unit("c", 500, 10, 1)]
    plan = plan_checkpoints(units, 1100)
    assert all(a >= 1 for a, _ in plan.segments) and plan.memory <= 1100
