"""Converters of the loss functions models compute inside their forward (transformers' heads called with
`labels=`: cross entropy for classification, masked and causal LM, MSE for regression, BCE-with-logits for
multi-label): torch.nn.functional's losses, their nn.Module forms and the aten ops torch.export keeps them as
(`cross_entropy_loss`, `nll_loss_forward`, `mse_loss`, ...).

Cross entropy is written without an index gather: the target's one-hot (Equal against the class range) picks
the log-probability, so an ignored target (ignore_index=-100, outside the classes) picks nothing, no shape is
fixed but the class count, and the batch stays dynamic. The arithmetic follows torch's (aten LossNLL.cpp):
mean divides by the summed weight of the targets not ignored, label smoothing mixes in the mean of the
log-probabilities over the classes, probability targets divide by the number of rows.
"""
from __future__ import annotations

import numpy as np
from torch import nn
import torch.nn.functional as F

from aiacc.core.ir import Value
from aiacc.core.translate import Untranslatable
from aiacc.plugins.torch.import_ops.common import rank, tensor
from aiacc.plugins.torch.importer import ATEN, FUNCTIONS, MODULES

_ATEN_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}  # at::Reduction's enum, as aten ops take it


def reduction_of(reduction, size_average=None, reduce=None) -> str:
    """"none" / "mean" / "sum" from a loss's reduction (a string, or aten's int) and the legacy
    size_average / reduce flags (torch's own rule: reduce=False is "none", size_average=False is "sum")."""
    if size_average is not None or reduce is not None:
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        return "none" if not reduce else ("mean" if size_average else "sum")
    if isinstance(reduction, int) and not isinstance(reduction, bool):
        reduction = _ATEN_REDUCTIONS.get(reduction, reduction)
    if reduction not in ("none", "mean", "sum"):
        raise Untranslatable(f"reduction {reduction!r}")
    return reduction


def _float(x, what: str) -> Value:
    x = tensor(x, what)
    if x.dtype is None or np.dtype(x.dtype).kind != "f":
        raise Untranslatable(f"{what} of dtype {x.dtype} (a loss needs a floating point tensor)")
    return x


def _all_axes(imp, op: str, x: Value) -> Value:
    r = rank(x)
    return x if r == 0 else imp.op(op, x, imp.ints(range(r)), keepdims=0)


def _reduce(imp, loss: Value, reduction: str) -> Value:
    if reduction == "none":
        return loss
    return _all_axes(imp, "ReduceMean" if reduction == "mean" else "ReduceSum", loss)


def _on_class_axis(imp, v: Value, r: int, axis: int) -> Value:
    """A [C] vector shaped to broadcast along the class axis of a rank-r input."""
    if r == 1:
        return v
    shape = [1] * r
    shape[axis] = -1
    return imp.op("Reshape", v, imp.ints(shape))


def all_in_range(imp, ids: Value, upper: int, also=None, lower: int = 0) -> Value:
    """A boolean scalar: every element of the integer tensor `ids` is in lower..upper-1 (or equals `also`,
    when given); true for an empty tensor. The condition of the run-time index checks (check_targets,
    indexing.check_index)."""
    inside = imp.op("And", imp.op("GreaterOrEqual", ids, imp.const(np.asarray(lower, dtype=ids.dtype))),
                    imp.op("Less", ids, imp.const(np.asarray(upper, dtype=ids.dtype))))
    if also is not None:
        inside = imp.op("Or", inside, imp.op("Equal", ids, imp.const(np.asarray(also, dtype=ids.dtype))))
    bad = _all_axes(imp, "ReduceSum", imp.op("Cast", imp.op("Not", inside), to="int64"))
    return imp.op("Equal", bad, imp.const(np.asarray(0, dtype=np.int64)))


