"""A discrete-event simulator of one data-parallel training iteration.

Timeline (t = 0 when backward starts): backward runs the layers last to first on the device; each
layer's gradients are ready when its backward ends. The network runs one all-reduce at a time
(a bucket can start once all its pieces are ready, after its `not_before` time, and when the network
is free; "fifo" plans keep list order, "priority" plans take the ready bucket with the smallest
priority). The next forward runs layers first to last and may start layer i only when every gradient
of layer i is all-reduced. The iteration time is when that forward ends: backward + forward + the
communication the schedule failed to hide. With `sync="step"` the next forward instead waits for every
all-reduce (what DDP, Horovod and an optimizer step after a global synchronize do).
A bucket that starts on an idle network and has no other bucket ready when it ends is sent alone and is
charged its cost model's `alone_extra` on top (measured lone messages, ClusterSpec.allreduce_samples_alone).
"""
from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass, field

from aiacc.core.comm.contention import message_slowdowns, slowdown_range
from aiacc.core.comm.cost import CostModel, LinearCost, concave_minorant
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
             *, validate: bool = True, sync: str = "layer") -> SimResult:
    """Run one iteration of `plan` on `cluster` and return its timeline. sync: "layer" (the next forward
    of a layer waits for that layer's gradients) or "step" (it waits for all of them)."""
    if sync not in ("layer", "step"):
        raise CommError(f"unknown sync {sync!r}; expected 'layer' or 'step'")
    cost = cost or CostModel(cluster, compression=plan.compression)
    if validate:
        plan.validate(model)
    if cluster.contended:
        return _simulate_contended(model, cluster, plan, cost, sync)
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
            idle = k == 0 or b_ready[k] > net  # the network idle before it
            start[k] = max(net, b_ready[k])
            end[k] = net = start[k] + dur[k]
            if idle and (k == nb - 1 or b_ready[k + 1] > net):  # and nothing queued behind it: sent alone
                dur[k] += cost.alone_extra(wire[k])
                end[k] = net = start[k] + dur[k]
            order.append(k)
    else:
        by_ready = sorted(range(nb), key=lambda k: (b_ready[k], k))
        heap: list[tuple[int, int]] = []
        j = 0
        idle = True  # the network idle before the next bucket starts
        while len(order) < nb:
            while j < nb and b_ready[by_ready[j]] <= net:
                k = by_ready[j]
                heapq.heappush(heap, (plan.buckets[k].priority, k))
                j += 1
            if not heap:
                net = b_ready[by_ready[j]]
                idle = True
                continue
            _, k = heapq.heappop(heap)
            start[k] = net
            end[k] = net = net + dur[k]
            if idle and not heap and (j == nb or b_ready[by_ready[j]] > net):  # sent alone
                dur[k] += cost.alone_extra(wire[k])
                end[k] = net = start[k] + dur[k]
            idle = False
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
    everything = max(done.values(), default=0.0)
    for layer in model.layers:
        need = everything if sync == "step" else max([done.get(g.name, 0.0) for g in layer.grads], default=0.0)
        s = max(t, need)
        events.append(Event("compute", f"forward {layer.name}", s, s + layer.forward_s,
                            {"waited_s": s - t} if s > t else {}))
        t = s + layer.forward_s
    return SimResult(plan.strategy, t, model.forward_s + model.backward_s, float(sum(dur)), nb, order, events)


