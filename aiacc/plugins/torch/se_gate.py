"""Squeeze-excite's tail in the torch inference export (level 3): `Conv1x1(x * gate)` as one batched GEMM on
x's own memory with the gate folded into the weight, instead of a full pass over x for the broadcast multiply
and then the convolution.

A squeeze-excite block (EfficientNet's MBConv, MobileNetV3) ends in `y = x * gate` with gate [N, C, 1, 1],
read by the 1x1 projection convolution. Since `W @ (x * g) == (W * g) @ x` per sample, the export runs
`torch.baddbmm(bias [+ residual], X, (W^T * g))` where X is x viewed as [N, H*W, C] (a view of the
channels-last tensor the oneDNN convolutions return; NCHW works too, as [N, C, H*W] on the other side):
scaling W costs C*O multiplies per sample instead of C*H*W, and the product is written once, channels-last.

The gate's own fully connected layers, 1x1 convolutions of a [N, C, 1, 1] map, run as F.linear at level 2
already (fastpath.conv2d); the oneDNN inner product that was timed against them here (`conv1x1_as_linear`)
was dropped as slower on every such layer of the benchmark nets (50 of 50 at batch 8), so it is no candidate
any more (the function stays, so modules saved by earlier versions load).

The squeeze itself, `act2(fc2(act1(fc1(GlobalAveragePool(x)))))` (act1 a fused activation or the SiLU
FusedElementwise after fc1), runs as one numba kernel (`se_squeeze`, aiacc/core/runtime/numba_se.py): one pass
over x for the mean, both layers on the pooled vector. Measured why (benchmarks/elementwise.py nets, 2 threads):
oneDNN sets up a convolution (or inner product) of a [N, C, 1, 1] map in 80-140 us per call whatever its size,
so level 2's pool + two 1x1 convolutions cost 250-380 us per block at batch 1, the kernel 24-60 us.

Level 3 only, and only where measured faster: `choose(graph)` (run by numba_op.choose_fusions in the torch
native export when the level-3 elementwise_fusion pass ran) times both forms on random tensors of the node's
shapes, interleaved, and records conv.meta[META_KEY] = (kept, note, kind): "kept: se gate in the GEMM 0.70x",
"kept: se squeeze in one numba kernel 0.12x" (on the second FC) or "dropped: ... slower 1.10x". The export
planner registered here (exporter.FUSION_PLANNERS) lowers the kept ones: the Mul is skipped and the convolution
becomes one `se_gated_conv1x1` call, or the pool and both layers one `se_squeeze` call (plain functions, so the
GraphModule saves, loads and traces like the rest; under autograd, tracing or on other devices and dtypes they
run the same ops in torch).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from aiacc.core.ir import Graph, Node, Value
from aiacc.plugins.torch import fastpath
from aiacc.plugins.torch.exporter import FUSION_PLANNERS, Fusions, arg

META_KEY = "torch.se_gate"  # conv node.meta: (kept: bool, note, "gate" | "squeeze")
MODE_ENV = "AIACC_SE_GATE"  # "measure" (default), "on" (always, when it applies), "off"
# the squeeze kernel: "measure" (default), "on", "off"; unset it follows an explicit AIACC_SE_GATE=on|off as
# "off" (that pins level 2's squeeze), else measures
SQUEEZE_ENV = "AIACC_SE_SQUEEZE"

try:  # numba only inside aiacc/core/runtime; without it the squeeze is never a candidate
    from aiacc.core.runtime import numba_se as _numba_se
except ImportError:  # pragma: no cover - numba missing
    _numba_se = None


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
    layers) as one oneDNN inner product (fastpath.linear) on [N, C]. No longer chosen (level 2's F.linear is
    faster); kept so GraphModules saved by earlier versions still load."""
    n, c = x.shape[:2]
    o = weight.shape[0]
    return fastpath.linear(x.reshape(n, c), weight.reshape(o, c), bias, attr, scalars, algorithm).view(n, o, 1, 1)


def _act_code(attr: str, scalars) -> tuple[int, tuple[float, float]] | None:
    """A oneDNN post-op (attr, scalars) as the squeeze kernel's activation code and params, or None."""
    if _numba_se is None or attr not in _numba_se.ACTS:
        return None
    params = [float(v) for v in (scalars or [])]
    if attr == "hardsigmoid":
        params = params or [1 / 6, 0.5]
    elif attr == "leaky_relu":
        params = params or [0.01]
    return _numba_se.ACTS[attr], tuple((params + [0.0, 0.0])[:2])


