import numpy as np
import pytest

from aiacc.core import parse, run
from aiacc.core.ops.fused import decompose_all, parse_program
from aiacc.core.passes import random_feeds, run_passes
from aiacc.core.passes.elementwise_fusion import RULE
from aiacc.core.runtime.numba_kernels import run_fast
from tests.core.passes.helpers import check_pass, ops

P = ["elementwise_fusion"]


def test_chain_and_tree_fuse_into_one_node():
    g = parse("""graph g(%x: float32[2,3,4], %b: float32[3,1], %z: float32[2,3,4]) {
  %h: float32[] = const [0.5]
  %a: float32[2,3,4] = Mul<a>(%x, %h)
  %c: float32[2,3,4] = Add<c>(%a, %b)
  %s: float32[2,3,4] = Sigmoid<s>(%z)
  %d: float32[2,3,4] = Mul<d>(%c, %s)
  %e: float32[2,3,4] = LeakyRelu<e>(%d) {alpha=0.3}
  return %e
}""")
    report = check_pass(g, P, rtol=0, atol=0)  # the reference kernel runs the same ops: bit-identical
    assert ops(g) == ["aiacc::FusedElementwise"] and g.outputs[0].name == "e"
    prog = parse_program(g.nodes[0].attrs["program"])
    assert [s[1] for s in prog] == ["Mul", "Add", "Sigmoid", "Mul", "LeakyRelu"] and prog[-1][3] == {"alpha": 0.3}
    assert report["elementwise_fusion"].fused == 1 and report["elementwise_fusion"].removed == 5


def test_value_read_outside_splits_groups_and_non_elementwise_stops_them():
    g = parse("""graph g(%x: float32[4,4]) {
  %a: float32[4,4] = Exp<a>(%x)
  %b: float32[4,4] = Neg<b>(%a)
  %m: float32[4,4] = MatMul<m>(%b, %x)
  %c: float32[4,4] = Tanh<c>(%m)
  %d: float32[4,4] = Add<d>(%c, %a)
  return %d
}""")
    check_pass(g, P)
    # Exp is read by Neg and the final Add, in different groups: it fuses with neither
    assert ops(g) == ["Exp", "Neg", "MatMul", "aiacc::FusedElementwise"]
    assert RULE.explain(g, "b") == "no elementwise producer to fuse with"


def test_diamond_is_one_group():
    g = parse("""graph g(%x: float32[8]) {
  %a: float32[8] = Sigmoid<a>(%x)
  %b: float32[8] = Mul<b>(%a, %x)
  %c: float32[8] = Sub<c>(%a, %b)
  return %c
}""")
    check_pass(g, P, rtol=0, atol=0)
    assert ops(g) == ["aiacc::FusedElementwise"]


def test_mixed_dtypes_and_graph_outputs_are_respected():
    g = parse("""graph g(%x: float32[8], %i: int64[8]) {
  %a: float32[8] = Relu<a>(%x)
  %b: float32[8] = Neg<b>(%a)
  %j: int64[8] = Add<j>(%i, %i)
  %k: int64[8] = Neg<k>(%j)
  return %b, %a, %k
}""")
    check_pass(g, P)
    assert ops(g) == ["Relu", "Neg", "Add", "Neg"]
    assert "int64" in RULE.explain(g, "k")


def test_numba_fast_path_matches_reference_and_decompose_restores_ops():
    g = parse("""graph g(%x: float32[2,3,8,8], %b: float32[1,3,1,1]) {
  %a: float32[2,3,8,8] = Add<a>(%x, %b)
  %e: float32[2,3,8,8] = Gelu<e>(%a)
  %t: float32[2,3,8,8] = HardSwish<t>(%e)
  %lo: float32[] = const [-0.5]
  %hi: float32[] = const [2.0]
  %c: float32[2,3,8,8] = Clip<c>(%t, %lo, %hi)
  return %c
}""")
    feeds = random_feeds(g)
    ref = run(g, feeds)["c"]
    run_passes(g, passes=P)
    assert ops(g) == ["aiacc::FusedElementwise"]
    np.testing.assert_allclose(run_fast(g, feeds)["c"], ref, rtol=1e-5, atol=1e-6)
    decompose_all(g)
    assert ops(g) == ["Add", "Gelu", "HardSwish", "Clip"]
    np.testing.assert_array_equal(run(g, feeds)["c"], ref)


def test_training_mode_does_not_fuse():
    g = parse("graph g(%x: float32[2]) {\n %a: float32[2] = Relu<a>(%x)\n %b: float32[2] = Neg<b>(%a)\n return %b\n}")
    with pytest.raises(Exception, match="does not apply in training mode"):
        run_passes(g, passes=P, mode="training")
    run_passes(g, level=3, mode="training")
    assert ops(g) == ["Relu", "Neg"]
