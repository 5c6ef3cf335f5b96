"""The TF shape ops: Reshape, Squeeze, ExpandDims, Transpose, Shape, concatenation and stacking, padding,
slicing, gathering, tiling, broadcasting, reversing, splitting and unstacking, band parts and the creation
ops (Fill, Range, ZerosLike / OnesLike, OneHot). Registered in the importer's table (`importer.handlers`)."""
from __future__ import annotations

import numpy as np

from aiacc.plugins.tf._tf import np_dtype_name
from aiacc.plugins.tf.importer import INT_MAX, NHWC_AXIS_TO_NCHW, TO_NCHW, Entry, handlers
from aiacc.plugins.tf.import_ops.common import attr, int64_as, operands


# ------------------------------------------------------------------------------------------ shapes
@handlers.register("Reshape")
def _reshape(imp, tfop):
    x, s = tfop.inputs
    target = imp.const(s)
    if target is None:
        sym = imp.sym.get(s.name)
        if isinstance(sym, list) and not any(isinstance(d, int) and d <= 0 for d in sym):
            # dims equal (same symbol) to the input's at the same index are copied (0), one more may be -1
            in_shape = imp.static_shape(x) or ()
            dims = [d if isinstance(d, int) else (0 if i < len(in_shape) and in_shape[i] == d else None)
                    for i, d in enumerate(sym)]
            if sum(d is None for d in dims) <= 1:
                target = np.array([-1 if d is None else d for d in dims], np.int64)
                y = imp.emit1("Reshape", [imp.plain(x), imp.ints(target, tfop.name + "_shape")], name=tfop.name)
                _set_symbolic_shape(y, sym)
                return [Entry(y)]
        # a shape computed at run time: TF semantics (0 is an empty dim, not a copy)
        sv = imp.plain(s)
        if sv.dtype != "int64":
            sv = imp.emit1("Cast", [sv], {"to": "int64"}, name=tfop.name + "_shape")
        y = imp.emit1("Reshape", [imp.plain(x), sv], {"allowzero": 1}, name=tfop.name)
        if isinstance(sym, list):
            _set_symbolic_shape(y, sym)
        return [Entry(y)]
    target = np.asarray(target, np.int64).reshape(-1)
    attrs = {"allowzero": 1} if (target == 0).any() else {}
    y = imp.emit1("Reshape", [imp.plain(x), imp.ints(target, tfop.name + "_shape")], attrs, name=tfop.name)
    return [Entry(y)]


def _set_symbolic_shape(y, sym) -> None:
    """Give a Reshape output the dims the shape arithmetic knows (symbols included)."""
    from aiacc.core.ir import TensorType

    if y.const is not None:
        return
    if y.shape is None or len(y.shape) != len(sym):
        y.type = TensorType(y.dtype, tuple(sym))
        return
    y.type = TensorType(y.dtype, tuple(d if isinstance(d, int) else o for d, o in zip(y.shape, sym)))


@handlers.register("Squeeze")
def _squeeze(imp, tfop):
    x = tfop.inputs[0]
    dims = list(tfop.get_attr("squeeze_dims"))
    shape = imp.static_shape(x)
    if shape is None:
        return None
    rank = len(shape)
    if not dims:
        if any(d is None or isinstance(d, str) for d in shape):
            return None
        dims = [i for i, d in enumerate(shape) if d == 1]
    dims = sorted(d % rank for d in dims)
    if not dims:
        return [imp.entry(x)]
    return [Entry(imp.emit1("Squeeze", [imp.plain(x), imp.ints(dims, tfop.name + "_axes")], name=tfop.name))]


@handlers.register("ExpandDims")
def _expand_dims(imp, tfop):
    x, a = tfop.inputs
    axis = int(np.asarray(imp.need_const(a, "non-constant axis")).reshape(-1)[0])
    rank = imp.rank(x)
    if rank is None:
        return None
    axis = axis % (rank + 1)
    return [Entry(imp.emit1("Unsqueeze", [imp.plain(x), imp.ints([axis], tfop.name + "_axes")], name=tfop.name))]


