"""Horovod's MXNet (Gluon) API on aiacc's communication plans and the torch.distributed transport:
change `import horovod.mxnet as hvd` to `import aiacc.plugins.mxnet.horovod as hvd`, launch with torchrun.

    hvd.init()
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)
    trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": 0.1})
    ... loss.backward(); trainer.step(local_batch_size)

Gradients leave MXNet as numpy arrays, are all-reduced (averaged) in the buckets of the plan, and are
written back before the optimizer update.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from aiacc.core.comm import CommError, Plan
from aiacc.distributed.compression import Average, Compression, Sum, check as _check_compression
from aiacc.distributed.compression import is_average as _average
from aiacc.distributed.process import barrier, init, local_rank, local_size, rank, require, shutdown, size
from aiacc.distributed.timeline import start_timeline, stop_timeline  # noqa: F401  (hvd.start_timeline)
from aiacc.plugins.mxnet._import import import_mxnet

mx = import_mxnet()

__all__ = ["Average", "Compression", "DistributedTrainer", "Sum", "allreduce", "barrier", "broadcast_parameters",
           "init", "local_rank", "local_size", "rank", "shutdown", "size", "start_timeline", "stop_timeline"]

# torch (the transport) is imported only where a function communicates: `import aiacc.plugins.mxnet.horovod`
# does not need torch


def _items(params) -> list[tuple[str, Any]]:
    if hasattr(params, "items"):
        return list(params.items())
    return [(p.name, p) for p in params]


def allreduce(tensor, average: bool | None = None, name: str | None = None,
              compression: str = Compression.none, op: str | None = None):
    """The all-reduced (average by default) copy of an NDArray."""
    from aiacc.distributed.executor import allreduce_arrays

    require()
    out = allreduce_arrays([(name or "tensor", tensor.asnumpy())], plan="per-tensor",
                           average=_average(average, op), compression=_check_compression(compression))[0]
    return mx.nd.array(out, dtype=out.dtype)


def broadcast_parameters(params, root_rank: int = 0) -> None:
    """Set every rank's parameters (a ParameterDict, dict or list of Parameters) to root_rank's values,
    after checking that all ranks hold the same names, shapes and dtypes."""
    items = _items(params)
    arrays = []
    for name, p in items:
        if isinstance(p, mx.nd.NDArray):
            arrays.append((name, p.asnumpy()))
            continue
        try:
            arrays.append((name, p.data().asnumpy()))
        except Exception as e:  # deferred initialisation, not initialised
            raise CommError(f"parameter {name} has no value yet ({type(e).__name__}); initialise it (give "
                            f"in_units / run one forward) before broadcast_parameters") from e
    from aiacc.distributed.transport import broadcast_arrays

    values = broadcast_arrays(arrays, root_rank, "parameter")
    for (name, p), v in zip(items, values):
        if isinstance(p, mx.nd.NDArray):
            p[:] = mx.nd.array(v, dtype=v.dtype)
        else:
            p.set_data(mx.nd.array(v, dtype=v.dtype))


class DistributedTrainer(mx.gluon.Trainer):
    """A gluon.Trainer whose step() averages the gradients over all ranks (aiacc plan) before updating."""

    def __init__(self, params, optimizer, optimizer_params=None, compression: str = Compression.none,
                 plan: str | Plan = "aiacc", **kw):
        from aiacc.distributed.transport import check_same

        require()
        kw.pop("kvstore", None)  # the reduction is ours; no kvstore
        super().__init__(params, optimizer, optimizer_params, kvstore=None, **kw)
        self._aiacc_compression = _check_compression(compression)
        self._aiacc_plan = plan
        self._aiacc_cache: dict = {}
        names = [f"{i}:{p.name}" for i, p in enumerate(self._params) if p.grad_req != "null"]
        shapes = [(n, tuple(p.shape), str(np.dtype(p.dtype))) for n, p in
                  zip(names, [p for p in self._params if p.grad_req != "null"])]
        check_same(shapes, "parameter")

    def _allreduce_grads(self):
        params = [p for p in self._params if p.grad_req != "null"]
        if not params:
            return
        named = []
        for i, p in enumerate(params):
            grads = p.list_grad()
            if len(grads) != 1:
                raise CommError(f"parameter {p.name} lives on {len(grads)} devices; DistributedTrainer expects "
                                f"one device per process")
            if grads[0].stype != "default":
                raise CommError(f"parameter {p.name} has a {grads[0].stype} gradient; only dense gradients "
                                f"are supported")
            named.append((f"{self._params.index(p)}:{p.name}", grads[0].asnumpy()))
        from aiacc.distributed.executor import allreduce_arrays

        reduced = allreduce_arrays(named, plan=self._aiacc_plan, average=True,
                                   compression=self._aiacc_compression, cache=self._aiacc_cache)
        for p, r in zip(params, reduced):
            p.list_grad()[0][:] = mx.nd.array(r, dtype=r.dtype)
