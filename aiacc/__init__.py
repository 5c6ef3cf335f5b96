"""aiacc: one graph optimizer for PyTorch, TensorFlow, MXNet and Caffe models.

    fast = aiacc.optimize(model, example_inputs)   # same kind of model back, faster, same numbers

This module stays light: it imports no deep-learning framework. Each call goes to the plugin of the model's
framework (aiacc.plugins: every plugin implements the protocol in aiacc.plugins.base), which imports its
framework the first time a model of that framework is traced, exported or run.
"""
from __future__ import annotations

from typing import Any

from aiacc.errors import AiaccError  # noqa: F401

__version__ = "0.1.0"


def trace(model: Any, example_inputs: Any = None, **options: Any):
    """Translate a framework model into an aiacc IR `Graph` (aiacc.core.Graph)."""
    from aiacc.plugins import framework_of, get_plugin

    return get_plugin(framework_of(model)).trace(model, example_inputs, **options)


def optimize(model: Any, example_inputs: Any = None, *, level: int = 2, passes: Any = None, disable: Any = None,
             backend: str = "native", verify: bool = True, debug: bool = False, precision: str = "fp32",
             calibration: Any = None, tolerance: Any = None, keep_float: Any = None, holdout: Any = None,
             **options: Any):
    """Optimize a model and return the same kind of model.

    level: 0 (translate only) to 3 (every pass); passes: run exactly these passes; disable: skip these;
    backend: "native" (lowered to the framework's fastest form) or "onnxruntime"; verify: run the original
    and the optimized model on the example inputs and refuse a result that differs; debug: verify the
    graph and its numerics after every pass. Framework-specific options pass through (e.g. mode="train").

    precision: "fp32", "bf16", "fp16" or "int8" (aiacc.plugins.precision): calibration: an iterable of
    inputs (each like example_inputs) int8 measures activation ranges on; keep_float: layer names to keep
    in float (default: the per-layer sensitivity decides); tolerance: max relative error (a number) or
    {"top1": agreement} the result must meet against the original on holdout (an iterable of inputs) or
    else the calibration inputs, checked when verify=True (VerificationError naming the worst layers).
    """
    from aiacc.plugins import framework_of, get_plugin
    from aiacc.plugins.precision import check_options, check_precision, optimize_precision

    precision = check_precision(precision)
    check_options(precision, calibration, tolerance, keep_float, holdout)
    if precision != "fp32":
        return optimize_precision(get_plugin(framework_of(model)), model, example_inputs, precision=precision,
                                  calibration=calibration, tolerance=tolerance, keep_float=keep_float,
                                  holdout=holdout, level=level, passes=passes, disable=disable, backend=backend,
                                  verify=verify, debug=debug, **options)
    return get_plugin(framework_of(model)).optimize(model, example_inputs, level=level, passes=passes,
                                                    disable=disable, backend=backend, verify=verify, debug=debug,
                                                    **options)


def export(graph: Any, framework: str, **options: Any):
    """Turn an IR graph into a model of `framework` ("torch", "tf", "mxnet", "caffe" or "onnx"); options:
    backend ("native" or "onnxruntime"), providers (onnxruntime's), original (the model it came from)."""
    from aiacc.plugins import get_plugin

    return get_plugin(framework).export(graph, **options)


def view(model_or_graph: Any, example_inputs: Any = None, optimize: bool = False, output: Any = "report.html",
         **options: Any):
    """Write a self-contained HTML view of a model (graph, passes, memory plan, communication) and return
    its path; see aiacc.view.view for the options. (Once the subpackage aiacc.view is imported this name is
    that module, which is callable the same way.)"""
    from aiacc.view import view as _view

    return _view(model_or_graph, example_inputs, optimize, output, **options)