def check_targets(imp, target: Value, classes: int, what: str, ignore_index=None) -> None:
    """A run-time check that every class-index target is in 0..classes-1 (or is `ignore_index`): torch raises
    on any other (nll_loss: IndexError 'Target 7 is out of bounds.', multi_margin_loss: 'target out of range',
    one_hot: 'Class values must be smaller than num_classes'), while the one-hot the converters pick a class
    with would pick none and return a number. An aiacc::ValueGuard with its own message (a GuardError naming
    the op and the range), run on every backend like the tracer's branch guards; an empty target passes."""
    ok = all_in_range(imp, target, classes, ignore_index)
    allowed = f"0..{classes - 1}" + ("" if ignore_index is None else f" or ignore_index={ignore_index}")
    message = (f"{what} (node {imp.current.name}): a target is " +
               (f"not in the classes 0..{classes - 1}" if ignore_index is None else
                f"neither in the classes 0..{classes - 1} nor ignore_index={ignore_index}") +
               ", where torch raises an error; the optimized model refuses the call rather than return a value "
               "that counts no class for it")
    imp.graph.add_node("ValueGuard", [ok], {"expected": 1, "what": f"{what}'s targets in {allowed}",
                                            "message": message}, domain="aiacc", name=f"{imp.current.name}_targets")


def nll(imp, logp, target, weight=None, reduction="mean", ignore_index=-100, label_smoothing=0.0,
        what="nll_loss"):
    """The negative log-likelihood (see `nll_and_total`)."""
    return nll_and_total(imp, logp, target, weight, reduction, ignore_index, label_smoothing, what)[0]


def nll_and_total(imp, logp, target, weight=None, reduction="mean", ignore_index=-100,
                  label_smoothing=0.0, what="nll_loss"):
    """(loss, total weight): the negative log-likelihood of class-index targets (or cross entropy of
    probability targets) from log-probabilities `logp` whose class axis is 1 (0 when unbatched), with torch's
    reduction, ignore_index, class weights and label smoothing. The total weight is the summed weight of the
    targets not ignored (the divisor of "mean"; None for probability targets)."""
    logp = _float(logp, "input")
    target = tensor(target, "target")
    r = rank(logp)
    if r == 0:
        raise Untranslatable("a 0-d loss input")
    axis = 1 if r >= 2 else 0
    classes = logp.shape[axis]
    if not isinstance(classes, int):
        raise Untranslatable("the class dimension is not static")
    w = None if weight is None else _on_class_axis(imp, _float(weight, "weight"), r, axis)
    if w is not None and w.dtype != logp.dtype:
        w = imp.op("Cast", w, to=logp.dtype)
    ls = float(label_smoothing or 0.0)

    def class_sum(v):  # summed over the class axis
        return imp.op("ReduceSum", v, imp.ints([axis]), keepdims=0)

    if np.dtype(target.dtype or "int64").kind == "f":  # class probabilities, the input's shape
        if rank(target) != r:
            raise Untranslatable("probability targets of another rank than the input")
        t = target if target.dtype == logp.dtype else imp.op("Cast", target, to=logp.dtype)
        if ls > 0:
            t = imp.op("Add", imp.op("Mul", t, imp.scalar_like(1.0 - ls, logp)),
                       imp.scalar_like(ls / classes, logp))
        picked = imp.op("Mul", logp, t)
        if w is not None:
            picked = imp.op("Mul", picked, w)
        loss = imp.op("Neg", class_sum(picked))
        return _reduce(imp, loss, reduction), None  # mean: over the rows (numel / C), whatever the weights
    if np.dtype(target.dtype or "int64").kind not in "iu":
        raise Untranslatable(f"target of dtype {target.dtype}")
    if rank(target) != r - 1:
        raise Untranslatable(f"class-index targets of rank {rank(target)} for a rank-{r} input")
    check_targets(imp, target, classes, what, ignore_index)
    ids = _on_class_axis(imp, imp.const(np.arange(classes, dtype=target.dtype)), r, axis)
    onehot = imp.op("Cast", imp.op("Equal", imp.op("Unsqueeze", target, imp.ints([axis])), ids), to=logp.dtype)
    valid = imp.op("Cast", imp.op("Not", imp.op("Equal", target, imp.const(np.asarray(ignore_index,
                                                                                       target.dtype)))),
                   to=logp.dtype)  # 0 where the target is ignored
    # times the target's class weight: each target's share of the "mean" divisor
    kept = valid if w is None else imp.op("Mul", valid, class_sum(imp.op("Mul", onehot, w)))
    loss = imp.op("Mul", imp.op("Neg", class_sum(imp.op("Mul", logp, onehot))), kept)
    total = _all_axes(imp, "ReduceSum", kept)  # every target ignored: 0 / 0 for "mean", NaN as in torch
    smooth = None
    if ls > 0:
        spread = logp if w is None else imp.op("Mul", logp, w)
        smooth = imp.op("Mul", imp.op("Neg", class_sum(spread)), valid)
    if reduction == "mean":
        loss = imp.op("Div", _all_axes(imp, "ReduceSum", loss), total)
        smooth = None if smooth is None else imp.op("Div", _all_axes(imp, "ReduceSum", smooth), total)
    elif reduction == "sum":
        loss = _all_axes(imp, "ReduceSum", loss)
        smooth = None if smooth is None else _all_axes(imp, "ReduceSum", smooth)
    if smooth is None:
        return loss, total
    return imp.op("Add", imp.op("Mul", loss, imp.scalar_like(1.0 - ls, logp)),
                  imp.op("Mul", smooth, imp.scalar_like(ls / classes, logp))), total


