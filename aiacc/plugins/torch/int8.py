"""torch native int8: aiacc's int8 plan (the QDQ graph of aiacc.core.quant) on PyTorch's x86 quantized
kernels (quantized::conv2d, quantized::linear, quantized::add, quantized::cat on quint8 activations and
per-channel qint8 weights; fbgemm / oneDNN under torch.backends.quantized.engine).

The plan is written in the IR as QuantizeLinear/DequantizeLinear pairs. This module gives the torch exporter
(1) lowerings of those two ops (torch.quantize_per_tensor / per_channel, and .dequantize() of the
quantized tensor, or (q - z) * s of its levels), so that every QDQ graph exports to a torch module that
computes what the graph says, and (2) a fusion planner (exporter.FUSION_PLANNERS) that turns each group
DequantizeLinear -> op [-> Relu/Clip] -> QuantizeLinear into one integer kernel reading and writing
quantized tensors, as onnxruntime's graph optimizer does for its QLinear kernels:

  Conv (2-D)                        quantized::conv2d(_relu) (QuantizedConv2d: the weight packed once)
  Gemm, MatMul by a constant        quantized::linear(_relu) (QuantizedLinear); one whose output stays
                                    float: quantized::linear_with_input_q_dq_qweight_dq_output_fp32
  Add, Mul of two activations       quantized::add(_relu), quantized::mul(_relu) (same shapes)
  Concat                            quantized::cat
  MaxPool, Reshape, Flatten,        the float lowering applied to the quantized tensor (the pair around it
  Transpose, Squeeze, Unsqueeze     has one scale: the levels move unchanged)

A Relu, or a Clip the output range already saturates, joins the kernel before it. Anything else (Softmax,
LayerNormalization, an activation x activation MatMul, an opaque node) runs in float between a dequantize
and a quantize, exactly as the QDQ graph defines it.

Measured (benchmarks/precision.py, 2 threads, AVX2 without VNNI): fbgemm packs run these kernels faster
than the 'x86' engine's choice (ResNet-50 batch 8: 404 vs 909 ms), so weights are packed for fbgemm;
onnxruntime's int8 kernels are still faster here (242 ms).
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from aiacc.core.ir import Graph, Node, Value
from aiacc.core.ops.nn import window_params
from aiacc.core.ops.quantize import dequantize_linear
from aiacc.core.passes.utils import const_value
from aiacc.errors import UnsupportedError
from aiacc.plugins.torch.exporter import FUSION_PLANNERS, LOWERINGS, LNode, arg, resolved_attrs

PACK_ENGINE = "fbgemm"
# PyTorch 2.10+ announces the removal of its quantized tensor type (pytorch/pytorch#184982): the kernels this
# module calls still ship and are what "torch native int8" means today; it is silenced while packing weights
_DEPRECATION = "torch.quantize_per_tensor, torch.quantize_per_channel and other quantized tensor creation"
_QDTYPES = {"uint8": torch.quint8, "int8": torch.qint8, "int32": torch.qint32}
PASSTHROUGH = ("MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze")


# ------------------------------------------------------------------------------ the ops themselves
def affine(x: torch.Tensor, scale: Any, zero_point: Any) -> torch.Tensor:
    """(x - zero_point) * scale for integer levels x (scale and zero point broadcast along their axis)."""
    return (x.to(torch.float32) - zero_point) * scale


def _scale_zp(n: LNode) -> tuple[np.ndarray, np.ndarray]:
    s = n.const(1)
    z = n.const(2) if n.n_inputs > 2 and n.values[2] is not None else None
    if s is None or (n.n_inputs > 2 and n.values[2] is not None and z is None):
        raise UnsupportedError(f"node {n.name}: {n.op} with a computed scale or zero point")
    return np.asarray(s, np.float32), (np.zeros(s.shape, np.uint8) if z is None else np.asarray(z))


@LOWERINGS.register("QuantizeLinear")
def _quantize(b, n: LNode):
    s, z = _scale_zp(n)
    dtype = _QDTYPES.get(z.dtype.name)
    if dtype is None:
        raise UnsupportedError(f"node {n.name}: QuantizeLinear to {z.dtype.name}")
    if s.size == 1:
        return b.call(torch.quantize_per_tensor, n.arg(0), float(s.reshape(())), int(z.reshape(())), dtype)
    rank = len(n.shape(0)) if n.shape(0) is not None else None
    axis = n.attr("axis", 1) % rank if rank else n.attr("axis", 1)
    return b.call(torch.quantize_per_channel, n.arg(0), b.constant(s.astype(np.float64)),
                  b.constant(z.astype(np.int64)), axis, dtype)


@LOWERINGS.register("DequantizeLinear")
def _dequantize(b, n: LNode):
    """The float value, decided at export time (no branch in the module, which torch.load traces again):
    a quantized tensor of these parameters (what QuantizeLinear and the integer kernels give) in one
    .dequantize(); its levels at other parameters (a scale folded into a second DequantizeLinear), or plain
    integers (a uint8 graph input), through (x - z) * s."""
    s, z = _scale_zp(n)
    c = n.const(0)
    axis = n.attr("axis", 1)
    if c is not None:  # an int8 weight or int32 bias outside any integer kernel: its float value, once
        return b.constant(dequantize_linear(c, s, z, axis=axis))
    src = n.values[0].producer
    x = n.arg(0)
    if src is not None and not src.domain and src.op == "QuantizeLinear":
        if s.size == 1 and _qparams(src) is not None and _qparams(src) == (float(s.reshape(())), int(z.reshape(()))):
            return b.method("dequantize", x)
        x = b.method("int_repr", x)
    if s.size == 1:
        return b.call(affine, x, float(s.reshape(())), int(z.reshape(())))
    rank = len(n.shape(0)) if n.shape(0) is not None else None
    if rank is None:
        raise UnsupportedError(f"node {n.name}: per-axis DequantizeLinear of a tensor of unknown rank")
    shape = [1] * rank
    shape[axis % rank] = -1
    return b.call(affine, x, b.constant(s.reshape(shape)), b.constant(z.astype(np.float32).reshape(shape)))


# ------------------------------------------------------------------------------------ the groups
def _qparams(node: Node | None) -> tuple[float, int] | None:
    """(scale, zero point) of a per-tensor uint8 QuantizeLinear/DequantizeLinear with constant parameters."""
    if node is None or node.domain or node.op not in ("QuantizeLinear", "DequantizeLinear"):
        return None
    s = const_value(node.inputs[1])
    zv = node.inputs[2] if len(node.inputs) > 2 else None
    z = const_value(zv) if zv is not None else np.zeros((), np.uint8)
    if s is None or z is None or s.size != 1 or z.size != 1 or z.dtype != np.uint8:
        return None
    return float(np.float32(s.reshape(()))), int(z.reshape(()))


def _only_user(v: Value) -> Node | None:
    users = v.users()
    return users[0] if len(users) == 1 and len(v.uses) == 1 and not v.is_graph_output else None


class QuantizedKernel(torch.nn.Module):
    """An integer kernel of the int8 plan: its int8 weight (a qint8 tensor, per output channel) and float
    bias as buffers, packed once for a quantized engine (PACK_ENGINE) and packed again after unpickling
    (the packed form is the engine's own object, not part of the state)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, scale: float, zero_point: int,
                 relu: bool, engine: str):
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)
        self.scale, self.zero_point, self.relu, self.engine = scale, zero_point, relu, engine
        self.repack()

    def repack(self) -> None:
        """Pack weight and bias for `engine` (the engine current while packing decides the kernels)."""
        current = torch.backends.quantized.engine
        if self.engine in torch.backends.quantized.supported_engines:
            torch.backends.quantized.engine = self.engine
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_DEPRECATION)
                self._packed = self.pack()
        finally:
            torch.backends.quantized.engine = current

    def pack(self) -> Any:
        """The engine's packed weight (each kernel class packs its own way)."""
        raise NotImplementedError(f"{type(self).__name__} does not pack a weight")

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_packed", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.repack()


