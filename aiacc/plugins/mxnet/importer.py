"""MXNet symbol JSON -> aiacc IR (ONNX semantics, NCHW): the walker and the converters' table.

One converter per MXNet op, registered in the table `converters` (`@converters.register("OpName", ...)`,
in aiacc.plugins.mxnet.import_ops, which the plugin's translator imports). A converter receives a `Ctx` (the
MXNet node, its IR input values, helpers to add IR nodes and constants) and returns the IR values of the
node's visible outputs, or None (or raises Untranslatable) to leave the node opaque: an op aiacc does not
know, or an attribute combination it does not translate, becomes a node in the domain "mxnet" carrying the
original JSON node (op, name, attributes), so the exporter writes it back unchanged, and an MXNet kernel so
the reference executor can still run it. Its output types come from MXNet's own inference on the whole
symbol (see aiacc.plugins.mxnet.opaque), so ops with several outputs or states (RNN) and shapes MXNet
infers backwards (the `_zeros(shape=(1, 0, H))` begin states of Gluon RNN layers) are typed.

The import never stops on a construct it does not understand: a converter that gives up part-way has its
nodes rolled back (Graph.checkpoint/rollback) and the node stays opaque; one that rejects an attribute or
shape MXNet itself accepts leaves the node opaque with a warning (if MXNet rejects it too, the aiacc error
naming the node stands). Converters whose IR the exporter can lower only with static shapes keep the node
opaque without them.

Inference semantics: BatchNorm uses its moving statistics, Dropout is the identity, loss heads
(SoftmaxOutput, MakeLoss, regression outputs) compute their forward.
"""
from __future__ import annotations

import inspect
from typing import Any, Mapping

import numpy as np

from aiacc.core.ir import Graph, TensorType, Value
from aiacc.core.translate import OpTable, Untranslatable, record_source
from aiacc.errors import AiaccError, ShapeError, UnsupportedError, fallback
from aiacc.plugins.mxnet.symjson import MxNode, MxSymbol, attr_bool, attr_float, attr_int, attr_str, attr_tuple

OPAQUE_DOMAIN = "mxnet"

# MXNet's SELU constants (double precision), shared by the Selu converter and the Selu lowering
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_GAMMA = 1.0507009873554804934193349852946

# MXNet op name -> converter(ctx) -> IR values | None (filled by aiacc.plugins.mxnet.import_ops)
converters = OpTable("mxnet import")


def supported_ops() -> list[str]:
    """The MXNet ops the importer translates (others stay opaque)."""
    return sorted(converters)


class InvalidValue(ShapeError):
    """An attribute value no MXNet node can run with (num_filter=-1): an error, never an opaque node (MXNet
    loads such a node and fails later, deep inside its shape inference)."""


