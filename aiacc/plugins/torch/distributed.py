"""Data-parallel gradient communication for torch modules, driven by an aiacc communication plan.

`GradientScheduler` hooks every parameter (`register_post_accumulate_grad_hook`): when backward has
finished a gradient, the scheduler marks it ready, and each bucket of the plan starts its all-reduce
(asynchronously, on torch.distributed) as soon as it is full, in the plan's issue order, so
communication overlaps the rest of backward. `synchronize()` waits for the all-reduces and leaves the
averaged gradients in `.grad`. The Horovod-compatible API (`aiacc.plugins.torch.horovod`) is built on it.
"""
from __future__ import annotations

import time
from typing import Iterable, Sequence

import torch

from aiacc.core.comm import ModelSpec, Plan, gradient_specs_from_params
from aiacc.plugins import _dist_transport as transport


def profile_backward(module: torch.nn.Module, loss_fn, name: str = "model") -> ModelSpec:
    """A ModelSpec with measured timing: runs one forward/backward (`loss_fn(module)` returns the loss)
    and records when each parameter's gradient is produced. Forward time is spread over layers in
    proportion to their backward time."""
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    stamps: dict[str, float] = {}
    handles = [p.register_post_accumulate_grad_hook(lambda _p, n=n: stamps.setdefault(n, time.perf_counter()))
               for n, p in params]
    try:
        t0 = time.perf_counter()
        loss = loss_fn(module)
        t1 = time.perf_counter()
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    module.zero_grad(set_to_none=True)
    spec = gradient_specs_from_params([(n, p.shape, p.dtype) for n, p in params], name=name)
    # backward time of a layer = gap between its gradients and those of the layer after it
    ends = [max(stamps.get(g.name, t1) for g in l.grads) - t1 for l in spec.layers]
    bwd, prev = [0.0] * len(ends), 0.0
    for i in sorted(range(len(ends)), key=lambda i: ends[i]):
        bwd[i] = max(0.0, ends[i] - prev)
        prev = max(prev, ends[i])
    total_b = sum(bwd) or 1.0
    fwd = [(t1 - t0) * b / total_b for b in bwd]
    return gradient_specs_from_params([(n, p.shape, p.dtype) for n, p in params], name=name,
                                      forward_s=fwd, backward_s=bwd)


class GradientScheduler:
    """All-reduces the gradients of `named_parameters` during backward, following a plan.

    plan: a strategy name ("aiacc", "ddp", "horovod", "bytescheduler", "per-tensor") or a Plan.
    compression: "none" or "fp16" (gradients travel as float16). average: divide the sum by the world
    size. backward_passes_per_step: gradients are communicated once every that many backward passes.
    model_spec: gradient timing (e.g. from `profile_backward`); by default sizes only.
    """

    def __init__(self, named_parameters: Iterable[tuple[str, torch.nn.Parameter]], *, plan: str | Plan = "aiacc",
                 compression: str = "none", average: bool = True, backward_passes_per_step: int = 1,
                 model_spec: ModelSpec | None = None):
        transport._require()
        named = [(n, p) for n, p in named_parameters if p.requires_grad]
        seen: dict[int, str] = {}
        for n, p in named:
            if id(p) in seen:
                raise transport.CommError(f"parameter {n} is the same tensor as {seen[id(p)]}; list it once")
            seen[id(p)] = n
        self.named = named
        self.by_name = dict(named)
        entries = [(n, tuple(p.shape), str(p.dtype).replace("torch.", "")) for n, p in named]
        transport.check_same(entries, "parameter")
        if not named:
            raise transport.CommError("no parameters that require grad were given to the distributed optimizer")
        self.plan, order, self.spec = transport.plan_for(entries, plan, compression=compression,
                                                         model_spec=model_spec)
        self.executor = transport.PlanExecutor(self.plan, order, {n: p.numel() for n, p in named},
                                               average=average, compression=compression)
        self.passes = backward_passes_per_step
        self.counts = {n: 0 for n, _ in named}
        self.handles = [p.register_post_accumulate_grad_hook(self._hook(n)) for n, p in named]

    def _hook(self, name: str):
        def hook(param: torch.Tensor) -> None:
            self.counts[name] += 1
            if self.counts[name] == self.passes:
                self.executor.ready(name, param.grad)
        return hook

    def synchronize(self) -> None:
        """Wait for every all-reduce of this step. A parameter that got no gradient on this rank takes
        part with zeros (all ranks must run the same collectives) and receives the average."""
        def zeros(name: str) -> torch.Tensor:
            p = self.by_name[name]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            return p.grad

        self.executor.wait(zeros)
        self.counts = dict.fromkeys(self.counts, 0)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
