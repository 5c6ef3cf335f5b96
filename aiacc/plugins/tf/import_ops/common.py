"""Helpers the TF op families share: attribute reading, the operands of broadcasting ops (NCHW where
they can follow a channels-first input), int64 results cast to the TF op's output dtype."""
from __future__ import annotations

import numpy as np

from aiacc.core.translate import Untranslatable
from aiacc.plugins.tf._tf import np_dtype_name
from aiacc.plugins.tf.importer import TO_NCHW, GraphImporter


def attr(tfop, key, default=None):
    """The TF op's attribute `key` (bytes decoded to str), `default` when the op has none."""
    try:
        v = tfop.get_attr(key)
    except ValueError:
        return default
    return v.decode() if isinstance(v, bytes) else v


def operands(imp: GraphImporter, tensors) -> tuple[list, bool]:
    """IR operands of a broadcasting op: NCHW when a rank-4 operand already is and the others can follow
    (constants are permuted, rank-4 tensors transposed), else all in TF layout."""
    entries = [imp.entry(t) for t in tensors]
    if any(e.nchw for e in entries):
        ok = all(e.nchw or e.value.const is not None or (e.value.shape is not None and len(e.value.shape) == 4)
                 for e in entries)
        if ok:
            vals = []
            for t, e in zip(tensors, entries):
                if e.nchw:
                    vals.append(e.value)
                elif e.value.const is not None:
                    vals.append(const_to_nchw(imp, e.value, t.name))
                else:
                    vals.append(imp.nchw(t))
            return vals, True
    return [imp.plain(t) for t in tensors], False


def const_to_nchw(imp, v, name):
    """A constant broadcast against an NHWC rank-4 tensor, rewritten to broadcast against NCHW."""
    c = v.const
    if c.ndim == 0:
        return v
    if c.ndim > 4:
        raise Untranslatable("constant of rank > 4")
    c4 = c.reshape((1,) * (4 - c.ndim) + c.shape).transpose(TO_NCHW)
    while c4.ndim > 1 and c4.shape[0] == 1:  # drop leading ones: (1,C,1,1) -> (C,1,1)
        c4 = c4[0]
    return imp.init(np.ascontiguousarray(c4), name + "_nchw")


def int64_as(imp, tfop, y, attr):
    """The int64 result `y` of an ONNX op cast to the TF op's integer output dtype (its `attr`), if that differs."""
    to = np_dtype_name(tfop.get_attr(attr), tfop.name)
    if to != "int64":
        y = imp.emit1("Cast", [y], {"to": to}, name=tfop.name + "_cast")
    return y
