"""IR -> TensorFlow: an (optimized) graph becomes a `tf.Module` whose `__call__` is a `tf.function`.

The IR is NCHW; the TF graph is built NHWC again. Every IR value maps to a TF tensor plus a flag `nhwc`:
when set, the tensor holds the value transposed to channels-last. A Transpose(0,3,1,2) at a graph input
only sets the flag (no TF op), Conv / pools / batch norm run NHWC on flagged tensors, elementwise ops keep
the flag (their constants are permuted once, at export time) and the flag is dropped with a real transpose
only where an op needs the IR layout. So a CNN exports with no Transpose op at all, Conv2D + BiasAdd + Relu
in the shape Grappler's remapper fuses.

One emitter per IR op, registered in the table `emitters` keyed by the node's qualified op (`"Conv"`,
`"aiacc::FusedConv"`; `"tf::*"` rebuilds every opaque TF node) in aiacc.plugins.tf.export_ops, which the
plugin's translator imports. aiacc fused ops without an emitter are decomposed first
(aiacc.core.translate.decompose_fused).

`tf.saved_model.save` works on the result; the reloaded model computes the same outputs.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from aiacc.core.ir import Graph, Node, Value, const_value
from aiacc.core.translate import OpTable, decompose_fused
from aiacc.errors import AiaccError, UnsupportedError, first_line
from aiacc.plugins.tf._tf import tf

TO_NCHW = (0, 3, 1, 2)
TO_NHWC = (0, 2, 3, 1)
NCHW_AXIS_TO_NHWC = {0: 0, 1: 3, 2: 1, 3: 2}

# qualified op -> emitter(emitter, node), which sets the node's outputs (filled by aiacc.plugins.tf.export_ops)
emitters = OpTable("tf export")
# qualified ops whose emitter builds the result only when read (Emitter.defer) and whose consumers may read
# around them, taking the node's own inputs instead (Conv reads a kernel Transpose's input, Reciprocal a
# Sqrt's, Mul(d, d) a Sub's); filled by aiacc.plugins.tf.export_ops next to those emitters
BUILT_WHEN_READ: set[str] = set()


def has_emitter(node: Node) -> bool:
    """True when the TF exporter can build `node` (an opaque TF node always)."""
    return node.qualified_op in emitters or node.domain == "tf"


# ------------------------------------------------------------------------------------------ entry point
def input_specs(graph: Graph) -> list:
    """The tf.TensorSpec of each graph input: the original signature when the graph came from TF (of the data
    inputs only, for a training-mode graph whose other inputs are the variables)."""
    tfm = tf()
    sig = graph.meta.get("tf_signature")
    if sig and len(sig) == graph.meta.get("tf_data_inputs", len(graph.inputs)):
        return [tfm.TensorSpec(shape, tfm.as_dtype(dtype), name=name) for (name, shape, dtype) in sig]
    specs = []
    for v in graph.inputs:
        if v.type is None or v.dtype is None:
            raise UnsupportedError(f"graph input %{v.name} has no type; the TF exporter needs dtype and rank")
        shape = None if v.shape is None else [d if isinstance(d, int) else None for d in v.shape]
        specs.append(tfm.TensorSpec(shape, tfm.as_dtype(v.dtype), name=v.name))
    return specs


def input_signature(graph: Graph) -> list:
    """The input_signature of the exported tf.function: the flat specs, nested as the original's positional
    arguments were (a Keras model taking a dict, a tf.function taking a tuple) where the graph records it.
    The function flattens what it is given with tf.nest.flatten."""
    tfm = tf()
    specs = input_specs(graph)
    structure = graph.meta.get("tf_input_structure")
    if structure is None:
        return specs
    try:
        return [tfm.nest.map_structure(lambda k: specs[k], arg) for arg in structure]
    except (IndexError, TypeError, ValueError):
        return specs


def lowerable_copy(graph: Graph) -> Graph:
    """A copy of `graph` in which fused ops TF has no fused form for are the ops they stand for (the module
    keeps its own graph); an aiacc error naming the first node that has no TensorFlow lowering at all."""
    decomposed, _ = decompose_fused(graph, keep=has_emitter)
    graph = decomposed if decomposed is not graph else graph.copy()
    for node in graph:
        if not has_emitter(node):
            raise UnsupportedError(f"node {node.name} ({node.qualified_op}) has no TensorFlow lowering")
    return graph


def export_graph(graph: Graph, original: Any = None) -> Any:
    """A tf.Module running `graph`; `module(*inputs)` returns the outputs in the original structure. A
    training-mode graph (graph.meta["tf_mode"] == "train") becomes a step on the original's own variables
    (aiacc.plugins.tf.training); `original` is then the model they belong to."""
    if graph.meta.get("tf_mode") == "train":
        from aiacc.plugins.tf.training import export_training

        return export_training(graph, original)
    tfm = tf()
    graph = lowerable_copy(graph)
    specs = input_signature(graph)
    structure = graph.meta.get("tf_output_structure")

    def call(self, *args):
        return pack_outputs(structure, Emitter(graph).run(tfm.nest.flatten(args)))

    cls = type("AiaccTFModule", (tfm.Module,), {
        "__call__": tfm.function(call, input_signature=specs, autograph=False, reduce_retracing=True),
        "__doc__": "A TF model optimized by aiacc: call it like the original.",
    })
    module = cls(name=module_name(graph.name))
    module.aiacc_graph = Untracked(graph)
    try:  # build the TF graph now, so that a lowering problem surfaces here as an aiacc error
        module.__call__.get_concrete_function()
    except AiaccError:
        raise
    except Exception as e:
        raise UnsupportedError(f"graph {graph.name}: TensorFlow refused the exported graph: {first_line(e)}") from e
    return module


class Untracked:
    """Holds a Python object (the IR graph, an onnxruntime runner) on a tf.Module without tf.Module trying
    to track it; attribute access goes to the object."""

    def __init__(self, obj: Any):
        self.__dict__["_obj"] = obj

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_obj"], name)

    def unwrap(self) -> Any:
        return self.__dict__["_obj"]


def module_name(name: str) -> str:
    """A tf.Module name made from a graph name (TF accepts letters, digits and _, starting with a letter)."""
    clean = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "aiacc"
    return clean if clean[0].isalpha() else "m_" + clean


# ------------------------------------------------------------------------------------------ the emitter
class Emitter:
    """Walks the IR in order, building TF ops inside the tf.function being traced."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.env: dict[int, tuple[Any, bool]] = {}
        self._cache: dict[tuple[str, int], Any] = {}
        # value id -> a function making its (tensor, nhwc) entry: pure ops built only when read (a training
        # graph's kernel Transposes, which Conv reads around, and a Sqrt under Reciprocal, emitted as Rsqrt)
        self._lazy: dict[int, Any] = {}

    def run(self, xs: list, identities: bool = True) -> list:
        """The graph's outputs (in the IR layout) from its inputs `xs`, each through a tf.identity unless
        identities=False (a training step, whose outputs are assigned to variables or returned as they are)."""
        tfm = tf()
        for v, x in zip(self.graph.inputs, xs):
            self.env[id(v)] = (x, False)
        for node in self.graph:
            self.emit(node)
        return [tfm.identity(self.std(v)) if identities else self.std(v) for v in self.graph.outputs]

    def emit(self, node: Node) -> None:
        fn = emitters.get(node.qualified_op)
        if fn is None and node.domain == "tf":
            fn = emitters["tf::*"]
        if fn is None:
            raise UnsupportedError(f"node {node.name} ({node.qualified_op}) has no TensorFlow lowering")
        fn(self, node)

    # -- values -------------------------------------------------------------------------------------
    def env_entry(self, v: Value) -> tuple[Any, bool]:
        if id(v) not in self.env:
            make = self._lazy.pop(id(v), None)
            if make is not None:
                self.env[id(v)] = make()
            elif v.const is not None:
                self.env[id(v)] = (tf().constant(v.const), False)
            else:
                raise UnsupportedError(f"value %{v.name} is read before it is defined")
        return self.env[id(v)]

    def set(self, v: Value, tensor: Any, nhwc: bool = False) -> None:
        self.env[id(v)] = (tensor, nhwc)

    def defer(self, v: Value, make: Any) -> None:
        """Build v's entry (make() -> (tensor, nhwc)) when something first reads it, not now: for a pure op
        whose result may never be read in TF (no dead op in the exported graph). A graph output is read
        at the end of run(), so it is always built."""
        self._lazy[id(v)] = make

    def flagged(self, v: Value | None) -> bool:
        return v is not None and v.const is None and self.env_entry(v)[1]

    def std(self, v: Value) -> Any:
        """The tensor in the IR's layout (one transpose per value at most)."""
        t, nhwc = self.env_entry(v)
        if not nhwc:
            return t
        key = ("std", id(v))
        if key not in self._cache:
            self._cache[key] = tf().transpose(t, TO_NCHW)
        return self._cache[key]

    def nhwc(self, v: Value) -> Any:
        """The rank-4 value in NHWC (one transpose per value at most)."""
        if v.const is not None:
            return tf().constant(np.ascontiguousarray(np.transpose(v.const, TO_NHWC)))
        t, nhwc = self.env_entry(v)
        if nhwc:
            return t
        key = ("nhwc", id(v))
        if key not in self._cache:
            self._cache[key] = tf().transpose(t, TO_NHWC)
        return self._cache[key]

    def const(self, v: Value | None) -> np.ndarray | None:
        """The value's data when it is an initializer or a Constant node's output, else None."""
        return const_value(v)

    def rank(self, v: Value) -> int | None:
        return None if v.shape is None else len(v.shape)


def pack_outputs(structure: Any, outs: list) -> Any:
    """The output tensors in the original model's output structure (recorded by the importer as
    graph.meta["tf_output_structure"]) where it fits, else one tensor or a tuple."""
    if structure is not None:
        try:
            return tf().nest.pack_sequence_as(structure, outs)
        except (ValueError, TypeError):
            pass
    return outs[0] if len(outs) == 1 else tuple(outs)


def const_to_nhwc(c: np.ndarray) -> np.ndarray | None:
    """A constant that broadcasts against an NCHW rank-4 value, rewritten for the NHWC tensor."""
    if c.ndim == 0:
        return c
    if c.ndim > 4:
        return None
    c4 = c.reshape((1,) * (4 - c.ndim) + c.shape).transpose(TO_NHWC)
    while c4.ndim > 1 and c4.shape[0] == 1:
        c4 = c4[0]
    return np.ascontiguousarray(c4)

