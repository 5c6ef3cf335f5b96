"""Data-parallel gradient communication for torch modules, driven by an aiacc communication plan.

`GradientScheduler` hooks every parameter (`register_post_accumulate_grad_hook`): when backward has
finished a gradient, the scheduler marks it ready, and each bucket of the plan starts its all-reduce
(asynchronously, on torch.distributed) as soon as it is full, in the plan's issue order, so
communication overlaps the rest of backward. The first time a gradient is ready it is copied into its
bucket's flat buffer and `param.grad` becomes a view of it (DDP's gradient_as_bucket_view): from then on
autograd accumulates into the buffer that is all-reduced in place (the DistributedOptimizer's zero_grad
zeroes such a view in place instead of dropping it; a gradient dropped otherwise costs one copy per
step, as in DDP). `synchronize()` waits for the all-reduces and leaves the
averaged gradients in `.grad`. The Horovod-compatible API (`aiacc.plugins.torch.horovod`) is built on it.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from aiacc.core.comm import ModelSpec, Plan, gradient_specs_from_params
from aiacc.core.comm import CommError
from aiacc.distributed.compression import check as check_compression
from aiacc.distributed.executor import PlanExecutor
from aiacc.distributed.planning import plan_for
from aiacc.distributed.process import collective, require
from aiacc.distributed.transport import check_same


def spec_from_stamps(named: Sequence[tuple[str, torch.Tensor]], stamps: dict[str, float],
                     backward_start: float | None = None, forward_s: float | None = None,
                     name: str = "model") -> ModelSpec:
    """A ModelSpec whose timing comes from when backward produced each gradient (`stamps`, seconds).

    The layers are listed in the reverse of the order in which backward finished them (ties: the
    parameters' order): the simulator runs backward from the last layer to the first and the next
    forward from the first, and the modules' registration order is not the order they run in (a
    post-norm transformer layer registers norm1 after linear2, but backward produces its gradient after
    linear1's: listed in registration order, the plan would take norm1's gradient as ready ~40 ms
    early and hold the first bucket, and every bucket after it, that long). A layer's backward time is
    the gap between its gradients and those produced before it; without `backward_start` the first
    layer gets the median gap. Forward time (total `forward_s`, default half the backward) is spread
    over layers in proportion to their backward time."""
    entries = [(n, p.shape, p.dtype) for n, p in named]
    spec = gradient_specs_from_params(entries, name=name)
    last = max(stamps.values(), default=0.0)
    ends = [max(stamps.get(g.name, last) for g in l.grads) for l in spec.layers]
    # forward order: the layer backward finished last first (a stable sort keeps registration order on ties)
    layers = sorted(range(len(ends)), key=lambda i: -ends[i])
    entries = [(g.name, g.shape, dtype_of[g.name]) for dtype_of in [{n: d for n, _, d in entries}]
               for i in layers for g in spec.layers[i].grads]
    ends = [ends[i] for i in layers]
    order = list(range(len(ends) - 1, -1, -1))  # backward's order: the last listed layer first
    bwd = [0.0] * len(ends)
    for a, b in zip(order, order[1:]):
        bwd[b] = max(0.0, ends[b] - ends[a])
    gaps = sorted(bwd[i] for i in order[1:]) or [1e-4]
    bwd[order[0]] = ends[order[0]] - backward_start if backward_start is not None else gaps[len(gaps) // 2]
    total_b = sum(bwd) or 1.0
    total_f = total_b / 2 if forward_s is None else forward_s
    fwd = [total_f * b / total_b for b in bwd]
    return gradient_specs_from_params(entries, name=name, forward_s=fwd, backward_s=bwd)


PROFILE_STEPS = 4  # steps timed before the plan is remade from their profile (the first is a warm-up)
# with contention profiling (GradientScheduler's profile_contention), what each profiled step runs:
# "warm-up" (not used), "quiet" (no all-reduce starts before backward has ended: compute alone) and
# "busy" (the probe plan's buckets in flight beside backward); quiet steps on both sides of the busy one
CONTENTION_PATTERN = ("warm-up", "quiet", "busy", "quiet")


def backward_span(stamps: dict[str, float]) -> float:
    """Seconds from a step's first gradient ready to its last (what its hooks saw of backward)."""
    return max(stamps.values()) - min(stamps.values()) if len(stamps) > 1 else 0.0


