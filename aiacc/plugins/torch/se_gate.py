"""Squeeze-excite's tail in the torch inference export (level 3): `Conv1x1(x * gate)` as one batched GEMM on
x's own memory with the gate folded into the weight, instead of a full pass over x for the broadcast multiply
and then the convolution.

A squeeze-excite block (EfficientNet's MBConv, MobileNetV3) ends in `y = x * gate` with gate [N, C, 1, 1],
read by the 1x1 projection convolution. Since `W @ (x * g) == (W * g) @ x` per sample, the export runs
`torch.baddbmm(bias [+ residual], X, (W^T * g))` where X is x viewed as [N, H*W, C] (a view of the
channels-last tensor the oneDNN convolutions return; NCHW works too, as [N, C, H*W] on the other side):
scaling W costs C*O multiplies per sample instead of C*H*W, and the product is written once, channels-last.

The gate's own fully connected layers, 1x1 convolutions of a [N, C, 1, 1] map, run as one oneDNN inner
product on [N, C] (`conv1x1_as_linear`, post-op included) instead of a convolution call.

Level 3 only, and only where measured faster: `choose(graph)` (run by numba_op.choose_fusions in the torch
native export when the level-3 elementwise_fusion pass ran) times both forms on random tensors of the node's
shapes, interleaved, and records conv.meta[META_KEY] = (kept, note, kind): "kept: se gate in the GEMM 0.70x",
"kept: 1x1 conv as inner product 0.60x" or "dropped: ... slower 1.10x". The export planner registered here
(exporter.FUSION_PLANNERS) lowers the kept ones: the Mul is skipped and the convolution becomes one
`se_gated_conv1x1` / `conv1x1_as_linear` call (plain functions, so the GraphModule saves, loads and traces like
the rest; under autograd, tracing or on other devices and dtypes they run the multiply and F.conv2d / F.linear).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from aiacc.core.ir import Graph, Node, Value
from aiacc.plugins.torch import fastpath
from aiacc.plugins.torch.exporter import FUSION_PLANNERS, Fusions, arg

META_KEY = "torch.se_gate"  # conv node.meta: (kept: bool, note, "gate" | "fc")
MODE_ENV = "AIACC_SE_GATE"  # "measure" (default), "on" (always, when it applies), "off"


@fastpath._fx_leaf
def se_gated_conv1x1(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     residual: torch.Tensor | None = None, attr: str = "none", scalars: list | tuple = (),
                     algorithm: str | None = None) -> torch.Tensor:
    """attr(conv2d(x * gate, weight, bias) + residual) for a 1x1, stride-1, unpadded, ungrouped convolution
    (weight [O, C, 1, 1], gate [N or 1, C, 1, 1]), as one batched GEMM with the gate folded into the weight.
    The output is channels-last where x is, else NCHW."""
    n, c, h, w = x.shape
    o = weight.shape[0]
    if not fastpath.usable(x, weight, bias) or gate.dtype is not torch.float32 or gate.shape[1] != c \
            or gate.numel() not in (c, n * c) or (residual is not None and residual.dtype is not torch.float32):
        y = F.conv2d(x * gate, weight, bias)
        if residual is not None:
            y = y + residual
        return fastpath._UNARY[attr](y, scalars, algorithm)
    g = gate.reshape(-1, c, 1)
    wt = weight.reshape(o, c)
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        xs = x.permute(0, 2, 3, 1).reshape(n, h * w, c)  # a view: [N, HW, C]
        wg = (wt.t().unsqueeze(0) * g).expand(n, c, o)  # [N, C, O] (one gate for the batch: broadcast)
        base = bias.view(1, 1, o) if bias is not None else None
        if residual is not None:
            r = residual.permute(0, 2, 3, 1).reshape(n, h * w, o)
            base = r if base is None else r + base
        y = torch.bmm(xs, wg) if base is None else torch.baddbmm(base, xs, wg)
        y = y.view(n, h, w, o).permute(0, 3, 1, 2)  # channels-last [N, O, H, W]
    else:
        xs = x.reshape(n, c, h * w)
        wg = (wt.unsqueeze(0) * g.view(-1, 1, c)).expand(n, o, c)  # [N, O, C]
        base = bias.view(1, o, 1) if bias is not None else None
        if residual is not None:
            r = residual.reshape(n, o, h * w)
            base = r if base is None else r + base
        y = torch.bmm(wg, xs) if base is None else torch.baddbmm(base, wg, xs)
        y = y.view(n, o, h, w)
    return fastpath._UNARY[attr](y, scalars, algorithm)


@fastpath._fx_leaf
def conv1x1_as_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, attr: str = "none",
                      scalars: list | tuple = (), algorithm: str | None = None) -> torch.Tensor:
    """attr(conv2d(x, weight, bias)) for a 1x1 convolution of a [N, C, 1, 1] map (squeeze-excite's FC
    layers) as one oneDNN inner product (fastpath.linear) on [N, C]: no convolution set-up per call."""
    n, c = x.shape[:2]
    o = weight.shape[0]
    return fastpath.linear(x.reshape(n, c), weight.reshape(o, c), bias, attr, scalars, algorithm).view(n, o, 1, 1)


def _static4(v: Value | None) -> bool:
    return v is not None and v.dtype == "float32" and v.shape is not None and len(v.shape) == 4 \
        and all(isinstance(d, int) for d in v.shape)


def match(conv: Node) -> tuple[Node, Value, Value, tuple] | None:
    """(the Mul, x, gate, oneDNN post-op) when `conv` is a 1x1 stride-1 unpadded ungrouped 2-D Conv /
    aiacc::FusedConv of `x * gate` with gate [N or 1, C, 1, 1], the product read by `conv` alone; else None."""
    if (conv.domain, conv.op) not in (("", "Conv"), ("aiacc", "FusedConv")) or len(conv.inputs) < 2:
        return None
    y, wv = conv.inputs[0], conv.inputs[1]
    mul = y.producer if y is not None else None
    if mul is None or (mul.domain, mul.op) != ("", "Mul") or y.is_graph_output or len(y.uses) != 1 \
            or not _static4(y) or not _static4(conv.output) or wv is None or wv.shape is None \
            or len(wv.shape) != 4 or tuple(wv.shape[2:]) != (1, 1) or wv.dtype != "float32":
        return None
    a = conv.attrs
    if not _conv_attrs_plain(conv):
        return None
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    if bias is not None and (bias.dtype != "float32" or bias.shape is None or len(bias.shape) != 1):
        return None
    residual = conv.inputs[3] if len(conv.inputs) > 3 else None
    if residual is not None and (not _static4(residual) or residual.shape != conv.output.shape):
        return None
    post = ("none", [], None)
    if conv.domain == "aiacc" and a.get("activation"):
        post = fastpath.onednn_activation(a.get("activation"), a.get("activation_params"))
        if post is None:
            return None
    n, c = y.shape[:2]
    for x, g in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
        if _static4(x) and tuple(x.shape) == tuple(y.shape) and _static4(g) \
                and tuple(g.shape) in ((n, c, 1, 1), (1, c, 1, 1)) and (n, c) != (1, 1):
            return mul, x, g, post
    return None


def _conv_attrs_plain(conv: Node) -> bool:
    a = conv.attrs
    return a.get("group", 1) == 1 and all(s == 1 for s in a.get("strides") or [1]) \
        and all(d == 1 for d in a.get("dilations") or [1]) and all(p == 0 for p in a.get("pads") or [0]) \
        and a.get("auto_pad", "NOTSET") in ("NOTSET", "VALID") and list(a.get("kernel_shape") or [1, 1]) == [1, 1]


def match_fc(conv: Node) -> tuple | None:
    """The oneDNN post-op when `conv` is a 1x1 Conv / aiacc::FusedConv (no residual) of a float32 [N, C, 1, 1]
    map, i.e. a fully connected layer; else None."""
    if (conv.domain, conv.op) not in (("", "Conv"), ("aiacc", "FusedConv")) or len(conv.inputs) < 2 \
            or (len(conv.inputs) > 3 and conv.inputs[3] is not None):
        return None
    x, wv = conv.inputs[0], conv.inputs[1]
    if not _static4(x) or tuple(x.shape[2:]) != (1, 1) or wv is None or wv.shape is None or len(wv.shape) != 4 \
            or tuple(wv.shape[2:]) != (1, 1) or wv.dtype != "float32" or not _static4(conv.output) \
            or not _conv_attrs_plain(conv):
        return None
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    if bias is not None and (bias.dtype != "float32" or bias.shape is None or len(bias.shape) != 1):
        return None
    if conv.domain == "aiacc" and conv.attrs.get("activation"):
        return fastpath.onednn_activation(conv.attrs.get("activation"), conv.attrs.get("activation_params"))
    return ("none", [], None)


def _fc_pair(conv: Node, post, rng) -> tuple:
    """(inner product, the 1x1 oneDNN convolution) as eager calls on random tensors of the node's shapes."""
    def t(shape):
        return torch.from_numpy(rng.standard_normal(shape).astype("float32"))

    x, w = t(conv.inputs[0].shape), t(conv.inputs[1].shape)
    bias = t(conv.inputs[2].shape) if len(conv.inputs) > 2 and conv.inputs[2] is not None else None
    attr, scalars, algorithm = post
    return (lambda: conv1x1_as_linear(x, w, bias, attr, scalars, algorithm),
            lambda: fastpath.conv2d(x, w, bias, [1, 1], [0, 0], [1, 1], 1, attr, scalars, algorithm))


