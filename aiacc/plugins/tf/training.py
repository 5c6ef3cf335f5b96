"""mode="train" for TensorFlow: the exported training step runs on the original model's own variables.

The importer (mode="train") leaves the variables unfrozen: each one is a graph input
(graph.meta["tf_variables"]: input name, index in `model.variables`, trainable) and each variable the step
assigns (BatchNormalization's moving statistics, Keras' dropout seed generator) an extra graph output
(graph.meta["tf_assigns"]). `export_training` builds one tf.function that reads those same tf.Variable
objects, computes the optimized graph and assigns the updates back, so a GradientTape, an existing optimizer,
checkpoints and `trainable_variables` see the original's variables. A Keras original gives a keras.Model
(`AiaccTrainModel`: `fit` trains it); a tf.Module a tf.Module tracking the same variables.

The verification in optimize runs both models in training semantics with every variable restored after
each run (`training_runs`), so the dropout masks (drawn from the same seed state) and the BatchNorm updates
are the same in both runs.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any

import numpy as np

from aiacc.core.ir import Graph
from aiacc.errors import AiaccError, UnsupportedError
from aiacc.plugins.tf._tf import tf
from aiacc.plugins.tf.exporter import Emitter, Untracked, input_signature, lowerable_copy, module_name, pack_outputs
from aiacc.plugins.tf.importer import _is_keras_model, model_variables

# set while optimize(mode="train") verifies: the variables restored after each run
TRAINING_RUN: contextvars.ContextVar = contextvars.ContextVar("aiacc_tf_training_run", default=None)


def step_function(graph: Graph, variables: list, jit_compile: bool = False) -> Any:
    """The tf.function (flat data inputs -> outputs in the original structure) of a training-mode graph:
    reads the variables, runs the graph, assigns the updated state back; compiled by XLA with
    jit_compile=True (its gradient function too)."""
    tfm = tf()
    graph = lowerable_copy(graph)
    n_data = graph.meta["tf_data_inputs"]
    n_model = graph.meta["tf_model_outputs"]
    by_input = {name: k for name, k, _ in graph.meta["tf_variables"]}
    reads = [variables[by_input[v.name]] for v in graph.inputs[n_data:]]
    assigns = [(i, variables[k]) for i, k in graph.meta["tf_assigns"]]
    structure = graph.meta.get("tf_output_structure")

    def step(*args):
        xs = list(tfm.nest.flatten(args)) + [tfm.convert_to_tensor(v) for v in reads]
        outs = Emitter(graph).run(xs)
        for i, var in assigns:
            var.assign(outs[i])
        return pack_outputs(structure, outs[:n_model])

    return tfm.function(step, input_signature=input_signature(graph), autograph=False, reduce_retracing=True,
                        jit_compile=jit_compile or None)


def export_training(graph: Graph, original: Any) -> Any:
    """The trained model: a keras.Model (AiaccTrainModel) for a Keras original, else a tf.Module whose
    __call__ is the step; either way on the original's variables."""
    if original is None:
        raise UnsupportedError(f"graph {graph.name}: a training-mode graph exports onto the original model's "
                               f"variables; pass original=")
    variables = model_variables(original)
    step = step_function(graph, variables)
    try:  # build the TF graph now, so that a lowering problem surfaces here as an aiacc error
        step.get_concrete_function()
    except AiaccError:
        raise
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UnsupportedError(f"graph {graph.name}: TensorFlow refused the exported training graph: {first}") from e
    if _is_keras_model(original):
        model = keras_model(original, step, nested=graph.meta.get("tf_input_structure") is not None)
    else:
        tfm = tf()
        cls = type("AiaccTFTrainModule", (tfm.Module,), {
            "__call__": lambda self, *args: self._aiacc_step(*args),
            "__doc__": "A TF model optimized by aiacc for training: its variables are the original's.",
        })
        model = cls(name=module_name(graph.name))
        model.original_variables = list(variables)  # tracked: trainable_variables are the original's
        model._aiacc_step = step
    model.aiacc_graph = Untracked(graph)
    model._aiacc_variables = Untracked(variables)
    return model