class QuantizedConv2d(QuantizedKernel):
    """quantized::conv2d(_relu): quint8 in, quint8 out at (scale, zero_point)."""

    def __init__(self, weight, bias, scale, zero_point, relu, engine, stride, padding, dilation, groups):
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        super().__init__(weight, bias, scale, zero_point, relu, engine)

    def pack(self) -> Any:
        return torch.ops.quantized.conv2d_prepack(self.weight, self.bias, self.stride, self.padding, self.dilation,
                                                  self.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        op = torch.ops.quantized.conv2d_relu if self.relu else torch.ops.quantized.conv2d
        return op(x, self._packed, self.scale, self.zero_point)


class QuantizedLinear(QuantizedKernel):
    """quantized::linear(_relu): quint8 in, quint8 out at (scale, zero_point). float_output: DequantizeLinear(x)
    -> Gemm(DequantizeLinear(w)) with a float result (onnxruntime's QGemm / MatMulIntegerToFloat): x is the
    float input, quantized inside the kernel at (scale, zero_point) of its DequantizeLinear, the product
    accumulated in int32 (quantized::linear_with_input_q_dq_qweight_dq_output_fp32)."""

    def __init__(self, weight, bias, scale, zero_point, relu, engine, float_output: bool = False):
        self.float_output = float_output
        super().__init__(weight, bias, scale, zero_point, relu, engine)

    def pack(self) -> Any:
        return torch.ops.quantized.linear_prepack(self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.float_output:
            return torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
                x, self.scale, self.zero_point, self._packed)
        op = torch.ops.quantized.linear_relu if self.relu else torch.ops.quantized.linear
        return op(x, self._packed, self.scale, self.zero_point)


def _act_dq(v: Value | None) -> Node | None:
    """The DequantizeLinear producing `v` from a quantized activation (a QuantizeLinear's output with the
    same parameters, which the lowering holds as a torch quantized tensor), else None."""
    dq = v.producer if v is not None else None
    params = _qparams(dq)
    if params is None or const_value(dq.inputs[0]) is not None:
        return None
    q = dq.inputs[0].producer
    return dq if q is not None and _qparams(q) == params and q.op == "QuantizeLinear" else None


def _weight(v: Value | None) -> tuple[np.ndarray, np.ndarray, int] | None:
    """(int8 weight, float scales, axis) of a DequantizeLinear of a constant symmetric int8 weight."""
    dq = v.producer if v is not None else None
    if dq is None or dq.domain or dq.op != "DequantizeLinear":
        return None
    w, s = const_value(dq.inputs[0]), const_value(dq.inputs[1])
    z = const_value(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] is not None else None
    if w is None or s is None or w.dtype != np.int8 or (z is not None and np.any(z != 0)):
        return None
    axis = dq.attrs.get("axis", 1) % w.ndim
    if s.size != 1 and (s.ndim != 1 or s.size != w.shape[axis]):
        return None
    return w, np.asarray(s, np.float32).reshape(-1), axis


def _bias(v: Value | None) -> tuple[bool, np.ndarray | None]:
    """(usable, float bias): none, a float constant, or a DequantizeLinear of a constant int32 bias."""
    if v is None:
        return True, None
    c = const_value(v)
    if c is not None:
        return c.dtype == np.float32 and c.ndim == 1, c
    dq = v.producer
    if dq is None or dq.domain or dq.op != "DequantizeLinear":
        return False, None
    b, s = const_value(dq.inputs[0]), const_value(dq.inputs[1])
    z = const_value(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] is not None else np.zeros((), np.int32)
    if b is None or s is None or z is None or b.ndim != 1:
        return False, None
    return True, dequantize_linear(b, s, z, axis=0).astype(np.float32)


def _tensor(a: np.ndarray | None) -> torch.Tensor | None:
    return None if a is None else torch.from_numpy(np.array(a, np.float32))


def _qweight(w: np.ndarray, scales: np.ndarray, axis: int) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(w))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_DEPRECATION)
        if scales.size == 1:
            return torch._make_per_tensor_quantized_tensor(t, float(scales[0]), 0)
        return torch._make_per_channel_quantized_tensor(t, torch.from_numpy(scales.astype(np.float64)),
                                                        torch.zeros(scales.size, dtype=torch.int64), axis)


