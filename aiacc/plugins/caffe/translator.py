"""The Caffe plugin (aiacc.plugins.base.Plugin): CaffeModel -> IR (trace), IR -> CaffeModel (export; or an
OrtCaffeModel running the net in onnxruntime for backend="onnxruntime"), running either (run) for the
before/after comparison, and the timing runner (OpenCV dnn where installed, the Caffe runtime at hand).
Protobuf and the Caffe schema are imported on first use, so detection imports nothing."""
from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from aiacc.core.ir import Graph
from aiacc.errors import UnsupportedError
from aiacc.plugins.base import Plugin


def _model(model: Any):
    from aiacc.plugins.caffe.model import CaffeModel

    if not isinstance(model, CaffeModel):
        raise UnsupportedError(f"the Caffe plugin takes an aiacc.plugins.caffe.CaffeModel, got {type(model).__name__}")
    return model


class CaffePlugin(Plugin):
    name = "caffe"
    title = "Caffe"
    install_hint = "pip install 'aiacc[caffe]'"

    # a Caffe net declares its input shapes: verify's check at another batch size then reports that the
    # original refuses it as well (CaffeModel.reshape makes a net for another size)
    checks_batch = True

    def with_batch(self, example_inputs: Any, n: int) -> Any:
        """The example arrays with `n` rows (base.grow_arrays)."""
        from aiacc.plugins.base import grow_arrays

        return grow_arrays(example_inputs, n)

    def detect(self, model: Any) -> bool:
        """A CaffeModel or OrtCaffeModel (aiacc's own classes: there is no Caffe package)."""
        return type(model).__module__.startswith("aiacc.plugins.caffe")

    def trace(self, model: Any, example_inputs: Any = None, **options: Any) -> Graph:
        """The net as an IR graph (a fresh copy the caller may change)."""
        return _model(model).graph.copy()

    def export_native(self, graph: Graph, *, original: Any = None, **options: Any) -> Any:
        """A CaffeModel (.prototxt + .caffemodel layers) computing the graph."""
        from aiacc.plugins.caffe import export_ops  # noqa: F401  (fills the exporter's table)
        from aiacc.plugins.caffe.exporter import export_graph

        return export_graph(graph, _name(original))

    def export_onnxruntime(self, graph: Graph, *, original: Any = None, providers: Any = None,
                           **options: Any) -> Any:
        """An OrtCaffeModel: CaffeModel's forward(), run in onnxruntime."""
        from aiacc.plugins.caffe.model import CaffeModel
        from aiacc.plugins.caffe.ort import OrtCaffeModel

        # the outputs keep the original's blob names (the passes may rename the values behind them)
        outputs = original.outputs if isinstance(original, CaffeModel) else None
        if outputs is not None and len(outputs) != len(graph.outputs):
            outputs = None
        return OrtCaffeModel(graph, outputs, name=_name(original), providers=providers)

    def run(self, model: Any, example_inputs: Any) -> list[np.ndarray]:
        from aiacc.plugins.caffe.ort import OrtCaffeModel

        if not isinstance(model, OrtCaffeModel):
            model = _model(model)
        return list(model.forward(**model.feeds(example_inputs)).values())

    def output_names(self, model: Any) -> list[str]:
        """The output blob names `forward` returns (a CaffeModel's or an OrtCaffeModel's)."""
        return list(model.outputs)

    def runner(self, model: Any, inputs: Any) -> Callable[[], list[np.ndarray]]:
        """A CaffeModel runs in OpenCV dnn where OpenCV is installed, else (and an OrtCaffeModel always)
        its own forward()."""
        from aiacc.plugins.caffe.model import CaffeModel

        if isinstance(model, CaffeModel) and opencv_available():
            return opencv_runner(model, inputs)
        feeds = dict(inputs)
        return lambda: list(model.forward(**feeds).values())

    def feeds(self, graph: Graph, example_inputs: Any) -> dict[str, np.ndarray] | None:
        names = [v.name for v in graph.inputs]
        if isinstance(example_inputs, dict):
            return {k: np.asarray(v, dtype=np.float32) for k, v in example_inputs.items()}
        if isinstance(example_inputs, (list, tuple)):
            return {n: np.asarray(a, dtype=np.float32) for n, a in zip(names, example_inputs)}
        if example_inputs is not None and len(names) == 1:
            return {names[0]: np.asarray(example_inputs, dtype=np.float32)}
        return None


def _name(original: Any) -> str | None:
    from aiacc.plugins.caffe.model import CaffeModel

    return original.name if isinstance(original, CaffeModel) and original.name else None


def opencv_available() -> bool:
    """True when OpenCV (cv2) is installed."""
    import importlib.util

    return importlib.util.find_spec("cv2") is not None


def opencv_runner(caffe_model: Any, inputs: dict[str, np.ndarray]) -> Callable[[], list[np.ndarray]]:
    """A callable running a CaffeModel's .prototxt/.caffemodel in OpenCV dnn, the Caffe runtime at hand
    (there is no Caffe package). Winograd is off: it changes the numbers beyond 1e-4."""
    import tempfile

    import cv2

    with tempfile.TemporaryDirectory(prefix="aiacc-caffe-") as tmp:
        prototxt, caffemodel = os.path.join(tmp, "net.prototxt"), os.path.join(tmp, "net.caffemodel")
        caffe_model.save(prototxt, caffemodel)
        net = cv2.dnn.readNetFromCaffe(prototxt, caffemodel)
    net.enableWinograd(False)
    feeds = dict(inputs)
    outs = list(caffe_model.outputs)

    def run():
        for name, x in feeds.items():
            net.setInput(x, name)
        return [np.array(o) for o in net.forward(outs)]
    return run


PLUGIN = CaffePlugin()
CaffeTranslator = CaffePlugin  # the name earlier code uses
