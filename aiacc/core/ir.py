"""The aiacc IR: values, nodes and graphs.

A `Graph` is a list of `Node`s in topological order (a doubly linked list, so inserting and erasing are
O(1)), graph inputs, graph outputs and initializers (constants held as numpy arrays). Every `Value` is
defined exactly once (by a node output, a graph input or an initializer) and keeps the list of its uses;
the IR maintains those lists itself, so `replace_all_uses_with` and `erase` cost O(uses).

Node semantics come from the op registry (`aiacc.core.ops`): ONNX semantics for the default domain "",
aiacc's fused ops in the domain "aiacc". A node whose (domain, op) the registry does not know is *opaque*:
it is kept with its attributes, and may carry the framework's own payload in `node.meta` (never printed);
importers add one with `Graph.add_opaque`, and undo a translation that gave up halfway with
`Graph.checkpoint()` / `Graph.rollback(token)`.

Outside this module, code uses the public API only (Node.erased, Graph.first_node/last_node,
add_untyped_input, remove_input, has_node_name, ...), never the underscore fields: a test enforces it.

The IR does not import the op registry (the registry imports the IR): `aiacc.core.ops` hands the IR its
schema lookup and shape inference at import with `use_registry` (the `aiacc.core` package imports it).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence, Union

import ml_dtypes  # noqa: F401  (registers bfloat16, float8_*, int4, int2, float4_e2m1fn as numpy dtype names)
import numpy as np

from aiacc.errors import GraphError, ShapeError

Dim = Union[int, str, None]  # a concrete size, a symbol such as "N", or unknown


def _registry_missing(*args: Any) -> Any:
    raise GraphError("the op registry is not loaded: import aiacc.core (or aiacc.core.ops) before building graphs")


# injected by aiacc.core.ops (see use_registry): (op, domain) -> schema | None, and node -> output types
_get_schema: Any = _registry_missing
_infer_node: Any = _registry_missing


def use_registry(get_schema: Any, infer_node: Any) -> None:
    """Give the IR the op registry's schema lookup `get_schema(op, domain)` and shape inference
    `infer_node(node) -> [TensorType | None]` (called once by aiacc.core.ops at import)."""
    global _get_schema, _infer_node
    _get_schema, _infer_node = get_schema, infer_node


@dataclass(frozen=True)
class TensorType:
    """dtype (a numpy dtype name such as "float32") and shape (None when even the rank is unknown)."""

    dtype: str | None
    shape: tuple[Dim, ...] | None

    def __post_init__(self):
        if self.dtype is not None:
            object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        if self.shape is not None:
            dims = tuple(int(d) if isinstance(d, (int, np.integer)) else d for d in self.shape)
            object.__setattr__(self, "shape", dims)

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        """True when every dimension is a concrete integer."""
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def numel(self) -> int | None:
        if not self.is_static:
            return None
        return int(np.prod(self.shape, dtype=np.int64))

    def nbytes(self) -> int | None:
        n = self.numel()
        if n is None or self.dtype is None:
            return None
        return n * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        from aiacc.core.text import format_type

        return format_type(self)


def canonical_dtype(dtype: Any) -> str:
    """The numpy name of a dtype given as a string, numpy dtype or numpy scalar type."""
    try:
        return np.dtype(dtype).name
    except TypeError as e:
        raise GraphError(f"unknown dtype {dtype!r}") from e


def type_of_array(array: np.ndarray) -> TensorType:
    return TensorType(array.dtype.name, tuple(array.shape))


class Value:
    """One SSA value. Defined by exactly one of: a node output, a graph input, an initializer."""

    __slots__ = ("_name", "type", "producer", "index", "uses", "graph", "const", "_seq", "__weakref__")

    def __init__(self, graph: "Graph", name: str, type: TensorType | None = None):
        self.graph = graph
        self._name = name
        self._seq = next(graph._serial)  # creation order, for Graph.rollback
        self.type = type
        self.producer: Node | None = None  # None for graph inputs and initializers
        self.index = 0  # output index in the producer
        self.uses: list[tuple[Node, int]] = []  # (consumer, input index), one entry per use
        self.const: np.ndarray | None = None  # set for initializers

    # -- names and types ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, new: str) -> None:
        self.graph._rename_value(self, new)

    @property
    def dtype(self) -> str | None:
        return None if self.type is None else self.type.dtype

    @property
    def shape(self) -> tuple[Dim, ...] | None:
        return None if self.type is None else self.type.shape

    @property
    def is_constant(self) -> bool:
        return self.const is not None

    @property
    def is_graph_input(self) -> bool:
        return self.producer is None and self.const is None

    @property
    def is_graph_output(self) -> bool:
        return any(o is self for o in self.graph.outputs)

    def users(self) -> list["Node"]:
        """The distinct nodes that read this value, in use order."""
        seen: dict[int, Node] = {}
        for node, _ in self.uses:
            seen.setdefault(id(node), node)
        return list(seen.values())

    def replace_all_uses_with(self, new: "Value") -> None:
        """Make every reader of this value (nodes and graph outputs) read `new` instead."""
        if new is self:
            return
        for node, i in list(self.uses):
            node.set_input(i, new)
        outs = self.graph.outputs
        for i, o in enumerate(outs):
            if o is self:
                outs[i] = new

    def __repr__(self) -> str:
        return f"%{self._name}"


class Node:
    """One operation: op type, domain, inputs (None for an omitted optional input), outputs, attributes."""

    __slots__ = ("op", "domain", "name", "attrs", "_inputs", "outputs", "graph", "meta", "_prev", "_next",
                 "_erased", "_seq", "__weakref__")

    def __init__(self, graph: "Graph", op: str, domain: str, name: str, attrs: dict[str, Any]):
        self.graph = graph
        self.op = op
        self.domain = domain
        self.name = name
        self.attrs = dict(attrs)
        self._inputs: list[Value | None] = []
        self.outputs: list[Value] = []
        self.meta: dict[str, Any] = {}  # framework payloads, provenance; not part of the text form
        self._prev: Node | None = None
        self._next: Node | None = None
        self._erased = False
        self._seq = next(graph._serial)  # creation order, for Graph.rollback

    @property
    def erased(self) -> bool:
        """True once the node has been erased from its graph (a pass holding a stale list checks it)."""
        return self._erased

    @property
    def inputs(self) -> tuple[Value | None, ...]:
        return tuple(self._inputs)

    @property
    def output(self) -> Value:
        """The single output of a one-output node."""
        if len(self.outputs) != 1:
            raise GraphError(f"node {self.name} ({self.qualified_op}) has {len(self.outputs)} outputs, not 1")
        return self.outputs[0]

    @property
    def qualified_op(self) -> str:
        return f"{self.domain}::{self.op}" if self.domain else self.op

    @property
    def schema(self):
        return _get_schema(self.op, self.domain)

    @property
    def is_opaque(self) -> bool:
        return self.schema is None

    def set_input(self, i: int, value: Value | None) -> None:
        old = self._inputs[i]
        if old is value:
            return
        if old is not None:
            _remove_use(old, self, i)
        self._inputs[i] = value
        if value is not None:
            value.uses.append((self, i))

    def replace_input(self, old: Value, new: Value) -> None:
        for i, v in enumerate(self._inputs):
            if v is old:
                self.set_input(i, new)

    def append_input(self, value: Value | None) -> None:
        self._inputs.append(None)
        self.set_input(len(self._inputs) - 1, value)

    def remove_input(self, i: int) -> None:
        """Delete input position i; the inputs after it move one position down."""
        if not -len(self._inputs) <= i < len(self._inputs):
            raise GraphError(f"node {self.name} ({self.qualified_op}) has no input {i}")
        i %= len(self._inputs)
        rest = self._inputs[i + 1:]
        self.truncate_inputs(i)
        for v in rest:
            self.append_input(v)

    def truncate_inputs(self, n: int) -> None:
        """Drop every input from position n on."""
        for i in range(len(self._inputs) - 1, n - 1, -1):
            self.set_input(i, None)
            self._inputs.pop()

    def attr(self, key: str, default: Any = None) -> Any:
        """The attribute's value, else the schema default, else `default`."""
        if key in self.attrs:
            return self.attrs[key]
        schema = self.schema
        if schema is not None and key in schema.attrs and schema.attrs[key].default is not None:
            return schema.attrs[key].default
        return default

    @property
    def next(self) -> "Node | None":
        return None if self._next is self.graph._root else self._next

    @property
    def prev(self) -> "Node | None":
        return None if self._prev is self.graph._root else self._prev

    def __repr__(self) -> str:
        ins = ", ".join("_" if v is None else repr(v) for v in self._inputs)
        outs = ", ".join(repr(v) for v in self.outputs)
        return f"<Node {self.name}: {outs} = {self.qualified_op}({ins})>"


