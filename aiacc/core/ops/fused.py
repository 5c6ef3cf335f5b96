"""aiacc's fused ops (domain "aiacc"), each defined by the standard ops it replaces.

    aiacc::FusedConv(x, w, b?, residual?)   act(Conv(x, w, b) + residual)
    aiacc::FusedGemm(a, b, c?)              act(Gemm(a, b, c))
    aiacc::FusedMatMul(a, w, bias?)         act(MatMul(a, w) + bias): a of any rank >= 1 (batched rows, e.g.
                                            BERT's [B, S, H]), w a matrix [K, N], bias a vector [N]
                                            (torch F.linear, TF MatMul+BiasAdd, MXNet FullyConnected
                                            flatten=False)
    aiacc::Attention(q, k, v, mask?)        Softmax((q @ k^T) * scale + mask, axis=-1) @ v
    aiacc::FusedElementwise(x0, x1, ...)    a program of elementwise ops evaluated in one pass
    aiacc::Embedding(weight, indices)       Gather(weight, indices, axis=0), a table lookup whose row
                                            `padding_idx` gets no gradient in training (torch's
                                            nn.Embedding(padding_idx=...) in train mode; inference imports
                                            a plain Gather)

The reference kernels compose the registry's kernels of the replaced ops, so a fused op computes what its
decomposition computes. `decompose(node, graph)` rewrites a fused node back into standard ONNX ops (for the
ONNX exporter and for plugins that cannot run a fused op); `decompose_all(graph)` does every one.

Activations (`activation` attribute, parameters in `activation_params`):
    "" (none), Relu, LeakyRelu [alpha], Elu [alpha], Sigmoid, Tanh, HardSigmoid [alpha, beta], HardSwish,
    Clip [min, max] (either may be -inf / inf), Gelu, GeluTanh
"""
from __future__ import annotations

import json
import re
from typing import Any, Sequence

import numpy as np

from aiacc.core.ir import Graph, Node, TensorType, Value
from aiacc.core.ops.elementwise import infer_broadcast
from aiacc.core.ops.nn import _CONV_ATTRS, infer_conv, infer_gemm, infer_matmul
from aiacc.core.ops.registry import REQUIRED, InferContext, get_schema, op
from aiacc.core.ops.shape_utils import broadcast_shapes
from aiacc.errors import AttributeError_, GraphError

DOMAIN = "aiacc"

# activation name -> (ONNX op, its parameter attribute names, fixed attributes)
ACTIVATIONS: dict[str, tuple[str, tuple[str, ...], dict[str, Any]]] = {
    "Relu": ("Relu", (), {}),
    "LeakyRelu": ("LeakyRelu", ("alpha",), {}),
    "Elu": ("Elu", ("alpha",), {}),
    "Sigmoid": ("Sigmoid", (), {}),
    "Tanh": ("Tanh", (), {}),
    "HardSigmoid": ("HardSigmoid", ("alpha", "beta"), {}),
    "HardSwish": ("HardSwish", (), {}),
    "Clip": ("Clip", (), {}),  # parameters are the min and max inputs
    "Gelu": ("Gelu", (), {"approximate": "none"}),
    "GeluTanh": ("Gelu", (), {"approximate": "tanh"}),
}


def call_op(op_type: str, *arrays: np.ndarray | None, domain: str = "", **attrs: Any) -> np.ndarray:
    """Run the registry kernel of a standard op on arrays, schema defaults filled in."""
    schema = get_schema(op_type, domain)
    if schema is None:
        raise GraphError(f"op {op_type} is not registered")
    kwargs = {k: (attrs[k] if k in attrs else spec.default) for k, spec in schema.attrs.items()}
    out = schema.kernel(*arrays, **kwargs)
    return out[0] if isinstance(out, (tuple, list)) else out


