"""An ONNX backend (onnx.backend.base.Backend) on the aiacc IR and the reference executor, so ONNX's own
backend test suite can run against aiacc (also importable as `aiacc.onnx_backend`):

    import aiacc.backends.onnx_conformance as backend
    rep = backend.prepare(model)          # ONNX -> aiacc Graph (verified)
    outputs = rep.run([x])                # reference executor
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from aiacc.core.ir import Graph
from aiacc.core.onnx import from_onnx
from aiacc.core.runtime.executor import Interpreter


class AiaccRep(BackendRep):
    """A prepared model: the imported graph and an interpreter for it."""

    def __init__(self, graph: Graph):
        super().__init__()
        self.graph = graph
        self.interpreter = Interpreter(graph)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        names = [v.name for v in self.graph.inputs]
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            if len(inputs) != len(names):
                from aiacc.errors import ShapeError

                raise ShapeError(f"graph {self.graph.name} takes {len(names)} inputs ({', '.join(names)}), "
                                 f"got {len(inputs)}")
            feeds = dict(zip(names, inputs))
        out = self.interpreter.run(feeds)
        return namedtupledict("Outputs", [v.name for v in self.graph.outputs])(
            *[out[v.name] for v in self.graph.outputs])


class AiaccBackend(Backend):
    """ONNX backend running models with aiacc's reference executor (CPU)."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> AiaccRep:
        super().prepare(model, device, **kwargs)
        graph = from_onnx(model)
        graph.verify()
        return AiaccRep(graph)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Sequence[np.ndarray], device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, Any]] | None = None, **kwargs: Any) -> tuple[Any, ...]:
        """Run one NodeProto by wrapping it in a one-node model."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info)
        names = [n for n in node.input if n]
        arrays = [np.asarray(a) for a in inputs]
        vis = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
               for n, a in zip(names, arrays)]
        outs = [onnx.helper.make_empty_tensor_value_info(n) for n in node.output if n]
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = onnx.helper.make_model(onnx.helper.make_graph([node], "run_node", vis, outs),
                                       opset_imports=[onnx.helper.make_opsetid("", opset)])
        return cls.prepare(model, device).run(arrays)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU


prepare = AiaccBackend.prepare
run_model = AiaccBackend.run_model
run_node = AiaccBackend.run_node
supports_device = AiaccBackend.supports_device
