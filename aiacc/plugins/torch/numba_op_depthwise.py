"""Depthwise convolutions in the torch inference export (level 3) as one numba kernel (folded BatchNorm's
bias and the activation fused), where measured faster than level 2's oneDNN convolution.

A depthwise convolution (groups == input channels == output channels, weight [C, 1, KH, KW]) of a
channels-last map runs as aiacc.core.runtime.numba_depthwise on the tensor's own memory viewed as NHWC (no
copy), into a fresh channels-last result. Measured why (2 threads, batch 1): oneDNN's depthwise convolution
takes 150-240 us per call whatever its size; the kernel takes 80-300 us on the MobileNetV3/EfficientNet
layers, so it wins on the small maps and loses on some large ones: the form is chosen per node. ReLU,
HardSwish, HardSigmoid, LeakyReLU and Clip run in the kernel; other activations (SiLU: numba's exp does not
vectorize without SVML) run after it, in place, as torch ops.

Level 3 only, and only where measured faster: `choose(graph)` (run by numba_op.choose_fusions in the torch
native export after se_gate.choose and pointwise.choose, when the level-3 elementwise_fusion pass ran) times
both forms on random tensors of the node's shapes, interleaved, and records conv.meta[META_KEY] = (kept,
note): "kept: depthwise conv in numba 0.61x" or "dropped: depthwise conv in numba slower 1.10x". The export
planner registered here (exporter.FUSION_PLANNERS) lowers the kept ones to one `depthwise_conv` call (a plain
function, so the GraphModule saves, loads and traces like the rest; under autograd, tracing, without numba or
on other devices and dtypes it runs F.conv2d and the activation). AIACC_DEPTHWISE=measure (default) | on | off.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from aiacc.core.ir import Graph, Node
from aiacc.plugins.torch import fastpath
from aiacc.plugins.torch.exporter import FUSION_PLANNERS, arg
from aiacc.plugins.torch.measured_choice import choose_per_node, kept_planner

try:
    from aiacc.core.runtime import numba_depthwise as _nd
except ImportError:  # no numba: the torch form only
    _nd = None

META_KEY = "torch.depthwise_numba"  # conv node.meta: (kept: bool, note)
MODE_ENV = "AIACC_DEPTHWISE"  # "measure" (default), "on" (always, where it applies), "off"
WHAT = "depthwise conv in numba"
MAX_KERNEL = 7  # filter sizes up to 7x7 are generated (unrolled taps)


def _kernel_act(attr: str, scalars) -> tuple[int, float, float] | None:
    """(ACTS code, p0, p1) when the kernel applies `attr` itself, else None (it runs after the kernel)."""
    if _nd is None or attr not in _nd.ACTS:
        return None
    s = list(scalars or [])
    if attr == "hardtanh":
        return _nd.ACTS[attr], float(s[0]), float(s[1])
    if attr == "leaky_relu":
        return _nd.ACTS[attr], float(s[0]) if s else 0.01, 0.0
    return _nd.ACTS[attr], 0.0, 0.0


def _weights(w: torch.Tensor, b: torch.Tensor | None, sh: int, sw: int, act: int):
    """(the [C, 1, KH, KW] weight as a contiguous [KH, KW, C] array, the bias (zeros if none) as numpy, the
    compiled kernel for its size, stride and activation), made once per weight (fastpath.prepared)."""
    wn = w.detach()[:, 0].permute(1, 2, 0).contiguous().numpy()
    bn = (b.detach().contiguous() if b is not None else torch.zeros(w.shape[0])).numpy()
    return wn, bn, _nd.depthwise_kernel(w.shape[2], w.shape[3], sh, sw, act)


@fastpath._fx_leaf
def depthwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: list[int],
                   padding: list[int], attr: str = "none", scalars: list | tuple = (),
                   algorithm: str | None = None) -> torch.Tensor:
    """attr(F.conv2d(x, weight, bias, stride, padding, groups=C)) for a depthwise convolution (weight
    [C, 1, KH, KW], x [N, C, H, W]); attr a oneDNN post-op name (fastpath._UNARY). One numba kernel call on
    x's memory (made channels-last if it is not) where it applies: CPU float32, no autograd, no tracer, numba
    present. The result is a fresh channels-last tensor there."""
    if _nd is None or x.dim() != 4 or not fastpath.usable(x, weight, bias) or x.numel() == 0 \
            or weight.dim() != 4 or weight.shape[1] != 1 or weight.shape[0] != x.shape[1] \
            or max(weight.shape[2:]) > MAX_KERNEL:
        y = F.conv2d(x, weight, bias, stride, padding, 1, x.shape[1] if x.dim() == 4 else 1)
        return fastpath._UNARY[attr](y, list(scalars), algorithm)
    sh, sw = stride
    ph, pw = padding
    n, c, h, w = x.shape
    kh, kw = weight.shape[2:]
    code, p0, p1 = _kernel_act(attr, scalars) or (0, 0.0, 0.0)
    wn, bn, mod = fastpath.prepared(("depthwise", sh, sw, code), (weight, bias),
                                    lambda a, b: _weights(a, b, sh, sw, code))
    if not x.is_contiguous(memory_format=torch.channels_last):
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.empty((n, c, (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1),
                    memory_format=torch.channels_last)
    # numpy's transpose of the channels-last memory is the C-contiguous NHWC array the kernel takes (a view;
    # numpy's own view costs a fraction of a torch permute, which is most of this call's overhead at batch 1)
    _nd.depthwise(mod, x.numpy().transpose(0, 2, 3, 1), wn, bn, y.numpy().transpose(0, 2, 3, 1), ph, pw, p0, p1)
    if code == 0 and attr != "none":
        y = fastpath._UNARY[attr](y, list(scalars), algorithm)  # in place on the fresh result (GELU: a new one)
    return y


def match(conv: Node) -> tuple | None:
    """(stride, padding, (attr, scalars, algorithm)) when `conv` is a 2-D Conv / aiacc::FusedConv that is
    depthwise (group == input == output channels, weight [C, 1, KH, KW] up to MAX_KERNEL), dilation 1,
    symmetric padding, no residual, of a static float32 [N, C, H, W] map, its activation one fastpath._UNARY
    has (its reader's SiLU epilogue included); else None."""
    from aiacc.plugins.torch.se_gate import _post, _static4

    if (conv.domain, conv.op) not in (("", "Conv"), ("aiacc", "FusedConv")) or len(conv.inputs) < 2:
        return None
    x, wv = conv.inputs[0], conv.inputs[1]
    if not _static4(x) or wv is None or wv.shape is None or len(wv.shape) != 4 or wv.dtype != "float32" \
            or not _static4(conv.output):
        return None
    c = x.shape[1]
    a = conv.attrs
    pads = list(a.get("pads") or [0, 0, 0, 0])
    if a.get("group", 1) != c or tuple(wv.shape[:2]) != (c, 1) or max(wv.shape[2:]) > MAX_KERNEL \
            or any(d != 1 for d in a.get("dilations") or [1]) or a.get("auto_pad", "NOTSET") != "NOTSET" \
            or len(pads) != 4 or pads[0] != pads[2] or pads[1] != pads[3]:
        return None
    strides = list(a.get("strides") or [1, 1])
    if len(strides) != 2 or tuple(conv.output.shape[:2]) != (x.shape[0], c):
        return None
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    if bias is not None and (bias.dtype != "float32" or bias.shape is None or len(bias.shape) != 1):
        return None
    if len(conv.inputs) > 3 and conv.inputs[3] is not None:
        return None
    post = ("none", [], None)
    if conv.domain == "aiacc" and a.get("activation"):
        post = fastpath.onednn_activation(a.get("activation"), a.get("activation_params"))
        if post is None:
            return None
    post = _post(conv, post)
    if post[0] not in fastpath._UNARY:
        return None
    return strides, [pads[0], pads[1]], post


def _pair(conv: Node, got, rng) -> tuple:
    """(the numba kernel, level 2's oneDNN convolution) as eager calls on random tensors of the node's shapes
    (the input channels-last, as the convolution before returns it)."""
    def t(shape):
        return torch.from_numpy(rng.standard_normal(shape).astype("float32"))

    strides, pads, (attr, scalars, algorithm) = got
    xt = t(conv.inputs[0].shape).contiguous(memory_format=torch.channels_last)
    w = t(conv.inputs[1].shape)
    bias = t(conv.inputs[2].shape) if len(conv.inputs) > 2 and conv.inputs[2] is not None else None
    c = xt.shape[1]
    return (lambda: depthwise_conv(xt, w, bias, strides, pads, attr, list(scalars), algorithm),
            lambda: fastpath.conv2d(xt, w, bias, strides, pads, [1, 1], c, attr, list(scalars), algorithm))


def choose(graph: Graph, timer=None) -> dict[str, str]:
    """For each convolution `match` accepts, time the numba kernel against level 2's oneDNN convolution and
    keep the faster: conv.meta[META_KEY] = (kept, note). Returns {node name: note}. `timer(fused, unfused) ->
    (s, s)` replaces the timing (tests); AIACC_DEPTHWISE=on / off skip it."""
    return choose_per_node(graph, meta_key=META_KEY, mode_env=MODE_ENV, what=WHAT, kind="numba", match=match,
                           make_pair=_pair, timer=timer,
                           unavailable="numba is not installed" if _nd is None else None)


def _special(conv: Node, got):
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    strides, pads, (attr, scalars, algorithm) = got

    def lower(b, ln, n):
        b.uses_fastpath = True  # the output is channels-last like the fast path's
        return [b.call(depthwise_conv, arg(b, conv.inputs[0]), arg(b, conv.inputs[1]), arg(b, bias),
                       list(strides), list(pads), attr, list(scalars), algorithm)]
    return lower


# export planner: a kept depthwise convolution (META_KEY) becomes one depthwise_conv call
_plan = kept_planner(META_KEY, match, _special)
if _plan not in FUSION_PLANNERS:
    FUSION_PLANNERS.append(_plan)