def _absorbed_activation(act: Node, params: tuple[float, int]) -> bool | None:
    """For a Relu/Clip between an integer kernel and its QuantizeLinear: True (the kernel's relu variant
    computes Q(act(y))), False (Q alone does: the output range saturates the bounds), None (it cannot
    join: a bound inside the range)."""
    s, z = params
    if act.op == "Relu":
        return z > 0  # zero point 0: Q's saturation at level 0 is the relu
    lo = const_value(act.inputs[1]) if len(act.inputs) > 1 and act.inputs[1] is not None else act.attrs.get("min")
    hi = const_value(act.inputs[2]) if len(act.inputs) > 2 and act.inputs[2] is not None else act.attrs.get("max")
    lo = None if lo is None else float(np.asarray(lo).reshape(()))
    hi = None if hi is None else float(np.asarray(hi).reshape(()))
    if hi is not None and round(hi / s) + z < 255:
        return None
    if lo is None or round(lo / s) + z <= 0:
        return False
    return (z > 0) if lo == 0 else None


class _Planner:
    """Finds the groups of one graph and records their lowerings in the exporter's Fusions."""

    def __init__(self, graph: Graph, f):
        self.graph, self.f = graph, f
        self.quantized_reads: set[tuple[int, int]] = set()  # (id(node), input index) read as quantized
        self.packed: set[int] = set()  # ids of nodes whose weight and bias an integer kernel holds
        self.groups = 0

    def free(self, *nodes: Node) -> bool:
        return all(id(n) not in self.f.skip and id(n) not in self.f.special for n in nodes)

    def claim(self, q: Node, absorbed: list[Node], reads: list[tuple[Node, int]], lower) -> None:
        for n in absorbed:
            self.f.skip.add(id(n))
        self.f.special[id(q)] = lower
        self.quantized_reads.update((id(n), i) for n, i in reads)
        self.groups += 1

    def run(self) -> None:
        for q in list(self.graph):
            params = _qparams(q)
            if params is None or q.op != "QuantizeLinear" or not self.free(q):
                continue
            p, act = q.inputs[0].producer, None
            if p is not None and not p.domain and p.op in ("Relu", "Clip") and _only_user(p.outputs[0]) is q:
                act, p = p, p.inputs[0].producer
                if p is not None and _only_user(p.outputs[0]) is not act:
                    continue
            if p is None or p.domain or p.schema is None or not self.free(p) or (act and not self.free(act)):
                continue
            if act is None and _only_user(p.outputs[0]) is not q:
                continue
            relu = False
            if act is not None:
                relu = _absorbed_activation(act, params)
                if relu is None:
                    continue
            absorbed = [p] + ([act] if act is not None else [])
            if p.op == "Conv":
                self.conv(q, p, absorbed, params, relu)
            elif p.op in ("Gemm", "MatMul"):
                self.linear(q, p, absorbed, params, relu)
            elif p.op in ("Add", "Mul"):
                self.binary(q, p, absorbed, params, relu)
            elif p.op == "Concat" and act is None:
                self.concat(q, p, absorbed, params)
            elif p.op in PASSTHROUGH and act is None:
                self.passthrough(q, p, params)
        for p in list(self.graph):  # gemms whose output stays float (read by float ops only)
            if not p.domain and p.op in ("Gemm", "MatMul") and self.free(p):
                self.linear(None, p, [], None, False)
        self.drop_dead_dequantize()

    def conv(self, q, p, absorbed, params, relu) -> None:
        x, wt = _act_dq(p.inputs[0]), _weight(p.inputs[1])
        ok, bias = _bias(p.inputs[2] if len(p.inputs) > 2 else None)
        shape = p.inputs[0].shape
        if x is None or wt is None or not ok or wt[0].ndim != 4 or (wt[1].size > 1 and wt[2] != 0) \
                or shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape[2:]):
            return
        w, scales, axis = wt
        kernel = list(p.attrs.get("kernel_shape") or w.shape[2:])
        strides, dilations, pads = window_params(list(shape[2:]), kernel, dict(
            auto_pad=p.attrs.get("auto_pad"), strides=p.attrs.get("strides"), dilations=p.attrs.get("dilations"),
            pads=p.attrs.get("pads")))
        if list(pads[:2]) != list(pads[2:]):
            return
        m = QuantizedConv2d(_qweight(w, scales, axis), _tensor(bias), *params, bool(relu), PACK_ENGINE,
                            list(strides), list(pads[:2]), list(dilations), p.attrs.get("group", 1))
        self.packed.add(id(p))
        self.module_group(q, absorbed, m, x, [(p, 0)])

    def linear(self, q, p, absorbed, params, relu) -> None:
        x, wt = _act_dq(p.inputs[0]), _weight(p.inputs[1])
        ok, bias = _bias(p.inputs[2] if len(p.inputs) > 2 else None)
        if x is None or wt is None or not ok or wt[0].ndim != 2:
            return
        w, scales, axis = wt
        if p.op == "Gemm":
            a = p.attrs
            if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or (bias is not None and a.get("beta", 1.0) != 1.0):
                return
            if not a.get("transB", 0):
                w, axis = w.T, 1 - axis
        else:
            if bias is not None or len(p.inputs) > 2:
                return
            w, axis = w.T, 1 - axis  # x @ W[K, N] == linear(x, W^T)
        if scales.size > 1 and axis != 0:
            return
        self.packed.add(id(p))
        if q is None:  # float output: the integer kernel reads the float input at its quantization parameters
            dq_out = x.outputs[0]
            fm = QuantizedLinear(_qweight(w, scales, 0), _tensor(bias), *_qparams(x), False, PACK_ENGINE, True)
            self.f.special[id(p)] = lambda b, ln, node: [
                b.fx.call_module(b.add_opaque_module(fm, copy_module=False), (arg(b, dq_out),), {})]
            self.groups += 1
            return
        m = QuantizedLinear(_qweight(w, scales, 0), _tensor(bias), *params, bool(relu), PACK_ENGINE)
        self.module_group(q, absorbed, m, x, [(p, 0)])

    def module_group(self, q, absorbed, module, x_dq, reads) -> None:
        src = x_dq.inputs[0]

        def lower(b, ln, node, module=module, src=src):
            return [b.fx.call_module(b.add_opaque_module(module, copy_module=False), (arg(b, src),), {})]
        self.claim(q, absorbed, reads, lower)

    def binary(self, q, p, absorbed, params, relu) -> None:
        a, c = _act_dq(p.inputs[0]), _act_dq(p.inputs[1])
        sa, sc = p.inputs[0].shape, p.inputs[1].shape
        if a is None or c is None or sa is None or tuple(sa) != tuple(sc or ()):
            return
        ops = {("Add", False): torch.ops.quantized.add, ("Add", True): torch.ops.quantized.add_relu,
               ("Mul", False): torch.ops.quantized.mul, ("Mul", True): torch.ops.quantized.mul_relu}
        fn, (s, z) = ops[(p.op, bool(relu))], params
        xa, xc = a.inputs[0], c.inputs[0]
        self.claim(q, absorbed, [(p, 0), (p, 1)],
                   lambda b, ln, node: [b.call(fn, arg(b, xa), arg(b, xc), s, z)])

    def concat(self, q, p, absorbed, params) -> None:
        dqs = [_act_dq(v) for v in p.inputs]
        if not dqs or any(d is None for d in dqs):
            return
        rank = len(p.outputs[0].shape) if p.outputs[0].shape is not None else None
        axis = p.attrs.get("axis", 0)
        axis = axis % rank if rank else axis
        srcs, (s, z) = [d.inputs[0] for d in dqs], params
        self.claim(q, absorbed, [(p, i) for i in range(len(dqs))],
                   lambda b, ln, node: [b.call(torch.ops.quantized.cat, [arg(b, v) for v in srcs], axis, s, z)])

    def passthrough(self, q, p, params) -> None:
        x = _act_dq(p.inputs[0])
        if x is None or _qparams(x) != params or any(v is not None and v.uses for v in p.outputs[1:]):
            return
        dq_out, src, fn = x.outputs[0], x.inputs[0], LOWERINGS.get(p.qualified_op)
        if fn is None:
            return

        def lower(b, ln, node):
            # the op's float lowering, its input bound to the quantized tensor for the length of the call
            saved = b.env.get(id(dq_out))
            b.env[id(dq_out)] = arg(b, src)
            try:
                out = fn(b, LNode(b, p.op, resolved_attrs(p), list(p.inputs), p.outputs, p.name, p.meta, p.domain))
            finally:
                if saved is None:
                    b.env.pop(id(dq_out), None)
                else:
                    b.env[id(dq_out)] = saved
            return [out[0] if isinstance(out, (list, tuple)) else out]
        self.claim(q, [p], [(p, 0)], lower)

    def drop_dead_dequantize(self) -> None:
        """A DequantizeLinear whose every reader is an integer kernel (or a weight packed into one) is not
        lowered at all."""
        for dq in self.graph:
            if dq.domain or dq.op != "DequantizeLinear" or id(dq) in self.f.special:
                continue
            out = dq.outputs[0]
            if out.is_graph_output or not out.users():
                continue
            reads = [(u, i) for u in out.users() for i, v in enumerate(u.inputs) if v is out]
            weight_only = const_value(dq.inputs[0]) is not None
            if all((id(u), i) in self.quantized_reads or (weight_only and id(u) in self.packed) for u, i in reads):
                self.f.skip.add(id(dq))


