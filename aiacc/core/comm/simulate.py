"""A discrete-event simulator of one data-parallel training iteration.

Timeline (t = 0 when backward starts): backward runs the layers last to first on the device; each
layer's gradients are ready when its backward ends. The network runs one all-reduce at a time
(a bucket can start once all its pieces are ready, after its `not_before` time, and when the network
is free; "fifo" plans keep list order, "priority" plans take the ready bucket with the smallest
priority). The next forward runs layers first to last and may start layer i only when every gradient
of layer i is all-reduced. The iteration time is when that forward ends: backward + forward + the
communication the schedule failed to hide.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from aiacc.core.comm.cost import CostModel
from aiacc.core.comm.errors import CommError
from aiacc.core.comm.plan import Plan
from aiacc.core.comm.spec import ClusterSpec, ModelSpec


@dataclass
class Event:
    lane: str  # "compute" or "network"
    name: str
    start: float
    end: float
    args: dict = field(default_factory=dict)


@dataclass
class SimResult:
    strategy: str
    iteration_s: float
    compute_s: float
    comm_busy_s: float
    messages: int
    issue_order: list[int]
    events: list[Event]

    @property
    def exposed_s(self) -> float:
        """Communication time not hidden behind compute."""
        return self.iteration_s - self.compute_s


def simulate(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel | None = None,
             *, validate: bool = True) -> SimResult:
    """Run one iteration of `plan` on `cluster` and return its timeline."""
    cost = cost or CostModel(cluster)
    if validate:
        plan.validate(model)
    events: list[Event] = []
    ready: dict[str, float] = {}
    layer_of: dict[str, int] = {}
    t = 0.0
    for i in range(len(model.layers) - 1, -1, -1):
        layer = model.layers[i]
        events.append(Event("compute", f"backward {layer.name}", t, t + layer.backward_s))
        t += layer.backward_s
        for g in layer.grads:
            ready[g.name] = t
            layer_of[g.name] = i
    backward_end = t

    nb = len(plan.buckets)
    wire = plan.wire_bytes(model)
    b_ready = [max([b.not_before] + [ready[p.grad] for p in b.pieces]) for b in plan.buckets]
    dur = [float(cost.time(n)) for n in wire]
    start = [0.0] * nb
    end = [0.0] * nb
    order: list[int] = []
    net = 0.0
    if plan.scheduling == "fifo":
        for k in range(nb):
            start[k] = max(net, b_ready[k])
            end[k] = net = start[k] + dur[k]
            order.append(k)
    else:
        by_ready = sorted(range(nb), key=lambda k: (b_ready[k], k))
        heap: list[tuple[int, int]] = []
        j = 0
        while len(order) < nb:
            while j < nb and b_ready[by_ready[j]] <= net:
                k = by_ready[j]
                heapq.heappush(heap, (plan.buckets[k].priority, k))
                j += 1
            if not heap:
                net = b_ready[by_ready[j]]
                continue
            _, k = heapq.heappop(heap)
            start[k] = net
            end[k] = net = net + dur[k]
            order.append(k)
    done: dict[str, float] = {}
    for k in range(nb):
        b = plan.buckets[k]
        events.append(Event("network", f"all-reduce #{k}", start[k], end[k],
                            {"bytes": wire[k], "algorithm": cost.best_algorithm(wire[k]),
                             "tensors": sorted({p.grad for p in b.pieces})[:8], "pieces": len(b.pieces)}))
        for p in b.pieces:
            done[p.grad] = max(done.get(p.grad, 0.0), end[k])

    t = backward_end
    for layer in model.layers:
        need = max([done.get(g.name, 0.0) for g in layer.grads], default=0.0)
        s = max(t, need)
        events.append(Event("compute", f"forward {layer.name}", s, s + layer.forward_s,
                            {"waited_s": s - t} if s > t else {}))
        t = s + layer.forward_s
    return SimResult(plan.strategy, t, model.forward_s + model.backward_s, float(sum(dur)), nb, order, events)


def lower_bound(model: ModelSpec, cluster: ClusterSpec, cost: CostModel | None = None,
                compression: str = "none") -> float:
    """An iteration time no plan can beat on this model (perfect overlap of communication).

    Every schedule must (a) run all compute; (b) for each layer k, all-reduce the gradients of layers
    0..k, which are ready no earlier than layer k's backward ends, before the forward of layer k, then
    run the forward of layers k..end; (c) push every byte through the network after the first gradient
    is ready, then run at least the forward of the last layer with gradients. Messages cost at least
    latency + coef * bytes (`CostModel.bound_terms`).
    """
    import numpy as np
    from aiacc.core.comm.plan import COMPRESSIONS

    cost = cost or CostModel(cluster)
    if cluster.world_size == 1:
        return model.forward_s + model.backward_s
    lin = cost.bound_terms()
    wire_dtype = COMPRESSIONS[compression]
    layers = model.layers
    n = len(layers)
    nbytes = [sum(g.numel * np.dtype(wire_dtype or g.dtype).itemsize for g in l.grads) for l in layers]
    # ready[k]: when layer k's backward ends; suffix_fwd[k]: forward of layers k..n-1
    ready = [0.0] * n
    t = 0.0
    for k in range(n - 1, -1, -1):
        t += layers[k].backward_s
        ready[k] = t
    suffix_fwd = [0.0] * (n + 1)
    for k in range(n - 1, -1, -1):
        suffix_fwd[k] = suffix_fwd[k + 1] + layers[k].forward_s
    best = model.forward_s + model.backward_s
    prefix = 0
    for k in range(n):
        prefix += nbytes[k]
        if nbytes[k]:
            best = max(best, ready[k] + lin.latency + lin.coef * prefix + suffix_fwd[k])
    with_grads = [k for k in range(n) if nbytes[k]]
    if with_grads:
        first_ready = ready[with_grads[-1]]
        best = max(best, first_ready + lin.latency + lin.coef * sum(nbytes) + suffix_fwd[with_grads[-1]])
    return best