def _squeeze_weights(w1, b1, w2, b2, act1, scalars1, act2, scalars2):
    """What the squeeze kernel takes besides x, made once per weights (fastpath.prepared): (w1t [C, R], b1,
    w2t [R, C], b2 as C-contiguous float32 arrays, (act1, params1), (act2, params2)), or None where the
    kernel does not apply (shapes, dtypes, devices, an activation it lacks)."""
    codes = (_act_code(act1, scalars1), _act_code(act2, scalars2))
    f32 = torch.float32
    if None in codes or any(t is not None and (t.dtype is not f32 or not t.is_cpu or t.is_mkldnn)
                            for t in (w1, b1, w2, b2)) or w1.dim() != 4 or w2.dim() != 4 \
            or tuple(w1.shape[2:]) != (1, 1) or tuple(w2.shape[2:]) != (1, 1) or w1.shape[0] != w2.shape[1] \
            or w1.shape[1] != w2.shape[0]:
        return None
    r, c = w1.shape[:2]
    t1 = w1.reshape(r, c).t().contiguous().numpy()
    t2 = w2.reshape(c, r).t().contiguous().numpy()
    bias1 = (b1.detach().contiguous() if b1 is not None else torch.zeros(r)).numpy()
    bias2 = (b2.detach().contiguous() if b2 is not None else torch.zeros(c)).numpy()
    return t1, bias1, t2, bias2, codes[0], codes[1]


@fastpath._fx_leaf
def se_squeeze(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor,
               b2: torch.Tensor | None, act1: str = "none", scalars1: list | tuple = (), act2: str = "none",
               scalars2: list | tuple = ()) -> torch.Tensor:
    """Squeeze-excite's gate act2(conv2d(act1(conv2d(adaptive_avg_pool2d(x, 1), w1, b1)), w2, b2)), [N, C, 1, 1]
    (w1 [R, C, 1, 1], w2 [C, R, 1, 1]; acts oneDNN post-op names), as one numba kernel call on x's memory
    (channels-last or NCHW) where it applies: CPU float32, no autograd, no tracer. Elsewhere the same ops in
    torch. The per-call work besides the kernel is kept small (weights prepared once, numpy views of x)."""
    if _numba_se is not None and x.dim() == 4 and fastpath.usable(x, w1, b1) and x.numel() > 0 \
            and not (torch.is_grad_enabled() and (w2.requires_grad or (b2 is not None and b2.requires_grad))):
        prep = fastpath.prepared(("se_squeeze", act1, tuple(scalars1), act2, tuple(scalars2)), (w1, b1, w2, b2),
                                 lambda *ts: _squeeze_weights(*ts, act1, scalars1, act2, scalars2))
        n, c, h, w = x.shape
        if prep is not None and prep[0].shape[0] == c:
            t1, bias1, t2, bias2, (a1, p1), (a2, p2) = prep
            xn = x.numpy()
            if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
                x3, last = xn.transpose(0, 2, 3, 1).reshape(n, h * w, c), True  # a view: [N, HW, C]
            else:
                x3, last = np.ascontiguousarray(xn).reshape(n, c, h * w), False
            out = torch.empty(n, c, 1, 1)
            _numba_se.se_squeeze(x3, last, t1, bias1, t2, bias2, a1, a2, out.numpy().reshape(n, c), p1, p2)
            return out
    s = F.adaptive_avg_pool2d(x, 1)
    s = fastpath._UNARY[act1](F.conv2d(s, w1, b1), list(scalars1), None)
    return fastpath._UNARY[act2](F.conv2d(s, w2, b2), list(scalars2), None)


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


def _single_reader(v: Value | None) -> Node | None:
    if v is None or v.is_graph_output or len(v.uses) != 1:
        return None
    return v.users()[0]


