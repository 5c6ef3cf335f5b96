"""The ONNX conformance backend under its historical name; it lives in `aiacc.backends.onnx_conformance`.

    import aiacc.onnx_backend as backend      # same objects as aiacc.backends.onnx_conformance
"""
from aiacc.backends.onnx_conformance import (AiaccBackend, AiaccRep, prepare, run_model, run_node,
                                             supports_device)

__all__ = ["AiaccBackend", "AiaccRep", "prepare", "run_model", "run_node", "supports_device"]
