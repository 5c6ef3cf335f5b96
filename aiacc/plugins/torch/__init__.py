"""aiacc torch plugin: torch.nn.Module <-> aiacc IR.

    graph = aiacc.plugins.torch.trace(module, example_inputs)            # IR (mode follows module.training)
    fast = aiacc.plugins.torch.optimize(module, example_inputs)          # fx.GraphModule, same signature
    module2 = aiacc.plugins.torch.export(graph)                          # IR -> fx.GraphModule

Import-light: torch is imported when one of these functions is first called. `plugin` is the plugin
protocol object (aiacc.plugins.base.Plugin). Modules: _fx.py (tracing), importer.py + convert.py +
attention.py (torch -> IR), exporter.py + lowerings.py (IR -> torch), translator.py (the Plugin),
ort.py (backend="onnxruntime"), files.py (`aiacc inspect/dump/optimize` on .pt2 and pkg.module:factory).
"""
from aiacc.plugins.torch.translator import PLUGIN as plugin

trace, optimize, export = plugin.trace, plugin.optimize, plugin.export

__all__ = ["plugin", "trace", "optimize", "export"]
