"""Communication strategies. Each turns a ModelSpec into a Plan; all run on the same simulator.

per_tensor      one all-reduce per gradient, in the order backward produces them.
horovod         Horovod's tensor fusion: every `cycle_s` the background loop fuses the gradients that
                became ready into buffers of at most 64 MB, sent in order.
ddp             PyTorch DistributedDataParallel: gradients in reverse parameter order packed into
                buckets (1 MB for the first, then 25 MB), each sent when all its gradients are ready.
bytescheduler   ByteScheduler: tensors cut into partitions (4 MB), no fusion, and the network always
                sends the ready partition whose layer the next forward needs first.
aiacc           aiacc's plan: for several partition sizes, bucket boundaries chosen by dynamic
                programming over the gradient order (minimising when each prefix of the gradients has
                been all-reduced), scheduled FIFO or by priority; every candidate, and the plans of
                the strategies above, is run through the simulator and the fastest one is kept, then
                improved by hill-climbing (merge neighbours, cut a bucket, shift a boundary). Plans are judged by
    the simulator with the contention of `cluster` and the executor's `sync` ("step": the next forward
    waits for every bucket, as after a global synchronize; "layer": per layer).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

from aiacc.core.comm.cost import CostModel
from aiacc.core.comm.errors import CommError
from aiacc.core.comm.plan import COMPRESSIONS, Bucket, Piece, Plan
from aiacc.core.comm.simulate import SimResult, lower_bound, simulate
from aiacc.core.comm.spec import ClusterSpec, ModelSpec

MB = 1 << 20


def _itemsize(g, compression: str) -> int:
    return np.dtype(COMPRESSIONS[compression] or g.dtype).itemsize


def per_tensor(model: ModelSpec, cluster: ClusterSpec | None = None, *, compression: str = "none") -> Plan:
    buckets = tuple(Bucket((Piece(g.name, 0, g.numel),), priority=i)
                    for g, _, i in model.backward_order())
    return Plan("per-tensor", buckets, "fifo", compression)


def horovod(model: ModelSpec, cluster: ClusterSpec | None = None, *, threshold: int = 64 * MB,
            cycle_s: float = 5e-3, compression: str = "none") -> Plan:
    """Horovod tensor fusion (HOROVOD_FUSION_THRESHOLD=64 MB, HOROVOD_CYCLE_TIME=5 ms)."""
    buckets: list[Bucket] = []
    cur: list[Piece] = []
    cur_bytes = 0
    cur_tick = None
    for g, ready, layer in model.backward_order():
        tick = math.ceil(ready / cycle_s - 1e-9) * cycle_s if cycle_s > 0 else ready
        nbytes = g.numel * _itemsize(g, compression)
        if cur and (tick != cur_tick or cur_bytes + nbytes > threshold):
            buckets.append(Bucket(tuple(cur), 0, cur_tick))
            cur, cur_bytes = [], 0
        cur.append(Piece(g.name, 0, g.numel))
        cur_bytes += nbytes
        cur_tick = tick
    if cur:
        buckets.append(Bucket(tuple(cur), 0, cur_tick))
    return Plan("horovod", tuple(buckets), "fifo", compression,
                params={"threshold": threshold, "cycle_s": cycle_s})


def ddp(model: ModelSpec, cluster: ClusterSpec | None = None, *, bucket_cap: int = 25 * MB,
        first_bucket_cap: int = 1 * MB, compression: str = "none") -> Plan:
    """torch DDP's bucketing (bucket_cap_mb=25, first bucket 1 MB), gradients in reverse parameter order."""
    buckets: list[Bucket] = []
    cur: list[Piece] = []
    cur_bytes = 0
    for g, _, layer in model.backward_order():
        cap = first_bucket_cap if not buckets else bucket_cap
        cur.append(Piece(g.name, 0, g.numel))
        cur_bytes += g.numel * _itemsize(g, compression)
        if cur_bytes >= cap:
            buckets.append(Bucket(tuple(cur)))
            cur, cur_bytes = [], 0
    if cur:
        buckets.append(Bucket(tuple(cur)))
    return Plan("ddp", tuple(buckets), "fifo", compression,
                params={"bucket_cap": bucket_cap, "first_bucket_cap": first_bucket_cap})


