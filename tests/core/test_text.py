"""The text form: print/parse round trips exactly, symbols and odd names survive, errors name the line."""
from __future__ import annotations

import numpy as np
import pytest

from aiacc.core import Graph, parse
from aiacc.errors import ParseError

TEXT = """graph main(%x: float32[N,3,8,8], %"odd name:0": float32[?]) {
  %w: float32[4,3,3,3] = const
  %b: float32[4] = const [0.5, 0.25, -1.5, 4.0]
  %y: float32[N,4,8,8] = Conv<conv1>(%x, %w, %b) {pads=[1, 1, 1, 1], strides=[1, 1]}
  %s0: float32[N,2,8,8], %s1: float32[N,2,8,8] = Split<split>(%y) {axis=1, num_outputs=2}
  %z: float32[N,2,8,8] = LeakyRelu<act>(%s0) {alpha=0.125}
  %q: float32[*] = com.example::Mystery<m>(%"odd name:0", _) {modes=["a", "b"], t=tensor<int64[2]>[1, 2]}
  return %z, %s1, %q
}
"""


def test_parse_print_round_trip_exact():
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    g = parse(TEXT, {"w": w})
    g.verify()
    assert str(g) == TEXT
    assert parse(str(g), {"w": w}).equals(g)
    assert g.value("odd name:0").shape == (None,)
    m = g.nodes[-1]
    assert m.is_opaque and m.inputs[1] is None and m.attrs["t"].dtype == np.int64


def test_built_graph_round_trips_with_weights_side_file():
    g = Graph("built")
    x = g.add_input("x", "float32", ("B", 16))
    w = g.add_initializer("fc.w", np.arange(16 * 32, dtype=np.float32).reshape(16, 32) / 7)
    y = g.op("MatMul", x, w)
    y = g.op("Gelu", y, approximate="tanh")
    g.add_output(g.op("Softmax", y, axis=-1))
    text = str(g)
    assert "float32[B,32]" in text and "%fc.w: float32[16,32] = const\n" in text
    g2 = parse(text, {"fc.w": w.const})
    assert g2.equals(g) and str(g2) == text


def test_floats_print_exactly():
    g = Graph("f")
    x = g.add_input("x", "float32", (3,))
    g.add_initializer("c", np.array([0.1, 1e-30, np.inf], np.float32))
    g.add_output(g.op("Elu", x, alpha=1 / 3))
    g2 = parse(str(g))
    assert g2.equals(g)
    assert g2.nodes[0].attrs["alpha"] == 1 / 3


@pytest.mark.parametrize("text, message", [
    ("graph g(%x: float32[2]) {\n  %y: float32[2] = Relu<r>(%nope)\n  return %y\n}", "line 2: input %nope"),
    ("graph g(%x: float32[2]) {\n  %y: float32[2] = Relu<r>(%x)\n  %y: float32[2] = Relu<r2>(%x)\n  return %y\n}",
     "line 3: %y is defined twice"),
    ("graph g(%x: float32[2]) {\n  %w: float32[3,3] = const\n  return %x\n}", "line 2: no data for constant %w"),
    ("graph g(%x: float32[2]) {\n  %y: float32[2] = Relu<r>(%x) {\n  return %y\n}", "line 3"),
    ("graph g(%x: float32[2]) {\n  %y = Relu<r>(%x)\n", "expected 'return'"),
])
def test_parse_errors_name_the_line(text, message):
    with pytest.raises(ParseError, match=message):
        parse(text)
