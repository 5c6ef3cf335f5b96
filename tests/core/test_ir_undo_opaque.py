"""The IR's undo (Graph.checkpoint/rollback), opaque nodes (Graph.add_opaque) and the small public API
plugins and passes use instead of private fields (Node.erased, untyped inputs, remove_input, last node)."""
from __future__ import annotations

import numpy as np
import pytest

from aiacc.core import Graph, TensorType, run
from aiacc.errors import GraphError


def base():
    g = Graph("g")
    x = g.add_input("x", "float32", (2, 3))
    r = g.op("Relu", x, name="relu")
    return g, x, r


def test_rollback_undoes_nodes_initializers_inputs_and_outputs():
    g, x, r = base()
    g.add_output(r)
    before = str(g)
    mark = g.checkpoint()
    c = g.add_initializer("c", np.ones((2, 3), np.float32))
    s = g.add_input("s", "float32", (2, 3))
    y = g.op("Add", r, c, name="add")
    z = g.op("Mul", y, s, name="mul")
    g.add_output(z)
    removed = g.rollback(mark)
    assert {v.name for v in removed} == {"c", "s"}
    assert str(g) == before and len(g) == 1 and g.last_node is r.producer
    assert not g.has_value("add") and not g.has_value("c") and not g.has_node_name("mul")
    assert not y.producer.graph.has_value("mul") and y.producer.erased
    g.verify()
    # the freed names can be used again
    assert g.op("Add", r, g.add_initializer("c", np.zeros((2, 3), np.float32)), name="add").name == "add"
    g.verify()


def test_rollback_nests_and_keeps_what_came_before_the_checkpoint():
    g, x, r = base()
    outer = g.checkpoint()
    a = g.op("Sigmoid", r, name="sig")
    inner = g.checkpoint()
    g.op("Tanh", a, name="tanh")
    g.rollback(inner)
    assert [n.name for n in g] == ["relu", "sig"]
    g.rollback(outer)
    assert [n.name for n in g] == ["relu"]
    g.verify()


def test_rollback_covers_nodes_inserted_before_older_ones():
    g, x, r = base()
    g.add_output(r)
    mark = g.checkpoint()
    g.add_node("Neg", [x], name="neg", before=r.producer)
    g.rollback(mark)
    assert [n.name for n in g] == ["relu"]
    g.verify()


def test_rollback_refuses_when_an_older_node_reads_a_new_value():
    g, x, r = base()
    g.add_output(r)
    mark = g.checkpoint()
    n = g.op("Neg", x, name="neg", before=r.producer)
    r.producer.set_input(0, n)
    with pytest.raises(GraphError, match="neg.*still used by relu"):
        g.rollback(mark)


def test_rollback_takes_only_a_checkpoint():
    g, _, _ = base()
    with pytest.raises(GraphError, match="Graph.checkpoint"):
        g.rollback(3)


def test_add_opaque_keeps_types_attrs_and_payload():
    g, x, r = base()
    payload = object()
    node = g.add_opaque("MyOp", [r, None], domain="torch", name="my", outputs=2,
                        output_types=[TensorType("float32", (2, 3)), None],
                        attrs={"target": "my_op"}, meta={"torch.callable": payload,
                                                           "kernel": lambda a, b: (a * 2, a)})
    assert node.is_opaque and node.domain == "torch" and node.attrs == {"target": "my_op"}
    assert node.meta["torch.callable"] is payload
    assert [v.type for v in node.outputs] == [TensorType("float32", (2, 3)), None]
    assert [v.name for v in node.outputs] == ["my_out0", "my_out1"]
    g.add_output(node.outputs[0])
    g.verify()
    out = run(g, {"x": np.full((2, 3), -1.0, np.float32)})
    np.testing.assert_array_equal(out["my_out0"], np.zeros((2, 3), np.float32))


def test_add_opaque_takes_output_names():
    g, x, _ = base()
    node = g.add_opaque("Layer", [x], domain="caffe", name="l", outputs=["top1", "top2"])
    assert [v.name for v in node.outputs] == ["top1", "top2"] and all(v.type is None for v in node.outputs)


def test_add_opaque_refuses_known_ops_core_domains_and_mismatched_types():
    g, x, _ = base()
    with pytest.raises(GraphError, match="framework's own domain"):
        g.add_opaque("Thing", [x], domain="")
    with pytest.raises(GraphError, match="framework's own domain"):
        g.add_opaque("FusedConv", [x], domain="aiacc")
    with pytest.raises(GraphError, match="2 outputs but 1 output types"):
        g.add_opaque("Thing", [x], domain="tf", outputs=2, output_types=[None])
    assert len(g) == 1


def test_untyped_inputs_and_remove_input():
    g = Graph("g")
    u = g.add_untyped_input("u")
    assert u.type is None and g.inputs == [u]
    with pytest.raises(GraphError, match="already used"):
        g.add_untyped_input("u")
    y = g.op("Relu", u, name="relu")
    with pytest.raises(GraphError, match="still used by relu"):
        g.remove_input(u)
    y.producer.set_input(0, None)
    g.erase(y.producer)
    g.remove_input(u)
    assert g.inputs == [] and not g.has_value("u")
    with pytest.raises(GraphError, match="not an input"):
        g.remove_input(u)


def test_node_remove_input_shifts_the_rest():
    g = Graph("g")
    a, b, c = (g.add_input(n, "float32", (2,)) for n in "abc")
    node = g.add_node("Sum", [a, b, c], name="sum")
    node.remove_input(1)
    assert node.inputs == (a, c)
    assert b.uses == [] and c.uses == [(node, 1)] and a.uses == [(node, 0)]
    with pytest.raises(GraphError, match="no input 5"):
        node.remove_input(5)
    g.add_output(node.output)
    g.verify()


def test_first_and_last_node():
    g = Graph("g")
    assert g.first_node is None and g.last_node is None
    x = g.add_input("x", "float32", (2,))
    a = g.op("Relu", x, name="a")
    b = g.op("Neg", a, name="b")
    assert g.first_node is a.producer and g.last_node is b.producer