def probe_plan(spec: ModelSpec, parts: int = 8):
    """The plan the contention-profiling steps run: DDP's bucketing with buckets of about 1/`parts` of
    the gradients' bytes (1 MB to 25 MB), so that buckets are in flight beside most of backward (DDP's
    default 25 MB puts a 10 MB model's gradients in one bucket after backward: a busy step would then
    say nothing about contention)."""
    from aiacc.core.comm.strategies import DDP_DEFAULT_MB, MB, ddp

    total = sum(g.nbytes for g in spec.gradients())
    cap = int(min(DDP_DEFAULT_MB * MB, max(MB, total // parts)))
    return ddp(spec, bucket_cap=cap)


def median_spec(specs: Sequence[ModelSpec]) -> ModelSpec:
    """The layer-by-layer median of the compute times of several profiles of the same model."""
    import statistics

    from aiacc.core.comm import Layer

    first = specs[0]
    # layers matched by name (each profile lists them in the order its backward finished them), in the
    # first profile's order
    by_name = [{l.name: l for l in s.layers} for s in specs]
    return ModelSpec(first.name, tuple(
        Layer(l.name, statistics.median(s[l.name].forward_s for s in by_name),
              statistics.median(s[l.name].backward_s for s in by_name), l.grads)
        for l in first.layers))


def profile_backward(module: torch.nn.Module, loss_fn, name: str = "model") -> ModelSpec:
    """A ModelSpec with measured timing: runs one forward/backward (`loss_fn(module)` returns the loss)
    and records when each parameter's gradient is produced."""
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    stamps: dict[str, float] = {}

    def stamp(name: str):
        def hook(_param) -> None:  # a post-accumulate hook must return None
            stamps.setdefault(name, time.perf_counter())
        return hook

    handles = [p.register_post_accumulate_grad_hook(stamp(n)) for n, p in params]
    try:
        t0 = time.perf_counter()
        loss = loss_fn(module)
        t1 = time.perf_counter()
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    module.zero_grad(set_to_none=True)
    return spec_from_stamps(params, stamps, backward_start=t1, forward_s=t1 - t0, name=name)


class GradientScheduler:
    """All-reduces the gradients of `named_parameters` during backward, following a plan.

    plan: a strategy name ("aiacc", "ddp", "horovod", "bytescheduler", "per-tensor") or a Plan.
    compression: "none" or "fp16" (gradients travel as float16). average: divide the sum by the world
    size. backward_passes_per_step: gradients are communicated once every that many backward passes.
    model_spec: gradient timing (e.g. from `profile_backward`). sync: what the plan is made for, "step"
    (the optimizer's step waits for everything), "layer" (per-layer waits, `attach_forward`) or "auto"
    (per-layer waits only where the simulator predicts them faster on the measured costs: `plan_for`;
    `defers` says what runs). Without model_spec, the first
    PROFILE_STEPS steps run a plan made from sizes only while the hooks time the backward; the plan is
    then remade, once, from the median profile of those steps but the first (rank 0's): the first step is
    a warm-up (buffers allocated, first collectives), its backward several times slower than later ones,
    and a plan made from it overlaps communication with compute that is not there.

    profile_contention (None: wherever aiacc plans on a measured network, one backward pass per step,
    more than one rank): the first PROFILE_STEPS steps also measure how much backward slows down with
    buckets in flight beside it, on this model as it trains (CONTENTION_PATTERN: steps with nothing in
    flight before backward's end and a step with the buckets of `probe_plan` in flight; the compute
    slowdown at which the simulator reproduces the busy step's backward is
    aiacc.core.comm.robust.slowdown_from_span, averaged over ranks) and pool that estimate with the job's
    others (`planning.add_slowdown_estimates`) before the plan is remade (from the quiet steps' timing,
    or `model_spec`); `contention_estimate` is the step's estimate (None: not measured or the step said
    nothing).
    """

    def __init__(self, named_parameters: Iterable[tuple[str, torch.nn.Parameter]], *, plan: str | Plan = "aiacc",
                 compression: str = "none", average: bool = True, backward_passes_per_step: int = 1,
                 model_spec: ModelSpec | None = None, sync: str = "step", profile_contention: bool | None = None):
        require()
        compression = check_compression(compression)
        named = [(n, p) for n, p in named_parameters if p.requires_grad]
        seen: dict[int, str] = {}
        for n, p in named:
            if id(p) in seen:
                raise CommError(f"parameter {n} is the same tensor as {seen[id(p)]}; list it once")
            seen[id(p)] = n
        self.named = named
        self.by_name = dict(named)
        entries = [(n, tuple(p.shape), str(p.dtype).replace("torch.", "")) for n, p in named]
        check_same(entries, "parameter")
        if not named:
            raise CommError("no parameters that require grad were given to the distributed optimizer")
        self.entries, self.compression, self.average = entries, compression, average
        self.strategy = plan if isinstance(plan, str) else None
        self.profiling = model_spec is None and self.strategy is not None
        self.stamps: dict[str, float] = {}
        self.profiles: list[ModelSpec] = []  # one per profiled step
        self.sync = sync  # what the plan is made for: "step" (synchronize), "layer" (attach_forward) or "auto"
        self.attached = False  # attach_forward was called
        self.passes = backward_passes_per_step
        self.given_spec = model_spec
        self.probing = self._wants_probe(profile_contention)
        self.contention_estimate: float | None = None
        self.step_index = 0  # steps finished
        if self.probing:  # the profiled steps run the probe plan; the plan is made after them
            self.quiet_profiles: list[ModelSpec] = []
            self.busy_span = 0.0
            probe = probe_plan(gradient_specs_from_params(entries))
            if sync != "auto":  # (with "auto" plan_for says which it chose)
                probe = dataclasses.replace(probe, params={**probe.params, "sync": sync})
            self._install(plan_for(entries, probe, compression=compression, sync=sync))
            self._prepare_step()
        else:
            self._install(plan_for(entries, plan, compression=compression, model_spec=model_spec, sync=sync))
        self.counts = {n: 0 for n, _ in named}
        self.pending: set[str] | None = None  # parameters whose deferred update waits (attach_forward)
        self.handles = [p.register_post_accumulate_grad_hook(self._hook(n)) for n, p in named]

    def _wants_probe(self, asked: bool | None) -> bool:
        """Whether the first steps profile contention (see the class's docstring)."""
        import torch.distributed as dist

        from aiacc.distributed.planning import calibrate

        if asked is False or self.strategy != "aiacc" or self.passes != 1:
            return False
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return False
        grad_bytes = sum(g.nbytes for g in gradient_specs_from_params(self.entries).gradients())
        return bool(calibrate(up_to_bytes=grad_bytes).allreduce_samples)  # a measured network

    def _prepare_step(self) -> None:
        """Before the next step: a quiet profiled step starts no all-reduce before backward's end."""
        if self.probing and self.step_index < len(CONTENTION_PATTERN) \
                and CONTENTION_PATTERN[self.step_index] == "quiet":
            self.executor.hold_step()

    def _estimate_contention(self) -> float | None:
        """The compute slowdown the busy profiled step shows: one estimate against each quiet step's
        timing (`slowdown_from_span`; two quiet steps bound how much of the busy step's extra time is
        the load of the moment), each averaged over the ranks that have it, all pooled into the
        calibrated cluster (`planning.add_slowdown_estimates`); returns their median, None where no
        rank has one (e.g. the probe plan left backward free of communication)."""
        import torch.distributed as dist

        from aiacc.core.comm import CostModel
        from aiacc.core.comm.robust import slowdown_from_span
        from aiacc.distributed import planning

        cluster = planning.current_cluster()
        n = len([k for k in CONTENTION_PATTERN if k == "quiet"])
        ests: list[float | None] = [None] * n
        if cluster is not None and cluster.allreduce_samples and self.busy_span > 0:
            cost = CostModel(cluster, compression=self.compression)
            for i, quiet in enumerate(self.quiet_profiles[:n]):
                ests[i] = slowdown_from_span(quiet, cluster, self.plan, self.busy_span, cost)
        both = torch.tensor([e or 0.0 for e in ests] + [1.0 if e else 0.0 for e in ests], dtype=torch.float64)
        collective("contention estimate", lambda: dist.all_reduce(both))
        got = [float(both[i] / both[n + i]) for i in range(n) if both[n + i] > 0.5]
        if not got:
            return None
        planning.add_slowdown_estimates(got)
        return float(np.median(got))

    def _install(self, planned) -> None:
        self.plan, order, self.spec = planned
        # what the plan was made for (sync="auto": the planner's measured choice)
        self.chosen_sync = self.plan.params.get("sync", "step") if self.sync == "auto" else self.sync
        old = getattr(self, "executor", None)
        self.executor = PlanExecutor(self.plan, order, {n: p.numel() for n, p in self.named},
                                     average=self.average, compression=self.compression,
                                     dtypes={n: p.dtype for n, p in self.named})
        if old is not None:  # the byte counters are this scheduler's, whichever plan sent them
            self.executor.bytes_total, self.executor.bytes_last_step = old.bytes_total, old.bytes_last_step

    def _hook(self, name: str):
        def hook(param: torch.Tensor) -> None:
            if self.pending:  # a new backward while updates of the last step wait (a layer skipped forward)
                self.flush()
            if self.profiling or self.probing:
                self.stamps.setdefault(name, time.perf_counter())
            self.counts[name] += 1
            if self.counts[name] == self.passes:
                grad = param.grad
                home = self.executor.ready(name, grad)
                if home is not grad and home.data_ptr() != grad.data_ptr():
                    param.grad = home  # later steps accumulate straight into the bucket buffer
        return hook

    def _complete(self) -> None:
        """Backward is over: a parameter that got no gradient on this rank takes part with zeros (all
        ranks must run the same collectives) and will receive the average; every bucket has started."""
        filled = []

        def zeros(name: str) -> torch.Tensor:
            p = self.by_name[name]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            filled.append(name)
            return p.grad

        self.executor.complete(zeros)
        for name in filled:
            p = self.by_name[name]
            home = self.executor.tensors[name]
            if home.data_ptr() != p.grad.data_ptr():
                p.grad = home

    def _finish(self) -> None:
        """Every all-reduce of the step has been waited for: end the step (the executor's checks), and
        re-plan once from the profile of the first step."""
        self.executor.wait()
        self.counts = dict.fromkeys(self.counts, 0)
        self.pending = None
        step, self.step_index = self.step_index, self.step_index + 1
        if self.probing:
            kind = CONTENTION_PATTERN[step]
            if kind == "quiet" and self.stamps:
                self.quiet_profiles.append(spec_from_stamps(self.named, self.stamps))
            elif kind == "busy":
                self.busy_span = backward_span(self.stamps)
            self.stamps = {}
            if self.step_index >= len(CONTENTION_PATTERN):  # every rank: the estimate, then the plan
                self.probing = self.profiling = False
                self.contention_estimate = self._estimate_contention()
                spec = self.given_spec or (median_spec(self.quiet_profiles) if self.quiet_profiles else None)
                self._install(plan_for(self.entries, self.strategy, compression=self.compression,
                                       model_spec=spec, sync=self.sync))
            else:
                self._prepare_step()
        elif self.profiling:  # every rank re-plans after PROFILE_STEPS steps (rank 0's profile decides)
            self.profiles.append(spec_from_stamps(self.named, self.stamps))
            self.stamps = {}
            if len(self.profiles) >= PROFILE_STEPS:
                self.profiling = False
                spec = median_spec(self.profiles[1:] or self.profiles)
                self._install(plan_for(self.entries, self.strategy, compression=self.compression,
                                       model_spec=spec, sync=self.sync))

    def synchronize(self) -> None:
        """Wait for every all-reduce of this step; the averaged gradients are in `.grad`."""
        if self.pending:
            self.flush()
            return
        self._complete()
        self._finish()

    # -- per-layer waits in the next forward ------------------------------------------------------------

    def attach_forward(self, module: torch.nn.Module, update: Callable[[list[str]], None]) -> None:
        """Overlap communication with the next forward: `defer()` ends backward without waiting, and a
        forward pre-hook waits, before a layer runs, only for the buckets holding that layer's parameters,
        then calls `update(names)` (the optimizer's update of just those parameters).

        A parameter belongs to the module that owns it, or, where that module's own forward never runs
        (nn.MultiheadAttention reads its out_proj's weight itself), to the nearest enclosing module whose
        forward does: which modules run is learnt from the forwards before the first deferred step.
        Whatever is still pending when the next backward starts (a layer skipped in that forward) is
        applied by `flush()`."""
        by_id = {id(p): n for n, p in self.named}
        self.update = update
        self.attached = True
        self._owned: list[tuple[list[torch.nn.Module], list[str]]] = []  # (owner and its ancestors, names)
        parents: dict[int, torch.nn.Module] = {}
        for m in module.modules():
            for child in m.children():
                parents.setdefault(id(child), m)
        for m in module.modules():
            names = [by_id[id(p)] for p in m.parameters(recurse=False) if id(p) in by_id]
            if names:
                chain = [m]
                while id(chain[-1]) in parents:
                    chain.append(parents[id(chain[-1])])
                self._owned.append((chain, names))
        self._ran: set[int] | None = set()  # modules whose forward ran (learnt until the first deferral)
        self._assigned: dict[int, list[str]] = {}
        for m in module.modules():
            if any(True for _ in m.parameters()):
                self.handles.append(m.register_forward_pre_hook(self._before_forward(id(m))))

    @property
    def defers(self) -> bool:
        """Whether the step's update is left to the next forward (attached, and the plan in use was made
        for per-layer waits)."""
        return self.attached and self.chosen_sync == "layer"

    def defer(self) -> None:
        """The step's update is deferred to the next forward: complete the step's gradients (all-reduces
        started), and mark every parameter as waiting for its update."""
        self._complete()
        if self._ran is not None:  # the first deferral: give each parameter to a module whose forward runs
            for chain, names in self._owned:
                runner = next((m for m in chain if id(m) in self._ran), None)
                if runner is not None:  # else: applied by flush() at the next backward
                    self._assigned.setdefault(id(runner), []).extend(names)
            self._ran = None
        self.pending = set(self.by_name)

    def _before_forward(self, key: int):
        def hook(module, args) -> None:
            if self._ran is not None:
                self._ran.add(key)
            if not self.pending:
                return
            mine = [n for n in self._assigned.get(key, ()) if n in self.pending]
            if mine:
                self.executor.wait_for(self.executor.buckets_of(mine))
                self.pending.difference_update(mine)
                self.update(mine)
                if not self.pending:
                    self._finish()
        return hook

    def flush(self) -> None:
        """Apply every deferred update now (all its all-reduces waited for) and end the step."""
        if not self.pending:
            return
        mine = [n for n in self.by_name if n in self.pending]
        self.executor.wait_for(self.executor.buckets_of(mine))
        self.pending.clear()
        self.update(mine)
        self._finish()

    def bucket_views(self) -> set[int]:
        """ids of the parameters whose `.grad` is its home in a bucket's buffer (a view of it)."""
        homes = self.executor.homes
        return {id(p) for n, p in self.named
                if p.grad is not None and n in homes and p.grad.data_ptr() == homes[n].data_ptr()}

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
