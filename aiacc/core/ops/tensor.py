"""Shape and data-movement ops (ONNX semantics): reshape, transpose, concat, gather, cast, constants..."""
from __future__ import annotations

import ml_dtypes
import numpy as np

from aiacc.core.ir import TensorType, type_of_array
from aiacc.core.ops.registry import InferContext, infer_by_running, op
from aiacc.core.ops.shape_utils import broadcast_shapes, normalize_axis, numel


@op("Constant", inputs=0, attrs={"value": ("tensor", None), "value_float": ("float", None),
                                 "value_floats": ("floats", None), "value_int": ("int", None),
                                 "value_ints": ("ints", None)})
def constant(*, value, value_float, value_floats, value_int, value_ints):
    """A constant tensor held in an attribute."""
    for v, dt in ((value, None), (value_float, np.float32), (value_floats, np.float32), (value_int, np.int64),
                  (value_ints, np.int64)):
        if v is not None:
            return np.asarray(v, dtype=dt)
    raise ValueError("Constant has no value attribute")


@op("Identity", infer=lambda ctx: [ctx.type(0)], elementwise=True)
def identity(x):
    return x


# the float8 types whose Cast saturates by default (ONNX: out-of-range values become +-max, not NaN/inf)
_SATURATING_FLOAT8 = {"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"}


@op("Cast", attrs={"to": ("string", "float32"), "saturate": ("int", 1), "round_mode": ("string", "up")},
    infer=lambda ctx: [TensorType(ctx.attrs["to"], ctx.shape(0)) if ctx.type(0) else None], elementwise=True)
def cast(x, *, to, saturate, round_mode):
    """Cast to the numpy dtype named by `to` (the ONNX bridge maps ONNX's integer codes to names). The ONNX
    low-precision types are ml_dtypes' numpy dtypes: float8 saturates unless saturate=0 (NaN stays NaN), and
    float8_e8m0fnu rounds its power of two as round_mode says (up, down, nearest)."""
    name = np.dtype(to).name
    if name in _SATURATING_FLOAT8 and saturate:
        info = ml_dtypes.finfo(name)
        return np.clip(x, info.min, info.max).astype(to)
    if name == "float8_e8m0fnu":
        return _to_e8m0(x, bool(saturate), round_mode)
    return x.astype(to)


