import numpy as np
import pytest

from aiacc.core import parse
from aiacc.core.passes import run_passes
from aiacc.core.passes.transpose_reshape import RULES
from tests.core.passes.helpers import check_pass, ops

P = ["transpose_reshape_cancellation"]
PROP = ["transpose_propagation"]


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


def tensordot(target="[-1,5,8]", flat="[-1,6]", x_shape="[N,5,6]"):
    """TF's Tensordot: Reshape to a matrix, MatMul, Reshape back."""
    n_t = len(target.split(","))
    return parse(f"""graph g(%x: float32{x_shape}) {{
      %w: float32[6,8] = const
      %s1: int64[2] = const {flat}
      %s2: int64[{n_t}] = const {target}
      %f: float32[?,6] = Reshape<flat>(%x, %s1)
      %m: float32[?,8] = MatMul<mm>(%f, %w)
      %y: float32[?,5,8] = Reshape<unflat>(%m, %s2)
      return %y
    }}""", {"w": np.random.default_rng(5).standard_normal((6, 8)).astype(np.float32)})


def test_tensordot_becomes_one_batched_matmul():
    from aiacc.core.passes.transpose_reshape import tensordot_matmul

    g = tensordot()
    assert tensordot_matmul.explain(g, "unflat") is None
    check_pass(g, PROP)
    assert ops(g) == ["MatMul"] and g.outputs[0].name == "y"


def test_tensordot_that_reorders_rows_stays():
    from aiacc.core.passes.transpose_reshape import tensordot_matmul

    g = tensordot(target="[5,-1,8]")
    assert "does not restore the leading axes" in tensordot_matmul.explain(g, "unflat")
    check_pass(g, PROP)
    assert ops(g) == ["Reshape", "MatMul", "Reshape"]


def test_transposed_product_of_transposes_loses_a_transpose():
    from aiacc.core.passes.transpose_reshape import transposed_product

    g = parse("""graph g(%a: float32[2,4,3,5], %b: float32[2,6,3,5]) {
      %ta: float32[2,3,4,5] = Transpose<ta>(%a) {perm=[0,2,1,3]}
      %tb: float32[2,3,5,6] = Transpose<tb>(%b) {perm=[0,2,3,1]}
      %m: float32[2,3,4,6] = MatMul<mm>(%ta, %tb)
      %y: float32[2,3,6,4] = Transpose<t>(%m) {perm=[0,1,3,2]}
      return %y
    }""")
    assert transposed_product.explain(g, "t") is None
    check_pass(g, PROP)
    assert sorted(ops(g)) == ["MatMul", "Transpose", "Transpose"]


def test_transpose_of_product_moving_batch_axes_stays():
    from aiacc.core.passes.transpose_reshape import transposed_product

    g = parse("""graph g(%a: float32[2,4,3,5], %b: float32[2,6,3,5]) {
      %ta: float32[2,3,4,5] = Transpose<ta>(%a) {perm=[0,2,1,3]}
      %tb: float32[2,3,5,6] = Transpose<tb>(%b) {perm=[0,2,3,1]}
      %m: float32[2,3,4,6] = MatMul<mm>(%ta, %tb)
      %y: float32[3,2,4,6] = Transpose<t>(%m) {perm=[1,0,2,3]}
      return %y
    }""")
    assert "does not just swap the last two axes" in transposed_product.explain(g, "t")
    check_pass(g, PROP)
    assert ops(g).count("Transpose") == 3


def test_axis_groups():
    from aiacc.core.passes.transpose_reshape import axis_groups

    assert axis_groups((16, 2, 192), (16, 2, 3, 4, 16)) == [([0], [0]), ([1], [1]), ([2], [2, 3, 4])]
    assert axis_groups((6, 4), (2, 12)) == [([0, 1], [0, 1])]
    assert axis_groups((2, 3, 1), (6,)) == [([0, 1, 2], [0])]
    assert axis_groups(("N", 4), (8,)) is None


