"""The batch guard of an optimized TF module specialized to its example's batch size.

Every TF module aiacc exports (natively, for onnxruntime, for aiacc's runtime) is an instance of a class of
its own whose `__call__` is a tf.function. A module that does not compute the original's outputs at another
batch size gets a Python-level check in front of that tf.function: calling it with another batch size is an
aiacc ShapeError naming the input, never a wrong answer or TF's binding error. The tf.function stays what
`module.__call__` forwards to (input_signature, get_concrete_function, ...) and what tf.saved_model.save
writes as `__call__` (a reloaded SavedModel keeps the signature's own shapes, which TF enforces).
"""
from __future__ import annotations

from typing import Any

from aiacc.errors import UnsupportedError
from aiacc.plugins.base import BatchGuard
from aiacc.plugins.tf._tf import tf


class GuardedCall:
    """The class attribute `__call__` of a guarded module: binds like the tf.function it wraps and checks the
    inputs' first dimension (a BatchGuard) before calling it."""

    def __init__(self, function: Any, guard: BatchGuard):
        self.function, self.guard = function, guard

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        bound = self.function.__get__(instance, owner)
        return bound if instance is None else GuardedBound(bound, self.guard)


class GuardedBound:
    """`module.__call__` of a guarded module: the check, then the bound tf.function; every other attribute
    is the tf.function's."""

    def __init__(self, bound: Any, guard: BatchGuard):
        self.__dict__.update(bound=bound, guard=guard)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.guard.check(tf().nest.flatten((args, kwargs)))
        return self.bound(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["bound"], name)


def _trackable_children(self, save_type="checkpoint", **kwargs):
    """tf.Module's SavedModel children plus `__call__` (TF lists only attributes that are tf.functions)."""
    children = super(type(self), self)._trackable_children(save_type, **kwargs)
    if str(getattr(save_type, "value", save_type)) == "savedmodel":
        fn = type(self).__dict__["__call__"].function.__get__(self, type(self))
        fn._list_all_concrete_functions_for_serialization()  # as TF does for the functions it finds
        children["__call__"] = fn
    return children


def guard_module(module: Any, batch: int, why: str) -> bool:
    """Put a BatchGuard in front of an aiacc-exported TF module's `__call__`; False for any other object."""
    cls = type(module)
    function = cls.__dict__.get("__call__")
    if isinstance(function, GuardedCall):
        return True
    if function is None or not hasattr(function, "get_concrete_function") or not hasattr(module, "aiacc_graph"):
        return False
    try:
        names = [getattr(s, "name", None) or f"input {i}"
                 for i, s in enumerate(tf().nest.flatten(function.input_signature or []))]
    except (TypeError, ValueError):
        names = []
    if not names:
        raise UnsupportedError(f"{cls.__name__}: its __call__ has no input signature to guard")
    cls.__call__ = GuardedCall(function, BatchGuard(batch, why, names, model=cls.__name__))
    cls._trackable_children = _trackable_children
    return True
