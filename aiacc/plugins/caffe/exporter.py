"""aiacc IR graph -> Caffe net (NetParameter with blobs), wrapped in a CaffeModel.

Nodes are lowered to Caffe layers one by one in schedule order, each by its lowering in the table LAYERS
(filled by aiacc.plugins.caffe.export_ops), with a few look-ahead patterns that give the layers a Caffe
user would write:

- Flatten(axis=1) feeding only Gemm/MatMul disappears (InnerProduct flattens by itself);
- Mul by a per-channel constant followed by Add of one becomes one Scale layer with bias_term;
- BatchNormalization becomes BatchNorm (+ Scale when its scale/bias are not 1/0);
- a chain Mul/Add/Pow by scalars becomes one Power layer; Mul by a scalar feeding an Eltwise SUM becomes
  that bottom's coefficient;
- ReLU, Dropout, BatchNorm and Scale work in place (top == bottom) when nothing else reads the bottom.

Opaque nodes of the domain "caffe" (layers the importer kept as they were) come back unchanged. aiacc's
fused ops (domain "aiacc") are first decomposed into the ops they stand for. An op with no Caffe form
raises UnsupportedError naming the node.
"""
from __future__ import annotations

from google.protobuf import text_format

from aiacc.core.ir import Graph, Node, Value
from aiacc.core.passes.utils import const_value as _const  # initializer or Constant node data
from aiacc.core.translate import OpTable, decompose_fused
from aiacc.errors import UnsupportedError
from aiacc.plugins.caffe.importer import OPAQUE_DOMAIN
from aiacc.plugins.caffe.proto import array_to_blob
from aiacc.plugins.caffe.schema import pb

# IR op (domain "") -> lowering(exporter, node) adding its Caffe layer(s); filled by
# aiacc.plugins.caffe.export_ops (the plugin imports it; this module never does)
LAYERS = OpTable("caffe export")


