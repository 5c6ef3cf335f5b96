import numpy as np

from aiacc.core import parse
from aiacc.core.passes import run_passes
from aiacc.core.passes.transpose_reshape import RULES
from tests.core.passes.helpers import check_pass, ops

P = ["transpose_reshape_cancellation"]


def test_transpose_pair_cancels():
    g = parse("""graph g(%x: float32[2,3,4]) {
      %t1: float32[3,4,2] = Transpose<t1>(%x) {perm=[1,2,0]}
      %t2: float32[2,3,4] = Transpose<t2>(%t1) {perm=[2,0,1]}
      %y: float32[2,3,4] = Relu<y>(%t2)
      return %y
    }""")
    check_pass(g, P)
    assert ops(g) == ["Relu"]


def test_transpose_pair_composes():
    g = parse("""graph g(%x: float32[2,3,4]) {
      %t1: float32[3,2,4] = Transpose<t1>(%x) {perm=[1,0,2]}
      %t2: float32[4,2,3] = Transpose<t2>(%t1) {perm=[2,1,0]}
      return %t2
    }""")
    check_pass(g, P)
    assert ops(g) == ["Transpose"] and g.outputs[0].name == "t2"
    assert g.nodes[0].attrs["perm"] == [2, 0, 1]


def test_inner_transpose_used_elsewhere_stays():
    g = parse("""graph g(%x: float32[2,3]) {
      %t1: float32[3,2] = Transpose<t1>(%x)
      %t2: float32[2,3] = Transpose<t2>(%t1)
      %y: float32[2,3] = Add<y>(%t2, %x)
      return %y, %t1
    }""")
    check_pass(g, P)
    assert ops(g) == ["Transpose", "Add"]


def test_cancelled_pair_between_input_and_output_keeps_output_name():
    g = parse("""graph g(%x: float32[2,3]) {
      %t1: float32[3,2] = Transpose<t1>(%x)
      %t2: float32[2,3] = Transpose<t2>(%t1)
      return %t2
    }""")
    check_pass(g, P)
    assert ops(g) == ["Identity"] and g.outputs[0].name == "t2"


def test_reshape_chain_and_identity_reshape():
    g = parse("""graph g(%x: float32[2,3,4]) {
      %s1: int64[2] = const [6, 4]
      %s2: int64[3] = const [0, 2, 2]
      %s3: int64[3] = const [2, 3, 4]
      %a: float32[6,4] = Reshape<a>(%x, %s1)
      %b: float32[6,2,2] = Reshape<b>(%a, %s2)
      %c: float32[2,3,4] = Reshape<c>(%x, %s3)
      %y: float32[2,3,4] = Relu<y>(%c)
      return %b, %y
    }""")
    check_pass(g, P)
    assert ops(g) == ["Reshape", "Relu"]
    r = g.nodes[0]
    assert r.inputs[0].name == "x" and r.inputs[1].const.tolist() == [6, 2, 2]


def test_symbolic_reshape_not_assumed_identity():
    g = parse("""graph g(%x: float32[N,M]) {
      %s: int64[2] = const [-1, 1]
      %y: float32[?,1] = Reshape<r>(%x, %s)
      return %y
    }""")
    run_passes(g, passes=P)
    assert ops(g) == ["Reshape"]
    assert RULES["reshape_identity"].explain(g, "r") is not None