def _remove_use(value: Value, node: Node, index: int) -> None:
    for k, (n, i) in enumerate(value.uses):
        if n is node and i == index:
            del value.uses[k]
            return
    raise GraphError(f"use-def list of %{value.name} lacks ({node.name}, {index})")


@dataclass(frozen=True)
class Checkpoint:
    """A point in a graph's history (from Graph.checkpoint()); rollback returns to it."""

    seq: int
    n_outputs: int


class _Root:
    """Sentinel of the circular node list."""

    __slots__ = ("_prev", "_next")


class Graph:
    """A computation graph: inputs, initializers, nodes in topological order, outputs."""

    def __init__(self, name: str = "main"):
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.initializers: dict[str, Value] = {}
        self.opset_imports: dict[str, int] = {"": 17}
        self.meta: dict[str, Any] = {}
        self.doc: str = ""
        self._values: dict[str, Value] = {}
        self._node_names: set[str] = set()
        self._counter = itertools.count()
        self._serial = itertools.count()  # creation order of values and nodes (checkpoint/rollback)
        self._root = _Root()
        self._root._prev = self._root._next = self._root
        self._len = 0

    # -- names -------------------------------------------------------------------------------------
    def fresh_name(self, base: str = "v") -> str:
        """A value name not used yet in this graph, derived from `base`."""
        if base and base not in self._values:
            return base
        while True:
            name = f"{base or 'v'}_{next(self._counter)}"
            if name not in self._values:
                return name

    def _fresh_node_name(self, base: str) -> str:
        if base and base not in self._node_names:
            return base
        while True:
            name = f"{base}_{next(self._counter)}"
            if name not in self._node_names:
                return name

    def _new_value(self, name: str | None, type: TensorType | None) -> Value:
        name = self.fresh_name(name or "v")
        v = Value(self, name, type)
        self._values[name] = v
        return v

    def _rename_value(self, value: Value, new: str) -> None:
        if new == value._name:
            return
        if new in self._values:
            raise GraphError(f"cannot rename %{value._name} to %{new}: the name is taken")
        del self._values[value._name]
        if value.const is not None:
            del self.initializers[value._name]
            self.initializers[new] = value
        value._name = new
        self._values[new] = value

    def value(self, name: str) -> Value:
        """The value called `name`."""
        try:
            return self._values[name]
        except KeyError:
            raise GraphError(f"graph {self.name} has no value %{name}") from None

    def has_value(self, name: str) -> bool:
        return name in self._values

    def has_node_name(self, name: str) -> bool:
        """True when a node of this graph is called `name`."""
        return name in self._node_names

    def values(self) -> Iterator[Value]:
        return iter(self._values.values())

    # -- building ----------------------------------------------------------------------------------
    def add_input(self, name: str, dtype: Any, shape: Sequence[Dim] | None) -> Value:
        """Append a graph input."""
        v = self._new_value(name, TensorType(dtype, None if shape is None else tuple(shape)))
        if v.name != name:
            raise GraphError(f"graph input name {name!r} is already used")
        self.inputs.append(v)
        return v

    def add_untyped_input(self, name: str) -> Value:
        """Append a graph input whose type is unknown (not even its dtype): `type` is None."""
        v = self._new_value(name, None)
        if v.name != name:
            raise GraphError(f"graph input name {name!r} is already used")
        self.inputs.append(v)
        return v

    def remove_input(self, value: Value) -> None:
        """Remove a graph input nothing reads any more."""
        if not any(v is value for v in self.inputs):
            raise GraphError(f"%{value.name} is not an input of graph {self.name}")
        if value.uses or value.is_graph_output:
            users = ", ".join(n.name for n in value.users()) or "the graph outputs"
            raise GraphError(f"cannot remove graph input %{value.name}: it is still used by {users}")
        self.inputs = [v for v in self.inputs if v is not value]
        del self._values[value.name]

    def add_initializer(self, name: str, array: Any) -> Value:
        """Add a constant held as a numpy array; returns its value (a fresh name if `name` is taken)."""
        array = np.asarray(array)
        v = self._new_value(name, type_of_array(array))
        v.const = array
        self.initializers[v.name] = v
        return v

    def add_node(self, op: str, inputs: Sequence[Value | None] = (), attrs: dict[str, Any] | None = None, *,
                 domain: str = "", name: str | None = None, outputs: int | Sequence[str] = 1,
                 output_types: Sequence[TensorType | None] | None = None, before: Node | None = None,
                 after: Node | None = None, infer: bool = True) -> Node:
        """Create a node and insert it (at the end, or before/after a given node).

        Output types are inferred from the op registry unless given; an opaque node needs `output_types`
        for its outputs to be typed.
        """
        node = Node(self, op, domain, self._fresh_node_name(name or op.lower()), attrs or {})
        self._node_names.add(node.name)
        for v in inputs:
            if v is not None and v.graph is not self:
                raise GraphError(f"node {node.name}: input %{v.name} belongs to another graph")
            node.append_input(v)
        names = [f"{node.name}_out{i}" if outputs > 1 else node.name for i in range(outputs)] \
            if isinstance(outputs, int) else list(outputs)
        for i, out_name in enumerate(names):
            v = self._new_value(out_name, None if output_types is None else output_types[i])
            v.producer, v.index = node, i
            node.outputs.append(v)
        self._link(node, before=before, after=after)
        if infer and output_types is None and node.schema is not None:
            for v, t in zip(node.outputs, _infer_node(node)):
                v.type = t
        return node

    def add_opaque(self, op: str, inputs: Sequence[Value | None] = (), *, domain: str, name: str | None = None,
                   outputs: int | Sequence[str] = 1, output_types: Sequence[TensorType | None] | None = None,
                   attrs: dict[str, Any] | None = None, meta: dict[str, Any] | None = None) -> Node:
        """Add, at the end, an opaque node: an op of a framework's own domain ("torch", "tf", "mxnet",
        "caffe") that the IR keeps as it is. `attrs` are printed and serialized (keep them small and
        plain); `meta` carries the framework's payload (its callable or definition, and the reference
        executor's numpy "kernel"). Output types are never inferred: give `output_types` (None entries
        for unknown ones, None for all unknown)."""
        if not domain or domain == "aiacc":
            raise GraphError(f"opaque node {name or op}: give the framework's own domain, not {domain!r}")
        if _get_schema(op, domain) is not None:
            raise GraphError(f"node {name or op}: {domain}::{op} is an op the IR knows, so it cannot be opaque")
        n_out = outputs if isinstance(outputs, int) else len(outputs)
        if output_types is not None and len(output_types) != n_out:
            raise GraphError(f"opaque node {name or op} ({domain}::{op}): {n_out} outputs but "
                             f"{len(output_types)} output types")
        node = self.add_node(op, inputs, attrs, domain=domain, name=name, outputs=outputs,
                             output_types=output_types, infer=False)
        if meta:
            node.meta.update(meta)
        return node

    def op(self, op: str, *inputs: Value | None, name: str | None = None, domain: str = "",
           before: Node | None = None, after: Node | None = None, **attrs: Any) -> Value:
        """Shorthand for building: add a one-output node and return its output value."""
        return self.add_node(op, inputs, attrs, domain=domain, name=name, before=before, after=after).output

    def add_output(self, value: Value) -> None:
        self.outputs.append(value)

    # -- undo --------------------------------------------------------------------------------------
    def checkpoint(self) -> "Checkpoint":
        """A token for `rollback`: the point to return to. O(1)."""
        return Checkpoint(next(self._serial), len(self.outputs))

    def nodes_since(self, token: "Checkpoint") -> list[Node]:
        """The nodes appended at the end of the graph since `token` (from Graph.checkpoint()), in graph
        order: what an importer's translation of one framework op made (to record where they came from).
        Walks back from the last node only as far as the new ones go, so an import stays linear."""
        out = []
        n = self._root._prev
        while n is not self._root and n._seq > token.seq:
            out.append(n)
            n = n._prev
        return out[::-1]

    def rollback(self, token: "Checkpoint") -> list[Value]:
        """Undo everything added since `token`: the nodes (erased from the last), the initializers and
        graph inputs, and the graph outputs appended. For an importer whose translation of one framework
        op gave up halfway. Returns the initializers and graph inputs removed (so the caller can drop
        its own records of them). Raises GraphError if something older still reads a new value."""
        if not isinstance(token, Checkpoint):
            raise GraphError(f"rollback takes a token from Graph.checkpoint(), not {type(token).__name__}")
        del self.outputs[token.n_outputs:]
        for node in reversed([n for n in self if n._seq > token.seq]):
            self.erase(node)
        removed = [v for v in self._values.values() if v._seq > token.seq]
        for v in removed:
            if v.uses or v.is_graph_output:
                users = ", ".join(n.name for n in v.users()) or "the graph outputs"
                raise GraphError(f"cannot roll back %{v.name}: it is read by {users}, added before the checkpoint")
        for v in removed:
            if v.const is not None:
                self.remove_initializer(v)
            else:
                self.remove_input(v)
        return removed

    # -- order ---------------------------------------------------------------------------------------
    @property
    def first_node(self) -> Node | None:
        """The first node of the schedule (None for an empty graph)."""
        n = self._root._next
        return None if n is self._root else n

    @property
    def last_node(self) -> Node | None:
        """The last node of the schedule (None for an empty graph)."""
        n = self._root._prev
        return None if n is self._root else n

    def _link(self, node: Node, *, before: Node | None = None, after: Node | None = None) -> None:
        if before is not None and after is not None:
            raise GraphError("give either before= or after=, not both")
        if before is not None:
            succ = before
        elif after is not None:
            succ = after._next
        else:
            succ = self._root
        pred = succ._prev
        node._prev, node._next = pred, succ
        pred._next = node
        succ._prev = node
        self._len += 1

    def _unlink(self, node: Node) -> None:
        node._prev._next = node._next
        node._next._prev = node._prev
        node._prev = node._next = None
        self._len -= 1

    def move_before(self, node: Node, anchor: Node) -> None:
        """Move `node` right before `anchor` in the schedule (the caller keeps the order topological)."""
        self._unlink(node)
        self._link(node, before=anchor)

    def move_after(self, node: Node, anchor: Node) -> None:
        self._unlink(node)
        self._link(node, after=anchor)

    def erase(self, node: Node) -> None:
        """Remove a node whose outputs nobody reads; its inputs' use lists are updated."""
        for v in node.outputs:
            if v.uses:
                users = ", ".join(n.name for n in v.users())
                raise GraphError(f"cannot erase node {node.name}: its output %{v.name} is still used by {users}")
            if v.is_graph_output:
                raise GraphError(f"cannot erase node {node.name}: its output %{v.name} is a graph output")
        for i in range(len(node._inputs)):
            node.set_input(i, None)
        self._unlink(node)
        for v in node.outputs:
            del self._values[v.name]
        self._node_names.discard(node.name)
        node._erased = True

    def remove_initializer(self, value: Value) -> None:
        if value.uses or value.is_graph_output:
            raise GraphError(f"cannot remove initializer %{value.name}: it is still used")
        del self.initializers[value.name]
        del self._values[value.name]

    def remove_unused_initializers(self) -> int:
        """Drop initializers nothing reads; returns the bytes freed."""
        freed = 0
        for v in list(self.initializers.values()):
            if not v.uses and not v.is_graph_output:
                freed += v.const.nbytes
                self.remove_initializer(v)
        return freed

    # -- traversal ---------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Node]:
        n = self._root._next
        while n is not self._root:
            nxt = n._next  # read first so the caller may erase n
            yield n
            n = nxt

    @property
    def nodes(self) -> list[Node]:
        return list(self)

    def __len__(self) -> int:
        return self._len

    def find_nodes(self, op: str, domain: str = "") -> list[Node]:
        return [n for n in self if n.op == op and n.domain == domain]

    def op_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        for n in self:
            hist[n.qualified_op] = hist.get(n.qualified_op, 0) + 1
        return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))

    # -- checks ------------------------------------------------------------------------------------
    def verify(self) -> None:
        """Check the invariants: SSA, topological order, consistent use-def lists, known attributes.

        Raises GraphError naming the first node at fault.
        """
        defined: set[int] = set()
        names: set[str] = set()

        def define(v: Value, where: str) -> None:
            if v.graph is not self:
                raise GraphError(f"{where}: %{v.name} belongs to another graph")
            if id(v) in defined:
                raise GraphError(f"{where}: %{v.name} is defined twice")
            if v.name in names:
                raise GraphError(f"{where}: the name %{v.name} is used by two values")
            if self._values.get(v.name) is not v:
                raise GraphError(f"{where}: %{v.name} is not registered in the graph")
            defined.add(id(v))
            names.add(v.name)

        for v in self.inputs:
            if v.producer is not None or v.const is not None:
                raise GraphError(f"graph input %{v.name} is also produced by a node or an initializer")
            define(v, "graph input")
        for name, v in self.initializers.items():
            if v.const is None or v.name != name:
                raise GraphError(f"initializer %{name} has no constant data or a mismatched name")
            define(v, "initializer")
        expected_uses: dict[int, list[tuple[int, int]]] = {}
        later = {id(v) for n in self for v in n.outputs}
        for node in self:
            if node._erased:
                raise GraphError(f"node {node.name} was erased but is still linked")
            if node.graph is not self:
                raise GraphError(f"node {node.name} belongs to another graph")
            for i, v in enumerate(node._inputs):
                if v is None:
                    continue
                if id(v) not in defined:
                    if id(v) in later:
                        raise GraphError(f"node {node.name} ({node.qualified_op}): input {i} %{v.name} is defined "
                                         f"after it (the graph has a cycle or is not in topological order)")
                    raise GraphError(f"node {node.name} ({node.qualified_op}): input {i} %{v.name} is dangling: "
                                     f"no node, graph input or initializer defines it")
                expected_uses.setdefault(id(v), []).append((id(node), i))
            for k, v in enumerate(node.outputs):
                if v.producer is not node or v.index != k:
                    raise GraphError(f"node {node.name}: output %{v.name} does not point back to it")
                define(v, f"node {node.name}")
            schema = node.schema
            if schema is not None:
                schema.check_node(node)
                _check_types(node)
        for v in self.outputs:
            if id(v) not in defined:
                raise GraphError(f"graph output %{v.name} is dangling: nothing defines it")
        for v in self._values.values():
            actual = sorted((id(n), i) for n, i in v.uses)
            if actual != sorted(expected_uses.get(id(v), [])):
                raise GraphError(f"use-def list of %{v.name} is out of date")
        if len(self._values) != len(defined):
            raise GraphError("the graph registers values that nothing defines")

    # -- copies and equality -----------------------------------------------------------------------
    def copy(self) -> "Graph":
        """A deep copy of the structure; constant arrays are shared (they are treated as immutable)."""
        g = Graph(self.name)
        g.opset_imports = dict(self.opset_imports)
        g.meta = dict(self.meta)
        g.doc = self.doc
        vmap: dict[int, Value] = {}
        for v in self.inputs:
            vmap[id(v)] = g.add_input(v.name, v.dtype, v.shape) if v.type else g.add_untyped_input(v.name)
        for name, v in self.initializers.items():
            nv = g.add_initializer(name, v.const)
            vmap[id(v)] = nv
        for n in self:
            nn = Node(g, n.op, n.domain, n.name, n.attrs)
            nn.meta = dict(n.meta)
            g._node_names.add(nn.name)
            for v in n._inputs:
                nn.append_input(None if v is None else vmap[id(v)])
            for v in n.outputs:
                nv = Value(g, v.name, v.type)
                g._values[v.name] = nv
                nv.producer, nv.index = nn, v.index
                nn.outputs.append(nv)
                vmap[id(v)] = nv
            g._link(nn)
        g.outputs = [vmap[id(v)] for v in self.outputs]
        return g

    def equals(self, other: "Graph") -> bool:
        """Structural equality: same text form and bit-identical constants."""
        if str(self) != str(other):
            return False
        for name, v in self.initializers.items():
            o = other.initializers.get(name)
            if o is None or o.const.dtype != v.const.dtype or o.const.shape != v.const.shape \
                    or not np.array_equal(o.const, v.const, equal_nan=True):
                return False
        return True

    def __str__(self) -> str:
        from aiacc.core.text import print_graph

        return print_graph(self)

    def __repr__(self) -> str:
        return f"<Graph {self.name}: {len(self.inputs)} inputs, {len(self)} nodes, {len(self.outputs)} outputs>"

    # -- statistics --------------------------------------------------------------------------------
    def parameter_count(self) -> int:
        return int(sum(v.const.size for v in self.initializers.values()))

    def constant_bytes(self) -> int:
        return int(sum(v.const.nbytes for v in self.initializers.values()))