class Exporter:
    def __init__(self, graph: Graph, name: str | None = None):
        self.g = graph
        self.net = pb.NetParameter()
        self.net.name = name or graph.name
        self.blob: dict[int, str] = {}  # id(value) -> Caffe blob name
        self.blob_values: dict[str, list[Value]] = {}
        self.done: set[int] = set()  # ids of nodes emitted or absorbed
        self.layer_names: set[str] = set()
        self.output_blobs: dict[int, str] = {}  # id(graph output value) -> the original net's blob name

    # -- helpers -----------------------------------------------------------------------------------
    def unsupported(self, node: Node, why: str) -> UnsupportedError:
        return UnsupportedError(f"node {node.name} ({node.qualified_op}) has no Caffe form: {why}")

    def bind(self, value: Value, blob: str) -> None:
        self.blob[id(value)] = blob
        self.blob_values.setdefault(blob, []).append(value)

    def blob_of(self, v: Value, node: Node) -> str:
        b = self.blob.get(id(v))
        if b is None:
            if _const(v) is not None:
                raise self.unsupported(node, f"its input %{v.name} is a constant; Caffe layers read constants "
                                             f"only as their own weights")
            raise self.unsupported(node, f"its input %{v.name} was not lowered to a Caffe blob")
        return b

    def single_use(self, v: Value) -> Node | None:
        """The one node reading v when that is all that reads it (and v is no graph output)."""
        users = v.users()
        if len(users) != 1 or len(v.uses) != 1 or v.is_graph_output:
            return None
        return users[0]

    def can_inplace(self, x: Value, node: Node) -> bool:
        """Whether `node` may overwrite x's blob: nothing else still reads any value living in that blob."""
        b = self.blob.get(id(x))
        if b is None or x.producer is None:
            return False  # graph inputs keep their blob
        for w in self.blob_values.get(b, []):
            if w.is_graph_output:
                return False
            if any(n is not node and id(n) not in self.done for n, _ in w.uses):
                return False
        return True

    def add_layer(self, type_: str, node: Node, bottoms: list[Value], tops: list[Value], *, inplace: bool = False,
                  name: str | None = None) -> pb.LayerParameter:
        layer = self.net.layer.add()
        base = name or node.name
        lname, k = base, 1
        while lname in self.layer_names:
            lname, k = f"{base}_{k}", k + 1
        self.layer_names.add(lname)
        layer.name = lname
        layer.type = type_
        layer.bottom.extend(self.blob_of(b, node) for b in bottoms)
        for t in tops:
            blob = layer.bottom[0] if inplace and self.can_inplace(bottoms[0], node) else t.name
            wanted = self.output_blobs.get(id(t))
            if wanted is not None and blob != wanted and wanted not in self.blob_values:
                blob = wanted  # a graph output keeps the original net's blob name (not a fused layer's)
            self.bind(t, blob)
            layer.top.append(blob)
        self.done.add(id(node))
        return layer

    # -- driver ------------------------------------------------------------------------------------
    def run(self):
        from aiacc.plugins.caffe.model import CaffeModel

        if not LAYERS:
            raise UnsupportedError("the Caffe lowerings are not loaded: import aiacc.plugins.caffe.export_ops "
                                   "(the Caffe plugin does) before using the exporter directly")
        for v in self.g.inputs:
            shape = [d if isinstance(d, int) else 1 for d in (v.shape or ())]
            if v.shape is None:
                raise UnsupportedError(f"graph input %{v.name} has no shape; a Caffe Input layer needs one")
            layer = self.net.layer.add()
            layer.name = v.name
            self.layer_names.add(v.name)
            layer.type = "Input"
            layer.top.append(v.name)
            layer.input_param.shape.add().dim.extend(shape)
            self.bind(v, v.name)
        # the original net's output blob names (the importer records them), by position
        names = self.g.meta.get("caffe_outputs")
        if names is not None and len(names) == len(self.g.outputs):
            self.output_blobs = {id(v): b for v, b in zip(self.g.outputs, names) if v.producer is not None}
        self._plan_flatten_aliases()
        for node in self.g:
            if id(node) in self.done:
                continue
            self.lower(node)
        outputs = []
        for v in self.g.outputs:
            outputs.append(self.blob_of(v, v.producer) if v.producer is not None else v.name)
        return CaffeModel(self.net, outputs=outputs, source=f"<exported {self.g.name}>")

    def _plan_flatten_aliases(self) -> None:
        """Flatten(axis=1) read only by InnerProduct-able nodes is dropped: InnerProduct flattens itself."""
        for node in self.g:
            if node.op == "Flatten" and node.domain == "" and node.attr("axis") == 1:
                users = node.output.users()
                if users and not node.output.is_graph_output and all(inner_product_weights(u) is not None and
                                                                     u.inputs[0] is node.output for u in users):
                    node.meta["caffe_alias"] = True

    # -- lowering ----------------------------------------------------------------------------------
    def lower(self, node: Node) -> None:
        if node.domain == OPAQUE_DOMAIN:
            return self._opaque(node)
        if node.domain != "":
            raise self.unsupported(node, "an op outside the ONNX domain (decompose fused ops before exporting)")
        if node.meta.get("caffe_alias"):
            self.bind(node.output, self.blob_of(node.inputs[0], node))
            self.done.add(id(node))
            return
        handler = LAYERS.get(node.op)
        if handler is None:
            raise self.unsupported(node, "no Caffe layer computes it")
        handler(self, node)

    def _opaque(self, node: Node) -> None:
        layer = self.net.layer.add()
        text_format.Parse(node.attrs["layer_param"], layer)
        nb = len(layer.bottom)
        for v in node.inputs[nb:]:
            if v is None or v.const is None:
                raise self.unsupported(node, "its weight inputs are no longer constants")
            array_to_blob(v.const, layer.blobs.add())
        original_bottoms, original_tops = list(layer.bottom), list(layer.top)
        del layer.bottom[:]
        layer.bottom.extend(self.blob_of(v, node) for v in node.inputs[:nb])
        del layer.top[:]
        for i, v in enumerate(node.outputs):
            blob = v.name
            top = original_tops[i] if i < len(original_tops) else None
            if top in original_bottoms:  # an in-place layer stays in place when nothing else reads the bottom
                j = original_bottoms.index(top)
                if self.can_inplace(node.inputs[j], node):
                    blob = layer.bottom[j]
            self.bind(v, blob)
            layer.top.append(blob)
        self.layer_names.add(layer.name)
        self.done.add(id(node))


def inner_product_weights(node: Node):
    """(W as (N, K), bias or None) when the node is an InnerProduct (a MatMul or Gemm by constant
    weights), else None."""
    if node.domain != "":
        return None
    if node.op == "MatMul":
        a, b = node.inputs
        bc = _const(b)
        if bc is None or bc.ndim != 2 or a.shape is None or len(a.shape) != 2:
            return None
        return bc.T, None
    if node.op != "Gemm":
        return None
    a, b = node.inputs[:2]
    c = node.inputs[2] if len(node.inputs) > 2 else None
    bc, cc = _const(b), _const(c)
    if bc is None or node.attr("transA") or node.attr("alpha") != 1.0 or (c is not None and cc is None):
        return None
    w = bc if node.attr("transB") else bc.T
    if cc is not None:
        if node.attr("beta") != 1.0 or cc.size != w.shape[0] or (cc.ndim == 2 and cc.shape[0] != 1):
            return None
        cc = cc.reshape(-1)
    return w, cc


def export_graph(graph: Graph, name: str | None = None):
    """Lower an IR graph to a CaffeModel (fused aiacc ops decomposed first; one without a decomposition
    is named by the UnsupportedError of the exporter)."""
    graph, _ = decompose_fused(graph)
    return Exporter(graph, name).run()
