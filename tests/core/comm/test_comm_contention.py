"""The simulator with compute/communication contention (ClusterSpec.compute_slowdown / comm_slowdown, as
measured where gloo shares the cores with backward) and with a global synchronize (sync="step")."""
import dataclasses

import numpy as np
import pytest

from aiacc.core.comm import (Bucket, ClusterSpec, CommError, GradientSpec, Layer, ModelSpec, Piece, Plan, lower_bound,
                             make_plan, models, simulate)


def pair(**kw):
    """Two workers: ring all-reduce costs 2e-4 + n / 1e9 seconds."""
    return ClusterSpec(nodes=2, workers_per_node=1, inter_bandwidth=1e9, inter_latency=1e-4, **kw)


def model(*numel, fwd=0.01, bwd=0.02):
    return ModelSpec("m", tuple(Layer(f"l{i}", fwd, bwd, (GradientSpec(f"g{i}", n),)) for i, n in enumerate(numel)))


def whole(name, n, prio=0, not_before=0.0):
    return Bucket((Piece(name, 0, n),), prio, not_before)


@pytest.mark.parametrize("strategy", ["per-tensor", "ddp", "horovod", "bytescheduler", "aiacc"])
@pytest.mark.parametrize("sync", ["layer", "step"])
def test_without_contention_the_event_timeline_is_the_plain_one(strategy, sync):
    spec = models.resnet50(batch=32)
    c = ClusterSpec.from_workers(16, 8, 10)
    plan = make_plan(strategy, spec, c)
    plain = simulate(spec, c, plan, sync=sync)
    barely = simulate(spec, dataclasses.replace(c, compute_slowdown=1 + 1e-12), plan, sync=sync)
    assert barely.iteration_s == pytest.approx(plain.iteration_s, rel=1e-9)
    assert barely.issue_order == plain.issue_order
    assert sorted((e.lane, e.name) for e in barely.events) == sorted((e.lane, e.name) for e in plain.events)


def test_hand_computed_contention():
    # one layer (backward 20 ms) and its 8 MB gradient, sent at once: 2e-4 + 8e-3 s alone
    m = ModelSpec("m", (Layer("a", 0.01, 0.02, (GradientSpec("ga", 1000),)),
                        Layer("b", 0.01, 0.02, (GradientSpec("gb", 2_000_000),))))
    plan = Plan("p", (whole("gb", 2_000_000), whole("ga", 1000)))
    c = pair(compute_slowdown=2.0, comm_slowdown=1.5)
    r = simulate(m, c, plan)
    # t=0.02: gb ready, its all-reduce (8.2 ms alone, 12.3 ms beside compute) runs beside layer a's backward,
    # which goes at half speed: after 12.3 ms, a has 6.15 ms of work done, 13.85 ms left alone
    t_gb = 0.02 + 0.0082 * 1.5
    t_a = t_gb + (0.02 - 0.0123 / 2)
    t_ga = t_a + 2e-4 + 4e-6  # nothing else runs: full speed
    assert r.iteration_s == pytest.approx(t_ga + 0.02, rel=1e-9)  # the forward of a waits for ga, then b
    assert simulate(m, pair(), plan).iteration_s < r.iteration_s


def test_contention_makes_overlap_pay_less_and_is_never_faster():
    spec = models.bert_large(batch=8)
    c = ClusterSpec.from_workers(8, 1, 25)
    for strategy in ("ddp", "aiacc", "per-tensor"):
        plan = make_plan(strategy, spec, c)
        alone = simulate(spec, c, plan).iteration_s
        contended = simulate(spec, dataclasses.replace(c, compute_slowdown=1.5, comm_slowdown=1.3), plan).iteration_s
        assert contended > alone
        assert contended >= lower_bound(spec, c) - 1e-12  # contention only adds time: the bound still holds


def test_after_backward_plans_do_not_contend():
    # every bucket waits for the end of backward: nothing overlaps, so the slowdowns change nothing
    m = model(1000, 200_000, 3000)
    plan = Plan("after", tuple(whole(g.name, g.numel, 0, m.backward_s) for g in m.gradients()))
    a = simulate(m, pair(), plan, sync="step").iteration_s
    b = simulate(m, pair(compute_slowdown=3.0, comm_slowdown=2.0), plan, sync="step").iteration_s
    assert a == pytest.approx(b, rel=1e-12)


def test_sync_step_waits_for_every_bucket():
    m = model(1000, 1000, 4_000_000)
    plan = Plan("p", tuple(whole(g.name, g.numel) for g in m.gradients()))
    for c in (pair(), pair(compute_slowdown=1.2)):
        layer = simulate(m, c, plan, sync="layer")
        step = simulate(m, c, plan, sync="step")
        done = max(e.end for e in step.events if e.lane == "network")
        assert step.iteration_s == pytest.approx(max(done, m.backward_s) + m.forward_s, rel=1e-9)
        assert step.iteration_s >= layer.iteration_s
    with pytest.raises(CommError, match="unknown sync 'all'"):
        simulate(m, pair(), plan, sync="all")


def test_slowdowns_are_checked():
    with pytest.raises(CommError, match="compute_slowdown must be at least 1"):
        pair(compute_slowdown=0.5)
    with pytest.raises(CommError, match="comm_slowdown must be at least 1"):
        pair(comm_slowdown=float("nan"))
    assert not pair().contended and pair(comm_slowdown=1.1).contended


def test_planner_sees_contention():
    # when compute stalls to half speed beside communication, sending everything after backward in one
    # message is as good as overlapping: the plan aiacc keeps is never worse than that on the simulator
    spec = models.resnet50(batch=16)
    c = dataclasses.replace(ClusterSpec.from_workers(2, 1, 1), compute_slowdown=2.0, comm_slowdown=1.5)
    best = simulate(spec, c, make_plan("aiacc", spec, c)).iteration_s
    for other in ("ddp", "horovod", "per-tensor", "bytescheduler"):
        assert best <= simulate(spec, c, make_plan(other, spec, c)).iteration_s + 1e-12
    np.testing.assert_array_less(0, best)
