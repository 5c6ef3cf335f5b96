import numpy as np
import pytest

from aiacc.core import parse
from aiacc.core.passes import run_passes
from aiacc.core.passes.affine_folding import RULES
from tests.core.passes.helpers import check_pass, ops

P = ["affine_folding"]
rng = np.random.default_rng(11)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def keras_bn(s_shape="[1,4,1,1]", t_shape="[4,1,1]", conv="Conv<conv>(%x, %w)", w_shape="[4,3,3,3]",
             extra_inputs="", tail="return %y"):
    """Conv -> Add(bias) -> Mul(s) -> Add(t): how the TF importer hands over a Keras Conv2D + BatchNorm."""
    dims = [int(d) for d in w_shape.strip("[]").split(",")]
    s_dims = [int(d) for d in s_shape.strip("[]").split(",") if d]
    t_dims = [int(d) for d in t_shape.strip("[]").split(",") if d]
    text = f"""graph g(%x: float32[N,3,6,6]{extra_inputs}) {{
      %w: float32{w_shape} = const
      %cb: float32[1,4,1,1] = const
      %s: float32{s_shape} = const
      %t: float32{t_shape} = const
      %c: float32[N,4,6,6] = {conv} {{pads=[1,1,1,1]}}
      %cc: float32[N,4,6,6] = Add<bias>(%c, %cb)
      %m: float32[N,4,6,6] = Mul<mul>(%cc, %s)
      %y: float32[N,4,6,6] = Add<add>(%m, %t)
      {tail}
    }}"""
    return parse(text, {"w": f32(*dims), "cb": f32(1, 4, 1, 1), "s": rng.uniform(0.5, 2, s_dims).astype(np.float32),
                        "t": f32(*t_dims)})


def test_keras_batchnorm_chain_folds_into_the_conv():
    g = keras_bn()
    report = check_pass(g, P)
    assert ops(g) == ["Conv"] and g.outputs[0].name == "y"
    assert report["affine_folding"].rewrites == 3


@pytest.mark.parametrize("s_shape", ["[]", "[4,1,1]", "[1,4,1,1]", "[1]"])
def test_scalar_and_per_channel_shapes_fold(s_shape):
    g = keras_bn(s_shape=s_shape, t_shape="[4,1,1]")
    check_pass(g, P)
    assert ops(g) == ["Conv"]


def test_constant_varying_over_space_does_not_fold():
    g = keras_bn(s_shape="[4,6,6]")
    check_pass(g, P)
    assert ops(g) == ["Conv", "Mul", "Add"]  # the bias Add folded, the Mul and what follows it stay
    why = RULES["scale_into_linear"].explain(g, "mul")
    assert why is not None and "varies along axis 2" in why


def test_shared_conv_output_and_non_constant_weight_do_not_fold():
    g = keras_bn(tail="%z: float32[N,4,6,6] = Relu<r>(%c)\n      return %y, %z")
    assert "also used by Relu<r>" in RULES["shift_into_linear"].explain(g, "bias")
    check_pass(g, P)
    assert ops(g) == ["Conv", "Add", "Mul", "Add", "Relu"]
    g = keras_bn(conv="Conv<conv>(%x, %wx)", extra_inputs=", %wx: float32[4,3,3,3]")
    assert "is not a constant" in RULES["shift_into_linear"].explain(g, "bias")
    check_pass(g, P)
    assert ops(g) == ["Conv", "Add", "Mul", "Add"]


def test_training_mode_skips_the_pass():
    g = keras_bn()
    report = run_passes(g, level=2, mode="training")
    assert "affine_folding" not in [r.name for r in report.records]
    assert ops(g).count("Mul") == 1


def test_div_and_sub_fold_and_scalar_times_conv_in_either_order():
    g = parse("""graph g(%x: float32[2,3,5,5]) {
      %w: float32[4,3,1,1] = const
      %d: float32[4,1,1] = const
      %e: float32[4,1,1] = const
      %k: float32[] = const [0.5]
      %c: float32[2,4,5,5] = Conv<conv>(%x, %w)
      %q: float32[2,4,5,5] = Div<div>(%c, %d)
      %r: float32[2,4,5,5] = Sub<sub>(%q, %e)
      %y: float32[2,4,5,5] = Mul<mul>(%k, %r)
      return %y
    }""", {"w": f32(4, 3, 1, 1), "d": rng.uniform(0.5, 2, (4, 1, 1)).astype(np.float32), "e": f32(4, 1, 1)})
    check_pass(g, P)
    assert ops(g) == ["Conv"]


def test_constant_minus_conv_does_not_fold_as_a_shift():
    g = parse("""graph g(%x: float32[2,3,5,5]) {
      %w: float32[4,3,1,1] = const
      %e: float32[4,1,1] = const
      %c: float32[2,4,5,5] = Conv<conv>(%x, %w)
      %y: float32[2,4,5,5] = Sub<sub>(%e, %c)
      return %y
    }""", {"w": f32(4, 3, 1, 1), "e": f32(4, 1, 1)})
    assert RULES["shift_into_linear"].explain(g, "sub") is not None
    check_pass(g, P)
    assert ops(g) == ["Conv", "Sub"]