def apply_activation(y: np.ndarray, activation: str, params: Sequence[float] | None) -> np.ndarray:
    """The activation, computed by the registry kernel of its op."""
    if not activation:
        return y
    if activation not in ACTIVATIONS:
        raise AttributeError_(f"unknown fused activation {activation!r} (known: {', '.join(ACTIVATIONS)})")
    op_type, names, fixed = ACTIVATIONS[activation]
    params = list(params or [])
    if activation == "Clip":
        lo, hi = (params + [-np.inf, np.inf])[:2]
        return call_op("Clip", y, np.asarray(lo, y.dtype), np.asarray(hi, y.dtype))
    attrs = dict(fixed)
    attrs.update({n: float(p) for n, p in zip(names, params)})
    return call_op(op_type, y, **attrs)


def _check_activation(ctx: InferContext) -> None:
    act = ctx.attrs.get("activation") or ""
    if act and act not in ACTIVATIONS:
        raise ctx.fail(f"unknown fused activation {act!r} (known: {', '.join(ACTIVATIONS)})")


_ACT_ATTRS = {"activation": ("string", ""), "activation_params": ("floats", None)}


# ------------------------------------------------------------------------------------------------ FusedConv
def infer_fused_conv(ctx: InferContext) -> list[TensorType | None]:
    _check_activation(ctx)
    out = infer_conv(ctx)
    if ctx.has_input(3) and out[0] is not None and ctx.shape(3) is not None and out[0].shape is not None:
        r, o = ctx.shape(3), out[0].shape
        if len(r) != len(o) or any(isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(r, o)):
            raise ctx.fail(f"residual of shape {list(r)} does not match the convolution output {list(o)}")
    return out


@op("FusedConv", domain=DOMAIN, attrs=dict(_CONV_ATTRS, **_ACT_ATTRS), inputs=(2, 4), infer=infer_fused_conv)
def fused_conv(x, w, b=None, residual=None, *, activation, activation_params, **conv_attrs):
    """act(Conv(x, w, b) + residual): the convolution, the residual Add and the activation of the ops it
    replaces, in that order."""
    y = call_op("Conv", x, w, b, **conv_attrs)
    if residual is not None:
        y = call_op("Add", y, residual)
    return apply_activation(y, activation, activation_params)


# ------------------------------------------------------------------------------------------------ FusedGemm
def infer_fused_gemm(ctx: InferContext) -> list[TensorType | None]:
    _check_activation(ctx)
    return infer_gemm(ctx)


@op("FusedGemm", domain=DOMAIN, attrs={"alpha": ("float", 1.0), "beta": ("float", 1.0), "transA": ("int", 0),
                                       "transB": ("int", 0), **_ACT_ATTRS},
    inputs=(2, 3), infer=infer_fused_gemm)
def fused_gemm(a, b, c=None, *, alpha, beta, transA, transB, activation, activation_params):
    """act(Gemm(a, b, c))."""
    y = call_op("Gemm", a, b, c, alpha=alpha, beta=beta, transA=transA, transB=transB)
    return apply_activation(y, activation, activation_params)


# ------------------------------------------------------------------------------------------------ FusedMatMul
def infer_fused_matmul(ctx: InferContext) -> list[TensorType | None]:
    _check_activation(ctx)
    w = ctx.shape(1)
    if w is not None and len(w) != 2:
        raise ctx.fail(f"the weight must be a matrix [K, N], it has shape {list(w)}")
    if ctx.has_input(2) and ctx.shape(2) is not None and w is not None:
        bias = ctx.shape(2)
        if len(bias) != 1 or (isinstance(bias[0], int) and isinstance(w[1], int) and bias[0] != w[1]):
            raise ctx.fail(f"the bias must be a vector of the {w[1]} output columns, it has shape {list(bias)}")
    return infer_matmul(ctx)