def plan_int8(graph: Graph, f) -> None:
    """exporter.FUSION_PLANNERS entry: the integer-kernel groups of a QDQ graph (nothing elsewhere)."""
    if not any(n.op == "QuantizeLinear" and not n.domain for n in graph):
        return
    p = _Planner(graph, f)
    p.run()
    graph.meta["torch.int8_kernels"] = p.groups


FUSION_PLANNERS.append(plan_int8)


def int8_kernels(module: torch.nn.Module) -> dict[str, int]:
    """Integer-kernel calls in an exported module, by kind (conv, linear, add, mul, cat): what a test or a
    report checks to see the int8 plan ran as int8."""
    counts: dict[str, int] = {}
    graph = getattr(module, "graph", None)
    if graph is None:
        return counts
    for node in graph.nodes:
        kind = None
        if node.op == "call_module":
            sub = module.get_submodule(node.target)
            kind = "conv" if isinstance(sub, QuantizedConv2d) else "linear" if isinstance(sub, QuantizedLinear) \
                else None
        elif node.op == "call_function" and str(node.target).startswith("quantized."):
            kind = str(node.target).split(".")[1].split("_")[0]
        if kind:
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def export_int8(plugin, qgraph: Graph, model: Any, options: dict) -> tuple[torch.nn.Module, dict[str, int], str]:
    """The torch plugin's native export of a QDQ graph with the integer kernels above; (module, kernel
    counts, the quantized engine its weights were packed for). A plan none of whose groups maps to a kernel still runs (in float between Q/DQ) and warns."""
    engine = torch.backends.quantized.engine
    # weights are packed for the engine current at export time and run with that engine's kernels
    # whatever it is later; fbgemm measured fastest here (ResNet-50 batch 8, 2 threads, AVX2: fbgemm
    # 404 ms, x86 909 ms: x86 packs some convolutions for oneDNN)
    if PACK_ENGINE in torch.backends.quantized.supported_engines:
        torch.backends.quantized.engine = PACK_ENGINE
    packed = torch.backends.quantized.engine
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_DEPRECATION)
            out = plugin.export(qgraph, original=model, backend="native", **options)
    finally:
        torch.backends.quantized.engine = engine
    kernels = int8_kernels(out)
    if not kernels:
        from aiacc.plugins.precision import _aiacc_warning

        warnings.warn("precision='int8' on torch native: no group of the int8 plan maps to a PyTorch integer "
                      "kernel (quantized conv2d/linear/add/cat), so it runs in float between quantize and "
                      "dequantize; backend='onnxruntime' has more integer kernels", _aiacc_warning(), stacklevel=5)
    return out, kernels, packed
