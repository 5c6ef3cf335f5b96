"""aiacc torch plugin: torch.nn.Module <-> aiacc IR.

    graph = aiacc.plugins.torch.trace(module, example_inputs)            # IR (mode follows module.training)
    fast = aiacc.plugins.torch.optimize(module, example_inputs)          # fx.GraphModule, same signature
    module2 = aiacc.plugins.torch.export(graph)                          # IR -> fx.GraphModule

Import-light: torch is imported when one of these functions is first called. `plugin` is the plugin
protocol object (aiacc.plugins.base.Plugin). Modules: _fx.py (tracing), importer.py + import_ops/ (torch ->
IR: the op tables, one module per op family), exporter.py + export_ops/ (IR -> torch lowerings, the same),
fastpath.py (oneDNN calls), memory.py (training under a memory budget), translator.py (the Plugin),
ort.py (backend="onnxruntime"), files.py (`aiacc inspect/dump/optimize` on .pt2 and pkg.module:factory),
horovod.py + distributed.py (data-parallel training).
"""
from aiacc.plugins.torch.translator import PLUGIN as plugin

trace, optimize, export = plugin.trace, plugin.optimize, plugin.export

__all__ = ["plugin", "trace", "optimize", "export"]
