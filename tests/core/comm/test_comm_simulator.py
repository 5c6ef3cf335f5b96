"""The alpha-beta cost model and the iteration simulator on hand-computed cases."""
import itertools
import json

import numpy as np
import pytest

from aiacc.core.comm import (Bucket, ClusterSpec, CommError, CostModel, GradientSpec, Layer, ModelSpec, Piece,
                             Plan, chrome_trace, lower_bound, simulate)
from aiacc.core.comm.strategies import bytescheduler, dp_buckets, _pieces, per_tensor

MB = 1 << 20


def pair(latency):
    """Two workers on one node: ring all-reduce costs 2*latency + n / 1e9 (2(p-1)/p = 1)."""
    return ClusterSpec(nodes=1, workers_per_node=2, inter_bandwidth=1e9, intra_bandwidth=1e9, intra_latency=latency)


def model(*grads_numel, fwd=0.01, bwd=0.02):
    return ModelSpec("m", tuple(Layer(f"l{i}", fwd, bwd, (GradientSpec(f"g{i}", n),)) for i, n in enumerate(grads_numel)))


def whole(name, n, prio=0):
    return Bucket((Piece(name, 0, n),), prio)


def test_cost_model_formulas():
    c = ClusterSpec(nodes=4, workers_per_node=8, inter_bandwidth=1e9, inter_latency=1e-4,
                    intra_bandwidth=1e10, intra_latency=1e-5)
    t = CostModel(c).terms
    assert t["ring"].latency == pytest.approx(62e-4) and t["ring"].coef == pytest.approx(2 * 31 / 32 / 1e9)
    assert t["hierarchical"].latency == pytest.approx(6e-4 + 1.4e-4)
    assert t["hierarchical"].coef == pytest.approx(1.5e-9 + 1.75e-10)
    assert t["hierarchical-tree"].latency == pytest.approx(4e-4 + 1.4e-4)
    assert t["hierarchical-tree"].coef == pytest.approx(2e-9 + 1.75e-10)
    cm = CostModel(c)
    assert cm.time(1000) == pytest.approx(5.4e-4 + 1000 * 2.175e-9)  # small: tree latency wins
    assert cm.best_algorithm(1000) == "hierarchical-tree"
    assert cm.time(1e9) == pytest.approx(7.4e-4 + 1e9 * 1.675e-9)  # large: hierarchical ring wins
    assert CostModel(c, "ring").time(1e6) == pytest.approx(62e-4 + 1e6 * 2 * 31 / 32 / 1e9)
    assert CostModel(ClusterSpec(1, 1, 1e9)).time(1e9) == 0
    with pytest.raises(CommError, match="unknown all-reduce algorithm 'mesh'"):
        CostModel(c, "mesh")


def test_one_tensor():
    m = model(1_000_000)  # 4 MB: all-reduce = 2 ms + 4 ms
    c = pair(1e-3)
    r = simulate(m, c, per_tensor(m))
    # backward 0-20 ms, all-reduce 20-26 ms, next forward 26-36 ms
    assert r.iteration_s == pytest.approx(0.036)
    assert r.compute_s == pytest.approx(0.030)
    assert r.exposed_s == pytest.approx(0.006)
    net = [e for e in r.events if e.lane == "network"]
    assert [(e.start, e.end) for e in net] == [pytest.approx((0.020, 0.026))]
    assert lower_bound(m, c) == pytest.approx(0.036)


def test_two_tensors_with_and_without_fusion():
    m = model(1_000_000, 1_000_000)  # layer 1's gradient is ready at 20 ms, layer 0's at 40 ms
    c = pair(1e-3)  # latency 2 ms per all-reduce
    separate = simulate(m, c, per_tensor(m))
    # g1 20-26 ms, g0 40-46 ms; forward l0 46-56, l1 56-66
    assert separate.iteration_s == pytest.approx(0.066)
    fused_plan = Plan("fused", (Bucket((Piece("g1", 0, 1_000_000), Piece("g0", 0, 1_000_000))),))
    fused = simulate(m, c, fused_plan)
    # one 8 MB all-reduce 40-50 ms (2 + 8 ms); forward 50-70
    assert fused.iteration_s == pytest.approx(0.070)
    # with a 40 ms latency fusion pays: separate g1 20-64, g0 64-108 -> 128 ms; fused 40-88 -> 108 ms
    c = pair(2e-2)
    assert simulate(m, c, per_tensor(m)).iteration_s == pytest.approx(0.128)
    assert simulate(m, c, fused_plan).iteration_s == pytest.approx(0.108)