def match_squeeze(fc2: Node) -> tuple | None:
    """(pool, fc1, the SiLU FusedElementwise between them or None, x, post1, post2) when `fc2` ends a squeeze
    `fc2(act1(fc1(GlobalAveragePool(x))))`: fc1 and fc2 1x1 convolutions of [N, C, 1, 1] maps (match_fc),
    act1 fc1's own post-op or a SiLU FusedElementwise reading it, every intermediate read by the next step
    alone, x a static float32 4-D map, both activations ones the kernel has; else None."""
    post2 = match_fc(fc2)
    if post2 is None:
        return None
    v = fc2.inputs[0]
    p = v.producer if v is not None else None
    fe = None
    if p is not None and (p.domain, p.op) == ("aiacc", "FusedElementwise"):
        from aiacc.plugins.torch.numba_op import EPILOGUES

        if p.attrs.get("program") not in EPILOGUES or len(p.inputs) != 1 or _single_reader(v) is not fc2:
            return None
        fe, v = p, p.inputs[0]
        p = v.producer if v is not None else None
    if p is None or _single_reader(v) is not (fe or fc2):
        return None
    fc1 = p
    post1 = match_fc(fc1)
    if post1 is None:
        return None
    post1 = _post(fc1, post1)
    if fe is not None:
        if post1[0] not in ("none", "swish"):
            return None
        post1 = tuple(EPILOGUES[fe.attrs["program"]])
    pv = fc1.inputs[0]
    pool = pv.producer if pv is not None else None
    if pool is None or (pool.domain, pool.op) != ("", "GlobalAveragePool") or _single_reader(pv) is not fc1:
        return None
    x = pool.inputs[0]
    if not _static4(x) or fc1.inputs[1].shape[1] != x.shape[1] or fc2.inputs[1].shape[0] != x.shape[1]:
        return None
    post2 = _post(fc2, post2)
    if _act_code(post1[0], post1[1]) is None or _act_code(post2[0], post2[1]) is None \
            or post1[2] not in (None, "none") or post2[2] not in (None, "none"):
        return None
    return pool, fc1, fe, x, post1, post2


