"""Contention per message size and wire dtype (aiacc.core.comm.contention): the CPU line fit, each
message's slowdown against the cluster's reference one, what the simulator and the planner make of it,
the contended floor against every plan, and the inversions (a profiled step, a probe's stream) in the
same units. No process group, no timing."""
import dataclasses
import random

import numpy as np
import pytest

from aiacc.core.comm import (Bucket, ClusterSpec, CostModel, GradientSpec, Layer, ModelSpec, Piece, Plan,
                             lower_bound, make_plan, simulate)
from aiacc.core.comm import contention
from aiacc.core.comm.robust import backward_span, slowdown_from_span
from aiacc.core.comm.strategies import aiacc_search

MB = 1 << 20
# a 1 Gbit/s pair as measured on the testbed (tests' figures: seconds per message, wall and CPU)
WALL = ((4.0, 1.0e-3), (65536.0, 2.5e-3), (float(MB), 8.3e-3), (8.0 * MB, 70e-3))
CPU = ((4.0, 1.2e-3), (65536.0, 1.4e-3), (float(MB), 1.8e-3), (8.0 * MB, 9.8e-3))
CPU16 = ((512.0, 1.3e-3), (65536.0, 1.6e-3), (float(MB), 2.3e-3), (8.0 * MB, 13.5e-3))


def measured(cs=1.6, ns=1.1, cpu=CPU, cpu16=CPU16):
    return ClusterSpec(2, 1, 1.25e8, compute_slowdown=cs, comm_slowdown=ns, allreduce_samples=WALL,
                       allreduce_samples_fp16=((512.0, 1.0e-3),) + WALL[1:],  # the same wire time per byte
                       allreduce_cpu_samples=cpu, allreduce_cpu_samples_fp16=cpu16)


def chain(numels, fwd=0.004, bwd=0.008):
    return ModelSpec("m", tuple(Layer(f"l{i}", fwd, bwd, (GradientSpec(f"g{i}", n),)) for i, n in enumerate(numels)))


def test_cpu_line_fit_is_the_least_squares_line_kept_non_negative():
    line = contention.fit_cpu_line([(0, 1e-3), (1e6, 2e-3), (2e6, 3e-3)])
    assert (line.latency, line.coef) == (pytest.approx(1e-3), pytest.approx(1e-9))
    flat = contention.fit_cpu_line([(0, 2e-3), (1e6, 1e-3)])  # falling: no per-byte cost, the mean
    assert (flat.latency, flat.coef) == (pytest.approx(1.5e-3), 0.0)
    through0 = contention.fit_cpu_line([(1e6, 1e-3), (2e6, 3e-3)])  # negative intercept: through the origin
    assert through0.latency == 0.0 and through0.coef == pytest.approx(7e3 / 5e12)
    with pytest.raises(contention.CommError, match="at least 2 sizes"):
        contention.fit_cpu_line([(1e6, 1e-3)])


def test_each_message_slows_compute_by_its_own_share_against_the_reference():
    c = measured()
    sizes = [4 << 10, 64 << 10, MB, 4 * MB, 8 * MB]
    cs = contention.message_slowdowns(c, sizes)
    # 1 MB float32 messages are the reference: exactly the cluster's compute_slowdown
    assert cs[2] == pytest.approx(1.6)
    assert cs[0] > cs[1] > cs[2] > cs[4]  # the per-message term: small messages take a larger share
    assert all(1.0 < x <= contention.SLOWDOWN_CAP + 1e-9 for x in cs)
    # by hand at 8 MB: share = cpu / wall against the reference's
    line = contention.fit_cpu_line(CPU)
    rel = (line(8 * MB) / 70e-3) / (line(MB) / 8.3e-3)
    assert cs[4] == pytest.approx(1 / (1 - (1 - 1 / 1.6) * rel))
    # float16 messages of the same bytes cost more CPU (gloo sums float16 in software)
    cs16 = contention.message_slowdowns(c, [MB, 4 * MB], "fp16")
    assert cs16[0] > cs[2] and cs16[1] > cs[3]
    # without CPU samples (or without contention) the uniform model: every message the cluster's slowdown
    plain = dataclasses.replace(c, allreduce_cpu_samples=None, allreduce_cpu_samples_fp16=None)
    assert contention.message_slowdowns(plain, sizes) == [1.6] * len(sizes)
    assert contention.message_slowdowns(dataclasses.replace(c, compute_slowdown=1.0), sizes) == [1.0] * 5


