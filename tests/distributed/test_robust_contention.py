"""Contention measured from training steps, pooled, and plans chosen robustly over its range.

aiacc.core.comm.robust: the compute slowdown read off a step by inverting the simulator
(`slowdown_from_span`), pooled (`pool_slowdowns`), and the least worst-case-regret choice (`robust_pick`);
planning's pool (`add_slowdown_estimates`) and robust search (`robust_search`); the safe plans a fallback
may run (Horovod's fusion after backward among them); the executor holding a step's all-reduces until
backward's end; and, on 2 loopback ranks, GradientScheduler's profiled steps (quiet, busy) feeding the pool.
No timing is asserted.
"""
import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

from aiacc.core.comm import ClusterSpec, CommError, CostModel, gradient_specs_from_params, simulate
from aiacc.core.comm.robust import (backward_span, pool_slowdowns, regret_table, robust_pick, slowdown_from_span,
                                    slowdown_grid, with_slowdown)
from aiacc.core.comm.strategies import (DDP_DEFAULT_MB, MB, after_backward, aiacc_search, ddp, ddp_layout,
                                        is_ddp_default, safe_family, safe_label)

torch = pytest.importorskip("torch")
from aiacc.distributed import planning  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _spec(n=12, shape=(512, 1024), bwd=0.02):
    entries = [(f"l{i}.w", shape, "float32") for i in range(n)]
    return gradient_specs_from_params(entries, forward_s=[bwd / 2] * n, backward_s=[bwd] * n)


def _cluster(rate=1.25e8, **kw):
    samples = tuple((float(b), 2e-4 + b / rate) for b in (4, 1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24, 1 << 26))
    return ClusterSpec(2, 1, rate, allreduce_samples=samples, **kw)


def test_the_slowdown_read_off_a_busy_step_is_the_one_that_made_it():
    spec, c = _spec(), _cluster()
    plan = ddp(spec, bucket_cap=2 * MB)  # buckets in flight beside most of backward
    for cs in (1.0, 1.35, 2.2, 4.0):
        span = backward_span(spec, with_slowdown(c, cs), plan)
        assert slowdown_from_span(spec, c, plan, span) == pytest.approx(cs, abs=5e-3)
    base = backward_span(spec, c, plan)
    assert base == pytest.approx(spec.backward_s - spec.layers[-1].backward_s)  # first gradient to the last
    assert slowdown_from_span(spec, c, plan, 0.5 * base) == 1.0  # faster than compute alone: no slowdown
    # slower than the cap explains: a load spike, not contention
    assert slowdown_from_span(spec, c, plan, 100 * base) is None
    # a plan that sends only after backward says nothing about contention
    assert slowdown_from_span(spec, c, after_backward(spec), base) is None
    with pytest.raises(CommError):
        slowdown_from_span(spec, c, plan, 0.0)


def test_pooled_slowdowns_median_and_range():
    assert pool_slowdowns([1.4]) == (1.4, (1.4, 1.4))
    assert pool_slowdowns([1.2, 2.5]) == (pytest.approx(1.85), (1.2, 2.5))  # few: smallest to largest
    med, (lo, hi) = pool_slowdowns([1.3, 1.5, 1.6, 1.7, 9.0])  # one wild probe run
    assert med == 1.6 and lo == 1.5 and hi == 1.7  # the interquartile range: not stretched to 9
    assert pool_slowdowns([0.5, 30.0])[1] == (1.0, 10.0)  # clipped to [1, cap]
    with pytest.raises(CommError):
        pool_slowdowns([])
    c = _cluster(compute_slowdown=1.6, compute_slowdown_range=(1.5, 1.7))
    assert slowdown_grid(c) == (1.5, 1.6, 1.7) and slowdown_grid(_cluster(compute_slowdown=1.3)) == (1.3,)
    with pytest.raises(CommError):
        _cluster(compute_slowdown=2.0, compute_slowdown_range=(1.2, 1.5))  # the point outside its range
    with pytest.raises(CommError):
        _cluster(slowdown_estimates=(0.9,))


