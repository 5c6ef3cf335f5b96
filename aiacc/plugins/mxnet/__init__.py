"""aiacc MXNet plugin: Gluon HybridBlocks, (Symbol, arg_params, aux_params) triples and exported
`-symbol.json` + `.params` files to the aiacc IR and back to a `gluon.SymbolBlock`.

    fast = aiacc.optimize(net, x)                    # net: a HybridBlock; fast: a gluon.SymbolBlock
    fast.export("model")                             # model-symbol.json + model-0000.params

Import-light: mxnet is imported (with numpy's removed aliases restored first, see `_import`) only when
a model is traced, exported or run. Submodules: symjson (the JSON format), importer (MXNet ops -> IR),
exporter (IR -> MXNet ops), mxrun (everything that calls mxnet), native (the exported SymbolBlock, run
with MXNet's MKLDNN fusions where available), translator (the Plugin; `plugin` here), files (the CLI's file entry
points), ort (the onnxruntime backend), horovod (distributed training).
"""
from aiacc.plugins.mxnet.translator import PLUGIN as plugin

trace, optimize, export = plugin.trace, plugin.optimize, plugin.export

__all__ = ["plugin", "trace", "optimize", "export"]
