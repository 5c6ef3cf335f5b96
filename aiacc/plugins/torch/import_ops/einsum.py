"""torch.einsum on static shapes, as the IR's MatMul, Transpose, Reshape and ReduceSum (no Einsum op):
attention scores and relative-position terms (MaxViT, ...) become MatMuls the passes fuse.

Operands are taken left to right, two at a time. For a pair, labels only one side has and the output and
the other operands lack are summed out first; the shared ones are batch labels (kept) or contracted ones
(summed by the MatMul): each side is transposed to [batch, free, contracted] and reshaped to [batch, M, K]
and [batch, K, N], multiplied, and reshaped / transposed to the output's order. A label repeated in one
operand (a diagonal), broadcasting between different sizes of one label, or shapes not known at trace
time keep the call opaque (Untranslatable).
"""
from __future__ import annotations

import string

import numpy as np
import torch

from aiacc.core.translate import Untranslatable
from aiacc.plugins.torch.import_ops.common import rank, tensor
from aiacc.plugins.torch.importer import FUNCTIONS


def parse_equation(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """The labels of each operand and of the output, one letter per dimension ('...' expanded into
    letters the equation does not use; the implicit output is the labels seen once, sorted, after the
    ellipsis ones, as torch has it)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise Untranslatable(f"einsum {equation!r}: {len(terms)} operand terms for {len(ranks)} operands")
    free = [c for c in string.ascii_letters if c not in eq]
    n_ell = 0
    for t, r in zip(terms, ranks):
        if "..." in t:
            n_ell = max(n_ell, r - (len(t) - 3))
    ell = "".join(free[:n_ell])
    out_terms = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            k = r - (len(t) - 3)
            t = t.replace("...", ell[n_ell - k:])  # broadcast ellipses align on the right
        if len(t) != r or not all(c.isalpha() for c in t):
            raise Untranslatable(f"einsum {equation!r}: term {t!r} does not fit a rank-{r} operand")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts = {c: sum(t.count(c) for t in out_terms) for c in set("".join(out_terms))}
        out = ell + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in ell))
    if len(set(out)) != len(out) or any(c not in "".join(out_terms) for c in out):
        raise Untranslatable(f"einsum {equation!r}: output labels {out!r}")
    for t in out_terms:
        if len(set(t)) != len(t):
            raise Untranslatable(f"einsum {equation!r}: a label repeated in one operand (a diagonal)")
    return out_terms, out


def _transpose(imp, x, labels: str, order: str):
    if labels == order:
        return x
    return imp.op("Transpose", x, perm=[labels.index(c) for c in order])


def _sum_out(imp, x, labels: str, drop: str):
    """Sum `x` over the labels in `drop`; returns (value, remaining labels)."""
    axes = [i for i, c in enumerate(labels) if c in drop]
    if not axes:
        return x, labels
    return imp.op("ReduceSum", x, imp.ints(axes), keepdims=0), "".join(c for c in labels if c not in drop)


def _pair(imp, a, la: str, b, lb: str, keep: str, size: dict[str, int]):
    """The einsum of two operands keeping the labels in `keep` (the output's and later operands')."""
    a, la = _sum_out(imp, a, la, "".join(c for c in la if c not in lb and c not in keep))
    b, lb = _sum_out(imp, b, lb, "".join(c for c in lb if c not in la and c not in keep))
    batch = "".join(c for c in la if c in lb and c in keep)
    contract = "".join(c for c in la if c in lb and c not in keep)
    fa = "".join(c for c in la if c not in lb)
    fb = "".join(c for c in lb if c not in la)

    def prod(ls: str) -> int:
        return int(np.prod([size[c] for c in ls], dtype=np.int64))

    bs = [size[c] for c in batch]
    a = imp.op("Reshape", _transpose(imp, a, la, batch + fa + contract), imp.ints(bs + [prod(fa), prod(contract)]))
    b = imp.op("Reshape", _transpose(imp, b, lb, batch + contract + fb), imp.ints(bs + [prod(contract), prod(fb)]))
    y = imp.op("MatMul", a, b)
    labels = batch + fa + fb
    return imp.op("Reshape", y, imp.ints([size[c] for c in labels])), labels


@FUNCTIONS.register(torch.einsum)
def _einsum(imp, equation, *operands):
    """torch.einsum(equation, *operands) (or a list of operands) on static shapes (see the module docstring)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str) or not operands:
        raise Untranslatable("einsum needs an equation string and operands")
    xs = [tensor(x, f"operand {i}") for i, x in enumerate(operands)]
    if len({x.dtype for x in xs}) != 1:
        raise Untranslatable("einsum of operands of different dtypes")
    terms, out = parse_equation(equation, [rank(x) for x in xs])
    size: dict[str, int] = {}
    for x, t in zip(xs, terms):
        for c, d in zip(t, imp.shape_of(x)):
            if not isinstance(d, (int, np.integer)):
                raise Untranslatable(f"einsum {equation!r}: the size of label {c!r} is not static")
            if size.setdefault(c, int(d)) != int(d):
                raise Untranslatable(f"einsum {equation!r}: label {c!r} has sizes {size[c]} and {int(d)} "
                                     f"(broadcasting)")
    y, labels = xs[0], terms[0]
    for k in range(1, len(xs)):
        keep = out + "".join(terms[k + 1:])
        y, labels = _pair(imp, y, labels, xs[k], terms[k], keep, size)
    y, labels = _sum_out(imp, y, labels, "".join(c for c in labels if c not in out))
    if labels == out and len(xs) == 1:
        return imp.op("Identity", y)
    return _transpose(imp, y, labels, out)
