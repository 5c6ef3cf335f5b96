"""Horovod's PyTorch API on aiacc's communication plans: change `import horovod.torch as hvd` to
`import aiacc.plugins.torch.horovod as hvd` and launch with `torchrun` instead of `horovodrun`.

    hvd.init()
    model = ...; optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.distributed as dist

from aiacc.core.comm import CommError, Plan
from aiacc.distributed import optimizer as _optimizer
from aiacc.distributed import transport
from aiacc.distributed.compression import Average, Compression, Sum, check as _check_compression
from aiacc.distributed.compression import is_average as _average
from aiacc.distributed.process import (barrier, collective, init, local_rank, local_size, rank, require,
                                       shutdown, size)
from aiacc.distributed.timeline import start_timeline, stop_timeline  # noqa: F401  (hvd.start_timeline)
from aiacc.plugins.torch.distributed import GradientScheduler

__all__ = ["Average", "Compression", "DistributedOptimizer", "Sum", "allgather", "allreduce", "allreduce_",
           "barrier", "broadcast", "broadcast_", "broadcast_object", "broadcast_optimizer_state",
           "broadcast_parameters", "init", "local_rank", "local_size", "rank", "shutdown", "size", "start_timeline",
           "stop_timeline"]


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               compression: str = Compression.none, op: str | None = None) -> torch.Tensor:
    """All-reduce `tensor` in place (average by default) and return it."""
    require()
    avg = _average(average, op)
    compression = _check_compression(compression)
    wire = tensor.to(torch.float16) if compression == Compression.fp16 and tensor.is_floating_point() else tensor
    if avg and wire is not tensor:
        wire = wire / dist.get_world_size()
    collective(f"allreduce of {name or 'tensor'}", lambda: dist.all_reduce(wire))
    if wire is not tensor:
        tensor.copy_(wire)
    elif avg:
        if tensor.is_floating_point():
            tensor.div_(dist.get_world_size())
        else:
            tensor.floor_divide_(dist.get_world_size())
    return tensor


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: str = Compression.none, op: str | None = None) -> torch.Tensor:
    """The all-reduced (average by default) copy of `tensor`."""
    return allreduce_(tensor.detach().clone(), average, name, compression, op)


def allgather(tensor: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """Concatenate every rank's `tensor` along dimension 0 (first dimensions may differ)."""
    require()
    n = torch.tensor([tensor.shape[0] if tensor.dim() else 1])
    sizes = [torch.zeros_like(n) for _ in range(dist.get_world_size())]
    collective(f"allgather sizes of {name or 'tensor'}", lambda: dist.all_gather(sizes, n))
    t = tensor.reshape(1) if tensor.dim() == 0 else tensor
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros((longest,) + tuple(t.shape[1:]), dtype=t.dtype)
    padded[:t.shape[0]] = t
    parts = [torch.empty_like(padded) for _ in sizes]
    collective(f"allgather of {name or 'tensor'}", lambda: dist.all_gather(parts, padded.contiguous()))
    return torch.cat([p[:int(s.item())] for p, s in zip(parts, sizes)])


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    require()
    collective(f"broadcast of {name or 'tensor'}", lambda: dist.broadcast(tensor, root_rank))
    return tensor


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    return broadcast_(tensor.detach().clone(), root_rank, name)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    return transport.broadcast_object(obj, root_rank, name or "object")


def broadcast_parameters(params, root_rank: int = 0) -> None:
    """Copy root_rank's parameters (a state_dict or named_parameters) to every rank, after checking
    that all ranks hold the same names, shapes and dtypes."""
    items = list(params.items()) if hasattr(params, "items") else list(params)
    for entry in items:
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], torch.Tensor)):
            raise CommError(f"broadcast_parameters expects a state_dict or (name, tensor) pairs, got {entry!r:.80}")
    transport.check_same([(n, tuple(t.shape), str(t.dtype).replace("torch.", "")) for n, t in items], "parameter")
    with torch.no_grad():
        for n, t in items:
            broadcast_(t.data if isinstance(t, torch.nn.Parameter) else t, root_rank, n)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Give every rank root_rank's optimizer state (hyper-parameters and buffers such as momentum)."""
    state = optimizer.state_dict()
    sig = [(f"group{i}.params", (len(g["params"]),), "") for i, g in enumerate(state["param_groups"])]
    transport.check_same(sig, "optimizer parameter group")
    root_state = transport.broadcast_object(state if dist.get_rank() == root_rank else None, root_rank,
                                            "optimizer state")
    if dist.get_rank() != root_rank:
        optimizer.load_state_dict(root_state)


