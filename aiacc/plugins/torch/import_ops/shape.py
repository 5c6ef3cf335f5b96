"""Converters of shape, size, indexing, copy/dtype, padding and rearrangement calls (view, reshape, permute,
cat, slicing, item assignment, pixel shuffle, ...)."""
from __future__ import annotations

import functools
import operator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from aiacc.core.ir import Value
from aiacc.core.translate import Untranslatable
from aiacc.plugins.torch.import_ops.common import need, norm_axis, rank, tensor
from aiacc.plugins.torch.import_ops.indexing import advanced_getitem, check_axis_index
from aiacc.plugins.torch.import_ops.nn import f_pad
from aiacc.plugins.torch.importer import ATEN, FUNCTIONS, METHODS, MODULES, Dim, tensor_to_numpy


@MODULES.register(nn.Identity)
def _m_identity(imp, m, x, *args, **kwargs):
    return x


@METHODS.register("contiguous", "clone")
def _same(imp, x, *args, **kwargs):
    return tensor(x)


@METHODS.register("detach")
def _detach(imp, x):
    if imp.training:
        raise Untranslatable("detach changes gradients in training")
    return tensor(x)


def dtype_of_other(other: Value) -> torch.dtype:
    """The torch dtype `x.to(other)` (aten.to.other) casts to: the other tensor's."""
    if other.dtype is None:
        raise Untranslatable("to(tensor) of a tensor of unknown dtype")
    return getattr(torch, other.dtype)


@METHODS.register("to", "type", "float", "half", "double", "long", "int", "bool")
def _to(imp, x, *args, **kwargs):
    x = tensor(x)
    name = imp.current.target
    dtypes = {"float": torch.float32, "half": torch.float16, "double": torch.float64, "long": torch.int64,
              "int": torch.int32, "bool": torch.bool}
    target = dtypes.get(name)
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.dtype):
            target = a
        elif isinstance(a, Value):  # x.to(other): other's dtype (and device, which the export ignores)
            target = dtype_of_other(a)
    if target is None:
        return x  # a device move: the exported module runs wherever it is put
    dtype = str(target).replace("torch.", "")
    if dtype not in _NUMPY_DTYPES:
        raise Untranslatable(f"{dtype} has no numpy dtype in the IR")
    return x if dtype == x.dtype else imp.op("Cast", x, to=dtype)


_NUMPY_DTYPES = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"}


# ---------------------------------------------------------------------------------- shapes and sizes
def _dim(imp, v: Value, axis: int):
    shape = imp.shape_of(v)
    return Dim(shape[axis], v, axis)


@METHODS.register("size")
def _size(imp, x, dim=None):
    x = tensor(x)
    if dim is None:
        return torch.Size([_dim(imp, x, i) for i in range(rank(x))])
    return _dim(imp, x, norm_axis(dim, rank(x)))


@METHODS.register("dim", "ndimension")
def _ndim(imp, x):
    return rank(tensor(x))


@METHODS.register("numel")
def _numel(imp, x):
    return int(np.prod(imp.shape_of(tensor(x))))


@FUNCTIONS.register(getattr)
def _getattr(imp, x, name, *default):
    if not isinstance(x, Value):
        return getattr(x, name, *default)
    if name == "shape":
        return _size(imp, x)
    if name == "ndim":
        return rank(x)
    if name == "T":
        return imp.op("Transpose", x, perm=list(range(rank(x)))[::-1])
    example = imp.example_of()
    if name in ("dtype", "device", "is_cuda", "requires_grad", "layout") and example is not None:
        return example
    raise Untranslatable(f"attribute {name}")


def reshape_target(imp, x: Value, shape) -> list[int]:
    """Target of a reshape: sizes read off tensors at the same position become 0 (copy the input's
    dimension), so `x.view(x.size(0), -1)` keeps working at other batch sizes."""
    if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)):
        shape = shape[0]
    in_shape = x.shape or ()
    out = []
    for i, d in enumerate(shape):
        d = _known_int(d)  # a size computed by tensor ops on static sizes (Longformer's chunk counts)
        if isinstance(d, Value):
            raise Untranslatable("reshape to a computed tensor shape")
        axis = getattr(d, "axis", None)
        if axis is not None and axis == i and i < len(in_shape) and in_shape[i] == int(d) \
                and (d.source is x or i == 0):
            out.append(0)
        else:
            out.append(int(d))
    return out


@METHODS.register("view", "reshape")
def view(imp, x, *shape):
    x = tensor(x)
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise Untranslatable("view as another dtype")
    return imp.op("Reshape", x, imp.ints(reshape_target(imp, x, shape)))