@handlers.register("Transpose")
def _transpose(imp, tfop):
    x, p = tfop.inputs
    perm = [int(i) for i in imp.need_const(p, "non-constant perm")]
    e = imp.entry(x)
    if e.nchw and len(perm) == 4:
        inv = [TO_NCHW.index(i) for i in range(4)]  # NHWC axis -> position in the NCHW value
        return [Entry(imp.transpose(e.value, [inv[q] for q in perm]))]
    return [Entry(imp.transpose(e.value, perm))]


@handlers.register("Shape")
def _shape(imp, tfop):
    y = imp.emit1("Shape", [imp.plain(tfop.inputs[0])], name=tfop.name)
    return [Entry(int64_as(imp, tfop, y, "out_type"))]


@handlers.register("ConcatV2")
def _concat(imp, tfop):
    tensors, a = list(tfop.inputs[:-1]), tfop.inputs[-1]
    axis = int(imp.need_const(a, "non-constant axis"))
    rank = imp.rank(tensors[0])
    if rank is None:
        return None
    axis %= rank
    vals, nchw = operands(imp, tensors)
    if nchw:
        axis = NHWC_AXIS_TO_NCHW[axis]
    return [Entry(imp.emit1("Concat", vals, {"axis": axis}, name=tfop.name), nchw)]


@handlers.register("Pack")
def _pack(imp, tfop):
    rank = imp.rank(tfop.inputs[0])
    if rank is None:
        return None
    axis = tfop.get_attr("axis") % (rank + 1)
    parts = [imp.emit1("Unsqueeze", [imp.plain(t), imp.ints([axis], f"{tfop.name}_axes{k}")],
                       name=f"{tfop.name}_unsqueeze{k}") for k, t in enumerate(tfop.inputs)]
    if len(parts) == 1:
        return [Entry(parts[0])]
    return [Entry(imp.emit1("Concat", parts, {"axis": axis}, name=tfop.name))]


@handlers.register("Pad", "PadV2", "MirrorPad")
def _pad(imp, tfop):
    x = tfop.inputs[0]
    pads = np.asarray(imp.need_const(tfop.inputs[1], "non-constant paddings")).astype(np.int64)
    e = imp.entry(x)
    mode = "constant"
    if tfop.type == "MirrorPad":
        m = attr(tfop, "mode")
        if m != "REFLECT":
            return None
        mode = "reflect"
    inputs_nchw = e.nchw and pads.shape[0] == 4
    if inputs_nchw:
        pads = pads[list(TO_NCHW)]
        xv = e.value
    else:
        xv = imp.plain(x)
    ins = [xv, imp.ints(np.concatenate([pads[:, 0], pads[:, 1]]), tfop.name + "_pads")]
    if tfop.type == "PadV2":
        ins.append(imp.plain(tfop.inputs[2]))
    return [Entry(imp.emit1("Pad", ins, {"mode": mode}, name=tfop.name), inputs_nchw)]


