"""The op registry: one `OpSchema` per (domain, op) with its attributes, shape/dtype inference and a numpy
reference kernel.

Ops are registered with the `op` decorator on their kernel:

    @op("Relu", infer=same_as_input)
    def relu(x):
        return np.maximum(x, 0)

A kernel takes the node's inputs positionally (None for an omitted optional input) and its attributes as
keyword arguments (defaults filled in from the schema) and returns an array or a tuple of arrays.
An inference function takes an `InferContext` and returns one `TensorType` per output.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from aiacc.core import ir as _ir
from aiacc.core.ir import Node, TensorType, Value, const_value, type_of_array
from aiacc.errors import AttributeError_, AiaccError, GraphError, ShapeError

REQUIRED = object()  # default of an attribute that must be given

_KINDS = ("int", "float", "string", "ints", "floats", "strings", "tensor")


@dataclass(frozen=True)
class Attr:
    """Schema of one attribute: its kind (one of int, float, string, ints, floats, strings, tensor) and default."""

    kind: str
    default: Any = None  # None: optional without default; REQUIRED: must be given

    def check(self, node: Node, name: str, value: Any) -> None:
        ok = {
            "int": lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool),
            "float": lambda v: isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool),
            "string": lambda v: isinstance(v, str),
            "ints": lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, (int, np.integer)) for x in v),
            "floats": lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, (int, float, np.number))
                                                                     for x in v),
            "strings": lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v),
            "tensor": lambda v: isinstance(v, np.ndarray),
        }[self.kind]
        if not ok(value):
            raise AttributeError_(f"node {node.name} ({node.qualified_op}): attribute {name}={value!r} "
                                  f"is not of kind {self.kind}")


@dataclass
class OpSchema:
    """Everything aiacc knows about one op."""

    op: str
    domain: str
    kernel: Callable[..., Any]
    infer: Callable[["InferContext"], list[TensorType]]
    attrs: dict[str, Attr] = field(default_factory=dict)
    inputs: tuple[int, int] = (1, 1)  # min, max number of inputs (max -1: variadic)
    outputs: tuple[int, int] = (1, 1)
    elementwise: bool = False  # output element i depends only on input elements i (after broadcasting)
    doc: str = ""
    # optional replacement of the plain kernel call for ops whose kernel needs the node itself
    # (e.g. Split without sizes needs the number of outputs): f(schema, node, arrays) -> list of arrays
    node_runner: Callable[["OpSchema", Node, Sequence[np.ndarray | None]], list[np.ndarray]] | None = None
    # running it matters beyond its outputs (a run-time check): no pass may erase, merge or fold it
    side_effects: bool = False

    @property
    def qualified_op(self) -> str:
        return f"{self.domain}::{self.op}" if self.domain else self.op

    def resolved_attrs(self, node: Node) -> dict[str, Any]:
        """The node's attributes with schema defaults filled in (None for optional attributes left out)."""
        out = {}
        for name, spec in self.attrs.items():
            if name in node.attrs:
                out[name] = node.attrs[name]
            elif spec.default is REQUIRED:
                raise AttributeError_(f"node {node.name} ({node.qualified_op}): required attribute {name} is missing")
            else:
                out[name] = spec.default
        return out

    def check_node(self, node: Node) -> None:
        """Attributes known and well-typed, input and output counts in range."""
        for name, value in node.attrs.items():
            spec = self.attrs.get(name)
            if spec is None:
                known = ", ".join(sorted(self.attrs)) or "none"
                raise AttributeError_(f"node {node.name} ({node.qualified_op}): unknown attribute {name!r} "
                                      f"(known: {known})")
            spec.check(node, name, value)
        self.resolved_attrs(node)
        lo, hi = self.inputs
        n = len(node.inputs)
        while n and node.inputs[n - 1] is None:
            n -= 1
        if n < lo or (hi >= 0 and n > hi):
            raise GraphError(f"node {node.name} ({node.qualified_op}): takes {lo}..{'*' if hi < 0 else hi} "
                             f"inputs, got {n}")
        for i in range(lo):
            if node.inputs[i] is None:
                raise GraphError(f"node {node.name} ({node.qualified_op}): required input {i} is missing")
        lo, hi = self.outputs
        if len(node.outputs) < lo or (hi >= 0 and len(node.outputs) > hi):
            raise GraphError(f"node {node.name} ({node.qualified_op}): has {len(node.outputs)} outputs, "
                             f"expected {lo}..{'*' if hi < 0 else hi}")

    def run(self, node: Node, arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Run the reference kernel for `node` on numpy inputs; always returns a list."""
        if self.node_runner is not None:
            return self.node_runner(self, node, arrays)
        result = self.kernel(*arrays, **self.resolved_attrs(node))
        if isinstance(result, (tuple, list)):
            return [np.asarray(r) for r in result]
        return [np.asarray(result)]


class InferContext:
    """What an inference function may look at: input types, constant inputs and resolved attributes."""

    def __init__(self, node: Node, schema: OpSchema):
        self.node = node
        self.schema = schema
        self.attrs = schema.resolved_attrs(node)

    @property
    def num_inputs(self) -> int:
        return len(self.node.inputs)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.inputs) and self.node.inputs[i] is not None

    def type(self, i: int) -> TensorType | None:
        v = self.node.inputs[i] if i < len(self.node.inputs) else None
        return None if v is None else v.type

    def shape(self, i: int):
        t = self.type(i)
        return None if t is None else t.shape

    def dtype(self, i: int) -> str | None:
        t = self.type(i)
        return None if t is None else t.dtype

    def const(self, i: int) -> np.ndarray | None:
        """The input's value when it is known at build time: an initializer, a Constant node's output, or
        a small tensor computed from shapes and constants (`known_value`: Shape -> Gather -> Concat ...)."""
        return known_value(self.node.inputs[i] if i < len(self.node.inputs) else None)

    def fail(self, message: str) -> ShapeError:
        """An error naming the node, its op and its input shapes."""
        shapes = ", ".join("_" if v is None else f"%{v.name}: {v.type}" for v in self.node.inputs)
        return ShapeError(f"node {self.node.name} ({self.node.qualified_op}): {message} (inputs: {shapes})")


_REGISTRY: dict[tuple[str, str], OpSchema] = {}


def op(name: str, *, domain: str = "", attrs: dict[str, Attr | tuple] | None = None,
       inputs: tuple[int, int] | int = 1, outputs: tuple[int, int] | int = 1,
       infer: Callable[[InferContext], list[TensorType]] | None = None, elementwise: bool = False,
       side_effects: bool = False):
    """Decorator registering a reference kernel as op `name` in `domain` (`side_effects`: see OpSchema)."""

    def wrap(kernel):
        spec = {k: (v if isinstance(v, Attr) else Attr(*v)) for k, v in (attrs or {}).items()}
        for k, a in spec.items():
            if a.kind not in _KINDS:
                raise ValueError(f"op {name}: attribute {k} has unknown kind {a.kind}")
        schema = OpSchema(
            op=name, domain=domain, kernel=kernel, infer=infer or infer_by_running, attrs=spec,
            inputs=(inputs, inputs) if isinstance(inputs, int) else inputs,
            outputs=(outputs, outputs) if isinstance(outputs, int) else outputs,
            elementwise=elementwise, doc=(kernel.__doc__ or "").strip(), side_effects=side_effects)
        _REGISTRY[(domain, name)] = schema
        return kernel

    return wrap


def get_schema(op_type: str, domain: str = "") -> OpSchema | None:
    """The schema of (domain, op_type), or None when the op is unknown (an opaque node)."""
    if domain == "ai.onnx":
        domain = ""
    return _REGISTRY.get((domain, op_type))


def has_side_effects(node: Node) -> bool:
    """Whether running `node` matters beyond its outputs, so passes must keep it even when nothing reads
    them: its op's schema says so (a value guard), or `node.meta["side_effects"]` (not serialized) does."""
    schema = node.schema
    return bool(node.meta.get("side_effects")) or (schema is not None and schema.side_effects)


def all_schemas() -> list[OpSchema]:
    return list(_REGISTRY.values())


def infer_node(node: Node) -> list[TensorType | None]:
    """Output types of a node whose op is registered. Unknown input types give unknown outputs."""
    schema = node.schema
    if schema is None:
        return [None] * len(node.outputs)
    schema.check_node(node)
    ctx = InferContext(node, schema)
    try:
        types = schema.infer(ctx)
    except AiaccError:
        raise
    except Exception as e:  # an inference bug or a shape the rule did not foresee
        raise ctx.fail(f"shape inference failed: {e}") from e
    types = list(types)
    if len(types) < len(node.outputs):
        types += [None] * (len(node.outputs) - len(types))
    types = types[:len(node.outputs)]
    for k, value in enumerate(_propagate(node, schema, ctx)):
        if value is not None and (types[k] is None or not types[k].is_static):
            types[k] = type_of_array(value)  # e.g. a Slice of a known shape vector: its length is known too
    return types


# ------------------------------------------------------------------------------------------------
# value propagation (ONNX's data propagation): the values of small integer shape computations
# ------------------------------------------------------------------------------------------------
#: the most elements a propagated value may have (shape vectors, indices, scalars; not activations)
PROPAGATE_ELEMENTS = 1024

#: ops whose output is not a function of their inputs' values, never evaluated at build time
_NOT_PROPAGATED = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                             "Multinomial", "Bernoulli", "Dropout"})

