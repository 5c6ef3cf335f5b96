"""TensorFlow -> IR: a Keras model, tf.Module or tf.function becomes an aiacc `Graph`.

The model is traced to a ConcreteFunction, its variables are frozen into constants
(`convert_variables_to_constants_v2`) and the frozen graph is walked op by op (no Grappler).

Layout: TensorFlow computes in NHWC, the IR in NCHW (ONNX semantics). Every TF tensor maps to an IR value
plus a flag `nchw`: when set, the IR value holds the TF tensor transposed to channels-first. Layout-sensitive
ops (Conv2D, pools, FusedBatchNorm) read NCHW values; elementwise ops follow their inputs; every other op
reads the TF layout. A Transpose is inserted only where a value crosses between the two worlds (at graph
inputs and outputs for a CNN), so the IR of a Keras CNN is the NCHW graph an ONNX exporter would give.

Shape arithmetic (Shape / StridedSlice / Pack / Prod feeding a Reshape, as Keras' Tensordot emits) is
evaluated symbolically: a Reshape whose target has at most one unknown size gets a constant target with -1,
and the shape subgraph disappears.

One handler per TF op type, registered in the table `handlers` (`@handlers.register("Conv2D", ...)`, in
aiacc.plugins.tf.import_ops, which the plugin's translator imports). A TF op with no handler, or whose handler raises
Untranslatable (its partial IR is rolled back), becomes an opaque node that keeps its NodeDef (attrs
`tf_op`, `node_def`) and a kernel running it eagerly, so the reference executor still runs it and the
exporter rebuilds it unchanged.

Control flow is frozen functional (`lower_control_flow=False`): While / If / Case and the TensorList
(variant) plumbing around them become opaque *regions* that carry a GraphDef with the function library
they need (aiacc.plugins.tf.regions). Function calls TF's inliner left in place (Keras' XLA-compiled
grouped convolution) are translated through the callee's body. The ops are walked in topological order
(a frozen graph lists them in creation order, which is not always one), each region as one unit.
"""
from __future__ import annotations

import base64
import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from aiacc.core.ir import Graph, TensorType, Value
from aiacc.core.translate import OpTable, Untranslatable, record_source
from aiacc.errors import ShapeError, UnsupportedError, describe, fallback, first_line
from aiacc.plugins.tf._tf import SUPPORTED_DTYPES, np_dtype_name, tf, tf_shape
from aiacc.plugins.tf.regions import (contract, eager_kernel, encode, find_regions, main_op, region_graph_def,
                                      region_kernel, topo_order)

TO_NCHW = (0, 3, 1, 2)
TO_NHWC = (0, 2, 3, 1)
NHWC_AXIS_TO_NCHW = {0: 0, 1: 2, 2: 3, 3: 1}
INT_MAX = 2 ** 63 - 1
INLINE_CALLS = ("PartitionedCall", "StatefulPartitionedCall")
VARIABLE_OPS = ("ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")

# TF op type -> handler(importer, tfop) -> [Entry | None per output] | None (filled by aiacc.plugins.tf.import_ops)
handlers = OpTable("tf import")


# ------------------------------------------------------------------------------------------ entry points
@dataclass
class Traced:
    """A model reduced to a frozen ConcreteFunction and its input signature."""

    frozen: Any  # ConcreteFunction with variables frozen
    specs: list  # tf.TensorSpec per flat input
    output_structure: Any  # structure of the outputs (tf.nest), to pack the exported outputs the same way
    input_structure: Any = None  # positional arguments as nests of flat input indices; None: flat tensors


def _is_keras_model(model: Any) -> bool:
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(model, keras.Model)


def _flat_examples(example_inputs: Any) -> list | None:
    if example_inputs is None:
        return None
    tfm = tf()
    flat = tfm.nest.flatten(example_inputs) if isinstance(example_inputs, (list, tuple, dict)) else [example_inputs]
    out = []
    for i, x in enumerate(flat):
        if isinstance(x, tfm.TensorSpec):
            out.append(x)
            continue
        try:
            out.append(tfm.convert_to_tensor(x))
        except (TypeError, ValueError) as e:
            raise ShapeError(f"example input {i} ({type(x).__name__}) cannot be converted to a tensor: {e}") from None
    return out


def _spec_of(x: Any, relax_batch: bool):
    tfm = tf()
    if isinstance(x, tfm.TensorSpec):
        return x
    shape = list(x.shape)
    if relax_batch and shape:
        shape[0] = None
    return tfm.TensorSpec(shape, x.dtype)


