import numpy as np
import pytest

from aiacc.core import parse, run
from aiacc.core.passes import random_feeds, run_passes
from aiacc.errors import AiaccError


def test_dce_removes_dead_chain_and_unused_constants():
    g = parse("""graph g(%x: float32[2,3]) {
      %c: float32[3] = const [1.0, 2.0, 3.0]
      %d: float32[3] = const [4.0, 5.0, 6.0]
      %a: float32[2,3] = Add<a>(%x, %c)
      %dead1: float32[2,3] = Mul<m>(%x, %d)
      %dead2: float32[2,3] = Relu<r>(%dead1)
      return %a
    }""")
    feeds = random_feeds(g)
    before = run(g, feeds)
    report = run_passes(g, passes=["dce"])
    assert [n.name for n in g] == ["a"]
    assert "d" not in g.initializers
    assert report["dce"].removed == 2
    assert report["dce"].const_bytes_saved == 12
    np.testing.assert_array_equal(run(g, feeds)["a"], before["a"])
    g.verify()


def test_dce_keeps_graph_outputs_and_side_effects():
    g = parse("""graph g(%x: float32[2]) {
      %a: float32[2] = Relu<a>(%x)
      %b: float32[2] = Neg<b>(%x)
      %o: float32[2] = custom::Print<p>(%x)
      return %a, %b
    }""")
    g.find_nodes("Print", "custom")[0].meta["side_effects"] = True
    run_passes(g, passes=["dce"])
    assert [n.name for n in g] == ["a", "b", "p"]


def test_dce_unknown_pass_is_named():
    g = parse("graph g(%x: float32[2]) {\n %a: float32[2] = Relu<a>(%x)\n return %a\n}")
    with pytest.raises(AiaccError, match="unknown pass 'nope'"):
        run_passes(g, passes=["nope"])
    with pytest.raises(AiaccError, match="unknown pass 'nope2'"):
        run_passes(g, disable=["nope2"])


def test_level0_runs_nothing():
    g = parse("graph g(%x: float32[2]) {\n %a: float32[2] = Relu<a>(%x)\n %b: float32[2] = Neg<b>(%x)\n"
              " return %a\n}")
    report = run_passes(g, level=0)
    assert report.records == [] and len(g) == 2