def test_a_share_that_does_not_depend_on_size_is_the_uniform_model():
    # wall and CPU per message both on lines, CPU a fixed fraction of the wall time: every message takes
    # the reference's share, so the simulation is the uniform one exactly
    wall = tuple((b, 1e-3 + 8e-9 * b) for b in (4.0, 65536.0, float(MB), 8.0 * MB))
    c = ClusterSpec(2, 1, 1.25e8, compute_slowdown=1.6, comm_slowdown=1.1, allreduce_samples=wall,
                    allreduce_cpu_samples=tuple((b, 0.2 * t) for b, t in wall))
    plain = dataclasses.replace(c, allreduce_cpu_samples=None)
    m = chain([300_000, 50_000, 800_000, 20_000])
    cost = CostModel(c)
    assert contention.message_slowdowns(c, [4, 65536, 3 * MB]) == pytest.approx([1.6] * 3)
    for s in ("per-tensor", "ddp", "horovod"):
        plan = make_plan(s, m, c)
        for sync in ("layer", "step"):
            assert simulate(m, c, plan, cost, sync=sync).iteration_s == \
                pytest.approx(simulate(m, plain, plan, cost, sync=sync).iteration_s, rel=1e-9)


def test_many_small_messages_cost_more_compute_than_few_large_ones_and_the_planner_sees_it():
    # 32 gradients of 64 KB, backward 8 ms each: per-tensor sends 32 small messages beside backward
    m = chain([16384] * 32, fwd=0.002, bwd=0.008)
    c = measured(cs=1.5)
    plain = dataclasses.replace(c, allreduce_cpu_samples=None, allreduce_cpu_samples_fp16=None)
    cost = CostModel(c)
    small = make_plan("per-tensor", m, c)
    big = make_plan("ddp", m, c, bucket_cap=MB)  # 2 messages of 1 MB: the reference size
    t = {(name, k): simulate(m, cl, p, cost, sync="step").iteration_s
         for name, p in (("small", small), ("big", big)) for k, cl in (("per-message", c), ("uniform", plain))}
    assert t["small", "per-message"] > t["small", "uniform"]  # 64 KB messages take more than 1 MB ones
    assert t["big", "per-message"] == pytest.approx(t["big", "uniform"], rel=0.02)
    # the planner's choice on the per-message model sends fewer messages than on the uniform one
    mine = aiacc_search(m, c, sync="step")[0]
    uni = aiacc_search(m, plain, sync="step")[0]
    assert len(mine.buckets) <= len(uni.buckets)
    assert simulate(m, c, mine, cost, sync="step").iteration_s <= simulate(m, c, uni, cost, sync="step").iteration_s + 1e-12


def _random_plans(model, rng, count=10):
    grads = [g for g, _, _ in model.backward_order()]
    plans = []
    for _ in range(count):
        order = grads[:]
        rng.shuffle(order)
        pieces = []
        for g in order:  # whole, or cut in two
            if rng.random() < 0.3 and g.numel > 1:
                h = g.numel // 2
                pieces += [Piece(g.name, 0, h), Piece(g.name, h, g.numel)]
            else:
                pieces.append(Piece(g.name, 0, g.numel))
        cuts = sorted(rng.sample(range(1, len(pieces)), rng.randint(0, len(pieces) - 1))) if len(pieces) > 1 else []
        groups = [pieces[a:b] for a, b in zip([0] + cuts, cuts + [len(pieces)])]
        plans.append(Plan("random", tuple(Bucket(tuple(g), priority=rng.randint(0, 3)) for g in groups),
                          rng.choice(["fifo", "priority"])))
    return plans


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_the_contended_floor_holds_for_every_plan_with_per_message_slowdowns(compression):
    rng = random.Random(1)
    tighter = 0
    for trial in range(10):
        model = ModelSpec(f"m{trial}", tuple(
            Layer(f"L{i}", rng.uniform(0.0, 0.02), rng.uniform(0.005, 0.05),
                  tuple(GradientSpec(f"w{i}_{j}", rng.choice([1000, 50_000, 400_000, 2_000_000]))
                        for j in range(rng.randint(1, 2))))
            for i in range(rng.randint(2, 5))))
        for cs, ns in ((1.3, 1.0), (2.2, 1.5), (1.6, 1.1)):
            c = measured(cs, ns)
            cost = CostModel(c, compression=compression)
            plans = [make_plan(s, model, c, compression=compression) for s in ("ddp", "per-tensor", "horovod")]
            plans += [dataclasses.replace(p, compression=compression) for p in _random_plans(model, rng)]
            for sync in ("layer", "step"):
                bound = lower_bound(model, c, cost, compression, sync=sync, contention=True)
                tighter += bound > lower_bound(model, c, cost, compression, sync=sync) + 1e-9
                for p in plans:
                    it = simulate(model, c, p, cost, sync=sync).iteration_s
                    assert it >= bound - 1e-9, (trial, cs, ns, p.strategy, sync, it, bound)
    assert tighter > 0