def _check_against(specs: list, examples: list, what: str) -> None:
    """ShapeError naming the input whose rank, size or dtype the signature refuses."""
    if len(specs) != len(examples):
        raise ShapeError(f"{what} takes {len(specs)} inputs, {len(examples)} example inputs were given")
    for i, (spec, x) in enumerate(zip(specs, examples)):
        want = tf_shape(spec.shape)
        got = tf_shape(x.shape)
        name = getattr(spec, "name", None) or f"input {i}"
        if want is not None and (got is None or len(got) != len(want) or
                                 any(w is not None and g is not None and w != g for w, g in zip(want, got))):
            raise ShapeError(f"{what}: input {name!r} expects shape {list(want)}, the example input has shape "
                             f"{list(got) if got is not None else '?'}")
        if spec.dtype != x.dtype:
            raise ShapeError(f"{what}: input {name!r} expects dtype {spec.dtype.name}, the example input is "
                             f"{x.dtype.name}")


def _keras_input_specs(model: Any) -> list | None:
    tfm = tf()
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        return None
    if not inputs:
        return None
    return [tfm.TensorSpec(tuple(t.shape), tfm.as_dtype(t.dtype), name=getattr(t, "name", None)) for t in inputs]


def _index_structure(structure: Any) -> Any:
    """`structure` with its leaves replaced by their flat (tf.nest) positions."""
    tfm = tf()
    return tfm.nest.pack_sequence_as(structure, list(range(len(tfm.nest.flatten(structure)))))


def _trace_keras(model: Any, candidates: list, pack, training: bool = False) -> tuple[Any, list]:
    """(ConcreteFunction, specs) of the first candidate signature the Keras model traces on; `pack` turns
    the flat inputs into the model's argument. A model that cannot trace on its declared (dynamic) shapes
    may still trace on the examples'."""
    tfm = tf()
    first_error = None
    tried = []
    for specs in candidates:
        key = [(tuple(s.shape), s.dtype) for s in specs]
        if key in tried:
            continue
        tried.append(key)

        def call(*xs):
            return model(pack(xs), training=training)

        try:
            return tfm.function(call, input_signature=specs).get_concrete_function(), specs
        except Exception as e:  # Keras raises many kinds of errors for inputs it cannot take
            first_error = first_error or (specs, e)
    specs, e = first_error
    raise ShapeError(f"Keras model {model.name!r} cannot be called on inputs "
                     f"{[(list(s.shape), s.dtype.name) for s in specs]}: {first_line(e)}") from None


def concrete_function(model: Any, example_inputs: Any, training: bool = False) -> Traced:
    """Trace `model` (keras.Model, tf.Module with a tf.function __call__, tf.function, ConcreteFunction) and
    freeze its variables. Example inputs may be omitted when the model carries an input signature.
    training: a Keras model is called with training=True and the variables are not frozen (Traced.frozen is
    then the ConcreteFunction itself, reading its variables through captured resources)."""
    tfm = tf()
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    examples = _flat_examples(example_inputs)
    ConcreteFunction = tfm.types.experimental.ConcreteFunction
    GenericFunction = tfm.types.experimental.GenericFunction

    input_structure = None
    if _is_keras_model(model) and isinstance(example_inputs, dict):
        # named inputs: the model takes one dict; the graph inputs are its values in tf.nest (sorted key) order
        input_structure = [_index_structure(example_inputs)]
        candidates = [[_spec_of(x, relax_batch=True) for x in examples], [_spec_of(x, relax_batch=False) for x in examples]]
        cf, specs = _trace_keras(model, candidates, lambda xs: tfm.nest.pack_sequence_as(example_inputs, list(xs)),
                                 training)
    elif _is_keras_model(model):
        known = _keras_input_specs(model)
        candidates = []
        if examples is not None:
            if known is not None:
                _check_against(known, examples, f"Keras model {model.name!r}")
                candidates.append(known)
            # a model that cannot be traced on its declared (dynamic) shapes may still trace on the examples'
            candidates.append([_spec_of(x, relax_batch=True) for x in examples])
            candidates.append([_spec_of(x, relax_batch=False) for x in examples])
        elif known is not None:
            candidates.append(known)
        else:
            raise UnsupportedError(f"Keras model {model.name!r} has no input shapes yet: pass example inputs")
        cf, specs = _trace_keras(model, candidates, lambda xs: xs[0] if len(xs) == 1 else list(xs), training)
    else:
        is_function = isinstance(model, (GenericFunction, ConcreteFunction))
        if not is_function and hasattr(getattr(model, "__call__", None), "get_concrete_function"):
            model = model.__call__  # a tf.Module (or a reloaded SavedModel object) with a tf.function __call__
        elif isinstance(model, tfm.Module) and not is_function:
            call = getattr(model, "__call__", None)
            if not hasattr(call, "get_concrete_function"):
                raise UnsupportedError(f"tf.Module {type(model).__name__} has no tf.function __call__: decorate "
                                       f"__call__ with @tf.function or pass the tf.function itself")
            model = call
        if isinstance(model, ConcreteFunction):
            cf = model
            specs = [s for s in tfm.nest.flatten(cf.structured_input_signature) if isinstance(s, tfm.TensorSpec)]
            if examples is not None:
                _check_against(specs, examples, f"concrete function {cf.name}")
        elif isinstance(model, GenericFunction) or hasattr(model, "get_concrete_function"):
            sig = getattr(model, "input_signature", None)
            if sig is not None:
                specs = list(tfm.nest.flatten(sig))
                if examples is not None:
                    _check_against(specs, examples, f"tf.function {getattr(model, '__name__', '?')}")
                try:
                    cf = model.get_concrete_function()
                except Exception as e:  # the function's own code failed while tracing
                    raise ShapeError(f"tf.function {getattr(model, '__name__', '?')} cannot be traced on its "
                                     f"input signature: {first_line(e)}") from None
            elif examples is None:
                raise UnsupportedError(f"tf.function {getattr(model, '__name__', '?')} has no input_signature: "
                                       f"pass example inputs")
            else:
                specs = [_spec_of(x, relax_batch=False) for x in examples]
                try:
                    cf = model.get_concrete_function(*specs)
                except Exception as e:  # the function's own code failed while tracing
                    raise ShapeError(f"tf.function {getattr(model, '__name__', '?')} cannot be traced on inputs "
                                     f"{[(list(s.shape), s.dtype.name) for s in specs]}: {first_line(e)}") from None
        else:
            raise UnsupportedError(f"{type(model).__module__}.{type(model).__name__} is not a Keras model, "
                                   f"tf.Module with a tf.function __call__, tf.function or ConcreteFunction")
    for i, s in enumerate(specs):
        np_dtype_name(s.dtype, f"input {i} ({getattr(s, 'name', None) or 'unnamed'})")
    if training:
        frozen = cf
    else:
        frozen = _freeze(cf, convert_variables_to_constants_v2)
    if input_structure is None:
        args, kwargs = cf.structured_input_signature
        if args and not kwargs and any(not isinstance(a, tfm.TensorSpec) for a in args):
            input_structure = list(_index_structure(tuple(args)))
    return Traced(frozen, specs, cf.structured_outputs, input_structure)


