from aiacc.core import parse
from aiacc.core.passes import run_passes
from tests.core.passes.helpers import check_pass, ops


def test_merges_identical_nodes_and_constants():
    g = parse("""graph g(%x: float32[2,3]) {
      %c1: float32[3] = const [1.0, 2.0, 3.0]
      %c2: float32[3] = const [1.0, 2.0, 3.0]
      %a: float32[2,3] = Add<a>(%x, %c1)
      %b: float32[2,3] = Add<b>(%x, %c2)
      %ra: float32[2,3] = Relu<ra>(%a)
      %rb: float32[2,3] = Relu<rb>(%b)
      %y: float32[2,3] = Mul<y>(%ra, %rb)
      return %y
    }""")
    report = check_pass(g, ["cse"])
    assert ops(g) == ["Add", "Relu", "Mul"]
    assert report["cse"].rewrites == 3 and report["cse"].const_bytes_saved == 12


def test_attributes_and_random_ops_keep_nodes_apart():
    g = parse("""graph g(%x: float32[2,3]) {
      %a: float32[2,3] = LeakyRelu<a>(%x) {alpha=0.1}
      %b: float32[2,3] = LeakyRelu<b>(%x) {alpha=0.2}
      %d1: float32[2,3] = Dropout<d1>(%x)
      %d2: float32[2,3] = Dropout<d2>(%x)
      %s: float32[2,3] = Sum<s>(%a, %b, %d1, %d2)
      return %s
    }""")
    run_passes(g, passes=["cse"])
    assert ops(g) == ["LeakyRelu", "LeakyRelu", "Dropout", "Dropout", "Sum"]


def test_duplicate_graph_output_keeps_its_name():
    g = parse("""graph g(%x: float32[2]) {
      %a: float32[2] = Relu<a>(%x)
      %b: float32[2] = Relu<b>(%x)
      %y: float32[2] = Add<y>(%a, %x)
      return %y, %b
    }""")
    check_pass(g, ["cse"])
    assert ops(g) == ["Relu", "Add"] and [v.name for v in g.outputs] == ["y", "b"]
