"""ONNX QuantizeLinear / DequantizeLinear (opset 13+ semantics: per-tensor or per-axis scale and zero point).

They are what aiacc's int8 plan (aiacc.core.quant) inserts: the reference executor runs them with these
kernels, onnxruntime fuses DequantizeLinear -> op -> QuantizeLinear groups into its integer kernels.
"""
from __future__ import annotations

import numpy as np

from aiacc.core.ir import TensorType
from aiacc.core.ops.registry import InferContext, op

_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "int32": (-2 ** 31, 2 ** 31 - 1)}


def _along(param: np.ndarray, x: np.ndarray, axis: int) -> np.ndarray:
    """A per-axis parameter reshaped to broadcast against x along `axis` (scalars stay scalars)."""
    param = np.asarray(param)
    if param.ndim == 0 or param.size == 1 and x.ndim == 0:
        return param.reshape(())
    shape = [1] * x.ndim
    shape[axis % x.ndim] = param.size
    return param.reshape(shape)


def _infer_quantize(ctx: InferContext) -> list[TensorType | None]:
    zp = ctx.type(2) if ctx.has_input(2) else None
    dtype = zp.dtype if zp is not None and zp.dtype else "uint8"
    x = ctx.type(0)
    return [TensorType(dtype, None if x is None else x.shape)]


def _infer_dequantize(ctx: InferContext) -> list[TensorType | None]:
    x, s = ctx.type(0), ctx.type(1)
    return [TensorType(s.dtype if s is not None and s.dtype else "float32", None if x is None else x.shape)]


@op("QuantizeLinear", attrs={"axis": ("int", 1), "saturate": ("int", 1)}, inputs=(2, 3), infer=_infer_quantize)
def quantize_linear(x, scale, zero_point=None, *, axis, saturate):
    """y = saturate(round_half_to_even(x / scale) + zero_point), in the zero point's type (uint8 if none)."""
    dtype = np.asarray(zero_point).dtype.name if zero_point is not None else "uint8"
    lo, hi = _RANGES[dtype]
    zp = 0 if zero_point is None else _along(zero_point, x, axis).astype(np.int64)
    q = np.rint(x / _along(scale, x, axis).astype(x.dtype)) + zp
    return np.clip(q, lo, hi).astype(dtype)


@op("DequantizeLinear", attrs={"axis": ("int", 1)}, inputs=(2, 3), infer=_infer_dequantize)
def dequantize_linear(x, scale, zero_point=None, *, axis):
    """y = (x - zero_point) * scale, in the scale's float type."""
    zp = 0 if zero_point is None else _along(zero_point, x, axis).astype(np.int64)
    s = np.asarray(scale)
    return ((x.astype(np.int64) - zp).astype(s.dtype) * _along(s, x, axis)).astype(s.dtype)