def _pieces(model: ModelSpec, partition_bytes: float | None, compression: str):
    """(piece, ready time, layer index, wire bytes) in backward order, tensors cut at partition_bytes."""
    out = []
    for g, ready, layer in model.backward_order():
        item = _itemsize(g, compression)
        step = g.numel if not partition_bytes else max(1, int(partition_bytes // item))
        for s in range(0, g.numel, step):
            e = min(g.numel, s + step)
            out.append((Piece(g.name, s, e), ready, layer, (e - s) * item))
    return out


def after_backward(model: ModelSpec, cluster: ClusterSpec | None = None, *, threshold: int = 64 * MB,
                   compression: str = "none") -> Plan:
    """Horovod's fusion as its users most often see it on a fast link: every gradient fused into buffers
    of at most `threshold` bytes (backward order), all sent once backward has ended (`not_before` the
    backward's end; the plan's params say "after_backward", which the executor holds to): no
    communication beside backward, so no contention with it, at the price of no overlap."""
    end = model.backward_s
    buckets: list[Bucket] = []
    cur: list[Piece] = []
    cur_bytes = 0
    for g, _, _ in model.backward_order():
        nbytes = g.numel * _itemsize(g, compression)
        if cur and cur_bytes + nbytes > threshold:
            buckets.append(Bucket(tuple(cur), 0, end))
            cur, cur_bytes = [], 0
        cur.append(Piece(g.name, 0, g.numel))
        cur_bytes += nbytes
    if cur:
        buckets.append(Bucket(tuple(cur), 0, end))
    return Plan("horovod", tuple(buckets), "fifo", compression,
                params={"threshold": threshold, "after_backward": True})


def bytescheduler(model: ModelSpec, cluster: ClusterSpec | None = None, *, partition: int = 4 * MB,
                  compression: str = "none") -> Plan:
    buckets = tuple(Bucket((p,), priority=layer) for p, _, layer, _ in _pieces(model, partition, compression))
    return Plan("bytescheduler", buckets, "priority", compression, params={"partition": partition})


def dp_buckets(pieces, cost: CostModel, cap: float | None = None) -> list[tuple[int, int]]:
    """Split `pieces` (in ready order) into consecutive buckets minimising when the last one is done.

    F[i] = min over j of max(F[j], ready[i-1]) + cost(bytes[j:i]) is the earliest time the first i
    pieces can have been all-reduced by FIFO buckets. F is non-decreasing in the earlier finish time,
    so keeping the best F for every prefix is optimal. `cap` limits a bucket's bytes (keeps buckets
    small enough for priority scheduling); a single piece always fits.
    """
    m = len(pieces)
    ready = np.array([r for _, r, _, _ in pieces])
    csum = np.concatenate([[0.0], np.cumsum([b for _, _, _, b in pieces])])
    F = np.zeros(m + 1)
    arg = np.zeros(m + 1, dtype=np.int64)
    for i in range(1, m + 1):
        j0 = 0
        if cap:
            # smallest j with bytes[j:i] <= cap, but at least the single piece i-1
            j0 = min(i - 1, int(np.searchsorted(csum, csum[i] - cap, side="left")))
        js = np.arange(j0, i)
        cand = np.maximum(F[js], ready[i - 1]) + cost.time(csum[i] - csum[js])
        k = int(np.argmin(cand))
        F[i] = cand[k]
        arg[i] = js[k]
    spans = []
    i = m
    while i > 0:
        spans.append((int(arg[i]), i))
        i = int(arg[i])
    return spans[::-1]


def dp_plan(model: ModelSpec, cluster: ClusterSpec, *, partition: float | None = None, cap: float | None = None,
            scheduling: str = "priority", compression: str = "none", cost: CostModel | None = None) -> Plan:
    """Buckets from `dp_buckets` over the gradients cut at `partition` bytes."""
    cost = cost or CostModel(cluster, compression=compression)
    pieces = _pieces(model, partition, compression)
    buckets = tuple(Bucket(tuple(p for p, _, _, _ in pieces[j:i]), priority=min(l for _, _, l, _ in pieces[j:i]))
                    for j, i in dp_buckets(pieces, cost, cap))
    return Plan("aiacc", buckets, scheduling, compression,
                params={"partition": partition, "cap": cap, "scheduling": scheduling})


DDP_DEFAULT_MB = 25  # torch DDP's bucket_cap_mb
DDP_SWEEP_MB = (1, 2, 5, 10, 25, 50)  # DDP bucket caps the planner tries (DDP's best of a sweep, as a user tunes it)
HOROVOD_MB = 64  # Horovod's default fusion threshold (HOROVOD_FUSION_THRESHOLD)


def _required_gain(step_s: float, latency_s: float, margin: float, banked_s: float = 0.0) -> float:
    """The predicted gain (seconds) a plan needs over a DDP-like one on measured costs: `margin` of the
    step, one message's latency (a gain that small is within the cost of the one message more a plan
    of aiacc's own sends at least), and the idle wire time the link banks (ClusterSpec.banked_s: a
    token bucket sends after idle time at line rate, so overlap that fills idle wire time gains nothing
    up to that much)."""
    return max(margin * step_s, latency_s, banked_s)


def ddp_layout(model: ModelSpec, cap_mb: float = DDP_DEFAULT_MB, compression: str = "none", *,
               first_mb: float = 1.0) -> Plan:
    """DDP's bucketing of `model`'s gradients (`ddp`: buckets of `cap_mb` MB, the first `first_mb` MB (DDP's
    default 1 MB; torch 2.x DDP given bucket_cap_mb caps its first bucket at that size), gradients in
    the order the spec's backward makes them ready, the order DDP rebuilds its buckets in after its first
    step) as an "aiacc" plan whose params say where it comes from ({"from": "ddp", "bucket_cap": ...}):
    the layout the planner falls back to (`safe_family`, planning's DDP-default guard) and the one
    benchmarks/dp.py --same-plan runs on aiacc's engine, built here once for all of them."""
    p = ddp(model, bucket_cap=int(cap_mb * MB), first_bucket_cap=int(first_mb * MB), compression=compression)
    return Plan("aiacc", p.buckets, p.scheduling, compression, params={"from": "ddp", **p.params})


def is_ddp_default(plan: Plan, model: ModelSpec) -> bool:
    """Whether `plan` runs DDP's default bucketing of `model` (`ddp_layout`'s buckets, whatever its params
    say: a plan refined from that layout keeps its params but not its buckets)."""
    return plan.buckets == ddp_layout(model, DDP_DEFAULT_MB, plan.compression).buckets


def safe_family(model: ModelSpec, cluster: ClusterSpec | None = None, compression: str = "none") -> list[Plan]:
    """The plans a fallback may run instead of aiacc's own (as "aiacc" plans whose params say where
    they come from): DDP's bucketing at every cap of DDP_SWEEP_MB (`ddp_layout`), and Horovod's 64 MB
    fusion after backward (`after_backward`: where contention makes overlap with backward cost more
    than it hides, no overlap is the safe plan)."""
    out = [ddp_layout(model, cap, compression) for cap in DDP_SWEEP_MB]
    p = after_backward(model, cluster, threshold=HOROVOD_MB * MB, compression=compression)
    out.append(Plan("aiacc", p.buckets, p.scheduling, compression, params={"from": "horovod", **p.params}))
    return out


def safe_label(plan: Plan) -> str:
    """How a plan of `safe_family` is named in notes."""
    if "bucket_cap" in plan.params:
        cap = plan.params["bucket_cap"] / MB
        return f"DDP-like buckets of {cap:g} MB" + (" (DDP's default)" if cap == DDP_DEFAULT_MB else "")
    return f"Horovod-like {plan.params.get('threshold', HOROVOD_MB * MB) / MB:g} MB fusion after backward"


def _safe_pick(safe: list[Plan], results: list[SimResult], latency_s: float, margin: float,
               banked_s: float) -> int:
    """Index of the safe plan to fall back to: DDP's default bucketing unless another safe plan is
    predicted faster than it by the required gain (`_required_gain`), then the fastest."""
    default = next(i for i, p in enumerate(safe) if p.params.get("bucket_cap") == DDP_DEFAULT_MB * MB)
    d = min(range(len(safe)), key=lambda i: (results[i].iteration_s, results[i].messages))
    need = _required_gain(results[default].iteration_s, latency_s, margin, banked_s)
    return d if results[default].iteration_s - results[d].iteration_s > need else default


SIZE_LADDER = 6  # aiacc_search's bucket sizes also include the gradient bytes / 2, / 4, ... / 2**SIZE_LADDER


def aiacc_search(model: ModelSpec, cluster: ClusterSpec, *, compression: str = "none",
                 cost: CostModel | None = None, baselines: bool = True, refine_rounds: int = 40,
                 sync: str = "layer", fallback_margin: float = 0.0) -> tuple[Plan, SimResult, list[SimResult]]:
    """aiacc's planner: simulate every candidate plan and keep the fastest.

    Candidates: dynamic-programming buckets (unbounded, and capped at sizes around the point where a
    message's latency is a few percent of its transfer time) over whole tensors and over partitions,
    each scheduled by priority and FIFO; with `baselines`, the other strategies' plans too, and DDP's
    bucketing at every cap of DDP_SWEEP_MB, so aiacc is never slower on the simulator than them nor than
    DDP with its best bucket size. The winner is then refined by `refine` (hill-climbing on bucket
    boundaries against the simulated timeline).

    fallback_margin: where the costs are measured (and so uncertain), a plan of aiacc's own must beat
    the best safe plan (`safe_family`: the DDP sweep and Horovod's 64 MB fusion after backward) by more
    than this fraction of the step, else that safe plan is returned (fewer, larger messages: the safer
    choice when the model says aiacc cannot win); its `notes` say so; that safe plan is DDP's default
    bucketing (DDP_DEFAULT_MB) unless another safe plan is predicted faster than it by the same margin. Each gain must also exceed one
    message's latency (the smallest sample's time) and the idle wire time the link banks
    (`ClusterSpec.banked_s`): that much of a prediction is the model's own error (overlap under
    contention, or idle wire time a token bucket makes up for, do not behave as simulated). Where DDP's
    default is the safe plan and its step minus the lower bound (what any plan could gain) is below that,
    the search is skipped and DDP's default returned. Returns (plan, its result, all results)."""
    cost = cost or CostModel(cluster, compression=compression)
    lin = cost.bound_terms()
    total = max(1, sum(g.numel for g in model.gradients()) * 4)
    safe = safe_family(model, cluster, compression) if baselines else []
    if safe and fallback_margin > 0:
        # where no plan can gain enough over the safe plan to pass the fallback's test below (its step
        # minus the lower bound is at most the gain of any plan), the search cannot change the outcome:
        # skip it (a short step re-planned inside training pays the search's time)
        safe_res = [simulate(model, cluster, p, cost, validate=False, sync=sync) for p in safe]
        # (only where DDP's default is the safe plan: where another safe plan beats it by the margin, the
        # search runs and the fallback below chooses between that plan and aiacc's own)
        d = _safe_pick(safe, safe_res, lin.latency, fallback_margin, cluster.banked_s)
        room = safe_res[d].iteration_s - lower_bound(model, cluster, cost, compression)
        if safe[d].params.get("bucket_cap") == DDP_DEFAULT_MB * MB and \
                room <= _required_gain(safe_res[d].iteration_s, lin.latency, fallback_margin, cluster.banked_s):
            notes = (f"fallback to {safe_label(safe[d])}: at most {room * 1e3:.2f} ms of the "
                     f"{safe_res[d].iteration_s * 1e3:.2f} ms step to gain (its lower bound), not more than the "
                     f"{fallback_margin:.0%} margin, one message's latency ({lin.latency * 1e3:.2f} ms) and the "
                     f"link's banked idle time ({cluster.banked_s * 1e3:.2f} ms)")
            best = dataclasses.replace(safe[d], notes=notes, params={**safe[d].params, "fallback": True})
            return best, safe_res[d], [safe_res[d]]
    # the size at which latency is 1/16 of the transfer; scan a factor of 64 around it
    knee = lin.latency / lin.coef * 16 if lin.coef > 0 else total
    sizes = {float(max(64 * 1024, min(total, knee * 2.0 ** e))) for e in range(-3, 4)}
    # and the model's gradient bytes halved up to SIZE_LADDER times: on measured samples the bound line's
    # slope can be far below the link's rate (a large latency intercept under samples that rise with size),
    # which put the knee at 80 MB for an 11 MB ResNet at 1 Gbit/s and every scanned size at the whole model,
    # so no plan of small buckets (the ones per-layer waits need) was a candidate: 146 ms found, where a
    # 9-bucket priority plan ran 136 on the same link
    sizes |= {float(total / 2 ** k) for k in range(1, SIZE_LADDER + 1) if total / 2 ** k >= 64 * 1024}
    sizes = sorted(sizes)
    candidates: list[Plan] = []
    for scheduling in ("priority", "fifo"):
        candidates.append(dp_plan(model, cluster, partition=None, cap=None, scheduling=scheduling,
                                  compression=compression, cost=cost))
        for s in sizes:
            candidates.append(dp_plan(model, cluster, partition=s, cap=s, scheduling=scheduling,
                                      compression=compression, cost=cost))
            candidates.append(dp_plan(model, cluster, partition=None, cap=s, scheduling=scheduling,
                                      compression=compression, cost=cost))
    ddp_like: list[int] = []
    if baselines:
        for name, make in STRATEGIES.items():
            if name != "aiacc":
                p = make(model, cluster, compression=compression)
                candidates.append(Plan("aiacc", p.buckets, p.scheduling, compression, params={"from": name, **p.params}))
        ddp_like = list(range(len(candidates), len(candidates) + len(safe)))
        candidates.extend(safe)
    results = [simulate(model, cluster, p, cost, validate=False, sync=sync) for p in candidates]
    k = min(range(len(results)), key=lambda i: (results[i].iteration_s, results[i].messages))
    best, best_res = refine(model, cluster, candidates[k], results[k], cost, rounds=refine_rounds, sync=sync)
    if ddp_like and fallback_margin > 0:
        # two steps, each needing the margin: aiacc's own plan over the best safe plan, and a safe plan
        # other than DDP's default (25 MB) over that default, so that what runs is DDP's own bucketing
        # unless the measured model predicts a clear gain
        lat = lin.latency
        d = ddp_like[_safe_pick(safe, [results[i] for i in ddp_like], lat, fallback_margin, cluster.banked_s)]
        need = _required_gain(results[d].iteration_s, lat, fallback_margin, cluster.banked_s)
        # the predicted gain is within the margin, one message's latency or the link's banked idle time:
        # about the model's own error where overlap may not happen as simulated (on one core per rank
        # gloo's thread competes with backward; a token bucket makes up for idle wire time)
        # (also where the winner was refined from that safe plan itself: its refinement needs the margin too)
        if results[d].iteration_s - best_res.iteration_s <= need and best.buckets != candidates[d].buckets:
            gain = 1 - best_res.iteration_s / results[d].iteration_s
            p = candidates[d]
            is_default = p.params.get("bucket_cap") == DDP_DEFAULT_MB * MB
            best = Plan("aiacc", p.buckets, p.scheduling, compression,
                        notes=f"fallback to {safe_label(p)}: the measured "
                              f"model predicts aiacc's own plan ({len(best.buckets)} buckets) only "
                              f"{gain:+.1%} faster, within the {fallback_margin:.0%} margin, one message's latency "
                              f"({lat * 1e3:.2f} ms) or the link's banked idle time "
                              f"({cluster.banked_s * 1e3:.2f} ms)"
                              + ("" if not is_default else f" (and no other safe plan {fallback_margin:.0%} faster "
                                                           f"than DDP's default)"),
                        params={**p.params, "fallback": True})
            best_res = results[d]
    return best, best_res, results + [best_res]


def _split(bucket: Bucket, layer_of: dict[str, int], frac: float = 0.5) -> tuple[Bucket, Bucket] | None:
    """Cut a bucket after `frac` of its elements (cutting a piece if needed); None if a side is empty."""
    total = bucket.numel
    cut_at, acc = int(total * frac), 0
    if not 0 < cut_at < total:
        return None
    left: list[Piece] = []
    right: list[Piece] = []
    for p in bucket.pieces:
        if acc >= cut_at:
            right.append(p)
        elif acc + p.numel <= cut_at:
            left.append(p)
        else:
            cut = p.start + (cut_at - acc)
            left.append(Piece(p.grad, p.start, cut))
            right.append(Piece(p.grad, cut, p.stop))
        acc += p.numel
    prio = lambda ps: min(layer_of[q.grad] for q in ps)
    return (Bucket(tuple(left), prio(left), bucket.not_before), Bucket(tuple(right), prio(right), bucket.not_before))


def _merge(a: Bucket, b: Bucket) -> Bucket:
    return Bucket(a.pieces + b.pieces, min(a.priority, b.priority), max(a.not_before, b.not_before))


def _moves(b: list[Bucket], layer_of: dict[str, int]):
    """Neighbouring plans: merge two neighbours, cut one bucket (at 1/4, 1/2, 3/4), or move a quarter
    or half of a bucket into its neighbour (shifts a boundary)."""
    for k in range(len(b) - 1):
        yield b[:k] + [_merge(b[k], b[k + 1])] + b[k + 2:]
        for f in (0.25, 0.5):
            h = _split(b[k + 1], layer_of, f)
            if h:
                yield b[:k] + [_merge(b[k], h[0]), h[1]] + b[k + 2:]
            h = _split(b[k], layer_of, 1 - f)
            if h:
                yield b[:k] + [h[0], _merge(h[1], b[k + 1])] + b[k + 2:]
    for k in range(len(b)):
        for f in (0.25, 0.5, 0.75):
            h = _split(b[k], layer_of, f)
            if h:
                yield b[:k] + list(h) + b[k + 1:]


def refine(model: ModelSpec, cluster: ClusterSpec, plan: Plan, result: SimResult, cost: CostModel,
           rounds: int = 40, sync: str = "layer") -> tuple[Plan, SimResult]:
    """Hill-climb on the simulated iteration time: take the best neighbouring plan (`_moves`) while it
    helps, at most `rounds` times."""
    layer_of = {g.name: i for i, l in enumerate(model.layers) for g in l.grads}
    start = plan
    for _ in range(rounds):
        best = None
        for m in _moves(list(plan.buckets), layer_of):
            cand = Plan(plan.strategy, tuple(m), plan.scheduling, plan.compression, plan.notes, plan.params)
            r = simulate(model, cluster, cand, cost, validate=False, sync=sync)
            if r.iteration_s < (best[1].iteration_s if best else result.iteration_s) - 1e-9:
                best = (cand, r)
        if best is None:
            break
        plan, result = best
    if plan is not start:  # its buckets are no longer those its params describe (e.g. DDP's at some cap)
        plan = dataclasses.replace(plan, params={**plan.params, "refined": True})
    return plan, result


def aiacc(model: ModelSpec, cluster: ClusterSpec, *, compression: str = "none", sync: str = "layer",
          fallback_margin: float = 0.0) -> Plan:
    """aiacc's plan (`aiacc_search`) for an executor whose next forward waits per layer or per step."""
    return aiacc_search(model, cluster, compression=compression, sync=sync, fallback_margin=fallback_margin)[0]


STRATEGIES: dict[str, Callable[..., Plan]] = {
    "per-tensor": per_tensor,
    "horovod": horovod,
    "ddp": ddp,
    "bytescheduler": bytescheduler,
    "aiacc": aiacc,
}


def make_plan(strategy: str, model: ModelSpec, cluster: ClusterSpec, **kw) -> Plan:
    """The plan of a named strategy (see STRATEGIES)."""
    try:
        make = STRATEGIES[strategy]
    except KeyError:
        raise CommError(f"unknown communication strategy {strategy!r}; expected one of {sorted(STRATEGIES)}") from None
    return make(model, cluster, **kw)


def compare(model: ModelSpec, cluster: ClusterSpec, *, compression: str = "none") -> dict[str, SimResult]:
    """Simulated iteration of every strategy on one model and cluster."""
    cost = CostModel(cluster, compression=compression)
    return {name: simulate(model, cluster, make_plan(name, model, cluster, compression=compression), cost)
            for name in STRATEGIES}
