"""ONNX <-> aiacc IR. The only module of aiacc.core that imports onnx.

`from_onnx(model)` reads a ModelProto into a Graph:
  * initializers become graph initializers, Constant nodes stay Constant nodes;
  * dimensions with a `dim_param` become symbols, dimensions without anything become unknown;
  * attributes that older opsets had and newer ones turned into inputs (axes of Squeeze/Unsqueeze/Reduce*,
    Split's sizes, Pad's pads, Clip's bounds, Slice's starts/ends...) are converted to the newer form, so
    the registry only knows one form of each op;
  * Cast's `to` becomes a numpy dtype name;
  * an op the registry does not know becomes an opaque node: domain and attributes kept (attributes the
    text form cannot hold, such as subgraphs, travel in node.meta["onnx_attributes"] and are written back).

`to_onnx(graph)` writes a ModelProto at opset 18 or newer (the form of the registry).
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from aiacc.core.ir import Graph, Node, TensorType, Value
from aiacc.core.ops import get_schema, infer_node
from aiacc.core.ops.guard import refuse_guards, without_input_checks
from aiacc.core.translate import decompose_fused  # noqa: F401  (re-exported: aiacc.core.onnx.decompose_fused)
from aiacc.errors import AiaccError, ParseError, UnsupportedError

MIN_EXPORT_OPSET = 18  # the registry follows opset-18 forms (Reduce axes as inputs, Split num_outputs...)

# ops that take `axes` as an attribute before the given opset and as an input from it on
_AXES_TO_INPUT = {"Squeeze": 13, "Unsqueeze": 13, "ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18,
                  "ReduceMin": 18, "ReduceProd": 18, "ReduceL1": 18, "ReduceL2": 18, "ReduceLogSum": 18,
                  "ReduceLogSumExp": 18, "ReduceSumSquare": 18}
# attributes old opsets had that carry no meaning any more
_OBSOLETE_ATTRS = {"consumed_inputs", "is_test", "spatial"}


# ------------------------------------------------------------------------------------------------ dtypes
_SUPPORTED_ELEM = {TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT16, TensorProto.INT16,
                   TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL, TensorProto.FLOAT16, TensorProto.DOUBLE,
                   TensorProto.UINT32, TensorProto.UINT64, TensorProto.COMPLEX64, TensorProto.COMPLEX128,
                   # the low-precision types, held as ml_dtypes' numpy dtypes (what onnx's numpy_helper gives)
                   TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ,
                   TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ, TensorProto.FLOAT8E8M0,
                   TensorProto.FLOAT4E2M1, TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2, TensorProto.UINT2}


def _elem_name(elem_type: int) -> str:
    try:
        return TensorProto.DataType.Name(elem_type)
    except ValueError:
        return str(elem_type)


def onnx_to_numpy_dtype(elem_type: int, where: str = "") -> str:
    """The numpy dtype name of an ONNX TensorProto element type (bfloat16, float8, int4... are ml_dtypes names;
    string and other non-numeric types are unsupported)."""
    if elem_type not in _SUPPORTED_ELEM:
        raise UnsupportedError(f"{where}element type {_elem_name(elem_type)} has no numpy equivalent aiacc supports")
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name


def numpy_to_onnx_dtype(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _tensor_to_array(t: TensorProto, where: str) -> np.ndarray:
    if t.data_type not in _SUPPORTED_ELEM:
        raise UnsupportedError(f"{where}: tensor {t.name!r} of type {_elem_name(t.data_type)} "
                               f"has no numpy equivalent aiacc supports")
    if any(d < 0 for d in t.dims):
        raise ParseError(f"{where}: negative dimension in dims {list(t.dims)}")
    try:
        return numpy_helper.to_array(t).copy()
    except (ValueError, TypeError) as e:  # data shorter/longer than its dims say, or of a bad byte size
        raise ParseError(f"{where}: its data does not fit dims {list(t.dims)} of type "
                         f"{_elem_name(t.data_type)} ({e})") from None


def _type_from_proto(tp, where: str) -> TensorType | None:
    if not tp.HasField("tensor_type"):
        raise UnsupportedError(f"{where}: only tensor values are supported (got {tp.WhichOneof('value')})")
    tt = tp.tensor_type
    dtype = onnx_to_numpy_dtype(tt.elem_type, f"{where}: ") if tt.elem_type else None
    if not tt.HasField("shape"):
        return TensorType(dtype, None)
    dims: list = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return TensorType(dtype, tuple(dims))


# ------------------------------------------------------------------------------------------------ import
def _attr_value(a: AttributeProto, where: str) -> tuple[bool, Any]:
    """(representable, value) of an attribute; not representable: graphs, sparse tensors, type protos."""
    T = AttributeProto
    if a.type == T.FLOAT:
        return True, float(a.f)
    if a.type == T.INT:
        return True, int(a.i)
    if a.type == T.STRING:
        try:
            return True, a.s.decode("utf-8")
        except UnicodeDecodeError:
            return False, None
    if a.type == T.FLOATS:
        return True, [float(x) for x in a.floats]
    if a.type == T.INTS:
        return True, [int(x) for x in a.ints]
    if a.type == T.STRINGS:
        try:
            return True, [s.decode("utf-8") for s in a.strings]
        except UnicodeDecodeError:
            return False, None
    if a.type == T.TENSOR:
        try:
            arr = _tensor_to_array(a.t, where)
        except UnsupportedError:
            return False, None
        if arr.dtype.kind in "OUS":
            return False, None
        return True, arr
    return False, None


def _merge_types(ours: TensorType | None, theirs: TensorType | None) -> TensorType | None:
    """Our inferred type, with what ONNX's shape inference or the model's value_info knows filling the gaps
    (dims we could not infer, or the whole type of an opaque node's output)."""
    if theirs is None:
        return ours
    if theirs.shape is not None:  # symbols onnx's inference invents ("unk__0") carry no information
        theirs = TensorType(theirs.dtype, tuple(None if isinstance(d, str) and d.startswith("unk__") else d
                                                for d in theirs.shape))
    if ours is None:
        return theirs
    dtype = ours.dtype or theirs.dtype
    shape = ours.shape
    if shape is None:
        shape = theirs.shape
    elif theirs.shape is not None and len(theirs.shape) == len(shape):
        shape = tuple(t if o is None else o for o, t in zip(shape, theirs.shape))
    return TensorType(dtype, shape)


class _Importer:
    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.opset = 1
        for imp in model.opset_import:
            if imp.domain in ("", "ai.onnx"):
                self.opset = imp.version
        self.g = Graph(model.graph.name or "main")
        self.g.opset_imports = {(i.domain if i.domain != "ai.onnx" else ""): i.version for i in model.opset_import}
        self.g.doc = model.graph.doc_string
        self.value_info: dict[str, Any] = {}

    # -- helpers -----------------------------------------------------------------------------------
    def value(self, name: str, node_name: str) -> Value | None:
        if name == "":
            return None
        if not self.g.has_value(name):
            raise ParseError(f"ONNX node {node_name!r}: input {name!r} is not defined before it "
                             f"(dangling input or the nodes are not in topological order)")
        return self.g.value(name)

    def const_input(self, array, base: str) -> Value:
        return self.g.add_initializer(self.g.fresh_name(base), np.asarray(array))

    # -- the graph ---------------------------------------------------------------------------------
    def run(self) -> Graph:
        gp = self.model.graph
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model, strict_mode=False)
            for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
                self.value_info[vi.name] = vi.type
        except Exception:  # shape inference is only a source of types for opaque nodes
            pass
        for vi in gp.value_info:
            self.value_info.setdefault(vi.name, vi.type)
        init_names = {t.name for t in gp.initializer}
        for t in gp.initializer:
            if self.g.has_value(t.name):
                raise ParseError(f"ONNX initializer {t.name!r} is defined twice")
            self.g.add_initializer(t.name, _tensor_to_array(t, f"initializer {t.name!r}"))
        for vi in gp.input:
            if vi.name in init_names:
                continue  # IR < 4 lists initializers among the inputs
            t = _type_from_proto(vi.type, f"graph input {vi.name!r}")
            self.g.add_input(vi.name, t.dtype, t.shape)
        for np_ in gp.node:
            self.node(np_)
        outs = []
        for vi in gp.output:
            if not self.g.has_value(vi.name):
                raise ParseError(f"ONNX graph output {vi.name!r} is not produced by any node")
            v = self.g.value(vi.name)
            if v.type is None or v.shape is None:
                v.type = _type_from_proto(vi.type, f"graph output {vi.name!r}")
            outs.append(v)
        self.g.outputs = outs
        return self.g

    def node(self, p: onnx.NodeProto) -> None:
        where = f"ONNX node {p.name or p.op_type!r} ({p.op_type})"
        domain = "" if p.domain in ("", "ai.onnx") else p.domain
        op_type = p.op_type
        attrs: dict[str, Any] = {}
        raw: list[bytes] = []
        for a in p.attribute:
            ok, val = _attr_value(a, where)
            if ok:
                attrs[a.name] = val
            else:
                raw.append(a.SerializeToString())
        inputs = [self.value(n, p.name or p.op_type) for n in p.input]
        schema = get_schema(op_type, domain)
        if schema is not None and raw:
            names = ", ".join(AttributeProto.FromString(r).name for r in raw)
            raise UnsupportedError(f"{where}: attribute(s) {names} cannot be represented")
        if schema is not None or (domain == "" and op_type == "Upsample"):
            op_type, inputs, attrs = self.upgrade(p, op_type, inputs, attrs, where)
            if op_type is None:
                return
            schema = get_schema(op_type, domain)
        out_names = [o if o else self.g.fresh_name(f"{p.name or op_type.lower()}_unused{i}")
                     for i, o in enumerate(p.output)]
        for o in out_names:
            if self.g.has_value(o):
                raise ParseError(f"{where}: output {o!r} is defined twice")
        node = self.g.add_node(op_type, inputs, attrs, domain=domain, name=p.name or None, outputs=out_names,
                               infer=False)
        if raw:
            node.meta["onnx_attributes"] = raw
        if p.doc_string:
            node.meta["doc"] = p.doc_string
        types: list = [None] * len(node.outputs)
        if schema is not None:
            try:
                types = infer_node(node)
            except AiaccError as e:
                raise type(e)(f"{e} [{where}]") from e
        for v, t in zip(node.outputs, types):
            if v.name in self.value_info:
                try:
                    t = _merge_types(t, _type_from_proto(self.value_info[v.name], where))
                except UnsupportedError:
                    pass
            v.type = t

    # -- opset upgrades ----------------------------------------------------------------------------
    def upgrade(self, p, op_type, inputs, attrs, where):
        """Rewrite attributes older opsets had into the inputs the registry expects."""
        opset = self.opset
        for k in list(attrs):
            if k in _OBSOLETE_ATTRS:
                del attrs[k]
        if "broadcast" in attrs and opset < 7:
            inputs = self.old_broadcast(p, inputs, attrs.pop("broadcast"), attrs.pop("axis", None), where)
        if op_type == "PRelu" and opset < 7 and len(inputs) == 2:
            inputs = self.old_broadcast(p, inputs, 1, 1, where, only_1d=True)
        if op_type == "Constant":
            for k in ("sparse_value", "value_string", "value_strings"):
                if k in attrs:
                    raise UnsupportedError(f"{where}: Constant {k} is not supported")
        if op_type == "Cast":
            to = attrs.get("to")
            if isinstance(to, int):
                attrs["to"] = onnx_to_numpy_dtype(to, f"{where}: Cast to ")
            elif isinstance(to, str):  # opset < 6 spelled the type
                attrs["to"] = onnx_to_numpy_dtype(TensorProto.DataType.Value(to.upper()), f"{where}: Cast to ")
        if op_type in _AXES_TO_INPUT and opset < _AXES_TO_INPUT[op_type] and "axes" in attrs:
            inputs = inputs[:1] + [self.const_input(np.asarray(attrs.pop("axes"), np.int64), f"{p.name}_axes")]
        if op_type == "Split" and "split" in attrs:
            inputs = inputs[:1] + [self.const_input(np.asarray(attrs.pop("split"), np.int64), f"{p.name}_split")]
        if op_type == "Pad" and opset < 11:
            pads = np.asarray(attrs.pop("pads"), np.int64)
            value = attrs.pop("value", 0.0)
            dt = inputs[0].dtype or "float32"
            inputs = inputs[:1] + [self.const_input(pads, f"{p.name}_pads"),
                                   self.const_input(np.asarray(value, dt), f"{p.name}_value")]
        if op_type == "Clip" and opset < 11:
            dt = inputs[0].dtype or "float32"
            lo, hi = attrs.pop("min", None), attrs.pop("max", None)
            inputs = inputs[:1] + [None if lo is None else self.const_input(np.asarray(lo, dt), f"{p.name}_min"),
                                   None if hi is None else self.const_input(np.asarray(hi, dt), f"{p.name}_max")]
        if op_type == "Slice" and opset < 10:
            starts, ends = attrs.pop("starts"), attrs.pop("ends")
            axes = attrs.pop("axes", None)
            inputs = inputs[:1] + [self.const_input(np.asarray(starts, np.int64), f"{p.name}_starts"),
                                   self.const_input(np.asarray(ends, np.int64), f"{p.name}_ends")]
            if axes is not None:
                inputs.append(self.const_input(np.asarray(axes, np.int64), f"{p.name}_axes"))
        if op_type == "Reshape" and "shape" in attrs:
            inputs = inputs[:1] + [self.const_input(np.asarray(attrs.pop("shape"), np.int64), f"{p.name}_shape")]
        if op_type == "Dropout" and opset < 12 and "ratio" in attrs:
            attrs.pop("ratio")  # inference semantics: identity either way
        if op_type == "BatchNormalization" and opset < 14 and len(p.output) > 1:
            # opset <= 13 returned saved mean/var in training; inference graphs only use the first output
            pass
        if op_type == "Upsample" or (op_type == "Resize" and opset < 11):
            mode = attrs.pop("mode", "nearest")
            scales = attrs.pop("scales", None)
            sc = inputs[1] if len(inputs) > 1 else self.const_input(np.asarray(scales, np.float32), f"{p.name}_scales")
            inputs = [inputs[0], None, sc]
            attrs = {"mode": "linear" if mode in ("linear", "bilinear") else mode,
                     "coordinate_transformation_mode": "asymmetric"}
            if attrs["mode"] == "nearest":
                attrs["nearest_mode"] = "floor"
            op_type = "Resize"
        if op_type in ("Softmax", "LogSoftmax", "Hardmax") and opset < 13:
            return self.old_softmax(p, op_type, inputs, attrs, where)
        return op_type, inputs, attrs

    def old_broadcast(self, p, inputs, broadcast, axis, where, only_1d=False):
        """Opset < 7 broadcasting aligns B with A starting at `axis`; numpy broadcasting aligns the ends.
        Unsqueeze B's trailing axes so both agree."""
        a, b = inputs[0], inputs[1]
        if not broadcast or axis is None or b is None:
            return inputs
        ra, rb = a.type.rank if a.type else None, b.type.rank if b.type else None
        if ra is None or rb is None:
            raise UnsupportedError(f"{where}: opset-{self.opset} broadcasting along axis {axis} needs known ranks")
        if only_1d and (rb != 1 or ra <= 2):
            return inputs
        axis = axis % ra if ra else 0
        trailing = ra - axis - rb
        if trailing <= 0:
            return inputs
        axes = self.const_input(np.arange(rb, rb + trailing, dtype=np.int64), f"{p.name}_bcast_axes")
        u = self.g.add_node("Unsqueeze", [b, axes], name=f"{p.name or p.op_type.lower()}_bcast").output
        return [a, u] + list(inputs[2:])

    def old_softmax(self, p, op_type, inputs, attrs, where):
        """Opset < 13 softmax flattens to 2-D at `axis` (default 1); same as the new op only on the last axis."""
        axis = attrs.pop("axis", 1)
        x = inputs[0]
        rank = x.type.rank if x.type is not None else None
        if rank is not None and (axis == -1 or axis % max(rank, 1) == rank - 1):
            return op_type, inputs, {"axis": -1}
        g = self.g
        base = p.name or op_type.lower()
        flat = g.add_node("Flatten", [x], {"axis": axis}, name=f"{base}_flatten").output
        sm = g.add_node(op_type, [flat], {"axis": -1}, name=f"{base}_2d").output
        shape = g.add_node("Shape", [x], name=f"{base}_shape").output
        return "Reshape", [sm, shape], {}