@handlers.register("StridedSlice")
def _strided_slice(imp, tfop):
    """StridedSlice -> Slice (+ Squeeze for shrink_axis_mask, + Unsqueeze for new_axis_mask); the
    ellipsis stands for the dimensions no other entry of the spec names."""
    x, b, e_, s = tfop.inputs
    rank = imp.rank(x)
    if rank is None:
        return None
    begin = [int(v) for v in np.asarray(imp.need_const(b, "non-constant begin")).reshape(-1)]
    end = [int(v) for v in np.asarray(imp.need_const(e_, "non-constant end")).reshape(-1)]
    strides = [int(v) for v in np.asarray(imp.need_const(s, "non-constant strides")).reshape(-1)]
    bm, em, sm = attr(tfop, "begin_mask"), attr(tfop, "end_mask"), attr(tfop, "shrink_axis_mask")
    nm, elm = attr(tfop, "new_axis_mask"), attr(tfop, "ellipsis_mask")
    n_spec = len(begin)
    if bin(elm).count("1") > 1:
        return None
    consumed = sum(1 for i in range(n_spec) if not (nm >> i) & 1 and not (elm >> i) & 1)
    starts, ends, axes, steps, squeeze, new_axes = [], [], [], [], [], []
    dim = out_pos = 0
    for i in range(n_spec):
        if (elm >> i) & 1:
            n_full = rank - consumed
            dim += n_full
            out_pos += n_full
            continue
        if (nm >> i) & 1:
            if (sm >> i) & 1:
                return None
            new_axes.append(out_pos)
            out_pos += 1
            continue
        if dim >= rank:
            return None
        bi, ei, si = begin[i], end[i], strides[i]
        if (sm >> i) & 1:
            starts.append(bi)
            ends.append(bi + 1 if bi != -1 else INT_MAX)
            steps.append(1)
            squeeze.append(dim)
        else:
            out_pos += 1
            if (bm >> i) & 1 and (em >> i) & 1 and si == 1:
                dim += 1
                continue  # the whole axis
            starts.append((0 if si > 0 else INT_MAX) if (bm >> i) & 1 else bi)
            ends.append((INT_MAX if si > 0 else -INT_MAX) if (em >> i) & 1 else ei)
            steps.append(si)
        axes.append(dim)
        dim += 1
    n = tfop.name
    y = imp.plain(x)
    if axes:
        y = imp.emit1("Slice", [y, imp.ints(starts, n + "_starts"), imp.ints(ends, n + "_ends"),
                                imp.ints(axes, n + "_axes"), imp.ints(steps, n + "_steps")], name=n + "_slice")
    if squeeze:
        y = imp.emit1("Squeeze", [y, imp.ints(squeeze, n + "_squeeze_axes")], name=n + "_squeeze")
    if new_axes:
        y = imp.emit1("Unsqueeze", [y, imp.ints(new_axes, n + "_new_axes")], name=n + "_unsqueeze")
    if y is imp.plain(x):
        y = imp.emit1("Identity", [y], name=n)
    return [Entry(y)]


@handlers.register("GatherV2")
def _gather(imp, tfop):
    if attr(tfop, "batch_dims", 0):
        return None
    params, idx = tfop.inputs[0], tfop.inputs[1]
    axis = int(imp.need_const(tfop.inputs[2], "non-constant axis"))
    return [Entry(imp.emit1("Gather", [imp.plain(params), imp.plain(idx)], {"axis": axis}, name=tfop.name))]


@handlers.register("Tile")
def _tile(imp, tfop):
    x, m = tfop.inputs
    reps = imp.const(m)
    e = imp.entry(x)
    if reps is None:
        mv = imp.plain(m)
        if mv.dtype != "int64":
            mv = imp.emit1("Cast", [mv], {"to": "int64"}, name=tfop.name + "_multiples")
        return [Entry(imp.emit1("Tile", [imp.plain(x), mv], name=tfop.name))]
    reps = np.asarray(reps, np.int64).reshape(-1)
    if e.nchw and reps.size == 4:
        return [Entry(imp.emit1("Tile", [e.value, imp.ints(reps[list(TO_NCHW)], tfop.name + "_multiples")],
                                name=tfop.name), True)]
    return [Entry(imp.emit1("Tile", [imp.plain(x), imp.ints(reps, tfop.name + "_multiples")], name=tfop.name))]


def _expand(imp, tfop, x, shape, cast_suffix):
    """ONNX Expand of tensor `x` to the runtime shape tensor `shape` (cast to int64 when it is not)."""
    sv = imp.plain(shape)
    if sv.dtype != "int64":
        sv = imp.emit1("Cast", [sv], {"to": "int64"}, name=tfop.name + cast_suffix)
    return [Entry(imp.emit1("Expand", [imp.plain(x), sv], name=tfop.name))]


@handlers.register("Fill")
def _fill(imp, tfop):
    dims, value = tfop.inputs
    return _expand(imp, tfop, value, dims, "_dims")


@handlers.register("Range")
def _range(imp, tfop):
    dt = np_dtype_name(tfop.outputs[0].dtype, tfop.name)
    vals = []
    for k, t in enumerate(tfop.inputs):
        v = imp.plain(t)
        if v.dtype != dt:
            v = imp.emit1("Cast", [v], {"to": dt}, name=f"{tfop.name}_in{k}")
        vals.append(v)
    return [Entry(imp.emit1("Range", vals, name=tfop.name))]