def _simulate_contended(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel, sync: str) -> SimResult:
    """`simulate` where compute and communication share the cores: an event-driven timeline in which
    compute runs slower while an all-reduce is in flight (by `cluster.compute_slowdown`, or, where the
    cluster has measured CPU samples, by that message's own slowdown for its size and wire dtype:
    aiacc.core.comm.contention.message_slowdowns), and an
    all-reduce `cluster.comm_slowdown` times slower while compute runs. The compute lane runs backward
    (last layer first), then the next forward, each forward layer once its gradients (sync "layer") or
    all gradients (sync "step") are all-reduced; the network runs one bucket at a time as in `simulate`."""
    ns = cluster.comm_slowdown
    L = len(model.layers)
    tasks = [("backward", i) for i in range(L - 1, -1, -1)] + [("forward", i) for i in range(L)]
    nb = len(plan.buckets)
    wire = plan.wire_bytes(model)
    dur = [float(cost.time(n)) for n in wire]
    cs_of = message_slowdowns(cluster, wire, plan.compression, cost)  # compute's slowdown beside each message
    grads_of = [[g.name for g in l.grads] for l in model.layers]
    missing = [len({p.grad for p in b.pieces}) for b in plan.buckets]  # gradients a bucket still waits for
    holders: dict[str, list[int]] = {}
    for k, b in enumerate(plan.buckets):
        for g in {p.grad for p in b.pieces}:
            holders.setdefault(g, []).append(k)
    pending_of = {g: len(ks) for g, ks in holders.items()}  # buckets of a gradient not yet all-reduced
    events: list[Event] = []
    order: list[int] = []
    started = [False] * nb
    finished = 0
    t = 0.0
    ti, c_left, c_start, c_wait_from = 0, None, 0.0, None  # compute lane: task, work left (alone-seconds)
    net, n_left, n_start = None, 0.0, 0.0  # network lane: bucket in flight, work left
    n_idle, n_extended = True, False  # the bucket in flight started on an idle network; its lone cost charged
    busy = [0.0] * nb  # network seconds (alone) each bucket was charged

    def can_run(task) -> bool:
        kind, i = task
        if kind == "backward":
            return True
        if sync == "step":
            return finished == nb
        return all(pending_of.get(g, 0) == 0 for g in grads_of[i])

    def pick() -> int | None:
        ready = [k for k in range(nb) if not started[k] and missing[k] == 0 and plan.buckets[k].not_before <= t + 1e-12]
        if plan.scheduling == "fifo":
            nxt = next((k for k in range(nb) if not started[k]), None)
            return nxt if nxt in ready else None
        return min(ready, key=lambda k: (plan.buckets[k].priority, k)) if ready else None

    while ti < len(tasks) or net is not None:
        if c_left is None and ti < len(tasks):
            if can_run(tasks[ti]):
                kind, i = tasks[ti]
                layer = model.layers[i]
                c_left, c_start = (layer.backward_s if kind == "backward" else layer.forward_s), t
            elif c_wait_from is None:
                c_wait_from = t
        if net is None:
            k = pick()
            if k is not None:
                net, n_left, n_start, n_extended = k, dur[k], t, False
                busy[k] = dur[k]
                started[k] = True
                order.append(k)
        c_rate = 1.0 / cs_of[net] if net is not None else 1.0
        n_rate = 1.0 / ns if c_left is not None else 1.0
        steps = []
        if c_left is not None:
            steps.append(c_left / c_rate)
        if net is not None:
            steps.append(n_left / n_rate)
        if net is None:  # an idle network may wait for a bucket's not_before
            waits = [plan.buckets[k].not_before - t for k in range(nb)
                     if not started[k] and missing[k] == 0 and plan.buckets[k].not_before > t + 1e-12]
            steps += waits
        if not steps:
            raise CommError(f"plan {plan.strategy}: the simulation cannot progress (a bucket waits for a "
                            f"gradient no layer produces)")
        dt = max(0.0, min(steps))
        t += dt
        if c_left is not None:
            c_left -= dt * c_rate
        if net is not None:
            n_left -= dt * n_rate
        if net is not None and n_left <= 1e-12 and n_idle and not n_extended and not any(
                not started[k] and missing[k] == 0 and plan.buckets[k].not_before <= t + 1e-12 for k in range(nb)):
            # started on an idle network and nothing queued behind it: a lone message, which costs more than
            # each of a queued run (calibrate's alone samples); the network runs on for the difference
            n_left, n_extended = cost.alone_extra(wire[net]), True
            busy[net] += n_left
        if net is not None and n_left <= 1e-12:
            b = plan.buckets[net]
            events.append(Event("network", f"all-reduce #{net}", n_start, t,
                                {"bytes": wire[net], "algorithm": cost.best_algorithm(wire[net]),
                                 "tensors": sorted({p.grad for p in b.pieces})[:8], "pieces": len(b.pieces)}))
            for g in {p.grad for p in b.pieces}:
                pending_of[g] -= 1
            finished += 1
            net = None
            n_idle = False  # the next bucket starts at once if one is ready (queued), else on an idle network
            if not any(not started[k] and missing[k] == 0 and plan.buckets[k].not_before <= t + 1e-12 for k in range(nb)):
                n_idle = True
        if c_left is not None and c_left <= 1e-12:
            kind, i = tasks[ti]
            args = {"waited_s": c_start - c_wait_from} if kind == "forward" and c_wait_from is not None else {}
            events.append(Event("compute", f"{kind} {model.layers[i].name}", c_start, t, args))
            if kind == "backward":
                for g in grads_of[i]:
                    for k in holders.get(g, ()):
                        missing[k] -= 1
            ti, c_left, c_wait_from = ti + 1, None, None
    return SimResult(plan.strategy, t, model.forward_s + model.backward_s, float(sum(busy)), nb, order, events)


