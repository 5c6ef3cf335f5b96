"""Converters for aten OpOverloads (programs from torch.export) whose arguments differ from the torch function
of the same name; the others reuse the torch converters (see importer.aten_converter)."""
from __future__ import annotations

import operator

import numpy as np
import torch
import torch.nn.functional as F

from aiacc.core.ir import Value
from aiacc.core.translate import Untranslatable
from aiacc.plugins.torch.import_ops.common import norm_axis, rank, tensor
from aiacc.plugins.torch.import_ops.elementwise import gelu, hardtanh, relu6, silu, softmax_like, unary
from aiacc.plugins.torch.import_ops.indexing import advanced_getitem
from aiacc.plugins.torch.import_ops.nn import (batch_norm, check_ids, dropout, f_avgpool, f_bn, f_conv, f_linear,
                                               f_maxpool, layer_norm)
from aiacc.plugins.torch.import_ops.shape import dtype_of_other, expand, f_permute, flatten, flip, view
from aiacc.plugins.torch import export_frontend
from aiacc.plugins.torch.importer import ATEN, FUNCTIONS, METHODS, tensor_to_numpy


def _aten_embedding(imp, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    # padding_idx changes only the backward, and torch.export programs are imported for inference only
    weight, indices = tensor(weight), tensor(indices)
    check_ids(imp, weight, indices)
    return imp.op("Gather", weight, indices, axis=0)


def _aten_bn_no_training(imp, x, weight, bias, running_mean, running_var, momentum, eps):
    y = batch_norm(imp, x, running_mean, running_var, weight, bias, False, momentum, eps)
    return (y, None, None)


def _aten_batch_norm(imp, x, weight, bias, running_mean, running_var, training, momentum, eps, cudnn=True):
    return f_bn(imp, x, running_mean, running_var, weight, bias, training, momentum, eps)


def _aten_dropout(imp, x, p, train):
    return dropout(imp, x, p, bool(train) and imp.training)


ATEN.update({
    "embedding": _aten_embedding,
    "_native_batch_norm_legit_no_training": _aten_bn_no_training,
    "batch_norm": _aten_batch_norm,
    "dropout": _aten_dropout,
    "linear": f_linear,
    "conv2d": f_conv(2), "conv1d": f_conv(1),
    "max_pool2d": f_maxpool(2), "avg_pool2d": f_avgpool(2),
    "adaptive_avg_pool2d": FUNCTIONS[F.adaptive_avg_pool2d],
    "gelu": gelu, "silu": silu, "hardswish": unary("HardSwish"), "relu6": relu6, "hardtanh": hardtanh,
    "layer_norm": lambda imp, x, shape, w=None, b=None, eps=1e-5, cudnn=True: layer_norm(imp, x, shape, w, b, eps),
    "softmax": softmax_like("Softmax"), "_softmax": lambda imp, x, dim, half: softmax_like("Softmax")(imp, x, dim),
    "flatten": flatten, "permute": f_permute,
})  # scaled_dot_product_attention: the torch function's converter (same arguments)


# ---------------------------------------------------------------------------------- torch.export's own ops
def _nothing(imp, *args, **kwargs):
    """export's checks of the example's metadata (`_assert_tensor_metadata`, shape asserts): the trace
    already ran on the example."""
    return None


def _same(imp, x, *args, **kwargs):
    return tensor(x)


def _sym_size(imp, x, dim):
    """`aten.sym_size.int`: a size that remembers its tensor and axis (a dynamic batch stays dynamic)."""
    return METHODS["size"](imp, x, dim)


def _to_dtype(imp, x, dtype=None):
    x = tensor(x)
    if dtype is None:
        return x  # a device or layout change only
    name = str(dtype).replace("torch.", "")
    if name not in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"):
        raise Untranslatable(f"{name} has no numpy dtype in the IR")
    return x if name == x.dtype else imp.op("Cast", x, to=name)


def _aten_to(imp, x, *args, dtype=None, **kwargs):
    """aten.to.dtype / to.dtype_layout / to.device / _to_copy: a Cast where the dtype changes."""
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, Value):  # aten.to.other: the other tensor's dtype
            dtype = dtype_of_other(a)
    return _to_dtype(imp, x, dtype)


