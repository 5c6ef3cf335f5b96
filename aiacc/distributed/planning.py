"""The plan every rank runs: the job's network as measured (`calibrate`: all-reduce times at several sizes
on the process group, as a nodes x workers ClusterSpec) and rank 0's plan for a set of
parameters, shared with all ranks (`plan_for`), since all ranks must issue the same collectives."""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

from aiacc.core.comm import ClusterSpec, CommError, ModelSpec, Plan, gradient_specs_from_params, make_plan, simulate
from aiacc.core.comm.contention import fit_exponent, reference_slowdown
from aiacc.core.comm.robust import SLOWDOWN_CAP, pool_slowdowns, regret_table, robust_pick, slowdown_grid, with_slowdown
from aiacc.core.comm.strategies import aiacc_search, safe_family
from aiacc.distributed.process import collective, local_size
from aiacc.distributed.transport import broadcast_object

_CLUSTER: ClusterSpec | None = None
# The predicted gain aiacc's own plan needs over the best safe plan inside the search (aiacc_search's fallback),
# a robust pick over the point estimate's plan, per-layer waits over one synchronize. Whether anything but DDP's
# default layout runs is decided once, after all of these, by `keep_or_ddp_default` with DDP_DEFAULT_MARGIN.
FALLBACK_MARGIN = 0.03
# The predicted gain any plan but DDP's default layout needs over that layout on measured costs, else DDP's
# layout runs (`keep_or_ddp_default`). From the testbed's runs (benchmarks/dp.py --json, 2 nodes, 1 and 10
# Gbit/s, 42 rows of 6 runs): the simulator's predicted ratio of a candidate's step to DDP 25 MB's was off
# from the measured ratio by a median 4.3% (75th percentile 7%), and the engine running DDP's own layout
# measured 0.96-1.01x of DDP with a predicted 1.00: a gain under 5% is within the model's error and the
# run-to-run scatter, so it is no reason to leave the layout DDP users get. (Where the link is the
# bottleneck the predicted gains were 14-22%, well above it.)
DDP_DEFAULT_MARGIN = 0.05


# float32 elements: 64 B, 1 KB, 16 KB, 64 KB, 256 KB, 1 MB, 4 MB, 16 MB (the sizes of buckets and tensors a
# plan may send; the cost model interpolates between them, so mid sizes are measured, not assumed to lie
# on a line). The smallest is MIN_CALIBRATION_NUMEL elements, not 1: gloo's ring gives each rank a chunk,
# and a tensor of fewer elements than ranks takes a cheaper path that no real gradient does (2 nodes at 10
# Gbit/s, back-to-back: 1-2 elements 0.4-0.5 ms, 4-384 elements 1.6-4.9 ms, 1 KB 2.5 ms); interpolated
# from a 4 B sample, every BatchNorm weight or bias (48-384 elements) cost ~0.5 ms instead of ~2, and
# "after backward"'s 38 per-tensor all-reduces of the ResNet were predicted 0.85x of their measured step
# (0.97x with a 64 B sample)
MIN_CALIBRATION_NUMEL = 16  # at least one element per rank's chunk up to 16 ranks
CALIBRATION_SIZES = (MIN_CALIBRATION_NUMEL, 1 << 8, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22)
_SAMPLES: list[tuple[int, float]] = []
_SAMPLES16: list[tuple[int, float]] = []
# (bytes, seconds) of all-reduces issued one at a time, each a blocking call after the last returned (what a
# user's loop of dist.all_reduce does, e.g. benchmarks/dp.py's "after backward"), up to BLOCKING_MAX_BYTES:
# on one core per rank a small message costs less than queued in the stream the executor issues (_timed_allreduce)
_BLOCKING: list[tuple[int, float]] = []
BLOCKING_MAX_BYTES = 1 << 20  # above this a blocking call and a queued one measured alike (1 MB: 5.2 vs 4.7 ms)
# (bytes, mean seconds) of blocking all-reduces of the calibration sizes up to BLOCKING_MAX_BYTES issued in turn,
# one size after another (`_timed_loop`), as a loop over a model's gradients issues them: what a loop of
# blocking calls is charged (`with_blocking_costs`). On one core per rank such calls' times are heavy-tailed and
# depend on their neighbours (2 testbed nodes at 10 Gbit/s: a 1 MB call took 1.0-4.7 ms inside BERT's loop of
# 42, a 1 KB one 0.2 ms after another small one and 2.2 ms after a 256 KB one, and the loop's total 51-86 ms from
# one iteration to the next); from the same-size batches above (a median) the loop was predicted 15-40% short
# (46 against 57 ms for the ResNet, 53 against 75 for BERT), from these means within -19% to +21%
_LOOP: list[tuple[int, float]] = []
LOOP_BUDGET_S = 1.5  # seconds of calibration the mixed loop may take (LOOP_MIN_ROUNDS..LOOP_MAX_ROUNDS rounds)
LOOP_MIN_ROUNDS, LOOP_MAX_ROUNDS = 6, 48
# (bytes, seconds) of one float32 all-reduce alone after a barrier, from ALONE_MIN_BYTES up: a step's last bucket
# runs alone, and on one core per rank gloo's worker threads pipeline queued messages that a lone one cannot use
# (2 testbed nodes at 10 Gbit/s: 4 MB 6.9 ms alone, 4.1 ms each of two queued), so the queued samples charged a
# lone last bucket too little (ClusterSpec.allreduce_samples_alone, the simulator's lone-bucket rule)
_ALONE: list[tuple[int, float]] = []
ALONE_MIN_BYTES = 1 << 20
_CPU: list[tuple[int, float]] = []  # (bytes, CPU seconds of this process per message) of the same batches
_CPU16: list[tuple[int, float]] = []
BATCH_BYTES = 2 << 20  # bytes of back-to-back all-reduces per timed batch (beyond a tbf burst / TCP window)
FP16_MIN_NUMEL = 1 << 8  # fp16 samples from 256 elements up (the sizes of buckets an fp16 plan sends)


BATCH_MAX_MESSAGES = 32  # per batch: latency-bound sizes (below 64 KB) send less than BATCH_BYTES in a batch