def _freeze(cf, convert_variables_to_constants_v2):
    try:
        # control flow stays functional (While / If with their bodies in the function library): the importer
        # keeps it as opaque regions instead of meeting the Switch/Merge/Enter/NextIteration cycles of lowering
        frozen = convert_variables_to_constants_v2(cf, lower_control_flow=False)
    except Exception as e:  # TF raises a variety of errors for graphs it cannot freeze
        raise UnsupportedError(f"the variables of {cf.name} cannot be frozen into constants: {first_line(e)}") from e
    return frozen


def import_model(model: Any, example_inputs: Any = None, *, name: str | None = None,
                 mode: str = "inference") -> Graph:
    """Trace and translate a TF model into an IR graph: inference semantics with the variables frozen, or
    (mode="train") training semantics with the variables as graph inputs and their updates as outputs."""
    training = mode == "train"
    variables = model_variables(model) if training else None
    traced = concrete_function(model, example_inputs, training=training)
    graph_name = name or getattr(model, "name", None) or getattr(model, "__name__", None) or "tf_model"
    return GraphImporter(traced, str(graph_name), variables=variables).run()


def model_variables(model: Any) -> list:
    """The variables of a Keras model or tf.Module, in the model's own (stable) order: what a training-mode
    graph's variable inputs index (graph.meta["tf_variables"])."""
    tfm = tf()
    if _is_keras_model(model) or isinstance(model, tfm.Module):
        return list(model.variables)
    raise UnsupportedError(f"mode='train' takes a Keras model or a tf.Module (whose variables the trained model "
                           f"shares), not a {type(model).__module__}.{type(model).__name__}")


def _handle(v: Any) -> Any:
    """The resource handle of a tf.Variable or of a Keras 3 Variable (which wraps one)."""
    inner = getattr(v, "value", None) if not hasattr(v, "handle") else v
    return getattr(inner, "handle", None)


# ------------------------------------------------------------------------------------------ the walker
@dataclass
class Entry:
    """The IR value standing for one TF tensor; nchw: the value is the tensor transposed to channels-first."""

    value: Value
    nchw: bool = False


