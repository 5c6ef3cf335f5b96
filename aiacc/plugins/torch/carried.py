"""Returned Python objects that hold tensors (a transformers DynamicCache of key/value states, returned with
use_cache=True inside the ModelOutput) carried through a translation.

Neither torch.fx nor torch.export can return such an object: fx records only containers it knows, and
torch.export only pytree nodes. The frontends split it into its tensors (the graph's outputs) and a skeleton
(a copy of the object with its tensors removed; its other values, a device or a length, are fixed to the
example's like every shape of the trace). A CarriedObject pytree node in the return structure's spec rebuilds
a fresh copy of the object around the optimized graph's tensors on every call, never the example's."""
from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable

import torch
from torch import nn
from torch.utils import _pytree as pytree

_DEPTH = 4  # a cache holds its tensors two or three attributes deep (cache.layers[i].keys)


class CarriedObject:
    """A returned object as a pytree node: its tensors are the children; unflattening builds a deep copy of
    `skeleton` with the new values set at `paths` (("attr", name) / ("item", key) steps)."""

    def __init__(self, skeleton: Any, paths: tuple, leaves: list):
        self.skeleton, self.paths, self.leaves = skeleton, paths, leaves

    def rebuild(self, values: list) -> Any:
        obj = copy.deepcopy(self.skeleton)
        for path, value in zip(self.paths, values):
            obj = _put(obj, path, value)
        return obj


def _put(holder: Any, path: tuple, value: Any) -> Any:
    """`holder` with `value` set at `path` (a tuple on the way is rebuilt)."""
    if not path:
        return value
    (kind, key), rest = path[0], path[1:]
    if kind == "attr":
        setattr(holder, key, _put(getattr(holder, key), rest, value))
        return holder
    if isinstance(holder, tuple):
        items = list(holder)
        items[key] = _put(items[key], rest, value)
        return type(holder)(items)
    holder[key] = _put(holder[key], rest, value)
    return holder


def _unflatten(values, context):
    return CarriedObject(*context, []).rebuild(list(values))


pytree.register_pytree_node(CarriedObject, lambda c: (list(c.leaves), (c.skeleton, c.paths)), _unflatten,
                            serialized_type_name="aiacc.plugins.torch.carried.CarriedObject")


def _is_object(x: Any) -> bool:
    return hasattr(x, "__dict__") and not callable(x) and not isinstance(x, (nn.Module, torch.Tensor, type))


def split(obj: Any, leaf: Callable[[Any], tuple[bool, Any]]) -> CarriedObject | None:
    """A CarriedObject of `obj` if it is a plain object holding leaves in its attributes (through lists,
    tuples and dicts), else None. `leaf(x)` -> (True, _) for a value to carry as a child, (False, v) to keep
    `v` in the skeleton instead (a traced non-tensor value: its example value)."""
    if not _is_object(obj) or type(obj) in pytree.SUPPORTED_NODES:
        return None
    return _split(obj, leaf)


def _split(obj: Any, leaf: Callable[[Any], tuple[bool, Any]]) -> CarriedObject | None:
    paths: list[tuple] = []
    leaves: list[Any] = []

    def walk(x, path, depth):
        is_leaf, kept = leaf(x)
        if is_leaf:
            paths.append(path)
            leaves.append(x)
            return None
        x = kept
        if depth > _DEPTH or isinstance(x, (nn.Module, torch.Tensor, type)):
            return x
        if type(x) in (list, tuple):
            return type(x)(walk(v, path + (("item", i),), depth + 1) for i, v in enumerate(x))
        if type(x) is dict:
            return {k: walk(v, path + (("item", k),), depth + 1) for k, v in x.items()}
        if _is_object(x):
            twin = copy.copy(x)
            for k, v in vars(x).items():
                setattr(twin, k, walk(v, path + (("attr", k),), depth + 1))
            return twin
        return x
    skeleton = walk(obj, (), 0)
    return CarriedObject(skeleton, tuple(paths), leaves) if leaves else None


def carried_classes(output: Any) -> set[type]:
    """The classes of the objects in a model's (eager) output that hold tensors and that pytree does not
    know (split would carry them)."""
    found = set()
    for x in pytree.tree_leaves(output):
        if split(x, lambda t: (isinstance(t, torch.Tensor), t)) is not None:
            found.add(type(x))
    return found


def _flatten(obj: Any) -> tuple[list, tuple]:
    c = _split(obj, lambda t: (isinstance(t, torch.Tensor), t))  # (split refuses it: registered now)
    return (list(c.leaves), (c.skeleton, c.paths)) if c is not None else ([], (copy.copy(obj), ()))


def _flatten_with_keys(obj: Any) -> tuple[list, tuple]:
    leaves, context = _flatten(obj)
    return [(pytree.SequenceKey(i), x) for i, x in enumerate(leaves)], context


@contextlib.contextmanager
def as_pytree_nodes(classes: set[type]):
    """While active, `classes` are pytree nodes that flatten into their tensors (torch.export can return
    them); removed after, so nothing outside aiacc's capture sees them. Use `to_carried` on the specs
    made meanwhile."""
    added = []
    for cls in classes:
        if cls in pytree.SUPPORTED_NODES:
            continue

        # the Python pytree only (what torch.export reads), which _deregister_pytree_node undoes exactly;
        # register_pytree_node would also register with optree, for good
        pytree._private_register_pytree_node(cls, _flatten, _unflatten, flatten_with_keys_fn=_flatten_with_keys)
        added.append(cls)
    try:
        yield
    finally:
        for cls in added:
            pytree._deregister_pytree_node(cls)


def to_carried(spec: pytree.TreeSpec, classes: set[type]) -> pytree.TreeSpec:
    """`spec` with the nodes of `classes` (registered by as_pytree_nodes) as CarriedObject nodes."""
    if spec.is_leaf():
        return spec
    children = [to_carried(c, classes) for c in spec.children_specs]
    kind = CarriedObject if spec.type in classes else spec.type
    return pytree.TreeSpec(kind, spec.context, children)
