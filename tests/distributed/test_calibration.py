"""Calibration of the transport (aiacc.distributed.planning): the alpha-beta fit, the multi-node ClusterSpec
whose cost model reproduces the measured line, and a real calibration on 2 testbed nodes (its shape, never
its timing)."""
import dataclasses
import numpy as np
import pytest

pytest.importorskip("torch")

from aiacc.core.comm import ClusterSpec, CommError, CostModel  # noqa: E402
from aiacc.core.comm.cost import isotonic  # noqa: E402
from aiacc.distributed.planning import CALIBRATION_SIZES, cluster_from_fit, fit_alpha_beta  # noqa: E402


def test_fit_recovers_a_line_and_stays_positive():
    lat, coef = 2e-4, 8e-9
    samples = [(b, lat + coef * b) for b in (4, 1 << 16, 1 << 20, 1 << 22, 1 << 24)]
    got = fit_alpha_beta(samples)
    assert got[0] == pytest.approx(lat + coef * 4) and got[1] == pytest.approx(coef, rel=1e-6)
    # noisy small messages (slower than a larger one) never make the latency or the slope negative
    lat2, coef2 = fit_alpha_beta([(4, 5e-3), (1 << 16, 1e-3), (1 << 22, 3e-2)])
    assert lat2 >= 0 and coef2 > 0
    with pytest.raises(CommError, match="at least 2 sizes"):
        fit_alpha_beta([(4, 1e-4)])


