"""aiacc MXNet plugin: Gluon HybridBlocks, (Symbol, arg_params, aux_params) triples and exported
`-symbol.json` + `.params` files to the aiacc IR and back to a `gluon.SymbolBlock`.

    fast = aiacc.optimize(net, x)                    # net: a HybridBlock; fast: a gluon.SymbolBlock
    fast.export("model")                             # model-symbol.json + model-0000.params

Import-light: mxnet is imported (with numpy's removed aliases restored first, see `_import`) only when
a model is traced, exported or run. Submodules: symjson (the JSON format), importer (MXNet ops -> IR),
exporter (IR -> MXNet ops), mxrun (everything that calls mxnet), native (the exported SymbolBlock, run
with MXNet's MKLDNN fusions where available), translator (the plugin API), files (the CLI's file entry
points), ort (the onnxruntime backend), horovod (distributed training).
"""
from __future__ import annotations

from typing import Any


def _translator():
    from aiacc.plugins.mxnet.translator import MXNetTranslator

    return MXNetTranslator()


def trace(model: Any, example_inputs: Any = None, **options: Any):
    """Translate a Gluon HybridBlock, a (Symbol, arg_params, aux_params) triple, a Symbol or a
    -symbol.json path into an aiacc IR Graph."""
    return _translator().trace(model, example_inputs, **options)


def optimize(model: Any, example_inputs: Any = None, **options: Any):
    """Optimize an MXNet model; returns a gluon.SymbolBlock (see aiacc.optimize for the options)."""
    from aiacc.plugins.base import optimize_model

    return optimize_model(_translator(), model, example_inputs, **options)


def export(graph, **options: Any):
    """Turn an IR graph into a gluon.SymbolBlock (backend="native") or an onnxruntime-backed Gluon block."""
    return _translator().export(graph, **options)
