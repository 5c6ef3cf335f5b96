"""The ONNX plugin (aiacc.plugins.base.Plugin): an onnx.ModelProto in, an optimized onnx.ModelProto out.

Trace imports with aiacc.core.onnx; export writes standard ONNX (fused aiacc ops decomposed back into
ONNX ops, so any ONNX runtime can run the result) for both backends: an ONNX model is what onnxruntime
runs. `run` runs a model in onnxruntime on the CPU. onnx and onnxruntime are imported on first use.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np

from aiacc.core.ir import Graph
from aiacc.errors import ShapeError
from aiacc.plugins.base import Plugin


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


def _session(model: Any):
    if hasattr(model, "aiacc_runtime"):  # backend="aiacc": an AiaccSession already runs like a session
        return model
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


class OnnxPlugin(Plugin):
    name = "onnx"
    title = "ONNX"
    install_hint = "pip install onnx onnxruntime"

    checks_batch = True

    def with_batch(self, example_inputs: Any, n: int) -> Any:
        """The example arrays with `n` rows (base.grow_arrays)."""
        from aiacc.plugins.base import grow_arrays

        return grow_arrays(example_inputs, n)

    def guard_batch(self, model: Any, batch: int, why: str) -> bool:
        """Declare dimension 0 of every graph input as `batch` in the optimized ModelProto, so that a runtime
        refuses other sizes (onnxruntime: INVALID_ARGUMENT naming the input and the dimension); False for a
        session (backend='aiacc'), which verify then refuses."""
        graph = getattr(model, "graph", None)
        if graph is None or not hasattr(graph, "initializer"):
            return False
        for value in graph.input:
            dims = value.type.tensor_type.shape.dim
            if len(dims) > 0:
                dims[0].Clear()
                dims[0].dim_value = batch
        return True

    def detect(self, model: Any) -> bool:
        onnx = sys.modules.get("onnx")
        return onnx is not None and isinstance(model, onnx.ModelProto)

    def trace(self, model: Any, example_inputs: Any = None, **options: Any) -> Graph:
        """The ModelProto as an IR graph."""
        from aiacc.core.onnx import from_onnx

        return from_onnx(model)

    def export_native(self, graph: Graph, *, original: Any = None, **options: Any) -> Any:
        """The graph as a standard ONNX ModelProto."""
        from aiacc.core.onnx import to_onnx

        return to_onnx(graph)

    def export_onnxruntime(self, graph: Graph, *, original: Any = None, providers: Any = None,
                           **options: Any) -> Any:
        """The same ModelProto: the caller's onnxruntime session chooses the providers."""
        return self.export_native(graph, original=original, **options)

    def run(self, model: Any, example_inputs: Any) -> list[np.ndarray]:
        sess = _session(model)
        names = [i.name for i in sess.get_inputs()]
        return sess.run(None, _as_feeds(names, example_inputs))

    def output_names(self, model: Any) -> list[str]:
        """The graph's output names, in order (what a session returns by name)."""
        if hasattr(model, "get_outputs"):  # a session (backend="aiacc" returns an AiaccSession)
            return [o.name for o in model.get_outputs()]
        return [o.name for o in model.graph.output]

    def runner(self, model: Any, inputs: Any) -> Callable[[], list[np.ndarray]]:
        """One CPU onnxruntime session, made once; inputs by name."""
        session = _session(model)
        return lambda: session.run(None, dict(inputs))

    def feeds(self, graph: Graph, example_inputs: Any) -> dict[str, np.ndarray] | None:
        if example_inputs is None:
            return None
        return _as_feeds([v.name for v in graph.inputs], example_inputs)


PLUGIN = OnnxPlugin()