@handlers.register("ZerosLike", "OnesLike")
def _fill_like(imp, tfop):
    e = imp.entry(tfop.inputs[0])
    shape = imp.emit1("Shape", [e.value], name=tfop.name + "_shape")
    one = imp.init(np.array(0 if tfop.type == "ZerosLike" else 1, e.value.dtype), tfop.name + "_value")
    return [Entry(imp.emit1("Expand", [one, shape], name=tfop.name), e.nchw)]


# ------------------------------------------------------------------------------------------ more shapes
@handlers.register("ReverseV2")
def _reverse(imp, tfop):
    x, a = tfop.inputs
    rank = imp.rank(x)
    if rank is None:
        return None
    axes = sorted({int(v) % rank for v in np.asarray(imp.need_const(a, "non-constant axis")).reshape(-1)})
    if not axes:
        return [imp.entry(x)]
    n = tfop.name
    k = len(axes)
    y = imp.emit1("Slice", [imp.plain(x), imp.ints([-1] * k, n + "_starts"), imp.ints([-INT_MAX] * k, n + "_ends"),
                            imp.ints(axes, n + "_axes"), imp.ints([-1] * k, n + "_steps")], name=n)
    return [Entry(y)]


def _split_parts(imp, tfop, x, axis: int, sizes: list[int] | None):
    e = imp.entry(x)
    rank = imp.rank(x)
    value, ax = imp.plain(x), axis
    if e.nchw and rank == 4:
        value, ax = e.value, NHWC_AXIS_TO_NCHW[axis]
    ins = [value] + ([imp.ints(sizes, tfop.name + "_sizes")] if sizes is not None else [])
    attrs = {"axis": ax}
    if sizes is None:
        attrs["num_outputs"] = len(tfop.outputs)
    outs = imp.emit("Split", ins, attrs, name=tfop.name, outputs=len(tfop.outputs))
    return [Entry(o, e.nchw and rank == 4) for o in outs]


