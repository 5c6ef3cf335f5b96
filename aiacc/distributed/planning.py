"""The plan every rank runs: the job's network as measured (`calibrate`) and rank 0's plan for a set of
parameters, shared with all ranks (`plan_for`), since all ranks must issue the same collectives."""
from __future__ import annotations

import os
import time
from typing import Any, Sequence

import torch
import torch.distributed as dist

from aiacc.core.comm import ClusterSpec, ModelSpec, Plan, gradient_specs_from_params, make_plan, simulate
from aiacc.distributed.process import collective, local_size
from aiacc.distributed.transport import broadcast_object

_CLUSTER: ClusterSpec | None = None


def calibrate(reps: int = 5) -> ClusterSpec:
    """The job's cluster as measured: all-reduce times of 4 bytes and 4 MB fitted to the alpha-beta
    model of a flat ring (rank 0's measurement, shared by all ranks so that their plans agree).
    AIACC_NETWORK_GBPS=<Gb/s> skips the measurement and assumes that network between nodes."""
    global _CLUSTER
    if _CLUSTER is not None:
        return _CLUSTER
    world = dist.get_world_size()
    if "AIACC_NETWORK_GBPS" in os.environ or world == 1:
        per = max(1, min(local_size(), world))
        per = per if world % per == 0 else 1
        gbps = float(os.environ.get("AIACC_NETWORK_GBPS", 25))
        _CLUSTER = ClusterSpec(nodes=world // per, workers_per_node=per, inter_bandwidth=gbps * 1e9 / 8)
        return _CLUSTER

    def timed(n: int) -> float:
        t = torch.zeros(n)
        best = float("inf")
        for _ in range(reps):
            collective("calibration barrier", dist.barrier)
            t0 = time.perf_counter()
            collective("calibration all-reduce", lambda: dist.all_reduce(t))
            best = min(best, time.perf_counter() - t0)
        return best

    small, big = timed(1), timed(1 << 20)
    alpha = small / (2 * (world - 1))
    coef = max(big - small, 1e-9) / (4 << 20)
    measured = [alpha, 2 * (world - 1) / world / coef]
    measured = broadcast_object(measured, 0, "calibration")
    _CLUSTER = ClusterSpec(nodes=1, workers_per_node=world, inter_bandwidth=measured[1],
                           intra_bandwidth=measured[1], intra_latency=measured[0])
    return _CLUSTER


def plan_for(params: Sequence[tuple[str, Sequence[int], Any]], plan: str | Plan = "aiacc", *,
             compression: str = "none", model_spec: ModelSpec | None = None) -> tuple[Plan, list[int], ModelSpec]:
    """A plan for these (name, shape, dtype) parameters (forward order) and its issue order.

    Rank 0 plans (on `model_spec`, by default sizes with a nominal compute time, and the calibrated
    cluster) and sends the plan to the others: all ranks must run the same collectives."""
    spec = model_spec or gradient_specs_from_params(params, name="model", forward_s=1e-3)
    cluster = calibrate() if dist.is_initialized() else ClusterSpec(1, 1, 1e9)
    chosen = None
    if not dist.is_initialized() or dist.get_rank() == 0:
        p = make_plan(plan, spec, cluster, compression=compression) if isinstance(plan, str) else plan
        p.validate(spec)
        chosen = (p, simulate(spec, cluster, p, validate=False).issue_order)
    if dist.is_initialized() and dist.get_world_size() > 1:
        chosen = broadcast_object(chosen, 0, "communication plan")
        chosen[0].validate(spec)  # a rank whose parameters differ from rank 0's fails here, by name
    return chosen[0], list(chosen[1]), spec
