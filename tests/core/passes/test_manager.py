import numpy as np
import pytest

from aiacc.core import parse
from aiacc.core.passes import (FunctionPass, Pass, passes_by_level, random_feeds, run_passes)
from aiacc.core.passes.manager import all_passes
from aiacc.errors import AiaccError, VerificationError

TEXT = """graph g(%x: float32[N,3]) {
  %c: float32[3] = const [1.0, 2.0, 3.0]
  %d: float32[3] = const [1.0, 2.0, 3.0]
  %i: float32[N,3] = Identity<i>(%x)
  %a: float32[N,3] = Add<a>(%i, %c)
  %b: float32[N,3] = Add<b>(%i, %d)
  %r: float32[N,3] = Relu<r>(%a)
  %s: float32[N,3] = Relu<s>(%b)
  %y: float32[N,3] = Mul<y>(%r, %s)
  %dead: float32[N,3] = Neg<dead>(%x)
  return %y
}"""


def test_levels_are_nested_and_documented():
    levels = passes_by_level()
    assert levels[0] == []
    for lo, hi in ((1, 2), (2, 3)):
        assert set(levels[lo]) < set(levels[hi])
    assert "batchnorm_folding" in levels[2] and "batchnorm_folding" not in levels[1]
    assert "elementwise_fusion" in levels[3] and "elementwise_fusion" not in levels[2]
    for name, p in all_passes().items():
        assert "Assumes" in p.doc and "Guarantees" in p.doc, name


def test_report_counts_and_renders():
    g = parse(TEXT)
    report = run_passes(g, level=1)
    assert [n.op for n in g] == ["Add", "Relu", "Mul"]
    d = report.as_dict()
    assert d["nodes_before"] == 7 and d["nodes_after"] == 3
    names = [p["name"] for p in d["passes"]]
    assert names == passes_by_level()[1]
    assert report["identity_removal"].removed == 1 and report["cse"].removed == 2
    assert report["cse"].const_bytes_saved == 12
    assert report["dce"].ops_removed == {"Neg": 1}
    text = str(report)
    assert "identity_removal" in text and "cse" in text and "const saved" in text


def test_passes_and_disable_select_exactly():
    g = parse(TEXT)
    report = run_passes(g, passes=["dce", "identity_removal"])
    assert [r.name for r in report.records] == ["dce", "identity_removal"]
    assert [n.op for n in g] == ["Add", "Add", "Relu", "Relu", "Mul"]
    g = parse(TEXT)
    report = run_passes(g, level=1, disable="cse,dce")
    assert "cse" not in [r.name for r in report.records] and len(g) == 6


def test_debug_names_the_pass_that_breaks_numerics():
    def bad(graph, ctx):
        """Assumes nothing. Guarantees nothing: turns every Relu into a Sigmoid."""
        for n in graph:
            if n.op == "Relu":
                n.op = "Sigmoid"
        return 1

    g = parse(TEXT)
    with pytest.raises(VerificationError, match="pass flip_relu changed the numerics: output 0 differs"):
        run_passes(g, passes=["cse", FunctionPass("flip_relu", bad)], debug=True)


def test_debug_names_the_pass_that_breaks_the_graph():
    class Dangle(Pass):
        """Assumes nothing. Guarantees nothing: leaves a graph output nothing defines."""
        name = "dangle"

        def run(self, graph, ctx):
            graph.outputs[0].producer.outputs[0].uses.append((graph.nodes[0], 0))
            return 1

    g = parse(TEXT)
    with pytest.raises(VerificationError, match="pass dangle left an invalid graph"):
        run_passes(g, passes=[Dangle()], debug=True)


def test_debug_mode_checks_every_pass_with_given_feeds():
    g = parse(TEXT)
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3) - 3}
    report = run_passes(g, level=3, debug=True, feeds=feeds)
    assert all(r.checked == "graph+numerics" for r in report.records)


def test_random_feeds_bind_symbols_consistently():
    g = parse("graph g(%a: float32[N,S,4], %b: int64[N,S], %m: bool[S]) {\n return %a\n}")
    f = random_feeds(g)
    assert f["a"].shape == (2, 8, 4) and f["b"].shape == (2, 8) and f["m"].shape == (8,)
    assert f["b"].dtype == np.int64 and f["m"].dtype == np.bool_


def test_a_crashing_pass_is_named():
    def boom(graph, ctx):
        raise ZeroDivisionError("oops")

    g = parse(TEXT)
    with pytest.raises(AiaccError, match="pass boom failed: ZeroDivisionError: oops"):
        run_passes(g, passes=[FunctionPass("boom", boom)])


def test_bad_level_and_mode():
    g = parse(TEXT)
    with pytest.raises(AiaccError, match="level must be 0..3"):
        run_passes(g, level=4)
    with pytest.raises(AiaccError, match="unknown mode"):
        run_passes(g, mode="eval")


def test_float64_copy_widens_types_constants_and_dtype_attributes_and_leaves_the_graph_alone():
    from aiacc.core import run
    from aiacc.core.passes.manager import float64_copy

    text = """graph g(%x: float32[3], %i: int64[3]) {
      %w: float32[3] = const
      %c: float32[3] = Cast<cast>(%i) {to="float32"}
      %m: float32[3] = Mul<mul>(%x, %w)
      %y: float32[3] = Add<add>(%m, %c)
      return %y
    }"""
    w = np.array([0.1, 0.2, 0.3], np.float32)
    g = parse(text, {"w": w})
    wide = float64_copy(g)
    assert str(g) == str(parse(text, {"w": w})) and g.initializers["w"].const.dtype == np.float32
    assert wide.outputs[0].dtype == "float64" and wide.initializers["w"].const.dtype == np.float64
    assert next(n for n in wide if n.op == "Cast").attrs["to"] == "float64"
    x, i = np.array([1.0, 2.0, 3.0]), np.arange(3)
    y = run(wide, {"x": x, "i": i})["y"]
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, x * w.astype(np.float64) + i, rtol=1e-15)