class GraphImporter:
    """Walks a frozen FuncGraph in topological order and builds the IR."""

    def __init__(self, traced: Traced, name: str, variables: list | None = None):
        self.traced = traced
        self.training = variables is not None
        self.variables = variables
        self.var_current: dict[str, Value] = {}  # training: captured resource tensor name -> current value
        self.tfgraph = traced.frozen.graph
        self.g = Graph(name)
        self.env: dict[str, Entry] = {}
        self.sym: dict[str, Any] = {}  # symbolic values of small int tensors (shape arithmetic)
        self._transposes: dict[tuple[int, tuple], Value] = {}
        self._n_sym = 0

    # -- driver --------------------------------------------------------------------------------------
    def run(self) -> Graph:
        tfm = tf()
        frozen = self.traced.frozen
        g = self.g
        captured = {t.name for t in frozen.graph.internal_captures} if self.training else set()
        placeholders = [t for t in frozen.inputs if t.dtype != tfm.resource and t.name not in captured]
        for i, (t, spec) in enumerate(zip(placeholders, self.traced.specs)):
            dtype = np_dtype_name(t.dtype, f"input {t.op.name}")
            shape = tf_shape(t.shape)
            if shape is not None:
                shape = tuple(d if d is not None else ("N" if k == 0 else f"{_clean(t.op.name)}_{k}")
                              for k, d in enumerate(shape))
            v = g.add_input(_clean(t.op.name), dtype, shape)
            self.env[t.name] = Entry(v)
        n_data = len(g.inputs)
        if self.training:
            start = self._bind_captures(frozen)
        self.library_def = self.tfgraph.as_graph_def().library
        self.translate_ops(self.tfgraph, frozen.outputs)
        for i, t in enumerate(frozen.outputs):
            if t.name not in self.env:
                raise UnsupportedError(f"output {i} ({t.name}) of the TF graph was not translated")
            g.add_output(self.plain(t))
        if self.training:
            self._state_outputs(start, n_data)
        g.meta["tf_signature"] = [(v.name, tf_shape(s.shape), s.dtype.name) for v, s in zip(g.inputs[:n_data],
                                                                                          self.traced.specs)]
        g.meta["tf_output_structure"] = self.traced.output_structure
        if self.traced.input_structure is not None:
            g.meta["tf_input_structure"] = self.traced.input_structure
        g.meta["framework"] = "tf"
        _dead_code(g)
        g.remove_unused_initializers()
        g.verify()
        return g

    # -- training: variables ------------------------------------------------------------------------
    def _bind_captures(self, cf) -> dict[str, Value]:
        """Each captured resource becomes a graph input standing for its variable (graph.meta["tf_variables"]:
        (input name, index in the model's variables, trainable)); captured constants become initializers.
        Returns {resource tensor name: input value}."""
        tfm = tf()
        by_handle = {id(_handle(v)): k for k, v in enumerate(self.variables)}
        start, table, arrays = {}, [], {}
        for external, internal in cf.graph.captures:
            if internal.dtype != tfm.resource:
                self.env[internal.name] = Entry(self.init(external.numpy(), internal.op.name))
                continue
            k = by_handle.get(id(external))
            if k is None:
                raise UnsupportedError(f"the traced function reads a variable ({internal.op.name}) that is not one "
                                       f"of the model's variables: mode='train' needs every variable reachable "
                                       f"from the model")
            var = self.variables[k]
            if internal.name in start:
                continue
            path = str(getattr(var, "path", None) or var.name).replace("/", "_").replace(":", "_")
            v = self.g.add_input(_clean(f"var_{k}_{path}"), np_dtype_name(var.dtype, f"variable {var.name}"),
                                 tuple(int(d) for d in var.shape))
            start[internal.name] = v
            table.append((v.name, k, bool(var.trainable)))
            arrays[v.name] = np.asarray(var.numpy())  # the reference executor's feeds (debug, culprit search)
        self.var_current = dict(start)
        self.g.meta["tf_variables"] = table
        self.g.meta["tf_variable_arrays"] = arrays
        return start

    def _state_outputs(self, start: dict[str, Value], n_data: int) -> None:
        """Every variable the step assigns gets its final value as an extra graph output
        (graph.meta["tf_assigns"]: (output index, variable index)); the exporter assigns it back."""
        names = {v_name: k for v_name, k, _ in self.g.meta["tf_variables"]}
        n_model = len(self.g.outputs)
        assigns = []
        for key, v in self.var_current.items():
            if v is start[key]:
                continue
            assigns.append((len(self.g.outputs), names[start[key].name]))
            self.g.add_output(v)
        self.g.meta["tf_assigns"] = assigns
        self.g.meta["tf_model_outputs"] = n_model
        self.g.meta["tf_data_inputs"] = n_data
        self.g.meta["tf_mode"] = "train"

    def translate_ops(self, tfgraph, outputs) -> None:
        """Translate the ops of `tfgraph` that `outputs` need (graph inputs already in self.env); in training
        also every variable assignment (reached by control dependencies only)."""
        if self.training:
            outputs = list(outputs) + [t for op in tfgraph.get_operations()
                                       if op.type in VARIABLE_OPS[1:] for t in op.inputs[1:]]
        needed = self._reachable(outputs)
        if self.training:
            needed |= {op.name for op in tfgraph.get_operations() if op.type in VARIABLE_OPS[1:]}
        ops = topo_order([op for op in tfgraph.get_operations() if op.name in needed])
        library = {f.signature.name for f in self.library_def.function}
        inlined = {op.name for op in ops if op.type in INLINE_CALLS and self._inline(op)}
        # training: the model's variable reads/assignments are translated (import_ops.variables), not regions
        variable_ops = {op.name for op in ops if self.training and op.type in VARIABLE_OPS}
        regions = find_regions([op for op in ops if op.type != "Placeholder" and op.name not in inlined
                                and op.name not in variable_ops], library)
        self._outputs = {t.name for t in outputs}
        for unit in contract(ops, regions):
            mark = self.g.checkpoint()
            self._translate_unit(unit, inlined, tfgraph)
            # for the view: the TF op (a Keras layer's ops are named after the layer) each node came from
            main = main_op(unit) if isinstance(unit, list) else unit
            record_source(self.g, mark, f"{main.name} ({main.type})")

    def _translate_unit(self, unit, inlined: set, tfgraph) -> None:
        """Translate one op, inlined function call or opaque region (a list of ops)."""
        if isinstance(unit, list):
            self._translate_region(unit, tfgraph)
        elif unit.name in inlined:
            entries = self._translate_call(unit)
            if entries is None:
                self._translate_region([unit], tfgraph)
                return
            for t, e in zip(unit.outputs, entries):
                self._merge_type(e, t)
                self.env[t.name] = e
        elif unit.type != "Placeholder":
            self._translate(unit)

    def _inline(self, call) -> bool:
        """Decide whether a function call is translated through its body (see _translate_call)."""
        f = call.node_def.attr["f"].func.name if "f" in call.node_def.attr else ""
        funcs = {fd.signature.name for fd in self.library_def.function}
        return bool(f) and f in funcs and all(t.dtype.name in SUPPORTED_DTYPES for t in
                                               list(call.inputs) + list(call.outputs))

    def _translate_call(self, call) -> list[Entry] | None:
        """PartitionedCall / StatefulPartitionedCall that TF's inliner left (Keras' XLA-compiled grouped
        convolution): the callee's body is translated like the caller's ops, its placeholders bound to the
        call's inputs. None when the body cannot be rebuilt (the call then stays an opaque region)."""
        from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

        tfm = tf()
        name = call.node_def.attr["f"].func.name
        fdef = next(fd for fd in self.library_def.function if fd.signature.name == name)
        try:
            with tfm.Graph().as_default():
                lib = tfm.compat.v1.GraphDef()
                lib.library.CopyFrom(self.library_def)
                tfm.graph_util.import_graph_def(lib, name="")
                fg = function_def_to_graph(fdef, input_shapes=[t.shape for t in call.inputs],
                                           include_library_functions=True)
        except Exception as e:  # noqa: BLE001 - a body TF itself cannot rebuild outside its graph
            fallback(f"tf.call:{name}", f"{call.type} {call.name} (function {name}) is kept as an opaque TF "
                     f"region: TF cannot rebuild its body outside its graph "
                     f"({describe(e)})")
            return None
        child = GraphImporter.__new__(GraphImporter)
        child.__dict__.update(self.__dict__)
        child.tfgraph = fg
        child.env = {ph.name: self.entry(t) for ph, t in zip(fg.inputs, call.inputs)}
        child.sym = {ph.name: self.sym[t.name] for ph, t in zip(fg.inputs, call.inputs) if t.name in self.sym}
        child.translate_ops(fg, fg.outputs)
        self._n_sym = child._n_sym
        return [child.entry(t) for t in fg.outputs]

    def _reachable(self, outputs) -> set[str]:
        seen: set[str] = set()
        stack = [t.op for t in outputs]
        while stack:
            o = stack.pop()
            if o.name in seen:
                continue
            seen.add(o.name)
            stack.extend(t.op for t in o.inputs)
        return seen

    def _translate(self, tfop) -> None:
        for k, t in enumerate(tfop.outputs):
            np_dtype_name(t.dtype, f"TF node {tfop.name} ({tfop.type}) output {k}")
        sym = _symbolic(self, tfop)
        if sym is not None:
            self.sym[tfop.outputs[0].name] = sym
            if tfop.type != "Const" and len(tfop.outputs) == 1 and _all_ints(sym):
                # shape arithmetic with a known result becomes a constant (Tile multiples, resize sizes, ...)
                value = np.asarray(sym, dtype=np_dtype_name(tfop.outputs[0].dtype, tfop.name))
                static = tf_shape(tfop.outputs[0].shape)
                if static is None or (len(static) == value.ndim and
                                      all(d is None or d == v for d, v in zip(static, value.shape))):
                    self.env[tfop.outputs[0].name] = Entry(self.init(value, tfop.name + "_c"))
                    return
        handler = handlers.get(tfop.type)
        entries = None
        if handler is not None:
            mark, n_transposes = self.g.checkpoint(), len(self._transposes)
            try:
                entries = handler(self, tfop)
            except Untranslatable:
                entries = None
            if entries is None:  # the handler gave up, maybe part-way: undo what it added
                self.g.rollback(mark)
                for key in list(self._transposes)[n_transposes:]:
                    del self._transposes[key]
        if entries is None:
            entries = self.opaque(tfop)
        for t, e in zip(tfop.outputs, entries):
            if e is None:  # an output the translation drops because nothing reads it
                continue
            self._merge_type(e, t)
            self.env[t.name] = e

    def _translate_region(self, region: list, tfgraph) -> None:
        """One opaque node for a region (see aiacc.plugins.tf.regions)."""
        gd, external, outputs = region_graph_def(region, self.library_def, tfgraph.graph_def_versions)
        names = {op.name for op in region}
        outputs += [t for op in region for t in op.outputs if t.name in self._outputs and t not in outputs]
        main = main_op(region)
        types = []
        for t in outputs:
            types.append(TensorType(np_dtype_name(t.dtype, f"TF node {t.op.name} ({t.op.type}) output "
                                                           f"{t.value_index}, read outside the opaque "
                                                           f"{main.type} region {main.name}"), tf_shape(t.shape)))
        inputs = [self.plain(t) for t in external]
        out_names = [t.name for t in outputs]
        node = self.g.add_opaque(main.type, inputs, domain="tf", name=_clean(main.name), outputs=len(outputs),
                                 output_types=types,
                                 attrs={"tf_op": main.type, "graph_def": encode(gd), "tf_outputs": out_names},
                                 meta={"graph_def": gd, "tf_ops": sorted(names),
                                       "kernel": region_kernel(gd, out_names, f"{main.name} ({main.type})")})
        for t, v in zip(outputs, node.outputs):
            self.env[t.name] = Entry(v)

    # -- values and layouts ---------------------------------------------------------------------------
    def entry(self, t) -> Entry:
        try:
            return self.env[t.name]
        except KeyError:
            raise UnsupportedError(f"TF tensor {t.name} is read before it is defined") from None

    def const(self, t) -> np.ndarray | None:
        """The constant value of a TF tensor (in TF layout), None when it is not constant."""
        e = self.env.get(t.name)
        if e is None or e.value.const is None:
            return None
        return np.transpose(e.value.const, TO_NHWC) if e.nchw else e.value.const

    def need_const(self, t, what: str) -> np.ndarray:
        c = self.const(t)
        if c is None:
            raise Untranslatable(what)
        return c

    def plain(self, t) -> Value:
        """The IR value of `t` in TF layout."""
        e = self.entry(t)
        return self.transpose(e.value, TO_NHWC) if e.nchw else e.value

    def nchw(self, t) -> Value:
        """The IR value of the rank-4 tensor `t` in NCHW."""
        e = self.entry(t)
        if e.nchw:
            return e.value
        if e.value.shape is None or len(e.value.shape) != 4:
            raise Untranslatable(f"{t.name} is not rank 4")
        return self.transpose(e.value, TO_NCHW)

    def transpose(self, v: Value, perm) -> Value:
        perm = tuple(int(p) for p in perm)
        if perm == tuple(range(len(perm))):
            return v
        if v.const is not None:
            return self.g.add_initializer(v.name + "_t", np.ascontiguousarray(np.transpose(v.const, perm)))
        key = (id(v), perm)
        if key not in self._transposes:
            self._transposes[key] = self.g.op("Transpose", v, perm=list(perm), name=v.name + "_transpose")
        return self._transposes[key]

    def init(self, array: Any, name: str) -> Value:
        return self.g.add_initializer(_clean(name), np.asarray(array))

    def ints(self, values, name: str) -> Value:
        return self.init(np.asarray(values, dtype=np.int64), name)

    def emit(self, op: str, inputs, attrs: dict | None = None, *, name: str, outputs: int = 1,
             domain: str = "") -> list[Value]:
        """Add an IR node; constant-fold it at once when every input is a constant."""
        node = self.g.add_node(op, list(inputs), attrs or {}, domain=domain, name=_clean(name), outputs=outputs)
        present = [v for v in node.inputs if v is not None]
        if node.schema is not None and present and all(v.const is not None for v in present):
            results = node.schema.run(node, [None if v is None else v.const for v in node.inputs])
            outs = list(node.outputs)
            consts = [self.init(r, o.name + "_c") for o, r in zip(outs, results)]
            for o, c in zip(outs, consts):
                o.replace_all_uses_with(c)
            self.g.erase(node)
            return consts
        return list(node.outputs)

    def emit1(self, op: str, inputs, attrs: dict | None = None, *, name: str) -> Value:
        return self.emit(op, inputs, attrs, name=name)[0]

    def _merge_type(self, e: Entry, t) -> None:
        """Fill dims the IR inference left unknown from TF's static shape."""
        v = e.value
        if v.const is not None:
            return
        shape = tf_shape(t.shape)
        if shape is not None and e.nchw and len(shape) == 4:
            shape = tuple(shape[p] for p in TO_NCHW)
        dtype = np_dtype_name(t.dtype, t.name)
        if v.type is None or v.shape is None:
            v.type = TensorType(v.dtype or dtype, shape)
            return
        if shape is None or len(shape) != len(v.shape):
            return
        merged = tuple(d if isinstance(d, int) else (s if isinstance(s, int) else d) for d, s in zip(v.shape, shape))
        v.type = TensorType(v.dtype or dtype, merged)

    def rank(self, t) -> int | None:
        """Rank of `t`: TF's static shape, else the IR's (TF loses it through some function calls)."""
        s = self.static_shape(t)
        return None if s is None else len(s)

    def static_shape(self, t) -> tuple | None:
        """Shape of `t` in TF layout, merging TF's static shape with the IR's."""
        s = tf_shape(t.shape)
        e = self.env.get(t.name)
        ir = None
        if e is not None and e.value.shape is not None:
            ir = e.value.shape
            if e.nchw and len(ir) == 4:
                ir = tuple(ir[p] for p in TO_NHWC)
        if s is None:
            return ir
        if ir is None or len(ir) != len(s):
            return s
        return tuple(a if a is not None else b for a, b in zip(s, ir))

    def new_symbol(self) -> str:
        self._n_sym += 1
        return f"s{self._n_sym}"

    # -- opaque nodes ---------------------------------------------------------------------------------
    def opaque(self, tfop) -> list[Entry]:
        """Keep a TF op as it is: its NodeDef travels in the attrs; its kernel runs it eagerly."""
        nd = _strip_node_def(tfop.node_def)
        inputs = [self.plain(t) for t in tfop.inputs]
        types = [TensorType(np_dtype_name(t.dtype, t.name), tf_shape(t.shape)) for t in tfop.outputs]
        in_dtypes = [t.dtype.as_datatype_enum for t in tfop.inputs]
        node = self.g.add_opaque(tfop.type, inputs, domain="tf", name=_clean(tfop.name), outputs=len(tfop.outputs),
                                 output_types=types,
                                 attrs={"tf_op": tfop.type,
                                        "node_def": base64.b64encode(nd.SerializeToString()).decode()},
                                 meta={"node_def": nd, "kernel": _eager_kernel(nd, in_dtypes, len(tfop.outputs))})
        return [Entry(v) for v in node.outputs]


