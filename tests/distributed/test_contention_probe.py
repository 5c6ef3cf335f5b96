"""The contention probe (aiacc.distributed.planning: measure_contention / probe_contention) and what its
measurement does: the factors it derives invert the simulator's contention model, an injected measurement
reaches the job's ClusterSpec and changes the simulator's prediction and the contended lower bound
(aiacc.core.comm.simulate.contention_floor) as computed by hand, the contended bound holds for every plan,
and calibration measures only the sizes a model's plans need. No process group, no timing."""
import dataclasses
import itertools
import random

import pytest

pytest.importorskip("torch")

from aiacc.core.comm import ClusterSpec, CommError, CostModel, Layer, ModelSpec, lower_bound, make_plan, simulate  # noqa: E402
from aiacc.core.comm.cost import Linear, LinearCost  # noqa: E402
from aiacc.core.comm.plan import Bucket, Piece, Plan  # noqa: E402
from aiacc.core.comm.contention import fit_exponent, reference_slowdown  # noqa: E402
from aiacc.core.comm.simulate import contention_floor  # noqa: E402
from aiacc.core.comm.spec import GradientSpec  # noqa: E402
from aiacc.distributed import planning  # noqa: E402


def _probe_timeline(unit_s, units, comm_alone_s, cs, ns):
    """(compute end, stream end) of the probe's setup in the simulator's contended model: a stream of
    `comm_alone_s` seconds alone that starts at 0, beside `units * unit_s` seconds of compute."""
    model = ModelSpec("probe", (Layer("compute", 0.0, units * unit_s, ()),
                                Layer("g", 0.0, 0.0, (GradientSpec("g", 1),))))
    plan = Plan("probe", (Bucket((Piece("g", 0, 1),)),))
    cluster = ClusterSpec(2, 1, 1e9, compute_slowdown=cs, comm_slowdown=ns)
    res = simulate(model, cluster, plan, LinearCost(Linear(comm_alone_s, 0.0)), sync="layer")
    compute_end = next(e.end for e in res.events if e.name == "backward compute")
    comm_end = max(e.end for e in res.events if e.lane == "network")
    return compute_end, comm_end


@pytest.mark.parametrize("cs,ns", [(1.0, 1.0), (1.4, 1.0), (1.2, 2.0), (2.5, 1.3)])
@pytest.mark.parametrize("units", [3, 1])  # compute outlasts the stream / the stream outlasts compute
def test_factors_invert_the_simulators_contention_model(cs, ns, units):
    unit_s, comm_alone = 0.1, (0.12 if units == 3 else 0.3)
    compute_s, comm_s = _probe_timeline(unit_s, units, comm_alone, cs, ns)
    assert (comm_s < compute_s) == (units == 3)
    got = planning.contention_factors(unit_s, units, compute_s, comm_alone, comm_s)
    assert got == pytest.approx((cs, ns), rel=1e-9)


def test_factors_are_clamped_and_checked():
    # noise that makes contention look like a speed-up reads as none; a stream that made no progress
    # beside compute (or compute none beside it) as the cap
    assert planning.contention_factors(0.1, 3, 0.29, 0.1, 0.09) == (1.0, 1.0)
    assert planning.contention_factors(0.1, 3, 0.6, 0.1, 0.2)[0] == planning.CONTENTION_CAP
    assert planning.contention_factors(0.1, 1, 0.1, 0.2, 0.31)[1] == planning.CONTENTION_CAP
    with pytest.raises(CommError, match="contention probe: times must be positive"):
        planning.contention_factors(0.1, 3, 0.3, 0.0, 0.1)


def _two_layer_case():
    """Two layers of 0.1 s backward each (forward 0), gradients "a" (first layer) and "b"; buckets b then
    a, each 0.05 s on the wire (4000 bytes at 0.05 / 4000 s per byte)."""
    model = ModelSpec("m", (Layer("L0", 0.0, 0.1, (GradientSpec("a", 1000),)),
                            Layer("L1", 0.0, 0.1, (GradientSpec("b", 1000),))))
    plan = Plan("by hand", (Bucket((Piece("b", 0, 1000),)), Bucket((Piece("a", 0, 1000),))))
    return model, plan, LinearCost(Linear(0.0, 0.05 / 4000))


@pytest.fixture
def fake_job(monkeypatch):
    """planning's module state as after a calibration of 2 ranks (samples, no contention), restored after."""
    samples = tuple((4.0 * n, 1e-3 + 8e-9 * 4 * n) for n in planning.CALIBRATION_SIZES)  # every size
    cluster = ClusterSpec(2, 1, 1.25e8, allreduce_samples=samples)
    monkeypatch.setattr(planning, "_CLUSTER", cluster)
    monkeypatch.setattr(planning, "_SAMPLES", [(int(b), t) for b, t in samples])
    monkeypatch.setattr(planning, "_SAMPLES16", [])
    monkeypatch.setattr(planning.dist, "get_world_size", lambda: 2)
    return cluster