def test_a_profiled_step_and_a_probe_are_read_in_the_reference_units():
    m = chain([100_000] * 12, fwd=0.003, bwd=0.01)
    probe = make_plan("ddp", m, measured(), bucket_cap=400_000)
    for true_cs in (1.3, 2.0):
        c = measured(cs=true_cs)
        span = backward_span(m, c, probe)  # the busy step as the per-message model says it runs
        assert slowdown_from_span(m, c, probe, span) == pytest.approx(true_cs, abs=0.01)
    # a probe's stream of 64 KB messages measured 1.8x: in reference units that is lower, and each
    # 64 KB message of a plan is again charged 1.8x
    c = measured()
    ref = contention.reference_slowdown(c, 1.8, 65536)
    assert 1.0 < ref < 1.8
    again = contention.message_slowdowns(dataclasses.replace(c, compute_slowdown=ref), [65536])[0]
    assert again == pytest.approx(1.8)
    assert contention.reference_slowdown(dataclasses.replace(c, allreduce_cpu_samples=None), 1.8, 65536) == 1.8


def test_slowdown_range_spans_every_message_size_a_plan_can_send():
    c = measured()
    lo, hi = contention.slowdown_range(c, 14 * MB)
    sizes = np.geomspace(1, 14 * MB, 200)
    got = contention.message_slowdowns(c, sizes)
    assert lo <= min(got) + 1e-12 and hi >= max(got) - 1e-12
    assert lo == pytest.approx(min(got), rel=1e-3)
    assert contention.slowdown_range(dataclasses.replace(c, allreduce_cpu_samples=None), 14 * MB) == (1.6, 1.6)


@pytest.mark.parametrize("g", [0.0, 0.35, 1.0])
def test_the_contention_exponent_is_fitted_from_probes_at_two_sizes(g):
    c = measured(cs=1.6)
    # the slowdowns the model with exponent g gives beside streams of 1 MB and 8 MB messages
    truth = dataclasses.replace(c, contention_exponent=g)
    cs1, cs8 = contention.message_slowdowns(truth, [MB, 8 * MB])
    assert contention.fit_exponent(c, (MB, cs1), (8 * MB, cs8)) == pytest.approx(g, abs=1e-6)
    # g shapes every size: the smaller it is, the flatter (g = 0: the uniform model)
    small = contention.message_slowdowns(truth, [64 << 10])[0]
    assert (small == pytest.approx(1.6)) if g == 0 else small > 1.6
    # noise beyond the model's range is clipped; nothing to fit without contention or CPU samples
    assert contention.fit_exponent(c, (MB, 1.6), (8 * MB, 2.5)) == 0.0  # grew with size
    assert contention.fit_exponent(c, (MB, 1.6), (8 * MB, 1.0)) == 1.0  # vanished at 8 MB
    assert contention.fit_exponent(c, (MB, 1.0), (8 * MB, 1.0)) is None
    assert contention.fit_exponent(dataclasses.replace(c, allreduce_cpu_samples=None), (MB, 1.6), (8 * MB, 1.3)) is None
    # the floor stays below every plan with the exponent too
    m = chain([300_000, 900_000, 50_000, 2_000_000], fwd=0.005, bwd=0.02)
    cost = CostModel(truth)
    bound = lower_bound(m, truth, cost, sync="step", contention=True)
    for s in ("ddp", "per-tensor", "horovod"):
        assert simulate(m, truth, make_plan(s, m, truth), cost, sync="step").iteration_s >= bound - 1e-9


@pytest.mark.parametrize("contended", [False, True])
def test_a_link_that_banks_idle_time_lowers_the_bound_by_that_much_never_under_the_compute(contended):
    # a token bucket (tc tbf) sends the burst banked while the wire idled at line rate: a step measured
    # on such a link may beat the rate by up to banked_s (100 Mbit/s ResNet, fp16: 507 ms against a
    # bound of 525 ms that ignored tbf's 34 ms); the bound of a banked link is the flat link's less that
    model = chain([400_000, 2_000_000, 50_000, 1_000_000])
    c = measured() if contended else dataclasses.replace(measured(), compute_slowdown=1.0, comm_slowdown=1.0)
    cost = CostModel(c)
    for sync in ("layer", "step"):
        flat = lower_bound(model, c, cost, sync=sync, contention=True)
        bank = 0.25 * (flat - (model.forward_s + model.backward_s))
        assert bank > 0
        banked = dataclasses.replace(c, banked_s=bank)
        assert lower_bound(model, banked, cost, sync=sync, contention=True) == pytest.approx(flat - bank)
        # the plans still meet it (the simulator has no bank), and a bank longer than all communication
        # leaves the compute, which no link can shorten
        for p in (make_plan(s, model, banked) for s in ("ddp", "per-tensor", "horovod", "aiacc")):
            assert simulate(model, banked, p, cost, sync=sync).iteration_s >= flat - bank - 1e-12
        huge = dataclasses.replace(c, banked_s=10.0)
        assert lower_bound(model, huge, cost, sync=sync, contention=True) == pytest.approx(model.forward_s + model.backward_s)
