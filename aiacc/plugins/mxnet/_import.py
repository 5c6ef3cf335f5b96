"""Import MXNet 1.9 on a modern numpy.

MXNet 1.9.1 still uses the numpy aliases (np.bool, np.int, ...) that numpy 1.24 removed. They are
restored right before importing mxnet, only where missing, and only when the MXNet plugin needs mxnet.
"""
from __future__ import annotations

import importlib
import sys

_ALIASES = {"bool": bool, "int": int, "float": float, "complex": complex, "object": object, "str": str}


def import_mxnet():
    """Restore the removed numpy aliases if absent, import mxnet and return the module."""
    if "mxnet" in sys.modules:
        return sys.modules["mxnet"]
    import numpy as np

    for name, value in _ALIASES.items():
        if name not in np.__dict__:
            setattr(np, name, value)
    return importlib.import_module("mxnet")