def test_robust_pick_takes_the_least_worst_case_regret():
    times = np.array([[1.00, 1.50],   # best at low slowdown, bad at high: regret 1.5
                      [1.20, 1.10],   # never best, never bad: regret 1.2
                      [1.40, 1.00]])  # regret 1.4
    assert robust_pick(times) == 1
    assert robust_pick(np.array([[1.0, 2.0], [1.0, 2.0]]), prefer=(1,)) == 1  # ties: the preferred
    with pytest.raises(CommError):
        robust_pick(np.zeros((0, 2)))


def test_the_safe_plans_include_horovods_fusion_after_backward_and_it_runs_where_overlap_costs():
    spec = _spec(n=30, bwd=0.004)  # 60 MB of gradients, a 0.12 s backward
    rate = 1.25e9
    safe = safe_family(spec, _cluster(rate))
    labels = [safe_label(p) for p in safe]
    assert labels[-1] == "Horovod-like 64 MB fusion after backward" and "DDP-like buckets of 25 MB (DDP's default)" in labels
    hv = safe[-1]
    assert hv.params["after_backward"] and all(b.not_before == spec.backward_s for b in hv.buckets)
    hv.validate(spec)
    # compute and transport each slow the other so much (1/cs + 1/ns < 1) that overlap loses: the plan sends
    # after backward, faster than DDP's default by more than the margin
    c = _cluster(rate, compute_slowdown=5.5, comm_slowdown=1.4)
    plan, res, _ = aiacc_search(spec, c, sync="step", fallback_margin=planning.FALLBACK_MARGIN)
    default = simulate(spec, c, ddp(spec, bucket_cap=DDP_DEFAULT_MB * MB), sync="step").iteration_s
    assert plan.params.get("after_backward") and res.iteration_s < default * (1 - planning.FALLBACK_MARGIN)
    # without contention overlap wins and DDP-like small buckets (or aiacc's own) run instead
    plan, _, _ = aiacc_search(spec, _cluster(rate), sync="step", fallback_margin=planning.FALLBACK_MARGIN)
    assert not plan.params.get("after_backward")


@pytest.fixture
def group():
    """A gloo process group of one rank in this process (torn down afterwards)."""
    dist = torch.distributed
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_held_step_starts_no_all_reduce_before_backwards_end(group):
    from aiacc.distributed.executor import PlanExecutor

    spec = _spec(n=3, shape=(4, 5))
    numel = {g.name: g.numel for g in spec.gradients()}
    for plan, hold in ((ddp(spec, bucket_cap=1, first_bucket_cap=1), True), (after_backward(spec), False)):
        ex = PlanExecutor(plan, list(range(len(plan.buckets))), numel)
        if hold:
            ex.hold_step()
        order = [g for g, _, _ in spec.backward_order()]
        for g in order[:-1]:
            ex.ready(g.name, torch.ones(g.numel))
        assert ex.works == []  # every bucket but the last is full, none started
        ex.ready(order[-1].name, torch.ones(order[-1].numel))  # backward's last gradient: all start, in order
        assert [pos for pos, *_ in ex.works] == list(range(len(plan.buckets)))
        out = ex.wait()
        assert all(torch.equal(t, torch.ones(t.numel())) for t in out.values())
        ex.ready(order[0].name, torch.ones(order[0].numel))
        assert bool(ex.works) == hold  # the next step is held only by a plan made to send after backward
        if ex.works:
            with pytest.raises(CommError):
                ex.hold_step()  # too late: this step's all-reduces started
        else:  # a gradient that never came (an unused parameter): complete() fills it and starts the rest
            ex.ready(order[1].name, torch.ones(order[1].numel))
            assert ex.works == []
            ex.complete()
            assert len(ex.works) == len(plan.buckets)
        ex.wait()


@pytest.fixture
def fake_job(monkeypatch):
    """planning's module state as after a calibration of 2 ranks (generic probe 1.3x), restored after."""
    cluster = _cluster(compute_slowdown=1.3, comm_slowdown=1.1)
    monkeypatch.setattr(planning, "_CLUSTER", cluster)
    monkeypatch.setattr(planning.dist, "get_world_size", lambda: 2)
    return cluster