def test_priority_and_partitioning_let_the_front_layer_overtake():
    m = model(1_000_000, 10_000_000)  # g1: 40 MB ready at 20 ms; g0: 4 MB ready at 40 ms
    c = pair(1e-3)
    # FIFO: g1 20-62 ms, g0 62-68, forward l0 68-78, l1 78-88
    assert simulate(m, c, per_tensor(m)).iteration_s == pytest.approx(0.088)
    # g1 cut into 4 x 10 MB (12 ms each): p1 20-32, p2 32-44, then g0 (priority 0) 44-50, p3 50-62, p4 62-74;
    # forward l0 50-60, l1 waits for p4: 74-84
    plan = bytescheduler(m, partition=10_000_000)
    assert len(plan.buckets) == 5
    r = simulate(m, c, plan)
    assert r.iteration_s == pytest.approx(0.084)
    assert [plan.buckets[k].pieces[0].grad for k in r.issue_order] == ["g1", "g1", "g0", "g1", "g1"]


def test_not_before_delays_a_bucket():
    m = model(1_000_000)
    plan = Plan("late", (Bucket((Piece("g0", 0, 1_000_000),), 0, not_before=0.05),))
    assert simulate(m, pair(1e-3), plan).iteration_s == pytest.approx(0.05 + 0.006 + 0.01)


def test_plan_validation_names_the_problem():
    m = model(10, 20)
    with pytest.raises(CommError, match=r"misses elements \[5, 10\) of gradient g0"):
        simulate(m, pair(0), Plan("p", (Bucket((Piece("g0", 0, 5), Piece("g1", 0, 20))),)))
    with pytest.raises(CommError, match="overlaps gradient g1"):
        simulate(m, pair(0), Plan("p", (whole("g0", 10), whole("g1", 20), Bucket((Piece("g1", 5, 6),)))))
    with pytest.raises(CommError, match="unknown gradient g7"):
        simulate(m, pair(0), Plan("p", (whole("g7", 10),)))
    with pytest.raises(CommError, match="unknown scheduling"):
        Plan("p", (), "lifo")
    with pytest.raises(CommError, match="gradient g0 appears twice"):
        ModelSpec("m", (Layer("a", 0, 0, (GradientSpec("g0", 1),)), Layer("b", 0, 0, (GradientSpec("g0", 1),))))


def test_dp_buckets_is_optimal_against_brute_force():
    rng = np.random.default_rng(0)
    m = ModelSpec("r", tuple(Layer(f"l{i}", 1e-3, float(rng.uniform(1e-4, 3e-3)),
                                   (GradientSpec(f"g{i}", int(rng.integers(1_000, 400_000))),)) for i in range(8)))
    cost = CostModel(pair(2e-4))
    pieces = _pieces(m, None, "none")

    def finish(spans):
        t = 0.0
        for j, i in spans:
            t = max(t, pieces[i - 1][1]) + cost.time(sum(p[3] for p in pieces[j:i]))
        return t

    best = min(finish(list(zip((0,) + cuts, cuts + (8,))))
               for k in range(8) for cuts in itertools.combinations(range(1, 8), k))
    assert finish(dp_buckets(pieces, cost)) == pytest.approx(best)


