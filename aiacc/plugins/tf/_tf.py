"""Lazy TensorFlow import and the dtype/shape conversions every TF module of the plugin shares."""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from aiacc.errors import UnsupportedError

# dtypes the IR and the reference executor handle (numpy names)
SUPPORTED_DTYPES = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
                    "uint32", "uint64", "bool"}


def tf():
    """The tensorflow module, imported on first use with its C++ logging quietened."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow

    return tensorflow


def np_dtype_name(dtype: Any, where: str) -> str:
    """numpy dtype name of a tf.DType; UnsupportedError naming `where` when the IR cannot hold it."""
    tfm = tf()
    dt = tfm.as_dtype(dtype)
    name = dt.name
    if name not in SUPPORTED_DTYPES:
        raise UnsupportedError(f"{where}: dtype {name} is not supported by aiacc "
                               f"(supported: {', '.join(sorted(SUPPORTED_DTYPES))})")
    return np.dtype(dt.as_numpy_dtype).name


def tf_shape(shape: Any) -> tuple | None:
    """A TensorShape as a tuple with None for unknown dimensions (None when the rank is unknown)."""
    tfm = tf()
    shape = tfm.TensorShape(shape)
    return None if shape.rank is None else tuple(shape.as_list())


def same_pads(sizes, kernel, strides, dilations) -> list[int]:
    """ONNX pads (all begins, then all ends) equal to TF's padding='SAME' for these spatial sizes."""
    pads_b, pads_e = [], []
    for n, k, s, d in zip(sizes, kernel, strides, dilations):
        out = -(-n // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
        pads_b.append(total // 2)
        pads_e.append(total - total // 2)
    return pads_b + pads_e