def _squeeze_pair(got, fc2: Node, rng) -> tuple:
    """(the squeeze kernel, level 2's pool and two oneDNN 1x1 convolutions) on random tensors of the shapes."""
    pool, fc1, fe, x, post1, post2 = got

    def t(shape):
        return torch.from_numpy(rng.standard_normal(shape).astype("float32"))

    xt = t(x.shape).contiguous(memory_format=torch.channels_last)  # as the convolution before returns it
    w1, w2 = t(fc1.inputs[1].shape), t(fc2.inputs[1].shape)
    b1 = t(fc1.inputs[2].shape) if len(fc1.inputs) > 2 and fc1.inputs[2] is not None else None
    b2 = t(fc2.inputs[2].shape) if len(fc2.inputs) > 2 and fc2.inputs[2] is not None else None
    one, zero = [1, 1], [0, 0]

    def unfused():
        s = F.adaptive_avg_pool2d(xt, 1)
        s = fastpath.conv2d(s, w1, b1, one, zero, one, 1, post1[0], list(post1[1]), post1[2])
        return fastpath.conv2d(s, w2, b2, one, zero, one, 1, post2[0], list(post2[1]), post2[2])
    return (lambda: se_squeeze(xt, w1, b1, w2, b2, post1[0], list(post1[1]), post2[0], list(post2[1])),
            unfused)


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
    multiply and the convolution (level 2's form) and keep the faster: conv.meta[META_KEY] = (kept, note, kind).
    Before those, each squeeze match_squeeze accepts: the numba kernel against the pool and two convolutions
    (its note under the pool's name; a kept one's fc1 and fc2 are no candidates for the other forms).
    Returns {node name: note}. `timer(fused, unfused) -> (s, s)` replaces the timing (tests);
    AIACC_SE_GATE=on / off and AIACC_SE_SQUEEZE=on / off skip it."""
    import os

    from aiacc.plugins.torch.numba_op import _time_pair

    mode = os.environ.get(MODE_ENV, "measure")
    timer = timer or _time_pair
    rng = np.random.default_rng(0)
    notes: dict[str, str] = {}
    seen: dict[tuple, tuple] = {}
    squeezed = _choose_squeezes(graph, timer, rng, notes)
    for node in graph:
        if id(node) in squeezed:
            continue
        node.meta.pop(META_KEY, None)
        got = match(node)
        if got is None:
            continue
        kind = "gate"
        _, x, g, post = got
        post = _post(node, post)
        what = "se gate in the GEMM"
        if mode == "off":
            decision = (False, f"dropped: {MODE_ENV}=off", kind)
        elif mode == "on":
            decision = (True, f"kept: {what} ({MODE_ENV}=on)", kind)
        else:
            key = (kind, tuple(node.inputs[0].shape), tuple(g.shape), tuple(node.inputs[1].shape), len(node.inputs),
                   str(post))
            decision = _measured(seen, key, what, kind, timer, lambda: _pair(node, x, g, post, rng))
        node.meta[META_KEY] = decision
        notes[node.name] = decision[1]
    return notes


def _measured(seen: dict, key: tuple, what: str, kind: str, timer, make_pair) -> tuple:
    """(kept, note, kind) for one candidate form against level 2's: `make_pair()` gives (fused, unfused)
    callables, timed once per `key` (the decision is kept in `seen` for nodes of the same shapes); kept only
    where clearly faster (timing.KEEP_BELOW), dropped otherwise or where it fails here."""
    decision = seen.get(key)
    if decision is None:
        try:
            f, u = timer(*make_pair())
        except Exception as e:  # noqa: BLE001  (a form that cannot run here is not kept)
            decision = (False, f"dropped: {what} failed ({type(e).__name__}: {e})", kind)
        else:
            from aiacc.plugins.timing import keep_note

            decision = (*keep_note(what, f / u if u > 0 else float("inf")), kind)
        seen[key] = decision
    return decision


def _choose_squeezes(graph: Graph, timer, rng, notes: dict) -> set[int]:
    """The squeeze kernel against level 2's pool and convolutions, per match_squeeze: fc2.meta[META_KEY] =
    (kept, note, "squeeze"), the note in `notes`. Returns the ids of fc1 and fc2 of kept squeezes (not
    candidates for the gate form)."""
    import os

    mode = os.environ.get(SQUEEZE_ENV) or ("off" if os.environ.get(MODE_ENV, "measure") != "measure" else "measure")
    taken: set[int] = set()
    seen: dict[tuple, tuple] = {}
    what = "se squeeze in one numba kernel"
    for node in graph:
        node.meta.pop(META_KEY, None)
        got = match_squeeze(node) if _numba_se is not None and mode != "off" else None
        if got is None:
            continue
        pool, fc1, fe, x, post1, post2 = got
        if mode == "on":
            decision = (True, f"kept: {what} ({SQUEEZE_ENV}=on)", "squeeze")
        else:
            key = (tuple(x.shape), tuple(fc1.inputs[1].shape), len(fc1.inputs), len(node.inputs), str(post1),
                   str(post2))
            decision = _measured(seen, key, what, "squeeze", timer, lambda: _squeeze_pair(got, node, rng))
        node.meta[META_KEY] = decision
        notes[pool.name] = decision[1]  # by the pool's name (the squeeze's first node)
        if decision[0]:
            fc1.meta.pop(META_KEY, None)
            taken.update((id(fc1), id(node)))
    return taken


def _post(conv: Node, post):
    """The post-op: the node's own activation, else the SiLU its reader became (numba_op's conv epilogue)."""
    epilogue = conv.meta.get("torch.conv_epilogue")
    return tuple(epilogue) if epilogue is not None and post[0] == "none" else post


def _plan(graph: Graph, f: Fusions) -> None:
    """Export planner: a kept gate (META_KEY) absorbs its Mul into one se_gated_conv1x1 call, a kept squeeze
    absorbs its pool, fc1 (and SiLU) into one se_squeeze call on fc2."""
    for node in graph:
        decision = node.meta.get(META_KEY)
        if not decision or not decision[0] or id(node) in f.special or id(node) in f.skip:
            continue
        if decision[2] == "squeeze":
            got = match_squeeze(node)
            if got is not None and not any(id(n) in f.special or id(n) in f.skip for n in got[:3] if n is not None):
                f.skip.update(id(n) for n in got[:3] if n is not None)
                f.special[id(node)] = _squeeze_special(node, got)
            continue
        got = match(node)
        if got is None or id(got[0]) in f.special:
            continue
        mul, x, g, post = got
        f.skip.add(id(mul))
        f.special[id(node)] = _special(node, x, g, _post(node, post))


def _squeeze_special(fc2: Node, got):
    pool, fc1, fe, x, post1, post2 = got
    b1 = fc1.inputs[2] if len(fc1.inputs) > 2 else None
    b2 = fc2.inputs[2] if len(fc2.inputs) > 2 else None

    def lower(b, ln, n):
        return [b.call(se_squeeze, arg(b, x), arg(b, fc1.inputs[1]), arg(b, b1), arg(b, fc2.inputs[1]), arg(b, b2),
                       post1[0], list(post1[1]), post2[0], list(post2[1]))]
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