def choose_step(model: Any, example_inputs: Any, setting: Any) -> Any:
    """The exported model with its step compiled by XLA (jit_compile=True) when that trains faster on the
    example inputs (framework_compile='auto': forward + GradientTape backward, measured interleaved; the
    state the step assigns is put back after every measured step), with the choice attached."""
    from aiacc.plugins.train_choice import TrainChoice, attach, choose

    tfm = tf()
    graph = model.aiacc_graph.__dict__["_obj"]
    variables = model._aiacc_variables.__dict__["_obj"]
    if example_inputs is None and setting == "auto":
        return attach(model, TrainChoice("aiacc graph", reason="no example inputs to measure on"))
    given = [] if example_inputs is None else example_inputs
    xs = [tfm.constant(a) for a in (given if isinstance(given, (list, tuple)) else [given])]
    assigned = [variables[k] for _, k in graph.meta["tf_assigns"]]
    trainable = [v for v in variables if v.trainable]

    def step_of(fn):
        def step():
            saved = [v.numpy() for v in assigned]
            with tfm.GradientTape() as tape:
                out = fn(*xs)
                loss = tfm.add_n([tfm.reduce_mean(tfm.square(tfm.cast(o, tfm.float32)))
                                  for o in tfm.nest.flatten(out) if o.dtype.is_floating])
            grads = tape.gradient(loss, trainable)
            for v, a in zip(assigned, saved):
                v.assign(a)
            return loss, grads
        return step

    base = model._aiacc_step
    chosen, choice = choose("aiacc graph", lambda: step_function(graph, variables, jit_compile=True), step_of,
                            base, setting, "XLA (jit_compile=True)",
                            to_arrays=lambda r: [r[0].numpy()] + [g.numpy() for g in r[1] if g is not None])
    model._aiacc_step = chosen
    return attach(model, choice)


def keras_model(original: Any, step: Any, nested: bool = False) -> Any:
    """A keras.Model whose training calls (training=True, or not given) run the aiacc step and whose
    inference calls (training=False: predict, evaluate) run the original; it tracks the original, so its
    variables, trainable_variables and checkpoints are the original's and `fit` trains them."""
    import keras

    class AiaccTrainModel(keras.Model):
        """A Keras model optimized by aiacc for training (its variables are the original's)."""

        def __init__(self, inner, fn):
            super().__init__(name=f"aiacc_{inner.name}")
            self.original = inner
            self._aiacc_step = fn

        def call(self, inputs, training=None):
            if training is False:
                return self.original(inputs, training=False)
            if isinstance(inputs, (list, tuple)) and not nested:  # a multi-input model: flat positional
                return self._aiacc_step(*inputs)
            return self._aiacc_step(inputs)

    model = AiaccTrainModel(original, step)
    model.built = True
    return model


def _restorable(model: Any) -> list:
    try:
        return model_variables(model)
    except UnsupportedError:
        return []


@contextlib.contextmanager
def training_runs(model: Any):
    """While active, the plugin's run() runs models in training semantics and restores the variables of
    `model` (the original, whose variables the optimized model shares) after every run."""
    token = TRAINING_RUN.set(_restorable(model))
    try:
        yield
    finally:
        TRAINING_RUN.reset(token)


def run_training(model: Any, xs: list) -> list[np.ndarray]:
    """One forward in training semantics (BatchNorm on batch statistics, dropout drawn from the current seed
    state), the outputs as numpy, every variable put back as it was."""
    tfm = tf()
    variables = TRAINING_RUN.get() or _restorable(model)
    saved = [v.numpy().copy() for v in variables]
    arg = xs[0] if len(xs) == 1 else xs
    try:
        if _is_keras_model(model):
            out = model(arg, training=True)
        else:
            out = model(*xs)
        return [np.asarray(o) for o in tfm.nest.flatten(out)]
    finally:
        for v, a in zip(variables, saved):
            v.assign(a)
