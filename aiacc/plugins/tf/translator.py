"""The TF plugin (aiacc.plugins.base.Plugin): detect, trace (importer.py), export (exporter.py natively,
ort.py for backend="onnxruntime"), run, feeds and the timing runner. TensorFlow is imported on first use."""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from aiacc.core.ir import Graph
from aiacc.errors import AiaccError, KernelError, ShapeError, UnsupportedError, first_line
from aiacc.plugins.base import Plugin, to_numpy_list
from aiacc.plugins.tf import export_ops, import_ops  # noqa: F401  (fill the op tables; no TensorFlow import)
from aiacc.plugins.tf._tf import tf


class TFPlugin(Plugin):
    name = "tf"
    title = "TF"
    install_hint = "pip install 'aiacc[tf]'"
    rtol = 1e-4
    atol = 1e-5
    modes = ("inference", "train")
    options = {"name": "the graph's name",
               "memory_budget": "bytes of activations to keep in mode='train' (tf.recompute_grad recomputes the rest)",
               "framework_compile": "mode='train': 'auto' measures the step with and without XLA (jit_compile) "
                                    "and keeps the faster; True always compiles; False never"}

    checks_batch = True

    def with_batch(self, example_inputs: Any, n: int) -> Any:
        """The example inputs as numpy arrays of `n` rows (base.grow_arrays); None for a training step (its
        verify compares one step at the example's size)."""
        from aiacc.plugins.base import grow_arrays
        from aiacc.plugins.tf.training import TRAINING_RUN

        return None if TRAINING_RUN.get() is not None else grow_arrays(example_inputs, n)

    def guard_batch(self, model: Any, batch: int, why: str) -> bool:
        """Whether the module can refuse another batch size: the shape guard guard_shapes puts on it then
        fixes dimension 0 too and says `why` (tf/guard.py)."""
        from aiacc.plugins.tf.guard import guardable

        return guardable(model)

    def guard_shapes(self, model: Any, original: Any, found: dict) -> Any:
        """A ShapeError in front of the module's tf.function for any call at shapes it was not built for
        (tf/guard.py; a signature's None dimensions the graph kept dynamic stay free)."""
        from aiacc.plugins.tf.guard import guard_module

        return guard_module(model, original, found)

    def detect(self, model: Any) -> bool:
        """A Keras model, a tf.Module, a tf.function (generic or concrete) or a restored SavedModel."""
        tfm = sys.modules.get("tensorflow")
        keras = sys.modules.get("keras")
        if keras is not None and isinstance(model, keras.Model):
            return True
        if tfm is None:
            return False
        function_types = tuple(t for t in (getattr(tfm.types.experimental, "GenericFunction", None),
                                           getattr(tfm.types.experimental, "ConcreteFunction", None)) if t)
        # objects restored by tf.saved_model.load are AutoTrackables, not tf.Modules
        restored = getattr(getattr(tfm, "__internal__", None), "tracking", None)
        restored_types = (restored.AutoTrackable,) if restored is not None else ()
        return isinstance(model, (tfm.Module,) + function_types + restored_types)

    def trace(self, model: Any, example_inputs: Any = None, **options: Any) -> Graph:
        """A Keras model, tf.Module or tf.function as an IR graph; mode="train" (alias "training"): training
        semantics with the variables as graph inputs (a Keras model or tf.Module only)."""
        from aiacc.plugins.tf.importer import import_model

        mode = self.check_mode(options.get("mode"))
        return import_model(model, example_inputs, name=options.get("name"), mode=mode)

    def export_native(self, graph: Graph, *, original: Any = None, **options: Any) -> Any:
        """A tf.Module whose __call__ is a tf.function computing the graph in TF ops (NHWC again); for a
        training-mode graph a model on the original's variables (a keras.Model for a Keras original)."""
        from aiacc.plugins.tf.exporter import export_graph

        return export_graph(graph, original)

    def export_onnxruntime(self, graph: Graph, *, original: Any = None, providers: Any = None,
                           **options: Any) -> Any:
        """A tf.Module-like callable running the graph in onnxruntime."""
        if graph.meta.get("tf_mode") == "train":
            raise UnsupportedError("backend='onnxruntime' runs inference only; use backend='native' for mode='train'")
        from aiacc.plugins.tf.ort import export_onnxruntime

        return export_onnxruntime(graph, providers=providers)

    def run(self, model: Any, example_inputs: Any) -> list[np.ndarray]:
        return self.run_named(model, example_inputs)[0]

    def run_named(self, model: Any, example_inputs: Any) -> tuple[list[np.ndarray], list[str] | None]:
        """The outputs in tf.nest order and where each sits in what the model returns ("dict['score']",
        "list[1]", "Out.aux"): a Keras model's or a signature's output dict keys, the structure and the
        order, which verify compares with the original's. A training step's outputs have no names."""
        try:
            return self._run(model, example_inputs)
        except AiaccError:
            raise
        except Exception as e:  # a TF runtime error in the model (original or optimized)
            raise KernelError(f"running {type(model).__name__} on the example inputs failed: {first_line(e)}") from e

    def float64_outputs(self, model: Any, inputs: Any) -> list[np.ndarray] | None:
        """`run` in float64, for verify's float64 re-check (base.Plugin.outputs_agree), on the example inputs
        with every float32 array widened: an optimized module runs its IR graph widened (float64_copy) and
        exported again; a Keras Functional or Sequential model runs a clone whose layers compute in float64,
        with its weights cast. None for what cannot be widened without rewriting its code (a tf.Module, a
        tf.function, a subclassed Keras model, a graph with an opaque TF region) and for training steps.
        The model given is not changed; the copy is dropped after the run."""
        from aiacc.plugins.tf.exporter import Untracked

        graph = getattr(model, "aiacc_graph", None)
        if isinstance(graph, Untracked):
            graph = graph.unwrap()
        if graph is not None and graph.meta.get("tf_mode") == "train":
            return None
        tfm = tf()

        def widen(x):
            if (isinstance(x, np.ndarray) or tfm.is_tensor(x)) and x.dtype in (np.float32, tfm.float32):
                return np.asarray(x).astype(np.float64)
            return x
        wide_inputs = tfm.nest.map_structure(widen, inputs)  # the same structure (a tuple, a dict of arrays)
        if graph is not None:
            from aiacc.core.passes.manager import float64_copy
            from aiacc.plugins.tf.exporter import export_graph

            wide = float64_copy(graph)
            if wide is not None and wide.meta.get("tf_signature"):  # the exported function's input specs
                wide.meta["tf_signature"] = [(name, shape, "float64" if str(dtype) == "float32"
                                              else dtype) for name, shape, dtype in wide.meta["tf_signature"]]
            copy = None if wide is None else export_graph(wide)
        else:
            copy = _keras_float64(model)
        if copy is None:
            return None
        return self.run(copy, wide_inputs)

    def optimize(self, model: Any, example_inputs: Any = None, **options: Any) -> Any:
        """aiacc.optimize for TF; with mode="train" the outputs compared before and after are one training
        step's (variables restored after each run, so the dropout seed and BatchNorm statistics match)."""
        from aiacc.plugins.tf.training import training_runs

        mode = self.check_mode(options.get("mode"))
        budget = options.pop("memory_budget", None)
        if budget is not None and mode != "train":
            raise UnsupportedError("memory_budget applies to mode='train' (inference memory is planned by the arena)")
        from aiacc.plugins.train_choice import option as compile_option

        compile_setting = compile_option(options)
        if mode != "train":
            return super().optimize(model, example_inputs, **options)
        from aiacc.plugins.tf.training import MEMORY_BUDGET

        xs = _as_list(example_inputs)
        batch = int(np.shape(xs[0])[0]) if xs and np.ndim(xs[0]) else 1
        token = MEMORY_BUDGET.set(None if budget is None else (budget, batch))
        try:
            with training_runs(model):
                out = super().optimize(model, example_inputs, **options)
        finally:
            MEMORY_BUDGET.reset(token)
        if options.get("backend", "native") != "native":
            return out
        from aiacc.plugins.tf.training import choose_step

        # recomputation is planned for the step as exported: under a budget 'auto' does not try XLA
        return choose_step(out, example_inputs, False if budget is not None and compile_setting == "auto"
                           else compile_setting)

    def _run(self, model: Any, example_inputs: Any) -> tuple[list[np.ndarray], list[str] | None]:
        from aiacc.plugins.base import output_paths
        from aiacc.plugins.tf.training import TRAINING_RUN, run_training

        if TRAINING_RUN.get() is not None:
            return run_training(model, _as_list(example_inputs)), None
        tfm = tf()
        xs = _as_list(example_inputs)
        from aiacc.plugins.tf.importer import _is_keras_model

        if _is_keras_model(model):
            out = model(xs[0] if len(xs) == 1 else xs, training=False)
        elif isinstance(model, tfm.types.experimental.ConcreteFunction) and \
                not model.structured_input_signature[0] and model.structured_input_signature[1]:
            # a SavedModel serving signature takes keyword arguments only (flattened in key order)
            names = sorted(model.structured_input_signature[1])
            out = model(**{k: tfm.convert_to_tensor(x) for k, x in zip(names, xs)})
        else:
            out = model(*xs)
        # tf.nest's order: dict keys sorted, so the names line up with tf.nest.flatten's arrays
        paths = output_paths(out, lambda x: tfm.is_tensor(x) or isinstance(x, np.ndarray), sort_keys=True)
        return [np.asarray(o) for _, o in paths if tfm.is_tensor(o) or isinstance(o, np.ndarray)], \
            [p for p, _ in paths]

    def feeds(self, graph: Graph, example_inputs: Any) -> dict[str, np.ndarray] | None:
        xs = _as_list(example_inputs)
        if graph.meta.get("tf_mode") == "train":  # data inputs, then the variables' values
            arrays = graph.meta.get("tf_variable_arrays", {})
            data = graph.inputs[:graph.meta["tf_data_inputs"]]
            if len(xs) != len(data):
                raise ShapeError(f"graph {graph.name} has {len(data)} data inputs, {len(xs)} were given")
            feeds = {v.name: np.asarray(x) for v, x in zip(data, xs)}
            feeds.update({k: a for k, a in arrays.items() if graph.has_value(k)})
            return feeds
        if len(xs) != len(graph.inputs):
            raise ShapeError(f"graph {graph.name} has {len(graph.inputs)} inputs, {len(xs)} were given")
        return {v.name: np.asarray(x) for v, x in zip(graph.inputs, xs)}

    def runner(self, model: Any, inputs: Any):
        """Calls model(*inputs) on tf.constants made once."""
        tfm = tf()
        xs = [tfm.constant(a) for a in (inputs if isinstance(inputs, (tuple, list)) else (inputs,))]
        return lambda: to_numpy_list(model(*xs))


def _as_list(example_inputs: Any) -> list:
    if example_inputs is None:
        return []
    if isinstance(example_inputs, (list, tuple)):
        return list(example_inputs)
    return [example_inputs]


def _keras_float64(model: Any) -> Any:
    """A clone of a Keras Functional or Sequential model whose layers (its Input layers too) compute in float64,
    holding its weights cast to float64; None for another model (a subclassed Keras model, a tf.Module: their
    dtypes are in their code)."""
    keras = tf().keras
    try:
        from keras.src.models.functional import Functional  # Keras 3: keras.Model(inputs, outputs)'s class
    except ImportError:
        Functional = ()
    if not isinstance(model, (keras.Sequential, Functional)):
        return None

    def widened(layer):
        config = layer.get_config()
        config["dtype"] = "float64"
        return layer.__class__.from_config(config)
    copy = keras.models.clone_model(model, clone_function=widened)
    copy.set_weights([w.astype(np.float64) if w.dtype == np.float32 else w for w in model.get_weights()])
    return copy


PLUGIN = TFPlugin()
