"""OpenVINO (optional: pip install -c constraints.txt 'aiacc[openvino]'): a whole IR graph compiled by
OpenVINO's CPU plugin. The graph goes to OpenVINO as ONNX; a QDQ graph (aiacc's int8 plan) is read by
OpenVINO's low-precision transformations, which run its QuantizeLinear/DequantizeLinear groups as int8
convolutions and matrix products (`runtime_precisions()` reports what the compiled model executes in).

Graphs with opaque nodes are refused (OpenVINO runs one compiled model; the onnxruntime backend splits
graphs around framework callables)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from aiacc.core.ir import Graph
from aiacc.errors import UnsupportedError


def available() -> bool:
    """Whether the openvino package imports."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


class OpenVinoRunner:
    """`graph` compiled for OpenVINO's CPU device; run(feeds) -> [arrays] in graph.outputs order."""

    def __init__(self, graph: Graph, *, threads: int = 0):
        """threads: OpenVINO's inference threads (0: its default, the cores it sees)."""
        try:
            import openvino as ov
        except ImportError as e:
            raise UnsupportedError("backend='openvino' needs the openvino package "
                                   "(pip install -c constraints.txt 'aiacc[openvino]')") from e
        from aiacc.core.onnx import to_onnx

        opaque = [n.name for n in graph if n.schema is None]
        if opaque:
            raise UnsupportedError(f"backend='openvino' runs whole graphs; these nodes have no ONNX form: "
                                   f"{', '.join(opaque[:10])} (use backend='onnxruntime', which runs them "
                                   f"between its sessions)")
        self.graph = graph
        core = ov.Core()
        model = core.read_model(to_onnx(graph).SerializeToString(), b"")
        config = {"INFERENCE_NUM_THREADS": int(threads)} if threads else {}
        try:
            self.compiled = core.compile_model(model, "CPU", config)
        except Exception as e:  # OpenVINO raises RuntimeError subclasses naming the op it cannot build
            raise UnsupportedError(f"OpenVINO could not compile graph {graph.name!r}: {e}") from e
        self.request = self.compiled.create_infer_request()
        self.input_names = [v.name for v in graph.inputs if v.const is None]
        self.output_names = [v.name for v in graph.outputs]

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The graph's outputs for these inputs (copies: the request's buffers are reused)."""
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise UnsupportedError(f"backend='openvino': no value for input(s) {', '.join(missing)}")
        result = self.request.infer({n: np.ascontiguousarray(feeds[n]) for n in self.input_names})
        by_name = {}
        for port, value in result.items():
            for name in port.get_names():
                by_name[name] = value
        return [np.array(by_name[n]) for n in self.output_names]

    def runtime_precisions(self) -> dict[str, int]:
        """Executed layers by (layer type, runtime precision) from the compiled model's runtime graph:
        e.g. {"Convolution/u8": 53} when int8 convolutions run (constants, inputs and outputs left out)."""
        counts: dict[str, int] = {}
        for op in self.compiled.get_runtime_model().get_ordered_ops():
            info = op.get_rt_info()
            kind = info["layerType"].astype(str) if "layerType" in info else op.get_type_name()
            if kind in ("Const", "Input", "Output"):
                continue
            prec = info["runtimePrecision"].astype(str) if "runtimePrecision" in info else "?"
            key = f"{kind}/{prec}"
            counts[key] = counts.get(key, 0) + 1
        return counts
