"""Horovod's MXNet (Gluon) API on aiacc's communication plans and the torch.distributed transport:
change `import horovod.mxnet as hvd` to `import aiacc.plugins.mxnet.horovod as hvd`, launch with torchrun.

    hvd.init()
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)
    trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": 0.1})
    ... loss.backward(); trainer.step(local_batch_size)

Gradients leave MXNet as numpy arrays, each as soon as MXNet's asynchronous engine has computed it, are
all-reduced (averaged) in the buckets of the plan while backward goes on, and are written back bucket by
bucket, each bucket's optimizer update pushed to the engine while later buckets are still on the wire
(DistributedTrainer's `overlap`).
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
    """A gluon.Trainer whose step() averages the gradients over all ranks (aiacc plan) before updating.

    overlap=True (the default): MXNet's engine runs backward asynchronously, so step() takes each
    parameter's gradient as soon as the engine has computed it (waiting for that gradient only, last
    layer first) and every bucket of the plan starts its all-reduce once full, while the engine is still
    computing the gradients of earlier layers; then, bucket by bucket in issue order, it writes back the
    averaged gradients of the parameters that bucket completes and pushes their optimizer update, which
    the engine runs while later buckets are still on the wire. overlap=False: every gradient first, then
    the reduction, then one update (the synchronous path). A loss scaler (AMP) needs every gradient before
    the update, so with one the update is not split."""

    def __init__(self, params, optimizer, optimizer_params=None, compression: str = Compression.none,
                 plan: str | Plan = "aiacc", overlap: bool = True, **kw):
        from aiacc.distributed.transport import check_same

        require()
        kw.pop("kvstore", None)  # the reduction is ours; no kvstore
        super().__init__(params, optimizer, optimizer_params, kvstore=None, **kw)
        self._aiacc_compression = _check_compression(compression)
        self._aiacc_plan = plan
        self._aiacc_overlap = bool(overlap)
        self._aiacc_cache: dict = {}
        names = [f"{i}:{p.name}" for i, p in enumerate(self._params) if p.grad_req != "null"]
        shapes = [(n, tuple(p.shape), str(np.dtype(p.dtype))) for n, p in
                  zip(names, [p for p in self._params if p.grad_req != "null"])]
        check_same(shapes, "parameter")

    def _aiacc_grads(self) -> list[tuple[int, str, Any]]:
        """(index in the trainer, reduction name, gradient NDArray) of each parameter that trains."""
        out = []
        for i, p in enumerate(self._params):
            if p.grad_req == "null":
                continue
            grads = p.list_grad()
            if len(grads) != 1:
                raise CommError(f"parameter {p.name} lives on {len(grads)} devices; DistributedTrainer expects "
                                f"one device per process")
            if grads[0].stype != "default":
                raise CommError(f"parameter {p.name} has a {grads[0].stype} gradient; only dense gradients "
                                f"are supported")
            out.append((i, f"{i}:{p.name}", grads[0]))
        return out

    def _aiacc_reducer(self, grads):
        from aiacc.distributed.executor import cached_reducer

        entries = [(name, tuple(g.shape), np.dtype(g.dtype)) for _, name, g in grads]
        return cached_reducer(entries, self._aiacc_cache, plan=self._aiacc_plan, average=True,
                              compression=self._aiacc_compression)

    def _aiacc_reduce(self, update=None) -> None:
        """All-reduce every gradient in place; with `update(indices)`, each bucket's parameters are
        updated as soon as their reduction is complete."""
        import torch.distributed as dist

        grads = self._aiacc_grads()
        if not grads:
            return
        if dist.get_world_size() == 1:
            if update is not None:
                update([i for i, _, _ in grads])
            return
        reducer = self._aiacc_reducer(grads)
        by_name = {name: (i, g) for i, name, g in grads}
        if self._aiacc_overlap:
            for _, name, g in reversed(grads):  # backward's order; asnumpy() waits for this gradient only
                reducer.add(name, g.asnumpy())
        else:
            arrays = [(name, g.asnumpy()) for _, name, g in grads]
            for name, a in reversed(arrays):
                reducer.add(name, a)
        for part in reducer.finished():
            for name, r in part.items():
                by_name[name][1][:] = mx.nd.array(r, dtype=r.dtype)
            if update is not None:
                update([by_name[n][0] for n in part])
                reducer.events.append(("update", list(part)))

    def _allreduce_grads(self):
        self._aiacc_reduce()

    def step(self, batch_size, ignore_stale_grad=False):
        """Average the gradients over all ranks and update, bucket by bucket when `overlap` (see the class)."""
        if not self._aiacc_overlap or getattr(self, "_amp_loss_scaler", None) is not None:
            return super().step(batch_size, ignore_stale_grad)
        self._check_and_rescale_grad(self._scale / batch_size)
        if not self._kv_initialized:
            self._init_kvstore()
        if self._params_to_init:
            self._init_params()
        if not ignore_stale_grad:  # gluon's check, for all parameters before any update
            for p in self._params:
                if p.grad_req != "null" and not all(d._fresh_grad for d in p._check_and_get(p._data, list)):
                    raise UserWarning(f"Gradient of Parameter `{p.name}` has not been updated by backward since "
                                      f"last `step`; call step with ignore_stale_grad=True to skip parameters "
                                      f"with stale gradients")
        self._aiacc_reduce(lambda indices: self._aiacc_update(indices, ignore_stale_grad))

    def _aiacc_update(self, indices, ignore_stale_grad: bool) -> None:
        """gluon.Trainer._update for the parameters at these indices (the updater keeps its state and
        update counts per index, so updating in parts equals one update of all)."""
        updates = [[] for _ in self._updaters]
        for i in indices:
            param = self._params[i]
            for upd, arr, grad in zip(updates, param.list_data(), param.list_grad()):
                if not ignore_stale_grad or arr._fresh_grad:
                    upd.append((i, grad, arr))
                    arr._fresh_grad = False
        for updater, upd in zip(self._updaters, updates):
            if upd:
                i, g, w = zip(*upd)
                updater(i, g, w)
