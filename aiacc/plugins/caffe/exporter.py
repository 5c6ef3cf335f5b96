"""aiacc IR graph -> Caffe net (NetParameter with blobs), wrapped in a CaffeModel.

Nodes are lowered to Caffe layers one by one in schedule order, with a few look-ahead patterns that give
the layers a Caffe user would write:

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

import numpy as np
from google.protobuf import text_format

from aiacc.core.ir import Graph, Node, Value
from aiacc.core.ops.nn import window_params
from aiacc.core.ops.shape_utils import conv_output_size
from aiacc.core.passes.utils import const_value as _const  # initializer or Constant node data
from aiacc.errors import UnsupportedError
from aiacc.plugins.caffe.schema import pb
from aiacc.plugins.caffe.importer import OPAQUE_DOMAIN
from aiacc.plugins.caffe.proto import array_to_blob


def caffe_pool_size(size: int, kernel: int, stride: int, pad: int, ceil: bool = True) -> int:
    """Caffe's pooled size: rounded up (by default), minus a last window that would start in the padding."""
    span = size + 2 * pad - kernel
    out = (-(-span // stride) if ceil else span // stride) + 1
    if pad and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _static(v: Value) -> list[int] | None:
    s = v.shape
    if s is None or not all(isinstance(d, int) for d in s):
        return None
    return list(s)


def _set_dims(p, field: str, values: list[int], two_d: bool, h: str | None = None, w: str | None = None,
              default: int | None = None, repeated: bool = True) -> None:
    """Write kernel/pad/stride/dilation the way Caffe files usually do: one value when all are equal."""
    if default is not None and all(v == default for v in values):
        return
    if len(set(values)) == 1:
        if repeated:
            getattr(p, field).append(values[0])
        else:
            setattr(p, field, values[0])
    elif two_d and h is not None:
        setattr(p, h, values[0])
        setattr(p, w, values[1])
    elif repeated:
        getattr(p, field).extend(values)
    else:
        raise ValueError(f"{field} differs per axis")


class Exporter:
    def __init__(self, graph: Graph, name: str | None = None):
        self.g = graph
        self.net = pb.NetParameter()
        self.net.name = name or graph.name
        self.blob: dict[int, str] = {}  # id(value) -> Caffe blob name
        self.blob_values: dict[str, list[Value]] = {}
        self.done: set[int] = set()  # ids of nodes emitted or absorbed
        self.layer_names: set[str] = set()

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
            self.bind(t, blob)
            layer.top.append(blob)
        self.done.add(id(node))
        return layer

    # -- driver ------------------------------------------------------------------------------------
    def run(self):
        from aiacc.plugins.caffe.model import CaffeModel

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
                if users and not node.output.is_graph_output and all(self._ip_weights(u) is not None and
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
        handler = getattr(self, f"_op_{node.op}", None)
        if handler is None:
            raise self.unsupported(node, "no Caffe layer computes it")
        handler(node)

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

    # convolution ----------------------------------------------------------------------------------
    def _conv_param(self, node: Node, layer: pb.LayerParameter, w: np.ndarray, num_output: int) -> None:
        x = node.inputs[0]
        kernel = list(node.attr("kernel_shape") or w.shape[2:])
        n = len(kernel)
        spatial = (x.shape or [None] * (n + 2))[2:]
        if node.op == "ConvTranspose":
            if node.attr("output_shape") is not None or any(node.attr("output_padding") or []) \
                    or (node.attr("auto_pad") or "NOTSET") != "NOTSET":
                raise self.unsupported(node, "output_shape, output_padding and auto_pad have no Caffe form")
            strides = list(node.attr("strides") or [1] * n)
            dilations = list(node.attr("dilations") or [1] * n)
            pads = list(node.attr("pads") or [0] * (2 * n))
        else:
            try:
                strides, dilations, pads = window_params(spatial, kernel, node.attrs)
            except ValueError as e:
                raise self.unsupported(node, str(e)) from None
            if pads is None:
                raise self.unsupported(node, "auto_pad needs a static input shape")
        if pads[:n] != pads[n:]:
            raise self.unsupported(node, f"asymmetric pads {pads}")
        p = layer.convolution_param
        p.num_output = num_output
        two_d = n == 2
        _set_dims(p, "kernel_size", kernel, two_d, "kernel_h", "kernel_w")
        _set_dims(p, "pad", pads[:n], two_d, "pad_h", "pad_w", default=0)
        _set_dims(p, "stride", strides, two_d, "stride_h", "stride_w", default=1)
        _set_dims(p, "dilation", dilations, False, default=1)
        if node.attr("group", 1) != 1:
            p.group = int(node.attr("group"))

    def _op_Conv(self, node: Node) -> None:
        x, w, b = (list(node.inputs) + [None])[:3]
        wc, bc = _const(w), _const(b)
        if wc is None or (b is not None and bc is None):
            raise self.unsupported(node, "weights and bias must be constants")
        layer = self.add_layer("Convolution", node, [x], node.outputs)
        self._conv_param(node, layer, wc, int(wc.shape[0]))
        layer.convolution_param.bias_term = bc is not None
        array_to_blob(wc, layer.blobs.add())
        if bc is not None:
            array_to_blob(bc, layer.blobs.add())

    def _op_ConvTranspose(self, node: Node) -> None:
        x, w, b = (list(node.inputs) + [None])[:3]
        wc, bc = _const(w), _const(b)
        if wc is None or (b is not None and bc is None):
            raise self.unsupported(node, "weights and bias must be constants")
        layer = self.add_layer("Deconvolution", node, [x], node.outputs)
        self._conv_param(node, layer, wc, int(wc.shape[1]) * int(node.attr("group", 1)))
        layer.convolution_param.bias_term = bc is not None
        array_to_blob(wc, layer.blobs.add())
        if bc is not None:
            array_to_blob(bc, layer.blobs.add())

    # pooling --------------------------------------------------------------------------------------
    def _pool(self, node: Node, method) -> None:
        if len(node.outputs) > 1 and node.outputs[1].uses:
            raise self.unsupported(node, "the argmax indices output")
        x = node.inputs[0]
        shape = _static(x)
        kernel = list(node.attr("kernel_shape"))
        if len(kernel) != 2 or (x.shape is not None and len(x.shape) != 4):
            raise self.unsupported(node, "Caffe pools 4-d inputs over 2 axes")
        ceil = bool(node.attr("ceil_mode"))
        is_ave = method == pb.PoolingParameter.AVE
        if shape is None:
            # unknown sizes (after an opaque layer): only the form the importer writes is known to match
            if (node.attr("auto_pad") or "NOTSET") != "NOTSET":
                raise self.unsupported(node, "auto_pad on an input of unknown size")
            strides = list(node.attr("strides") or [1, 1])
            dilations = list(node.attr("dilations") or [1, 1])
            pads = list(node.attr("pads") or [0] * 4)
            if pads[:2] != pads[2:] or (is_ave and any(pads) and not node.attr("count_include_pad")):
                raise self.unsupported(node, f"pads {pads} on an input of unknown size")
            round_mode = pb.PoolingParameter.CEIL if ceil else pb.PoolingParameter.FLOOR
        else:
            strides, dilations, pads = window_params(shape[2:], kernel, node.attrs)
            want = [conv_output_size(shape[2 + i], kernel[i], strides[i], pads[i], pads[2 + i], 1, ceil)
                    for i in range(2)]
            round_mode = pb.PoolingParameter.CEIL
            got = [caffe_pool_size(shape[2 + i], kernel[i], strides[i], pads[i]) for i in range(2)]
            if got != want:
                floor = [caffe_pool_size(shape[2 + i], kernel[i], strides[i], pads[i], ceil=False) for i in range(2)]
                if floor != want:
                    raise self.unsupported(node, f"pads {pads} give {want} outputs, Caffe's symmetric padding {got}")
                round_mode = pb.PoolingParameter.FLOOR
            if is_ave:
                if pads[:2] != pads[2:]:
                    raise self.unsupported(node, f"average pooling with asymmetric pads {pads}")
                if any(pads) and not node.attr("count_include_pad"):
                    raise self.unsupported(node, "Caffe's average pooling counts the padding (count_include_pad=0)")
        if any(d != 1 for d in dilations):
            raise self.unsupported(node, "dilated pooling")
        begin = pads[:2]
        layer = self.add_layer("Pooling", node, [x], node.outputs[:1])
        p = layer.pooling_param
        p.pool = method
        if kernel[0] == kernel[1]:
            p.kernel_size = kernel[0]
        else:
            p.kernel_h, p.kernel_w = kernel
        if begin[0] == begin[1]:
            if begin[0]:
                p.pad = begin[0]
        else:
            p.pad_h, p.pad_w = begin
        if strides[0] == strides[1]:
            if strides[0] != 1:
                p.stride = strides[0]
        else:
            p.stride_h, p.stride_w = strides
        if round_mode != pb.PoolingParameter.CEIL:
            p.round_mode = round_mode  # BVLC Caffe reads it; OpenCV's schema does not know this field

    def _op_MaxPool(self, node: Node) -> None:
        self._pool(node, pb.PoolingParameter.MAX)

    def _op_AveragePool(self, node: Node) -> None:
        self._pool(node, pb.PoolingParameter.AVE)

    def _global_pool(self, node: Node, method) -> None:
        if _static(node.inputs[0]) is None or len(node.inputs[0].shape) != 4:
            raise self.unsupported(node, "Caffe pools 4-d inputs")
        layer = self.add_layer("Pooling", node, [node.inputs[0]], node.outputs)
        layer.pooling_param.pool = method
        layer.pooling_param.global_pooling = True

    def _op_GlobalMaxPool(self, node: Node) -> None:
        self._global_pool(node, pb.PoolingParameter.MAX)

    def _op_GlobalAveragePool(self, node: Node) -> None:
        self._global_pool(node, pb.PoolingParameter.AVE)

    # inner product --------------------------------------------------------------------------------
    def _ip_weights(self, node: Node):
        """(W as (N, K), bias or None) when the node is an InnerProduct, else None."""
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

    def _ip(self, node: Node) -> None:
        found = self._ip_weights(node)
        if found is None:
            raise self.unsupported(node, "InnerProduct needs constant weights (and bias), alpha=beta=1, "
                                         "no transA, a 2-d input")
        w, b = found
        layer = self.add_layer("InnerProduct", node, [node.inputs[0]], node.outputs)
        p = layer.inner_product_param
        p.num_output = int(w.shape[0])
        p.bias_term = b is not None
        array_to_blob(w, layer.blobs.add())
        if b is not None:
            array_to_blob(b, layer.blobs.add())

    _op_Gemm = _ip
    _op_MatMul = _ip

    # activations ----------------------------------------------------------------------------------
    def _op_Relu(self, node: Node) -> None:
        self.add_layer("ReLU", node, [node.inputs[0]], node.outputs, inplace=True)

    def _op_LeakyRelu(self, node: Node) -> None:
        layer = self.add_layer("ReLU", node, [node.inputs[0]], node.outputs, inplace=True)
        layer.relu_param.negative_slope = float(node.attr("alpha"))

    def _op_Sigmoid(self, node: Node) -> None:
        self.add_layer("Sigmoid", node, [node.inputs[0]], node.outputs)

    def _op_Tanh(self, node: Node) -> None:
        self.add_layer("TanH", node, [node.inputs[0]], node.outputs)

    def _op_Elu(self, node: Node) -> None:
        layer = self.add_layer("ELU", node, [node.inputs[0]], node.outputs)
        if node.attr("alpha") != 1.0:
            layer.elu_param.alpha = float(node.attr("alpha"))

    def _op_PRelu(self, node: Node) -> None:
        x, slope = node.inputs
        s = _const(slope)
        shape = _static(x)
        if s is None or shape is None:
            raise self.unsupported(node, "PReLU needs a constant slope and a static input shape")
        if s.size == 1:
            blob, shared = s.reshape(1), True
        else:
            full = (1,) * (len(shape) - s.ndim) + s.shape
            if len(shape) < 2 or full[1] != shape[1] or any(d != 1 for i, d in enumerate(full) if i != 1):
                raise self.unsupported(node, f"slope of shape {list(s.shape)} is not per channel")
            blob, shared = s.reshape(-1), False
        layer = self.add_layer("PReLU", node, [x], node.outputs)
        if shared:
            layer.prelu_param.channel_shared = True
        array_to_blob(blob, layer.blobs.add())

    def _op_Softmax(self, node: Node) -> None:
        layer = self.add_layer("Softmax", node, [node.inputs[0]], node.outputs)
        axis = int(node.attr("axis"))
        if axis != 1:
            layer.softmax_param.axis = axis

    def _op_Dropout(self, node: Node) -> None:
        if len(node.outputs) > 1 and node.outputs[1].uses:
            raise self.unsupported(node, "the dropout mask output")
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            t = _const(node.inputs[2])
            if t is None or bool(t):
                raise self.unsupported(node, "training-mode dropout")
        ratio = _const(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        layer = self.add_layer("Dropout", node, [node.inputs[0]], node.outputs[:1], inplace=True)
        if ratio is not None and float(ratio) != 0.5:
            layer.dropout_param.dropout_ratio = float(ratio)

    def _op_Identity(self, node: Node) -> None:
        self.bind(node.output, self.blob_of(node.inputs[0], node))
        self.done.add(id(node))

    def _op_LRN(self, node: Node) -> None:
        layer = self.add_layer("LRN", node, [node.inputs[0]], node.outputs)
        p = layer.lrn_param
        p.local_size = int(node.attr("size"))
        p.alpha = float(node.attr("alpha"))
        p.beta = float(node.attr("beta"))
        p.k = float(node.attr("bias"))

    # normalization and per-channel arithmetic -----------------------------------------------------
    def _op_BatchNormalization(self, node: Node) -> None:
        if node.attr("training_mode") or any(v.uses or v.is_graph_output for v in node.outputs[1:]):
            raise self.unsupported(node, "training-mode batch normalization")
        x = node.inputs[0]
        scale, bias, mean, var = (_const(v) for v in node.inputs[1:5])
        if any(a is None for a in (scale, bias, mean, var)):
            raise self.unsupported(node, "scale, bias, mean and variance must be constants")
        plain = bool(np.all(scale == 1) and np.all(bias == 0))
        out = node.outputs[0]
        bn = self.add_layer("BatchNorm", node, [x], [out], inplace=True)
        if node.attr("epsilon") != 1e-5:
            bn.batch_norm_param.eps = float(node.attr("epsilon"))
        for a in (mean, var, np.ones(1, np.float32)):
            array_to_blob(a, bn.blobs.add())
        if not plain:
            layer = self.net.layer.add()
            layer.name = self._unique(f"{node.name}/scale")
            layer.type = "Scale"
            layer.bottom.append(bn.top[0])
            layer.top.append(bn.top[0])
            layer.scale_param.bias_term = True
            array_to_blob(scale, layer.blobs.add())
            array_to_blob(bias, layer.blobs.add())

    def _unique(self, base: str) -> str:
        name, k = base, 1
        while name in self.layer_names:
            name, k = f"{base}_{k}", k + 1
        self.layer_names.add(name)
        return name

    @staticmethod
    def _param_layout(x_shape: list[int], c: np.ndarray):
        """(axis, blob array) for a constant that broadcasts against x like a Caffe Scale/Bias parameter
        (its non-1 dims one contiguous run matching x's), ("scalar", value) for a scalar, else None."""
        if c.size == 1:
            return "scalar", float(c.reshape(-1)[0])
        r = len(x_shape)
        if c.ndim > r:
            return None
        full = [1] * (r - c.ndim) + list(c.shape)
        idx = [i for i, d in enumerate(full) if d != 1]
        a, e = idx[0], idx[-1]
        if any(full[i] != x_shape[i] for i in range(a, e + 1)):
            return None
        return a, c.reshape(full[a:e + 1])

    def _scalar_operand(self, node: Node):
        """(dynamic input, scalar value) of a binary node with one scalar constant operand, else None."""
        if node.domain != "" or len(node.inputs) != 2:
            return None
        a, b = node.inputs
        ca, cb = _const(a), _const(b)
        if cb is not None and ca is None and cb.size == 1:
            return a, float(cb.reshape(-1)[0])
        if node.op in ("Mul", "Add") and ca is not None and cb is None and ca.size == 1:
            return b, float(ca.reshape(-1)[0])
        return None

    def _power_chain(self, node: Node) -> None:
        """Mul/Add/Sub/Div/Pow by scalars, in the order scale -> shift -> power, as one Power layer."""
        stage = {"Mul": 0, "Div": 0, "Add": 1, "Sub": 1, "Pow": 2}
        scale, shift, power = 1.0, 0.0, 1.0
        x = self._scalar_operand(node)[0]
        cur, last = node, -1
        chain = []
        while True:
            operand = self._scalar_operand(cur) if cur.op in stage else None
            if operand is None or stage[cur.op] <= last or (chain and operand[0] is not chain[-1].output):
                break
            value = operand[1]
            if cur.op == "Mul":
                scale = value
            elif cur.op == "Div":
                scale = 1.0 / value
            elif cur.op == "Add":
                shift = value
            elif cur.op == "Sub":
                shift = -value
            else:
                power = value
            chain.append(cur)
            last = stage[cur.op]
            nxt = self.single_use(cur.output)
            if nxt is None:
                break
            cur = nxt
        end = chain[-1]
        layer = self.add_layer("Power", node, [x], end.outputs)
        for n in chain:
            self.done.add(id(n))
        p = layer.power_param
        if power != 1.0:
            p.power = power
        if scale != 1.0:
            p.scale = scale
        if shift != 0.0:
            p.shift = shift

    def _binary_const(self, node: Node) -> bool:
        """Mul/Add/Sub/Div with one constant operand as Scale/Bias/Power; False when no constant."""
        a, b = node.inputs
        ca, cb = _const(a), _const(b)
        if ca is None and cb is None:
            return False
        if ca is not None and cb is not None:
            raise self.unsupported(node, "both operands are constants (fold them first)")
        if ca is not None and node.op in ("Sub", "Div"):
            raise self.unsupported(node, "a constant divided by or minus a tensor")
        x, c = (b, ca) if ca is not None else (a, cb)
        shape = _static(x)
        if shape is None:
            raise self.unsupported(node, "needs a static input shape")
        if c.size == 1:
            self._power_chain(node)
            return True
        if node.op == "Sub":
            c = -c
        if node.op == "Div":
            c = (1.0 / c.astype(np.float64)).astype(np.float32)
        layout = self._param_layout(shape, c)
        out_shape = _static(node.output)
        if layout is None or out_shape != shape:
            raise self.unsupported(node, f"constant of shape {list(c.shape)} does not broadcast per Caffe's "
                                         f"Scale/Bias rules against {shape}")
        axis, blob = layout
        is_scale = node.op in ("Mul", "Div")
        bias_node, bias_blob = None, None
        if is_scale:
            nxt = self.single_use(node.output)
            if nxt is not None and nxt.op in ("Add", "Sub") and nxt.domain == "":
                other = nxt.inputs[1] if nxt.inputs[0] is node.output else nxt.inputs[0]
                oc = _const(other)
                if oc is not None and not (nxt.op == "Sub" and other is nxt.inputs[0]):
                    oc = -oc if nxt.op == "Sub" else oc
                    full = np.broadcast_to(oc, shape) if oc.size == 1 else oc
                    lay = self._param_layout(shape, np.asarray(full)) if oc.size != 1 else (axis, np.full(
                        blob.shape, float(oc.reshape(-1)[0]), np.float32))
                    if lay is not None and lay[0] == axis and lay[1].shape == blob.shape:
                        bias_node, bias_blob = nxt, lay[1]
        if not is_scale:
            # a lone bias: Scale with unit scale and bias_term, which OpenCV dnn runs (it has no Bias layer)
            bias_blob, blob = blob, np.ones(blob.shape, np.float32)
            is_scale = True
        tops = bias_node.outputs if bias_node is not None else node.outputs
        layer = self.add_layer("Scale", node, [x], tops, inplace=True)
        if bias_node is not None:
            self.done.add(id(bias_node))
        p = layer.scale_param
        if axis != 1:
            p.axis = axis
        if blob.ndim != 1:
            p.num_axes = blob.ndim
        array_to_blob(blob, layer.blobs.add())
        if bias_blob is not None:
            layer.scale_param.bias_term = True
            array_to_blob(bias_blob, layer.blobs.add())
        return True

    def _coeff_of(self, v: Value, sum_node: Node):
        """(v's source, coefficient) when v is a scalar Mul read only by `sum_node`, else (v, None)."""
        p = v.producer
        if p is None or p.op != "Mul" or self.single_use(v) is not sum_node or id(p) in self.done:
            return v, None
        found = self._scalar_operand(p)
        if found is None or found[0].shape != v.shape:
            return v, None
        return found[0], found[1]

    def _is_eltwise_sum(self, node: Node) -> bool:
        if node.domain != "" or node.op not in ("Add", "Sum") or len(node.inputs) < 2:
            return False
        shapes = [_static(v) for v in node.inputs]
        return all(_const(v) is None for v in node.inputs) and shapes[0] is not None and \
            all(s == shapes[0] for s in shapes)

    def _eltwise(self, node: Node, operation) -> None:
        xs = list(node.inputs)
        coeffs = None
        if operation == pb.EltwiseParameter.SUM:
            found = [self._coeff_of(v, node) for v in xs]
            if any(c is not None for _, c in found):
                for v, (src, c) in zip(xs, found):
                    if c is not None:
                        self.done.add(id(v.producer))
                xs = [src for src, _ in found]
                coeffs = [1.0 if c is None else c for _, c in found]
        layer = self.add_layer("Eltwise", node, xs, node.outputs)
        if operation != pb.EltwiseParameter.SUM:
            layer.eltwise_param.operation = operation
        if coeffs:
            layer.eltwise_param.coeff.extend(coeffs)

    def _broadcast_dynamic(self, node: Node, kind: str) -> None:
        """x * y / x + y with y broadcasting like a Caffe parameter: a 2-bottom Scale / Bias (after a
        Reshape of y to the dims it covers)."""
        a, b = node.inputs
        sa, sb = _static(a), _static(b)
        out = _static(node.output)
        if sa is None or sb is None:
            raise self.unsupported(node, "needs static shapes")
        x, y, sy = (a, b, sb) if sa == out else (b, a, sa) if sb == out else (None, None, None)
        if x is None or len(sy) > len(out):
            raise self.unsupported(node, "neither operand has the output's shape")
        full = [1] * (len(out) - len(sy)) + sy
        idx = [i for i, d in enumerate(full) if d != 1] or [0]
        axis, end = idx[0], idx[-1]
        covered = out[axis:end + 1]
        if full[axis:end + 1] != covered:
            raise self.unsupported(node, f"operand of shape {sy} does not broadcast per Caffe's {kind} rules")
        y_blob = self.blob_of(y, node)
        if sy != covered:
            rs = self.net.layer.add()
            rs.name = self._unique(f"{node.name}/reshape")
            rs.type = "Reshape"
            rs.bottom.append(y_blob)
            y_blob = f"{y.name}/{node.name}/reshaped"
            rs.top.append(y_blob)
            rs.reshape_param.shape.dim.extend(covered)
        layer = self.add_layer(kind, node, [x], node.outputs)
        layer.bottom.append(y_blob)
        p = layer.scale_param if kind == "Scale" else layer.bias_param
        if axis != 1:
            p.axis = axis

    def _op_Mul(self, node: Node) -> None:
        found = self._scalar_operand(node)
        if found is not None:
            user = self.single_use(node.output)
            if user is not None and self._is_eltwise_sum(user) and found[0].shape == node.output.shape:
                return  # lowered later as that Eltwise SUM's coefficient
        if self._binary_const(node):
            return
        a, b = node.inputs
        if _static(a) is not None and _static(a) == _static(b):
            return self._eltwise(node, pb.EltwiseParameter.PROD)
        self._broadcast_dynamic(node, "Scale")

    def _op_Add(self, node: Node) -> None:
        if self._binary_const(node):
            return
        if self._is_eltwise_sum(node):
            return self._eltwise(node, pb.EltwiseParameter.SUM)
        self._broadcast_dynamic(node, "Bias")

    def _op_Sum(self, node: Node) -> None:
        if len(node.inputs) == 1:
            return self._op_Identity(node)
        if not self._is_eltwise_sum(node):
            raise self.unsupported(node, "Eltwise SUM needs inputs of one static shape")
        self._eltwise(node, pb.EltwiseParameter.SUM)

    def _op_Max(self, node: Node) -> None:
        shapes = [_static(v) for v in node.inputs]
        if len(node.inputs) == 1:
            return self._op_Identity(node)
        if shapes[0] is None or any(s != shapes[0] for s in shapes) or any(_const(v) is not None for v in node.inputs):
            raise self.unsupported(node, "Eltwise MAX needs tensor inputs of one static shape")
        self._eltwise(node, pb.EltwiseParameter.MAX)

    def _op_Sub(self, node: Node) -> None:
        if not self._binary_const(node):
            raise self.unsupported(node, "the difference of two tensors (Caffe has no such Eltwise)")

    def _op_Div(self, node: Node) -> None:
        if not self._binary_const(node):
            raise self.unsupported(node, "the quotient of two tensors")

    def _op_Pow(self, node: Node) -> None:
        found = self._scalar_operand(node)
        if found is None:
            raise self.unsupported(node, "Power needs a scalar constant exponent")
        self._power_chain(node)

    # shapes ---------------------------------------------------------------------------------------
    def _op_Concat(self, node: Node) -> None:
        layer = self.add_layer("Concat", node, list(node.inputs), node.outputs)
        axis = int(node.attr("axis"))
        if axis != 1:
            layer.concat_param.axis = axis

    def _op_Split(self, node: Node) -> None:
        x = node.inputs[0]
        shape = _static(x)
        outs = [_static(v) for v in node.outputs]
        if shape is None or any(o is None for o in outs):
            raise self.unsupported(node, "needs static shapes")
        axis = int(node.attr("axis")) % len(shape)
        sizes = [o[axis] for o in outs]
        layer = self.add_layer("Slice", node, [x], node.outputs)
        if axis != 1:
            layer.slice_param.axis = axis
        points = np.cumsum(sizes)[:-1].tolist()
        if len(set(sizes)) != 1:
            layer.slice_param.slice_point.extend(int(p) for p in points)

    def _op_Flatten(self, node: Node) -> None:
        if node.attr("axis") == 1:
            self.add_layer("Flatten", node, [node.inputs[0]], node.outputs)
        else:
            self._reshape_static(node)

    def _reshape_static(self, node: Node) -> None:
        out = _static(node.output)
        if out is None:
            raise self.unsupported(node, "needs a static output shape")
        layer = self.add_layer("Reshape", node, [node.inputs[0]], node.outputs)
        layer.reshape_param.shape.dim.extend(out)

    def _op_Reshape(self, node: Node) -> None:
        target = _const(node.inputs[1])
        if target is None:
            raise self.unsupported(node, "a computed target shape")
        if node.attr("allowzero") and 0 in target.tolist():
            return self._reshape_static(node)
        layer = self.add_layer("Reshape", node, [node.inputs[0]], node.outputs)
        layer.reshape_param.shape.dim.extend(int(d) for d in target.reshape(-1))

    def _op_Constant(self, node: Node) -> None:
        self.done.add(id(node))  # read by layers as their weights; any other reader fails in blob_of


def export_graph(graph: Graph, name: str | None = None):
    """Lower an IR graph to a CaffeModel (fused aiacc ops decomposed first)."""
    graph = _decompose_fused(graph)
    return Exporter(graph, name).run()


def _decompose_fused(graph: Graph) -> Graph:
    """A copy of the graph with aiacc's fused ops replaced by the ops they stand for, when the core
    provides `aiacc.core.ops.fused.decompose`; unchanged otherwise."""
    if not any(n.domain == "aiacc" for n in graph):
        return graph
    try:
        from aiacc.core.ops.fused import decompose
    except ImportError:
        return graph  # the exporter names the fused node it cannot lower
    g = graph.copy()
    for node in list(g):
        if node.domain == "aiacc":
            decompose(node, g)
    return g