# node output -> its value, computed when the node's type was inferred (a weak key: a value erased
# from its graph drops its entry)
_PROPAGATED: "weakref.WeakKeyDictionary[Value, np.ndarray]" = weakref.WeakKeyDictionary()


def known_value(v: Value | None) -> np.ndarray | None:
    """The value's data when it is known without running the graph: a constant (`const_value`), or the
    result of a shape computation that type inference evaluated (the shape of a tensor of static shape, and
    every standard op on such values: Gather, Concat, Slice, Unsqueeze, Squeeze, Cast, integer arithmetic,
    ConstantOfShape, Range, ...). None when unknown, or when the stored value no longer matches the
    value's type (the graph changed since)."""
    c = const_value(v)
    if c is not None or v is None:
        return c
    a = _PROPAGATED.get(v)
    if a is None:
        return None
    t = v.type
    if t is not None and t.is_static and (t.dtype != a.dtype.name or tuple(t.shape) != a.shape):
        return None
    return a


def _propagate(node: Node, schema: OpSchema, ctx: InferContext) -> list[np.ndarray | None]:
    """The values of `node`'s outputs when they follow from known input values (and record them for the
    nodes downstream); Nones otherwise. Shape reads only its input's static dimensions."""
    for v in node.outputs:
        _PROPAGATED.pop(v, None)
    none = [None] * len(node.outputs)
    if schema.domain != "" or node.op in _NOT_PROPAGATED or node.op == "Constant":
        return none
    if node.op == "Shape":
        shape = ctx.shape(0)
        if shape is None:
            return none
        dims = shape[slice(ctx.attrs["start"], ctx.attrs["end"])]
        if not all(isinstance(d, int) for d in dims):
            return none
        outs = [np.asarray(dims, dtype=np.int64)]
    else:
        arrays = []
        for i in range(ctx.num_inputs):
            if not ctx.has_input(i):
                arrays.append(None)
                continue
            a = ctx.const(i)
            if a is None or a.size > PROPAGATE_ELEMENTS:
                return none
            arrays.append(a)
        if not any(a is not None for a in arrays):
            return none
        try:
            with np.errstate(all="ignore"):
                outs = schema.run(node, arrays)
        except Exception:  # noqa: BLE001  (the type inference above reports real errors; no value then)
            return none
    result = []
    for v, a in zip(node.outputs, outs):
        a = np.asarray(a)
        if a.size <= PROPAGATE_ELEMENTS:
            _PROPAGATED[v] = a
            result.append(a)
        else:
            result.append(None)
    return result + none[len(result):]


def infer_by_running(ctx: InferContext) -> list[TensorType | None]:
    """Fallback inference: run the kernel on constants or zeros when every input shape is concrete."""
    arrays = []
    for i in range(ctx.num_inputs):
        if not ctx.has_input(i):
            arrays.append(None)
            continue
        c = ctx.const(i)
        if c is not None:
            arrays.append(c)
            continue
        t = ctx.type(i)
        if t is None or t.dtype is None or not t.is_static:
            return [None] * len(ctx.node.outputs)
        arrays.append(np.zeros(t.shape, dtype=t.dtype))
    with np.errstate(all="ignore"):
        try:
            outs = ctx.schema.run(ctx.node, arrays)
        except AiaccError:
            raise
        except Exception as e:
            raise ctx.fail(str(e)) from e
    return [type_of_array(o) for o in outs]


# the IR asks the registry for schemas and shape inference through these (it does not import the registry)
_ir.use_registry(get_schema, infer_node)
