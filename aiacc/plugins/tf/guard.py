"""The shape guard of an optimized TF module: every dimension aiacc specialized (shape_guard.ShapeSpec).

Every TF module aiacc exports (natively, for onnxruntime, for aiacc's runtime) is an instance of a class of
its own whose `__call__` is a tf.function. A Python-level check in front of that tf.function makes a call at
shapes the module was not built for an aiacc ShapeError naming the input, the dimension and the size, never
TF's binding error or a wrong answer. A dimension the signature leaves None and the IR kept symbolic stays
free, as in the original; dimension 0 is fixed where verify's second-batch check found the module specialized
to the example's batch. The tf.function stays what `module.__call__` forwards to (input_signature,
get_concrete_function, ...) and what tf.saved_model.save writes as `__call__`: a reloaded SavedModel enforces
the signature's own shapes, and the dimensions only the guard fixes are fixed in the saved signature too.
"""
from __future__ import annotations

from typing import Any

from aiacc.errors import UnsupportedError
from aiacc.plugins.shape_guard import ShapeCheck, ShapeSpec, graph_spec, other_shapes_why, unique_names
from aiacc.plugins.tf._tf import tf


class GuardedCall:
    """The class attribute `__call__` of a guarded module: binds like the tf.function it wraps and checks the
    inputs' shapes (a ShapeCheck) before calling it."""

    def __init__(self, function: Any, guard: ShapeCheck):
        self.function, self.guard = function, guard

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        bound = self.function.__get__(instance, owner)
        return bound if instance is None else GuardedBound(bound, self.guard)


class GuardedBound:
    """`module.__call__` of a guarded module: the check, then the bound tf.function; every other attribute
    is the tf.function's."""

    def __init__(self, bound: Any, guard: ShapeCheck):
        self.__dict__.update(bound=bound, guard=guard)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.guard.check(tf().nest.flatten((args, kwargs)))
        return self.bound(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["bound"], name)


def _trackable_children(self, save_type="checkpoint", **kwargs):
    """tf.Module's SavedModel children plus `__call__` (TF lists only attributes that are tf.functions): the
    wrapped tf.function, or one on the same code whose signature also fixes what only the guard fixes."""
    children = super(type(self), self)._trackable_children(save_type, **kwargs)
    if str(getattr(save_type, "value", save_type)) == "savedmodel":
        guarded = type(self).__dict__["__call__"]
        function = guarded.function
        tight = _tightened(function.input_signature, guarded.guard)
        if tight is not None:
            function = tf().function(function.python_function, input_signature=tight, autograph=False)
        fn = function.__get__(self, type(self))
        fn._list_all_concrete_functions_for_serialization()  # as TF does for the functions it finds
        children["__call__"] = fn
    return children


def _tightened(signature: Any, guard: ShapeCheck) -> list | None:
    """`signature` with each None dimension the guard fixes set to its size, or None when there is none."""
    tfm = tf()
    flat = tfm.nest.flatten(signature)
    changed = False
    specs = []
    for spec, name in zip(flat, guard.names):
        want = guard.spec.shapes.get(name)
        dims = spec.shape.as_list() if spec.shape.rank is not None else None
        if want is not None and dims is not None and len(dims) == len(want):
            new = [w if d is None and w is not None else d for d, w in zip(dims, want)]
            if new != dims:
                changed = True
                spec = tfm.TensorSpec(new, spec.dtype, name=spec.name)
        specs.append(spec)
    return tfm.nest.pack_sequence_as(signature, specs) if changed else None


def guardable(module: Any) -> bool:
    """True for an aiacc-exported TF module for inference (a tf.function `__call__` with an input signature,
    the optimized graph as `aiacc_graph`)."""
    function = type(module).__dict__.get("__call__")
    if isinstance(function, GuardedCall):
        return True
    graph = getattr(module, "aiacc_graph", None)
    return (function is not None and hasattr(function, "get_concrete_function") and graph is not None
            and graph.meta.get("tf_mode") != "train")


def guard_module(module: Any, original: Any, found: dict | None) -> ShapeSpec | None:
    """Put the shape guard in front of an aiacc-exported TF module's `__call__` (built from its graph's input
    shapes and what verify `found`, shape_guard.graph_spec): its ShapeSpec; None for any other object."""
    if not guardable(module):
        return None
    cls = type(module)
    function = cls.__dict__["__call__"]
    if isinstance(function, GuardedCall):
        function = function.function
    try:
        flat = tf().nest.flatten(function.input_signature or [])
    except (TypeError, ValueError):
        flat = []
    if not flat:
        raise UnsupportedError(f"{cls.__name__}: its __call__ has no input signature to guard")
    graph = module.aiacc_graph
    names = unique_names([getattr(s, "name", None) for s in flat])
    shapes = [v.shape for v in graph.inputs] if len(graph.inputs) == len(flat) else \
        [None if s.shape.rank is None else s.shape.as_list() for s in flat]
    spec = graph_spec(shapes, names, found)
    model = type(original).__name__ if original is not None else cls.__name__  # as torch's guard names it
    cls.__call__ = GuardedCall(function, ShapeCheck(spec, names, model, other_shapes_why("TF")))
    cls._trackable_children = _trackable_children
    return spec
