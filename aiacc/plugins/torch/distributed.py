"""Data-parallel gradient communication for torch modules, driven by an aiacc communication plan.

`GradientScheduler` hooks every parameter (`register_post_accumulate_grad_hook`): when backward has
finished a gradient, the scheduler marks it ready, and each bucket of the plan starts its all-reduce
(asynchronously, on torch.distributed) as soon as it is full, in the plan's issue order, so
communication overlaps the rest of backward. The first time a gradient is ready it is copied into its
bucket's flat buffer and `param.grad` becomes a view of it (DDP's gradient_as_bucket_view): from then on
autograd accumulates into the buffer that is all-reduced in place, unless `zero_grad(set_to_none=True)`
dropped it (one copy per step then, as in DDP). `synchronize()` waits for the all-reduces and leaves the
averaged gradients in `.grad`. The Horovod-compatible API (`aiacc.plugins.torch.horovod`) is built on it.
"""
from __future__ import annotations

import time
from typing import Iterable, Sequence

import torch

from aiacc.core.comm import ModelSpec, Plan, gradient_specs_from_params
from aiacc.core.comm import CommError
from aiacc.distributed.compression import check as check_compression
from aiacc.distributed.executor import PlanExecutor
from aiacc.distributed.planning import plan_for
from aiacc.distributed.process import require
from aiacc.distributed.transport import check_same


def spec_from_stamps(named: Sequence[tuple[str, torch.Tensor]], stamps: dict[str, float],
                     backward_start: float | None = None, forward_s: float | None = None,
                     name: str = "model") -> ModelSpec:
    """A ModelSpec whose timing comes from when backward produced each gradient (`stamps`, seconds).

    A layer's backward time is the gap between its gradients and those produced before it; without
    `backward_start` the first layer gets the median gap. Forward time (total `forward_s`, default half
    the backward) is spread over layers in proportion to their backward time."""
    entries = [(n, p.shape, p.dtype) for n, p in named]
    spec = gradient_specs_from_params(entries, name=name)
    last = max(stamps.values(), default=0.0)
    ends = [max(stamps.get(g.name, last) for g in l.grads) for l in spec.layers]
    order = sorted(range(len(ends)), key=lambda i: ends[i])
    bwd = [0.0] * len(ends)
    for a, b in zip(order, order[1:]):
        bwd[b] = max(0.0, ends[b] - ends[a])
    gaps = sorted(bwd[i] for i in order[1:]) or [1e-4]
    bwd[order[0]] = ends[order[0]] - backward_start if backward_start is not None else gaps[len(gaps) // 2]
    total_b = sum(bwd) or 1.0
    total_f = total_b / 2 if forward_s is None else forward_s
    fwd = [total_f * b / total_b for b in bwd]
    return gradient_specs_from_params(entries, name=name, forward_s=fwd, backward_s=bwd)


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
    model_spec: gradient timing (e.g. from `profile_backward`). Without it, the first step runs a plan
    made from sizes only while the hooks time the backward; the plan is then remade from that measured
    profile (rank 0's), once.
    """

    def __init__(self, named_parameters: Iterable[tuple[str, torch.nn.Parameter]], *, plan: str | Plan = "aiacc",
                 compression: str = "none", average: bool = True, backward_passes_per_step: int = 1,
                 model_spec: ModelSpec | None = None):
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
        self._install(plan_for(entries, plan, compression=compression, model_spec=model_spec))
        self.passes = backward_passes_per_step
        self.counts = {n: 0 for n, _ in named}
        self.handles = [p.register_post_accumulate_grad_hook(self._hook(n)) for n, p in named]

    def _install(self, planned) -> None:
        self.plan, order, self.spec = planned
        self.executor = PlanExecutor(self.plan, order, {n: p.numel() for n, p in self.named},
                                     average=self.average, compression=self.compression,
                                     dtypes={n: p.dtype for n, p in self.named})

    def _hook(self, name: str):
        def hook(param: torch.Tensor) -> None:
            if self.profiling:
                self.stamps.setdefault(name, time.perf_counter())
            self.counts[name] += 1
            if self.counts[name] == self.passes:
                grad = param.grad
                home = self.executor.ready(name, grad)
                if home is not grad and home.data_ptr() != grad.data_ptr():
                    param.grad = home  # later steps accumulate straight into the bucket buffer
        return hook

    def synchronize(self) -> None:
        """Wait for every all-reduce of this step. A parameter that got no gradient on this rank takes
        part with zeros (all ranks must run the same collectives) and receives the average."""
        filled = []

        def zeros(name: str) -> torch.Tensor:
            p = self.by_name[name]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            filled.append(name)
            return p.grad

        done = self.executor.wait(zeros)
        for name in filled:
            p = self.by_name[name]
            if done[name].data_ptr() != p.grad.data_ptr():
                p.grad = done[name]
        self.counts = dict.fromkeys(self.counts, 0)
        if self.profiling:  # every rank re-plans after its first step (rank 0's profile decides)
            self.profiling = False
            spec = spec_from_stamps(self.named, self.stamps)
            self._install(plan_for(self.entries, self.strategy, compression=self.compression,
                                             model_spec=spec))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