@FUNCTIONS.register(torch.reshape)
def _reshape(imp, x, shape):
    return view(imp, x, shape)


def flatten(imp, x, start_dim=0, end_dim=-1):
    x = tensor(x)
    r = rank(x)
    if r == 0:
        return imp.op("Reshape", x, imp.ints([1]))
    s, e = norm_axis(start_dim, r), norm_axis(end_dim, r)
    if s == e:
        return x
    if s == 1 and e == r - 1:
        return imp.op("Flatten", x, axis=1)
    shape = imp.shape_of(x)
    target = [0] * s + [-1] + list(shape[e + 1:])
    return imp.op("Reshape", x, imp.ints(target))


FUNCTIONS[torch.flatten] = flatten
METHODS["flatten"] = flatten
MODULES[nn.Flatten] = lambda imp, m, x: flatten(imp, x, m.start_dim, m.end_dim)


@METHODS.register("permute")
def _permute(imp, x, *dims):
    x = tensor(x)
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = dims[0]
    r = rank(x)
    return imp.op("Transpose", x, perm=[norm_axis(d, r) for d in dims])


@FUNCTIONS.register(torch.permute)
def f_permute(imp, x, dims):
    return _permute(imp, x, dims)


@FUNCTIONS.register(torch.transpose)
@METHODS.register("transpose")
def _transpose(imp, x, dim0, dim1):
    x = tensor(x)
    r = rank(x)
    perm = list(range(r))
    a, b = norm_axis(dim0, r), norm_axis(dim1, r)
    perm[a], perm[b] = perm[b], perm[a]
    return imp.op("Transpose", x, perm=perm)


@FUNCTIONS.register(torch.t)
@METHODS.register("t")
def _t(imp, x):
    x = tensor(x)
    return x if rank(x) < 2 else imp.op("Transpose", x, perm=[1, 0])


@FUNCTIONS.register(torch.unsqueeze)
@METHODS.register("unsqueeze")
def _unsqueeze(imp, x, dim):
    x = tensor(x)
    return imp.op("Unsqueeze", x, imp.ints([norm_axis(dim, rank(x) + 1)]))


@FUNCTIONS.register(torch.squeeze)
@METHODS.register("squeeze")
def _squeeze(imp, x, dim=None):
    x = tensor(x)
    shape = imp.shape_of(x)
    dims = range(len(shape)) if dim is None else ([dim] if isinstance(dim, int) else dim)
    axes = [a for a in (norm_axis(d, len(shape)) for d in dims) if shape[a] == 1]
    return x if not axes else imp.op("Squeeze", x, imp.ints(axes))


@FUNCTIONS.register(torch.cat, torch.concat, torch.concatenate)
def _cat(imp, tensors, dim=0, axis=None):
    tensors = [tensor(t) for t in tensors]
    # torch's legacy rule: a 1-d empty tensor is skipped beside tensors of another rank (transformers'
    # DynamicLayer starts its key/value cache as torch.tensor([]) and concatenates the states onto it)
    kept = [t for t in tensors if not (t.shape == (0,) and any(rank(o) != 1 for o in tensors))]
    tensors = kept or tensors[:1]
    if len(tensors) == 1:
        return tensors[0]
    if len({t.dtype for t in tensors}) > 1:  # torch promotes the inputs to their common dtype
        common = functools.reduce(torch.promote_types, [getattr(torch, t.dtype) for t in tensors])
        name = str(common).replace("torch.", "")
        tensors = [t if t.dtype == name else imp.op("Cast", t, to=name) for t in tensors]
    return imp.op("Concat", *tensors, axis=norm_axis(dim if axis is None else axis, rank(tensors[0])))


@FUNCTIONS.register(torch.stack)
def _stack(imp, tensors, dim=0):
    tensors = [tensor(t) for t in tensors]
    axis = norm_axis(dim, rank(tensors[0]) + 1)
    return imp.op("Concat", *[imp.op("Unsqueeze", t, imp.ints([axis])) for t in tensors], axis=axis)


@METHODS.register("expand")
def expand(imp, x, *sizes):
    x = tensor(x)
    if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)):
        sizes = sizes[0]
    shape = imp.shape_of(x)
    offset = len(sizes) - len(shape)
    target = [shape[i - offset] if int(s) == -1 else int(s) for i, s in enumerate(sizes)]
    return imp.op("Expand", x, imp.ints(target))


