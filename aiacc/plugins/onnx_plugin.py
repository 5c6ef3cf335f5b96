"""The ONNX 'plugin': an onnx.ModelProto in, an optimized onnx.ModelProto out.

`aiacc.optimize(model_proto)` imports with aiacc.core.onnx, runs the passes and exports standard ONNX
(fused aiacc ops decomposed back into ONNX ops, so any ONNX runtime can run the result). Verification
runs the original and the optimized model in onnxruntime.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from aiacc.core.ir import Graph
from aiacc.core.onnx import from_onnx, to_onnx
from aiacc.plugins.base import Translator, plugin_api
from aiacc.errors import ShapeError, UnsupportedError


def _as_feeds(graph_inputs: list[str], example_inputs: Any) -> dict[str, np.ndarray]:
    if isinstance(example_inputs, dict):
        return {k: np.asarray(v) for k, v in example_inputs.items()}
    if isinstance(example_inputs, np.ndarray):
        example_inputs = [example_inputs]
    example_inputs = list(example_inputs)
    if len(example_inputs) != len(graph_inputs):
        raise ShapeError(f"the model takes {len(graph_inputs)} inputs ({', '.join(graph_inputs)}), "
                         f"{len(example_inputs)} example inputs were given")
    return {name: np.asarray(x) for name, x in zip(graph_inputs, example_inputs)}


class OnnxTranslator(Translator):
    """ONNX ModelProto <-> IR; runs models in onnxruntime for verification."""

    framework = "onnx"

    def trace(self, model: Any, example_inputs: Any = None, **options: Any) -> Graph:
        return from_onnx(model)

    def export(self, graph: Graph, *, original: Any = None, backend: str = "native", **options: Any) -> Any:
        if backend not in ("native", "onnxruntime"):
            raise UnsupportedError(f"unknown backend {backend!r} (expected 'native' or 'onnxruntime')")
        return to_onnx(graph)

    def run(self, model: Any, example_inputs: Any) -> list[np.ndarray]:
        import onnxruntime as ort

        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        return sess.run(None, _as_feeds(names, example_inputs))

    def feeds(self, graph: Graph, example_inputs: Any) -> dict[str, np.ndarray] | None:
        if example_inputs is None:
            return None
        return _as_feeds([v.name for v in graph.inputs], example_inputs)


trace, optimize, export = plugin_api(OnnxTranslator())