def _to_e8m0(x, saturate: bool, round_mode: str) -> np.ndarray:
    """float32 -> float8_e8m0fnu (an 8-bit exponent, no sign or mantissa): NaN and inf become NaN (0xFF); a
    value between two powers of two rounds as round_mode says; saturate keeps a round-up at 2^127."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.uint16)
    special = exponent == 0xFF
    if round_mode == "nearest":
        guard, rnd = (bits & 0x400000) > 0, (bits & 0x200000) > 0
        sticky, lsb = (bits & 0x1FFFFF) > 0, exponent > 0
        up = guard & (rnd | sticky | lsb)
    elif round_mode == "up":
        up = (bits & 0x7FFFFF) > 0
    elif round_mode == "down":
        up = np.zeros(bits.shape, bool)
    else:
        raise ValueError(f"Cast round_mode must be up, down or nearest, got {round_mode!r}")
    up &= ~special
    if saturate:
        up &= exponent != 0xFE
    out = np.where(special, 0xFF, exponent + up).astype(np.uint8)
    return out.view(ml_dtypes.float8_e8m0fnu)


@op("Shape", attrs={"start": ("int", 0), "end": ("int", None)},
    infer=lambda ctx: [TensorType("int64", None if ctx.shape(0) is None else
                                  (len(range(*slice(ctx.attrs["start"], ctx.attrs["end"])
                                                 .indices(len(ctx.shape(0))))),))])
def shape(x, *, start, end):
    return np.asarray(x.shape[start:end], dtype=np.int64)


def infer_flatten(ctx: InferContext):
    s = ctx.shape(0)
    if s is None:
        return [TensorType(ctx.dtype(0), (None, None)) if ctx.dtype(0) else None]
    axis = ctx.attrs["axis"]
    if not -len(s) <= axis <= len(s):
        raise ctx.fail(f"axis {axis} is out of range for rank {len(s)}")
    axis = axis + len(s) if axis < 0 else axis
    return [TensorType(ctx.dtype(0), (_product(s[:axis]), _product(s[axis:])))]


def _product(dims):
    """Product of dims; a lone symbol times ones stays that symbol (Flatten of [N, 2048, 1, 1] is [N, 2048])."""
    n = numel(dims)
    if n is not None:
        return n
    rest = [d for d in dims if d != 1]
    return rest[0] if len(rest) == 1 and isinstance(rest[0], str) else None


@op("Flatten", attrs={"axis": ("int", 1)}, infer=infer_flatten)
def flatten(x, *, axis):
    axis = axis + x.ndim if axis < 0 else axis
    return x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)


def reshape_target(in_shape, target, allowzero):
    """The output shape of Reshape; in_shape may hold symbols, which survive where they are copied."""
    target = [int(t) for t in target]
    out: list = []
    for i, t in enumerate(target):
        if t == 0 and not allowzero:
            if i >= len(in_shape):
                raise ValueError(f"reshape target {target} copies dimension {i} the input lacks")
            out.append(in_shape[i])
        else:
            out.append(t)
    if out.count(-1) > 1:
        raise ValueError(f"reshape target {target} has more than one -1")
    if -1 in out:
        known = numel([d for d in out if d != -1])
        total = numel(in_shape)
        if total is None or known is None:
            # symbolic: the -1 takes the symbol when the other dimensions are copied through unchanged
            rest = [d for d in in_shape if d not in out]
            out[out.index(-1)] = rest[0] if len(rest) == 1 and isinstance(rest[0], str) else None
        else:
            if known == 0 or total % known:
                raise ValueError(f"cannot reshape {list(in_shape)} to {target}")
            out[out.index(-1)] = total // known
    elif numel(in_shape) is not None and numel(out) is not None and numel(in_shape) != numel(out):
        raise ValueError(f"cannot reshape {list(in_shape)} ({numel(in_shape)} elements) to {target}")
    return tuple(out)


def infer_reshape(ctx: InferContext):
    target = ctx.const(1)
    s = ctx.shape(0)
    if target is None or s is None:
        t2 = ctx.shape(1)
        return [TensorType(ctx.dtype(0), None if t2 is None or not isinstance(t2[0], int) else (None,) * t2[0])]
    try:
        return [TensorType(ctx.dtype(0), reshape_target(s, target.tolist(), ctx.attrs["allowzero"]))]
    except ValueError as e:
        raise ctx.fail(str(e)) from None


@op("Reshape", attrs={"allowzero": ("int", 0)}, inputs=2, infer=infer_reshape)
def reshape(x, shape, *, allowzero):
    return x.reshape(reshape_target(x.shape, shape.tolist(), allowzero))


def infer_transpose(ctx: InferContext):
    s = ctx.shape(0)
    if s is None:  # unknown rank: the dtype is still known
        return [TensorType(ctx.dtype(0), None) if ctx.dtype(0) else None]
    perm = ctx.attrs["perm"] or list(range(len(s)))[::-1]
    if sorted(perm) != list(range(len(s))):
        raise ctx.fail(f"perm {perm} is not a permutation of {len(s)} axes")
    return [TensorType(ctx.dtype(0), tuple(s[p] for p in perm))]


@op("Transpose", attrs={"perm": ("ints", None)}, infer=infer_transpose)
def transpose(x, *, perm):
    return np.transpose(x, perm)


def _axes(ctx_or_attr, const):
    return None if const is None else [int(a) for a in np.asarray(const).reshape(-1)]


def infer_squeeze(ctx: InferContext):
    s = ctx.shape(0)
    if s is None:  # unknown rank: the dtype is still known
        return [TensorType(ctx.dtype(0), None) if ctx.dtype(0) else None]
    axes = _axes(ctx, ctx.const(1)) if ctx.has_input(1) else None
    if ctx.has_input(1) and axes is None:
        return [TensorType(ctx.dtype(0), None)]
    if axes is None:
        if any(not isinstance(d, int) for d in s):
            return [TensorType(ctx.dtype(0), None)]
        return [TensorType(ctx.dtype(0), tuple(d for d in s if d != 1))]
    axes = {normalize_axis(a, len(s)) for a in axes}
    for a in axes:
        if isinstance(s[a], int) and s[a] != 1:
            raise ctx.fail(f"cannot squeeze axis {a} of size {s[a]}")
    return [TensorType(ctx.dtype(0), tuple(d for i, d in enumerate(s) if i not in axes))]


@op("Squeeze", inputs=(1, 2), infer=infer_squeeze)
def squeeze(x, axes=None):
    return np.squeeze(x, axis=None if axes is None else tuple(int(a) for a in axes))


def infer_unsqueeze(ctx: InferContext):
    s = ctx.shape(0)
    axes = _axes(ctx, ctx.const(1))
    if s is None or axes is None:
        return [TensorType(ctx.dtype(0), None)]
    rank = len(s) + len(axes)
    axes = sorted(normalize_axis(a, rank) for a in axes)
    out = list(s)
    for a in axes:
        out.insert(a, 1)
    return [TensorType(ctx.dtype(0), tuple(out))]


@op("Unsqueeze", inputs=2, infer=infer_unsqueeze)
def unsqueeze(x, axes):
    rank = x.ndim + axes.size
    out = x
    for a in sorted(int(a) % rank for a in axes.reshape(-1)):
        out = np.expand_dims(out, a)
    return out


def infer_concat(ctx: InferContext):
    types = [ctx.type(i) for i in range(ctx.num_inputs) if ctx.has_input(i)]
    if any(t is None or t.shape is None for t in types):
        return [TensorType(types[0].dtype if types and types[0] else None, None)]
    rank = len(types[0].shape)
    if any(len(t.shape) != rank for t in types):
        raise ctx.fail("inputs have different ranks")
    axis = normalize_axis(ctx.attrs["axis"], rank)
    out = list(types[0].shape)
    for k in range(rank):
        dims = [t.shape[k] for t in types]
        if k == axis:
            out[k] = sum(dims) if all(isinstance(d, int) for d in dims) else None
        else:
            concrete = {d for d in dims if isinstance(d, int)}
            if len(concrete) > 1:
                raise ctx.fail(f"dimension {k} differs between inputs: {dims}")
            out[k] = concrete.pop() if concrete else dims[0]
    return [TensorType(types[0].dtype, tuple(out))]


@op("Concat", attrs={"axis": ("int", 0)}, inputs=(1, -1), infer=infer_concat)
def concat(*xs, axis):
    return np.concatenate(xs, axis=axis)


def infer_gather(ctx: InferContext):
    data, idx = ctx.shape(0), ctx.shape(1)
    if data is None or idx is None:
        return [TensorType(ctx.dtype(0), None)]
    axis = normalize_axis(ctx.attrs["axis"], len(data))
    return [TensorType(ctx.dtype(0), tuple(data[:axis]) + tuple(idx) + tuple(data[axis + 1:]))]


@op("Gather", attrs={"axis": ("int", 0)}, inputs=2, infer=infer_gather)
def gather(data, indices, *, axis):
    """Gather along an axis; negative indices count from the end."""
    idx = indices.astype(np.int64)
    n = data.shape[axis]
    if idx.size and (idx.max() >= n or idx.min() < -n):
        raise IndexError(f"index out of range for axis {axis} of size {n}")
    return np.take(data, np.where(idx < 0, idx + n, idx), axis=axis)


def infer_expand(ctx: InferContext):
    """Broadcast of x against the target shape; an unknown target gives unknown dims of known rank."""
    s = ctx.shape(0)
    target = ctx.const(1)
    if target is None:
        ts = ctx.shape(1)
        if s is None or ts is None or not isinstance(ts[0], int):
            return [TensorType(ctx.dtype(0), None)]
        return [TensorType(ctx.dtype(0), (None,) * max(len(s), ts[0]))]
    if s is None:
        return [TensorType(ctx.dtype(0), None)]
    try:
        return [TensorType(ctx.dtype(0), broadcast_shapes(s, tuple(int(d) for d in target.reshape(-1))))]
    except ValueError as e:
        raise ctx.fail(str(e)) from None


@op("Expand", inputs=2, infer=infer_expand)
def expand(x, shape):
    """Broadcast x to `shape` (bidirectional, as numpy)."""
    target = np.broadcast_shapes(x.shape, tuple(int(d) for d in shape))
    return np.broadcast_to(x, target).copy()