def _slice(imp, x, dim=0, start=None, end=None, step=1):
    x = tensor(x)
    axis = norm_axis(dim, rank(x))
    return FUNCTIONS[operator.getitem](imp, x, (slice(None),) * axis + (slice(start, end, step),))


def _select(imp, x, dim, index):
    x = tensor(x)
    axis = norm_axis(dim, rank(x))
    return FUNCTIONS[operator.getitem](imp, x, (slice(None),) * axis + (int(index),))


def _index(imp, x, indices):
    """aten.index.Tensor: None entries are full slices (x[:, idx])."""
    x = tensor(x)
    index = tuple(slice(None) if i is None else i for i in indices)
    return FUNCTIONS[operator.getitem](imp, x, index)


def _unsafe_index(imp, x, indices):
    """aten._unsafe_index.Tensor (upsampling's decompositions): aten.index without torch's bounds check, so
    none at run time either."""
    x = tensor(x)
    index = tuple(slice(None) if i is None else i for i in indices)
    if any(isinstance(i, (Value, list, torch.Tensor)) for i in index):
        return advanced_getitem(imp, x, index, checked=False)
    return FUNCTIONS[operator.getitem](imp, x, index)


def _new_constant(fill):
    def conv(imp, x, size, *args, dtype=None, layout=None, device=None, pin_memory=None, **kwargs):
        """new_zeros / new_ones / new_full / new_empty(x, size, [value]): a constant of the sizes (the
        example's; new_empty's contents are undefined, zeros here)."""
        x = tensor(x)
        value = args[0] if fill is None else fill
        if isinstance(value, Value) or any(isinstance(d, Value) for d in size):
            raise Untranslatable("tensor fill value or size")
        dt = str(dtype).replace("torch.", "") if dtype is not None else x.dtype
        return imp.const(np.full([int(d) for d in size], value, dtype=dt))
    return conv


def _triangle(upper: bool):
    def conv(imp, x, diagonal=0):
        """triu / tril on a static shape: Where(a constant band mask, x, 0)."""
        x = tensor(x)
        shape = imp.shape_of(x)
        if len(shape) < 2:
            raise Untranslatable("triu/tril of a tensor of rank < 2")
        rows, cols = shape[-2:]
        keep = (np.triu if upper else np.tril)(np.ones((rows, cols), dtype=bool), int(diagonal))
        return imp.op("Where", imp.const(keep), x, imp.scalar_like(0 if x.dtype != "bool" else False, x)
                      if x.dtype != "bool" else imp.const(np.asarray(False)))
    return conv


# torch.tril / x.tril (Longformer's band masks) and triu: the same converters as the aten ops
for _upper, _name in ((True, "triu"), (False, "tril")):
    METHODS[_name] = _triangle(_upper)
    FUNCTIONS[getattr(torch, _name)] = _triangle(_upper)


def _einsum(imp, equation, operands, path=None):
    return FUNCTIONS[torch.einsum](imp, equation, *operands)


def _group_norm(imp, x, num_groups, weight=None, bias=None, eps=1e-5, cudnn=True):
    return FUNCTIONS[F.group_norm](imp, x, num_groups, weight, bias, eps)


def _constant_pad(imp, x, pad, value=0.0):
    return FUNCTIONS[F.pad](imp, x, list(pad), "constant", value)


def _squeeze_dims(imp, x, dim=None):
    return FUNCTIONS[torch.squeeze](imp, x, list(dim) if isinstance(dim, (list, tuple)) else dim)


def _upsample_aa(mode):
    def conv(imp, x, output_size, align_corners, *scales):
        """_upsample_*2d_aa(x, output_size, align_corners, [scales_h, scales_w]) or its .vec form
        (x, output_size, align_corners, scale_factors): antialiased interpolate."""
        if len(scales) == 1:
            scales = scales[0] or ()
        factor = list(scales) if scales and all(s is not None for s in scales) else None
        return FUNCTIONS[F.interpolate](imp, x, size=None if factor else list(output_size), scale_factor=factor,
                                        mode=mode, align_corners=align_corners, antialias=True)
    return conv


def _upsample(mode, antialias=False):
    def conv(imp, x, output_size=None, *args):
        """upsample_*2d.vec(x, output_size, [align_corners,] scale_factors) (the _aa ops: antialiased)."""
        align = args[0] if len(args) == 2 else None
        scales = args[-1] if args else None
        kw = {"mode": mode, "antialias": antialias}
        if align is not None:
            kw["align_corners"] = align
        return FUNCTIONS[F.interpolate](imp, x, size=list(output_size) if output_size else None,
                                        scale_factor=list(scales) if scales else None, **kw)
    return conv


