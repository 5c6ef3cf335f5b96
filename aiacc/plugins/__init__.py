"""Framework plugins, one subpackage each (aiacc.plugins.torch, .tf, .mxnet, .caffe, .onnx), every one an
implementation of the protocol in aiacc.plugins.base: `aiacc.plugins.<name>.plugin` is its `Plugin`.

Plugin packages are import-light (the framework is imported only when a model is traced, exported or run),
so detection can ask each plugin's `detect` in turn: it looks at `sys.modules` (a user holding a torch
model has imported torch already) and imports nothing. `import aiacc` never imports a framework.
"""
from __future__ import annotations

import importlib
from typing import Any

from aiacc.errors import UnsupportedError

FRAMEWORKS = ("torch", "tf", "mxnet", "caffe", "onnx")  # the order detection asks them in


def load_plugin(name: str):
    """The plugin package `aiacc.plugins.<name>` (its `plugin` attribute is the Plugin), imported on first use."""
    if name not in FRAMEWORKS:
        raise UnsupportedError(f"unknown framework {name!r} (known: {', '.join(FRAMEWORKS)})")
    return importlib.import_module(f"aiacc.plugins.{name}")


def get_plugin(name: str):
    """The `Plugin` object of framework `name`."""
    return load_plugin(name).plugin


def framework_of(model: Any) -> str:
    """The name of the plugin that handles `model` ("torch", "tf", "mxnet", "caffe" or "onnx")."""
    for name in FRAMEWORKS:
        if get_plugin(name).detect(model):
            return name
    raise UnsupportedError(f"aiacc does not know what framework a {type(model).__module__}.{type(model).__name__} "
                           f"belongs to; expected a torch.nn.Module, a Keras model / tf.Module / tf.function, "
                           f"a Gluon block or MXNet Symbol, an aiacc CaffeModel or an ONNX ModelProto")


def plugin_for(model: Any):
    """The plugin package for `model` (trace, optimize, export, plugin), imported on first use."""
    return load_plugin(framework_of(model))