def _pair(conv: Node, x: Value, g: Value, post, rng) -> tuple:
    """(gated GEMM, multiply then the oneDNN conv) as eager calls on random tensors of the node's shapes."""
    def t(shape):
        return torch.from_numpy(rng.standard_normal(shape).astype("float32"))

    xt = t(x.shape).contiguous(memory_format=torch.channels_last)  # as the convolution before returns it
    gt = torch.sigmoid(t(g.shape))
    w = t(conv.inputs[1].shape)
    bias = t(conv.inputs[2].shape) if len(conv.inputs) > 2 and conv.inputs[2] is not None else None
    res = conv.inputs[3] if len(conv.inputs) > 3 else None
    rt = t(res.shape).contiguous(memory_format=torch.channels_last) if res is not None else None
    attr, scalars, algorithm = post

    def fused():
        return se_gated_conv1x1(xt, gt, w, bias, rt, attr, scalars, algorithm)

    def unfused():
        if rt is not None:
            return fastpath.conv2d_add_(xt * gt, w, bias, [1, 1], [0, 0], [1, 1], 1, rt.clone(), attr, scalars,
                                        algorithm)
        return fastpath.conv2d(xt * gt, w, bias, [1, 1], [0, 0], [1, 1], 1, attr, scalars, algorithm)
    if rt is not None:  # both sides pay the residual's copy (conv2d_add_ writes into it)
        base = fused
        fused = lambda: (rt.clone(), base())  # noqa: E731
    return fused, unfused