def _symbolic_dims(node) -> list[int] | None:
    """The axes of an export node's result whose size is symbolic (a dynamic batch), from the program's
    own shape reasoning (meta["val"]); None when the node has no such record."""
    val = node.meta.get("val") if node is not None else None
    if not isinstance(val, torch.Tensor):
        return None
    return [i for i, d in enumerate(val.shape) if not isinstance(d, int)]


def _aten_view(imp, x, shape):
    """view / reshape / _unsafe_view: where export knows the result has one symbolic size (the batch, or
    the batch times a head count), that size is -1, so the reshape holds at any batch size."""
    x = tensor(x)
    sym = _symbolic_dims(imp.current)
    example = imp.example_of()
    if sym is not None and len(sym) == 1 and isinstance(example, torch.Tensor):
        target = list(example.shape)  # the example's sizes: what the IR's static shapes are
        target[sym[0]] = -1
        return imp.op("Reshape", x, imp.ints(target))
    return view(imp, x, shape)


def _aten_expand(imp, x, size, implicit=False):
    """expand: a symbolic size where x already has it becomes 1 (Expand broadcasts: x's own size stays)."""
    x = tensor(x)
    sym = _symbolic_dims(imp.current)
    if sym:
        shape = imp.shape_of(x)
        offset = len(size) - len(shape)
        target = [shape[i - offset] if int(s) == -1 else int(s) for i, s in enumerate(size)]
        for i in sym:
            if i - offset >= 0 and shape[i - offset] == target[i]:
                target[i] = 1
        return imp.op("Expand", x, imp.ints(target))
    return expand(imp, x, size)


def _binary_promoted(torch_fn):
    def conv(imp, a, b, *args, **kwargs):
        """An int tensor with a float tensor: the int one is cast first (torch's type promotion)."""
        if isinstance(a, Value) and isinstance(b, Value) and a.dtype and b.dtype and a.dtype != b.dtype:
            ka, kb = np.dtype(a.dtype).kind, np.dtype(b.dtype).kind
            if ka == "f" and kb in "iub":
                b = imp.op("Cast", b, to=a.dtype)
            elif kb == "f" and ka in "iub":
                a = imp.op("Cast", a, to=b.dtype)
        return FUNCTIONS[torch_fn](imp, a, b, *args, **kwargs)
    return conv


def _copy(imp, x, src, non_blocking=False):
    """aten.copy (functionalized `x.copy_(src)` / `x[...] = src`): src in x's dtype, broadcast to x's shape."""
    x, src = tensor(x), tensor(src, "src")
    if src.dtype != x.dtype:
        src = imp.op("Cast", src, to=x.dtype)
    return src if src.shape == x.shape else imp.op("Expand", src, imp.op("Shape", x))


def _slice_scatter(imp, x, src, dim=0, start=None, end=None, step=1):
    """aten.slice_scatter (functionalized `x[:, a:b] = src`): x with x[dim, start:end:step] replaced by src,
    as a Concat of x's parts around src (step 1) or a ScatterElements of the written indices."""
    x, src = tensor(x), tensor(src, "src")
    r = rank(x)
    axis = norm_axis(dim, r)
    size = x.shape[axis]
    if not isinstance(size, int) or any(isinstance(a, Value) for a in (start, end, step)):
        raise Untranslatable("slice_scatter on an axis of unknown size or with tensor bounds")
    first, stop, step = slice(start, end, step).indices(size)
    if src.dtype != x.dtype:
        src = imp.op("Cast", src, to=x.dtype)
    if step == 1:
        parts = []
        if first > 0:
            parts.append(_slice(imp, x, axis, 0, first))
        parts.append(src)
        if stop < size:
            parts.append(_slice(imp, x, axis, stop, size))
        return parts[0] if len(parts) == 1 else imp.op("Concat", *parts, axis=axis)
    shape = imp.shape_of(src)
    where = np.arange(first, stop, step, dtype=np.int64).reshape([-1 if i == axis else 1 for i in range(r)])
    return imp.op("ScatterElements", x, imp.const(np.broadcast_to(where, shape).copy()), src, axis=axis,
                  reduction="none")