def _clean(name: str) -> str:
    return name.replace(":", "_")


def _dead_code(g: Graph) -> None:
    """Erase nodes nobody reads (the shape arithmetic a constant Reshape target replaced)."""
    changed = True
    while changed:
        changed = False
        for node in reversed(g.nodes):
            if all(not v.uses and not v.is_graph_output for v in node.outputs):
                g.erase(node)
                changed = True


# ------------------------------------------------------------------------------------------ NodeDef helpers
def _strip_node_def(nd):
    """A copy of a NodeDef without control inputs and device, inputs renamed to in0, in1, ..."""
    tfm = tf()
    out = tfm.compat.v1.NodeDef()
    out.CopyFrom(nd)
    data_inputs = [i for i in out.input if not i.startswith("^")]
    del out.input[:]
    out.input.extend(f"in{k}" for k in range(len(data_inputs)))
    out.device = ""
    for key in [k for k in out.attr if k.startswith("_")]:
        del out.attr[key]
    return out


def node_def_graph(nd, in_dtypes: list[int]):
    """A GraphDef holding placeholders in0.. and the NodeDef, for import_graph_def."""
    tfm = tf()
    gd = tfm.compat.v1.GraphDef()
    for k, dt in enumerate(in_dtypes):
        ph = gd.node.add()
        ph.name = f"in{k}"
        ph.op = "Placeholder"
        ph.attr["dtype"].type = dt
    gd.node.add().CopyFrom(nd)
    return gd