def test_an_injected_measurement_reaches_the_cluster_and_the_prediction(fake_job, monkeypatch):
    seen = []

    def measured(workload, numel, reps):  # what the probe would have measured beside `workload`
        seen.append((workload, numel, reps))
        return 1.5, 1.2
    monkeypatch.setattr(planning, "measure_contention", measured)
    work = object()
    got = planning.probe_contention(work, reps=4)
    assert seen == [(work, planning.PROBE_NUMEL, 4)]
    assert (got.compute_slowdown, got.comm_slowdown) == (1.5, 1.2)
    assert got.allreduce_samples == fake_job.allreduce_samples  # only the contention changed
    assert planning.calibrate() is got and planning.calibrate(up_to_bytes=1 << 20) is got  # what plans use

    model, plan, cost = _two_layer_case()
    # by hand: L1 0-0.1; bucket b from 0.1 at 1/1.2 speed beside L0 (at 1/1.5): ends 0.16, L0 has then
    # done 0.04 and ends alone at 0.22; bucket a 0.22-0.27. Without contention: 0.25
    assert simulate(model, fake_job, plan, cost, sync="step").iteration_s == pytest.approx(0.25)
    assert simulate(model, got, plan, cost, sync="step").iteration_s == pytest.approx(0.27)
    # the contended bound, C = 0.2, W = c(all bytes) = 0.1, first layer's w0 = 0.05, a = ns (1 - 1/cs) = 0.4:
    # C + W - (1/cs + 1/ns - 1) min(cs C, ns W) = 0.24 and C + a W + (1 - a) w0 = 0.27, which this plan
    # reaches; without contention the bound is compute + the first layer's 0.05 = 0.25
    assert contention_floor(model, got, cost) == pytest.approx(0.2 + 0.4 * 0.1 + 0.6 * 0.05)
    assert lower_bound(model, got, cost, sync="step", contention=True) == pytest.approx(0.27)
    assert lower_bound(model, got, cost, sync="step") == pytest.approx(0.25)
    assert lower_bound(model, got, cost, sync="step") == lower_bound(model, fake_job, cost, sync="step")
    # a job of one rank or with an assumed network keeps its cluster
    monkeypatch.setattr(planning, "_CLUSTER", ClusterSpec(2, 1, 1.25e7))
    assert planning.probe_contention(work).compute_slowdown == 1.0 and len(seen) == 1


def test_contention_floor_by_hand_and_without_contention():
    model = ModelSpec("m", (Layer("L0", 0.05, 0.15, (GradientSpec("a", 1000),)),
                            Layer("L1", 0.0, 0.15, (GradientSpec("b", 1 << 20),))))
    cost = LinearCost(Linear(0.0, 5e-8))
    w, w0, c_s = 4 * ((1 << 20) + 1000) * 5e-8, 4000 * 5e-8, 0.35
    c = ClusterSpec(2, 1, 1e9, compute_slowdown=1.25, comm_slowdown=1.1)
    k, a = 0.8 + 1 / 1.1 - 1, 1.1 * (1 - 1 / 1.25)
    assert 1.1 * w < 1.25 * c_s  # the network is shorter than compute slowed
    by_overlap, by_tail = c_s + w - k * 1.1 * w, c_s + a * w + (1 - a) * w0
    assert by_tail > by_overlap and contention_floor(model, c, cost) == pytest.approx(by_tail)
    # 1/cs + 1/ns <= 1 and a > 1: overlap saves nothing
    assert contention_floor(model, dataclasses.replace(c, compute_slowdown=3.0, comm_slowdown=3.0), cost) \
        == pytest.approx(c_s + w)
    # no contention: compute, then the first layer's bytes (or the network, if longer)
    assert contention_floor(model, ClusterSpec(2, 1, 1e9), cost) == pytest.approx(max(c_s + w0, w))
    assert contention_floor(model, ClusterSpec(1, 1, 1e9), cost) == pytest.approx(c_s)


