"""The translation kit (aiacc.core.translate): OpTable, Untranslatable and decompose_fused."""
from __future__ import annotations

import numpy as np
import pytest

from aiacc.core import Graph, parse, run
from aiacc.core.translate import OpTable, TableError, Untranslatable, decompose_fused
from aiacc.errors import AiaccError, GraphError


def test_op_table_registers_every_key_and_looks_them_up():
    table = OpTable("test ops")

    @table.register("Relu", ("tf", "Relu6"), int)
    def fn(x):
        return x

    assert table.get("Relu") is fn and table[("tf", "Relu6")] is fn and table[int] is fn
    assert "Relu" in table and "Sigmoid" not in table and len(table) == 3
    assert list(table) == ["Relu", ("tf", "Relu6"), int] == list(table.keys())
    assert dict(table.items()) == {"Relu": fn, ("tf", "Relu6"): fn, int: fn}
    assert table.get("Sigmoid") is None and table.get("Sigmoid", 7) == 7
    assert table.get(["unhashable"]) is None and ["unhashable"] not in table


def test_op_table_missing_key_names_the_table():
    table = OpTable("caffe layers")
    with pytest.raises(KeyError, match="caffe layers.*'Conv'"):
        table["Conv"]


def test_op_table_refuses_a_key_twice_unless_replace():
    table = OpTable("torch functions")
    table.register("add")(lambda: 1)
    with pytest.raises(TableError, match=r"torch functions.*'add' is registered twice"):
        table.register("add")(lambda: 2)
    with pytest.raises(TableError, match="registered twice"):
        table["add"] = lambda: 3
    with pytest.raises(TableError, match="registered twice"):
        table.update({"add": lambda: 4})
    table.register("add", replace=True)(lambda: 5)
    assert table["add"]() == 5
    assert issubclass(TableError, AiaccError)


def test_op_table_names_a_type_key_by_its_qualified_name():
    table = OpTable("modules")
    table.add(np.ndarray, len)
    with pytest.raises(TableError, match=r"numpy\.ndarray"):
        table.add(np.ndarray, len)


def test_register_needs_a_key():
    with pytest.raises(TableError, match="at least one key"):
        OpTable("t").register()


def test_untranslatable_is_a_signal_not_a_user_error():
    # importers catch it to keep a node opaque; code that reports aiacc errors must not mistake it for one
    assert issubclass(Untranslatable, Exception) and not issubclass(Untranslatable, AiaccError)
    assert str(Untranslatable("grouped-query attention")) == "grouped-query attention"


FUSED = """
graph g(%x: float32[1,3,6,6], %a: float32[4,5], %b: float32[5,6]) {
  %w: float32[4,3,3,3] = const
  %c: float32[1,4,4,4] = aiacc::FusedConv<fc>(%x, %w) {activation="Relu"}
  %m: float32[4,6] = aiacc::FusedMatMul<fm>(%a, %b) {activation="Sigmoid"}
  return %c, %m
}
"""


def fused_graph() -> Graph:
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    return parse(FUSED, weights={"w": w})


def test_decompose_fused_rewrites_a_copy_into_standard_ops():
    g = fused_graph()
    before = str(g)
    d, count = decompose_fused(g)
    assert count == 2 and d is not g and str(g) == before
    assert all(n.domain == "" for n in d)
    assert [v.name for v in d.outputs] == ["c", "m"]
    d.verify()
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32),
             "a": rng.standard_normal((4, 5)).astype(np.float32),
             "b": rng.standard_normal((5, 6)).astype(np.float32)}
    want, got = run(g, feeds), run(d, feeds)
    assert list(got) == list(want) == ["c", "m"]
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


def test_decompose_fused_keeps_what_keep_accepts():
    d, count = decompose_fused(fused_graph(), keep={"FusedConv"})
    assert count == 1 and [n.qualified_op for n in d if n.domain] == ["aiacc::FusedConv"]
    d, count = decompose_fused(fused_graph(), keep=lambda n: n.op == "FusedMatMul")
    assert count == 1 and [n.qualified_op for n in d if n.domain] == ["aiacc::FusedMatMul"]
    with pytest.raises(GraphError, match="collection of op names"):
        decompose_fused(fused_graph(), keep="FusedConv")


def test_decompose_fused_returns_the_graph_itself_when_nothing_to_do():
    g = parse("graph g(%x: float32[2]) {\n  %y: float32[2] = Relu<r>(%x)\n  return %y\n}\n")
    assert decompose_fused(g) == (g, 0)
    g = fused_graph()
    assert decompose_fused(g, keep=lambda n: True) == (g, 0)


def test_decompose_fused_leaves_a_fused_op_it_cannot_decompose_untouched():
    # aiacc::Attention with k of unknown rank has no decomposition: it stays, with nothing half-built
    g = parse("""
graph g(%q: float32[2,4,8], %k, %v: float32[2,4,8]) {
  %o: float32[2,4,8] = aiacc::Attention<att>(%q, %k, %v) {scale=0.5}
  %r: float32[2,4,8] = Relu<r>(%o)
  return %r
}
""")
    d, count = decompose_fused(g)
    assert count == 0
    assert [n.qualified_op for n in d] == ["aiacc::Attention", "Relu"]
    assert not d.initializers
    d.verify()


def test_core_onnx_re_exports_decompose_fused():
    from aiacc.core import onnx as core_onnx

    assert core_onnx.decompose_fused is decompose_fused