def test_estimates_pool_in_the_cluster_and_a_range_makes_the_choice_robust(fake_job, monkeypatch):
    monkeypatch.setattr(planning, "measure_contention", lambda workload, numel, reps: (1.8, 1.05))
    c = planning.probe_contention(object())
    # the model's own probe replaces the generic one: one estimate, no range
    assert (c.compute_slowdown, c.comm_slowdown, c.slowdown_estimates, c.compute_slowdown_range) == (1.8, 1.05, (1.8,), None)
    c = planning.add_slowdown_estimates([1.2, 2.6])  # two more from a profiled step
    assert c.compute_slowdown == 1.8 and c.compute_slowdown_range == (1.2, 2.6) and c.comm_slowdown == 1.05
    assert planning.current_cluster() is c  # what plan_for plans with
    spec = _spec()
    plan, res = planning.robust_search(spec, c, sync="step")
    info = plan.params["robust"]
    assert info["grid"] == [1.2, 1.8, 2.6] and info["finalists"] >= 2
    # the chosen plan's worst-case regret over the range is the least of the finalists' (aiacc's search at
    # each point of the grid, the safe plans), recomputed from the simulator
    finalists = [aiacc_search(spec, with_slowdown(c, cs), sync="step")[0] for cs in info["grid"]]
    finalists += safe_family(spec, c)
    t = regret_table(spec, c, finalists, info["grid"], sync="step")
    mine = regret_table(spec, c, [plan], info["grid"], sync="step")[0]
    regret = (t / t.min(axis=0)).max(axis=1)
    assert (mine / t.min(axis=0)).max() == pytest.approx(regret.min()) == pytest.approx(info["regret"])
    point = finalists[1]
    assert res.iteration_s == pytest.approx(simulate(spec, c, plan, sync="step").iteration_s)
    # a narrow range (under ROBUST_SPREAD): the point estimate's search alone
    narrow = dataclasses.replace(c, compute_slowdown_range=(1.75, 1.85))
    plain, _ = planning.robust_search(spec, narrow, sync="step")
    assert "robust" not in plain.params and plain.buckets == point.buckets
    # another model: its estimates start afresh
    c = planning.reset_contention()
    assert c.slowdown_estimates == () and c.compute_slowdown_range is None
    # an assumed network (no samples) models no contention
    monkeypatch.setattr(planning, "_CLUSTER", ClusterSpec(2, 1, 1e9))
    assert planning.add_slowdown_estimates([3.0]).compute_slowdown == 1.0


WORKER = r'''
import json, sys
import numpy as np
import torch
import aiacc.plugins.torch.horovod as hvd
from aiacc.distributed import planning
from aiacc.plugins.torch.distributed import CONTENTION_PATTERN, PROFILE_STEPS

torch.set_num_threads(1)
hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)])
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters())
s = opt._aiacc_scheduler
x = torch.randn(8, 64, 256, generator=torch.Generator().manual_seed(1))
y = torch.randn(8, 64, 256, generator=torch.Generator().manual_seed(2))
r = hvd.rank()
started, plans = [], []
for i in range(PROFILE_STEPS + 2):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x[4 * r:4 * r + 4]), y[4 * r:4 * r + 4]).backward()
    ex = s.executor  # before synchronize: how many gradients were ready when the first bucket started
    started.append(min(ex.launched_at) < len(ex.numel) if ex.launched_at else False)
    opt.step()
    plans.append(s.plan.strategy + ("/probe" if s.probing else ""))
c = planning.current_cluster()
json.dump({"started": started, "plans": plans, "pattern": list(CONTENTION_PATTERN), "est": s.contention_estimate,
           "pool": list(c.slowdown_estimates), "cs": c.compute_slowdown,
           "params": {n: p.detach().numpy().tolist() for n, p in model.named_parameters()}},
          open(sys.argv[1] + f".{r}.json", "w"))
hvd.shutdown()
'''