def from_onnx(model: onnx.ModelProto | str | os.PathLike) -> Graph:
    """Read an ONNX model (a ModelProto or a file path) into an aiacc Graph."""
    if not isinstance(model, onnx.ModelProto):
        model = load_model(model)
    if not model.HasField("graph"):
        raise ParseError("the ONNX model has no graph (an empty or truncated file?)")
    for imp in model.opset_import:
        newest = onnx.defs.onnx_opset_version()
        if imp.domain in ("", "ai.onnx") and imp.version > newest:
            raise UnsupportedError(f"the ONNX model imports the default domain at opset {imp.version}; the newest "
                                   f"opset this onnx {onnx.__version__} knows is {newest}")
    if model.graph.sparse_initializer:
        raise UnsupportedError("sparse initializers are not supported")
    return _Importer(model).run()


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """onnx.load with an aiacc error for unreadable files."""
    try:
        return onnx.load(os.fspath(path))
    except FileNotFoundError:
        raise
    except Exception as e:
        raise ParseError(f"{path}: not a readable ONNX model ({e})") from e


def load(path: str | os.PathLike) -> Graph:
    """Read an .onnx file into a Graph."""
    return from_onnx(load_model(path))


# ------------------------------------------------------------------------------------------------ export
def _value_info(v: Value) -> onnx.ValueInfoProto:
    t = v.type
    if t is None or t.dtype is None:
        return helper.make_empty_tensor_value_info(v.name) if t is None else \
            helper.make_tensor_value_info(v.name, TensorProto.UNDEFINED, None)
    shape = None if t.shape is None else [d for d in t.shape]
    return helper.make_tensor_value_info(v.name, numpy_to_onnx_dtype(t.dtype), shape)


