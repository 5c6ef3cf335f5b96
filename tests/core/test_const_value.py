"""aiacc.core.ir.const_value: the one constant-of-a-value helper knows every form of ONNX's Constant."""
import numpy as np
import pytest

import aiacc.core.ops  # noqa: F401  (registers the schemas the IR infers with)
from aiacc.core.ir import Graph, const_value


@pytest.mark.parametrize("attrs,want", [
    ({"value": np.arange(3, dtype=np.float32)}, np.arange(3, dtype=np.float32)),
    ({"value_float": 2.5}, np.float32(2.5)),
    ({"value_floats": [1.0, -2.0]}, np.array([1.0, -2.0], np.float32)),
    ({"value_int": 7}, np.int64(7)),
    ({"value_ints": [1, 2]}, np.array([1, 2], np.int64)),
])
def test_every_constant_form_is_known(attrs, want):
    g = Graph("g")
    node = g.add_node("Constant", [], attrs)
    got = const_value(node.output)
    assert got is not None and got.dtype == np.asarray(want).dtype
    np.testing.assert_array_equal(got, want)
    # the same array the Constant kernel produces
    np.testing.assert_array_equal(got, node.schema.run(node, [])[0])


def test_initializers_and_computed_values():
    g = Graph("g")
    w = g.add_initializer("w", np.ones((2, 2), np.float32))
    x = g.add_input("x", "float32", (2, 2))
    y = g.add_node("Add", [x, w]).output
    assert const_value(w) is w.const and const_value(y) is None and const_value(None) is None
