"""The TF half of the plugin protocol (aiacc.plugins.base.Translator): trace, export, run, feeds."""
from __future__ import annotations

from typing import Any

import numpy as np

from aiacc.core.ir import Graph
from aiacc.errors import AiaccError, KernelError, ShapeError
from aiacc.plugins.base import Translator
from aiacc.plugins.tf import export_ops, import_ops  # noqa: F401  (fill the op tables; no TensorFlow import)
from aiacc.plugins.tf._tf import tf


class TFTranslator(Translator):
    framework = "tf"
    rtol = 1e-4
    atol = 1e-5

    def trace(self, model: Any, example_inputs: Any = None, **options: Any) -> Graph:
        from aiacc.plugins.tf.importer import import_model

        return import_model(model, example_inputs, name=options.get("name"))

    def export(self, graph: Graph, *, original: Any = None, backend: str = "native", **options: Any) -> Any:
        if backend == "onnxruntime":
            from aiacc.plugins.tf.ort import export_onnxruntime

            return export_onnxruntime(graph)
        if backend != "native":
            from aiacc.errors import UnsupportedError

            raise UnsupportedError(f"the TF plugin has no backend {backend!r} (use 'native' or 'onnxruntime')")
        from aiacc.plugins.tf.exporter import export_graph

        return export_graph(graph)

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


def _as_list(example_inputs: Any) -> list:
    if example_inputs is None:
        return []
    if isinstance(example_inputs, (list, tuple)):
        return list(example_inputs)
    return [example_inputs]
