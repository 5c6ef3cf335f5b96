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
all-reduced in the buckets of the plan, and come back as tensors. TensorFlow hands over every gradient
at once after backward, so what overlaps is the reduction of later buckets with the optimizer's update
of earlier ones (DistributedOptimizer's `overlap`); DistributedGradientTape returns all gradients
together and cannot overlap anything. XLA-compiled steps cannot call out to
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


def spec_from_model(model, variables: Sequence[Any], names: list[str], example_inputs=None):
    """The gradients' ModelSpec from the IR of `model` (aiacc.trace, then the core's
    `gradient_specs_from_graph`: layers in the order the forward first reads each variable, roofline
    timing), its gradients named as `names` (one per variable of `variables`). The IR's parameters are
    matched to the variables by shape and value. None, with a warning, where some variable has no
    parameter of the IR to match (the plan is then made from the variables' sizes alone)."""
    import warnings

    import aiacc
    from aiacc.core.comm import GradientSpec, Layer, ModelSpec, gradient_specs_from_graph
    from aiacc.errors import AiaccWarning

    if example_inputs is None:
        example_inputs = [np.zeros([1 if d is None else int(d) for d in x.shape], x.dtype.name
                                   if hasattr(x.dtype, "name") else str(x.dtype)) for x in model.inputs]
        example_inputs = example_inputs[0] if len(example_inputs) == 1 else tuple(example_inputs)
    graph = aiacc.trace(model, example_inputs)
    spec = gradient_specs_from_graph(graph)
    consts = {n: v.const for n, v in graph.initializers.items()}
    free = {n: np.asarray(v.numpy()) for n, v in zip(names, variables)}
    layers = []
    for layer in spec.layers:
        grads = []
        for g in layer.grads:
            value = consts.get(g.name)
            match = next((n for n, a in free.items() if value is not None and a.shape == value.shape
                          and np.array_equal(a, value)), None)
            if match is not None:
                del free[match]
                grads.append(GradientSpec(match, g.numel, g.dtype, g.shape))
        if grads:
            layers.append(Layer(layer.name, layer.forward_s, layer.backward_s, tuple(grads)))
    if free:
        warnings.warn(f"aiacc: DistributedOptimizer(model=...): variable {next(iter(free))} is not a parameter of "
                      f"the model's traced graph ({len(free)} unmatched); the plan is made from the variables' "
                      f"sizes alone", AiaccWarning, stacklevel=3)
        return None
    return ModelSpec(spec.name, tuple(layers))


def _splittable(opt) -> bool:
    """Whether the Keras optimizer's update may be applied in parts: not with a global clip norm, an EMA
    of the weights or gradient accumulation (each needs every gradient, or counts calls)."""
    return not (getattr(opt, "global_clipnorm", None) or getattr(opt, "use_ema", False)
                or getattr(opt, "gradient_accumulation_steps", None))


class _DistributedOptimizer:
    """Mixed into a Keras optimizer class: apply() all-reduces the gradients first.

    With overlap (the default), every bucket's all-reduce is started at once, and the update of the
    variables of each bucket, in the plan's issue order, runs as soon as that bucket is reduced, while
    later buckets are still on the wire (eagerly, or inside Keras's tf.function, where the waits are
    numpy_function ops that TensorFlow runs in program order between the updates). The iteration
    counter is advanced once per apply(), as by one update."""

    def apply(self, grads, trainable_variables=None):
        variables = list(trainable_variables) if trainable_variables is not None else list(self._trainable_variables)
        grads = list(grads)
        names = _names(variables, len(grads))
        if not hasattr(self, "_aiacc_cache"):
            self._aiacc_cache = {}
        if not self._aiacc_overlap or not _splittable(self) or size() == 1:
            reduced = _allreduce_tensors(grads, names, average=True, compression=self._aiacc_compression,
                                         plan=self._aiacc_plan, cache=self._aiacc_cache)
            return super(self.__class__, self).apply(reduced, trainable_variables)
        return self._aiacc_apply_in_parts(grads, variables, names)

    def _aiacc_apply_in_parts(self, grads, variables, names):
        import keras

        from aiacc.distributed.executor import cached_reducer

        dense = []
        for g, n in zip(grads, names):
            if g is None:
                raise CommError(f"gradient {n} is None; pass only variables the loss depends on "
                                f"(all ranks must all-reduce the same tensors)")
            dense.append(tf.convert_to_tensor(g))
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(variables)
            self.built = True
        entries = [(n, tuple(int(d) for d in t.shape), np.dtype(t.dtype.as_numpy_dtype)) for n, t in zip(names, dense)]
        ref = self._aiacc_model_ref
        if ref.model is not None and "spec" not in self._aiacc_cache:
            with tf.init_scope():  # traced eagerly, also while Keras traces its train step
                self._aiacc_cache["spec"] = spec_from_model(ref.model, variables, names, ref.example_inputs)
        reducer = cached_reducer(entries, self._aiacc_cache, plan=self._aiacc_plan, average=True,
                                 compression=self._aiacc_compression, model_spec=self._aiacc_cache.get("spec"))
        groups = [g for g in reducer.completes_at if g]
        index = {n: i for i, n in enumerate(names)}
        state: dict = {}

        def start(*arrays):
            for n in reducer.backward_names:
                reducer.add(n, np.asarray(arrays[index[n]]))
            state["parts"] = reducer.finished()
            return np.int64(len(groups))

        def wait(_token, k):
            part = next(state["parts"])
            if list(part) != groups[k]:
                raise CommError(f"bucket {k} completed {list(part)[:3]}, the plan expected {groups[k][:3]}")
            if k == len(groups) - 1:
                for _ in state["parts"]:  # ends the step (the executor's checks)
                    raise CommError("the step reduced more buckets than planned")
            return [part[n] for n in groups[k]]

        eager = tf.executing_eagerly()
        if eager:
            token = start(*[t.numpy() for t in dense])
        else:
            token = tf.numpy_function(start, dense, tf.int64, stateful=True, name="aiacc_allreduce_start")
        it0 = tf.identity(self.iterations)
        for k, group in enumerate(groups):
            dtypes = [dense[index[n]].dtype for n in group]
            if eager:
                outs = [tf.convert_to_tensor(a) for a in wait(token, k)]
            else:
                outs = tf.numpy_function(lambda t, k=k: wait(t, k), [token], dtypes, stateful=True,
                                         name=f"aiacc_allreduce_wait_{k}")
                outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
                for o, n in zip(outs, group):
                    o.set_shape(dense[index[n]].shape)
            super(self.__class__, self).apply(outs, [variables[index[n]] for n in group])
            if eager:
                reducer.events.append(("update", list(group)))
            if k < len(groups) - 1:  # one step of the counter for the whole update (LR schedules, Adam)
                self.iterations.assign(it0)


def DistributedOptimizer(optimizer, compression: str = Compression.none, plan: str | Plan = "aiacc",
                         overlap: bool = True, model=None, example_inputs=None):
    """A copy of the Keras `optimizer` (same class and config) whose updates use gradients averaged
    over all ranks.

    overlap: the update of each bucket's variables runs once that bucket is reduced, while later
    buckets are still on the wire (see _DistributedOptimizer); False: reduce everything, then one
    update. model (an aiacc extension): the Keras model the optimizer trains; the plan is then made
    from the IR's gradient specs of its traced graph (`spec_from_model`), so buckets follow the order
    the forward reads the variables, instead of their list order."""
    require()
    return _optimizer.wrap(optimizer, _DistributedOptimizer, lambda cls: cls.from_config(optimizer.get_config()),
                           _aiacc_compression=_check_compression(compression), _aiacc_plan=plan,
                           _aiacc_overlap=bool(overlap), _aiacc_model_ref=_Untracked(model, example_inputs))


class _Untracked:
    """Holds the model outside the optimizer's attribute tracking (a Keras model set on a Keras optimizer
    would become part of its checkpoint)."""

    __slots__ = ("model", "example_inputs")

    def __init__(self, model, example_inputs):
        self.model, self.example_inputs = model, example_inputs