@op("FusedMatMul", domain=DOMAIN, attrs=dict(_ACT_ATTRS), inputs=(2, 3), infer=infer_fused_matmul)
def fused_matmul(a, w, bias=None, *, activation, activation_params):
    """act(MatMul(a, w) + bias): the MatMul, the bias Add and the activation of the ops it replaces."""
    y = call_op("MatMul", a, w)
    if bias is not None:
        y = call_op("Add", y, bias)
    return apply_activation(y, activation, activation_params)


# ------------------------------------------------------------------------------------------------ Attention
def infer_attention(ctx: InferContext) -> list[TensorType | None]:
    q, k, v = ctx.type(0), ctx.type(1), ctx.type(2)
    if q is None or v is None or q.shape is None or v.shape is None or k is None or k.shape is None:
        return [None]
    if len(q.shape) < 2 or len(k.shape) < 2 or len(v.shape) < 2:
        raise ctx.fail("q, k and v need rank >= 2")
    d_q = q.shape[-1]
    d_k = k.shape[-2] if ctx.attrs["k_transposed"] else k.shape[-1]
    if isinstance(d_q, int) and isinstance(d_k, int) and d_q != d_k:
        raise ctx.fail(f"query depth {d_q} differs from key depth {d_k}")
    try:
        batch = broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError as e:
        raise ctx.fail(str(e)) from None
    return [TensorType(q.dtype, (*batch, q.shape[-2], v.shape[-1]))]


@op("Attention", domain=DOMAIN, attrs={"scale": ("float", 1.0), "k_transposed": ("int", 0)}, inputs=(3, 4),
    infer=infer_attention)
def attention(q, k, v, mask=None, *, scale, k_transposed):
    """Softmax((q @ K) * scale + mask, axis=-1) @ v with K = k if k_transposed else k^T (last two axes)."""
    kt = k if k_transposed else np.swapaxes(k, -1, -2)
    s = call_op("MatMul", q, kt)
    if scale != 1.0:
        s = call_op("Mul", s, np.asarray(scale, s.dtype))
    if mask is not None:
        s = call_op("Add", s, mask)
    p = call_op("Softmax", s, axis=-1)
    return call_op("MatMul", p, v)


# ------------------------------------------------------------------------------------------------ FusedElementwise
# program: statements "tK=Op(args)" or "tK=Op(args){json attrs}" separated by ";"; args are iN (inputs) or
# tN (earlier results); the last statement is the output.
_STMT = re.compile(r"^\s*(t\d+)\s*=\s*([A-Za-z][A-Za-z0-9_]*)\(([^)]*)\)\s*(\{.*\})?\s*$")


def parse_program(program: str) -> list[tuple[str, str, list[str], dict[str, Any]]]:
    """[(target, op, args, attrs)] of a FusedElementwise program; raises AttributeError_ when malformed."""
    out = []
    defined: set[str] = set()
    for k, stmt in enumerate(s for s in program.split(";") if s.strip()):
        m = _STMT.match(stmt)
        if m is None:
            raise AttributeError_(f"FusedElementwise program: statement {k} {stmt!r} is malformed")
        target, op_type, args, attrs = m.group(1), m.group(2), m.group(3), m.group(4)
        arg_list = [a.strip() for a in args.split(",") if a.strip()]
        for a in arg_list:
            if not re.fullmatch(r"[it]\d+", a) or (a[0] == "t" and a not in defined):
                raise AttributeError_(f"FusedElementwise program: statement {k} reads {a!r} before it is defined")
        if get_schema(op_type) is None or not get_schema(op_type).elementwise:
            raise AttributeError_(f"FusedElementwise program: {op_type} is not a registered elementwise op")
        out.append((target, op_type, arg_list, json.loads(attrs) if attrs else {}))
        defined.add(target)
    if not out:
        raise AttributeError_("FusedElementwise program is empty")
    return out


def format_statement(target: str, op_type: str, args: Sequence[str], attrs: dict[str, Any]) -> str:
    s = f"{target}={op_type}({','.join(args)})"
    if attrs:
        s += json.dumps(attrs, sort_keys=True, separators=(",", ":"))
    return s