def batch_messages(nbytes: int) -> int:
    """How many back-to-back all-reduces of `nbytes` one timed calibration batch holds (at least
    BATCH_BYTES in all, 2 to BATCH_MAX_MESSAGES messages: below 64 KB a message costs its latency, ~1-5 ms
    on these links whatever its bytes, and 128 of them per batch made the small sizes most of the
    calibration's time)."""
    return int(min(BATCH_MAX_MESSAGES, max(2, -(-BATCH_BYTES // max(1, int(nbytes))))))


def banked_time(samples: Sequence[tuple[float, float]]) -> float:
    """Idle wire time the link banks, from calibration samples (bytes, mean seconds per message of a
    batch that followed an idle barrier): the median over the mid-sized samples (neither the smallest,
    a latency probe, nor the largest, the reference) of the time a batch took less than the sustained
    rate (the largest sample's seconds per byte) and the smallest sample's latency allow, at least 0. A token bucket (tc tbf) sends its
    burst at line rate after idle time, so every batch larger than the burst saves about burst / rate;
    on a link without one, smaller messages cost more per byte than large ones and this is 0. The
    median: one sample that looks impossibly fast must not make every overlap look illusory."""
    pts = sorted((float(b), float(t)) for b, t in samples)
    if len(pts) < 3 or pts[-1][0] <= 0:
        return 0.0
    per_byte = pts[-1][1] / pts[-1][0]
    # each message also pays the smallest's latency: its time less its own bytes at the sustained rate
    lat = max(0.0, pts[0][1] - pts[0][0] * per_byte)
    return float(np.median([max(0.0, batch_messages(int(b)) * (lat + b * per_byte - t)) for b, t in pts[1:-1]]))


def cluster_shape(world: int) -> tuple[int, int]:
    """(nodes, workers per node) of the job: torchrun's LOCAL_WORLD_SIZE ranks share a node."""
    per = max(1, min(local_size(), world))
    per = per if world % per == 0 else 1
    return world // per, per


def fit_alpha_beta(samples: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(latency s, seconds per byte) of the alpha-beta line through (bytes, seconds) samples: the latency
    is the smallest message's time, the slope the least-squares one of the rest above it (dominated by
    the large messages, whose per-byte cost a training step pays; a free intercept would let the noise of
    the small ones make it negative or zero). Both are kept positive."""
    pts = sorted((float(b), float(t)) for b, t in samples)
    if len(pts) < 2 or pts[0][0] == pts[-1][0]:
        raise CommError(f"calibration needs all-reduce times of at least 2 sizes, got {len(samples)}")
    lat = max(0.0, pts[0][1])
    x = np.array([b - pts[0][0] for b, _ in pts[1:]])
    y = np.array([t - lat for _, t in pts[1:]])
    coef = float(np.dot(x, y) / np.dot(x, x))
    if coef <= 0:  # no measurable per-byte cost: the largest message's average
        coef = max(pts[-1][1] / pts[-1][0], 1e-15)
    return lat, coef


def cluster_from_fit(latency: float, coef: float, world: int, nodes: int) -> ClusterSpec:
    """The ClusterSpec whose flat-ring all-reduce cost (aiacc.core.comm.cost) is latency + coef * n.

    gloo runs one ring over all ranks: 2(p-1) steps, each paying the link latency and n/p bytes. With
    several nodes the ring crosses the network, whose link is the slow one (and carries a node's
    traffic); on one node the measured links are the ones inside it."""
    p = world
    lat = latency / (2 * (p - 1))
    bw = 2 * (p - 1) / p / coef
    if nodes == 1:
        return ClusterSpec(nodes=1, workers_per_node=p, inter_bandwidth=bw, intra_bandwidth=bw, intra_latency=lat)
    per = p // nodes
    return ClusterSpec(nodes=nodes, workers_per_node=per, inter_bandwidth=bw, inter_latency=lat,
                       intra_bandwidth=bw, intra_latency=lat)


def measurements(dtype: str = "float32", what: str = "wall") -> list[tuple[int, float]]:
    """The (bytes, seconds) all-reduce times `calibrate` measured (rank 0's) of float32 or "float16"
    payloads (what="cpu": the process's CPU seconds per message of the same batches), empty before or
    when skipped."""
    if what == "cpu":
        return list(_CPU16 if dtype == "float16" else _CPU)
    if what == "blocking":
        return blocking_samples()
    if what == "loop":
        return loop_samples()
    if what == "alone":
        return list(_ALONE)
    return list(_SAMPLES16 if dtype == "float16" else _SAMPLES)


def blocking_samples() -> list[tuple[int, float]]:
    """The float32 (bytes, seconds) of all-reduces issued as blocking calls one after another (`calibrate`'s
    samples up to BLOCKING_MAX_BYTES, the streamed samples above it, where both measured alike), empty
    before `calibrate`."""
    if not _BLOCKING:
        return []
    top = max(b for b, _ in _BLOCKING)
    return sorted(list(_BLOCKING) + [(b, t) for b, t in _SAMPLES if b > top])


def loop_samples() -> list[tuple[int, float]]:
    """The float32 (bytes, mean seconds) of blocking all-reduces of mixed sizes issued in turn (`calibrate`'s
    `_timed_loop`, up to BLOCKING_MAX_BYTES) and the streamed samples above them, empty before `calibrate`."""
    if not _LOOP:
        return []
    top = max(b for b, _ in _LOOP)
    # above the loop's sizes: each blocking call is a message alone (its alone sample where measured)
    above = [(b, t) for b, t in _ALONE if b > top] or [(b, t) for b, t in _SAMPLES if b > top]
    return sorted(list(_LOOP) + above)


def with_blocking_costs(cluster: ClusterSpec) -> ClusterSpec:
    """`cluster` whose cost model charges all-reduces issued one blocking call after another instead of
    queued ones: for predicting a loop of blocking dist.all_reduce calls over a model's gradients (not what
    the executor runs). Charged the mean times of such calls of mixed sizes in turn (`loop_samples`) where
    they were measured, else those of same-size calls (`blocking_samples`); `cluster` itself where neither
    was."""
    samples = loop_samples()
    if len({b for b, _ in samples}) < 2:
        samples = blocking_samples()
    if len({b for b, _ in samples}) < 2:
        return cluster
    # every call of such a loop is charged in the table (no lone-bucket extra on top of it)
    return dataclasses.replace(cluster, allreduce_samples=tuple((float(b), float(t)) for b, t in samples),
                               allreduce_samples_alone=None)


def calibration_sizes(up_to_bytes: float | None = None, sizes: Sequence[int] = CALIBRATION_SIZES) -> tuple[int, ...]:
    """The float32 element counts of `sizes` that `calibrate` measures for messages of at most
    `up_to_bytes` (e.g. a model's gradient bytes: no bucket of its plans is larger): the sizes below it
    and the first one at or above it, so that every message the plans can send lies between two samples
    (at least 3 sizes: `banked_time` needs one between the smallest and the largest). None: all."""
    ordered = sorted(int(n) for n in sizes)
    if up_to_bytes is None:
        return tuple(ordered)
    out: list[int] = []
    for n in ordered:
        out.append(n)
        if 4 * n >= up_to_bytes and len(out) >= 3:
            break
    return tuple(out)


def _timed_allreduce(n: int, reps: int, dtype=None, blocking_calls: bool = False) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) per all-reduce of `n` elements of `dtype` (float32 by
    default) in a stream: the medians over `reps` batches (fewer for messages above 1 MB) of the mean of
    back-to-back all-reduces after a barrier, started asynchronously one after the other and then waited
    for, as the executor starts a plan's buckets (each queued behind the ones in flight on the process
    group's worker threads). The CPU time (time.process_time: every thread, user and system, so gloo's
    threads and the kernel's TCP work done in the process) is what a message takes from compute where
    they share a core (aiacc.core.comm.contention). blocking_calls: each all-reduce a blocking call after the
    last has returned (a user's loop of dist.all_reduce) instead."""
    bufs = [torch.zeros(n, dtype=dtype or torch.float32) for _ in range(2)]
    if n <= 1 << 18:  # connections and buffers warm (the large sizes follow the small ones)
        collective("calibration all-reduce", lambda: dist.all_reduce(bufs[0]))
    # back to back, as a plan's buckets follow each other: one all-reduce after an idle barrier rides
    # the link's burst allowance (a token bucket, a TCP window) and looks cheaper than it is in a
    # stream, so each batch carries at least BATCH_BYTES (up to BATCH_MAX_MESSAGES): the mean of each batch,
    # the median over batches. Asynchronously, not one blocking call after another: on one core per rank
    # (2 testbed nodes at 10 Gbit/s) a small message queued behind others took 2-3 ms, one issued after the
    # last had returned ~1 ms (64 B: 3.1 vs 1.4 ms, 16 KB 2.1 vs 1.3, 1 MB 4.7 vs 5.2): gloo's two worker
    # threads run queued all-reduces side by side and each waits for the core in turn; sampled one at a
    # time, a plan of 40 small buckets was predicted 0.80x of its measured step
    times, cpus = [], []
    nbytes = bufs[0].element_size() * n
    k = batch_messages(nbytes)
    for _ in range(reps if nbytes <= 1 << 20 else max(3, (reps + 1) // 2)):
        collective("calibration barrier", dist.barrier)
        c0, t0 = time.process_time(), time.perf_counter()
        if blocking_calls:
            for _ in range(k):
                collective("calibration all-reduce", lambda: dist.all_reduce(bufs[0]))
        else:
            works = [collective("calibration all-reduce", lambda b=bufs[i % 2]: dist.all_reduce(b, async_op=True))
                     for i in range(k)]
            for w in works:
                collective("calibration all-reduce", w.wait)
        times.append((time.perf_counter() - t0) / k)
        cpus.append((time.process_time() - c0) / k)
    return float(np.median(times)), float(np.median(cpus))


def _timed_alone(n: int, reps: int) -> float:
    """Seconds of one blocking float32 all-reduce of `n` elements sent alone (after a barrier, nothing queued
    behind it): the median over `reps` (at least 3). A collective."""
    buf = torch.zeros(n)
    times = []
    for _ in range(max(3, reps)):
        collective("calibration barrier", dist.barrier)
        t0 = time.perf_counter()
        collective("calibration all-reduce", lambda: dist.all_reduce(buf))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def loop_rounds(blocking: Sequence[tuple[float, float]], budget_s: float = LOOP_BUDGET_S) -> int:
    """How many rounds `_timed_loop` runs over sizes whose blocking calls took `blocking` ((bytes, seconds)
    each, one round one call of each size): as many as fit in `budget_s`, LOOP_MIN_ROUNDS to LOOP_MAX_ROUNDS."""
    round_s = sum(float(t) for _, t in blocking)
    if round_s <= 0:
        return LOOP_MAX_ROUNDS
    return int(min(LOOP_MAX_ROUNDS, max(LOOP_MIN_ROUNDS, budget_s // round_s)))


def _timed_loop(numels: Sequence[int], rounds: int) -> list[tuple[int, float]]:
    """(bytes, mean seconds) of a blocking float32 all-reduce of each of `numels` elements, the sizes issued
    in turn one blocking call after another (forwards, then backwards the next round, after a barrier each
    round), as a loop over a model's gradients issues them: the mean over `rounds` calls of each size, not a
    median (such a loop pays every stall; its calls' times are heavy-tailed on a shared core). A collective:
    every rank passes the same sizes and rounds."""
    bufs = {int(n): torch.zeros(int(n)) for n in numels}
    per: dict[int, list[float]] = {n: [] for n in bufs}
    order = sorted(bufs)
    for r in range(max(1, int(rounds))):
        collective("calibration barrier", dist.barrier)
        for n in (order if r % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            collective("calibration all-reduce", lambda b=bufs[n]: dist.all_reduce(b))
            per[n].append(time.perf_counter() - t0)
    return [(4 * n, float(np.mean(per[n]))) for n in order]


def calibrate(reps: int = 5, sizes: Sequence[int] = CALIBRATION_SIZES, *,
              up_to_bytes: float | None = None) -> ClusterSpec:
    """The job's cluster as measured on the actual process group: for each of `sizes` float32 elements,
    the median over `reps` batches of the mean time of back-to-back all-reduces started asynchronously,
    as the executor queues a plan's buckets (`_timed_allreduce`), and the same sizes up to
    BLOCKING_MAX_BYTES as blocking calls one after another (`blocking_samples`: the link's banked idle time,
    since a queued small message costs more than one alone and that is no banked time) and as a loop of
    blocking calls of those sizes in turn (`loop_samples`, means: for predicting such a loop) (the median, not the
    fastest: a training step pays the typical time, scheduling delays of a loaded core included), kept
    as the cluster's `allreduce_samples` (the cost model interpolates them), with the least-squares
    alpha-beta line through them as the ClusterSpec's link figures (nodes x workers, LOCAL_WORLD_SIZE
    ranks per node); the same in float16 from FP16_MIN_NUMEL elements up (`allreduce_samples_fp16`, for
    fp16 compression); the process's CPU seconds per message of the same batches
    (`allreduce_cpu_samples`, `..._fp16`: how the contention depends on a message's size and dtype,
    aiacc.core.comm.contention); the idle wire time a token-bucket link banks (`banked_time`, the ClusterSpec's
    banked_s); and the contention of compute and communication (`measure_contention`, with a generic
    workload; `probe_contention` re-measures it with the model's own). Rank
    0's measurement is shared by all ranks so that their plans agree. AIACC_NETWORK_GBPS=<Gb/s> skips
    the measurement and assumes that network between nodes.

    up_to_bytes (e.g. the model's gradient bytes, as `plan_for` gives): only the sizes that messages of
    at most that many bytes need (`calibration_sizes`); a later call that needs larger ones measures
    just those and adds them (the contention measured first is kept). Every rank must pass the same."""
    global _CLUSTER
    want = calibration_sizes(up_to_bytes, sizes)
    have = {b for b, _ in _SAMPLES}
    if _CLUSTER is not None and (not _CLUSTER.allreduce_samples or all(4 * n in have for n in want)):
        return _CLUSTER
    world = dist.get_world_size()
    nodes, per = cluster_shape(world)
    if "AIACC_NETWORK_GBPS" in os.environ or world == 1:
        gbps = float(os.environ.get("AIACC_NETWORK_GBPS", 25))
        _CLUSTER = ClusterSpec(nodes=nodes, workers_per_node=per, inter_bandwidth=gbps * 1e9 / 8)
        return _CLUSTER
    new = [n for n in want if 4 * n not in have]
    timed = [(4 * n, _timed_allreduce(n, reps)) for n in new]
    # fp16 payloads (compression): gloo sums float16 on the CPU at its own rate per byte
    timed16 = [(2 * n, _timed_allreduce(n, reps, torch.float16)) for n in new if n >= FP16_MIN_NUMEL]
    timed_blocking = [(4 * n, _timed_allreduce(n, reps, blocking_calls=True)[0]) for n in new
                      if 4 * n <= BLOCKING_MAX_BYTES]
    timed_alone = [(4 * n, _timed_alone(n, reps)) for n in new if 4 * n >= ALONE_MIN_BYTES]
    probe_numel = min(PROBE_NUMEL, max(want))
    large_numel = min(SHAPE_FACTOR * probe_numel, max(want))  # the second size: how contention falls with size
    if _CLUSTER is None:  # probe messages no larger than the largest calibrated one (the plans' buckets)
        slowdowns = measure_contention(numel=probe_numel, reps=max(2, min(3, reps)))
        large = measure_contention(numel=large_numel, reps=max(2, min(3, reps))) \
            if large_numel >= 4 * probe_numel and len(_CPU) >= 2 else None
    else:
        slowdowns = large = None
    timed, timed16, timed_blocking, timed_alone = broadcast_object((timed, timed16, timed_blocking, timed_alone), 0,
                                                                   "calibration")
    _ALONE[:] = sorted(_ALONE + list(timed_alone))
    # the same sizes again as a loop of blocking calls of mixed sizes (rank 0's blocking times set the rounds,
    # so that every rank runs as many)
    if len(timed_blocking) >= 2:
        looped = _timed_loop([b // 4 for b, _ in timed_blocking], loop_rounds(timed_blocking))
        _LOOP[:] = sorted(_LOOP + list(broadcast_object(looped, 0, "calibration loop")))
    _BLOCKING[:] = sorted(_BLOCKING + list(timed_blocking))
    _SAMPLES[:] = sorted(_SAMPLES + [(b, w) for b, (w, _) in timed])
    _SAMPLES16[:] = sorted(_SAMPLES16 + [(b, w) for b, (w, _) in timed16])
    _CPU[:] = sorted(_CPU + [(b, c) for b, (_, c) in timed])
    _CPU16[:] = sorted(_CPU16 + [(b, c) for b, (_, c) in timed16])
    samples, samples16 = list(_SAMPLES), list(_SAMPLES16)
    lat, coef = fit_alpha_beta(samples)
    pairs = lambda pts: tuple((float(b), float(t)) for b, t in pts) if len({b for b, _ in pts}) >= 2 else None
    cluster = dataclasses.replace(cluster_from_fit(lat, coef, world, nodes), banked_s=banked_time(blocking_samples()),
                                  allreduce_samples=pairs(samples), allreduce_samples_fp16=pairs(samples16),
                                  allreduce_cpu_samples=pairs(_CPU), allreduce_cpu_samples_fp16=pairs(_CPU16),
                                  allreduce_samples_alone=pairs(_ALONE))
    if slowdowns is None:  # a later call: the contention measured first is kept
        cs, ns = _CLUSTER.compute_slowdown, _CLUSTER.comm_slowdown
        cluster = dataclasses.replace(cluster, slowdown_estimates=_CLUSTER.slowdown_estimates,
                                      compute_slowdown_range=_CLUSTER.compute_slowdown_range)
    else:  # the probe's messages' slowdown, in the units of the cluster's (1 MB float32 messages)
        if large is not None:
            cluster = with_exponent(cluster, (4 * probe_numel, slowdowns[0]), (4 * large_numel, large[0]))
        cs, ns = reference_slowdown(cluster, slowdowns[0], 4 * probe_numel), slowdowns[1]
    if slowdowns is None:
        cluster = dataclasses.replace(cluster, contention_exponent=_CLUSTER.contention_exponent)
    _CLUSTER = dataclasses.replace(cluster, compute_slowdown=cs, comm_slowdown=ns)
    return _CLUSTER


SHAPE_FACTOR = 8  # the contention probe's second message size, in multiples of its first (1 MB -> 8 MB)


def with_exponent(cluster: ClusterSpec, small: tuple[float, float], large: tuple[float, float]) -> ClusterSpec:
    """`cluster` with the contention exponent fitted to slowdowns measured beside streams of two message
    sizes ((bytes, slowdown) each: aiacc.core.comm.contention.fit_exponent); unchanged where they say
    nothing."""
    g = fit_exponent(cluster, small, large)
    return cluster if g is None else dataclasses.replace(cluster, contention_exponent=g)


CONTENTION_CAP = SLOWDOWN_CAP  # a slowdown above this is reported as this (a stream starved beside compute)
PROBE_NUMEL = 1 << 18  # float32 elements of each all-reduce of the contention probe: a 1 MB bucket
PROBE_MAX_MESSAGES = 64


def contention_factors(unit_s: float, units: int, compute_s: float, comm_alone_s: float,
                       comm_s: float) -> tuple[float, float]:
    """(compute slowdown, communication slowdown) of one probe in the simulator's contention model
    (aiacc.core.comm.simulate: compute runs `cs` times slower while an all-reduce is in flight, an
    all-reduce `ns` times slower while compute runs): `units` workload units of `unit_s` seconds alone
    took `compute_s` with a stream of all-reduces (`comm_alone_s` alone) started beside them at time 0 and
    done at `comm_s`.

    Stream done first: they overlapped for `comm_s` (ns = comm_s / comm_alone_s), in which compute lost
    the `compute_s - units * unit_s` it took longer, comm_s * (1 - 1/cs). Compute done first: it ran slowed
    all along (cs = compute_s / work) and the stream did the rest of its work alone after it. Both at
    least 1 and at most CONTENTION_CAP (a stream that made no progress beside compute)."""
    work = unit_s * units
    if not (work > 0 and comm_alone_s > 0 and compute_s > 0 and comm_s > 0):
        raise CommError(f"contention probe: times must be positive, got unit {unit_s} x {units}, compute "
                        f"{compute_s}, stream alone {comm_alone_s}, stream beside compute {comm_s}")
    if comm_s <= compute_s:
        lost = compute_s - work
        cs = comm_s / (comm_s - lost) if lost < comm_s else CONTENTION_CAP
        ns = comm_s / comm_alone_s
    else:
        cs = compute_s / work
        left = comm_alone_s - (comm_s - compute_s)  # stream work done while compute ran
        ns = compute_s / left if left > 0 else CONTENTION_CAP
    return tuple(float(min(CONTENTION_CAP, max(1.0, f))) for f in (cs, ns))


def backward_like_workload(width: int = 512, batch: int = 128, layers: int = 3):
    """A default compute workload for the contention probe where the model's own is not given: forward and
    backward of a `layers`-deep MLP (GEMMs and their transposes, as a backward runs), ~10 ms on one core."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())])
    x = torch.randn(batch, width)

    def unit() -> None:
        net(x).sum().backward()
    return unit


def measure_contention(workload=None, *, numel: int = PROBE_NUMEL, reps: int = 5) -> tuple[float, float]:
    """(compute slowdown, communication slowdown) of this job's ranks when a stream of back-to-back async
    all-reduces of `numel` float32 elements (a plan's buckets) runs on the actual process group beside
    `workload` (a callable, one unit of compute: e.g. the model's own forward + backward; default
    `backward_like_workload`), as backward does while its buckets are reduced: gloo's reductions and the
    kernel's network stack take CPU from the cores that compute, and compute delays the transport.

    The stream lasts about one workload unit alone (2 to PROBE_MAX_MESSAGES messages, rank 0's count), the
    compute at least 1.5 times the stream alone (2 to 64 units), so that compute outlasts the stream; per rep, `contention_factors` of the two
    times (the stream's end timed by a thread waiting on it); the median over `reps`, averaged over the
    ranks (all get the same factors, so their plans agree). A collective: every rank calls it."""
    import threading

    workload = workload or backward_like_workload()
    for _ in range(2):
        workload()
    alone = []
    for _ in range(3):
        t0 = time.perf_counter()
        workload()
        alone.append(time.perf_counter() - t0)
    unit_s = float(np.median(alone))
    bufs = [torch.zeros(numel) for _ in range(2)]

    def stream(k: int) -> list:
        return [collective("contention all-reduce", lambda b=bufs[i % 2]: dist.all_reduce(b, async_op=True))
                for i in range(k)]

    def stream_alone(k: int) -> float:
        collective("contention barrier", dist.barrier)
        t0 = time.perf_counter()
        for w in stream(k):
            collective("contention all-reduce", w.wait)
        return time.perf_counter() - t0

    two = stream_alone(2)
    k = int(min(PROBE_MAX_MESSAGES, max(2, round(2 * unit_s / max(two, 1e-9)))))
    k = int(broadcast_object(k, 0, "contention probe size"))
    comm_alone = float(np.median([stream_alone(k) for _ in range(max(1, reps))]))
    units = int(min(64, max(2, -(-1.5 * comm_alone // unit_s))))  # compute outlasts the stream
    cs, ns = [], []
    for _ in range(max(1, reps)):
        done: list[float] = []
        collective("contention barrier", dist.barrier)
        t0 = time.perf_counter()
        works = stream(k)

        def wait_all(works=works, done=done) -> None:
            for w in works:
                w.wait()  # (releases the GIL)
            done.append(time.perf_counter())
        th = threading.Thread(target=wait_all, daemon=True)
        th.start()
        for _ in range(units):
            workload()
        compute_s = time.perf_counter() - t0
        th.join(timeout=None)
        collective("contention all-reduce", lambda: [w.wait() for w in works])  # a failure raises here
        f = contention_factors(unit_s, units, compute_s, comm_alone, done[0] - t0)
        cs.append(f[0])
        ns.append(f[1])
    mine = torch.tensor([float(np.median(cs)), float(np.median(ns))], dtype=torch.float64)
    collective("contention result", lambda: dist.all_reduce(mine))
    mine /= dist.get_world_size()
    return float(mine[0]), float(mine[1])


def probe_contention(workload, *, numel: int = PROBE_NUMEL, reps: int = 5) -> ClusterSpec:
    """Re-measure the contention of compute and communication with `workload` (the model's own forward +
    backward: `measure_contention`) and keep it in the job's calibrated cluster (`calibrate`), which the
    plans made after this (`plan_for`) and their simulation use: its compute slowdown is pooled with the
    job's other model-specific estimates (`add_slowdown_estimates`: e.g. the engine's profiled steps), its
    communication slowdown replaces the last; where the calibration covers messages SHAPE_FACTOR times
    larger, a second probe with those sets the cluster's contention exponent (`with_exponent`); returns
    that cluster. A collective."""
    global _CLUSTER
    cluster = _CLUSTER if _CLUSTER is not None else calibrate()
    if dist.get_world_size() == 1 or not cluster.allreduce_samples:
        return cluster  # nothing measured to compete with (an assumed network: AIACC_NETWORK_GBPS)
    cs, ns = measure_contention(workload, numel=numel, reps=reps)
    # a second message size (where the calibration covers it): how much the contention falls with size
    top = max(b for b, _ in cluster.allreduce_samples)
    large = min(SHAPE_FACTOR * numel, int(top // 4))
    if large >= 4 * numel and cluster.allreduce_cpu_samples:  # (the exponent shapes the CPU samples' shares)
        big = measure_contention(workload, numel=large, reps=reps)
        _CLUSTER = cluster = with_exponent(cluster, (4 * numel, cs), (4 * large, big[0]))
    # in the units of the cluster's compute_slowdown (1 MB float32 messages: aiacc.core.comm.contention)
    return add_slowdown_estimates([reference_slowdown(cluster, cs, 4 * numel)], comm_slowdown=ns)


HOST_COST_NUMEL = 1 << 20  # float32 elements of the buffer `host_cost` times (4 MB: a typical bucket's share)


def host_cost(numel: int = HOST_COST_NUMEL, reps: int = 7) -> float:
    """Seconds of this process's core per gradient byte of one pass over a gradient outside the all-reduce
    (bucketing: copying or accumulating a gradient into its bucket, scaling it by 1/world, zeroing it, copying
    it back), timed here as the median over `reps` of the mean of one zero, one accumulation and one scale of
    a `numel`-element float32 buffer. DDP (copy in, divide, copy out), Horovod's fusion (concatenate, divide,
    copy back) and the engine (zero, autograd's accumulation into the bucket view, scale) each make about
    three such passes per gradient per step, which a profile of the model without communication does not
    contain: 2 testbed nodes at 10 Gbit/s, BERT's 14 MB of gradients, DDP with a comm hook that sends nothing
    took 4 ms longer a step than the plain model, the engine on DDP's layout on one rank 2-3 ms. Not a
    collective (each rank's own core; share rank 0's where the ranks must agree)."""
    grad = torch.randn(int(numel))
    buf = torch.zeros(int(numel))
    times = []
    for _ in range(max(1, int(reps)) + 1):
        t0 = time.perf_counter()
        buf.zero_()
        buf.add_(grad)
        buf.mul_(0.5)
        times.append((time.perf_counter() - t0) / 3)
    return float(np.median(times[1:])) / (4 * int(numel))  # (the first warms the buffers)


def current_cluster() -> ClusterSpec | None:
    """The job's calibrated cluster as it stands (its contention pooled so far), None before `calibrate`."""
    return _CLUSTER


def add_slowdown_estimates(estimates: Sequence[float], *, comm_slowdown: float | None = None) -> ClusterSpec:
    """Pool model-specific compute-slowdown estimates (a probe beside the model's own forward + backward,
    or a profiled training step: aiacc.core.comm.robust.slowdown_from_span) into the calibrated cluster:
    its compute_slowdown becomes the median of every such estimate so far (calibrate's generic probe is
    dropped once there is one), its compute_slowdown_range their spread (`pool_slowdowns`; None while
    there is one estimate), which makes `choose_plan`'s choice robust over that range. Not a collective:
    every rank must pass the same values (rank 0's plan decides anyway). Returns the cluster."""
    global _CLUSTER
    cluster = _CLUSTER if _CLUSTER is not None else calibrate()
    if not cluster.allreduce_samples:
        return cluster  # an assumed network: no contention modelled
    pooled = tuple(cluster.slowdown_estimates) + tuple(float(min(CONTENTION_CAP, max(1.0, e))) for e in estimates)
    if not pooled:
        return cluster
    cs, rng = pool_slowdowns(pooled)
    _CLUSTER = dataclasses.replace(cluster, compute_slowdown=cs, compute_slowdown_range=rng if len(pooled) > 1 else None,
                                   slowdown_estimates=pooled,
                                   comm_slowdown=cluster.comm_slowdown if comm_slowdown is None else comm_slowdown)
    return _CLUSTER


def reset_contention() -> ClusterSpec | None:
    """Forget the model-specific contention estimates (before planning for another model in the same job):
    the cluster keeps its point estimates but no pool and no range. Returns the cluster."""
    global _CLUSTER
    if _CLUSTER is not None:
        _CLUSTER = dataclasses.replace(_CLUSTER, slowdown_estimates=(), compute_slowdown_range=None)
    return _CLUSTER


ROBUST_SPREAD = 0.10  # a compute-slowdown range wider than this (high / low - 1) makes the choice robust


def clearly_faster(times: np.ndarray, default_times: np.ndarray, point: int, cluster: ClusterSpec,
                   margin: float) -> bool:
    """Whether a plan whose predicted steps over the slowdown grid are `times` may run instead of DDP's
    default (`default_times`): faster at the point estimate (index `point`) by the required gain (`margin`
    of the step, DDP_DEFAULT_MARGIN in `keep_or_ddp_default`, the one place this is decided; one message's
    latency; the link's banked idle time) and no slower at any slowdown of the grid. Where compute is the bottleneck every plan predicts about the same step,
    and what runs is then DDP's own plan (a prediction's error there is as large as the differences)."""
    from aiacc.core.comm import CostModel
    from aiacc.core.comm.strategies import _required_gain

    lat = CostModel(cluster).bound_terms().latency
    need = _required_gain(float(default_times[point]), lat, margin, cluster.banked_s)
    return bool(default_times[point] - times[point] > need and np.all(times <= default_times + 1e-12))


def robust_search(spec: ModelSpec, cluster: ClusterSpec, *, compression: str = "none", sync: str = "step",
                  margin: float = 0.0):
    """(plan, its result at the point estimate) of aiacc's search made robust to the uncertainty of the
    compute slowdown: where `cluster.compute_slowdown_range` is wider than ROBUST_SPREAD, aiacc's search
    (`aiacc_search`, with the fallback `margin`) runs at the range's ends and its point estimate
    (`slowdown_grid`); those plans and the safe plans (`safe_family`: DDP's bucket sweep, Horovod's fusion
    after backward) are simulated at every point of the grid, and the one with the least worst-case regret
    (`robust_pick`) runs, unless its regret is within `margin` of the point estimate's plan, which then
    runs (the plan's params say so: "robust"). Elsewhere: `aiacc_search` at the point estimate. Whether
    the plan found may run instead of DDP's default layout is not decided here but by the one guard that
    judges every plan against it (`keep_or_ddp_default`, DDP_DEFAULT_MARGIN, applied by `choose_plan`)."""
    grid = slowdown_grid(cluster)
    point = aiacc_search(spec, with_slowdown(cluster, cluster.compute_slowdown), compression=compression,
                         sync=sync, fallback_margin=margin)[:2]
    rng = cluster.compute_slowdown_range
    if len(grid) < 2 or rng is None or rng[1] <= rng[0] * (1 + ROBUST_SPREAD):
        return point
    plans = [point[0]]
    for cs in grid:
        if cs != cluster.compute_slowdown:
            plans.append(aiacc_search(spec, with_slowdown(cluster, cs), compression=compression, sync=sync,
                                      fallback_margin=margin)[0])
    plans += safe_family(spec, cluster, compression)
    unique: list[Plan] = []
    for p in plans:  # the same buckets found at several slowdowns are one finalist
        if not any(q.buckets == p.buckets and q.scheduling == p.scheduling for q in unique):
            unique.append(p)
    times = regret_table(spec, cluster, unique, grid, sync=sync)
    regret = (times / times.min(axis=0, keepdims=True)).max(axis=1)
    pick = robust_pick(times, prefer=(0,))
    if regret[0] - regret[pick] <= margin:
        pick = 0
    chosen = unique[pick]
    note = (f"robust over compute slowdown {rng[0]:.2f}-{rng[1]:.2f} (point {cluster.compute_slowdown:.2f}): "
            f"worst-case regret {regret[pick]:.3f} vs {regret[0]:.3f} for the point estimate's plan")
    chosen = dataclasses.replace(chosen, notes=(chosen.notes + "; " if chosen.notes else "") + note,
                                 params={**chosen.params, "robust": {"grid": list(grid),
                                                                     "regret": float(regret[pick]),
                                                                     "point_regret": float(regret[0]),
                                                                     "finalists": len(unique)}})
    return chosen, simulate(spec, cluster, chosen, validate=False, sync=sync)


def choose_plan(spec: ModelSpec, cluster: ClusterSpec, plan: str | Plan = "aiacc", *, compression: str = "none",
                sync: str = "step") -> Plan:
    """The plan that `plan_for` runs for `spec` on `cluster` (rank 0's decision), for an executor that
    waits per `sync` ("step", "layer" or "auto": see plan_for). aiacc's plan must win by FALLBACK_MARGIN
    over DDP-like bucketing where the costs are measured (`aiacc_search`'s fallback), and whatever is chosen
    then by DDP_DEFAULT_MARGIN over DDP's default layout, else that layout runs (`keep_or_ddp_default`); with "auto" the
    plan's params say which sync was chosen ("sync") and the predicted step of each ("predicted"). Where
    the compute slowdown is uncertain (a pooled range), aiacc's plan is chosen robustly (`robust_search`)."""
    if sync not in ("step", "layer", "auto"):
        raise CommError(f"unknown sync {sync!r}; expected 'step', 'layer' or 'auto'")
    margin = FALLBACK_MARGIN if cluster.allreduce_samples else 0.0
    syncs = ("step", "layer") if sync == "auto" else (sync,)
    if isinstance(plan, str) and plan == "aiacc":
        found = {s: robust_search(spec, cluster, compression=compression, sync=s, margin=margin) for s in syncs}
    else:  # the same plan either way: how it runs with each wait
        p = make_plan(plan, spec, cluster, compression=compression) if isinstance(plan, str) else plan
        if sync != "auto":
            return p
        found = {s: (p, simulate(spec, cluster, p, validate=False, sync=s)) for s in syncs}
    pick = syncs[0]
    if sync == "auto" and found["layer"][1].iteration_s < found["step"][1].iteration_s * (1 - margin):
        pick = "layer"  # per-layer waits: only where predicted faster by the margin
    p = found[pick][0]
    p = dataclasses.replace(p, params={**p.params, "sync": pick,
                                       "predicted": {s: r.iteration_s for s, (_, r) in found.items()}})
    if isinstance(plan, str) and plan == "aiacc" and margin > 0:  # measured costs: DDP's layout unless beaten
        p = keep_or_ddp_default(spec, cluster, p, syncs, compression=compression)
    return p


def keep_or_ddp_default(spec: ModelSpec, cluster: ClusterSpec, plan: Plan, syncs: Sequence[str] = ("step",), *,
                        compression: str = "none", margin: float = DDP_DEFAULT_MARGIN) -> Plan:
    """`plan` (aiacc's choice, with its params' "sync") where it is predicted clearly faster than DDP's
    default layout (`strategies.ddp_layout`: 25 MB buckets, the first 1 MB, in the order backward makes
    gradients ready; what benchmarks/dp.py --same-plan runs) waiting for everything before the update as
    DDP does: faster by `margin` of that layout's step (and one message's latency, and the link's banked
    idle time: `clearly_faster`) at the point estimate of the compute slowdown and no slower anywhere on
    its pooled range; else that layout, step-synchronized as DDP runs it (where `syncs` is one wait the
    caller asked for, with that wait, and judged with it). Either way the params say which ran
    ("ddp_default": True for DDP's layout, "fallback": True where it replaced aiacc's plan) and the
    predicted speedup of `plan` over the layout ("vs_ddp_default"); the notes of a replaced plan say by how
    much it was predicted faster. `syncs`: the waits the choice was made among (DDP's layout is predicted
    with each, for the params' "predicted")."""
    from aiacc.core.comm import CostModel
    from aiacc.core.comm.strategies import ddp_layout, is_ddp_default

    sync = plan.params.get("sync", "step")
    if is_ddp_default(plan, spec):  # what runs is DDP's layout already (e.g. aiacc_search's own fallback)
        return dataclasses.replace(plan, params={**plan.params, "ddp_default": True, "vs_ddp_default": 1.0})
    default = ddp_layout(spec, compression=compression)
    grid = slowdown_grid(cluster)
    point = grid.index(cluster.compute_slowdown)
    cost = CostModel(cluster, compression=compression)

    def steps(p: Plan, s: str) -> np.ndarray:
        return np.array([simulate(spec, with_slowdown(cluster, cs), p, cost, validate=False, sync=s).iteration_s
                         for cs in grid])
    # DDP's layout waits as DDP does (one synchronize) where the wait was chosen ("auto"), else as asked
    fb_sync = syncs[0] if len(syncs) == 1 else "step"
    mine, theirs = steps(plan, sync), steps(default, fb_sync)
    speedup = float(theirs[point] / mine[point])
    if clearly_faster(mine, theirs, point, cluster, margin):
        return dataclasses.replace(plan, params={**plan.params, "vs_ddp_default": speedup})
    waits = ", per-layer waits" if sync == "layer" else ""
    note = (f"DDP's default layout kept ({len(default.buckets)} buckets: 25 MB, the first 1 MB, as DDP runs them): "
            f"aiacc's plan ({len(plan.buckets)} buckets{waits}) is predicted to save {1 - mine[point] / theirs[point]:+.1%} "
            f"of its step ({mine[point] * 1e3:.1f} ms against {theirs[point] * 1e3:.1f} ms)"
            + ("" if len(grid) < 2 else f" at compute slowdown {cluster.compute_slowdown:.2f}, "
               f"{(1 - mine / theirs).min():+.1%} at worst over {grid[0]:.2f}-{grid[-1]:.2f}")
            + f", not the {margin:.0%} (or one message's latency, or the link's banked idle time) that the "
              f"simulator's error on such comparisons asks for")
    predicted = {s: float(theirs[point]) if s == fb_sync else simulate(spec, cluster, default, cost, validate=False,
                                                                        sync=s).iteration_s for s in syncs}
    return dataclasses.replace(default, notes=note, params={**default.params, "fallback": True, "ddp_default": True,
                                                            "vs_ddp_default": 1.0, "sync": fb_sync,
                                                            "predicted": predicted, "replaced": {
                                                                "buckets": len(plan.buckets), "sync": sync,
                                                                "speedup": speedup}})



def plan_for(params: Sequence[tuple[str, Sequence[int], Any]], plan: str | Plan = "aiacc", *,
             compression: str = "none", model_spec: ModelSpec | None = None,
             sync: str = "step") -> tuple[Plan, list[int], ModelSpec]:
    """A plan for these (name, shape, dtype) parameters (forward order) and its issue order.

    Rank 0 plans (on `model_spec`, by default sizes with a nominal compute time, and the calibrated
    cluster, for an executor that waits per `sync`: "step" or "layer") and sends the plan to the others:
    all ranks must run the same collectives (`choose_plan` is rank 0's choice).

    sync="auto": aiacc's plans for both (or the one plan given, simulated both ways), and per-layer waits
    only where the simulator predicts them FALLBACK_MARGIN faster than the step plan on these costs
    (per-layer updates cost more hooks and optimizer calls than one update, which the model does not
    see); the chosen plan's `params["sync"]` says which, its `params["predicted"]` the predicted step of each."""
    if sync not in ("step", "layer", "auto"):  # on every rank, before rank 0 plans alone
        raise CommError(f"unknown sync {sync!r}; expected 'step', 'layer' or 'auto'")
    spec = model_spec or gradient_specs_from_params(params, name="model", forward_s=1e-3)
    # the transport measured up to the model's gradient bytes (no message of its plans is larger)
    # (from `params`, the same on every rank, whatever model_spec a rank was given)
    grad_bytes = sum(g.nbytes for g in gradient_specs_from_params(params).gradients())
    cluster = calibrate(up_to_bytes=grad_bytes) if dist.is_initialized() else ClusterSpec(1, 1, 1e9)
    chosen = None
    if not dist.is_initialized() or dist.get_rank() == 0:
        # sync "step": the executor waits for every bucket before the update (synchronize); "layer": each
        # layer's update waits for its own buckets in the next forward (torch's forward_module)
        # on measured costs aiacc's own plan must win by FALLBACK_MARGIN over DDP's best bucketing, else
        # it runs that (the plan's notes say so): the model's error is a few percent
        p = choose_plan(spec, cluster, plan, compression=compression, sync=sync)
        p.validate(spec)
        chosen = (p, simulate(spec, cluster, p, validate=False).issue_order)
    if dist.is_initialized() and dist.get_world_size() > 1:
        chosen = broadcast_object(chosen, 0, "communication plan")
        chosen[0].validate(spec)  # a rank whose parameters differ from rank 0's fails here, by name
    return chosen[0], list(chosen[1]), spec