def test_chrome_trace_lists_compute_and_network_events(tmp_path):
    from aiacc.core.comm import write_chrome_trace

    m = model(1_000_000, 1_000_000)
    r = simulate(m, pair(1e-3), per_tensor(m))
    doc = json.loads(write_chrome_trace(r, tmp_path / "t.json").read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 2 + 2 + 2  # backward x2, all-reduce x2, forward x2
    ar = [e for e in spans if e["cat"] == "network"]
    assert [(round(e["ts"]), round(e["dur"])) for e in ar] == [(20000, 6000), (40000, 6000)]
    assert doc["otherData"]["iteration_s"] == pytest.approx(0.066)
    assert chrome_trace(r)["traceEvents"][0]["args"]["name"] == "aiacc plan: per-tensor"


def _ordered_partitions(items):
    """Every way to split `items` into non-empty groups and order the groups (Fubini many)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for tail in _ordered_partitions(rest):
        for i in range(len(tail)):  # join an existing group
            yield tail[:i] + [[first] + tail[i]] + tail[i + 1:]
        for i in range(len(tail) + 1):  # or form a new group at any position
            yield tail[:i] + [[first]] + tail[i:]


def _brute_force_best(m, c, cost, sync="layer"):
    """The fastest of all FIFO plans over whole tensors or halves (every grouping and order)."""
    grads = m.gradients()
    best = float("inf")
    for halves in itertools.product((False, True), repeat=len(grads)):
        pieces = []
        for g, half in zip(grads, halves):
            pieces += [Piece(g.name, 0, g.numel // 2), Piece(g.name, g.numel // 2, g.numel)] if half else [whole(g.name, g.numel).pieces[0]]
        for groups in _ordered_partitions(pieces):
            plan = Plan("bf", tuple(Bucket(tuple(grp)) for grp in groups))
            best = min(best, simulate(m, c, plan, cost, validate=False, sync=sync).iteration_s)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_lower_bound_holds_against_every_plan_of_small_models(seed):
    """No plan (any grouping, order or halving of 3 tensors) beats the bound, and it is not vacuous."""
    rng = np.random.default_rng(seed)
    m = ModelSpec("r", tuple(Layer(f"l{i}", float(rng.uniform(1e-4, 4e-3)), float(rng.uniform(1e-4, 6e-3)),
                                   (GradientSpec(f"g{i}", int(rng.integers(10_000, 3_000_000))),)) for i in range(3)))
    # several nodes so that "auto" mixes ring, hierarchical and tree algorithms (a concave cost)
    c = ClusterSpec(nodes=int(rng.choice([2, 4, 16])), workers_per_node=4, inter_bandwidth=float(rng.uniform(1e8, 2e9)),
                    inter_latency=float(rng.uniform(1e-5, 2e-3)), intra_bandwidth=1e10, intra_latency=1e-5)
    cost = CostModel(c)
    best, lb = _brute_force_best(m, c, cost), lower_bound(m, c, cost)
    assert lb <= best + 1e-12
    assert lb >= 0.9 * best  # and within 10% of the true optimum on these cases


@pytest.mark.parametrize("seed", range(4))
def test_step_sync_lower_bound_holds_against_every_plan_and_is_above_the_layer_bound(seed):
    """sync="step" (the next forward waits for every all-reduce): no plan beats its bound, which is at
    least the per-layer one and within 10% of the brute-force optimum."""
    rng = np.random.default_rng(50 + seed)
    m = ModelSpec("r", tuple(Layer(f"l{i}", float(rng.uniform(1e-4, 4e-3)), float(rng.uniform(1e-4, 6e-3)),
                                   (GradientSpec(f"g{i}", int(rng.integers(10_000, 3_000_000))),)) for i in range(3)))
    c = ClusterSpec(nodes=int(rng.choice([2, 4, 16])), workers_per_node=4, inter_bandwidth=float(rng.uniform(1e8, 2e9)),
                    inter_latency=float(rng.uniform(1e-5, 2e-3)), intra_bandwidth=1e10, intra_latency=1e-5)
    cost = CostModel(c)
    best, lb = _brute_force_best(m, c, cost, sync="step"), lower_bound(m, c, cost, sync="step")
    assert lower_bound(m, c, cost) <= lb <= best + 1e-12
    assert lb >= 0.9 * best
    with pytest.raises(CommError, match="unknown sync"):
        lower_bound(m, c, cost, sync="bucket")


def test_lower_bound_counts_the_messages_a_plan_needs():
    """Two tensors ready 20 ms apart: one message waits for both, two pay two latencies. The bound is
    the better of the two and the brute-force optimum attains it."""
    m = model(1_000_000, 1_000_000)
    c = pair(1e-3)  # 2 ms latency, 4 ms per MB... (1 ns per byte)
    # one message 40-50 ms then forward 20 ms = 70 ms; two messages: g1 20-26, g0 40-46, forward -> 66 ms
    # the bound: min(40 + 10 + 20, 20 + 2 + 10 + 20, 40 + 2 + 10 + 10, 20 + 4 + 10 + 10) = 44 ms (K >= 3 case),
    # the per-layer term: g0 ready at 40 ms, 6 ms, then 20 ms forward = 66 ms
    assert lower_bound(m, c) == pytest.approx(0.066)
    assert _brute_force_best(m, c, CostModel(c)) == pytest.approx(0.066)


@pytest.mark.parametrize("seed", range(6))
def test_lower_bound_holds_on_varied_models_and_clusters(seed):
    """2-5 layers (some with two tensors, the largest tensor cut in thirds when there are few), one or
    many nodes, any worker count: every grouping and order of the pieces stays above the bound."""
    rng = np.random.default_rng(1000 + seed)
    m = ModelSpec("r", tuple(Layer(f"l{i}", float(rng.uniform(1e-5, 4e-3)), float(rng.uniform(1e-5, 6e-3)),
                                   tuple(GradientSpec(f"g{i}_{j}", int(rng.integers(1_000, 5_000_000)))
                                         for j in range(int(rng.integers(0, 2)) or 1)))
                             for i in range(int(rng.integers(2, 6)))))
    c = ClusterSpec(nodes=int(rng.choice([1, 2, 4, 16, 32])), workers_per_node=int(rng.choice([1, 4, 8])),
                    inter_bandwidth=float(rng.uniform(1e8, 5e9)), inter_latency=float(rng.uniform(1e-6, 3e-3)),
                    intra_bandwidth=float(rng.uniform(1e9, 1e11)), intra_latency=float(rng.uniform(1e-6, 1e-4)))
    cost = CostModel(c)
    grads = m.gradients()
    pieces = [Piece(g.name, 0, g.numel) for g in grads]
    if len(pieces) <= 3:
        g = max(grads, key=lambda g: g.numel)
        t = g.numel // 3
        pieces = [p for p in pieces if p.grad != g.name] + [Piece(g.name, 0, t), Piece(g.name, t, 2 * t),
                                                            Piece(g.name, 2 * t, g.numel)]
    best = min(simulate(m, c, Plan("bf", tuple(Bucket(tuple(grp)) for grp in groups)), cost, validate=False).iteration_s
               for groups in _ordered_partitions(pieces))
    lb = lower_bound(m, c, cost)
    assert best * 0.85 <= lb <= best + 1e-12


def _alone_cluster(alone=True, **kw):
    """Measured costs: queued 1 ms at 1 KB to 5 ms at 4 MB; alone 1.5 ms at 1 MB (below queued: no extra) and
    8 ms at 4 MB (3 ms more than queued)."""
    return ClusterSpec(2, 1, 1.25e9, allreduce_samples=((1e3, 1e-3), (4e6, 5e-3)),
                       allreduce_samples_alone=((1e6, 1.5e-3), (4e6, 8e-3)) if alone else None, **kw)


def test_alone_extra_is_the_measured_excess_over_the_queued_cost():
    cost = CostModel(_alone_cluster())
    assert cost.alone_extra(4e6) == pytest.approx(3e-3)
    assert cost.alone_extra(1e6) == 0.0  # alone cheaper than queued there: no extra
    assert cost.alone_extra(2.5e6) == pytest.approx(1.5e-3)  # interpolated
    assert cost.alone_extra(8e6) == pytest.approx(3e-3)  # the largest sample's beyond it
    assert CostModel(_alone_cluster(alone=False)).alone_extra(4e6) == 0.0


@pytest.mark.parametrize("contended", [False, True])
def test_a_lone_bucket_is_charged_its_alone_cost_and_a_queued_run_is_not(contended):
    kw = {"compute_slowdown": 1.5} if contended else {}
    with_alone, without = _alone_cluster(**kw), _alone_cluster(alone=False, **kw)
    # g1 (4 MB) ready at 20 ms, g0 at 40: each bucket starts on an idle network with nothing queued behind it
    m = model(1_000_000, 1_000_000)
    lone = simulate(m, with_alone, per_tensor(m))
    base = simulate(m, without, per_tensor(m))
    assert lone.comm_busy_s == pytest.approx(base.comm_busy_s + 2 * 3e-3)
    if contended:
        assert lone.iteration_s > base.iteration_s
    else:  # g1 20-28 ms, g0 40-48, forward 48-68 (queued costs: 65 ms)
        assert base.iteration_s == pytest.approx(0.065) and lone.iteration_s == pytest.approx(0.068)
    # two buckets ready together (one layer, two gradients): a queued run, charged the queued costs
    m2 = ModelSpec("m2", (Layer("l0", 0.01, 0.02, (GradientSpec("a", 1_000_000), GradientSpec("b", 1_000_000))),))
    queued = simulate(m2, with_alone, per_tensor(m2))
    assert queued.iteration_s == pytest.approx(simulate(m2, without, per_tensor(m2)).iteration_s)
    assert queued.comm_busy_s == pytest.approx(2 * 5e-3)