class Ctx:
    """What a converter works with: the MXNet node, its IR inputs and helpers to build IR."""

    def __init__(self, graph: Graph, node: MxNode, inputs: list[Value]):
        self.g = graph
        self.node = node
        self.inputs = inputs
        # mode="train": BatchNorm on batch statistics, Dropout kept (MXNet decides at run time, by autograd)
        self.training = graph.meta.get("mxnet.mode") == "train"

    # attribute shorthands
    def int(self, key, default=None):
        return attr_int(self.node, key, default)

    def float(self, key, default=None):
        return attr_float(self.node, key, default)

    def bool(self, key, default):
        return attr_bool(self.node, key, default)

    def tuple(self, key, default=None, allow_none=False):
        return attr_tuple(self.node, key, default, allow_none)

    def str(self, key, default=None):
        return attr_str(self.node, key, default)

    def shape(self, i: int):
        return self.inputs[i].shape

    def static(self, i: int) -> tuple[int, ...] | None:
        """The i-th input's shape when every dimension is a known integer, else None. Converters whose IR
        the exporter can only lower with static shapes (Slice, Where, Pad, Resize) keep the node opaque
        without one, so a graph downstream of a data-dependent shape still exports."""
        s = self.inputs[i].shape
        if s is None or not all(isinstance(d, (int, np.integer)) for d in s):
            return None
        return tuple(int(d) for d in s)

    def count(self, key: str, weight: int, axis: int, times: int = 1) -> None:
        """Check the count attribute `key` (num_filter, num_hidden): a positive integer that agrees with
        dimension `axis` of input `weight` (times `times`) where that shape is known; a ShapeError naming
        the node otherwise. MXNet itself fails later on such a file, deep inside shape inference."""
        n = self.int(key, None)
        if n is None:
            return
        s = self.inputs[weight].shape if weight < len(self.inputs) else None
        has = s[axis] * times if s is not None and len(s) > axis and isinstance(s[axis], int) else None
        if n < 1:
            raise InvalidValue(f"{self.node.describe()}: {key}={n} must be a positive count"
                             + (f" (its weight {self.inputs[weight].name!r} has {has})" if has else ""))
        if has is not None and has != n:
            raise InvalidValue(f"{self.node.describe()}: {key}={n}, but its weight {self.inputs[weight].name!r} "
                               f"has shape {list(s)} ({has})")

    def kernel_matches(self, kernel: list, weight: int = 1) -> None:
        """The weight's spatial dimensions must be `kernel` where the weight's shape is known (a parameter
        of the wrong shape): an InvalidValue naming the parameter and the node otherwise."""
        s = self.inputs[weight].shape if weight < len(self.inputs) else None
        if s is None or len(s) != len(kernel) + 2 or not all(isinstance(d, int) for d in s):
            return
        if list(s[2:]) != [int(k) for k in kernel]:
            raise InvalidValue(f"{self.node.describe()}: parameter {self.inputs[weight].name!r} has shape "
                               f"{list(s)}, but kernel={tuple(kernel)} needs spatial dimensions {list(kernel)}")

    def rank(self, i: int) -> int | None:
        s = self.inputs[i].shape
        return None if s is None else len(s)

    def dtype(self, i: int = 0) -> str:
        return self.inputs[i].dtype or "float32"

    def const(self, i: int) -> np.ndarray | None:
        v = self.inputs[i]
        return v.const

    def need_inputs(self, lo: int, hi: int | None = None) -> None:
        hi = lo if hi is None else hi
        if not lo <= len(self.inputs) <= hi:
            raise AiaccError(f"{self.node.describe()}: takes {lo}..{hi} inputs, the file gives {len(self.inputs)}")

    def constant(self, suffix: str, array: Any, dtype: str | None = None) -> Value:
        """A new initializer named after the node."""
        arr = np.asarray(array, dtype=dtype)
        return self.g.add_initializer(self.g.fresh_name(f"{self.node.name}_{suffix}"), arr)

    def scalar(self, value: float, like: int = 0) -> Value:
        return self.constant("scalar", np.asarray(value, dtype=self.dtype(like)))

    def ints(self, suffix: str, values) -> Value:
        return self.constant(suffix, np.asarray(list(values), dtype=np.int64))

    def op(self, op: str, *inputs: Value | None, outputs: int = 1, **attrs) -> Any:
        """Add an IR node named after the MXNet node; one output value, or a list when outputs > 1."""
        node = self.g.add_node(op, inputs, {k: v for k, v in attrs.items() if v is not None},
                               name=self.node.name, outputs=outputs if outputs > 1 else [self.node.name])
        return node.outputs if outputs > 1 else node.output


# -- the importer -----------------------------------------------------------------------------------