def _select_scatter(imp, x, src, dim, index):
    """aten.select_scatter (functionalized `x[:, i] = src`): the slice i:i+1 written with src unsqueezed."""
    x = tensor(x)
    axis = norm_axis(dim, rank(x))
    i = int(index) % x.shape[axis] if isinstance(x.shape[axis], int) else int(index)
    return _slice_scatter(imp, x, imp.op("Unsqueeze", tensor(src, "src"), imp.ints([axis])), axis, i, i + 1)


ATEN.update({
    "view": _aten_view, "reshape": _aten_view, "_unsafe_view": _aten_view, "expand": _aten_expand,
    "pow": _binary_promoted(torch.pow), "add": _binary_promoted(torch.add), "sub": _binary_promoted(torch.sub),
    "mul": _binary_promoted(torch.mul), "div": _binary_promoted(torch.div),
    "_assert_tensor_metadata": _nothing, "_assert_scalar": _nothing, "sym_constrain_range_for_size": _nothing,
    "_assert_async": _nothing, "sym_size": _sym_size,
    "to": _aten_to, "_to_copy": _aten_to, "lift_fresh_copy": _same, "alias": _same, "clone": _same,
    "contiguous": _same, "detach": _same, "detach_": _same,
    "slice": _slice, "select": _select, "index": _index, "_unsafe_index": _unsafe_index,
    "new_zeros": _new_constant(0), "new_ones": _new_constant(1), "new_empty": _new_constant(0),
    "new_full": _new_constant(None),
    "triu": _triangle(True), "tril": _triangle(False),
    "flip": flip,
    "meshgrid": lambda imp, tensors, indexing=None: FUNCTIONS[torch.meshgrid](imp, tensors, indexing=indexing),
    "einsum": _einsum, "group_norm": _group_norm, "constant_pad_nd": _constant_pad,
    "squeeze": _squeeze_dims, "unfold": METHODS["unfold"],  # Tensor.unfold's (not F.unfold's im2col)
    "copy": _copy, "slice_scatter": _slice_scatter, "select_scatter": _select_scatter,
    "upsample_nearest2d": _upsample("nearest"), "upsample_bilinear2d": _upsample("bilinear"),
    "_upsample_bilinear2d_aa": _upsample_aa("bilinear"), "_upsample_bicubic2d_aa": _upsample_aa("bicubic"),
})


# ---------------------------------------------------------------------------------- sizes read at run time
def _size_value(imp, d) -> Value:
    """A size of export_frontend's (tensor, axis) form as a 1-element int64 IR value (Shape + Gather), or
    a constant for an int."""
    if isinstance(d, tuple):
        t, axis = tensor(d[0]), norm_axis(int(d[1]), rank(d[0]))
        return imp.op("Gather", imp.op("Shape", t), imp.ints([axis]), axis=0)
    return imp.ints([int(d)])


def _filled(imp, sizes, value, dtype):
    """export_frontend.filled: ConstantOfShape of a shape read off the tensors (a dynamic batch stays free)."""
    name = str(dtype).replace("torch.", "")
    if name not in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"):
        raise Untranslatable(f"{name} has no numpy dtype in the IR")
    parts = [_size_value(imp, d) for d in sizes]
    shape = parts[0] if len(parts) == 1 else imp.op("Concat", *parts, axis=0) if parts else imp.ints([])
    return imp.op("ConstantOfShape", shape, value=np.array([value], dtype=name))


def _ranged(imp, start, end, step, dtype):
    """export_frontend.ranged: Range(start, end, step) with a bound read off a tensor."""
    name = str(dtype).replace("torch.", "")
    if name not in ("int64", "int32", "float32", "float64"):
        raise Untranslatable(f"arange of dtype {name}")

    def scalar(d):
        if isinstance(d, tuple):
            v = imp.op("Squeeze", _size_value(imp, d), imp.ints([0]))
            return v if name == "int64" else imp.op("Cast", v, to=name)
        return imp.const(np.asarray(d, dtype=name))
    return imp.op("Range", scalar(start), scalar(end), scalar(step))


FUNCTIONS.update({export_frontend.filled: _filled, export_frontend.ranged: _ranged,
                  export_frontend.leaf: lambda imp, tree, index: export_frontend.pytree.tree_leaves(tree)[index]})
