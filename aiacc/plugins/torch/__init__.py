"""aiacc torch plugin: torch.nn.Module <-> aiacc IR.

    graph = aiacc.plugins.torch.trace(module, example_inputs)            # IR (mode follows module.training)
    fast = aiacc.plugins.torch.optimize(module, example_inputs)          # fx.GraphModule, same signature
    module2 = aiacc.plugins.torch.export(graph)                          # IR -> fx.GraphModule

Import-light: torch is imported when one of these functions is first called (the plugin package itself is
imported only once a torch model has been seen). Modules: _fx.py (tracing), importer.py + convert.py +
attention.py (torch -> IR), exporter.py + lowerings.py (IR -> torch), translator.py (optimize flow),
ort.py (backend="onnxruntime"), files.py (`aiacc inspect/dump/optimize` on .pt2 and pkg.module:factory).
"""
from __future__ import annotations

from typing import Any


def trace(model: Any, example_inputs: Any = None, **options: Any):
    """Translate a torch.nn.Module into an aiacc IR Graph (mode='train' keeps training semantics)."""
    from aiacc.plugins.torch.translator import trace as _trace

    return _trace(model, example_inputs, **options)


def optimize(model: Any, example_inputs: Any = None, **options: Any):
    """Trace, optimize and export back to torch (see aiacc.optimize for the options)."""
    from aiacc.plugins.torch.translator import optimize as _optimize

    return _optimize(model, example_inputs, **options)


def export(graph: Any, **options: Any):
    """Turn an IR Graph into a torch module (original=, backend='native' | 'onnxruntime')."""
    from aiacc.plugins.torch.translator import export as _export

    return _export(graph, **options)