def import_symbol(sym: MxSymbol, params: Mapping[str, np.ndarray], input_types: Mapping[str, TensorType],
                  name: str = "mxnet", opaque_backend: Any = None, training: bool = False) -> Graph:
    """Translate a parsed symbol into an IR graph.

    params: every argument and auxiliary parameter by name (numpy arrays); input_types: the model inputs
    (the variables that are not parameters). opaque_backend: an object with `infer(mxnode, input_types)`
    and `kernel(mxnode)` used for opaque nodes (the MXNet runtime; see aiacc.plugins.mxnet.mxrun).
    A variable that is neither a parameter nor an input is a missing parameter: UnsupportedError names it.
    training: training semantics (graph.meta["mxnet.mode"] = "train"); the caller passes the parameters as
    inputs then, so they stay variables.
    """
    g = Graph(name)
    if training:
        g.meta["mxnet.mode"] = "train"
    env: dict[tuple[int, int], Value] = {}
    consumers: dict[int, list[MxNode]] = {}
    for n in sym.nodes:
        for i, _ in n.inputs:
            consumers.setdefault(i, []).append(n)
    used = {i for n in sym.nodes for i, _ in n.inputs} | {i for i, _ in sym.heads}
    for n in sym.nodes:
        if not n.is_variable:
            continue
        if n.index not in used:
            continue
        if g.has_value(n.name) and (n.name in params or n.name in input_types):
            env[(n.index, 0)] = g.value(n.name)  # several variable nodes of one name are one variable
        elif n.name in params:
            env[(n.index, 0)] = g.add_initializer(n.name, np.asarray(params[n.name]))
        elif n.name in input_types:
            t = input_types[n.name]
            env[(n.index, 0)] = g.add_input(n.name, t.dtype, t.shape)
        else:
            users = ", ".join(c.describe() for c in consumers.get(n.index, [])) or "a graph output"
            raise UnsupportedError(f"variable {n.name!r} (read by {users}) has no value in the parameters and is "
                                   f"not a model input: a parameter is missing (model inputs: "
                                   f"{', '.join(input_types) or 'none'})")
    # keep graph inputs in the order the caller gave them
    order = {k: i for i, k in enumerate(input_types)}
    g.inputs.sort(key=lambda v: order.get(v.name, len(order)))
    for n in sym.nodes:
        if n.is_variable:
            continue
        ins = []
        for i, k in n.inputs:
            if (i, k) not in env:
                src = sym.nodes[i]
                raise AiaccError(f"{n.describe()}: input {src.name!r} output {k} does not exist "
                                 f"({src.describe()} has fewer outputs)")
            ins.append(env[(i, k)])
        outs = None
        fn = converters.get(n.op)
        start = g.checkpoint()  # for the view: the nodes made from this symbol node record its name
        if fn is not None:
            mark = g.checkpoint()
            try:
                outs = fn(Ctx(g, n, ins))
            except Untranslatable:
                g.rollback(mark)
                outs = None
            except AiaccError as e:
                # an attribute or shape our converter rejects: if MXNet accepts the node, aiacc's reading
                # was too strict and the node stays opaque; if MXNet rejects it too, our error names it
                err = e if n.name in str(e) else type(e)(f"{n.describe()}: {e}")
                g.rollback(mark)
                if opaque_backend is None or isinstance(e, InvalidValue):
                    raise err from None
                try:
                    outs = _opaque(g, n, ins, opaque_backend)
                except AiaccError:
                    raise err from None
                fallback(f"mxnet.converter:{n.op}", f"{n.describe()} kept opaque (MXNet runs it): {err}")
            except Exception as e:  # noqa: BLE001 - a converter that cannot cope keeps the node opaque
                g.rollback(mark)
                fallback(f"mxnet.converter:{n.op}", f"{n.describe()} kept opaque: its converter failed "
                         f"({type(e).__name__}: {e})")
                outs = None
            else:
                if outs is None:
                    g.rollback(mark)  # a converter may have built part of a translation before giving up
        if outs is None:
            outs = _opaque(g, n, ins, opaque_backend)
        record_source(g, start, f"{n.name} ({n.op})")
        if isinstance(outs, Value):
            outs = [outs]
        for k, v in enumerate(outs):
            env[(n.index, k)] = v
    for i, k in sym.heads:
        if (i, k) not in env:
            raise AiaccError(f"output head refers to output {k} of {sym.nodes[i].describe()}, which it lacks")
        g.add_output(env[(i, k)])
    return g


def _opaque(g: Graph, n: MxNode, ins: list[Value], backend: Any) -> list[Value]:
    """Keep an MXNet node as it is: domain "mxnet", its attributes as strings, an MXNet kernel in meta."""
    if backend is None:
        raise UnsupportedError(f"{n.describe()}: aiacc does not translate this op and no MXNet runtime was "
                               f"given to keep it opaque")
    types = backend.infer(n, [v.type for v in ins])
    original = {"op": n.op, "name": n.name, "attrs": dict(n.attrs)}
    if n.extra:  # e.g. the "subgraphs" of a control-flow op, written back by the exporter
        original["extra"] = dict(n.extra)
    node = g.add_opaque(n.op, ins, domain=OPAQUE_DOMAIN, name=n.name, attrs=dict(n.attrs),
                        outputs=[n.name] if len(types) == 1 else [f"{n.name}_output{k}" for k in range(len(types))],
                        output_types=types, meta={"mxnet_node": original})
    try:  # a backend that can pin output shapes the op cannot infer alone (see opaque.SymbolOpaqueBackend)
        params = inspect.signature(backend.kernel).parameters
    except (TypeError, ValueError):
        params = {}
    node.meta["kernel"] = backend.kernel(n, types) if len(params) >= 2 else backend.kernel(n)
    return node.outputs
