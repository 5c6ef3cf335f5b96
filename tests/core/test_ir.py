"""The IR: use-def lists, insertion/erasure/replacement, verify() on broken graphs, and run() on bad feeds."""
from __future__ import annotations

import numpy as np
import pytest

from aiacc.core import Graph, run, topological_sort
from aiacc.errors import AiaccError, AttributeError_, GraphError, ShapeError


def small_graph():
    g = Graph("g")
    x = g.add_input("x", "float32", ("N", 3, 8, 8))
    w = g.add_initializer("w", np.ones((4, 3, 3, 3), np.float32))
    y = g.op("Conv", x, w, name="conv", pads=[1, 1, 1, 1])
    r = g.op("Relu", y, name="relu")
    z = g.op("Add", r, y, name="add")
    g.add_output(z)
    return g, x, w, y, r, z


def test_use_def_lists_follow_edits():
    g, x, w, y, r, z = small_graph()
    assert [(n.name, i) for n, i in y.uses] == [("relu", 0), ("add", 1)]
    assert [n.name for n in y.users()] == ["relu", "add"]
    assert x.uses[0][0].name == "conv" and w.uses[0][0].name == "conv"
    # insert a Sigmoid after relu and reroute add's first input through it
    s = g.add_node("Sigmoid", [r], name="sig", after=r.producer).output
    z.producer.set_input(0, s)
    assert [n.name for n in g] == ["conv", "relu", "sig", "add"]
    assert [n.name for n, _ in r.uses] == ["sig"]
    assert [n.name for n, _ in s.uses] == ["add"]
    g.verify()


def test_replace_all_uses_with_covers_nodes_and_graph_outputs():
    g, x, w, y, r, z = small_graph()
    g.add_output(y)  # y is read by relu, add and the graph outputs
    y2 = g.add_node("Conv", [x, w], {"pads": [1, 1, 1, 1]}, name="conv2", after=y.producer).output
    y.replace_all_uses_with(y2)
    assert y.uses == [] and g.outputs == [z, y2]
    assert sorted((n.name, i) for n, i in y2.uses) == [("add", 1), ("relu", 0)]
    g.erase(y.producer)  # nothing reads it any more
    g.verify()
    assert [n.name for n in g] == ["conv2", "relu", "add"]


def test_insert_before_and_move():
    g, x, w, y, r, z = small_graph()
    n = g.add_node("Neg", [x], name="neg", before=y.producer)
    assert [m.name for m in g][:2] == ["neg", "conv"]
    g.move_after(n, z.producer)
    assert [m.name for m in g][-1] == "neg"
    g.verify()  # still topological: neg reads only the graph input


def test_erase_refused_while_used_then_allowed():
    g, x, w, y, r, z = small_graph()
    with pytest.raises(GraphError, match="cannot erase node conv: its output %conv is still used by relu, add"):
        g.erase(y.producer)
    with pytest.raises(GraphError, match="graph output"):
        g.erase(z.producer)
    extra = g.op("Relu", y, name="unused")
    g.erase(extra.producer)
    assert [n.name for n, _ in y.uses] == ["relu", "add"]
    assert not g.has_value("unused")
    g.verify()


def test_verify_dangling_input_names_the_node():
    g, x, w, y, r, z = small_graph()
    del g.initializers["w"]  # a buggy pass dropped the weight but left the reader
    with pytest.raises(GraphError, match=r"node conv \(Conv\): input 1 %w is dangling"):
        g.verify()


def test_verify_cycle_names_the_node():
    g, x, w, y, r, z = small_graph()
    y.producer.set_input(0, r)  # conv now reads relu, which reads conv
    with pytest.raises(GraphError, match=r"node conv \(Conv\): input 0 %relu is defined after it .*cycle"):
        g.verify()
    with pytest.raises(GraphError, match="is on a cycle"):
        topological_sort(g)


def test_conv_weight_channel_mismatch():
    g = Graph("g")
    x = g.add_input("x", "float32", (1, 3, 8, 8))
    w = g.add_initializer("w", np.ones((4, 5, 3, 3), np.float32))
    with pytest.raises(ShapeError, match=r"node conv1 \(Conv\): input has 3 channels but the weight expects 5"):
        g.op("Conv", x, w, name="conv1")
    # and verify() catches a weight swapped in after the node was built
    g2, x2, w2, y2, _, _ = small_graph()
    bad = g2.add_initializer("bad", np.ones((4, 5, 3, 3), np.float32))
    y2.producer.set_input(1, bad)
    with pytest.raises(ShapeError, match=r"node conv \(Conv\): input has 3 channels but the weight expects 5"):
        g2.verify()


def test_unknown_attribute():
    g = Graph("g")
    x = g.add_input("x", "float32", (2, 3))
    with pytest.raises(AttributeError_, match=r"node r \(Relu\): unknown attribute 'alpha'"):
        g.op("Relu", x, name="r", alpha=0.1)
    g2, *_ = small_graph()
    g2.nodes[0].attrs["stride"] = [2, 2]  # a typo of strides
    with pytest.raises(AttributeError_, match=r"node conv \(Conv\): unknown attribute 'stride'"):
        g2.verify()


def test_wrong_attribute_kind():
    g = Graph("g")
    x = g.add_input("x", "float32", (2, 3))
    with pytest.raises(AttributeError_, match="attribute axis='1' is not of kind int"):
        g.op("Softmax", x, name="sm", axis="1")


def test_run_wrong_input_shape():
    g, *_ = small_graph()
    with pytest.raises(ShapeError, match=r"graph input 'x': dimension 1 should be 3, got 4"):
        run(g, {"x": np.zeros((1, 4, 8, 8), np.float32)})
    with pytest.raises(ShapeError, match="expected shape"):
        run(g, {"x": np.zeros((3, 8, 8), np.float32)})
    with pytest.raises(ShapeError, match="expected dtype float32, got float64"):
        run(g, {"x": np.zeros((1, 3, 8, 8))})
    with pytest.raises(ShapeError, match="was not given"):
        run(g, {})


def test_run_shape_error_inside_graph_names_the_node():
    g = Graph("g")
    x = g.add_input("x", "float32", None)  # unknown shape: only the kernel can tell
    w = g.add_initializer("w", np.ones((4, 3, 3, 3), np.float32))
    g.add_output(g.op("Conv", x, w, name="conv_a"))
    with pytest.raises(AiaccError, match=r"node conv_a \(Conv\) failed on inputs \(float32\[1, 5, 8, 8\]"):
        run(g, {"x": np.zeros((1, 5, 8, 8), np.float32)})


def test_symbol_bound_consistently():
    g = Graph("g")
    a = g.add_input("a", "float32", ("N", 2))
    b = g.add_input("b", "float32", ("N", 2))
    g.add_output(g.op("Add", a, b))
    with pytest.raises(ShapeError, match=r"dimension 0 \(N\) is 3 here but 2 in another input"):
        run(g, {"a": np.zeros((2, 2), np.float32), "b": np.zeros((3, 2), np.float32)})


def test_copy_and_equals():
    g, *_ = small_graph()
    c = g.copy()
    assert c.equals(g) and c is not g
    c.nodes[1].attrs.clear()
    c.initializers["w"].const = np.zeros((4, 3, 3, 3), np.float32)
    assert not c.equals(g)