@pytest.mark.parametrize("world,nodes", [(2, 2), (4, 4), (2, 1), (4, 1), (4, 2)])
def test_cluster_from_fit_reproduces_the_measured_ring(world, nodes):
    lat, coef = 3e-4, 1e-8
    c = cluster_from_fit(lat, coef, world, nodes)
    assert (c.nodes, c.workers_per_node) == (nodes, world // nodes)
    cost = CostModel(c, "ring")
    for n in (4, 1 << 20, 1 << 24):
        assert cost.time(n) == pytest.approx(lat + coef * n, rel=1e-9)
    assert CostModel(c).time(1 << 24) <= lat + coef * (1 << 24) + 1e-12  # "auto" never costs more than the ring


def test_calibration_on_two_testbed_nodes_is_a_two_node_cluster(two_node_job):
    """A real calibration (2 timed batches per size) on 2 testbed nodes at 1 Gbit/s, one rank each: the job
    of tests/distributed/conftest.py, which runs it after the fp16 wire test's all-reduces."""
    from aiacc.distributed import testbed

    if not two_node_job["on_testbed"]:
        pytest.skip(testbed.unavailable())
    got = two_node_job["calibration"]
    c = got["cluster"]
    assert (c["nodes"], c["workers_per_node"]) == (2, 1)  # one rank per node: the ring crosses the network
    assert [b for b, _ in got["samples"]] == [4 * n for n in CALIBRATION_SIZES]
    # the cluster carries the samples, so the cost model charges what was measured
    assert [tuple(x) for x in c["allreduce_samples"]] == [tuple(x) for x in got["samples"]]
    cost = CostModel(ClusterSpec(**{**c, "allreduce_samples": tuple(map(tuple, c["allreduce_samples"]))}))
    # the isotonic fit of the samples: non-decreasing, each run out of order replaced by its mean
    fitted = [cost.time(b) for b, _ in got["samples"]]
    assert all(a <= b + 1e-15 for a, b in zip(fitted, fitted[1:]))
    assert np.allclose(fitted, isotonic([t for _, t in got["samples"]]))
    assert c["inter_bandwidth"] > 0 and c["compute_slowdown"] >= 1 and c["comm_slowdown"] >= 1


def test_measured_costs_interpolate_the_samples_and_bound_them_below():
    samples = ((4.0, 4e-4), (1 << 14, 4e-3), (1 << 16, 3e-3), (1 << 20, 8e-3), (1 << 24, 0.14))
    c = ClusterSpec(2, 1, 1.25e8, allreduce_samples=samples)
    cost = CostModel(c)
    assert cost.best_algorithm(1000) == "measured"
    assert cost.time(1 << 20) == pytest.approx(8e-3)
    # out of order with the larger message's 3 ms: both become their mean (a fast larger sample no longer
    # makes the smaller message look cheap)
    assert cost.time(1 << 14) == pytest.approx(3.5e-3) and cost.time(1 << 16) == pytest.approx(3.5e-3)
    assert list(isotonic([1, 3, 2, 2, 5, 0, 6])) == pytest.approx([1, 7 / 3, 7 / 3, 7 / 3, 2.5, 2.5, 6])
    mid = (1 << 20) + ((1 << 24) - (1 << 20)) / 2
    assert cost.time(mid) == pytest.approx((8e-3 + 0.14) / 2)
    assert cost.time(1 << 25) > cost.time(1 << 24)  # beyond the largest sample: its average rate
    xs = np.array([4.0, 100.0, 1 << 14, 1 << 18, 1 << 22, 1 << 26])
    assert np.allclose(cost.time(xs), [cost.time(float(x)) for x in xs])
    line = cost.bound_terms()
    assert all(line(x) <= cost.time(float(x)) + 1e-15 for x in np.geomspace(1, 1 << 26, 200))
    with pytest.raises(CommError, match="allreduce_samples"):
        ClusterSpec(2, 1, 1.25e8, allreduce_samples=((4.0, 1e-3),))


def test_fp16_plans_are_charged_the_fp16_samples():
    fp32 = ((4.0, 1e-4), (1 << 20, 8e-3), (1 << 24, 0.12))
    fp16 = ((2.0, 1e-4), (1 << 19, 6e-3), (1 << 23, 0.09))  # dearer per byte than fp32 (gloo sums fp16 on the CPU)
    c = ClusterSpec(2, 1, 1.25e8, allreduce_samples=fp32, allreduce_samples_fp16=fp16)
    assert CostModel(c).time(1 << 23) == pytest.approx(CostModel(ClusterSpec(2, 1, 1.25e8, allreduce_samples=fp32)).time(1 << 23))
    assert CostModel(c, compression="fp16").time(1 << 23) == pytest.approx(0.09)
    assert CostModel(c, compression="fp16").time(1 << 23) > CostModel(c).time(1 << 23)
    # the simulator and the lower bound of an fp16 plan use them by default
    from aiacc.core.comm import gradient_specs_from_params, lower_bound, simulate
    from aiacc.core.comm.strategies import ddp

    m = gradient_specs_from_params([("w", (1 << 21,), "float32")], forward_s=1e-3, backward_s=1e-3)
    plan = ddp(m, c, compression="fp16")
    assert simulate(m, c, plan).iteration_s == pytest.approx(
        simulate(m, c, plan, CostModel(c, compression="fp16")).iteration_s)
    assert simulate(m, c, plan).iteration_s > simulate(m, c, plan, CostModel(c)).iteration_s
    assert lower_bound(m, c, compression="fp16") <= simulate(m, c, plan).iteration_s + 1e-12
    with pytest.raises(CommError, match="allreduce_samples_fp16"):
        ClusterSpec(2, 1, 1.25e8, allreduce_samples_fp16=((4.0, 1e-3),))


def test_calibration_batches_start_their_all_reduces_asynchronously_back_to_back(monkeypatch):
    """Each timed batch starts all its all-reduces (async_op=True) before it waits for the first, as the
    executor starts a plan's buckets (queued behind each other on the process group), and returns the time
    per message. A fake process group records the calls; no timing is asserted."""
    from aiacc.distributed import planning

    log = []

    class Work:
        def __init__(self, i):
            self.i = i

        def wait(self):
            log.append(("wait", self.i))
            return True

    class FakeDist:
        def all_reduce(self, t, async_op=False):
            log.append(("start" if async_op else "blocking", t.numel()))
            return Work(len(log))

        def barrier(self):
            log.append(("barrier",))

    monkeypatch.setattr(planning, "dist", FakeDist())
    n = 1 << 12
    k = planning.batch_messages(4 * n)
    wall, cpu = planning._timed_allreduce(n, reps=3)
    assert wall >= 0 and cpu >= 0
    batches, cur = [], None
    for entry in log:
        if entry[0] == "barrier":
            cur = []
            batches.append(cur)
        elif cur is not None:
            cur.append(entry[0])
    assert len(batches) == 3 and k >= 2
    for b in batches:  # k starts, then k waits: never one blocking call after another
        assert b == ["start"] * k + ["wait"] * k, b


def test_blocking_costs_take_the_blocking_samples_and_the_streamed_ones_above_them(monkeypatch):
    """with_blocking_costs: a cluster charged the all-reduces measured as blocking calls one after another
    (up to BLOCKING_MAX_BYTES) and the streamed ones above; the cluster itself before any were measured."""
    from aiacc.distributed import planning

    stream = [(64, 3e-3), (1 << 20, 5e-3), (1 << 22, 9e-3), (1 << 24, 0.03)]
    blocking = [(64, 1e-3), (1 << 20, 4e-3)]
    c = ClusterSpec(2, 1, 1.25e9, allreduce_samples=tuple((float(b), t) for b, t in stream))
    monkeypatch.setattr(planning, "_SAMPLES", list(stream))
    monkeypatch.setattr(planning, "_BLOCKING", [])
    assert planning.with_blocking_costs(c) is c
    monkeypatch.setattr(planning, "_BLOCKING", list(blocking))
    assert planning.blocking_samples() == blocking + stream[2:]
    assert planning.measurements(what="blocking") == blocking + stream[2:]
    b = planning.with_blocking_costs(c)
    assert CostModel(b).time(64) == pytest.approx(1e-3) and CostModel(c).time(64) == pytest.approx(3e-3)
    assert CostModel(b).time(1 << 24) == pytest.approx(CostModel(c).time(1 << 24))


def test_loop_calibration_issues_mixed_sizes_blocking_and_is_what_blocking_loops_are_charged(monkeypatch):
    """_timed_loop: each round one blocking call of every size, in turn (forwards, then backwards), after a
    barrier, and the mean per size; with_blocking_costs charges those means (and the streamed samples above
    them) over the same-size blocking samples; loop_rounds fits the budget within its bounds. A fake process
    group records the calls; no timing is asserted."""
    from aiacc.distributed import planning

    log = []

    class FakeDist:
        def all_reduce(self, t, async_op=False):
            assert not async_op
            log.append(t.numel())

        def barrier(self):
            log.append("barrier")

    monkeypatch.setattr(planning, "dist", FakeDist())
    out = planning._timed_loop([256, 16, 1 << 12], rounds=3)
    assert log == ["barrier", 16, 256, 4096, "barrier", 4096, 256, 16, "barrier", 16, 256, 4096]
    assert [b for b, _ in out] == [64, 1024, 16384] and all(t >= 0 for _, t in out)
    assert planning.loop_rounds([(64, 0.01), (1024, 0.02)], budget_s=0.3) == 10
    assert planning.loop_rounds([(64, 1.0)], budget_s=0.3) == planning.LOOP_MIN_ROUNDS
    assert planning.loop_rounds([(64, 1e-5)]) == planning.LOOP_MAX_ROUNDS

    stream = [(64, 3e-3), (1 << 20, 5e-3), (1 << 24, 0.03)]
    c = ClusterSpec(2, 1, 1.25e9, allreduce_samples=tuple((float(b), t) for b, t in stream))
    monkeypatch.setattr(planning, "_SAMPLES", list(stream))
    monkeypatch.setattr(planning, "_BLOCKING", [(64, 1e-3), (1 << 20, 4e-3)])
    monkeypatch.setattr(planning, "_LOOP", [])
    assert CostModel(planning.with_blocking_costs(c)).time(64) == pytest.approx(1e-3)  # no loop: same-size
    monkeypatch.setattr(planning, "_ALONE", [])
    monkeypatch.setattr(planning, "_LOOP", [(64, 2e-3), (1 << 20, 6e-3)])
    assert planning.loop_samples() == [(64, 2e-3), (1 << 20, 6e-3), (1 << 24, 0.03)]
    assert planning.measurements(what="loop") == planning.loop_samples()
    b = planning.with_blocking_costs(c)
    assert CostModel(b).time(64) == pytest.approx(2e-3) and CostModel(b).time(1 << 20) == pytest.approx(6e-3)
    assert CostModel(b).time(1 << 24) == pytest.approx(CostModel(c).time(1 << 24))
    # above the loop's sizes each blocking call is a lone message: its alone sample where measured, and no
    # lone-bucket extra on top of the loop's table
    monkeypatch.setattr(planning, "_ALONE", [(1 << 20, 7e-3), (1 << 24, 0.04)])
    assert planning.loop_samples() == [(64, 2e-3), (1 << 20, 6e-3), (1 << 24, 0.04)]
    alone = dataclasses.replace(c, allreduce_samples_alone=((1 << 20, 7e-3), (1 << 24, 0.04)))
    assert CostModel(alone).alone_extra(1 << 24) == pytest.approx(0.01)
    b = planning.with_blocking_costs(alone)
    assert b.allreduce_samples_alone is None and CostModel(b).time(1 << 24) == pytest.approx(0.04)
