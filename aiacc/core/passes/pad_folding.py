"""Pad folded into the Conv or pooling op that reads it."""
from __future__ import annotations

import numpy as np

from aiacc.core.passes.manager import register_pass
from aiacc.core.passes.rewrite import Const, Op, Opt, RewritePass, Rule, RuleSet, RuleFailure, Var, const_value

_PAD = Op("Pad", Var("x"), Const("pads"), Opt("value"), Opt("axes"), name="pad", shared=True)


def _widths(m):
    """Per-axis [begin, end] of the Pad, or a reason string."""
    x = m["x"]
    if x.shape is None:
        return "the rank of the padded value is unknown"
    rank = len(x.shape)
    pads = [int(p) for p in m.const("pads").reshape(-1)]
    if m["axes"] is not None:
        axes_c = m.const("axes")
        if axes_c is None:
            return "the Pad axes are not constant"
        axes = [int(a) % rank for a in axes_c.reshape(-1)]
    else:
        axes = list(range(rank))
    if len(pads) != 2 * len(axes):
        return "malformed pads"
    widths = [[0, 0] for _ in range(rank)]
    for k, a in enumerate(axes):
        widths[a] = [pads[k], pads[len(axes) + k]]
    return widths


def _pad_value(m):
    if m["value"] is None:
        return 0.0
    c = m.const("value")
    if c is None:
        return None
    return float(c.reshape(-1)[0]) if c.size else 0.0


def _common_check(m, want_value):
    pad, root = m.node("pad"), m.root
    if pad.attr("mode", "constant") != "constant":
        return f"Pad<{pad.name}> mode is {pad.attr('mode')}, only constant padding folds"
    w = _widths(m)
    if isinstance(w, str):
        return w
    if any(p != 0 for p in w[0] + w[1]):
        return "the Pad pads the batch or channel axis"
    if any(p < 0 for pw in w for p in pw):
        return "the Pad crops (negative pads)"
    if root.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return f"{root.qualified_op}<{root.name}> uses auto_pad={root.attr('auto_pad')}"
    value = _pad_value(m)
    if value is None:
        return "the pad value is not constant"
    if not want_value(value):
        return f"pad value {value} differs from what {root.op} pads with"


def _new_attrs(m):
    root = m.root
    w = _widths(m)
    n = len(w) - 2
    old = list(root.attr("pads") or [0] * (2 * n)) if root.attr("auto_pad", "NOTSET") == "NOTSET" else [0] * (2 * n)
    pads = [old[i] + w[2 + i][0] for i in range(n)] + [old[n + i] + w[2 + i][1] for i in range(n)]
    attrs = dict(root.attrs, pads=pads)
    attrs.pop("auto_pad", None)
    return attrs


def _rewrite(m, b):
    root = m.root
    ins = [m["x"]] + list(root.inputs[1:])
    return b.node(root.op, ins, _new_attrs(m), domain=root.domain, name=root.name,
                  outputs=len(root.outputs)).outputs


def _check_conv(m):
    return _common_check(m, lambda v: v == 0.0)


# ops whose outputs are never negative, so zero padding before a max is padding with -inf
_NONNEGATIVE_ACTIVATIONS = {"Relu", "Sigmoid", "Softmax", "Abs", "Exp", "Softplus"}


def _nonnegative(v) -> bool:
    p = v.producer
    if p is None:
        return False
    if p.domain == "" and p.op in _NONNEGATIVE_ACTIVATIONS:
        return True
    if p.domain == "" and p.op == "Clip":
        lo = const_value(p.inputs[1]) if len(p.inputs) > 1 and p.inputs[1] is not None else None
        return lo is not None and lo.size == 1 and float(lo.reshape(-1)[0]) >= 0
    if p.domain == "aiacc" and p.op in ("FusedConv", "FusedGemm", "FusedMatMul"):
        act, params = p.attr("activation", ""), list(p.attr("activation_params") or [])
        return act in ("Relu", "Sigmoid") or (act == "Clip" and bool(params) and params[0] >= 0)
    return False


def _every_window_sees_input(m) -> str | None:
    """None when every pooling window of the folded MaxPool overlaps the unpadded input (pads below the
    kernel size, no dilation, floor mode), else why not."""
    root = m.root
    if root.attr("ceil_mode", 0):
        return "the MaxPool uses ceil_mode"
    if any(d != 1 for d in (root.attr("dilations") or [])):
        return "the MaxPool is dilated"
    attrs = _new_attrs(m)
    k = list(root.attr("kernel_shape"))
    pads = attrs["pads"]
    n = len(k)
    if any(pads[i] >= k[i] or pads[n + i] >= k[i] for i in range(n)):
        return f"pads {pads} reach a kernel size {k}: a window could hold only padding"
    return None