@FUNCTIONS.register(torch.meshgrid, torch._C._VariableFunctions.meshgrid)  # the second: torch.export's call
def _meshgrid(imp, *tensors, indexing=None):
    """torch.meshgrid of 1-d tensors: each reshaped onto its own axis and expanded to the grid ("ij", the
    default; "xy" swaps the first two axes, as numpy's)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    ts = [tensor(t) for t in tensors]
    if any(rank(t) > 1 for t in ts):
        raise Untranslatable("meshgrid of tensors that are not 1-d")
    sizes = [int(np.prod(imp.shape_of(t))) for t in ts]
    axes = list(range(len(ts)))
    if indexing == "xy" and len(ts) >= 2:
        axes[0], axes[1] = 1, 0
    grid = [sizes[axes.index(k)] for k in range(len(ts))]
    out = []
    for t, axis in zip(ts, axes):
        shape = [1] * len(ts)
        shape[axis] = -1
        out.append(imp.op("Expand", imp.op("Reshape", t, imp.ints(shape)), imp.ints(grid)))
    return tuple(out)


def flip(imp, x, dims):
    """flip on a static shape: a Gather of the reversed indices on each flipped axis."""
    x = tensor(x)
    shape = imp.shape_of(x)
    for d in ([dims] if isinstance(dims, int) else dims):
        axis = norm_axis(d, len(shape))
        x = imp.op("Gather", x, imp.const(np.arange(shape[axis] - 1, -1, -1, dtype=np.int64)), axis=axis)
    return x


@FUNCTIONS.register(torch.flip)
@METHODS.register("flip")
def _f_flip(imp, x, *dims, **kwargs):
    dims = kwargs.get("dims", dims[0] if len(dims) == 1 and isinstance(dims[0], (list, tuple)) else list(dims))
    return flip(imp, x, dims)


FUNCTIONS.update({torch.fliplr: lambda imp, x: flip(imp, x, [1]), torch.flipud: lambda imp, x: flip(imp, x, [0])})
METHODS.update({"fliplr": lambda imp, x: flip(imp, x, [1]), "flipud": lambda imp, x: flip(imp, x, [0])})


@METHODS.register("expand_as")
def _expand_as(imp, x, other):
    return expand(imp, x, imp.shape_of(tensor(other)))


def split(imp, x, sizes: list[int], axis: int):
    need("Split")
    outs = imp.op("Split", x, imp.ints(sizes), axis=axis, outputs=len(sizes))
    return tuple(outs) if isinstance(outs, tuple) else (outs,)


@FUNCTIONS.register(torch.chunk)
@METHODS.register("chunk")
def _chunk(imp, x, chunks, dim=0):
    x = tensor(x)
    axis = norm_axis(dim, rank(x))
    n = imp.shape_of(x)[axis]
    size = -(-n // chunks)
    sizes = [min(size, n - i) for i in range(0, n, size)]
    return split(imp, x, sizes, axis)


@FUNCTIONS.register(torch.split)
@METHODS.register("split")
def _f_split(imp, x, split_size_or_sections, dim=0):
    x = tensor(x)
    axis = norm_axis(dim, rank(x))
    n = imp.shape_of(x)[axis]
    if isinstance(split_size_or_sections, int):
        s = split_size_or_sections
        sizes = [min(s, n - i) for i in range(0, n, s)]
    else:
        sizes = [int(s) for s in split_size_or_sections]
    return split(imp, x, sizes, axis)


@FUNCTIONS.register(torch.tensor_split)
@METHODS.register("tensor_split")
def _tensor_split(imp, x, indices_or_sections, dim=0):
    """torch.tensor_split: n sections (the first size % n one longer, as numpy's array_split) or cut at the
    given indices (as slices: clamped to the axis, a part 0 long where indices meet or cross)."""
    x = tensor(x)
    axis = norm_axis(dim, rank(x))
    n = imp.shape_of(x)[axis]
    if isinstance(indices_or_sections, Value):
        raise Untranslatable("indices given as a tensor")
    if isinstance(indices_or_sections, int):
        k = int(indices_or_sections)
        if k <= 0:
            raise Untranslatable(f"{k} sections")
        sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
        if 0 in sizes:
            raise Untranslatable(f"{k} sections of an axis of {n} leave an empty part")
    else:  # part j is x[bounds[j]:bounds[j + 1]] with Python's slice rules
        bounds = [0] + [min(max(int(i) + (n if int(i) < 0 else 0), 0), n) for i in indices_or_sections] + [n]
        if any(end <= start for start, end in zip(bounds, bounds[1:])):
            # an empty part (Mamba cuts a 16-long axis at [16]): every part a Slice, the empty ones 0 long
            return tuple(imp.op("Slice", x, imp.ints([start]), imp.ints([max(start, end)]), imp.ints([axis]))
                         for start, end in zip(bounds, bounds[1:]))
        sizes = [end - start for start, end in zip(bounds, bounds[1:])]
    return split(imp, x, sizes, axis)


ATEN.add("split_with_sizes", _f_split)  # torch.export's form of x.split([a, b]) (Jamba's mamba mixer)


@FUNCTIONS.register(operator.getitem)
def _getitem(imp, x, index):
    if not isinstance(x, Value):
        return x[index]
    index = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, Value) or isinstance(i, (list, torch.Tensor)) for i in index):
        return advanced_getitem(imp, x, index)
    shape = list(imp.shape_of(x))
    if index.count(Ellipsis) > 1:
        raise Untranslatable("two ellipses")
    consumed = sum(1 for i in index if i is not None and i is not Ellipsis)
    if Ellipsis in index:
        k = index.index(Ellipsis)
        index = index[:k] + (slice(None),) * (len(shape) - consumed) + index[k + 1:]
    starts, ends, axes, steps, gathers, unsq = [], [], [], [], [], []
    axis = 0
    out_axis = 0
    for i in index:
        if i is None:
            unsq.append(out_axis)
            out_axis += 1
            continue
        if isinstance(i, slice):
            if i != slice(None):
                b, e, st = i.indices(shape[axis])
                if st <= 0:
                    raise Untranslatable("negative step")
                starts.append(b)
                ends.append(e)
                axes.append(axis)
                steps.append(st)
            out_axis += 1
        else:
            gathers.append((axis, int(i) % shape[axis]))
        axis += 1
    y = x
    if starts:
        need("Slice")
        y = imp.op("Slice", y, imp.ints(starts), imp.ints(ends), imp.ints(axes), imp.ints(steps))
    for k, (ax, i) in enumerate(reversed(gathers)):  # highest axis first so lower axes keep their place
        y = imp.op("Gather", y, imp.const(np.int64(i)), axis=ax)
    if unsq:
        y = imp.op("Unsqueeze", y, imp.ints(unsq))
    return y


# ---------------------------------------------------------------------------------- more shapes
@FUNCTIONS.register(torch.unbind)
@METHODS.register("unbind")
def _unbind(imp, x, dim=0):
    x = tensor(x)
    axis = norm_axis(dim, rank(x))
    return tuple(imp.op("Gather", x, imp.const(np.int64(i)), axis=axis) for i in range(imp.shape_of(x)[axis]))


@METHODS.register("repeat")
def _repeat(imp, x, *sizes):
    x = tensor(x)
    if len(sizes) == 1 and isinstance(sizes[0], (list, tuple, torch.Size)):
        sizes = sizes[0]
    sizes = [int(s) for s in sizes]
    r = rank(x)
    if len(sizes) < r:
        raise Untranslatable("fewer repeats than dimensions")
    if len(sizes) > r:
        x = imp.op("Reshape", x, imp.ints([1] * (len(sizes) - r) + list(imp.shape_of(x))))
    need("Tile")
    return imp.op("Tile", x, imp.ints(sizes))


@FUNCTIONS.register(torch.tile)
@METHODS.register("tile")
def _tile(imp, x, *dims):
    x = tensor(x)
    if len(dims) == 1 and isinstance(dims[0], (list, tuple, torch.Size)):
        dims = dims[0]
    dims = [1] * (rank(x) - len(dims)) + [int(d) for d in dims]
    return _repeat(imp, x, dims)


@FUNCTIONS.register(torch.repeat_interleave)
@METHODS.register("repeat_interleave")
def _repeat_interleave(imp, x, repeats, dim=None, *, output_size=None):
    x = tensor(x)
    if not isinstance(repeats, int) or dim is None:
        raise Untranslatable("tensor repeats or no dim")
    shape = list(imp.shape_of(x))
    axis = norm_axis(dim, len(shape))
    y = imp.op("Unsqueeze", x, imp.ints([axis + 1]))
    y = imp.op("Tile", y, imp.ints([1] * (axis + 1) + [repeats] + [1] * (len(shape) - axis - 1)))
    shape[axis] *= repeats
    return imp.op("Reshape", y, imp.ints([0] + shape[1:] if axis else shape))


@METHODS.register("view_as", "reshape_as")
def _view_as(imp, x, other):
    other = tensor(other)
    shape = imp.shape_of(other)
    return imp.op("Reshape", tensor(x), imp.ints(shape))


@METHODS.register("type_as")
def _type_as(imp, x, other):
    x, other = tensor(x), tensor(other)
    return x if x.dtype == other.dtype else imp.op("Cast", x, to=other.dtype)


@FUNCTIONS.register(torch.broadcast_to)
def _broadcast_to(imp, x, size):
    return expand(imp, x, *size)


@FUNCTIONS.register(torch.movedim, torch.moveaxis)
@METHODS.register("movedim", "moveaxis")
def _movedim(imp, x, source, destination):
    x = tensor(x)
    r = rank(x)
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    src, dst = [norm_axis(s, r) for s in src], [norm_axis(d, r) for d in dst]
    rest = [a for a in range(r) if a not in src]
    perm = [None] * r
    for s, d in zip(src, dst):
        perm[d] = s
    it = iter(rest)
    perm = [p if p is not None else next(it) for p in perm]
    return imp.op("Transpose", x, perm=perm)


@FUNCTIONS.register(torch.swapaxes, torch.swapdims)
@METHODS.register("swapaxes", "swapdims")
def _swapaxes(imp, x, a, b):
    return _transpose(imp, x, a, b)


def _constant_like(fill):
    """zeros_like / ones_like / full_like: ConstantOfShape of the input's shape (a dynamic batch stays free)."""

    def conv(imp, x, *args, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False,
             memory_format=None):
        x = tensor(x)
        value = fill if fill is not None else args[0]
        if isinstance(value, Value):
            raise Untranslatable("tensor fill value")
        dt = str(dtype).replace("torch.", "") if dtype is not None else x.dtype
        shape = imp.op("Shape", x)
        return imp.op("ConstantOfShape", shape, value=np.array([value], dtype=dt))
    return conv


FUNCTIONS.update({torch.zeros_like: _constant_like(0), torch.ones_like: _constant_like(1),
                  torch.full_like: _constant_like(None)})


@METHODS.register("new_zeros", "new_ones", "new_full", "new_tensor")
def _new_constant(imp, x, *args, **kwargs):
    """A constant made from sizes and values (recomputed: the example run's tensor may have been changed
    in place since)."""
    like = imp.example_of(imp.current.args[0])
    # a size computed with tensor ops on sizes (Longformer's `torch.div(seq_len, w) - 1`) is a known value
    args, kwargs = torch.utils._pytree.tree_map(_known_int, (args, kwargs))
    if not isinstance(like, torch.Tensor):
        raise Untranslatable("no example value")
    if any(isinstance(a, Value) for a in torch.utils._pytree.tree_leaves((args, kwargs))):
        raise Untranslatable("a size or value computed at run time")
    return imp.const(tensor_to_numpy_(getattr(like, imp.current.target)(*[int(a) if isinstance(a, int) and not
                                                                          isinstance(a, bool) else a for a in args],
                                                                        **kwargs)))


def _known_int(v):
    """A one-element integer Value whose value is known at build time, as a Python int (else v)."""
    if isinstance(v, Value):
        from aiacc.core.ops import registry

        c = registry.known_value(v)
        if c is not None and c.size == 1 and c.dtype.kind in "iu":
            return int(c.reshape(-1)[0])
    return v


@METHODS.register("stride")
def _stride(imp, x, dim=None):
    """x.stride([dim]): the example tensor's strides in elements, fixed at trace time like its shape
    (Longformer builds as_strided windows from them)."""
    tensor(x)
    like = imp.example_of(imp.current.args[0])
    if not isinstance(like, torch.Tensor):
        raise Untranslatable("no example value")
    return like.stride() if dim is None else like.stride(dim)


def as_strided(imp, x, size, stride, storage_offset=None):
    """x.as_strided(size, stride, storage_offset) (Longformer's overlapping attention chunks): element
    [j0, j1, ...] is the storage element at storage_offset + sum(j_k * stride_k). The IR holds values, not
    memory, so the storage is read through x's own layout on the example (its strides and offset): each
    storage position is mapped back to the element of x that holds it, and the result is one Gather of the
    flat x with that constant index array (one int64 per output element). x's layout follows the model
    inputs it is computed from, so those keep the example's layout (layout_guard: GuardError on a call that
    changes it). A position no element of x holds (storage of a larger tensor x is a view of), or an x whose
    elements overlap in memory (an expanded tensor), has no such meaning: Untranslatable."""
    x = tensor(x)
    size, stride, storage_offset = torch.utils._pytree.tree_map(_known_int, (size, stride, storage_offset))
    if any(isinstance(a, Value) for a in torch.utils._pytree.tree_leaves((size, stride, storage_offset))):
        raise Untranslatable("as_strided with a size or stride computed at run time")
    like = imp.example_of(imp.current.args[0])
    if not isinstance(like, torch.Tensor):
        raise Untranslatable("no example value")
    size, stride = [int(d) for d in size], [int(d) for d in stride]
    if len(size) != len(stride):
        raise Untranslatable(f"as_strided: {len(size)} sizes and {len(stride)} strides")
    start = like.storage_offset() if storage_offset is None else int(storage_offset)
    held = _storage_positions(list(like.shape), list(like.stride()), like.storage_offset())
    wanted = _storage_positions(size, stride, start)
    if held.size == 0 or wanted.size == 0:
        raise Untranslatable("as_strided of or to an empty tensor")
    owner = np.full(int(held.max()) + 1, -1, dtype=np.int64)  # storage position -> x's flat element
    owner[held.reshape(-1)] = np.arange(held.size, dtype=np.int64)
    if np.count_nonzero(owner >= 0) != held.size:
        raise Untranslatable("as_strided of a tensor whose elements share memory (an expanded tensor)")
    if wanted.min() < 0 or wanted.max() >= owner.size or (owner[wanted] < 0).any():
        raise Untranslatable("as_strided reads storage outside the tensor's own elements")
    # the index holds for the example's layout: a model input that layout follows is guarded to keep it
    from aiacc.plugins.torch import layout_guard

    layout_guard.record(imp, imp.current.args[0], storage_offset is not None, imp.current.name)
    flat = imp.op("Reshape", x, imp.ints([-1]))
    return imp.op("Gather", flat, imp.const(owner[wanted]), axis=0)


def _storage_positions(size: list[int], stride: list[int], offset: int) -> np.ndarray:
    """The storage position of each element of a strided view, as an int64 array of its shape."""
    pos = np.full(size, offset, dtype=np.int64)
    for axis, (n, st) in enumerate(zip(size, stride)):
        pos = pos + (np.arange(n, dtype=np.int64) * st).reshape([n if a == axis else 1 for a in range(len(size))])
    return pos


METHODS["as_strided"] = as_strided
FUNCTIONS[torch.as_strided] = as_strided


def tensor_to_numpy_(t: torch.Tensor) -> np.ndarray:
    return tensor_to_numpy(t)


@METHODS.register("fill_", "zero_")
def _fill(imp, x, value=0):
    x = tensor(x)
    if isinstance(value, Value):
        raise Untranslatable("tensor fill value")
    return imp.op("ConstantOfShape", imp.op("Shape", x), value=np.array([value], dtype=x.dtype))


@FUNCTIONS.register(operator.setitem)
def _setitem(imp, x, index, value):
    """`x[index] = value` out of place: Where(region mask, value padded to x's shape, x). Basic indexing
    (integers, step-1 slices, Ellipsis) only."""
    if not isinstance(x, Value):
        raise Untranslatable("item assignment on a non-tensor")
    shape = list(imp.shape_of(x))
    index = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, (Value, list, torch.Tensor)) for i in index) and index.count(Ellipsis) <= 1 \
            and None not in index:
        # index tensors (computed positions, a boolean mask): index_put among full slices
        from aiacc.plugins.torch.import_ops.scatter import index_put

        if Ellipsis in index:
            k = index.index(Ellipsis)
            index = index[:k] + (slice(None),) * (len(shape) - len(index) + 1) + index[k + 1:]
        if any(isinstance(i, slice) and i != slice(None) or isinstance(i, int) for i in index):
            raise Untranslatable("advanced indexing mixed with partial slices or integers")
        return index_put(imp, x, tuple(None if isinstance(i, slice) else i for i in index), value)
    if any(i is None or isinstance(i, (Value, list, torch.Tensor)) for i in index) or index.count(Ellipsis) > 1:
        raise Untranslatable("advanced indexing")
    consumed = sum(1 for i in index if i is not Ellipsis)
    if Ellipsis in index:
        k = index.index(Ellipsis)
        index = index[:k] + (slice(None),) * (len(shape) - consumed) + index[k + 1:]
    index = index + (slice(None),) * (len(shape) - len(index))
    if len(index) != len(shape):
        raise Untranslatable("too many indices")
    mask_shape, region, pads_begin, pads_end, int_axes, selects = [], [], [], [], [], []
    for axis, (i, d) in enumerate(zip(index, shape)):
        if isinstance(i, slice):
            b, e, st = i.indices(d)
            if st != 1:
                raise Untranslatable("strided slice assignment")
            e = max(e, b)
        else:
            b = int(i) % d
            e = b + 1
            int_axes.append(axis)
        full = (b, e) == (0, d)
        mask_shape.append(1 if full else d)
        selects.append(slice(None) if full else slice(b, e))
        region.append(e - b)
        pads_begin.append(b)
        pads_end.append(d - e)
    mask = np.zeros(mask_shape, dtype=bool)
    mask[tuple(selects)] = True
    if isinstance(value, Value):
        if value.dtype != x.dtype:
            raise Untranslatable("value of another dtype")
        v = value
        if int_axes:  # the integer-indexed axes are absent from the value: put them back
            v_rank = rank(v)
            kept = len(shape) - len(int_axes)
            if v_rank > kept:
                raise Untranslatable("value of higher rank than the region")
            v = imp.op("Reshape", v, imp.ints([1] * (kept - v_rank) + list(imp.shape_of(v))))
            v = imp.op("Unsqueeze", v, imp.ints(int_axes))
        v = imp.op("Expand", v, imp.ints(region))
        if any(pads_begin) or any(pads_end):
            v = imp.op("Pad", v, imp.ints(pads_begin + pads_end))
    else:
        if isinstance(value, torch.Tensor):
            raise Untranslatable("tensor constant value")
        v = imp.scalar_like(value, x)
    return imp.op("Where", imp.const(mask), v, x)


