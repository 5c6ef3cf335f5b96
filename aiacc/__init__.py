"""aiacc: one graph optimizer for PyTorch, TensorFlow, MXNet and Caffe models.

    fast = aiacc.optimize(model, example_inputs)   # same kind of model back, faster, same numbers

This module stays light: it imports no deep-learning framework. The plugin of a model's framework is
imported the first time a model of that framework is seen.
"""
from __future__ import annotations

from typing import Any

from aiacc.errors import AiaccError  # noqa: F401

__version__ = "0.1.0"


def trace(model: Any, example_inputs: Any = None, **options: Any):
    """Translate a framework model into an aiacc IR `Graph` (aiacc.core.Graph)."""
    from aiacc.plugins import plugin_for

    return plugin_for(model).trace(model, example_inputs, **options)


def optimize(model: Any, example_inputs: Any = None, *, level: int = 2, passes: Any = None, disable: Any = None,
             backend: str = "native", verify: bool = True, debug: bool = False, **options: Any):
    """Optimize a model and return the same kind of model.

    level: 0 (translate only) to 3 (every pass); passes: run exactly these passes; disable: skip these;
    backend: "native" (lowered to the framework's fastest form) or "onnxruntime"; verify: run the original
    and the optimized model on the example inputs and refuse a result that differs; debug: verify the
    graph and its numerics after every pass. Framework-specific options pass through (e.g. mode="train").
    """
    from aiacc.plugins import plugin_for

    return plugin_for(model).optimize(model, example_inputs, level=level, passes=passes, disable=disable,
                                      backend=backend, verify=verify, debug=debug, **options)


def export(graph: Any, framework: str, **options: Any):
    """Turn an IR graph into a model of `framework` ("torch", "tf", "mxnet", "caffe" or "onnx")."""
    from aiacc.plugins import load_plugin

    return load_plugin(framework).export(graph, **options)