def contention_floor(model: ModelSpec, cluster: ClusterSpec, cost: CostModel | None = None,
                     compression: str = "none") -> float:
    """An iteration time no plan can beat where compute and communication contend (`cluster`'s
    compute_slowdown cs and comm_slowdown ns, `simulate`'s contended rules), whatever its waits.

    Split the iteration into time with both lanes busy (T_o), compute alone (T_c), network alone (T_n)
    and neither. Compute does its C = forward + backward seconds of work: T_c + T_o / cs = C; the network
    its messages' W seconds: T_n + T_o / ns = W. So T >= C + W - k T_o with k = 1/cs + 1/ns - 1, and
    T_o <= min(cs C, ns W). Where each message has its own slowdown (aiacc.core.comm.contention), cs is
    the smallest of any message of at most all the bytes (compute gets at most 1/cs of a core in any
    overlapped second) and the cs of T_o <= cs C the largest (`contention.slowdown_range`):
    T >= C + W - max(0, k) min(cs C, ns W), which does not decrease with W, so
    W may be replaced by a bound on it: every set of messages carrying all N bytes costs at least c(N)
    on a concave cost with c(0) >= 0 (subadditive; on measured costs each of `CostModel.bound_lines`
    at N, whose latency is not negative). With the network shorter than compute that is
    C + ns W (1 - 1/cs): the compute the in-flight communication takes from the cores. Without
    contention it is C + W - min(C, W) = max(C, W), which `lower_bound` already exceeds.

    The first layer's gradients (where it has any) are ready only when backward ends and are needed by
    the first forward layer, so their messages run while compute waits: T_n >= w0, the cost of those
    bytes. With T_o = ns (W - T_n): T >= C + a W + (1 - a) T_n, a = ns (1 - 1/cs); where a <= 1 that is
    at least C + a W + (1 - a) w0 (W and w0 bounded below as W is)."""
    import numpy as np
    from aiacc.core.comm.plan import COMPRESSIONS

    cost = cost or CostModel(cluster, compression=compression)
    compute = model.forward_s + model.backward_s
    if cluster.world_size == 1:
        return compute
    wire_dtype = COMPRESSIONS[compression]
    total = float(sum(g.numel * np.dtype(wire_dtype or g.dtype).itemsize for l in model.layers for g in l.grads))
    if total <= 0:
        return compute
    first = float(sum(g.numel * np.dtype(wire_dtype or g.dtype).itemsize for g in model.layers[0].grads))

    def least(nbytes: float) -> float:  # no set of messages carrying nbytes costs less
        if nbytes <= 0:
            return 0.0
        if isinstance(cost, CostModel) and cost.measured is not None:
            return max(float(line(nbytes)) for line in cost.bound_lines())
        return float(concave_minorant(cost).time(nbytes)) if isinstance(cost, CostModel) else float(cost.time(nbytes))
    w, w0 = least(total), least(first)
    # per-message slowdowns (measured CPU samples): the least any message of these bytes causes is what
    # every overlapped second costs at least; the most bounds how long compute can overlap
    cs, cs_max = slowdown_range(cluster, total, compression, cost if isinstance(cost, CostModel) else None)
    ns = cluster.comm_slowdown
    k = 1.0 / cs + 1.0 / ns - 1.0
    floor = compute + w - max(0.0, k) * min(cs_max * compute, ns * w)
    a = ns * (1.0 - 1.0 / cs)
    if a <= 1.0:
        floor = max(floor, compute + a * w + (1.0 - a) * w0)
    return floor