def eval_program(program: str, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """Evaluate a program with the registry kernels of its ops (the reference semantics)."""
    env: dict[str, np.ndarray] = {f"i{k}": a for k, a in enumerate(inputs)}
    last = None
    for target, op_type, args, attrs in parse_program(program):
        arrays = []
        for a in args:
            if a not in env:
                raise AttributeError_(f"FusedElementwise program reads {a} but has {len(inputs)} inputs")
            arrays.append(env[a])
        last = env[target] = np.asarray(call_op(op_type, *arrays, **attrs))
    return last


def infer_fused_elementwise(ctx: InferContext) -> list[TensorType | None]:
    try:
        parse_program(ctx.attrs["program"])
    except AttributeError_ as e:
        raise ctx.fail(str(e)) from None
    return infer_broadcast(ctx)


@op("FusedElementwise", domain=DOMAIN, attrs={"program": ("string", None)}, inputs=(1, -1),
    infer=infer_fused_elementwise, elementwise=True)
def fused_elementwise(*inputs, program):
    """The elementwise program's ops applied in order (numba compiles the same program into one loop)."""
    return eval_program(program, inputs)


# ------------------------------------------------------------------------------------------------ Embedding
def infer_embedding(ctx: InferContext) -> list[TensorType | None]:
    w, idx = ctx.shape(0), ctx.shape(1)
    if w is not None and len(w) != 2:
        raise ctx.fail(f"the table must be a matrix [num_embeddings, dim], it has shape {list(w)}")
    dt = ctx.dtype(1)
    if dt is not None and not np.issubdtype(np.dtype(dt), np.integer):
        raise ctx.fail(f"the indices must be integers, they are {dt}")
    p = ctx.attrs["padding_idx"]
    if w is not None and isinstance(w[0], int) and not 0 <= p < w[0]:
        raise ctx.fail(f"padding_idx {p} is not a row of the {w[0]}-row table")
    if w is None or idx is None:
        return [TensorType(ctx.dtype(0), None)]
    return [TensorType(ctx.dtype(0), (*idx, w[1]))]


@op("Embedding", domain=DOMAIN, attrs={"padding_idx": ("int", REQUIRED)}, inputs=2, infer=infer_embedding)
def embedding(weight, indices, *, padding_idx):
    """Gather(weight, indices, axis=0): rows of the table; row `padding_idx` (0 <= padding_idx <
    num_embeddings) is read like any other but receives no gradient in training."""
    return call_op("Gather", weight, indices, axis=0)


# ------------------------------------------------------------------------------------------------ decompose
def _activation_node(graph: Graph, y: Value, activation: str, params, before: Node, name: str) -> Value:
    if not activation:
        return y
    op_type, names, fixed = ACTIVATIONS[activation]
    params = list(params or [])
    if activation == "Clip":
        lo, hi = (params + [-np.inf, np.inf])[:2]
        dt = y.dtype or "float32"
        ins = [y, graph.add_initializer(graph.fresh_name(f"{name}_min"), np.asarray(lo, dt)),
               graph.add_initializer(graph.fresh_name(f"{name}_max"), np.asarray(hi, dt))]
        return graph.add_node("Clip", ins, {}, name=name, before=before).output
    attrs = dict(fixed)
    attrs.update({n: float(p) for n, p in zip(names, params)})
    return graph.add_node(op_type, [y], attrs, name=name, before=before).output


def decompose(node: Node, graph: Graph | None = None) -> list[Node]:
    """Rewrite an aiacc fused node into the standard ONNX ops it stands for; returns the new nodes.
    The last new node's output takes the fused node's output name."""
    graph = graph or node.graph
    if node.domain != DOMAIN:
        raise GraphError(f"node {node.name} ({node.qualified_op}) is not an aiacc fused op")
    first = {id(n) for n in graph}
    a = node.attrs
    ins = list(node.inputs) + [None] * 4
    nm = node.name
    if node.op == "FusedConv":
        conv_attrs = {k: v for k, v in a.items() if k in _CONV_ATTRS}
        y = graph.add_node("Conv", ins[:2] + ([ins[2]] if ins[2] is not None else []), conv_attrs, name=f"{nm}_conv", before=node).output
        if ins[3] is not None:
            y = graph.add_node("Add", [y, ins[3]], {}, name=f"{nm}_add", before=node).output
        y = _activation_node(graph, y, a.get("activation", ""), a.get("activation_params"), node, f"{nm}_act")
    elif node.op == "FusedGemm":
        gemm_attrs = {k: v for k, v in a.items() if k in ("alpha", "beta", "transA", "transB")}
        y = graph.add_node("Gemm", [v for v in ins[:3] if v is not None], gemm_attrs, name=f"{nm}_gemm",
                           before=node).output
        y = _activation_node(graph, y, a.get("activation", ""), a.get("activation_params"), node, f"{nm}_act")
    elif node.op == "FusedMatMul":
        y = graph.add_node("MatMul", ins[:2], {}, name=f"{nm}_matmul", before=node).output
        if ins[2] is not None:
            y = graph.add_node("Add", [y, ins[2]], {}, name=f"{nm}_bias", before=node).output
        y = _activation_node(graph, y, a.get("activation", ""), a.get("activation_params"), node, f"{nm}_act")
    elif node.op == "Attention":
        q, k, v, mask = ins[:4]
        if not a.get("k_transposed", 0):
            if k.shape is None:
                raise GraphError(f"node {nm} (aiacc::Attention): the rank of k is unknown, cannot decompose")
            r = len(k.shape)
            perm = list(range(r - 2)) + [r - 1, r - 2]
            k = graph.add_node("Transpose", [k], {"perm": perm}, name=f"{nm}_kt", before=node).output
        s = graph.add_node("MatMul", [q, k], {}, name=f"{nm}_qk", before=node).output
        scale = float(a.get("scale", 1.0))
        if scale != 1.0:
            c = graph.add_initializer(graph.fresh_name(f"{nm}_scale"), np.asarray(scale, q.dtype or "float32"))
            s = graph.add_node("Mul", [s, c], {}, name=f"{nm}_scale", before=node).output
        if mask is not None:
            s = graph.add_node("Add", [s, mask], {}, name=f"{nm}_mask", before=node).output
        p = graph.add_node("Softmax", [s], {"axis": -1}, name=f"{nm}_softmax", before=node).output
        y = graph.add_node("MatMul", [p, v], {}, name=f"{nm}_pv", before=node).output
    elif node.op == "Embedding":  # the forward; the padding row's missing gradient has no ONNX form
        y = graph.add_node("Gather", ins[:2], {"axis": 0}, name=f"{nm}_gather", before=node).output
    elif node.op == "FusedElementwise":
        env = {f"i{k}": v for k, v in enumerate(node.inputs)}
        y = None
        for target, op_type, args, attrs in parse_program(a["program"]):
            y = env[target] = graph.add_node(op_type, [env[x] for x in args], attrs, name=f"{nm}_{target}",
                                             before=node).output
    else:
        raise GraphError(f"node {nm}: no decomposition for aiacc::{node.op}")
    out = node.output
    name = out.name
    out.replace_all_uses_with(y)
    graph.erase(node)
    y.name = name
    return [n for n in graph if id(n) not in first]


def decompose_all(graph: Graph) -> int:
    """Decompose every aiacc fused node of the graph; returns how many."""
    count = 0
    for n in graph.nodes:
        if n.domain == DOMAIN and n.op in ("FusedConv", "FusedGemm", "FusedMatMul", "Attention", "FusedElementwise",
                                                "Embedding"):
            decompose(n, graph)
            count += 1
    return count