def test_grouped_convtranspose_scale_and_shift():
    g = parse("""graph g(%x: float32[2,4,3,3]) {
      %w: float32[4,3,2,2] = const
      %s: float32[6,1,1] = const
      %t: float32[1,6,1,1] = const
      %c: float32[2,6,6,6] = ConvTranspose<ct>(%x, %w) {group=2, strides=[2,2]}
      %m: float32[2,6,6,6] = Mul<mul>(%c, %s)
      %y: float32[2,6,6,6] = Add<add>(%m, %t)
      return %y
    }""", {"w": f32(4, 3, 2, 2), "s": rng.uniform(0.5, 2, (6, 1, 1)).astype(np.float32), "t": f32(1, 6, 1, 1)})
    check_pass(g, P)
    assert ops(g) == ["ConvTranspose"]


@pytest.mark.parametrize("transB", [0, 1])
def test_gemm_column_scale_and_shift(transB):
    wshape = "[5,3]" if transB else "[3,5]"
    g = parse(f"""graph g(%x: float32[4,3]) {{
      %w: float32{wshape} = const
      %c: float32[4,5] = const
      %s: float32[5] = const
      %t: float32[1,5] = const
      %gm: float32[4,5] = Gemm<gemm>(%x, %w, %c) {{beta=0.5, alpha=2.0, transB={transB}}}
      %m: float32[4,5] = Mul<mul>(%gm, %s)
      %y: float32[4,5] = Add<add>(%m, %t)
      return %y
    }}""", {"w": f32(5, 3) if transB else f32(3, 5), "c": f32(4, 5), "s": f32(5), "t": f32(1, 5)})
    check_pass(g, P)
    assert ops(g) == ["Gemm"]


def test_gemm_row_constant_does_not_fold():
    g = parse("""graph g(%x: float32[4,3]) {
      %w: float32[3,5] = const
      %s: float32[4,1] = const
      %gm: float32[4,5] = Gemm<gemm>(%x, %w)
      %y: float32[4,5] = Mul<mul>(%gm, %s)
      return %y
    }""", {"w": f32(3, 5), "s": f32(4, 1)})
    assert "not only the channel axis 1" in RULES["scale_into_linear"].explain(g, "mul")


def test_batched_matmul_with_constant_weight_takes_a_scale():
    g = parse("""graph g(%x: float32[2,7,3]) {
      %w: float32[3,5] = const
      %s: float32[5] = const
      %mm: float32[2,7,5] = MatMul<mm>(%x, %w)
      %y: float32[2,7,5] = Mul<mul>(%mm, %s)
      return %y
    }""", {"w": f32(3, 5), "s": f32(5)})
    check_pass(g, P)
    assert ops(g) == ["MatMul"]


def test_fused_conv_with_activation_or_residual_takes_no_scale():
    g = parse("""graph g(%x: float32[2,3,5,5], %r: float32[2,4,5,5]) {
      %w: float32[4,3,1,1] = const
      %s: float32[4,1,1] = const
      %a: float32[2,4,5,5] = aiacc::FusedConv<fc>(%x, %w) {activation="Relu"}
      %y: float32[2,4,5,5] = Mul<mul>(%a, %s)
      %bb: float32[4] = const
      %b: float32[2,4,5,5] = aiacc::FusedConv<fc2>(%x, %w, %bb, %r)
      %z: float32[2,4,5,5] = Mul<mul2>(%b, %s)
      return %y, %z
    }""", {"w": f32(4, 3, 1, 1), "s": f32(4, 1, 1), "bb": f32(4)})
    assert "applies Relu before the Mul" in RULES["scale_into_linear"].explain(g, "mul")
    assert "residual" in RULES["scale_into_linear"].explain(g, "mul2")
    check_pass(g, P)
    assert ops(g) == ["aiacc::FusedConv", "Mul", "aiacc::FusedConv", "Mul"]


def test_fused_conv_with_residual_takes_a_shift():
    g = parse("""graph g(%x: float32[2,3,5,5], %r: float32[2,4,5,5]) {
      %w: float32[4,3,1,1] = const
      %s: float32[4,1,1] = const
      %bb: float32[4] = const
      %b: float32[2,4,5,5] = aiacc::FusedConv<fc2>(%x, %w, %bb, %r)
      %u: float32[2,4,5,5] = Add<add2>(%b, %s)
      return %u
    }""", {"w": f32(4, 3, 1, 1), "s": f32(4, 1, 1), "bb": f32(4)})
    check_pass(g, P)
    assert ops(g) == ["aiacc::FusedConv"]


def test_level2_pipeline_reaches_a_fused_conv_with_relu():
    g = keras_bn(tail="%z: float32[N,4,6,6] = Relu<relu>(%y)\n      return %z")
    run_passes(g, level=2, debug=True)
    assert ops(g) == ["aiacc::FusedConv"] and g.nodes[0].attrs["activation"] == "Relu"


def test_shared_weight_is_not_duplicated_by_a_scale():
    """Tied weights (an embedding table reused by the output projection) keep one copy."""
    g = parse("""graph g(%x: float32[2,7,3]) {
      %w: float32[3,5] = const
      %s: float32[5] = const
      %mm: float32[2,7,5] = MatMul<mm>(%x, %w)
      %y: float32[2,7,5] = Mul<mul>(%mm, %s)
      %mm2: float32[2,7,5] = MatMul<mm2>(%x, %w)
      return %y, %mm2
    }""", {"w": f32(3, 5), "s": f32(5)})
    assert "is shared with MatMul<mm2>" in RULES["scale_into_linear"].explain(g, "mul")
    check_pass(g, P)
    assert ops(g) == ["MatMul", "Mul", "MatMul"]
