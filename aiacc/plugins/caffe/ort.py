"""backend="onnxruntime" for Caffe: an object with CaffeModel's forward interface whose net runs in
onnxruntime (aiacc.backends.onnxruntime.OrtGraphRunner).

Layers the importer kept opaque (e.g. a Python layer given a kernel with register_layer) run between
onnxruntime sessions through that kernel. `to_caffe()` gives the same optimized net as a plain CaffeModel
(for .prototxt/.caffemodel files, which hold no onnxruntime).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from aiacc.core.ir import Graph
from aiacc.errors import ShapeError


class OrtCaffeModel:
    """A Caffe net running in onnxruntime: `forward(**inputs) -> {output blob: array}` like CaffeModel."""

    def __init__(self, graph: Graph, outputs: Sequence[str] | None = None, *, name: str | None = None,
                 providers: Sequence[str] | None = None):
        from aiacc.backends.onnxruntime import OrtGraphRunner

        self.graph = graph
        self._name = name or graph.name
        names = list(outputs) if outputs is not None else [v.name for v in graph.outputs]
        if len(names) != len(graph.outputs):
            raise ShapeError(f"net {self._name!r}: {len(names)} output blob names for {len(graph.outputs)} outputs")
        self._outputs = names
        from aiacc.plugins.caffe.model import runtime_graph

        # PriorBox as constants and Normalize as ops: fewer layers run between onnxruntime's sessions
        self.runner = OrtGraphRunner(runtime_graph(graph), providers=providers)

    @property
    def name(self) -> str:
        return self._name

    @property
    def inputs(self) -> dict[str, tuple]:
        """Input blob name -> shape."""
        return {v.name: v.shape for v in self.graph.inputs}

    @property
    def outputs(self) -> list[str]:
        """The blob names `forward` returns."""
        return list(self._outputs)

    def feeds(self, example_inputs: Any) -> dict[str, np.ndarray]:
        """Inputs given as a dict, one array or a sequence, as {input blob name: float32 array}."""
        from aiacc.plugins.caffe.model import blob_feeds

        return blob_feeds(self.name, [v.name for v in self.graph.inputs], example_inputs)

    def forward(self, *args: Any, **inputs: Any) -> dict[str, np.ndarray]:
        """Run the net: inputs by blob name (or positionally in the order of the net's inputs); returns
        {output blob name: array}."""
        feeds = self.feeds(args if args else inputs)
        for v in self.graph.inputs:
            shape = v.shape
            got = feeds[v.name].shape
            if shape is not None and (len(got) != len(shape) or any(isinstance(d, int) and d != g
                                                                     for d, g in zip(shape, got))):
                raise ShapeError(f"net {self.name!r}: input blob {v.name!r} has shape {list(got)}, "
                                 f"the net expects {list(shape)}")
        return dict(zip(self._outputs, self.runner.run(feeds)))

    def to_caffe(self):
        """The same optimized net as a plain CaffeModel (writable as .prototxt + .caffemodel)."""
        from aiacc.plugins.caffe import export_ops  # noqa: F401  (fills the exporter's table)
        from aiacc.plugins.caffe.exporter import export_graph

        return export_graph(self.graph.copy(), self.name)

    def __repr__(self) -> str:
        return (f"<OrtCaffeModel {self.name!r}: {len(self.graph.nodes)} nodes in {len(self.runner.sessions)} "
                f"segments ({self.runner.num_opaque} opaque) on {self.runner.providers[0]}>")
