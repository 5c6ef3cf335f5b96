"""Caffe net (NetParameter with blobs) -> aiacc IR graph.

Each Caffe layer becomes one or a few ONNX-semantics nodes. Blobs are Caffe's mutable named buffers;
the IR is SSA, so a layer that writes a blob it also reads (an in-place ReLU, BatchNorm, Scale...) defines
a new value: the first definition of blob `b` is the value `%b`, later ones are named after the layer that
wrote them. The net's outputs are the blobs no later layer reads (Caffe's rule), in the order they were
last written.

Each layer type's translator is registered in the table TRANSLATORS by aiacc.plugins.caffe.import_ops. A
layer type aiacc does not translate (or a configuration it cannot express) becomes an opaque node in
the domain "caffe" whose `layer_param` attribute holds the LayerParameter in text form (blobs become
initializer inputs after the bottoms), so the exporter can put the layer back unchanged. It runs through the
kernel registered for its type with `register_layer`, else aiacc's own numpy kernel (layer_kernels), else
OpenCV dnn (opencv_layer, which also gives its output shapes). A layer holding fields the schema does not
declare (kept as text by unknown_fields) stays opaque unless its translator reads them (FORK_FIELDS).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from google.protobuf import text_format

from aiacc.core.ir import Graph, TensorType, Value
from aiacc.core.translate import OpTable, Untranslatable, record_source
from aiacc.errors import AiaccError, GraphError, KernelError, ParseError, ShapeError, UnsupportedError, fallback
from aiacc.plugins.caffe.schema import pb
from aiacc.plugins.caffe.proto import blob_shape, blob_to_array, layer_phase_ok, legacy_inputs
from aiacc.plugins.caffe.unknown_fields import field_name

OPAQUE_DOMAIN = "caffe"

# Caffe layer type -> translator(ctx: LayerContext) -> [top values]; raises Untranslatable for a configuration
# the IR cannot express (the layer stays opaque). Filled by aiacc.plugins.caffe.import_ops (the plugin
# imports it; this module never does).
TRANSLATORS = OpTable("caffe layers")

# Caffe layer type -> {field name: message class}: the forks' parameter fields its translator reads from the
# layer's kept text (aiacc_unknown_text, see unknown_fields). A layer with any other kept field stays opaque.
FORK_FIELDS: dict[str, dict[str, Any]] = {}


# ------------------------------------------------------------------------------------------------
# user kernels for layer types aiacc does not know
# ------------------------------------------------------------------------------------------------
@dataclass
class CustomLayer:
    """A numpy implementation of a Caffe layer type: kernel(layer_param, *bottoms_then_blobs) -> top array(s);
    infer(layer_param, bottom_shapes) -> top shapes (optional: else found by running the kernel on zeros);
    blobs(layer_param, bottom_shapes) -> [(what, shape)] of the weight blobs it reads (optional: for
    CaffeModel.fill_random)."""

    kernel: Callable[..., Any]
    infer: Callable[..., Sequence[Sequence[int]]] | None = None
    blobs: Callable[..., Sequence[tuple[str, Sequence[int]]]] | None = None
    accepts: Callable[..., bool] | None = None  # which layers of the type it computes (default: all)


_CUSTOM: dict[str, CustomLayer] = {}  # the user's (register_layer)
# aiacc's own numpy kernels of the Caffe layer types that stay opaque and OpenCV cannot run (Threshold,
# Reduction, ArgMax, Tile, Embed, Clip, the forks' Upsample...), filled by aiacc.plugins.caffe.layer_kernels;
# a user's kernel for the same type comes first
BUILTIN_LAYERS: dict[str, CustomLayer] = {}
# opaque layer type -> blobs(layer_param, bottom_shapes) -> [(what, shape)] of the weight blobs it reads, for
# CaffeModel.fill_random on layers OpenCV runs (the SSD fork's Normalize scale); filled by layer_kernels
OPAQUE_BLOBS: dict[str, Callable[..., Sequence[tuple[str, Sequence[int]]]]] = {}


def custom_layer(layer_type: str, layer=None) -> CustomLayer | None:
    """The numpy kernel for an opaque layer: the user's for its type (register_layer), else aiacc's own
    where it computes that layer."""
    if layer_type in _CUSTOM:
        return _CUSTOM[layer_type]
    own = BUILTIN_LAYERS.get(layer_type)
    return own if own is not None and (own.accepts is None or layer is None or own.accepts(layer)) else None


def register_layer(layer_type: str, kernel: Callable[..., Any],
                   infer: Callable[..., Sequence[Sequence[int]]] | None = None) -> None:
    """Give aiacc a numpy kernel for a Caffe layer type it does not translate (e.g. a Python layer), so
    nets using it run on the reference executor. The layer still exports back unchanged."""
    _CUSTOM[layer_type] = CustomLayer(kernel, infer)


def unregister_layer(layer_type: str) -> None:
    _CUSTOM.pop(layer_type, None)


def opaque_kernel(node) -> Callable[..., Any] | None:
    """The executor kernel of an opaque Caffe node: the registered one, or one raising a clear error."""
    layer_text = node.attrs.get("layer_param", "")
    layer = pb.LayerParameter()
    text_format.Parse(layer_text, layer)
    custom = custom_layer(node.op, layer)
    reason = node.attrs.get("reason")
    if custom is None:
        def refuse(*_args):
            why = f" ({reason})" if reason else ""
            raise KernelError(f"Caffe layer {layer.name!r} of type {node.op!r} has no aiacc kernel{why}; "
                              f"register one with aiacc.plugins.caffe.register_layer({node.op!r}, kernel)")
        return refuse

    def run(*arrays):
        return custom.kernel(layer, *arrays)
    return run


def _unknown_source(v: Value):
    """The opaque node (a layer type aiacc does not know) an unknown shape comes from, if any: the first one
    on the way up whose own inputs all have known shapes (the cause, not a layer that only inherited it)."""
    seen, todo, found = set(), [v], None
    while todo:
        node = todo.pop().producer
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        unknown = [x for x in node.inputs if x is not None and x.shape is None]
        if node.is_opaque:
            found = found or node
            if not unknown:
                return node
        todo += unknown
    return found


def _why_unknown(node) -> str:
    """Why an opaque layer's tops have no shapes, for the error of a layer after it."""
    if node.op == "Python":
        return (f"a Python layer, whose code is not in the file: nothing here can run it or know its shapes; "
                f"register a kernel and shapes with aiacc.plugins.caffe.register_layer('Python', kernel, infer)")
    return (f"which neither aiacc nor OpenCV dnn can run here: register its kernel and shapes with "
            f"aiacc.plugins.caffe.register_layer({node.op!r}, kernel, infer)")