_KIND_TO_TYPE = {"int": AttributeProto.INT, "float": AttributeProto.FLOAT, "string": AttributeProto.STRING,
                 "ints": AttributeProto.INTS, "floats": AttributeProto.FLOATS, "strings": AttributeProto.STRINGS,
                 "tensor": AttributeProto.TENSOR}


def _make_attr(node: Node, key: str, value: Any) -> AttributeProto:
    schema = node.schema
    kind = schema.attrs[key].kind if schema is not None and key in schema.attrs else None
    if isinstance(value, np.ndarray):
        return helper.make_attribute(key, numpy_helper.from_array(value))
    if kind == "float":
        value = float(value)
    elif kind == "floats":
        value = [float(x) for x in value]
    elif kind == "int":
        value = int(value)
    elif kind == "ints":
        value = [int(x) for x in value]
    if isinstance(value, (list, tuple)) and not value and kind is None:
        return helper.make_attribute(key, [], attr_type=AttributeProto.INTS)
    if kind is not None and isinstance(value, (list, tuple)):
        return helper.make_attribute(key, list(value), attr_type=_KIND_TO_TYPE[kind])
    return helper.make_attribute(key, value)


def _node_proto(node: Node) -> onnx.NodeProto:
    attrs = dict(node.attrs)
    if node.domain == "" and node.op == "Cast" and "to" in attrs:
        attrs["to"] = numpy_to_onnx_dtype(attrs["to"])
    if node.domain == "" and node.op == "Split" and "num_outputs" not in attrs and \
            (len(node.inputs) < 2 or node.inputs[1] is None):
        attrs["num_outputs"] = len(node.outputs)  # opset 18 needs sizes or num_outputs
    p = helper.make_node(node.op, ["" if v is None else v.name for v in node.inputs],
                         [v.name for v in node.outputs], name=node.name, domain=node.domain or None)
    for k in sorted(attrs):
        if node.domain == "" and node.op == "Cast" and k == "to":
            p.attribute.append(helper.make_attribute("to", int(attrs["to"])))
        else:
            p.attribute.append(_make_attr(node, k, attrs[k]))
    for raw in node.meta.get("onnx_attributes", ()):
        p.attribute.append(AttributeProto.FromString(raw))
    if node.meta.get("doc"):
        p.doc_string = node.meta["doc"]
    return p


