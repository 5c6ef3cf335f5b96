"""Horovod's TensorFlow API on aiacc's communication plans and the torch.distributed transport:
change `import horovod.tensorflow as hvd` (or `horovod.tensorflow.keras`) to
`import aiacc.plugins.tf.horovod as hvd` and launch with `torchrun`.

    hvd.init()
    with tf.GradientTape() as tape:
        loss = ...
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)

    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01))   # Keras: model.compile(optimizer=opt)
    hvd.broadcast_variables(model.variables, root_rank=0)

Gradients leave TensorFlow as numpy arrays (through `tf.numpy_function` inside a tf.function), are
all-reduced in the buckets of the plan, and come back as tensors. XLA-compiled steps cannot call out to
the transport: compile Keras models with `jit_compile=False` (the default on CPU).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from aiacc.core.comm import CommError, Plan
from aiacc.distributed import optimizer as _optimizer
from aiacc.distributed.compression import Average, Compression, Sum, check as _check_compression
from aiacc.distributed.compression import is_average as _average
from aiacc.distributed.process import barrier, init, local_rank, local_size, rank, require, shutdown, size
from aiacc.distributed.timeline import start_timeline, stop_timeline  # noqa: F401  (hvd.start_timeline)

__all__ = ["Average", "Compression", "DistributedGradientTape", "DistributedOptimizer", "Sum", "allreduce",
           "barrier", "broadcast", "broadcast_variables", "init", "local_rank", "local_size", "rank",
           "shutdown", "size", "start_timeline", "stop_timeline"]

# torch (the transport) is imported only where a function communicates: `import aiacc.plugins.tf.horovod`
# does not need torch


def _names(variables: Sequence[Any] | None, n: int) -> list[str]:
    """Unique, rank-independent names: the position plus the variable's path/name."""
    if variables is None:
        return [f"{i}:tensor" for i in range(n)]
    out = []
    for i, v in enumerate(variables):
        name = getattr(v, "path", None) or getattr(v, "name", None) or "tensor"
        out.append(f"{i}:{name}")
    return out


def _reduce_numpy(names: list[str], arrays: list[np.ndarray], average: bool, compression: str,
                  plan: str | Plan, cache: dict) -> list[np.ndarray]:
    from aiacc.distributed.executor import allreduce_arrays

    return allreduce_arrays(list(zip(names, arrays)), plan=plan, average=average, compression=compression,
                            cache=cache)


def _allreduce_tensors(tensors: Sequence[Any], names: list[str], *, average: bool = True,
                       compression: str = "none", plan: str | Plan = "aiacc", cache: dict | None = None) -> list:
    """All-reduce a list of tf tensors (None entries take part as zeros), eagerly or inside a tf.function."""
    cache = {} if cache is None else cache
    shapes = []
    dense = []
    for t, n in zip(tensors, names):
        if t is None:
            raise CommError(f"gradient {n} is None; pass only variables the loss depends on "
                            f"(all ranks must all-reduce the same tensors)")
        if isinstance(t, tf.IndexedSlices):
            t = tf.convert_to_tensor(t)
        dense.append(t)
        shapes.append(t.shape)
    if not dense:
        return []

    def run(*arrays):
        return _reduce_numpy(names, [np.asarray(a) for a in arrays], average, compression, plan, cache)

    if tf.executing_eagerly():
        return [tf.convert_to_tensor(a) for a in run(*[t.numpy() for t in dense])]
    out = tf.numpy_function(run, dense, [t.dtype for t in dense], stateful=True, name="aiacc_allreduce")
    if not isinstance(out, (list, tuple)):
        out = [out]
    for o, s in zip(out, shapes):
        o.set_shape(s)
    return list(out)


def allreduce(tensor, average: bool | None = None, name: str | None = None,
              compression: str = Compression.none, op: str | None = None):
    """The all-reduced (average by default) value of one tensor."""
    require()
    avg = _average(average, op)
    return _allreduce_tensors([tf.convert_to_tensor(tensor)], [name or "tensor"], average=avg,
                              compression=compression, plan="per-tensor")[0]


def broadcast(tensor, root_rank: int = 0, name: str | None = None):
    """root_rank's value of `tensor` (eager)."""
    from aiacc.distributed.transport import broadcast_arrays

    value = np.asarray(tensor)
    return tf.convert_to_tensor(broadcast_arrays([(name or "tensor", value)], root_rank, "tensor")[0])


def broadcast_variables(variables: Sequence[Any], root_rank: int = 0) -> None:
    """Assign root_rank's values to `variables` on every rank, after checking that all ranks hold the
    same variable names, shapes and dtypes (eager)."""
    from aiacc.distributed.transport import broadcast_arrays

    variables = list(variables)
    names = _names(variables, len(variables))
    values = broadcast_arrays([(n, np.asarray(v.numpy())) for n, v in zip(names, variables)], root_rank,
                              "variable")
    for v, a in zip(variables, values):
        v.assign(a)


class DistributedGradientTape:
    """Wraps a tf.GradientTape: gradient() returns gradients averaged over all ranks."""

    def __init__(self, gradtape, compression: str = Compression.none, op: str = Average,
                 plan: str | Plan = "aiacc"):
        require()
        self._tape = gradtape
        self._compression = _check_compression(compression)
        self._average = _average(None, op)
        self._plan = plan
        self._cache: dict = {}

    def gradient(self, target, sources, output_gradients=None, **kw):
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients, **kw)
        flat = tf.nest.flatten(grads)
        names = _names(tf.nest.flatten(sources), len(flat))
        reduced = _allreduce_tensors(flat, names, average=self._average, compression=self._compression,
                                     plan=self._plan, cache=self._cache)
        return tf.nest.pack_sequence_as(grads, reduced)

    def __getattr__(self, item):
        return getattr(self._tape, item)


class _DistributedOptimizer:
    """Mixed into a Keras optimizer class: apply() all-reduces the gradients first."""

    def apply(self, grads, trainable_variables=None):
        variables = list(trainable_variables) if trainable_variables is not None else list(self._trainable_variables)
        grads = list(grads)
        names = _names(variables, len(grads))
        if not hasattr(self, "_aiacc_cache"):
            self._aiacc_cache = {}
        reduced = _allreduce_tensors(grads, names, average=True, compression=self._aiacc_compression,
                                     plan=self._aiacc_plan, cache=self._aiacc_cache)
        return super(self.__class__, self).apply(reduced, trainable_variables)


def DistributedOptimizer(optimizer, compression: str = Compression.none, plan: str | Plan = "aiacc"):
    """A copy of the Keras `optimizer` (same class and config) whose updates use gradients averaged
    over all ranks."""
    require()
    return _optimizer.wrap(optimizer, _DistributedOptimizer, lambda cls: cls.from_config(optimizer.get_config()),
                           _aiacc_compression=_check_compression(compression), _aiacc_plan=plan)