@METHODS.register("item", "tolist")
def _item(imp, x):
    raise Untranslatable("reads a tensor's value into Python (data-dependent)")


# ---------------------------------------------------------------------------------- padding modules
def _pad_module(mode):
    def conv(imp, m, x):
        value = getattr(m, "value", 0.0) if mode == "constant" else None
        return f_pad(imp, x, list(m.padding), mode, value)
    return conv


for _mode, _types in (("constant", ("ZeroPad1d", "ZeroPad2d", "ZeroPad3d", "ConstantPad1d", "ConstantPad2d",
                                    "ConstantPad3d")),
                      ("reflect", ("ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d")),
                      ("replicate", ("ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d")),
                      ("circular", ("CircularPad1d", "CircularPad2d", "CircularPad3d"))):
    for _t in _types:
        if hasattr(nn, _t):
            MODULES[getattr(nn, _t)] = _pad_module(_mode)



# ---------------------------------------------------------------------------------- rearrangements
def pixel_shuffle(imp, x, r: int, inverse: bool = False):
    """PixelShuffle (depth to space, torch's channel order) and PixelUnshuffle as Reshape-Transpose-Reshape."""
    x = tensor(x)
    shape = imp.shape_of(x)
    if len(shape) != 4:
        raise Untranslatable("input of rank other than 4")
    n, c, h, w = shape
    if not inverse:
        if c % (r * r):
            raise Untranslatable(f"{c} channels do not divide by {r}^2")
        y = imp.op("Reshape", x, imp.ints([0, c // (r * r), r, r, h, w]))
        y = imp.op("Transpose", y, perm=[0, 1, 4, 2, 5, 3])
        return imp.op("Reshape", y, imp.ints([0, c // (r * r), h * r, w * r]))
    if h % r or w % r:
        raise Untranslatable(f"{h}x{w} does not divide by {r}")
    y = imp.op("Reshape", x, imp.ints([0, c, h // r, r, w // r, r]))
    y = imp.op("Transpose", y, perm=[0, 1, 3, 5, 2, 4])
    return imp.op("Reshape", y, imp.ints([0, c * r * r, h // r, w // r]))


FUNCTIONS[F.pixel_shuffle] = lambda imp, x, upscale_factor: pixel_shuffle(imp, x, int(upscale_factor))
FUNCTIONS[F.pixel_unshuffle] = lambda imp, x, downscale_factor: pixel_shuffle(imp, x, int(downscale_factor), True)
MODULES[nn.PixelShuffle] = lambda imp, m, x: pixel_shuffle(imp, x, m.upscale_factor)
MODULES[nn.PixelUnshuffle] = lambda imp, m, x: pixel_shuffle(imp, x, m.downscale_factor, True)


@MODULES.register(nn.ChannelShuffle)
def _m_channel_shuffle(imp, m, x):
    x = tensor(x)
    shape = list(imp.shape_of(x))
    g = m.groups
    if len(shape) < 3 or shape[1] % g:
        raise Untranslatable("channels do not divide into the groups")
    y = imp.op("Reshape", x, imp.ints([0, g, shape[1] // g] + shape[2:]))
    y = imp.op("Transpose", y, perm=[0, 2, 1] + list(range(3, len(shape) + 1)))
    return imp.op("Reshape", y, imp.ints([0] + shape[1:]))


@FUNCTIONS.register(torch.unflatten)
@METHODS.register("unflatten")
def unflatten(imp, x, dim, sizes):
    x = tensor(x)
    shape = list(imp.shape_of(x))
    axis = norm_axis(dim, len(shape))
    sizes = [int(s) for s in sizes]
    if -1 in sizes:
        known = int(np.prod([s for s in sizes if s != -1]))
        sizes[sizes.index(-1)] = shape[axis] // known
    target = [0] * axis + sizes + shape[axis + 1:]  # leading axes copied (a dynamic batch stays free)
    return imp.op("Reshape", x, imp.ints(target))


MODULES[nn.Unflatten] = lambda imp, m, x: unflatten(imp, x, m.dim, m.unflattened_size)


@FUNCTIONS.register(torch.index_select)
@METHODS.register("index_select")
def _index_select(imp, x, dim, index):
    """torch.index_select: a Gather on `dim`. An index computed from the inputs is checked at run time in
    0..size-1 (torch raises IndexError on any other, a negative one too, which a Gather would read from the
    end)."""
    x, index = tensor(x), tensor(index, "index")
    axis = norm_axis(dim, rank(x))
    size = imp.shape_of(x)[axis] if rank(x) else 1
    check_axis_index(imp, index, size, axis, "index_select", False, "an error (IndexError, RuntimeError)")
    return imp.op("Gather", x, index, axis=axis)


@FUNCTIONS.register(torch.narrow)
@METHODS.register("narrow")
def _narrow(imp, x, dim, start, length):
    """x.narrow(dim, start, length): a Slice (start and length Python ints: the trace's)."""
    x = tensor(x)
    if isinstance(start, Value) or isinstance(length, Value):
        raise Untranslatable("narrow with a tensor start or length")
    axis = norm_axis(int(dim), rank(x))
    n = imp.shape_of(x)[axis]
    b = int(start) % n if int(start) < 0 else int(start)
    return imp.op("Slice", x, imp.ints([b]), imp.ints([b + int(length)]), imp.ints([axis]), imp.ints([1]))


@FUNCTIONS.register(F.one_hot)
def _one_hot(imp, x, num_classes=-1):
    """F.one_hot(x, num_classes): Equal(x[..., None], 0..num_classes-1) as int64. num_classes=-1 (the
    data's maximum + 1: a data-dependent shape) stays opaque."""
    x = tensor(x)
    if int(num_classes) < 0:
        raise Untranslatable("one_hot without num_classes (its width depends on the data)")
    if x.dtype != "int64":
        raise Untranslatable(f"one_hot of a {x.dtype} tensor")
    from aiacc.plugins.torch.import_ops.loss import check_targets

    check_targets(imp, x, int(num_classes), "one_hot")  # torch raises on a class outside 0..num_classes-1
    hot = imp.op("Equal", imp.op("Unsqueeze", x, imp.ints([rank(x)])),
                 imp.const(np.arange(int(num_classes), dtype=np.int64)))
    return imp.op("Cast", hot, to="int64")


# ------------------------------------------------------------------------------------ sliding windows
@METHODS.register("unfold")
def _tensor_unfold(imp, x, dimension, size, step):
    """Tensor.unfold(dim, size, step) (timm's HaloNet blocks): the windows x[..., i*step : i*step+size, ...]
    as a Gather of a constant [windows, size] index along dim, the window axis moved last (torch's layout)."""
    x = tensor(x)
    r = rank(x)
    axis = norm_axis(int(dimension), max(r, 1))
    length = x.shape[axis] if r else 1
    if not isinstance(length, int) or any(isinstance(a, Value) for a in (size, step)):
        raise Untranslatable("unfold of an axis of unknown size or with tensor arguments")
    size, step = int(size), int(step)
    if step <= 0 or size > length:
        raise Untranslatable(f"unfold size {size} step {step} of an axis of {length}")
    windows = (length - size) // step + 1
    index = np.arange(windows, dtype=np.int64)[:, None] * step + np.arange(size, dtype=np.int64)[None, :]
    y = imp.op("Gather", x, imp.const(index), axis=axis)  # x[:axis] + [windows, size] + x[axis+1:]
    perm = list(range(axis + 1)) + list(range(axis + 2, r + 1)) + [axis + 1]
    return y if perm == list(range(r + 1)) else imp.op("Transpose", y, perm=perm)