def cross_entropy(imp, x, target, weight=None, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    """Cross entropy of logits `x` (LogSoftmax over the class axis, then `nll`)."""
    x = _float(x, "input")
    r = rank(x)
    if r == 0:
        raise Untranslatable("a 0-d loss input")
    logp = imp.op("LogSoftmax", x, axis=1 if r >= 2 else 0)
    return nll(imp, logp, target, weight, reduction, ignore_index, label_smoothing, "cross_entropy")


@FUNCTIONS.register(F.cross_entropy)
def _f_cross_entropy(imp, x, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                     reduction="mean", label_smoothing=0.0):
    return cross_entropy(imp, x, target, weight, reduction_of(reduction, size_average, reduce), ignore_index,
                         label_smoothing)


@FUNCTIONS.register(F.nll_loss)
def _f_nll_loss(imp, x, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                reduction="mean"):
    return nll(imp, x, target, weight, reduction_of(reduction, size_average, reduce), ignore_index)


# --------------------------------------------------------------------------- elementwise regression losses
def _difference(imp, x, target):
    x = _float(x, "input")
    target = tensor(target, "target")
    if target.dtype != x.dtype:
        target = imp.op("Cast", target, to=x.dtype)
    return x, imp.op("Sub", x, target)


def _weighted(imp, loss, weight, reduction, mean_over_weight: bool):
    """An elementwise loss times `weight` (the input's shape), reduced as torch does: mse / l1's "mean"
    divides by the summed weight, huber's by the element count."""
    if weight is None:
        return _reduce(imp, loss, reduction)
    loss = imp.op("Mul", loss, _float(weight, "weight"))
    if reduction == "mean" and mean_over_weight:
        return imp.op("Div", _all_axes(imp, "ReduceSum", loss), _all_axes(imp, "ReduceSum", weight))
    return _reduce(imp, loss, reduction)


def mse(imp, x, target, reduction="mean", weight=None):
    x, d = _difference(imp, x, target)
    return _weighted(imp, imp.op("Mul", d, d), weight, reduction, True)


def l1(imp, x, target, reduction="mean", weight=None):
    x, d = _difference(imp, x, target)
    return _weighted(imp, imp.op("Abs", d), weight, reduction, True)


def _piecewise(imp, x, d, knot: float, inner_scale: float, outer_scale: float):
    """knot > 0: inner_scale * d^2 where |d| < knot, else outer_scale * (|d| - knot / 2)."""
    a = imp.op("Abs", d)
    inner = imp.op("Mul", imp.op("Mul", d, d), imp.scalar_like(inner_scale, x))
    outer = imp.op("Mul", imp.op("Sub", a, imp.scalar_like(knot / 2, x)), imp.scalar_like(outer_scale, x))
    return imp.op("Where", imp.op("Less", a, imp.scalar_like(knot, x)), inner, outer)


def smooth_l1(imp, x, target, reduction="mean", beta=1.0):
    x, d = _difference(imp, x, target)
    beta = float(beta)
    loss = imp.op("Abs", d) if beta == 0 else _piecewise(imp, x, d, beta, 0.5 / beta, 1.0)
    return _reduce(imp, loss, reduction)


def huber(imp, x, target, reduction="mean", delta=1.0, weight=None):
    x, d = _difference(imp, x, target)
    delta = float(delta)
    return _weighted(imp, _piecewise(imp, x, d, delta, 0.5, delta), weight, reduction, False)


# ------------------------------------------------------------------------------------- binary losses
def bce_with_logits(imp, x, target, weight=None, pos_weight=None, reduction="mean"):
    """torch's stable form: (1 - t) x + (1 + (pos_weight - 1) t) (log(1 + exp(-|x|)) + max(-x, 0))."""
    x = _float(x, "input")
    t = tensor(target, "target")
    if t.dtype != x.dtype:
        t = imp.op("Cast", t, to=x.dtype)
    one = imp.scalar_like(1.0, x)
    soft = imp.op("Add", imp.op("Log", imp.op("Add", one, imp.op("Exp", imp.op("Neg", imp.op("Abs", x))))),
                  imp.op("Relu", imp.op("Neg", x)))
    if pos_weight is not None:
        pw = _float(pos_weight, "pos_weight")
        soft = imp.op("Mul", soft, imp.op("Add", one, imp.op("Mul", imp.op("Sub", pw, one), t)))
    loss = imp.op("Add", imp.op("Mul", imp.op("Sub", one, t), x), soft)
    if weight is not None:
        loss = imp.op("Mul", loss, _float(weight, "weight"))
    return _reduce(imp, loss, reduction)


def bce(imp, p, target, weight=None, reduction="mean"):
    """-(t log p + (1 - t) log(1 - p)), each log clamped at -100 as torch does."""
    p = _float(p, "input")
    t = tensor(target, "target")
    if t.dtype != p.dtype:
        t = imp.op("Cast", t, to=p.dtype)
    one, floor = imp.scalar_like(1.0, p), imp.scalar_like(-100.0, p)
    log_p = imp.op("Max", imp.op("Log", p), floor)
    log_q = imp.op("Max", imp.op("Log", imp.op("Sub", one, p)), floor)
    loss = imp.op("Neg", imp.op("Add", imp.op("Mul", t, log_p), imp.op("Mul", imp.op("Sub", one, t), log_q)))
    if weight is not None:
        loss = imp.op("Mul", loss, _float(weight, "weight"))
    return _reduce(imp, loss, reduction)


# ------------------------------------------------------------------------------------- margin losses
def multilabel_soft_margin(imp, x, target, weight=None, reduction="mean"):
    """torch's -(t logsigmoid(x) + (1 - t) logsigmoid(-x)), times `weight` (broadcast), summed over the last
    (class) axis and divided by the class count, then reduced over the rows. The elementwise term is written
    as BCE-with-logits' stable form (the same value): (1 - t) x + log(1 + exp(-|x|)) + max(-x, 0)."""
    x = _float(x, "input")
    r = rank(x)
    if r == 0:
        raise Untranslatable("a 0-d loss input")
    classes = x.shape[-1]
    if not isinstance(classes, int):
        raise Untranslatable("the class dimension is not static")
    elementwise = bce_with_logits(imp, x, target, weight, None, "none")
    loss = imp.op("Div", imp.op("ReduceSum", elementwise, imp.ints([r - 1]), keepdims=0),
                  imp.scalar_like(float(classes), x))
    return _reduce(imp, loss, reduction)


def multi_margin(imp, x, target, p=1, margin=1.0, weight=None, reduction="mean"):
    """torch's multi-class hinge loss (aten MultiMarginCriterion): for each row with target class y,
    sum over the classes j != y of w[y] * max(0, margin - x[y] + x[j])^p, divided by the class count; "mean"
    is the plain mean over the rows (the weights do not divide). The target's class is picked with a one-hot
    (Equal against the class range), so the batch stays dynamic; a 1-D input is one row and its loss has
    the target's shape."""
    x = _float(x, "input")
    target = tensor(target, "target")
    if np.dtype(target.dtype or "float32").kind not in "iu":
        raise Untranslatable(f"target of dtype {target.dtype}")
    if p not in (1, 2):
        raise Untranslatable(f"p={p!r} (torch supports 1 and 2)")
    r = rank(x)
    if r not in (1, 2):
        raise Untranslatable(f"a rank-{r} input (torch takes 1-D or 2-D)")
    classes = x.shape[-1]
    if not isinstance(classes, int):
        raise Untranslatable("the class dimension is not static")
    target_shape = tuple(target.shape) if target.shape is not None else None
    if r == 1:
        if target_shape not in ((), (1,)):
            raise Untranslatable(f"target of shape {target_shape} for a 1-D input")
        x = imp.op("Unsqueeze", x, imp.ints([0]))
        target = imp.op("Reshape", target, imp.ints([1]))
    elif target_shape is None or len(target_shape) != 1:
        raise Untranslatable(f"target of shape {target_shape} for a 2-D input")
    check_targets(imp, target, classes, "multi_margin_loss")
    ids = imp.const(np.arange(classes, dtype=target.dtype))
    mask = imp.op("Equal", imp.op("Unsqueeze", target, imp.ints([1])), ids)  # [N, C]: j == y
    zero = imp.scalar_like(0.0, x)
    picked = imp.op("ReduceSum", imp.op("Where", mask, x, zero), imp.ints([1]), keepdims=1)  # x[y], [N, 1]
    h = imp.op("Relu", imp.op("Add", imp.op("Sub", imp.scalar_like(float(margin), x), picked), x))
    if p == 2:
        h = imp.op("Mul", h, h)
    if weight is not None:
        w = _float(weight, "weight")
        if rank(w) != 1:
            raise Untranslatable("a weight that is not one-dimensional")
        if w.dtype != x.dtype:
            w = imp.op("Cast", w, to=x.dtype)
        w_y = imp.op("ReduceSum", imp.op("Where", mask, w, zero), imp.ints([1]), keepdims=1)  # w[y], [N, 1]
        h = imp.op("Mul", h, w_y)
    h = imp.op("Where", mask, zero, h)  # the target's own class is not summed
    loss = imp.op("Div", imp.op("ReduceSum", h, imp.ints([1]), keepdims=0), imp.scalar_like(float(classes), x))
    if reduction == "none":
        return imp.op("Reshape", loss, imp.ints(target_shape)) if r == 1 and target_shape == () else loss
    return _all_axes(imp, "ReduceMean" if reduction == "mean" else "ReduceSum", loss)


FUNCTIONS.update({
    F.multilabel_soft_margin_loss: lambda imp, x, t, weight=None, size_average=None, reduce=None, reduction="mean":
        multilabel_soft_margin(imp, x, t, weight, reduction_of(reduction, size_average, reduce)),
    F.multi_margin_loss:
        lambda imp, x, t, p=1, margin=1.0, weight=None, size_average=None, reduce=None, reduction="mean":
        multi_margin(imp, x, t, p, margin, weight, reduction_of(reduction, size_average, reduce)),
})


FUNCTIONS.update({
    F.mse_loss: lambda imp, x, t, size_average=None, reduce=None, reduction="mean", weight=None:
        mse(imp, x, t, reduction_of(reduction, size_average, reduce), weight),
    F.l1_loss: lambda imp, x, t, size_average=None, reduce=None, reduction="mean", weight=None:
        l1(imp, x, t, reduction_of(reduction, size_average, reduce), weight),
    F.smooth_l1_loss: lambda imp, x, t, size_average=None, reduce=None, reduction="mean", beta=1.0:
        smooth_l1(imp, x, t, reduction_of(reduction, size_average, reduce), beta),
    F.huber_loss: lambda imp, x, t, reduction="mean", delta=1.0, weight=None:
        huber(imp, x, t, reduction_of(reduction), delta, weight),
    F.binary_cross_entropy_with_logits:
        lambda imp, x, t, weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None:
        bce_with_logits(imp, x, t, weight, pos_weight, reduction_of(reduction, size_average, reduce)),
    F.binary_cross_entropy: lambda imp, x, t, weight=None, size_average=None, reduce=None, reduction="mean":
        bce(imp, x, t, weight, reduction_of(reduction, size_average, reduce)),
})


# --------------------------------------------------------------------------------- the module forms
def _buffer(imp, m, attr):
    return imp.param(m, attr) if getattr(m, attr, None) is not None else None


MODULES.update({
    nn.CrossEntropyLoss: lambda imp, m, x, t: cross_entropy(imp, x, t, _buffer(imp, m, "weight"), m.reduction,
                                                            m.ignore_index, m.label_smoothing),
    nn.NLLLoss: lambda imp, m, x, t: nll(imp, x, t, _buffer(imp, m, "weight"), m.reduction, m.ignore_index),
    nn.MSELoss: lambda imp, m, x, t: mse(imp, x, t, m.reduction),
    nn.L1Loss: lambda imp, m, x, t: l1(imp, x, t, m.reduction),
    nn.SmoothL1Loss: lambda imp, m, x, t: smooth_l1(imp, x, t, m.reduction, m.beta),
    nn.HuberLoss: lambda imp, m, x, t: huber(imp, x, t, m.reduction, m.delta),
    nn.BCEWithLogitsLoss: lambda imp, m, x, t: bce_with_logits(imp, x, t, _buffer(imp, m, "weight"),
                                                               _buffer(imp, m, "pos_weight"), m.reduction),
    nn.BCELoss: lambda imp, m, x, t: bce(imp, x, t, _buffer(imp, m, "weight"), m.reduction),
    nn.MultiLabelSoftMarginLoss: lambda imp, m, x, t: multilabel_soft_margin(imp, x, t, _buffer(imp, m, "weight"),
                                                                             m.reduction),
    nn.MultiMarginLoss: lambda imp, m, x, t: multi_margin(imp, x, t, m.p, m.margin, _buffer(imp, m, "weight"),
                                                          m.reduction),
})


# ------------------------------------------------------------------ the aten ops torch.export keeps
def _aten_nll_forward(imp, x, target, weight, reduction, ignore_index):
    """nll_loss_forward / nll_loss2d_forward: (loss, total weight), the second as torch gives it for the
    backward (the summed weight of the targets not ignored)."""
    return nll_and_total(imp, x, target, weight, reduction_of(reduction), ignore_index)


ATEN.update({
    "cross_entropy_loss": lambda imp, x, t, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0:
        cross_entropy(imp, x, t, weight, reduction_of(reduction), ignore_index, label_smoothing),
    "nll_loss": lambda imp, x, t, weight=None, reduction=1, ignore_index=-100:
        nll(imp, x, t, weight, reduction_of(reduction), ignore_index),
    "nll_loss_nd": lambda imp, x, t, weight=None, reduction=1, ignore_index=-100:
        nll(imp, x, t, weight, reduction_of(reduction), ignore_index),
    "nll_loss2d": lambda imp, x, t, weight=None, reduction=1, ignore_index=-100:
        nll(imp, x, t, weight, reduction_of(reduction), ignore_index),
    "nll_loss_forward": _aten_nll_forward,
    "nll_loss2d_forward": _aten_nll_forward,
    "mse_loss": lambda imp, x, t, reduction=1: mse(imp, x, t, reduction_of(reduction)),
    "l1_loss": lambda imp, x, t, reduction=1: l1(imp, x, t, reduction_of(reduction)),
    "smooth_l1_loss": lambda imp, x, t, reduction=1, beta=1.0: smooth_l1(imp, x, t, reduction_of(reduction), beta),
    "huber_loss": lambda imp, x, t, reduction=1, delta=1.0: huber(imp, x, t, reduction_of(reduction), delta),
    "binary_cross_entropy_with_logits":
        lambda imp, x, t, weight=None, pos_weight=None, reduction=1:
        bce_with_logits(imp, x, t, weight, pos_weight, reduction_of(reduction)),
    "binary_cross_entropy": lambda imp, x, t, weight=None, reduction=1: bce(imp, x, t, weight,
                                                                           reduction_of(reduction)),
    "multi_margin_loss": lambda imp, x, t, p=1, margin=1.0, weight=None, reduction=1:
        multi_margin(imp, x, t, p, margin, weight, reduction_of(reduction)),
    "multilabel_soft_margin_loss": lambda imp, x, t, weight=None, reduction=1:
        multilabel_soft_margin(imp, x, t, weight, reduction_of(reduction)),
})