def test_profiled_steps_measure_contention_and_feed_the_plan_on_two_ranks(tmp_path):
    from aiacc.distributed.launch import launch_local

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("AIACC_NETWORK_GBPS", None)
    res = launch_local([str(script), str(tmp_path / "out")], 2, timeout=180, env=env)
    for p in res:
        assert p.returncode == 0, p.stderr[-3000:]
    r0, r1 = (json.loads(Path(f"{tmp_path / 'out'}.{r}.json").read_text()) for r in range(2))
    pattern = r0["pattern"]
    # quiet steps start nothing before backward's last gradient; the others start buckets during backward
    assert r0["started"][:len(pattern)] == [k != "quiet" for k in pattern]
    # the probe plan during the profiled steps, aiacc's plan after them
    assert r0["plans"][:len(pattern) - 1] == ["ddp/probe"] * (len(pattern) - 1) and r0["plans"][-1] == "aiacc"
    # the estimate (one per quiet step, averaged over ranks) is in the pool, the same on both ranks
    assert r0["pool"] == r1["pool"] and r0["est"] == r1["est"]
    if r0["est"] is not None:
        assert 1 <= min(r0["pool"]) and r0["est"] == pytest.approx(float(np.median(r0["pool"])))
    # and training is single-process training on the full batch
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(8, 64, 256, generator=torch.Generator().manual_seed(1))
    y = torch.randn(8, 64, 256, generator=torch.Generator().manual_seed(2))
    for _ in range(len(r0["plans"])):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    for n, p in model.named_parameters():
        np.testing.assert_array_equal(np.array(r0["params"][n]), np.array(r1["params"][n]))
        np.testing.assert_allclose(np.array(r0["params"][n]), p.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_the_robust_choice_runs_ddps_default_unless_the_guard_finds_it_clearly_faster(fake_job):
    # compute-bound (10 Gbit/s, 24 MB of gradients, 240 ms of backward): the least-regret plan (DDP-like
    # 10 MB buckets) is predicted a little faster than DDP's default, within the model's error. robust_search
    # itself no longer judges against DDP's default: the plan it finds is another one, and choose_plan's one
    # guard (keep_or_ddp_default, DDP_DEFAULT_MARGIN) runs DDP's default layout instead, saying why
    fast = dataclasses.replace(_cluster(rate=1.25e9), compute_slowdown=1.5, compute_slowdown_range=(1.2, 2.2),
                               slowdown_estimates=(1.2, 1.5, 2.2))
    spec = _spec(bwd=0.02)
    other, _ = planning.robust_search(spec, fast, sync="step", margin=planning.FALLBACK_MARGIN)
    assert "robust" in other.params and other.buckets != ddp_layout(spec).buckets
    plan = planning.choose_plan(spec, fast, "aiacc", sync="step")
    assert is_ddp_default(plan, spec) and plan.params["fallback"] and plan.params["ddp_default"], plan.notes
    assert "DDP's default layout kept" in plan.notes and f"{planning.DDP_DEFAULT_MARGIN:.0%}" in plan.notes
    assert "at worst over 1.20-2.20" in plan.notes  # judged over the pooled range
    assert "DDP's default bucketing kept" not in plan.notes  # no second check with a margin of its own
    # link-bound (1 Gbit/s, 24 MB of gradients): a plan faster than DDP's default at every slowdown of
    # the range, by more than DDP_DEFAULT_MARGIN at the point estimate, runs
    slow = dataclasses.replace(fake_job, compute_slowdown=1.5, compute_slowdown_range=(1.2, 2.2),
                               slowdown_estimates=(1.2, 1.5, 2.2))
    spec = _spec()
    plan = planning.choose_plan(spec, slow, "aiacc", sync="step")
    assert "robust" in plan.params and not plan.params.get("ddp_default") and not is_ddp_default(plan, spec)
    grid = slowdown_grid(slow)
    t = regret_table(spec, slow, [plan, ddp_layout(spec)], grid, sync="step")
    assert planning.clearly_faster(t[0], t[1], grid.index(1.5), slow, planning.DDP_DEFAULT_MARGIN)
    assert plan.params["vs_ddp_default"] == pytest.approx(t[1][grid.index(1.5)] / t[0][grid.index(1.5)])
    assert not planning.clearly_faster(t[1], t[1], grid.index(1.5), slow, planning.DDP_DEFAULT_MARGIN)