def _check_types(node: Node) -> None:
    """Re-run shape inference: inputs that no longer fit the op raise (naming the node); recorded output
    types must agree with the inferred ones wherever both are known."""
    for v, t in zip(node.outputs, _infer_node(node)):
        if t is None or v.type is None:
            continue
        if t.dtype and v.type.dtype and t.dtype != v.type.dtype:
            raise ShapeError(f"node {node.name} ({node.qualified_op}): output %{v.name} is recorded as "
                             f"{v.type.dtype} but the op computes {t.dtype}")
        if t.shape is not None and v.type.shape is not None:
            bad = len(t.shape) != len(v.type.shape) or any(
                isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(t.shape, v.type.shape))
            if bad:
                raise ShapeError(f"node {node.name} ({node.qualified_op}): output %{v.name} is recorded as "
                                 f"{v.type} but its inputs give {t}")


def topological_sort(graph: Graph) -> None:
    """Reorder nodes topologically (stable where possible). Raises GraphError naming a node on a cycle."""
    nodes = graph.nodes
    producers = {id(v): n for n in nodes for v in n.outputs}
    state: dict[int, int] = {}  # 1 = visiting, 2 = done
    order: list[Node] = []
    for root in nodes:
        if state.get(id(root)):
            continue
        stack: list[tuple[Node, Iterator]] = [(root, iter(root._inputs))]
        state[id(root)] = 1
        while stack:
            node, it = stack[-1]
            for v in it:
                p = None if v is None else producers.get(id(v))
                if p is None:
                    continue
                s = state.get(id(p))
                if s == 1:
                    raise GraphError(f"node {p.name} ({p.qualified_op}) is on a cycle: it depends on its own output")
                if s is None:
                    state[id(p)] = 1
                    stack.append((p, iter(p._inputs)))
                    break
            else:
                stack.pop()
                state[id(node)] = 2
                order.append(node)
    for n in order:
        graph._unlink(n)
    for n in order:
        graph._link(n)


def const_value(v: Value | None) -> np.ndarray | None:
    """The value's data when it is known without running the graph: an initializer or the output of a
    Constant node holding a tensor."""
    if v is None:
        return None
    if v.const is not None:
        return v.const
    p = v.producer
    if p is not None and p.op == "Constant" and p.domain == "":
        # every form ONNX's Constant has (value, value_float(s), value_int(s)), as the Constant kernel reads them
        for key, dtype in (("value", None), ("value_float", np.float32), ("value_floats", np.float32),
                           ("value_int", np.int64), ("value_ints", np.int64)):
            if p.attrs.get(key) is not None:
                return np.asarray(p.attrs[key], dtype=dtype)
    return None


def iter_values(values: Iterable[Value | None]) -> Iterator[Value]:
    return (v for v in values if v is not None)
