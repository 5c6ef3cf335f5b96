"""backend="onnxruntime" for MXNet: a Gluon block whose forward runs the optimized IR in onnxruntime.

Opaque MXNet nodes run between onnxruntime segments through the MXNet kernel the importer attached to
them (see aiacc.backends.onnxruntime.OrtGraphRunner). On the CPU, inputs reach onnxruntime as numpy
views of the NDArrays' memory where MXNet allows it.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from aiacc.core.ir import Graph
from aiacc.errors import ShapeError
from aiacc.plugins.mxnet._import import import_mxnet

_mx = import_mxnet()


class OrtBlock(_mx.gluon.Block):
    """A gluon.Block computing `graph` with onnxruntime; call it like the original model."""

    def __init__(self, graph: Graph, providers: Any = None, **kwargs: Any):
        super().__init__(**kwargs)
        from aiacc.backends.onnxruntime import OrtGraphRunner

        self.aiacc_graph = graph
        self._runner = OrtGraphRunner(graph, providers=providers)

    def forward(self, *inputs: Any):
        mx = _mx
        graph = self.aiacc_graph
        if len(inputs) != len(graph.inputs):
            raise ShapeError(f"{type(self).__name__}: the model takes {len(graph.inputs)} inputs "
                             f"({', '.join(v.name for v in graph.inputs)}), got {len(inputs)}")
        feeds = {}
        for v, x in zip(graph.inputs, inputs):
            a = x.asnumpy() if isinstance(x, mx.nd.NDArray) else np.asarray(x)
            if v.dtype is not None and a.dtype.name != v.dtype:
                a = a.astype(v.dtype)
            feeds[v.name] = a
        array = mx.np.array if mx.util.is_np_array() else mx.nd.array  # a block under npx.set_np() returns mx.np
        outs = [array(o, dtype=o.dtype) for o in self._runner.run(feeds)]
        return outs[0] if len(outs) == 1 else outs