def int_list(values) -> list[int]:
    """A protobuf repeated field of integers as a list of Python ints."""
    return [int(v) for v in values]


def _strip_leading_ones(shape):
    shape = list(shape)
    while shape and shape[0] == 1:
        shape.pop(0)
    return shape


class Importer:
    """Translates one NetParameter (with its blobs merged in) into a Graph."""

    def __init__(self, net: pb.NetParameter, *, where: str = "<net>", weights_hint: str = "",
                 probe: bool = False):
        if not TRANSLATORS:
            raise UnsupportedError("the Caffe layer translators are not loaded: import aiacc.plugins.caffe.import_ops "
                                   "(CaffeModel and the Caffe plugin do) before using the importer directly")
        self.net = net
        self.probe = probe  # record the blob shapes layers expect instead of requiring blobs
        self.probed: list[tuple[pb.LayerParameter, list[tuple[str, list[int]]]]] = []
        self.where = where
        self.weights_hint = weights_hint
        self.g = Graph(net.name or "caffe_net")
        self.g.meta["framework"] = "caffe"
        self.blobs: dict[str, Value] = {}  # Caffe blob name -> its current value
        self.order: list[str] = []  # blob names by last write
        self.read: set[str] = set()  # blobs read since their last write

    # -- driver ------------------------------------------------------------------------------------
    def run(self) -> Graph:
        for name, shape in legacy_inputs(self.net, self.where):
            self._add_input(name, shape, None)
        self.active = [layer for layer in self.net.layer if layer_phase_ok(layer)]
        for pos, layer in enumerate(self.active):
            self.pos = pos
            self._layer(layer)
        outputs = [b for b in self.order if b not in self.read]
        if not outputs:
            raise GraphError(f"{self.where}: the net has no output (every blob is read by a later layer)")
        self.g.outputs = [self.blobs[b] for b in outputs]
        self.g.meta["caffe_outputs"] = outputs
        self.g.meta["caffe_blobs"] = {b: v.name for b, v in self.blobs.items()}  # each blob's final value
        self.g.verify()
        return self.g

    def read_later(self, blob: str) -> bool:
        """Whether a layer after the current one reads `blob`."""
        return any(blob in layer.bottom for layer in self.active[self.pos + 1:])

    def _add_input(self, name: str, shape, layer) -> None:
        where = f"layer {layer.name!r} (Input)" if layer is not None else f"{self.where}: input {name!r}"
        if shape is None:
            raise ShapeError(f"{where}: input blob {name!r} has no shape; give input_param {{ shape {{ dim: ... }} }}")
        if name in self.blobs:
            raise GraphError(f"{where}: blob {name!r} is defined twice")
        v = self.g.add_input(name, "float32", tuple(int(d) for d in shape))
        self._wrote(name, v)

    def _wrote(self, blob: str, value: Value) -> None:
        self.blobs[blob] = value
        if blob in self.order:
            self.order.remove(blob)
        self.order.append(blob)
        self.read.discard(blob)

    def _bottoms(self, layer) -> list[Value]:
        out = []
        for b in layer.bottom:
            v = self.blobs.get(b)
            if v is None:
                known = ", ".join(sorted(self.blobs)) or "none"
                raise GraphError(f"layer {layer.name!r} ({layer.type}): bottom {b!r} is not produced by any "
                                 f"earlier layer or net input (blobs so far: {known})")
            out.append(v)
        return out

    def _layer(self, layer: pb.LayerParameter) -> None:
        if not layer.name:
            raise ParseError(f"{self.where}: a layer of type {layer.type!r} has no name")
        if layer.type == "Input":
            shapes = list(layer.input_param.shape)
            if shapes and len(shapes) not in (1, len(layer.top)):
                raise ShapeError(f"layer {layer.name!r} (Input): {len(layer.top)} tops but {len(shapes)} shapes")
            for i, top in enumerate(layer.top):
                shape = None if not shapes else int_list((shapes[i] if len(shapes) > 1 else shapes[0]).dim)
                self._add_input(top, shape, layer)
            return
        bottoms = self._bottoms(layer)
        translate = TRANSLATORS.get(layer.type)
        outs = None
        start = self.g.checkpoint()  # for the view: every node made from this layer records it
        unknown = [field_name(t) for t in layer.aiacc_unknown_text]
        foreign = [f for f in unknown if f not in FORK_FIELDS.get(layer.type, {})]
        if foreign:  # what the schema lacks may change what the layer computes: the runtime at hand reads it
            outs = self._opaque(layer, bottoms, reason=f"fields aiacc's Caffe schema does not declare: "
                                                       f"{', '.join(dict.fromkeys(foreign))}", opencv=True)
        elif translate is not None:
            mark = self.g.checkpoint()
            try:
                outs = translate(LayerContext(self, layer, bottoms))
            except Untranslatable as e:
                self.g.rollback(mark)  # the nodes and constants it added so far: the layer turns opaque instead
                outs = self._opaque(layer, bottoms, reason=str(e))
        else:
            outs = self._opaque(layer, bottoms)
        record_source(self.g, start, f"{layer.name} ({layer.type})")
        for b in layer.bottom:
            self.read.add(b)
        if len(outs) != len(layer.top):
            raise GraphError(f"layer {layer.name!r} ({layer.type}): produces {len(outs)} blobs but names "
                             f"{len(layer.top)} tops")
        for top, v in zip(layer.top, outs):
            self._wrote(top, v)

    def _opaque(self, layer, bottoms: list[Value], reason: str | None = None, opencv: bool = False) -> list[Value]:
        """Keep the layer as it is: an opaque node carrying its LayerParameter."""
        bare = pb.LayerParameter()
        bare.CopyFrom(layer)
        del bare.blobs[:]
        inputs = list(bottoms)
        for i, blob in enumerate(layer.blobs):
            inputs.append(self.g.add_initializer(f"{layer.name}/blob{i}",
                                                 blob_to_array(blob, f"layer {layer.name!r}")))
        attrs = {"layer_param": text_format.MessageToString(bare)}
        if reason:
            attrs["reason"] = reason
        custom = custom_layer(layer.type, layer)
        types = [None] * len(layer.top)
        cv_kernel = None
        if self.probe and not layer.blobs and custom is None and layer.type in OPAQUE_BLOBS:
            inputs += self._custom_blobs(layer, CustomLayer(None, blobs=OPAQUE_BLOBS[layer.type]), bottoms)
        if custom is not None:
            if custom.blobs is not None and not layer.blobs:
                inputs += self._custom_blobs(layer, custom, bottoms)
            types = self._custom_types(layer, custom, inputs, len(layer.top))
        elif reason is None or opencv:  # a type no rule knows (not one whose translator refused a setting)
            types, cv_kernel = self._opencv_layer(layer, bottoms, types)
        names = [self._out_name(top, layer, i) for i, top in enumerate(layer.top)]
        node = self.g.add_opaque(layer.type, inputs, domain=OPAQUE_DOMAIN, name=layer.name, outputs=names,
                                 output_types=types, attrs=attrs, meta={"caffe_layer": layer.name})
        node.meta["kernel"] = cv_kernel or opaque_kernel(node)  # reads the node's attrs
        return list(node.outputs)

    def _opencv_layer(self, layer, bottoms: list[Value], types):
        """Output types and a kernel for a layer no rule knows, from OpenCV dnn (opencv_layer): its own
        shape inference and a one-layer net. Without OpenCV, or bottoms of unknown shapes, none."""
        from aiacc.plugins.caffe import opencv_layer

        shapes = [v.shape for v in bottoms]
        if not opencv_layer.available() or any(s is None or not all(isinstance(d, int) for d in s) for s in shapes):
            return types, None
        try:
            outs = opencv_layer.output_shapes(layer, shapes)
            run = opencv_layer.kernel(layer, shapes)
        except ShapeError as e:
            fallback(f"caffe.opencv:{layer.type}", f"{e}; its tops have unknown shapes")
            return types, None
        if len(outs) < len(layer.top):
            return types, None
        # OpenCV may declare optional outputs the layer does not name (Proposal's scores): the first ones
        outs = outs[:len(layer.top)]
        return [TensorType("float32", s) for s in outs], lambda *arrays: run(*arrays[:len(bottoms)])

    def _custom_blobs(self, layer, custom: CustomLayer, bottoms: list[Value]) -> list[Value]:
        """The weight blobs a builtin kernel reads, for a layer that has none: in probe mode (fill_random)
        recorded and given as ones; else a clear error, as for a translated layer."""
        shapes = [v.shape for v in bottoms]
        if any(s is None for s in shapes):
            return []
        expected = [(w, [int(d) for d in s]) for w, s in custom.blobs(layer, [list(s) for s in shapes])]
        if not expected:
            return []
        if not self.probe:
            what = ", ".join(f"{w} {s}" for w, s in expected)
            raise ShapeError(f"layer {layer.name!r} ({layer.type}): needs {len(expected)} weight blob(s) ({what}) "
                             f"but has 0{self.weights_hint}")
        self.probed.append((layer, expected))
        return [self.g.add_initializer(f"{layer.name}/blob{i}", np.ones(s, np.float32))
                for i, (_, s) in enumerate(expected)]

    def _custom_types(self, layer, custom: CustomLayer, inputs: list[Value], n_out: int):
        shapes = [v.shape for v in inputs]
        if any(s is None or not all(isinstance(d, int) for d in s) for s in shapes):
            return [None] * n_out
        try:
            if custom.infer is not None:
                outs = custom.infer(layer, [list(s) for s in shapes[:len(layer.bottom)]])
                return [TensorType("float32", tuple(int(d) for d in s)) for s in outs]
            arrays = [v.const if v.const is not None else np.zeros(v.shape, np.float32) for v in inputs]
            outs = custom.kernel(layer, *arrays)
            outs = outs if isinstance(outs, (list, tuple)) else [outs]
            return [TensorType(np.asarray(o).dtype.name, np.asarray(o).shape) for o in outs]
        except AiaccError:
            raise
        except Exception as e:
            raise KernelError(f"layer {layer.name!r} ({layer.type}): the registered kernel failed while "
                              f"inferring output shapes: {e}") from e

    def _out_name(self, top: str, layer, i: int) -> str:
        """A top's value name: the blob name on its first definition, else the layer's name."""
        if not self.g.has_value(top):
            return top
        base = layer.name if len(layer.top) == 1 else f"{layer.name}_{i}"
        return self.g.fresh_name(base)


