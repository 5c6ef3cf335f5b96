import numpy as np

from aiacc.core import parse
from aiacc.core.passes import run_passes
from tests.core.passes.helpers import check_pass, ops


def test_removes_identity_and_dropout_in_inference():
    g = parse("""graph g(%x: float32[2,3]) {
      %r: float32[2] = const [0.3]
      %i: float32[2,3] = Identity<i>(%x)
      %d: float32[2,3] = Dropout<d>(%i, %r)
      %y: float32[2,3] = Relu<y>(%d)
      %o: float32[2,3] = Identity<o>(%y)
      return %o
    }""".replace("float32[2] = const [0.3]", "float32[1] = const [0.3]"))
    check_pass(g, ["identity_removal"])
    assert ops(g) == ["Relu"] and g.outputs[0].name == "o"


def test_dropout_kept_in_training_or_when_training_mode_true_or_mask_read():
    text = """graph g(%x: float32[2,3]) {
      %r: float32[1] = const [0.3]
      %t: bool[] = const [true]
      %d: float32[2,3] = Dropout<d>(%x, %r, %t)
      %e, %mask: bool[2,3] = Dropout<e>(%x)
      %y: float32[2,3] = Add<y>(%d, %e)
      return %y, %mask
    }""".replace("%e, %mask: bool[2,3]", "%e: float32[2,3], %mask: bool[2,3]")
    g = parse(text)
    run_passes(g, passes=["identity_removal"])
    assert ops(g) == ["Dropout", "Dropout", "Add"]
    g = parse(text.replace("[true]", "[false]"))
    run_passes(g, passes=["identity_removal"], mode="training")
    assert ops(g) == ["Dropout", "Dropout", "Add"]
    run_passes(g, passes=["identity_removal"])
    assert ops(g) == ["Dropout", "Add"]  # training_mode=false: identity; the mask reader keeps the other


def test_identity_from_input_to_output_is_kept():
    g = parse("""graph g(%x: float32[2]) {
      %y: float32[2] = Identity<y>(%x)
      return %y
    }""")
    check_pass(g, ["identity_removal"])
    assert ops(g) == ["Identity"]


def test_cast_to_the_same_dtype_goes_and_a_real_cast_stays():
    g = parse("""graph g(%x: float32[2,3], %i: int32[2,3]) {
      %a: float32[2,3] = Cast<same>(%x) {to="float32"}
      %b: float32[2,3] = Relu<r>(%a)
      %c: int64[2,3] = Cast<widen>(%i) {to="int64"}
      return %b, %c
    }""")
    check_pass(g, ["identity_removal"])
    assert ops(g) == ["Relu", "Cast"] and g.nodes[0].inputs[0].name == "x"