def _plans(model, cluster, rng):
    """The baseline strategies' plans (aiacc's own search is slow here: its plans are bucketings too), and random bucketings of the gradients in random orders (fifo and priority)."""
    plans = [make_plan(s, model, cluster) for s in ("ddp", "per-tensor", "horovod", "bytescheduler")]
    grads = [g for g, _, _ in model.backward_order()]
    for _ in range(12):
        order = grads[:]
        rng.shuffle(order)
        cuts = sorted(rng.sample(range(1, len(order)), rng.randint(0, len(order) - 1))) if len(order) > 1 else []
        groups = [order[a:b] for a, b in zip([0] + cuts, cuts + [len(order)])]
        buckets = tuple(Bucket(tuple(Piece(g.name, 0, g.numel) for g in grp), priority=rng.randint(0, 3))
                        for grp in groups)
        plans.append(Plan("random", buckets, rng.choice(["fifo", "priority"])))
    return plans


def test_the_contended_bound_holds_for_every_plan():
    rng = random.Random(0)
    tighter = 0
    for trial in range(12):
        layers = tuple(Layer(f"L{i}", rng.uniform(0.0, 0.02), rng.uniform(0.005, 0.05),
                             tuple(GradientSpec(f"w{i}_{j}", rng.choice([1000, 50000, 400000]))
                                   for j in range(rng.randint(0, 2))))
                       for i in range(rng.randint(2, 5)))
        if not any(l.grads for l in layers):
            continue
        model = ModelSpec(f"m{trial}", layers)
        gbps = rng.choice([0.1, 1.0, 10.0])
        for cs, ns in itertools.product((1.0, 1.3, 2.2), (1.0, 1.5)):
            cluster = ClusterSpec.from_workers(2, 1, gbps, compute_slowdown=cs, comm_slowdown=ns)
            cost = CostModel(cluster)
            bound = {s: lower_bound(model, cluster, cost, sync=s, contention=True) for s in ("layer", "step")}
            plain = {s: lower_bound(model, cluster, cost, sync=s) for s in ("layer", "step")}
            for s in ("layer", "step"):
                assert bound[s] >= plain[s] - 1e-12
                if not cluster.contended:
                    assert bound[s] == plain[s]
                tighter += bound[s] > plain[s] + 1e-9
            for plan in _plans(model, cluster, rng):
                for s in ("layer", "step"):
                    it = simulate(model, cluster, plan, cost, sync=s).iteration_s
                    assert it >= bound[s] - 1e-9, (trial, cs, ns, plan.strategy, s, it, bound[s])
    assert tighter > 0  # the contended bound is not just the plain one


def test_calibration_sizes_cover_the_models_messages():
    sizes = planning.CALIBRATION_SIZES
    assert planning.calibration_sizes(None) == tuple(sorted(sizes))
    assert planning.calibration_sizes(1740) == (16, 1 << 8, 1 << 12)  # 1.7 KB: up to the first size above
    assert planning.calibration_sizes(4) == (16, 1 << 8, 1 << 12)  # at least 3 sizes
    assert planning.calibration_sizes(11_000_000) == tuple(sorted(sizes))  # 16 MB is the first above
    assert planning.calibration_sizes(1 << 20) == (16, 1 << 8, 1 << 12, 1 << 14, 1 << 16, 1 << 18)
    # the smallest calibrated all-reduce gives every rank of a ring (up to 16) at least one element: a
    # 1-element all-reduce takes a cheaper path in gloo than any gradient (0.4 against ~2 ms on the testbed
    # at 10 Gbit/s), and the cost model would interpolate every small tensor's cost from it
    assert min(sizes) >= 16