class _DistributedOptimizer:
    """Mixed into the user's optimizer class: step() first waits for the gradients' all-reduces (or, with
    `forward_module`, leaves each layer's update to the forward pre-hook of that layer)."""

    def synchronize(self) -> None:
        """Wait for this step's all-reduces (called by step(); call it yourself to clip gradients)."""
        self._aiacc_scheduler.synchronize()
        self._aiacc_synchronized = True

    def skip_synchronize(self):
        """Context manager: the next step() does not synchronize (use after calling synchronize())."""
        opt = self

        class _Skip:
            def __enter__(self):
                opt._aiacc_skip = True

            def __exit__(self, *exc):
                opt._aiacc_skip = False

        return _Skip()

    def step(self, closure=None):
        sched = self._aiacc_scheduler
        if sched.defers and not self._aiacc_skip and not self._aiacc_synchronized:
            if closure is not None:
                raise CommError("DistributedOptimizer(forward_module=...) defers the update to the next forward "
                                "and cannot take a closure; call synchronize() first, or drop forward_module")
            # the update of each layer happens in the next forward, once its buckets are reduced, with the
            # hyper-parameters of now (an LR scheduler stepping after step() must not change this update)
            self._aiacc_hyper = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
            self._aiacc_zero = None
            sched.defer()
            return None
        if not self._aiacc_skip and not self._aiacc_synchronized:
            self.synchronize()
        self._aiacc_synchronized = False
        return super(self.__class__, self).step(closure)

    def _aiacc_update(self, names: list[str]) -> None:
        """The deferred update of just these parameters: the wrapped optimizer's step() with every other
        gradient hidden (torch optimizers skip parameters without a gradient)."""
        chosen = {id(self._aiacc_scheduler.by_name[n]) for n in names}
        hidden, saved = [], []
        for g, hyper in zip(self.param_groups, self._aiacc_hyper):
            saved.append({k: g[k] for k in hyper})
            g.update(hyper)
            for p in g["params"]:
                if id(p) not in chosen and p.grad is not None:
                    hidden.append((p, p.grad))
                    p.grad = None
        try:
            super(self.__class__, self).step()
        finally:
            for p, grad in hidden:
                p.grad = grad
            for g, old in zip(self.param_groups, saved):
                g.update(old)
        if self._aiacc_zero is not None:  # zero_grad() was called while this update was pending
            views = self._aiacc_scheduler.bucket_views()
            for n in names:
                p = self._aiacc_scheduler.by_name[n]
                if self._aiacc_zero and id(p) not in views:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    def finish_step(self) -> None:
        """Apply every deferred update now (forward_module mode): before evaluating, saving or reading the
        parameters outside the model's forward. A no-op otherwise."""
        self._aiacc_scheduler.flush()

    def zero_grad(self, set_to_none: bool = True):
        """As torch's, except that a gradient living in its bucket (a view of the bucket's buffer, see
        aiacc.plugins.torch.distributed) is zeroed in place even with set_to_none=True: backward then
        accumulates straight into the bucket again, with no new gradient to allocate and copy in (every
        parameter takes part in each step's reduction anyway, with zeros where backward gave it none)."""
        if self._aiacc_scheduler.pending:  # the deferred updates still need their gradients
            self._aiacc_zero = set_to_none
            return None
        views = self._aiacc_scheduler.bucket_views() if set_to_none else set()
        if not views:
            return super(self.__class__, self).zero_grad(set_to_none=set_to_none)
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                if id(p) in views:
                    p.grad.zero_()
                else:
                    p.grad = None
        return None

    @property
    def defers(self) -> bool:
        """Whether step() leaves each layer's update to the next forward (forward_module; with
        overlap_forward="auto", where the planner chose per-layer waits)."""
        return self._aiacc_scheduler.defers

    @property
    def plan(self) -> Plan:
        """The communication plan in use."""
        return self._aiacc_scheduler.plan


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Iterable | None = None,
                         compression: str = Compression.none, backward_passes_per_step: int = 1,
                         op: str = Average, plan: str | Plan = "aiacc", model_spec=None,
                         forward_module: torch.nn.Module | None = None,
                         overlap_forward: bool | str = True) -> torch.optim.Optimizer:
    """Wrap `optimizer` so gradients are all-reduced during backward (aiacc plan, overlapped) before step().

    The result is an instance of a subclass of the optimizer's class sharing its state. `plan` picks the
    strategy ("aiacc" by default; "ddp", "horovod", "bytescheduler", "per-tensor", or a Plan).

    forward_module: the model (an aiacc extension, not in Horovod). Communication then also overlaps the
    next forward: step() does not wait; each layer's update runs in a forward pre-hook of that layer once
    the buckets holding its parameters are reduced (the update still sees reduced gradients, with the
    hyper-parameters of the step() call). Parameters read outside their layer's forward (evaluation,
    saving) need `optimizer.finish_step()` first.

    overlap_forward (with forward_module): True (the default) always defers as above; "auto" defers only
    where the simulator, on the measured costs, predicts the per-layer plan faster than the plan for one
    synchronize before step() by the planner's margin (else step() synchronizes as without
    forward_module; `optimizer.defers` says which runs, `optimizer.plan.params["predicted"]` both
    predictions); False: as without forward_module.
    """
    if overlap_forward not in (True, False, "auto"):
        raise CommError(f"overlap_forward must be True, False or 'auto', got {overlap_forward!r}")
    if forward_module is None or overlap_forward is False:
        sync = "step"
    else:
        sync = "layer" if overlap_forward is True else "auto"
    require()
    if named_parameters is None:
        named = [(f"param.{gi}.{pi}", p) for gi, g in enumerate(optimizer.param_groups)
                 for pi, p in enumerate(g["params"])]
    else:
        named = list(named_parameters)
        in_opt = {id(p) for g in optimizer.param_groups for p in g["params"]}
        named_ids = {id(p) for _, p in named}
        missing = [i for i in in_opt if i not in named_ids]
        if missing:
            raise CommError(f"named_parameters misses {len(missing)} of the optimizer's parameters; "
                            f"pass model.named_parameters() of the model the optimizer trains")
        named = [(n, p) for n, p in named if id(p) in in_opt]
    wrapped = _optimizer.wrap(optimizer, _DistributedOptimizer,
                              _aiacc_scheduler=GradientScheduler(named, plan=plan, compression=compression,
                                                                 average=_average(None, op),
                                                                 backward_passes_per_step=backward_passes_per_step,
                                                                 model_spec=model_spec,
                                                                 sync=sync),
                              _aiacc_skip=False, _aiacc_synchronized=False,
                              _aiacc_hyper=None, _aiacc_zero=None)
    if sync != "step":
        wrapped._aiacc_scheduler.attach_forward(forward_module, wrapped._aiacc_update)
    return wrapped
