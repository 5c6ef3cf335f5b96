"""The TF plugin (aiacc.plugins.base.Plugin): detect, trace (importer.py), export (exporter.py natively,
ort.py for backend="onnxruntime"), run, feeds and the timing runner. TensorFlow is imported on first use."""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from aiacc.core.ir import Graph
from aiacc.errors import AiaccError, KernelError, ShapeError
from aiacc.plugins.base import Plugin, to_numpy_list
from aiacc.plugins.tf import export_ops, import_ops  # noqa: F401  (fill the op tables; no TensorFlow import)
from aiacc.plugins.tf._tf import tf


class TFPlugin(Plugin):
    name = "tf"
    title = "TF"
    install_hint = "pip install 'aiacc[tf]'"
    rtol = 1e-4
    atol = 1e-5

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
        from aiacc.plugins.tf.importer import import_model

        return import_model(model, example_inputs, name=options.get("name"))

    def export_native(self, graph: Graph, *, original: Any = None, **options: Any) -> Any:
        """A tf.Module whose __call__ is a tf.function computing the graph in TF ops (NHWC again)."""
        from aiacc.plugins.tf.exporter import export_graph

        return export_graph(graph)

    def export_onnxruntime(self, graph: Graph, *, original: Any = None, providers: Any = None,
                           **options: Any) -> Any:
        """A tf.Module-like callable running the graph in onnxruntime."""
        from aiacc.plugins.tf.ort import export_onnxruntime

        return export_onnxruntime(graph, providers=providers)

    def run(self, model: Any, example_inputs: Any) -> list[np.ndarray]:
        try:
            return self._run(model, example_inputs)
        except AiaccError:
            raise
        except Exception as e:  # a TF runtime error in the model (original or optimized)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise KernelError(f"running {type(model).__name__} on the example inputs failed: {first}") from e

    def _run(self, model: Any, example_inputs: Any) -> list[np.ndarray]:
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
        return [np.asarray(o) for o in tfm.nest.flatten(out)]

    def feeds(self, graph: Graph, example_inputs: Any) -> dict[str, np.ndarray] | None:
        xs = _as_list(example_inputs)
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


PLUGIN = TFPlugin()
