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
from aiacc.core.comm.strategies import aiacc_search
from aiacc.distributed.process import collective, local_size
from aiacc.distributed.transport import broadcast_object

_CLUSTER: ClusterSpec | None = None
FALLBACK_MARGIN = 0.03  # the predicted gain aiacc's own plan needs over DDP-like buckets on measured costs


# float32 elements: 4 B, 1 KB, 16 KB, 64 KB, 256 KB, 1 MB, 4 MB, 16 MB (the sizes of buckets and tensors a
# plan may send; the cost model interpolates between them, so mid sizes are measured, not assumed to lie
# on a line)
CALIBRATION_SIZES = (1, 1 << 8, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22)
_SAMPLES: list[tuple[int, float]] = []
_SAMPLES16: list[tuple[int, float]] = []
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
    per_byte, lat = pts[-1][1] / pts[-1][0], pts[0][1]  # each message also pays the smallest's latency
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


def measurements(dtype: str = "float32") -> list[tuple[int, float]]:
    """The (bytes, seconds) all-reduce times `calibrate` measured (rank 0's) of float32 or "float16"
    payloads, empty before or when skipped."""
    return list(_SAMPLES16 if dtype == "float16" else _SAMPLES)


def calibrate(reps: int = 5, sizes: Sequence[int] = CALIBRATION_SIZES) -> ClusterSpec:
    """The job's cluster as measured on the actual process group: for each of `sizes` float32 elements,
    the median over `reps` batches of the mean time of back-to-back all-reduces (the median, not the
    fastest: a training step pays the typical time, scheduling delays of a loaded core included), kept
    as the cluster's `allreduce_samples` (the cost model interpolates them), with the least-squares
    alpha-beta line through them as the ClusterSpec's link figures (nodes x workers, LOCAL_WORLD_SIZE
    ranks per node); the same in float16 from FP16_MIN_NUMEL elements up (`allreduce_samples_fp16`, for
    fp16 compression); the idle wire time a token-bucket link banks (`banked_time`, the ClusterSpec's
    banked_s); and the contention of compute and communication (`measure_contention`). Rank
    0's measurement is shared by all ranks so that their plans agree. AIACC_NETWORK_GBPS=<Gb/s> skips
    the measurement and assumes that network between nodes."""
    global _CLUSTER
    if _CLUSTER is not None:
        return _CLUSTER
    world = dist.get_world_size()
    nodes, per = cluster_shape(world)
    if "AIACC_NETWORK_GBPS" in os.environ or world == 1:
        gbps = float(os.environ.get("AIACC_NETWORK_GBPS", 25))
        _CLUSTER = ClusterSpec(nodes=nodes, workers_per_node=per, inter_bandwidth=gbps * 1e9 / 8)
        return _CLUSTER

    def timed(n: int, dtype=torch.float32) -> float:
        t = torch.zeros(n, dtype=dtype)
        if n <= 1 << 18:  # connections and buffers warm (the large sizes follow the small ones)
            collective("calibration all-reduce", lambda: dist.all_reduce(t))
        # back to back, as a plan's buckets follow each other: one all-reduce after an idle barrier rides
        # the link's burst allowance (a token bucket, a TCP window) and looks cheaper than it is in a
        # stream, so each batch carries at least BATCH_BYTES (up to BATCH_MAX_MESSAGES): the mean of each batch,
        # the median over batches
        times = []
        nbytes = t.element_size() * n
        k = batch_messages(nbytes)
        for _ in range(reps if nbytes <= 1 << 20 else max(3, (reps + 1) // 2)):
            collective("calibration barrier", dist.barrier)
            t0 = time.perf_counter()
            for _ in range(k):
                collective("calibration all-reduce", lambda: dist.all_reduce(t))
            times.append((time.perf_counter() - t0) / k)
        return float(np.median(times))

    samples = [(4 * n, timed(n)) for n in sizes]
    # fp16 payloads (compression): gloo sums float16 on the CPU at its own rate per byte
    samples16 = [(2 * n, timed(n, torch.float16)) for n in sizes if n >= FP16_MIN_NUMEL]
    mid = min(sizes, key=lambda n: abs(n - (1 << 20)))  # 4 MB: a typical bucket
    slowdowns = measure_contention(mid, dict(samples)[4 * mid], reps)
    samples, samples16, slowdowns = broadcast_object((samples, samples16, slowdowns), 0, "calibration")
    _SAMPLES[:] = samples
    _SAMPLES16[:] = samples16
    lat, coef = fit_alpha_beta(samples)
    _CLUSTER = dataclasses.replace(cluster_from_fit(lat, coef, world, nodes), compute_slowdown=slowdowns[0],
                                   comm_slowdown=slowdowns[1], banked_s=banked_time(samples),
                                   allreduce_samples=tuple((float(b), float(t)) for b, t in samples),
                                   allreduce_samples_fp16=tuple((float(b), float(t)) for b, t in samples16)
                                   if len(samples16) >= 2 else None)
    return _CLUSTER


def measure_contention(numel: int, alone_s: float, reps: int = 3) -> tuple[float, float]:
    """(compute slowdown, communication slowdown) when an all-reduce of `numel` float32 elements (alone:
    `alone_s` seconds) runs beside compute on this process's cores, as backward does while its gradients
    are reduced. Compute is a loop of small matrix products run until the all-reduce has finished; each
    factor is the median over `reps` of (time with the other beside it) / (time alone), at least 1."""
    a = torch.randn(160, 160)

    def unit() -> None:
        torch.mm(a, a)

    for _ in range(5):
        unit()
    t0 = time.perf_counter()
    for _ in range(50):
        unit()
    unit_s = (time.perf_counter() - t0) / 50
    buf = torch.zeros(numel)
    cs, ns = [], []
    for _ in range(reps):
        collective("contention barrier", dist.barrier)
        t0 = time.perf_counter()
        work = collective("contention all-reduce", lambda: dist.all_reduce(buf, async_op=True))
        iters = 0
        while not work.is_completed():
            unit()
            iters += 1
        elapsed = time.perf_counter() - t0
        collective("contention all-reduce", work.wait)
        if iters:
            cs.append(elapsed / iters / unit_s)
            ns.append(elapsed / alone_s)
    if not cs:
        return 1.0, 1.0
    return max(1.0, float(np.median(cs))), max(1.0, float(np.median(ns)))


def choose_plan(spec: ModelSpec, cluster: ClusterSpec, plan: str | Plan = "aiacc", *, compression: str = "none",
                sync: str = "step") -> Plan:
    """The plan that `plan_for` runs for `spec` on `cluster` (rank 0's decision), for an executor that
    waits per `sync` ("step", "layer" or "auto": see plan_for). aiacc's plan must win by FALLBACK_MARGIN
    over DDP-like bucketing where the costs are measured (`aiacc_search`'s fallback); with "auto" the
    plan's params say which sync was chosen ("sync") and the predicted step of each ("predicted")."""
    if sync not in ("step", "layer", "auto"):
        raise CommError(f"unknown sync {sync!r}; expected 'step', 'layer' or 'auto'")
    margin = FALLBACK_MARGIN if cluster.allreduce_samples else 0.0
    syncs = ("step", "layer") if sync == "auto" else (sync,)
    if isinstance(plan, str) and plan == "aiacc":
        found = {s: aiacc_search(spec, cluster, compression=compression, sync=s, fallback_margin=margin)[:2]
                 for s in syncs}
    else:  # the same plan either way: how it runs with each wait
        p = make_plan(plan, spec, cluster, compression=compression) if isinstance(plan, str) else plan
        if sync != "auto":
            return p
        found = {s: (p, simulate(spec, cluster, p, validate=False, sync=s)) for s in syncs}
    pick = syncs[0]
    if sync == "auto" and found["layer"][1].iteration_s < found["step"][1].iteration_s * (1 - margin):
        pick = "layer"  # per-layer waits: only where predicted faster by the margin
    p = found[pick][0]
    return dataclasses.replace(p, params={**p.params, "sync": pick,
                                          "predicted": {s: r.iteration_s for s, (_, r) in found.items()}})


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
    cluster = calibrate() if dist.is_initialized() else ClusterSpec(1, 1, 1e9)
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