def to_onnx(graph: Graph, *, opset: int | None = None, producer: str = "aiacc",
            value_info: bool = True, keep_fused: bool = False) -> onnx.ModelProto:
    """Write a Graph as an ONNX ModelProto.

    The default-domain opset is at least 18 (the form the registry follows) or higher where an op needs it
    (Gelu: 20). aiacc's fused ops are written as their decomposition into standard ops (so any ONNX runtime
    can run the model) unless `keep_fused`; fused ops without a decomposition and other domains keep their
    domain, imported at the version recorded in graph.opset_imports (1 if none). A value guard
    (aiacc::ValueGuard) has no ONNX form: UnsupportedError naming it.
    """
    if not keep_fused:
        graph, _ = decompose_fused(graph)
    refuse_guards(graph, "ONNX")  # a run-time value check ONNX cannot express: never dropped silently
    graph = without_input_checks(graph, "ONNX")  # checks of inputs the original refuses: left out, warned
    imports = dict(graph.opset_imports)
    default = max(imports.get("", 17), MIN_EXPORT_OPSET)
    for n in graph:
        if n.domain == "" and n.op == "Gelu":
            default = max(default, 20)
        if n.domain == "" and n.op == "Pad" and n.attrs.get("mode") == "wrap":
            default = max(default, 19)
        if n.domain == "" and n.op == "Resize" and n.attrs.get("coordinate_transformation_mode") == \
                "half_pixel_symmetric":
            default = max(default, 19)
    imports[""] = opset if opset is not None else default
    for n in graph:
        if n.domain and n.domain not in imports:
            imports[n.domain] = 1
    nodes = [_node_proto(n) for n in graph]
    inits = [numpy_helper.from_array(v.const, name) for name, v in graph.initializers.items()]
    inputs = [_value_info(v) for v in graph.inputs]
    outputs = [_value_info(v) for v in graph.outputs]
    vis = []
    if value_info:
        outset = {id(v) for v in graph.outputs}
        for n in graph:
            for v in n.outputs:
                if id(v) not in outset and v.type is not None and v.type.dtype is not None:
                    vis.append(_value_info(v))
    gp = helper.make_graph(nodes, graph.name, inputs, outputs, initializer=inits, value_info=vis,
                           doc_string=graph.doc or None)
    model = helper.make_model(gp, producer_name=producer,
                              opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(imports.items())])
    model.ir_version = min(model.ir_version, 10)  # onnxruntime accepts IR <= 10
    return model


def save(graph: Graph, path: str | os.PathLike, **kw: Any) -> None:
    """Write a Graph to an .onnx file (weights over 2 GB go to an external data file)."""
    model = to_onnx(graph, **kw)
    large = graph.constant_bytes() > 1_900_000_000
    onnx.save_model(model, os.fspath(path), save_as_external_data=large)