def choose(graph: Graph, timer=None) -> dict[str, str]:
    """For each convolution `match` accepts (x * gate into a 1x1 conv), time the gated GEMM against the
    multiply and the convolution (level 2's form); for each `match_fc` accepts (a 1x1 conv of a 1x1 map),
    the inner product against the convolution; keep the faster: conv.meta[META_KEY] = (kept, note, kind).
    Returns {conv name: note}. `timer(fused, unfused) -> (s, s)` replaces the timing (tests);
    AIACC_SE_GATE=on / off skips it."""
    import os

    from aiacc.plugins.torch.numba_op import _time_pair

    mode = os.environ.get(MODE_ENV, "measure")
    timer = timer or _time_pair
    rng = np.random.default_rng(0)
    notes: dict[str, str] = {}
    seen: dict[tuple, tuple] = {}
    for node in graph:
        node.meta.pop(META_KEY, None)
        got = match(node)
        kind = "gate"
        if got is None:
            fc = match_fc(node)
            if fc is None:
                continue
            got, kind = (None, None, None, fc), "fc"
        _, x, g, post = got
        post = _post(node, post)
        what = "se gate in the GEMM" if kind == "gate" else "1x1 conv as inner product"
        if mode == "off":
            decision = (False, f"dropped: {MODE_ENV}=off", kind)
        elif mode == "on":
            decision = (True, f"kept: {what} ({MODE_ENV}=on)", kind)
        else:
            key = (kind, tuple(node.inputs[0].shape), None if g is None else tuple(g.shape),
                   tuple(node.inputs[1].shape), len(node.inputs), str(post))
            decision = seen.get(key)
            if decision is None:
                try:
                    pair = _pair(node, x, g, post, rng) if kind == "gate" else _fc_pair(node, post, rng)
                    f, u = timer(*pair)
                except Exception as e:  # noqa: BLE001  (a form that cannot run here is not kept)
                    decision = (False, f"dropped: {what} failed ({type(e).__name__}: {e})", kind)
                else:
                    r = f / u if u > 0 else float("inf")
                    decision = (True, f"kept: {what} {r:.2f}x", kind) if r < 1.0 else \
                        (False, f"dropped: {what} slower {r:.2f}x", kind)
                seen[key] = decision
        node.meta[META_KEY] = decision
        notes[node.name] = decision[1]
    return notes


def _post(conv: Node, post):
    """The post-op: the node's own activation, else the SiLU its reader became (numba_op's conv epilogue)."""
    epilogue = conv.meta.get("torch.conv_epilogue")
    return tuple(epilogue) if epilogue is not None and post[0] == "none" else post


def _plan(graph: Graph, f: Fusions) -> None:
    """Export planner: a kept gate (META_KEY) absorbs its Mul into one se_gated_conv1x1 call, a kept 1x1 map
    convolution becomes conv1x1_as_linear."""
    for node in graph:
        decision = node.meta.get(META_KEY)
        if not decision or not decision[0] or id(node) in f.special or id(node) in f.skip:
            continue
        if decision[2] == "fc":
            post = match_fc(node)
            if post is not None:
                f.special[id(node)] = _fc_special(node, _post(node, post))
            continue
        got = match(node)
        if got is None or id(got[0]) in f.special:
            continue
        mul, x, g, post = got
        f.skip.add(id(mul))
        f.special[id(node)] = _special(node, x, g, _post(node, post))


def _fc_special(conv: Node, post):
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    attr, scalars, algorithm = post

    def lower(b, ln, n):
        return [b.call(conv1x1_as_linear, arg(b, conv.inputs[0]), arg(b, conv.inputs[1]), arg(b, bias), attr,
                       list(scalars), algorithm)]
    return lower


def _special(conv: Node, x: Value, g: Value, post):
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    res = conv.inputs[3] if len(conv.inputs) > 3 else None
    attr, scalars, algorithm = post

    def lower(b, ln, n):
        b.uses_fastpath = True  # the output is channels-last like the fast path's
        return [b.call(se_gated_conv1x1, arg(b, x), arg(b, g), arg(b, conv.inputs[1]), arg(b, bias), arg(b, res),
                       attr, list(scalars), algorithm)]
    return lower


if _plan not in FUSION_PLANNERS:
    FUSION_PLANNERS.append(_plan)