_RNG = np.random.default_rng(9)
MHA_W = {"w": _RNG.standard_normal((8, 24)).astype(np.float32), "b": _RNG.standard_normal(24).astype(np.float32),
         "wo": _RNG.standard_normal((8, 8)).astype(np.float32)}


def test_batch_first_false_attention_projections_lose_their_transposes():
    """torch's MultiheadAttention (batch_first=False) as the plugin decomposes it, around the fused
    projections: Transpose -> FusedMatMul -> Reshape -> Transpose, and Transpose -> Reshape -> FusedMatMul ->
    Transpose."""
    g = parse("""graph g(%x: float32[2,5,8], %a: float32[2,2,5,4]) {
      %w: float32[8,24] = const
      %b: float32[24] = const
      %wo: float32[8,8] = const
      %s1: int64[5] = const [0, 0, 3, 2, 4]
      %s2: int64[3] = const [5, 2, 8]
      %xt: float32[5,2,8] = Transpose<xt>(%x) {perm=[1,0,2]}
      %p: float32[5,2,24] = aiacc::FusedMatMul<inproj>(%xt, %w, %b)
      %pr: float32[5,2,3,2,4] = Reshape<pr>(%p, %s1)
      %qkv: float32[3,2,2,5,4] = Transpose<qkv>(%pr) {perm=[2,1,3,0,4]}
      %at: float32[5,2,2,4] = Transpose<at>(%a) {perm=[2,0,1,3]}
      %ar: float32[5,2,8] = Reshape<ar>(%at, %s2)
      %o: float32[5,2,8] = aiacc::FusedMatMul<outproj>(%ar, %wo)
      %y: float32[2,5,8] = Transpose<y>(%o) {perm=[1,0,2]}
      return %qkv, %y
    }""", MHA_W)
    check_pass(g, PROP)
    assert ops(g).count("Transpose") == 2 and ops(g).count("Reshape") == 2
    # the kept reshapes copy the batch axis (0) instead of fixing its size
    shapes = [list(n.inputs[1].const) for n in g if n.op == "Reshape"]
    assert [0, 0, 3, 2, 4] in shapes and [0, 0, 8] in shapes


def test_transposes_that_would_not_compose_stay_before_the_product():
    from aiacc.core.passes.transpose_reshape import transpose_through_product

    g = parse("""graph g(%x: float32[2,5,8]) {
      %w: float32[8,24] = const
      %xt: float32[5,2,8] = Transpose<xt>(%x) {perm=[1,0,2]}
      %p: float32[5,2,24] = MatMul<mm>(%xt, %w)
      %y: float32[5,2,24] = Relu<y>(%p)
      return %y
    }""", {"w": MHA_W["w"]})
    assert "no Transpose follows" in transpose_through_product.explain(g, "mm")
    check_pass(g, PROP)
    assert ops(g) == ["Transpose", "MatMul", "Relu"]
    g = parse("""graph g(%x: float32[8,5,2]) {
      %w: float32[8,24] = const
      %xt: float32[2,5,8] = Transpose<xt>(%x) {perm=[2,1,0]}
      %p: float32[2,5,24] = MatMul<mm>(%xt, %w)
      %y: float32[5,2,24] = Transpose<y>(%p) {perm=[1,0,2]}
      return %y
    }""", {"w": MHA_W["w"]})
    assert "moves the last axis" in transpose_through_product.explain(g, "mm")


def test_propagation_is_inference_only():
    """A training-mode Dropout draws its mask in its input's memory order: layouts must not move."""
    from aiacc.errors import AiaccError

    g = tensordot()
    with pytest.raises(AiaccError, match="does not apply in training mode"):
        run_passes(g, passes=PROP, mode="training")
    run_passes(g, level=2, mode="training")
    assert ops(g) == ["Reshape", "MatMul", "Reshape"]
