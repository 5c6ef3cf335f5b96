"""Converters for indexing and the ops transformers / torchvision / timm models use around it: tensor
(advanced) indexing, torch.gather, cumsum, diff, torchvision's stochastic_depth and timm's drop_path.

All of them are built from ops the IR has (Gather, Reshape, Mul, Add, Mod, ReduceSum, Floor ...) on static
shapes, so they fuse and lower like any other node.
"""
from __future__ import annotations

import numpy as np
import torch

from aiacc.core.ir import Value, const_value
from aiacc.core.translate import Untranslatable
from aiacc.plugins.torch.import_ops.common import norm_axis, rank, tensor
from aiacc.plugins.torch.importer import FUNCTIONS, METHODS, tensor_to_numpy


# ---------------------------------------------------------------------------- run-time index checks
# ops whose output is not fixed by their inputs: an index computed through one is not known in range
_UNFIXED = {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Multinomial", "Bernoulli"}


def fixed(v: Value) -> bool:
    """Whether `v` is computed from constants only (no graph input, opaque call, random or side-effect op on
    the way): its value is then the same on every call as on the example."""
    seen, todo = set(), [v]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen or x.is_constant:
            continue
        seen.add(id(x))
        p = x.producer
        if p is None or p.is_opaque or p.schema is None or p.schema.side_effects or p.op in _UNFIXED:
            return False
        todo.extend(p.inputs)
    return True


def _in_range_by_construction(idx: Value, lower: int, upper: int) -> bool:
    """Whether every element of `idx` is in lower..upper-1 whatever the input: a Mod (fmod=0: the divisor's
    sign) by a positive constant n <= upper, as torch.export's take_along_dim computes its index
    (remainder(index, size) before the gather)."""
    p = idx.producer
    while p is not None and p.op == "Cast" and p.attrs.get("to") in ("int64", "int32"):
        p = p.inputs[0].producer
    n = None if p is None or p.op != "Mod" or p.attrs.get("fmod", 0) != 0 else const_value(p.inputs[1])
    if n is None:
        return False
    return n.size == 1 and n.dtype.kind in "iu" and 0 < int(n.reshape(-1)[0]) <= upper and lower <= 0


def check_index(imp, idx: Value, size: int, *, what: str, message: str, negative: bool = False,
                suffix: str = "index") -> None:
    """A run-time check that every index of `idx` addresses one of `size` entries: 0..size-1, or with
    `negative` (torch's `x[idx]`, which counts a negative index from the end) -size..size-1. torch raises on
    any other, while a Gather (onnxruntime's, aiacc's kernel) reads a negative index from the end and the Mod
    a converter wraps negative indices with would turn a too-large one into another entry. An
    aiacc::ValueGuard carrying `message` (a GuardError naming the node), the embedding ids' and the loss
    targets' mechanism. Left out where the index is fixed (computed from constants only: the example's run
    of the original, which raises on a bad index, read the same one) or in range by construction. The
    check reads only the index and is placed right where it is defined (the graph's start for an input), past
    the checks already there: a backend that runs the guards between sessions (onnxruntime) then splits the
    graph there, not between the lookup and the ops fused with it."""
    if not isinstance(size, int) or idx.dtype not in ("int64", "int32"):
        return  # an axis of unknown size / an index dtype the Gather refuses itself
    lower = -size if negative else 0
    if fixed(idx) or _in_range_by_construction(idx, lower, size):
        return
    from aiacc.plugins.torch.import_ops.loss import all_in_range

    g, name = imp.graph, imp.current.name
    mark = g.checkpoint()
    ok = all_in_range(imp, idx, size, lower=lower)
    conds = g.nodes_since(mark)
    allowed = f"{lower}..{size - 1}"
    guard = g.add_node("ValueGuard", [ok], {"expected": 1, "what": f"{what} in {allowed}", "message": message},
                       domain="aiacc", name=f"{name}_{suffix}")
    # where: after the index's producer (the start for an input), past the checks already there (their
    # conditions first, then their guards), so several checks make one guard run for onnxruntime
    checks = getattr(imp, "_id_checks", None)  # (the conditions' nodes, the guards) of this import
    if checks is None:
        checks = imp._id_checks = (set(), set())
    anchor = g.first_node if idx.producer is None else idx.producer.next
    while anchor is not None and anchor in checks[0]:
        anchor = anchor.next
    if anchor is not None and anchor is not conds[0]:
        for n in conds:
            g.move_before(n, anchor)
    after = conds[-1].next
    while after is not None and after in checks[1]:
        after = after.next
    if after is not None and after is not guard:
        g.move_before(guard, after)
    checks[0].update(conds)
    checks[1].add(guard)


def check_axis_index(imp, idx: Value, size, axis: int, op: str, negative: bool, error: str) -> None:
    """`check_index` for an index along `axis` of a tensor (`op`: the torch op in the message; `error`: the
    exception torch raises)."""
    if not isinstance(size, int):
        return
    allowed = f"{-size if negative else 0}..{size - 1}"
    message = (f"{op} (node {imp.current.name}): an index is outside dimension {axis}'s {size} entries (this call "
               f"has an index < {-size if negative else 0} or >= {size}; indices must be in {allowed}), where "
               f"torch raises {error}; the optimized model refuses the call rather than read or write another entry")
    check_index(imp, idx, size, what=f"{op}'s indices on dimension {axis}", message=message, negative=negative)


def _index_value(imp, i) -> Value | None:
    """An integer index tensor as an IR value (a constant for a torch tensor or a list); None if not one.
    uint8 is refused: torch reads a uint8 index tensor as a mask."""
    if isinstance(i, Value):
        if i.dtype is None or np.dtype(i.dtype).kind not in "iu" or i.dtype == "uint8":
            raise Untranslatable("a boolean, uint8 or float index tensor (masking gives a data-dependent shape)")
        return i
    if isinstance(i, torch.Tensor) or isinstance(i, list):
        a = tensor_to_numpy(i) if isinstance(i, torch.Tensor) else np.asarray(i)
        if a.dtype.kind not in "iu" or a.dtype == np.uint8:
            raise Untranslatable("a boolean, uint8 or float index tensor (masking gives a data-dependent shape)")
        return imp.const(a.astype(np.int64))
    return None


def _wrap(imp, idx: Value, size: int) -> Value:
    """Negative indices count from the end (torch's indexing rule): idx mod size."""
    return imp.op("Mod", idx, imp.const(np.asarray(size, dtype=idx.dtype or "int64")), fmod=0)


def advanced_getitem(imp, x: Value, index: tuple, checked: bool = True):
    """`x[..., idx, ...]` with index tensors: one tensor index among full slices is a Gather on its axis;
    several tensors on the leading axes (`mask[batch_idx, kv_idx]`, broadcast together) index the
    flattened leading axes with one linear index; tensors on other axes index those axes moved to the front,
    their dims then placed as torch places them. Other mixes stay opaque. Each index tensor computed from
    the inputs is checked at run time in -size..size-1 of its axis (`check_index`; torch raises IndexError
    on another) unless not `checked` (aten._unsafe_index, which torch does not check)."""
    shape = list(imp.shape_of(x))
    ellipses = [k for k, i in enumerate(index) if i is Ellipsis]
    if len(ellipses) == 1:  # `qkv[..., [-2], :]` (Falcon): the ellipsis stands for the full slices it spans
        k = ellipses[0]
        index = index[:k] + (slice(None),) * (len(shape) - len(index) + 1) + index[k + 1:]
    if any(i is Ellipsis or i is None for i in index):
        raise Untranslatable("advanced indexing with None or several ellipses")
    kinds = []
    for i in index:
        if isinstance(i, slice):
            if i != slice(None):
                raise Untranslatable("advanced indexing mixed with a partial slice")
            kinds.append(None)
        else:
            v = _index_value(imp, i)
            if v is None:
                raise Untranslatable("advanced indexing mixed with an integer index")
            kinds.append(v)
    tensors = [k for k, v in enumerate(kinds) if v is not None]
    if checked:
        for k in tensors:
            check_axis_index(imp, kinds[k], shape[k], k, "indexing", True, "IndexError")
    if len(tensors) == 1:
        axis = tensors[0]
        return imp.op("Gather", x, _wrap(imp, kinds[axis], shape[axis]), axis=axis)
    if tensors != list(range(len(tensors))):
        # `x[:, i, j]` (ViTDet's relative positions): the indexed axes moved to the front, indexed there, and
        # the broadcast index dims put where torch puts them: in place of the indexed axes when those are
        # adjacent, first when a full slice separates them
        others = [a for a in range(len(shape)) if a not in tensors]
        moved = imp.op("Transpose", x, perm=tensors + others)
        y = advanced_getitem(imp, moved, tuple(kinds[a] for a in tensors) + (slice(None),) * len(others),
                             checked=False)  # checked above
        adjacent = tensors == list(range(tensors[0], tensors[-1] + 1))
        lead = tensors[0] if adjacent else 0  # the full-slice axes that stay before the index dims
        if lead == 0:
            return y
        b = len(imp.shape_of(y)) - len(others)
        return imp.op("Transpose", y, perm=[b + j for j in range(lead)] + list(range(b))
                      + [b + j for j in range(lead, len(others))])
    k = len(tensors)
    strides = [int(np.prod(shape[j + 1:k])) for j in range(k)]
    linear = None
    for j in range(k):
        term = _wrap(imp, kinds[j], shape[j])
        if strides[j] != 1:
            term = imp.op("Mul", term, imp.const(np.asarray(strides[j], dtype=term.dtype)))
        if linear is not None and linear.dtype != term.dtype:
            raise Untranslatable("index tensors of different dtypes")
        linear = term if linear is None else imp.op("Add", linear, term)
    flat = imp.op("Reshape", x, imp.ints([int(np.prod(shape[:k]))] + shape[k:]))
    return imp.op("Gather", flat, linear, axis=0)


@FUNCTIONS.register(torch.gather)
@METHODS.register("gather")
def _gather(imp, x, dim, index, *, sparse_grad=False, out=None):
    """torch.gather (ONNX GatherElements): out[i][j][k] = x[i][index[i][j][k]][k] for dim 1. Written as a
    Gather on the flattened input with linear indices index * stride(dim) + (the other coordinates). An
    index computed from the inputs is checked at run time in 0..size-1 (torch raises RuntimeError on any
    other, a negative one too)."""
    if out is not None:
        raise Untranslatable("out= argument")
    x, index = tensor(x), _index_value(imp, index)
    if index is None:
        raise Untranslatable("gather index is not a tensor")
    xs, ishape = list(imp.shape_of(x)), list(imp.shape_of(index))
    r = rank(x)
    if len(ishape) != r:
        raise Untranslatable("gather index of another rank")
    axis = norm_axis(dim, r)
    check_axis_index(imp, index, xs[axis], axis, "gather", False, "RuntimeError")
    strides = [int(np.prod(xs[j + 1:])) for j in range(r)]
    # the linear offset of every index position along the other axes (a constant of the shapes)
    grids = np.meshgrid(*[np.arange(n, dtype=np.int64) for n in ishape], indexing="ij")
    base = sum(grids[j] * strides[j] for j in range(r) if j != axis) if r > 1 else np.zeros(ishape, np.int64)
    idx = index if index.dtype == "int64" else imp.op("Cast", index, to="int64")
    idx = _wrap(imp, idx, xs[axis])
    linear = imp.op("Add", imp.op("Mul", idx, imp.const(np.asarray(strides[axis], np.int64))),
                    imp.const(np.asarray(base, np.int64)))
    flat = imp.op("Reshape", x, imp.ints([-1]))
    return imp.op("Gather", flat, linear, axis=0)


@FUNCTIONS.register(torch.take_along_dim)
@METHODS.register("take_along_dim")
def _take_along_dim(imp, x, indices, dim=None, *, out=None):
    """torch.take_along_dim: x and indices broadcast against each other off `dim`, then gather along it.
    torch takes each index modulo the size there (its own decomposition: remainder(indices, size), so -1 is
    the last entry and size + 1 the second, never an error), and so does this (a Mod before the gather,
    which makes the gather's run-time check unnecessary). dim None is torch's gather of the flattened
    tensors, with no modulo: an index outside 0..numel-1 raises, checked as torch.gather's."""
    if out is not None:
        raise Untranslatable("out= argument")
    x, index = tensor(x), _index_value(imp, indices)
    if index is None:
        raise Untranslatable("take_along_dim indices are not a tensor")
    if dim is None:
        return _gather(imp, imp.op("Reshape", x, imp.ints([-1])), 0, imp.op("Reshape", index, imp.ints([-1])))
    xs, ishape = list(imp.shape_of(x)), list(imp.shape_of(index))
    r = len(xs)
    if len(ishape) != r:
        raise Untranslatable("take_along_dim indices of another rank")
    axis = norm_axis(int(dim), r)
    both = [max(a, b) for a, b in zip(xs, ishape)]
    if any(n not in (1, m) for sizes in (xs, ishape) for n, m in zip(sizes, both)):
        raise Untranslatable(f"take_along_dim of shapes {xs} and {ishape} that do not broadcast")
    x_to = [both[j] if j != axis else xs[j] for j in range(r)]
    i_to = [both[j] if j != axis else ishape[j] for j in range(r)]
    if x_to != xs:
        x = imp.op("Expand", x, imp.ints(x_to))
    if i_to != ishape:
        index = imp.op("Expand", index, imp.ints(i_to))
    index = _wrap(imp, index if index.dtype == "int64" else imp.op("Cast", index, to="int64"), xs[axis])
    return _gather(imp, x, axis, index)


@FUNCTIONS.register(torch.cumsum)
@METHODS.register("cumsum")
def _cumsum(imp, x, dim, *, dtype=None, out=None):
    """Cumulative sum along `dim`. Integers (position ids from an attention mask) as a masked sum:
    y[..., i] = sum_j x[..., j] * (j <= i) (static length), exact and what every exporter has; floats as
    the IR's CumSum, whose running sum adds in torch's order (a masked sum would not)."""
    if out is not None:
        raise Untranslatable("out= argument")
    x = tensor(x)
    if x.dtype is None:
        raise Untranslatable("cumsum of a tensor of unknown dtype")
    r = rank(x)
    axis = norm_axis(dim, r)
    if np.dtype(x.dtype).kind == "f" or (dtype is not None and dtype.is_floating_point):
        # floats: the IR's CumSum (ONNX's), a running sum in torch's order
        if dtype is not None and str(dtype).replace("torch.", "") != x.dtype:
            x = imp.op("Cast", x, to=str(dtype).replace("torch.", ""))
        return imp.op("CumSum", x, imp.const(np.asarray(axis, np.int64)))
    n = imp.shape_of(x)[axis]
    if dtype is not None:
        x = imp.op("Cast", x, to=str(dtype).replace("torch.", ""))
    elif x.dtype in ("bool", "int8", "int16", "int32", "uint8"):
        x = imp.op("Cast", x, to="int64")  # torch sums integers as int64
    last = x if axis == r - 1 else imp.op("Transpose", x, perm=[j for j in range(r) if j != axis] + [axis])
    tri = np.tril(np.ones((n, n), dtype=np.dtype(last.dtype)))  # row i: the j <= i taken into y[i]
    y = imp.op("ReduceSum", imp.op("Mul", imp.op("Unsqueeze", last, imp.ints([r - 1])), imp.const(tri)),
               imp.ints([-1]), keepdims=0)
    if axis != r - 1:
        perm = list(range(r - 1))
        perm.insert(axis, r - 1)
        y = imp.op("Transpose", y, perm=perm)
    return y


@FUNCTIONS.register(torch.diff)
@METHODS.register("diff")
def _diff(imp, x, n=1, dim=-1, prepend=None, append=None):
    """torch.diff: x[..., 1:] - x[..., :-1] along `dim`, n times, after concatenating prepend / append (the
    packed-sequence check of transformers' masks); booleans differ by Xor, as torch's does."""
    import operator

    x = tensor(x)
    r = rank(x)
    axis = norm_axis(dim, r)
    parts = [p for p in (prepend, x, append) if p is not None]
    if any(not isinstance(p, Value) for p in parts):
        raise Untranslatable("a scalar prepend / append")
    if any(p.dtype != x.dtype for p in parts):
        raise Untranslatable("prepend / append of another dtype")
    if len(parts) > 1:
        x = imp.op("Concat", *parts, axis=axis)
    lead = (slice(None),) * axis
    for _ in range(int(n)):
        later = FUNCTIONS[operator.getitem](imp, x, lead + (slice(1, None),))
        earlier = FUNCTIONS[operator.getitem](imp, x, lead + (slice(None, -1),))
        x = imp.op("Xor" if x.dtype == "bool" else "Sub", later, earlier)
    return x


@FUNCTIONS.register("torchvision.ops.stochastic_depth.stochastic_depth")
def _stochastic_depth(imp, x, p, mode, training=True):
    """torchvision.ops.stochastic_depth: the identity in eval mode (or p == 0). In training, x times a
    Bernoulli(1 - p) mask over the batch ("row": one draw per sample) or the whole tensor ("batch": one
    draw), divided by 1 - p: that is Dropout(ones(mask shape), p) in training mode, which the exporter
    lowers to F.dropout, so the mask comes from torch's generator with the same draws torchvision makes
    (empty(size).bernoulli_(1 - p) / (1 - p))."""
    if mode not in ("batch", "row"):
        raise Untranslatable(f"stochastic_depth mode {mode!r}")
    return _drop_path(imp, x, p, training, mode == "row", True)


@FUNCTIONS.register("timm.layers.drop.drop_path")
def _timm_drop_path(imp, x, drop_prob=0.0, training=False, scale_by_keep=True):
    """timm's drop_path (DropPath's function): per sample, x times new_empty((B, 1, ...)).bernoulli_(1 - p),
    divided by 1 - p when scale_by_keep; the identity when not training. The same mask as
    stochastic_depth's "row" mode."""
    return _drop_path(imp, x, drop_prob, training, True, bool(scale_by_keep))


def _drop_path(imp, x, p, training, per_row: bool, scale: bool):
    """x * Bernoulli(1 - p) mask of shape (batch, 1, ...) (per_row) or (1, ...), scaled by 1 / (1 - p):
    Dropout(ones, p) in training mode (F.dropout's draws: empty_like(ones).bernoulli_(1 - p) / (1 - p))."""
    x = tensor(x)
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise Untranslatable(f"drop path with p={p!r}")
    if not training or p == 0.0 or not imp.training:
        return imp.op("Identity", x)  # as Dropout: an inference trace computes the eval-mode function
    if p == 1.0:
        raise Untranslatable("drop path with p=1 (torch's 0/0 mask)")
    r = rank(x)
    dt = np.dtype(x.dtype or "float32")
    if per_row and r:
        # ones of shape (batch, 1, ...) taken from x's shape
        size = imp.op("Concat", imp.op("Shape", x, start=0, end=1), imp.ints([1] * (r - 1)), axis=0)
        ones = imp.op("ConstantOfShape", size, value=np.ones([1], dtype=dt))
    else:
        ones = imp.const(np.ones([1] * r, dtype=dt))
    noise = imp.op("Dropout", ones, imp.const(np.float32(p)), imp.const(np.bool_(True)))
    if not scale:  # Dropout scales the kept ones by 1 / (1 - p): undo it
        noise = imp.op("Mul", noise, imp.const(np.asarray(1.0 - p, dtype=dt)))
    return imp.op("Mul", x, noise)


@FUNCTIONS.register(torch.roll)
@METHODS.register("roll")
def _roll(imp, x, shifts, dims=None):
    """torch.roll on static shapes: per rolled axis, the last `shift` elements moved to the front (a Slice of
    each part and a Concat)."""
    x = tensor(x)
    if dims is None:
        raise Untranslatable("roll of the flattened tensor")
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if len(shifts) != len(dims):
        raise Untranslatable("roll with as many shifts as dims")
    shape = imp.shape_of(x)
    y = x
    for shift, dim in zip(shifts, dims):
        axis = norm_axis(int(dim), rank(x))
        n = shape[axis]
        k = int(shift) % n if n else 0
        if k == 0:
            continue
        tail = imp.op("Slice", y, imp.ints([n - k]), imp.ints([n]), imp.ints([axis]))
        head = imp.op("Slice", y, imp.ints([0]), imp.ints([n - k]), imp.ints([axis]))
        y = imp.op("Concat", tail, head, axis=axis)
    return y