def _check_maxpool(m):
    if len(m.root.outputs) > 1 and (m.root.outputs[1].uses or m.root.outputs[1].is_graph_output):
        return "the MaxPool indices output is read (indices refer to the padded tensor)"
    if _pad_value(m) == 0.0 and _nonnegative(m["x"]):
        # max(reals + zeros) == max(reals) when the reals are >= 0 and every window holds one of them
        why = _common_check(m, lambda v: v == 0.0)
        return why or _every_window_sees_input(m)
    return _common_check(m, lambda v: v == -np.inf)


def _check_avgpool(m):
    root = m.root
    why = _common_check(m, lambda v: v == 0.0)
    if why:
        return why
    if not root.attr("count_include_pad", 0) and any(root.attr("pads") or []):
        return "the AveragePool has its own pads excluded from the divisor; the padded zeros would count differently"


def _rewrite_avgpool(m, b):
    root = m.root
    attrs = _new_attrs(m)
    attrs["count_include_pad"] = 1  # the Pad's zeros were real elements: they count in the divisor
    return b.node(root.op, [m["x"]], attrs, name=root.name).outputs


def _rewrite_maxpool(m, b):
    root = m.root
    if len(root.outputs) > 1:
        raise RuleFailure("indices output")
    return _rewrite(m, b)


# -- Transpose(Pad(x)) -> Pad(Transpose(x)): the Pad moves next to the Conv/Pool reading it ---------------
def _check_transpose_pad(m):
    x = m["x"]
    if x.shape is None:
        return "the rank of the padded value is unknown"
    w = _widths(m)
    if isinstance(w, str):
        return w
    if _pad_value_input_ok(m) is not None:
        return _pad_value_input_ok(m)


def _pad_value_input_ok(m):
    if m["value"] is not None and m.const("value") is None:
        return "the pad value is not constant"
    return None


def _rewrite_transpose_pad(m, b):
    rank = len(m["x"].shape)
    perm = m.root.attr("perm")
    perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
    w = _widths(m)
    pads = [w[p][0] for p in perm] + [w[p][1] for p in perm]
    t = b.op("Transpose", m["x"], perm=perm, name=m.root.name)
    pad = m.node("pad")
    ins = [t, b.const(np.asarray(pads, dtype=np.int64), "pads")] + ([m["value"]] if m["value"] is not None else [])
    return b.node("Pad", ins, {"mode": pad.attr("mode", "constant")}, name=pad.name).output


transpose_of_pad = Rule(
    "transpose_of_pad", Op("Transpose", Op("Pad", Var("x"), Const("pads"), Opt("value"), Opt("axes"), name="pad"),
                           name="t"),
    _rewrite_transpose_pad, _check_transpose_pad, modes=("inference",),
    doc="Transpose(Pad(x, pads)) is Pad(Transpose(x), pads permuted): the Pad then meets its Conv or Pool "
        "(TF pads NHWC before the transpose to NCHW). Inference only: it changes the memory layout a "
        "training-mode Dropout reading the result would draw its mask in.")

RULES = RuleSet([
    transpose_of_pad,
    Rule("pad_into_conv", [Op("Conv", _PAD, Var("w"), Opt("b"), name="conv"),
                           Op("FusedConv", _PAD, Var("w"), Opt("b"), Opt("r"), domain="aiacc", name="conv")],
         _rewrite, _check_conv, doc="Conv(Pad(x, zeros)) is Conv(x) with larger pads."),
    Rule("pad_into_maxpool", Op("MaxPool", _PAD, name="pool"), _rewrite_maxpool, _check_maxpool,
         doc="MaxPool(Pad(x, -inf)) is MaxPool(x) with larger pads."),
    Rule("pad_into_averagepool", Op("AveragePool", _PAD, name="pool"), _rewrite_avgpool, _check_avgpool,
         doc="AveragePool(Pad(x, zeros)) is AveragePool(x) with larger pads counted in the divisor."),
])

register_pass(RewritePass("pad_folding", RULES, level=2, doc="""
Fold a constant-mode Pad of the spatial axes into the pads of the Conv, MaxPool or AveragePool reading it:
zero padding into Conv, -inf padding into MaxPool (and zero padding of a non-negative value, e.g. a Relu
output, when every window still overlaps the input), zero padding into AveragePool (count_include_pad=1).
In inference mode a Transpose of a Pad (TF pads in NHWC, then transposes to NCHW) is first swapped into a
Pad of the Transpose, with the pads permuted, so the Pad meets the op reading it.

Assumes: the Pad pads only spatial axes, by non-negative constant amounts with a constant value.
Guarantees: identical outputs; a Pad read by other nodes stays for them; MaxPool with zero padding of a
value that may be negative (the max would differ where a window's values are all negative) is never folded.
""".strip()))