def rebuild_node(nd, in_dtypes: list[int], inputs: list, n_out: int) -> list:
    """Recreate a NodeDef in the current (function) graph, reading `inputs`; returns its outputs."""
    tfm = tf()
    graph = tfm.compat.v1.get_default_graph()
    try:
        op = graph._create_op_internal(nd.op, list(inputs), dtypes=None, name=nd.name,  # noqa: SLF001
                                       attrs={k: v for k, v in nd.attr.items()})
        return list(op.outputs)
    except (AttributeError, TypeError):  # a TF without the private entry point: go through a GraphDef
        gd = node_def_graph(nd, in_dtypes)
        names = [f"{nd.name}:{k}" for k in range(n_out)]
        return list(tfm.graph_util.import_graph_def(gd, input_map={f"in{k}": x for k, x in enumerate(inputs)},
                                                    return_elements=names, name="aiacc_opaque"))


def _eager_kernel(nd, in_dtypes: list[int], n_out: int) -> Callable:
    return eager_kernel(lambda xs: rebuild_node(nd, in_dtypes, xs, n_out), f"TF op {nd.name} ({nd.op})")


# ------------------------------------------------------------------------------------------ symbolic shapes
def _all_ints(sym) -> bool:
    if isinstance(sym, list):
        return all(isinstance(d, int) and not isinstance(d, bool) for d in sym)
    return isinstance(sym, int) and not isinstance(sym, bool)


