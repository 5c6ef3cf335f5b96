"""What an opaque torch node carries: the original callable, how to call it, and a numpy kernel so the
reference executor (and the per-pass numerics checks) can still run a graph that contains it."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils import _pytree as pytree


class MethodCall:
    """A picklable `Tensor.<name>(*args)` call (the callable of an opaque call_method node)."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(obj, self.name)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tensor.{self.name}"


def call_opaque(fn: Callable, in_spec, template: Sequence[Any], tensors: Sequence[Any]) -> Any:
    """Call `fn` with the original argument structure, tensors filled into the template's holes."""
    it = iter(tensors)
    leaves = [next(it) if t is None else t for t in template]
    args, kwargs = pytree.tree_unflatten(leaves, in_spec)
    return fn(*args, **kwargs)


def flatten_outputs(result: Any, tensor_pos: Sequence[int]) -> list:
    leaves = pytree.tree_leaves(result)
    return [leaves[i] for i in tensor_pos]


def make_kernel(fn: Callable, in_spec, template: Sequence[Any], tensor_pos: Sequence[int]):
    """A numpy-in, numpy-out kernel that runs the torch callable (for the reference executor)."""

    def kernel(*arrays: np.ndarray) -> list[np.ndarray]:
        tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
        with torch.no_grad():
            result = call_opaque(fn, in_spec, template, tensors)
        return [t.detach().cpu().numpy() for t in flatten_outputs(result, tensor_pos)]

    return kernel


class CallableModule(torch.nn.Module):
    """An opaque function call held as a submodule of the exported module: fx's code generator cannot
    name every callable (a custom autograd Function's `apply`, a function from a user script), but it
    can always call a submodule, and torch.save pickles it by reference."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def extra_repr(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))
