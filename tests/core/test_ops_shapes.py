"""Symbolic shape inference of the cutting, reducing and resizing ops (kernels are covered by the ONNX
conformance suite)."""
from __future__ import annotations

import numpy as np
import pytest

from aiacc.core import Graph, run
from aiacc.errors import ShapeError


def graph(shape=("N", 6, 8, 8)):
    g = Graph("t")
    return g, g.add_input("x", "float32", shape)


def const(g, v, dtype=np.int64):
    return g.add_initializer(g.fresh_name("c"), np.asarray(v, dtype))


def t(v):
    return str(v.type)


def test_split_slice_pad_keep_symbols():
    g, x = graph()
    a, b, c = g.add_node("Split", [x], {"axis": 1, "num_outputs": 3}, outputs=3).outputs
    assert [t(a), t(b), t(c)] == ["float32[N,2,8,8]"] * 3
    u, v = g.add_node("Split", [x, const(g, [2, 4])], {"axis": 1}, outputs=2).outputs
    assert (t(u), t(v)) == ("float32[N,2,8,8]", "float32[N,4,8,8]")
    s = g.op("Slice", x, const(g, [1, -1]), const(g, [2 ** 63 - 1, 0]), const(g, [1, 3]), const(g, [2, -2]))
    assert t(s) == "float32[N,3,8,4]"
    p = g.op("Pad", x, const(g, [0, 0, 1, 2, 0, 0, 3, 4]))
    assert t(p) == "float32[N,6,12,14]"
    with pytest.raises(ShapeError, match="do not add up"):
        g.add_node("Split", [x, const(g, [2, 2])], {"axis": 1}, outputs=2, name="bad_split")


def test_reductions_and_resize():
    g, x = graph()
    assert t(g.op("ReduceMean", x, const(g, [2, 3]))) == "float32[N,6,1,1]"
    assert t(g.op("ReduceSum", x, const(g, [1]), keepdims=0)) == "float32[N,8,8]"
    assert t(g.op("ReduceMax", x)) == "float32[1,1,1,1]"
    r = g.op("Resize", x, None, const(g, [1, 1, 2, 0.5], np.float32), mode="linear")
    assert t(r) == "float32[N,6,16,4]"
    r = g.op("Resize", x, None, None, const(g, [5, 7]), axes=[2, 3], mode="nearest")
    assert t(r) == "float32[N,6,5,7]"


def test_resize_nearest_matches_repeat():
    g, x = graph((1, 2, 3, 3))
    g.add_output(g.op("Resize", x, None, const(g, [1, 1, 2, 2], np.float32), mode="nearest",
                      coordinate_transformation_mode="asymmetric", nearest_mode="floor"))
    a = np.arange(18, dtype=np.float32).reshape(1, 2, 3, 3)
    out = run(g, {"x": a})
    np.testing.assert_array_equal(list(out.values())[0], a.repeat(2, axis=2).repeat(2, axis=3))
