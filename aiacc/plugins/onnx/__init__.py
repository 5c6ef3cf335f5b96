"""aiacc ONNX plugin: an onnx.ModelProto in, an optimized onnx.ModelProto out.

    fast = aiacc.optimize(model_proto, [x])       # standard ONNX again (verified in onnxruntime)
    graph = aiacc.plugins.onnx.trace(model_proto)

Import-light: onnx and onnxruntime are imported on first use. `plugin` is the plugin protocol object
(aiacc.plugins.base.Plugin, in translator.py); files.py holds `aiacc inspect/dump/optimize` on .onnx files
(and on aiacc's own graph files, whose reader and writer the command passes in).
"""
from aiacc.plugins.onnx.translator import PLUGIN as plugin

trace, optimize, export = plugin.trace, plugin.optimize, plugin.export

__all__ = ["plugin", "trace", "optimize", "export"]
