"""Pointwise (1x1) convolutions in the torch inference export (level 3) as one GEMM on the activation's own
memory, where measured faster than level 2's oneDNN convolution.

A 1x1, stride-1, unpadded, ungrouped convolution of a channels-last [N, C, H, W] map is the matrix product
X [N*H*W, C] @ W^T [C, O] on x's memory as it is (a view, no copy), written channels-last into a fresh
[N*H*W, O] tensor with the bias broadcast in the same call (`torch.addmm`, BLAS); a residual is added and the
activation applied in place on that result (an NCHW input runs as `W @ X[n]` per image, NCHW out). Measured
why (benchmarks/elementwise.py nets, 2 threads): oneDNN's pointwise convolution (fastpath.conv2d) has a large
fixed cost per call; called alone on the same tensors, batch-1 MobileNetV3-style 1x1 convolutions took
160-260 us where the GEMM took 43-110 us, but timed interleaved at optimize time the GEMM was 0.77x-0.98x at
batch 1 and 0.56x-1.22x at batch 8 (some layers favour oneDNN). So the form is chosen per node.

Level 3 only, and only where measured faster: `choose(graph)` (run by numba_op.choose_fusions in the torch
native export after se_gate.choose, when the level-3 elementwise_fusion pass ran) times both forms on random
tensors of the node's shapes, interleaved, and records conv.meta[META_KEY] = (kept, note): "kept: 1x1 conv as
GEMM 0.41x" or "dropped: 1x1 conv as GEMM slower 1.10x". A convolution whose squeeze-excite gate se_gate kept
in its own GEMM is no candidate. The export planner registered here (exporter.FUSION_PLANNERS) lowers the kept
ones to one `conv1x1_gemm` call (a plain function, so the GraphModule saves, loads and traces like the rest;
under autograd, tracing or on other devices and dtypes it runs F.conv2d, the residual and the activation).
AIACC_CONV1X1_GEMM=measure (default) | on | off.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from aiacc.core.ir import Graph, Node
from aiacc.plugins.torch import fastpath
from aiacc.plugins.torch.exporter import FUSION_PLANNERS, arg
from aiacc.plugins.torch.measured_choice import choose_per_node, kept_planner

META_KEY = "torch.conv1x1_gemm"  # conv node.meta: (kept: bool, note)
MODE_ENV = "AIACC_CONV1X1_GEMM"  # "measure" (default), "on" (always, where it applies), "off"
WHAT = "1x1 conv as GEMM"


class _Calls:
    """How many convolutions ran as the GEMM in this process (tests check the form really ran)."""
    count = 0


CALLS = _Calls()


def _transposed(weight: torch.Tensor) -> torch.Tensor:
    """A [O, C, 1, 1] weight as a contiguous [C, O] matrix, made once per weight (fastpath.prepared: re-made
    when the weight is another tensor or its storage or version changed)."""
    return fastpath.prepared("conv1x1_gemm.T", (weight,), lambda w: w.reshape(w.shape[0], -1).t().contiguous())


@fastpath._fx_leaf
def conv1x1_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 residual: torch.Tensor | None = None, attr: str = "none", scalars: list | tuple = (),
                 algorithm: str | None = None) -> torch.Tensor:
    """attr(conv2d(x, weight, bias) + residual) for a 1x1, stride-1, unpadded, ungrouped convolution (weight
    [O, C, 1, 1]), as one GEMM on x's memory; attr a oneDNN post-op name (fastpath._UNARY). The result is a
    fresh tensor, channels-last where x is (NCHW otherwise); `residual` is only read."""
    if x.dim() != 4 or not fastpath.usable(x, weight, bias) or x.numel() == 0 or weight.dim() != 4 \
            or weight.shape[1] != x.shape[1] or (residual is not None and (
                type(residual) is not torch.Tensor or residual.dtype is not torch.float32 or not residual.is_cpu
                or residual.shape != (x.shape[0], weight.shape[0], *x.shape[2:])
                or (torch.is_grad_enabled() and residual.requires_grad))):
        y = F.conv2d(x, weight, bias)
        if residual is not None:
            y = y + residual
        return fastpath._UNARY[attr](y, list(scalars), algorithm)
    n, c, h, w = x.shape
    o = weight.shape[0]
    if x.is_contiguous(memory_format=torch.channels_last):  # [N*HW, C] @ [C, O] -> [N*HW, O], channels-last
        hw = h * w
        xs = x.as_strided((n * hw, c), (c, 1))  # x's memory as [N*HW, C] (a view)
        wt = _transposed(weight)
        y = torch.mm(xs, wt) if bias is None else torch.addmm(bias, xs, wt)
        if residual is not None:
            y.add_(residual.as_strided((n * hw, o), (o, 1)) if residual.is_contiguous(
                memory_format=torch.channels_last) else residual.permute(0, 2, 3, 1).reshape(n * hw, o))
        if attr != "none":
            y = fastpath._UNARY[attr](y, scalars, algorithm)  # in place on the fresh product (GELU: a new one)
        out = y.as_strided((n, o, h, w), (hw * o, 1, w * o, o))  # [N, O, H, W] channels-last
    else:  # NCHW: W [O, C] @ x[n] [C, HW] per image -> [N, O, HW]
        xs = x.contiguous().view(n, c, h * w)
        wm = weight.reshape(o, c)
        y = torch.matmul(wm, xs)
        if bias is not None:
            y.add_(bias.view(1, o, 1))
        if residual is not None:
            y.add_(residual.reshape(n, o, h * w))
        out = fastpath._UNARY[attr](y, list(scalars), algorithm).view(n, o, h, w)
    CALLS.count += 1
    return out


def match(conv: Node) -> tuple | None:
    """The oneDNN post-op (attr, scalars, algorithm) when `conv` is a 1x1, stride-1, unpadded, ungrouped 2-D
    Conv / aiacc::FusedConv of a static float32 [N, C, H, W] map with H*W > 1 (residual allowed, activation one
    fastpath._UNARY has, its reader's SiLU epilogue included); else None."""
    from aiacc.plugins.torch.se_gate import _conv_attrs_plain, _post, _static4

    if (conv.domain, conv.op) not in (("", "Conv"), ("aiacc", "FusedConv")) or len(conv.inputs) < 2:
        return None
    x, wv = conv.inputs[0], conv.inputs[1]
    if not _static4(x) or x.shape[2] * x.shape[3] <= 1 or wv is None or wv.shape is None or len(wv.shape) != 4 \
            or tuple(wv.shape[2:]) != (1, 1) or wv.shape[1] != x.shape[1] or wv.dtype != "float32" \
            or not _static4(conv.output) or not _conv_attrs_plain(conv):
        return None
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    if bias is not None and (bias.dtype != "float32" or bias.shape is None or len(bias.shape) != 1):
        return None
    residual = conv.inputs[3] if len(conv.inputs) > 3 else None
    if residual is not None and (not _static4(residual) or tuple(residual.shape) != tuple(conv.output.shape)):
        return None
    post = ("none", [], None)
    if conv.domain == "aiacc" and conv.attrs.get("activation"):
        post = fastpath.onednn_activation(conv.attrs.get("activation"), conv.attrs.get("activation_params"))
        if post is None:
            return None
    post = _post(conv, post) if residual is None else post  # the SiLU epilogue only where no residual
    return post if post[0] in fastpath._UNARY else None


def _pair(conv: Node, post, rng) -> tuple:
    """(the GEMM, level 2's oneDNN convolution) as eager calls on random tensors of the node's shapes (the
    input channels-last, as the convolution before returns it)."""
    def t(shape):
        return torch.from_numpy(rng.standard_normal(shape).astype("float32"))

    xt = t(conv.inputs[0].shape).contiguous(memory_format=torch.channels_last)
    w = t(conv.inputs[1].shape)
    bias = t(conv.inputs[2].shape) if len(conv.inputs) > 2 and conv.inputs[2] is not None else None
    res = conv.inputs[3] if len(conv.inputs) > 3 else None
    rt = t(res.shape).contiguous(memory_format=torch.channels_last) if res is not None else None
    attr, scalars, algorithm = post
    one, zero = [1, 1], [0, 0]

    def fused():
        return conv1x1_gemm(xt, w, bias, rt, attr, list(scalars), algorithm)

    def unfused():
        if rt is None:
            return fastpath.conv2d(xt, w, bias, one, zero, one, 1, attr, list(scalars), algorithm)
        if attr in ("none", "relu"):  # level 2: the sum into the (dying) residual's memory, one call
            return fastpath.conv2d_add_(xt, w, bias, one, zero, one, 1, rt.clone(), attr, list(scalars), algorithm)
        y = fastpath.conv2d(xt, w, bias, one, zero, one, 1, "none", [], None).add_(rt)
        return fastpath._UNARY[attr](y, list(scalars), algorithm)
    if rt is not None:  # both sides pay the residual's copy (conv2d_add_ writes into it)
        base = fused
        fused = lambda: (rt.clone(), base())  # noqa: E731
    return fused, unfused


def choose(graph: Graph, timer=None) -> dict[str, str]:
    """For each convolution `match` accepts and se_gate did not take (conv.meta[se_gate.META_KEY] kept), time
    the GEMM against level 2's oneDNN convolution and keep the faster: conv.meta[META_KEY] = (kept, note).
    Returns {node name: note}. `timer(fused, unfused) -> (s, s)` replaces the timing (tests);
    AIACC_CONV1X1_GEMM=on / off skip it."""
    from aiacc.plugins.torch.se_gate import META_KEY as SE_KEY

    def taken_by_se_gate(node: Node) -> bool:  # its gate runs in se_gate's GEMM (or it is a kept squeeze's layer)
        se = node.meta.get(SE_KEY)
        return bool(se and se[0])

    return choose_per_node(graph, meta_key=META_KEY, mode_env=MODE_ENV, what=WHAT, kind="gemm", match=match,
                           make_pair=_pair, timer=timer, skip=taken_by_se_gate)


def _special(conv: Node, post):
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    res = conv.inputs[3] if len(conv.inputs) > 3 else None
    attr, scalars, algorithm = post

    def lower(b, ln, n):
        b.uses_fastpath = True  # the output is channels-last like the fast path's
        return [b.call(conv1x1_gemm, arg(b, conv.inputs[0]), arg(b, conv.inputs[1]), arg(b, bias), arg(b, res),
                       attr, list(scalars), algorithm)]
    return lower


# export planner: a kept convolution (META_KEY) becomes one conv1x1_gemm call
_plan = kept_planner(META_KEY, match, _special)
if _plan not in FUSION_PLANNERS:
    FUSION_PLANNERS.append(_plan)