def _product(xs):
    out: Any = 1
    for x in xs:
        if isinstance(out, int) and isinstance(x, int):
            out *= x
        else:
            out = f"{out}*{x}" if out != 1 else x
    return out


def _symbolic(imp: GraphImporter, tfop) -> Any:
    """Symbolic value of a small integer tensor (list of int/str for rank 1, int/str for scalars)."""
    if not tfop.outputs or not tfop.outputs[0].dtype.is_integer:
        return None
    ins = [imp.sym.get(t.name) for t in tfop.inputs]
    typ = tfop.type
    try:
        if typ == "Const":
            v = tf().make_ndarray(tfop.get_attr("value"))
            if v.ndim <= 1 and v.size <= 64:
                return v.tolist()
            return None
        if typ == "Shape":
            s = imp.static_shape(tfop.inputs[0])
            if s is None:
                return None
            return [d if d is not None else imp.new_symbol() for d in s]
        if typ in ("Identity", "Cast", "StopGradient") and ins and ins[0] is not None:
            return ins[0]
        if typ == "Reshape" and ins[0] is not None and isinstance(ins[1], list):
            flat = ins[0] if isinstance(ins[0], list) else [ins[0]]
            if ins[1] == [] and len(flat) == 1:
                return flat[0]
            if len(ins[1]) == 1 and ins[1][0] in (-1, len(flat)):
                return list(flat)
            return None
        if typ in ("Add", "AddV2", "Sub", "FloorDiv", "Maximum", "Minimum") and len(ins) == 2 and \
                all(isinstance(x, int) for x in ins):
            a, b = ins
            return {"Add": a + b, "AddV2": a + b, "Sub": a - b, "FloorDiv": a // b if b else None,
                    "Maximum": max(a, b), "Minimum": min(a, b)}[typ]
        if typ == "StridedSlice" and isinstance(ins[0], list) and all(isinstance(x, list) for x in ins[1:]):
            if any(tfop.get_attr(k) for k in ("ellipsis_mask", "new_axis_mask")):
                return None
            (b,), (e,), (s,) = ins[1], ins[2], ins[3]
            if not all(isinstance(x, int) for x in (b, e, s)):
                return None
            b = None if tfop.get_attr("begin_mask") & 1 else b
            e = None if tfop.get_attr("end_mask") & 1 else e
            if tfop.get_attr("shrink_axis_mask") & 1:
                return ins[0][b]
            return ins[0][b:e:s]
        if typ == "GatherV2" and isinstance(ins[0], list) and ins[1] is not None and ins[2] in (0, [0]):
            idx = ins[1]
            if isinstance(idx, list):
                return [ins[0][i] for i in idx]
            return ins[0][idx]
        if typ == "Pack" and all(x is not None and not isinstance(x, list) for x in ins) and tfop.get_attr("axis") == 0:
            return list(ins)
        if typ == "ConcatV2" and all(isinstance(x, list) for x in ins[:-1]):
            return [d for x in ins[:-1] for d in x]
        if typ == "Rank":
            s = imp.static_shape(tfop.inputs[0])
            return None if s is None else len(s)
        if typ == "Size":
            s = imp.static_shape(tfop.inputs[0])
            return None if s is None else _product([d if d is not None else imp.new_symbol() for d in s])
        if typ == "Prod" and isinstance(ins[0], list) and ins[1] in (0, [0]) and not tfop.get_attr("keep_dims"):
            return _product(ins[0])
        if typ == "Mul" and all(x is not None and not isinstance(x, list) for x in ins):
            return _product(ins)
    except (IndexError, TypeError, ValueError):
        return None
    return None