def lower_bound(model: ModelSpec, cluster: ClusterSpec, cost: CostModel | None = None,
                compression: str = "none", *, subdivisions: int = 16, sync: str = "layer",
                contention: bool = False) -> float:
    """An iteration time no plan can beat on this model under the cost model (`simulate`'s rules).
    sync "layer" (default): any plan with either wait (a per-layer wait is never slower than a global
    one); sync "step": plans whose next forward waits for every all-reduce (see the end).
    By default the bound ignores `cluster`'s contention (a bound without it is a bound with it:
    contention only adds time); `contention=True` also takes `contention_floor`, the bound that
    charges the measured contention.
    On a link that banks idle time (`cluster.banked_s`, a token bucket: not simulated) the bound is
    the flat link's less banked_s, at least the compute: a measured step may beat the rate by that much.

    Notation: ready[k] is when layer k's backward ends, F[k] the forward of layers k..end, P[k] the
    bytes of layers 0..k, N all bytes; k0 / kl are the first / last layers with gradients, so
    r_last = ready[k0] is when the last gradient is ready and r_first = ready[kl] the first;
    R(x) is the earliest time at which x bytes of gradients are ready.
    c(n) = cost.time(n) is a minimum of affine functions of n, hence concave and non-decreasing.
    Write c(n) = b * n + h(n) with b the smallest per-byte cost of any algorithm: h is concave,
    non-decreasing and h(0) = g0 >= 0 (the smallest latency). Two facts about messages of n_1..n_K
    bytes (sum N, largest x) on the serial network:
        (S) h - g0 is concave and 0 at 0, so subadditive:  sum h(n_i) >= (K - 1) g0 + h(N)
        (X) h(n)/n does not increase (concave, h(0) >= 0):  sum h(n_i) >= N h(x) / x
        (Y) the largest alone, (S) on the others:          sum h(n_i) >= h(x) + (K - 2) g0 + h(N - x)
    Every schedule (a) runs all compute; (b) for each layer k, sends the bytes of layers 0..k in
    messages that start after ready[k], which end no earlier than ready[k] + c(P[k]) by (S), before
    the forward of the layer they feed (index <= k), so F[k] remains. (c) Let M_1..M_K be the messages
    in network order and M_j the last one carrying bytes of layer k0. The network ends at
        E >= start(M_1) + sum c(n_i) >= r_first + b N + max of the three sums    by (S), (X), (Y)
    and also E >= R(x) + c(x): the largest message starts once its x bytes are ready. The forward of k0
    starts after M_j; the forward of some layer <= kl starts after M_K. One of these cases holds:
        K = 1:            M_1 starts after r_last     T >= r_last + c(N) + F[k0]
        K >= 2, j = K:                                 T >= E(K >= 2) + F[k0]
        K >= 2, j = 1:    M_1 starts after r_last     T >= r_last + g0 + c(N) + F[kl]
        K >= 3, 1<j<K:                                 T >= E(K >= 3) + F[kl]
    (the last two need k0 != kl). E(K >= m) is the smallest over x of the larger of the two bounds on
    E. On a piece (y0, y1] of the ready curve (R constant there) each term is bounded by its value at
    an end: h(x) >= h(y0), h(N - x) >= h(N - y1), N h(x)/x >= N h(y1)/y1, R(x) + c(x) >= R + c(y0);
    the pieces split each layer's bytes into `subdivisions`. T is at least the smallest case.
    c(N) is the cheapest single algorithm for all the bytes: no message pays the smallest latency of
    one algorithm and the smallest per-byte cost of another. tests/core/comm checks the bound against
    every plan of small models by brute force. On measured costs: the larger of the bounds on the lines
    of `CostModel.bound_lines` (each below every interpolated cost).
    With sync "step" every forward layer starts after the last message, at E: T >= E + F[0], where
    E >= r_last + c(N) for K = 1 and E >= E(K >= 2) otherwise (E(K >= m) grows with m), and for each k
    T >= ready[k] + c(P[k]) + F[0]. A block of n steps timed up to the end of its last update (a
    per-layer wait has nothing to overlap with after the last backward) lasts at least
    (n - 1) * the "layer" bound + the "step" bound.
    """
    if sync not in ("layer", "step"):
        raise CommError(f"unknown sync {sync!r}; expected 'layer' or 'step'")
    import numpy as np
    from aiacc.core.comm.plan import COMPRESSIONS

    cost = cost or CostModel(cluster, compression=compression)
    if cluster.banked_s > 0 and cluster.world_size > 1:
        # a token-bucket link (ClusterSpec.banked_s, which the simulator does not model) carries up to
        # banked_s more wire time than its rate allows after idle time: once per iteration at most (the
        # tokens refill at the rate, so over a run the wire never beats it; within an iteration the burst
        # banked while it idled goes at line rate). Every bound above grows by at most one second per
        # second of wire time, so less that is still a bound; and never less than the compute
        # (measured at 100 Mbit/s, tbf banking 34 ms: an fp16 ResNet step 3% under the bound without this)
        flat = dataclasses.replace(cluster, banked_s=0.0)
        b = lower_bound(model, flat, cost, compression, subdivisions=subdivisions, sync=sync, contention=contention)
        return max(model.forward_s + model.backward_s, b - cluster.banked_s)
    if contention and cluster.contended:
        return max(lower_bound(model, cluster, cost, compression, subdivisions=subdivisions, sync=sync),
                   contention_floor(model, cluster, cost, compression))
    if cluster.world_size == 1:
        return model.forward_s + model.backward_s
    # the argument below needs a concave cost; measured (interpolated) costs are bounded by each line
    # below every sample (CostModel.bound_lines): the bound on either is a bound, so the larger one
    if isinstance(cost, CostModel) and cost.measured is not None:
        return max(lower_bound(model, cluster, LinearCost(line), compression, subdivisions=subdivisions, sync=sync)
                   for line in cost.bound_lines())
    cost = concave_minorant(cost) if isinstance(cost, CostModel) else cost
    c = lambda n: float(cost.time(float(n)))
    b = cost.bound_terms().coef
    h = lambda n: c(n) - b * n
    g0 = c(0.0)
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
    if sync == "step":  # no layer's forward starts before the last message has ended
        suffix_fwd = [suffix_fwd[0]] * (n + 1)
    best = model.forward_s + model.backward_s
    prefix = 0
    for k in range(n):
        prefix += nbytes[k]
        if nbytes[k]:
            best = max(best, ready[k] + c(prefix) + suffix_fwd[k])
    with_grads = [k for k in range(n) if nbytes[k]]
    if not with_grads:
        return best
    k0, kl = with_grads[0], with_grads[-1]
    r_last, r_first, total = ready[k0], ready[kl], float(sum(nbytes))

    def network_end(min_messages: int) -> float:
        fixed = r_first + b * total
        floor_s = (min_messages - 1) * g0 + h(total)
        out, done = float("inf"), 0.0
        for k in reversed(with_grads):  # ready order: R(x) = ready[k] for x in (done, done + nbytes[k]]
            ys = np.linspace(done, done + nbytes[k], subdivisions + 1)
            for y0, y1 in zip(ys[:-1], ys[1:]):
                spread = max(total * h(y1) / y1, h(y0) + h(total - y1) + (min_messages - 2) * g0)
                out = min(out, max(fixed + max(spread, floor_s), ready[k] + c(y0)))
            done += nbytes[k]
        return out

    cases = [r_last + c(total) + suffix_fwd[k0], network_end(2) + suffix_fwd[k0]]
    if k0 != kl and sync == "layer":  # (with "step" these cases are above network_end(2) + F[0])
        cases += [r_last + g0 + c(total) + suffix_fwd[kl], network_end(3) + suffix_fwd[kl]]
    return max(best, min(cases))
