"""backend="aiacc" for every plugin: the optimized IR runs on aiacc's own runtime
(`aiacc.core.runtime.backend.AiaccRuntime`: the planned arena, numba kernels for fused elementwise nodes,
numpy / BLAS for the rest), wrapped in the framework's kind of model.

    fast = aiacc.optimize(model, x, backend="aiacc")

What comes back, per framework (called like the original, returning what the native path returns):
    torch   an nn.Module (same input signature and output structure; torch tensors out)
    tf      a tf.Module whose tf.function calls the runtime through tf.numpy_function (in-process only)
    mxnet   a gluon.Block (NDArrays out, mx.np arrays under npx.set_np())
    caffe   an object with CaffeModel's forward(**blobs) -> {output blob: array}; `to_caffe()` gives the
            plain CaffeModel (for .prototxt / .caffemodel files)
    onnx    an `AiaccSession`: InferenceSession's `run(output_names, feeds)` and `get_inputs()`
Each keeps its runtime as `aiacc_runtime` (its `report()` says what ran where).

The MXNet and Caffe wrappers are the plugins' onnxruntime wrappers (aiacc/plugins/<fw>/ort.py) with aiacc's
runtime (same `run(feeds) -> [arrays]`) in place of onnxruntime's; torch's is ort.RunnerModule's subclass and
TF's comes from tf/ort.py's numpy_runner_module, which the onnxruntime backends use too.
The runtime is for inference: mode="train" is refused.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from aiacc.core.ir import Graph
from aiacc.core.runtime.backend import AiaccRuntime
from aiacc.errors import UnsupportedError


def export_aiacc(plugin: Any, graph: Graph, *, original: Any = None, **options: Any) -> Any:
    """The graph as a model of `plugin`'s framework running on aiacc's runtime (backend="aiacc")."""
    mode = options.get("mode") or graph.meta.get("mxnet.mode")
    if mode in ("train", "training"):
        raise UnsupportedError("backend='aiacc' runs inference only; use backend='native' for mode='train'")
    runtime = AiaccRuntime(graph)
    build = _BUILDERS.get(plugin.name)
    if build is None:
        raise UnsupportedError(f"the {plugin.title} plugin has no backend 'aiacc'")
    model = build(graph, runtime, original)
    try:
        model.aiacc_runtime = runtime
    except (AttributeError, TypeError):
        pass
    return model


# --------------------------------------------------------------------------------------------- torch
def _torch(graph: Graph, runtime: AiaccRuntime, original: Any) -> Any:
    from aiacc.plugins.torch.ort import RunnerModule

    class AiaccModule(RunnerModule):
        """An nn.Module whose forward runs the graph on aiacc's runtime: called like the original (same
        argument names, same output structure); inputs cross as numpy views of CPU tensors' memory, outputs
        come back as tensors on the inputs' device. Inference only (no autograd through it)."""

    return AiaccModule(graph, runtime).eval()


# --------------------------------------------------------------------------------------------- tf
def _tf(graph: Graph, runtime: AiaccRuntime, original: Any) -> Any:
    from aiacc.plugins.tf.ort import numpy_runner_module

    return numpy_runner_module(
        graph, runtime, class_name="AiaccTFModule", name_suffix="_aiacc", op_name="aiacc_runtime",
        runner_attr="aiacc_runtime",
        doc="A TF model whose graph runs on aiacc's runtime (made by aiacc.optimize(backend='aiacc')).")


# --------------------------------------------------------------------------------------------- mxnet
def _mxnet(graph: Graph, runtime: AiaccRuntime, original: Any) -> Any:
    from aiacc.plugins.mxnet._import import import_mxnet
    from aiacc.plugins.mxnet.ort import OrtBlock

    mx = import_mxnet()

    class AiaccBlock(OrtBlock):
        """A gluon.Block computing the graph on aiacc's runtime; call it like the original model."""

        def __init__(self, graph: Graph, runtime: AiaccRuntime):
            mx.gluon.Block.__init__(self)
            self.aiacc_graph = graph
            self._runner = runtime

    return AiaccBlock(graph, runtime)


# --------------------------------------------------------------------------------------------- caffe
def _caffe(graph: Graph, runtime: AiaccRuntime, original: Any) -> Any:
    from aiacc.plugins.caffe.model import CaffeModel
    from aiacc.plugins.caffe.ort import OrtCaffeModel
    from aiacc.plugins.caffe.translator import _name

    outputs = original.outputs if isinstance(original, CaffeModel) else None
    if outputs is not None and len(outputs) != len(graph.outputs):
        outputs = None

    class AiaccCaffeModel(OrtCaffeModel):
        """A Caffe net on aiacc's runtime: `forward(**inputs) -> {output blob: array}` like CaffeModel."""

        def __init__(self, graph: Graph, runtime: AiaccRuntime):
            names = list(outputs) if outputs is not None else [v.name for v in graph.outputs]
            self.graph = graph
            self._name = _name(original) or graph.name
            self._outputs = names
            self.runner = runtime

        def __repr__(self) -> str:
            return f"<AiaccCaffeModel {self.name!r}: {len(self.graph.nodes)} nodes, {self.runner!r}>"

    return AiaccCaffeModel(graph, runtime)


# --------------------------------------------------------------------------------------------- onnx
class AiaccSession:
    """onnxruntime.InferenceSession's calling convention on aiacc's runtime: `run(output_names, feeds)`."""

    class _Arg:
        def __init__(self, v):
            self.name, self.type, self.shape = v.name, v.dtype, list(v.shape or [])

    def __init__(self, graph: Graph, runtime: AiaccRuntime):
        self.graph = graph
        self.aiacc_runtime = runtime

    def get_inputs(self) -> list:
        """The graph inputs (name, dtype, shape)."""
        return [self._Arg(v) for v in self.graph.inputs]

    def get_outputs(self) -> list:
        """The graph outputs (name, dtype, shape)."""
        return [self._Arg(v) for v in self.graph.outputs]

    def run(self, output_names: Any, feeds: dict) -> list[np.ndarray]:
        """The outputs named (all when None), in that order."""
        outs = self.aiacc_runtime.run_dict(feeds)
        names = [v.name for v in self.graph.outputs] if output_names is None else list(output_names)
        return [outs[n] for n in names]


def _onnx(graph: Graph, runtime: AiaccRuntime, original: Any) -> Any:
    return AiaccSession(graph, runtime)


_BUILDERS = {"torch": _torch, "tf": _tf, "mxnet": _mxnet, "caffe": _caffe, "onnx": _onnx}

__all__ = ["export_aiacc", "AiaccSession"]