class LayerContext:
    """What a layer translator works with: the layer, its bottoms, helpers to add nodes and blobs."""

    def __init__(self, imp: Importer, layer: pb.LayerParameter, bottoms: list[Value]):
        self.imp = imp
        self.g = imp.g
        self.layer = layer
        self.bottoms = bottoms

    @property
    def name(self) -> str:
        return self.layer.name

    def fail(self, message: str, cls=ShapeError) -> AiaccError:
        return cls(f"layer {self.layer.name!r} ({self.layer.type}): {message}")

    def x(self, i: int = 0) -> Value:
        return self.bottoms[i]

    def shape(self, i: int = 0) -> list[int]:
        s = self.bottoms[i].shape
        if s is None or not all(isinstance(d, int) for d in s):
            made = _unknown_source(self.bottoms[i]) if s is None else None
            why = f" (it comes from layer {made.name!r} of type {made.op!r}, {_why_unknown(made)})" if made is not None else ""
            raise self.fail(f"bottom {self.layer.bottom[i]!r} has an unknown shape {s}{why}")
        return list(s)

    def maybe_shape(self, i: int = 0) -> list | None:
        """The bottom's shape where known (it may hold symbols), else None."""
        s = self.bottoms[i].shape
        return None if s is None else list(s)

    def need_bottoms(self, lo: int, hi: int | None = None) -> None:
        n = len(self.bottoms)
        hi = lo if hi is None else hi
        if not lo <= n <= hi:
            want = str(lo) if lo == hi else f"{lo} to {hi}"
            raise self.fail(f"takes {want} bottoms, got {n}", GraphError)
        if len(self.layer.top) != 1 and self.layer.type not in ("Slice", "Split"):
            raise self.fail(f"has {len(self.layer.top)} tops, expected 1", GraphError)

    def blobs(self, expected: list[tuple[str, list[int] | None]], required: int | None = None) -> list[np.ndarray]:
        """The layer's blobs as arrays, checked against the shapes the prototxt implies."""
        layer = self.layer
        required = len(expected) if required is None else required
        n = len(layer.blobs)
        if self.imp.probe and n == 0:
            self.imp.probed.append((layer, [(w, list(s)) for w, s in expected]))
            return [np.ones(s, np.float32) for _, s in expected]
        if n < required:
            what = ", ".join(f"{w} {s}" for w, s in expected[:required])
            hint = self.imp.weights_hint
            raise self.fail(f"needs {required} weight blob(s) ({what}) but has {n}{hint}")
        if n > len(expected):
            raise self.fail(f"has {n} blobs, expected at most {len(expected)} "
                            f"({', '.join(w for w, _ in expected)})")
        out = []
        for i, (blob, (what, want)) in enumerate(zip(layer.blobs, expected)):
            a = blob_to_array(blob, f"layer {layer.name!r}")
            if want is not None and list(a.shape) != list(want):
                shape, legacy = blob_shape(blob)
                if legacy and a.size == int(np.prod(want)) and _strip_leading_ones(shape) == _strip_leading_ones(want):
                    a = a.reshape(want)  # legacy 4-d blob such as (1, 1, 1, C) for a (C,) bias
                else:
                    raise self.fail(f"blob {i} ({what}) has shape {list(a.shape)} in the caffemodel, but the "
                                    f"prototxt implies {list(want)}")
            out.append(a)
        return out

    def fork_param(self, field: str):
        """The fork's parameter message `field` (declared in FORK_FIELDS for this layer type) parsed from the
        layer's kept text; a default message when the layer does not give it."""
        cls = FORK_FIELDS[self.layer.type][field]
        msg = cls()
        for kept in self.layer.aiacc_unknown_text:
            if field_name(kept) == field:
                body = kept.strip()[len(field):].lstrip().lstrip(":").strip()
                try:
                    text_format.Parse(body[1:-1] if body.startswith("{") else body, msg)
                except text_format.ParseError as e:
                    raise self.fail(f"{field}: {e}", ParseError) from None
        return msg

    def const(self, array, what: str) -> Value:
        v = self.g.add_initializer(f"{self.layer.name}/{what}", np.asarray(array))
        return v

    def scalar(self, value: float, what: str, dtype=np.float32) -> Value:
        return self.const(np.asarray(value, dtype=dtype), what)

    def inner(self, op: str, *inputs: Value | None, sub: str, **attrs) -> Value:
        """An intermediate node of this layer's expansion."""
        node = self.g.add_node(op, inputs, attrs, name=f"{self.layer.name}/{sub}")
        node.meta["caffe_layer"] = self.layer.name
        return node.output

    def final(self, op: str, *inputs: Value | None, n_out: int = 1, **attrs) -> list[Value]:
        """The node that defines the layer's tops."""
        names = [self.imp._out_name(top, self.layer, i) for i, top in enumerate(self.layer.top)][:n_out] \
            if len(self.layer.top) >= n_out else [f"{self.layer.name}_{i}" for i in range(n_out)]
        node = self.g.add_node(op, inputs, attrs, name=self.layer.name, outputs=names)
        node.meta["caffe_layer"] = self.layer.name
        return list(node.outputs)


def expected_blob_shapes(net: pb.NetParameter) -> list[tuple[pb.LayerParameter, list[tuple[str, list[int]]]]]:
    """For every layer of `net` lacking blobs: (layer, [(what, shape)...]) of the blobs it needs."""
    imp = Importer(net, probe=True)
    imp.run()
    return imp.probed


def import_net(net: pb.NetParameter, *, where: str = "<net>", weights_hint: str = "") -> Graph:
    """Translate a Caffe net (its blobs merged in) into an IR graph."""
    return Importer(net, where=where, weights_hint=weights_hint).run()