@handlers.register("Split")
def _split(imp, tfop):
    a, x = tfop.inputs
    rank = imp.rank(x)
    if rank is None:
        return None
    axis = int(np.asarray(imp.need_const(a, "non-constant axis")).reshape(-1)[0]) % rank
    n = len(tfop.outputs)
    dim = (imp.static_shape(x) or [None] * rank)[axis]
    sizes = [dim // n] * n if isinstance(dim, int) else None
    return _split_parts(imp, tfop, x, axis, sizes)


@handlers.register("SplitV")
def _split_v(imp, tfop):
    x, s, a = tfop.inputs
    rank = imp.rank(x)
    if rank is None:
        return None
    axis = int(np.asarray(imp.need_const(a, "non-constant axis")).reshape(-1)[0]) % rank
    sizes = [int(v) for v in np.asarray(imp.need_const(s, "non-constant sizes")).reshape(-1)]
    if -1 in sizes:
        dim = (imp.static_shape(x) or [None] * rank)[axis]
        if not isinstance(dim, int):
            return None
        sizes[sizes.index(-1)] = dim - (sum(sizes) + 1)
    return _split_parts(imp, tfop, x, axis, sizes)


@handlers.register("Unpack")
def _unpack(imp, tfop):
    x = tfop.inputs[0]
    rank = imp.rank(x)
    if rank is None:
        return None
    axis = tfop.get_attr("axis") % rank
    n = len(tfop.outputs)
    parts = imp.emit("Split", [imp.plain(x), imp.ints([1] * n, tfop.name + "_sizes")], {"axis": axis},
                     name=tfop.name + "_split", outputs=n)
    return [Entry(imp.emit1("Squeeze", [p, imp.ints([axis], f"{tfop.name}_axes{k}")], name=f"{tfop.name}_{k}"))
            for k, p in enumerate(parts)]


@handlers.register("BroadcastTo")
def _broadcast_to(imp, tfop):
    x, s = tfop.inputs
    return _expand(imp, tfop, x, s, "_shape")


@handlers.register("MatrixBandPart")
def _band_part(imp, tfop):
    """Keep a band of the last two axes (Keras' causal mask): Where with a constant mask."""
    x, lo_t, hi_t = tfop.inputs
    shape = imp.static_shape(x)
    lo, hi = imp.const(lo_t), imp.const(hi_t)
    if shape is None or len(shape) < 2 or lo is None or hi is None:
        return None
    lo, hi = int(lo), int(hi)
    name = tfop.name
    zero = imp.init(np.array(0, np_dtype_name(tfop.inputs[0].dtype, name)), name + "_zero")
    if lo < 0 and hi < 0:
        return [imp.entry(x)]
    if all(isinstance(d, int) for d in shape[-2:]):
        m, n = shape[-2:]
        i, j = np.arange(m)[:, None], np.arange(n)[None, :]
        mask = imp.init(((lo < 0) | (i - j <= lo)) & ((hi < 0) | (j - i <= hi)), name + "_mask")
    else:  # sizes known at run time: the mask from two Ranges
        dims = imp.emit1("Shape", [imp.plain(x)], name=name + "_shape")
        zero64, one64 = imp.ints(0, name + "_start"), imp.ints(1, name + "_delta")
        idx = []
        for k, axis in enumerate((len(shape) - 2, len(shape) - 1)):
            size = imp.emit1("Gather", [dims, imp.ints(axis, f"{name}_axis{k}")], {"axis": 0}, name=f"{name}_size{k}")
            r = imp.emit1("Range", [zero64, size, one64], name=f"{name}_range{k}")
            idx.append(imp.emit1("Unsqueeze", [r, imp.ints([1 - k], f"{name}_unsqueeze_axes{k}")],
                                 name=f"{name}_index{k}"))
        diff = imp.emit1("Sub", idx, name=name + "_diff")  # i - j
        conds = []
        if lo >= 0:
            conds.append(imp.emit1("LessOrEqual", [diff, imp.ints(lo, name + "_lower")], name=name + "_below"))
        if hi >= 0:
            conds.append(imp.emit1("GreaterOrEqual", [diff, imp.ints(-hi, name + "_upper")], name=name + "_above"))
        mask = conds[0] if len(conds) == 1 else imp.emit1("And", conds, name=name + "_mask")
    if tfop.inputs[0].dtype.is_bool:  # (onnxruntime has no bool Where)
        return [Entry(imp.emit1("And", [mask, imp.plain(x)], name=name))]
    return [Entry(imp.emit1("Where", [mask, imp.plain(x), zero], name=name))]


@handlers.register("Slice")
def _slice(imp, tfop):
    """tf.slice(x, begin, size): size -1 runs to the end."""
    x, b, s = tfop.inputs
    begin = [int(v) for v in np.asarray(imp.need_const(b, "non-constant begin")).reshape(-1)]
    size = [int(v) for v in np.asarray(imp.need_const(s, "non-constant size")).reshape(-1)]
    ends = [INT_MAX if sz == -1 else st + sz for st, sz in zip(begin, size)]
    n = tfop.name
    e = imp.entry(x)
    if e.nchw and len(begin) == 4:
        perm = list(TO_NCHW)
        return [Entry(imp.emit1("Slice", [e.value, imp.ints([begin[p] for p in perm], n + "_starts"),
                                          imp.ints([ends[p] for p in perm], n + "_ends")], name=n), True)]
    return [Entry(imp.emit1("Slice", [imp.plain(x), imp.ints(begin, n + "_starts"), imp.ints(ends, n + "_ends")],
                            name=n))]


@handlers.register("OneHot")
def _one_hot(imp, tfop):
    """OneHot -> Where(indices == range(depth), on, off) with the new axis where TF puts it."""
    idx, depth_t, on, off = tfop.inputs
    depth = imp.const(depth_t)
    rank = imp.rank(idx)
    if depth is None or rank is None:
        return None
    depth = int(depth)
    axis = tfop.get_attr("axis")
    axis = rank if axis == -1 else axis
    n = tfop.name
    positions = np.arange(depth, dtype=np.int64).reshape([depth] + [1] * (rank - axis))
    iv = imp.plain(idx)
    if iv.dtype != "int64":
        iv = imp.emit1("Cast", [iv], {"to": "int64"}, name=n + "_indices")
    iv = imp.emit1("Unsqueeze", [iv, imp.ints([axis], n + "_axes")], name=n + "_unsqueeze")
    hit = imp.emit1("Equal", [iv, imp.init(positions, n + "_positions")], name=n + "_equal")
    return [Entry(imp.emit1("Where", [hit, imp.plain(on), imp.plain(off)], name=n))]
