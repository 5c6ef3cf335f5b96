"""Converters of torch.fft's complex-to-complex transforms (fft, fft2, fftn) whose complex result is only
read through its real or imaginary part (FNet's `torch.fft.fftn(x, dim=(1, 2)).real`).

The IR has no complex tensors. On static shapes a DFT along an axis of size N is a matrix product with the
constant N x N matrices C = cos(2 pi j k / N) and S = sin(2 pi j k / N) (F = C - iS), so a transform is
carried as a pair of real IR values (`Complex`) that only `.real`, `.imag`, torch.real / torch.imag and
another of these transforms read; any other use of the complex result (abs, angle, a multiply, returning
it) keeps the transform opaque.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.fx as fx

from aiacc.core.ir import Value
from aiacc.core.translate import Untranslatable
from aiacc.plugins.torch.import_ops.common import norm_axis, rank
from aiacc.plugins.torch.importer import FUNCTIONS, IRObject


class Complex(IRObject):
    """A complex tensor as two real IR values; `.real` / `.imag` read them (getattr's converter passes
    attribute reads on non-IR objects through)."""

    def __init__(self, real: Value, imag: Value | None):
        self.real, self.imag_or_none = real, imag

    @property
    def imag(self) -> Value:
        if self.imag_or_none is None:
            raise Untranslatable("the imaginary part of a real tensor")
        return self.imag_or_none


def _axes(fn, dim, n, r: int) -> list[int]:
    """The transformed axes of an fft / fft2 / fftn call on a rank-r tensor; `n` (a padded or cut length)
    is refused unless None."""
    if n is not None:
        raise Untranslatable("n= / s= (a padded or truncated transform)")
    if fn is torch.fft.fft:
        dims = [-1 if dim is None else dim]
    elif fn is torch.fft.fft2:
        dims = [-2, -1] if dim is None else list(dim)
    else:
        dims = list(range(r)) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    if not all(isinstance(d, int) for d in dims):
        raise Untranslatable(f"dim={dim!r}")
    return [norm_axis(d, r) for d in dims]


def _bound(fn, args: tuple, kwargs: dict) -> tuple:
    """(input, n or s, dim, norm) of a call of fn, by position or keyword (torch's argument names)."""
    names = ("input", "n" if fn is torch.fft.fft else "s", "dim", "norm")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    if set(bound) - set(names):
        raise Untranslatable(f"arguments {sorted(set(bound) - set(names))}")
    return bound.get("input"), bound.get(names[1]), bound.get("dim"), bound.get("norm")


_READERS = {"real", "imag"}


def _check_users(node: fx.Node, r: int) -> None:
    """Every use of the complex result must be one this module translates: `.real` / `.imag`, torch.real /
    torch.imag, or another transform (its arguments checked here, so it cannot be left opaque with a
    complex argument the IR cannot hold)."""
    for user in node.users:
        if user.op == "call_function" and user.target is getattr and user.args[1] in _READERS:
            continue
        if user.op == "call_function" and user.target in (torch.real, torch.imag):
            continue
        if user.op == "call_function" and user.target in _TRANSFORMS and user.args and user.args[0] is node:
            _, n, dim, norm = _bound(user.target, user.args, user.kwargs)
            if any(isinstance(a, fx.Node) for a in (n, dim, norm)):
                raise Untranslatable(f"{user.name}: transform arguments computed at run time")
            _axes(user.target, dim, n, r)
            _scale(norm, 1)
            continue
        raise Untranslatable(f"its complex result is used by {user.name} ({user.op} {user.target}): the IR has "
                             f"no complex tensors")


def _scale(norm, size: int) -> float:
    if norm in (None, "backward"):
        return 1.0
    if norm == "ortho":
        return 1.0 / np.sqrt(size)
    if norm == "forward":
        return 1.0 / size
    raise Untranslatable(f"norm={norm!r}")


def _along(imp, x: Value, axis: int, m: np.ndarray, r: int) -> Value:
    """x with its `axis` multiplied by the constant matrix m (sum over k of x[..., k, ...] * m[k, j])."""
    if axis == r - 1:
        return imp.op("MatMul", x, imp.const(m))
    perm = list(range(r))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    y = imp.op("MatMul", imp.op("Transpose", x, perm=perm), imp.const(m))
    return imp.op("Transpose", y, perm=perm)


def _transform(fn):
    def conv(imp, *args, **kwargs):
        x, n, dim, norm = _bound(fn, args, kwargs)
        src = x.real if isinstance(x, Complex) else x
        if not isinstance(src, Value):
            raise Untranslatable("input is not a tensor")
        if src.dtype not in ("float32", "float64"):
            raise Untranslatable(f"the fft of a {src.dtype} tensor")
        r = rank(src)
        axes = _axes(fn, dim, n, r)
        shape = imp.shape_of(src)
        _check_users(imp.current, r)
        re, im = src, (x.imag_or_none if isinstance(x, Complex) else None)
        for axis in axes:
            size = shape[axis]
            k = np.arange(size)
            angle = 2.0 * np.pi * np.outer(k, k) / size
            s = _scale(norm, size)
            c, sn = (np.cos(angle) * s).astype(src.dtype), (np.sin(angle) * s).astype(src.dtype)
            # (a + ib)(C - iS) = (aC + bS) + i(bC - aS)
            new_re = _along(imp, re, axis, c, r)
            new_im = imp.op("Neg", _along(imp, re, axis, sn, r))
            if im is not None:
                new_re = imp.op("Add", new_re, _along(imp, im, axis, sn, r))
                new_im = imp.op("Add", new_im, _along(imp, im, axis, c, r))
            re, im = new_re, new_im
        return Complex(re, im)
    return conv


_TRANSFORMS = {torch.fft.fft: None, torch.fft.fft2: None, torch.fft.fftn: None}
for _fn in list(_TRANSFORMS):
    _TRANSFORMS[_fn] = _transform(_fn)
    FUNCTIONS.add(_fn, _TRANSFORMS[_fn])


@FUNCTIONS.register(torch.real)
def _real(imp, x):
    """torch.real: the real part of a translated transform (of a real tensor: the tensor)."""
    if isinstance(x, Complex):
        return x.real
    if isinstance(x, Value) and x.dtype and not x.dtype.startswith("complex"):
        return x
    raise Untranslatable("torch.real of a complex tensor from outside a translated transform")


@FUNCTIONS.register(torch.imag)
def _imag(imp, x):
    """torch.imag: the imaginary part of a translated transform."""
    if isinstance(x, Complex):
        return x.imag
    raise Untranslatable("torch.imag of a tensor not from a translated transform")

