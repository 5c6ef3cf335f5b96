"""backend="onnxruntime" for TF: a tf.Module whose tf.function hands the inputs to onnxruntime.

The IR runs in onnxruntime sessions (aiacc.backends.onnxruntime.OrtGraphRunner); opaque TF ops run
between sessions through the eager kernel the importer attached. The call crosses into Python through
tf.numpy_function, so this module runs in the process that made it and is not SavedModel-portable
(the native backend is).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from aiacc.core.ir import Graph
from aiacc.errors import AiaccError, UnsupportedError, first_line
from aiacc.plugins.tf._tf import tf


def export_onnxruntime(graph: Graph, *, providers: Any = None) -> Any:
    """A tf.Module running `graph` on onnxruntime, with the graph's original input signature."""
    from aiacc.backends.onnxruntime import OrtGraphRunner

    try:
        runner = OrtGraphRunner(graph, providers=providers)
    except AiaccError:
        raise
    except Exception as e:  # onnxruntime refusing a segment (an op or dtype it has no kernel for)
        raise UnsupportedError(f"graph {graph.name}: onnxruntime cannot run it: {first_line(e)}") from e
    return numpy_runner_module(
        graph, runner, class_name="AiaccOrtTFModule", name_suffix="_ort", op_name="aiacc_onnxruntime",
        runner_attr="aiacc_runner",
        doc="A TF model whose graph runs in onnxruntime (made by aiacc.optimize(backend='onnxruntime')).")


def numpy_runner_module(graph: Graph, runner: Any, *, class_name: str, name_suffix: str, op_name: str,
                        runner_attr: str, doc: str) -> Any:
    """A tf.Module whose tf.function (the graph's input signature) calls `runner.run(feeds) -> [arrays]`
    through tf.numpy_function, restores the outputs' static shapes and packs them as the original returned
    them. The runner is kept as `module.<runner_attr>` (untracked, so it is not saved as TF state)."""
    from aiacc.plugins.tf.exporter import Untracked, input_signature, module_name, pack_outputs

    tfm = tf()
    specs = input_signature(graph)
    names = [v.name for v in graph.inputs]
    out_dtypes = [tfm.as_dtype(v.dtype) for v in graph.outputs]
    out_shapes = [None if v.shape is None else [d if isinstance(d, int) else None for d in v.shape]
                  for v in graph.outputs]
    structure = graph.meta.get("tf_output_structure")

    def run_numpy(*arrays):
        outs = runner.run({n: np.asarray(a) for n, a in zip(names, arrays)})
        return [np.asarray(o, dtype=d.as_numpy_dtype) for o, d in zip(outs, out_dtypes)]

    def call(self, *args):
        outs = tfm.numpy_function(run_numpy, tfm.nest.flatten(args), out_dtypes, stateful=False, name=op_name)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        for o, s in zip(outs, out_shapes):
            if s is not None:
                o.set_shape(s)
        return pack_outputs(structure, outs)

    cls = type(class_name, (tfm.Module,), {
        "__call__": tfm.function(call, input_signature=specs, autograph=False),
        "__doc__": doc,
    })
    module = cls(name=module_name(graph.name) + name_suffix)
    module.aiacc_graph = Untracked(graph)
    setattr(module, runner_attr, Untracked(runner))
    return module
