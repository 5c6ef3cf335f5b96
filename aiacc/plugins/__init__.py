"""Framework plugins. Each one lives in its own subpackage and is imported only when a model of its
framework is seen, so `import aiacc` never imports a framework.

Detection looks at `sys.modules`: a user holding a torch model has imported torch already, so checking
`isinstance` against the already-imported module costs nothing and imports nothing.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any

from aiacc.errors import UnsupportedError

FRAMEWORKS = ("torch", "tf", "mxnet", "caffe", "onnx")


def _is_torch(model: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


def _is_tf(model: Any) -> bool:
    tf = sys.modules.get("tensorflow")
    keras = sys.modules.get("keras")
    if keras is not None and isinstance(model, keras.Model):
        return True
    if tf is None:
        return False
    function_types = tuple(t for t in (getattr(tf.types.experimental, "GenericFunction", None),
                                       getattr(tf.types.experimental, "ConcreteFunction", None)) if t)
    # objects restored by tf.saved_model.load are AutoTrackables, not tf.Modules
    restored = getattr(getattr(tf, "__internal__", None), "tracking", None)
    restored_types = (restored.AutoTrackable,) if restored is not None else ()
    return isinstance(model, (tf.Module,) + function_types + restored_types)


def _is_mxnet(model: Any) -> bool:
    mx = sys.modules.get("mxnet")
    if mx is None:
        return False
    if isinstance(model, (mx.gluon.Block, mx.symbol.Symbol)):
        return True
    return isinstance(model, tuple) and len(model) == 3 and isinstance(model[0], mx.symbol.Symbol)


def _is_caffe(model: Any) -> bool:
    return type(model).__module__.startswith("aiacc.plugins.caffe")


def _is_onnx(model: Any) -> bool:
    onnx = sys.modules.get("onnx")
    return onnx is not None and isinstance(model, onnx.ModelProto)


_DETECTORS = {"torch": _is_torch, "tf": _is_tf, "mxnet": _is_mxnet, "caffe": _is_caffe, "onnx": _is_onnx}


def framework_of(model: Any) -> str:
    """The name of the plugin that handles `model` ("torch", "tf", "mxnet", "caffe" or "onnx")."""
    for name, detect in _DETECTORS.items():
        if detect(model):
            return name
    raise UnsupportedError(f"aiacc does not know what framework a {type(model).__module__}.{type(model).__name__} "
                           f"belongs to; expected a torch.nn.Module, a Keras model / tf.Module / tf.function, "
                           f"a Gluon block or MXNet Symbol, an aiacc CaffeModel or an ONNX ModelProto")


def plugin_for(model: Any):
    """The plugin module for `model`, imported on first use."""
    return load_plugin(framework_of(model))


def load_plugin(name: str):
    """Import `aiacc.plugins.<name>` (the ONNX 'plugin' is `aiacc.plugins.onnx_plugin`)."""
    module = "aiacc.plugins.onnx_plugin" if name == "onnx" else f"aiacc.plugins.{name}"
    return importlib.import_module(module)
