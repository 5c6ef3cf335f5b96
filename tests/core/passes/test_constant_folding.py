import numpy as np

from aiacc.core import parse
from aiacc.core.passes import run_passes
from tests.core.passes.helpers import check_pass, ops


def test_folds_constant_subgraph_and_keeps_names():
    g = parse("""graph g(%x: float32[2,3]) {
      %a: float32[3] = const [1.0, 2.0, 3.0]
      %b: float32[3] = const [0.5, 0.5, 0.5]
      %k: float32[1] = Constant<k>() {value=tensor<float32[1]>[2.0]}
      %ab: float32[3] = Mul<m>(%a, %b)
      %abk: float32[3] = Add<ad>(%ab, %k)
      %y: float32[2,3] = Add<y>(%x, %abk)
      return %y
    }""")
    report = check_pass(g, ["constant_folding"])
    assert ops(g) == ["Add"]
    np.testing.assert_array_equal(g.initializers["abk"].const, np.array([2.5, 3.0, 3.5], np.float32))
    assert report["constant_folding"].removed == 3


def test_folds_shape_of_static_value_into_reshape_target():
    g = parse("""graph g(%x: float32[2,3,4]) {
      %s: int64[3] = Shape<s>(%x)
      %y: float32[2,3,4] = Reshape<r>(%x, %s)
      return %y
    }""")
    check_pass(g, ["constant_folding"])
    assert ops(g) == ["Reshape"]
    assert g.initializers["s"].const.tolist() == [2, 3, 4]


def test_does_not_fold_dynamic_shape_or_dropout_or_opaque():
    g = parse("""graph g(%x: float32[N,3]) {
      %c: float32[3] = const [1.0, 2.0, 3.0]
      %s: int64[2] = Shape<s>(%x)
      %d: float32[3] = Dropout<d>(%c)
      %o: float32[3] = vendor::Magic<o>(%c)
      %y: float32[N,3] = Add<y>(%x, %d)
      return %y, %s, %o
    }""")
    run_passes(g, passes=["constant_folding"])
    assert ops(g) == ["Shape", "Dropout", "vendor::Magic", "Add"]


def test_training_mode_leaves_parameters_alone():
    g = parse("""graph g(%x: float32[2,3]) {
      %w: float32[3,2] = const [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
      %wt: float32[2,3] = Transpose<t>(%w)
      %k: float32[1] = Constant<k>() {value=tensor<float32[1]>[2.0]}
      %k2: float32[1] = Mul<m>(%k, %k)
      %y: float32[2,3] = Mul<y>(%x, %wt)
      %z: float32[2,3] = Add<z>(%y, %k2)
      return %z
    }""")
    check_pass(g, ["constant_folding"], mode="training")
    assert ops(g) == ["Transpose", "Mul", "Add"]
    check_pass(g, ["constant_folding"])
    assert ops(g) == ["Mul", "Add"]


def test_folded_graph_output_keeps_its_name():
    g = parse("""graph g(%x: float32[2]) {
      %a: float32[2] = const [1.0, -2.0]
      %r: float32[2] = Relu<r>(%a)
      %y: float32[2] = Add<y>(%x, %r)
      return %y, %r
    }""")
    check_pass(g, ["constant_folding"])
    assert [v.name for v in g.outputs] == ["y", "r"] and ops(g) == ["Add"]
