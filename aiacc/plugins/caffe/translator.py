"""The Caffe half of aiacc.optimize: CaffeModel -> IR (trace), IR -> CaffeModel (export; or an
OrtCaffeModel running the net in onnxruntime for backend="onnxruntime"), and running either (run) for the
before/after comparison."""
from __future__ import annotations

from typing import Any

import numpy as np

from aiacc.core.ir import Graph
from aiacc.errors import UnsupportedError
from aiacc.plugins.base import Translator
from aiacc.plugins.caffe.model import CaffeModel


def _model(model: Any) -> CaffeModel:
    if not isinstance(model, CaffeModel):
        raise UnsupportedError(f"the Caffe plugin takes an aiacc.plugins.caffe.CaffeModel, got {type(model).__name__}")
    return model


class CaffeTranslator(Translator):
    framework = "caffe"

    def trace(self, model: Any, example_inputs: Any = None, **options: Any) -> Graph:
        """The net as an IR graph (a fresh copy the caller may change)."""
        return _model(model).graph.copy()

    def export(self, graph: Graph, *, original: Any = None, backend: str = "native", **options: Any) -> CaffeModel:
        from aiacc.plugins.caffe.exporter import export_graph

        name = original.name if isinstance(original, CaffeModel) and original.name else None
        if backend == "onnxruntime":
            from aiacc.plugins.caffe.ort import OrtCaffeModel

            # the outputs keep the original's blob names (the passes may rename the values behind them)
            outputs = original.outputs if isinstance(original, CaffeModel) else None
            if outputs is not None and len(outputs) != len(graph.outputs):
                outputs = None
            return OrtCaffeModel(graph, outputs, name=name, providers=options.get("providers"))
        if backend != "native":
            raise UnsupportedError(f"the Caffe plugin has no backend {backend!r} (use 'native' or 'onnxruntime')")
        return export_graph(graph, name)

    def run(self, model: Any, example_inputs: Any) -> list[np.ndarray]:
        from aiacc.plugins.caffe.ort import OrtCaffeModel

        if not isinstance(model, OrtCaffeModel):
            model = _model(model)
        return list(model.forward(**model.feeds(example_inputs)).values())

    def feeds(self, graph: Graph, example_inputs: Any) -> dict[str, np.ndarray] | None:
        names = [v.name for v in graph.inputs]
        if isinstance(example_inputs, dict):
            return {k: np.asarray(v, dtype=np.float32) for k, v in example_inputs.items()}
        if isinstance(example_inputs, (list, tuple)):
            return {n: np.asarray(a, dtype=np.float32) for n, a in zip(names, example_inputs)}
        if example_inputs is not None and len(names) == 1:
            return {names[0]: np.asarray(example_inputs, dtype=np.float32)}
        return None