def test_calibration_measures_only_the_sizes_needed_and_extends(monkeypatch):
    timed, probes = [], []
    monkeypatch.setattr(planning, "_CLUSTER", None)
    monkeypatch.setattr(planning, "_SAMPLES", [])
    monkeypatch.setattr(planning, "_SAMPLES16", [])
    monkeypatch.setattr(planning.dist, "get_world_size", lambda: 2)
    monkeypatch.delenv("AIACC_NETWORK_GBPS", raising=False)
    monkeypatch.setattr(planning, "cluster_shape", lambda world: (2, 1))
    monkeypatch.setattr(planning, "broadcast_object", lambda obj, root, what: obj)

    blocking, loops, alone = [], [], []
    monkeypatch.setattr(planning, "_BLOCKING", [])
    monkeypatch.setattr(planning, "_LOOP", [])
    monkeypatch.setattr(planning, "_ALONE", [])

    def fake_alone(n, reps):
        alone.append(n)
        return 3e-3 + 16e-9 * 4 * n
    monkeypatch.setattr(planning, "_timed_alone", fake_alone)

    def fake_loop(numels, rounds):
        loops.append((list(numels), rounds))
        return [(4 * n, 2e-3 + 8e-9 * 4 * n) for n in numels]
    monkeypatch.setattr(planning, "_timed_loop", fake_loop)

    def fake_time(n, reps, dtype=None, blocking_calls=False):
        (blocking if blocking_calls else timed).append((n, dtype))
        return 1e-3 + 8e-9 * 4 * n, 2e-4 + 1e-9 * 4 * n

    def fake_probe(workload=None, *, numel, reps):
        probes.append(numel)
        return 1.3, 1.1
    monkeypatch.setattr(planning, "_timed_allreduce", fake_time)
    monkeypatch.setattr(planning, "measure_contention", fake_probe)
    small = planning.calibrate(reps=2, up_to_bytes=1740)
    assert [n for n, d in timed if d is None] == [16, 1 << 8, 1 << 12]
    assert [n for n, d in timed if d is not None] == [1 << 8, 1 << 12]  # fp16 from FP16_MIN_NUMEL up
    assert probes == [1 << 12]  # the probe's messages no larger than the plans' largest
    assert [b for b, _ in small.allreduce_samples] == [64, 1 << 10, 1 << 14]
    assert planning.calibrate(up_to_bytes=1000) is small and len(timed) == 5  # covered: nothing measured
    big = planning.calibrate(reps=2, up_to_bytes=1 << 20)  # a larger model: only the missing sizes
    assert [n for n, d in timed[5:] if d is None] == [1 << 14, 1 << 16, 1 << 18]
    assert [b for b, _ in big.allreduce_samples] == [4 * n for n in planning.calibration_sizes(1 << 20)]
    assert (big.compute_slowdown, big.comm_slowdown) == (small.compute_slowdown, 1.1) and probes == [1 << 12]  # kept
    # the probe's 16 KB messages take a larger share of the core than 1 MB ones (the per-message CPU term):
    # its 1.3 is kept in the units of 1 MB float32 messages (aiacc.core.comm.contention), so lower
    assert small.compute_slowdown == pytest.approx(reference_slowdown(small, 1.3, 4 << 12))
    assert 1.0 < small.compute_slowdown < 1.3
    assert [b for b, _ in big.allreduce_cpu_samples] == [b for b, _ in big.allreduce_samples]
    assert big.allreduce_cpu_samples[0][1] == pytest.approx(2e-4 + 64e-9)  # the 64 B message
    assert big.allreduce_samples_fp16[0][0] == 2 * (1 << 8)
    # the same sizes as blocking calls one after another, up to BLOCKING_MAX_BYTES, each once (float32)
    assert blocking == [(n, None) for n in planning.calibration_sizes(1 << 20) if 4 * n <= planning.BLOCKING_MAX_BYTES]
    assert [b for b, _ in planning.blocking_samples()] == [4 * n for n in planning.calibration_sizes(1 << 20)]
    # and as one loop of mixed sizes per call, over the new blocking sizes only
    assert [n for n, _ in loops] == [[16, 1 << 8, 1 << 12], [1 << 14, 1 << 16, 1 << 18]]
    assert [b for b, _ in planning.loop_samples()] == [4 * n for n in planning.calibration_sizes(1 << 20)]
    # one message alone after a barrier, from ALONE_MIN_BYTES up (a single size: no cluster samples of it yet)
    assert alone == [n for n in planning.calibration_sizes(1 << 20) if 4 * n >= planning.ALONE_MIN_BYTES] == [1 << 18]
    assert planning.measurements(what="alone") == [(1 << 20, pytest.approx(3e-3 + 16e-9 * (1 << 20)))]
    assert big.allreduce_samples_alone is None


def test_the_probe_at_a_second_size_fits_the_contention_exponent(fake_job, monkeypatch):
    # with CPU samples (1 ms + 1 ns/B per message) the probe also runs with 8x larger messages, and the
    # exponent is the one that reproduces the two slowdowns (aiacc.core.comm.contention.fit_exponent)
    cpu = tuple((b, 1e-3 + 1e-9 * b) for b, _ in fake_job.allreduce_samples)
    monkeypatch.setattr(planning, "_CLUSTER", dataclasses.replace(fake_job, allreduce_cpu_samples=cpu))
    seen = []

    def measured(workload, numel, reps):
        seen.append(numel)
        return (1.6, 1.1) if numel == planning.PROBE_NUMEL else (1.4, 1.1)
    monkeypatch.setattr(planning, "measure_contention", measured)
    got = planning.probe_contention(object(), reps=2)
    assert seen == [planning.PROBE_NUMEL, planning.SHAPE_FACTOR * planning.PROBE_NUMEL]
    want = fit_exponent(got, (4 * planning.PROBE_NUMEL, 1.6), (4 * seen[1], 1.4))
    assert 0.0 < want < 1.0 and got.contention_exponent == pytest.approx(want)
    # the 1 MB probe is the reference size: its slowdown is pooled as measured
    assert got.compute_slowdown == pytest.approx(1.6)
