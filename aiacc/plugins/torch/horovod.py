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
from aiacc.plugins.torch.distributed import GradientScheduler

__all__ = ["Average", "Compression", "DistributedOptimizer", "Sum", "allgather", "allreduce", "allreduce_",
           "barrier", "broadcast", "broadcast_", "broadcast_object", "broadcast_optimizer_state",
           "broadcast_parameters", "init", "local_rank", "local_size", "rank", "shutdown", "size"]


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
    """Mixed into the user's optimizer class: step() first waits for the gradients' all-reduces."""

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
        if not self._aiacc_skip and not self._aiacc_synchronized:
            self.synchronize()
        self._aiacc_synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none: bool = True):
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)

    @property
    def plan(self) -> Plan:
        """The communication plan in use."""
        return self._aiacc_scheduler.plan


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Iterable | None = None,
                         compression: str = Compression.none, backward_passes_per_step: int = 1,
                         op: str = Average, plan: str | Plan = "aiacc", model_spec=None) -> torch.optim.Optimizer:
    """Wrap `optimizer` so gradients are all-reduced during backward (aiacc plan, overlapped) before step().

    The result is an instance of a subclass of the optimizer's class sharing its state. `plan` picks the
    strategy ("aiacc" by default; "ddp", "horovod", "bytescheduler", "per-tensor", or a Plan).
    """
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
    return _optimizer.wrap(optimizer, _DistributedOptimizer,
                           _aiacc_scheduler=GradientScheduler(named, plan=plan, compression=compression,
                                                              average=_average(None, op),
                                                              backward_passes_per_step=backward_passes_per_step,
                                                              model_spec=model_spec),
                           _aiacc_skip=False, _aiacc_synchronized=False)
