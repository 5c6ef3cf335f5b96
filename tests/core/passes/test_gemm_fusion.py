import numpy as np
import pytest

from aiacc.core import parse
from aiacc.core.passes import run_passes
from aiacc.core.passes.gemm_fusion import RULES
from tests.core.passes.helpers import check_pass, ops

P = ["gemm_fusion"]
rng = np.random.default_rng(2)
W = {"w": rng.standard_normal((3, 5)).astype(np.float32), "c": rng.standard_normal(5).astype(np.float32)}


def test_matmul_add_relu_is_fused_gemm():
    g = parse("""graph g(%x: float32[N,3]) {
      %w: float32[3,5] = const
      %c: float32[5] = const
      %m: float32[N,5] = MatMul<mm>(%x, %w)
      %a: float32[N,5] = Add<add>(%c, %m)
      %r: float32[N,5] = Relu<relu>(%a)
      return %r
    }""", W)
    check_pass(g, P)
    assert ops(g) == ["aiacc::FusedGemm"] and g.nodes[0].attrs["activation"] == "Relu"


def test_matmul_add_without_activation_is_gemm():
    g = parse("""graph g(%x: float32[4,3], %c: float32[4,1]) {
      %w: float32[3,5] = const
      %m: float32[4,5] = MatMul<mm>(%x, %w)
      %a: float32[4,5] = Add<add>(%m, %c)
      return %a
    }""", W)
    check_pass(g, P)
    assert ops(g) == ["Gemm"] and g.outputs[0].name == "a"


def test_batched_matmul_is_no_gemm_but_a_fused_matmul_and_shared_product_does_not_fuse():
    g = parse("""graph g(%x: float32[2,4,3]) {
      %w: float32[3,5] = const
      %c: float32[5] = const
      %m: float32[2,4,5] = MatMul<mm>(%x, %w)
      %a: float32[2,4,5] = Add<add>(%m, %c)
      return %a
    }""", W)
    assert "ranks 3 and 2" in RULES["matmul_add_to_gemm"].explain(g, "add")
    check_pass(g, P)
    assert ops(g) == ["aiacc::FusedMatMul"]
    g = parse("""graph g(%x: float32[4,3]) {
      %w: float32[3,5] = const
      %c: float32[5] = const
      %m: float32[4,5] = MatMul<mm>(%x, %w)
      %a: float32[4,5] = Add<add>(%m, %c)
      %b: float32[4,5] = Mul<mul>(%a, %m)
      return %b
    }""", W)
    assert "also used by Mul<mul>" in RULES["matmul_add_to_gemm"].explain(g, "add")
    check_pass(g, P)
    assert ops(g) == ["MatMul", "Add", "Mul"]


def test_addend_that_broadcasts_the_product_is_refused():
    g = parse("""graph g(%x: float32[1,3], %c: float32[4,5]) {
      %w: float32[3,5] = const
      %m: float32[1,5] = MatMul<mm>(%x, %w)
      %a: float32[4,5] = Add<add>(%m, %c)
      return %a
    }""", W)
    assert "broadcast" in RULES["matmul_add_to_gemm"].explain(g, "add")


# -- FusedMatMul: BERT's batched projections ---------------------------------------------------------------
def bert_dense(bias_shape="[8]", act="", x_shape="[2,5,6]", w_shape="[6,8]", bias_const=True):
    rank = len(x_shape.split(","))
    out = f"[{','.join(x_shape.strip('[]').split(',')[:-1] + ['8'])}]"
    act_line = f"%y: float32{out} = {act}<act>(%a)" if act else f"%y: float32{out} = Identity<id>(%a)"
    bias_decl = f"%c: float32{bias_shape} = const" if bias_const else ""
    inputs = f"%x: float32{x_shape}" + ("" if bias_const else f", %c: float32{bias_shape}")
    text = f"""graph g({inputs}) {{
      %w: float32{w_shape} = const
      {bias_decl}
      %m: float32{out} = MatMul<mm>(%x, %w)
      %a: float32{out} = Add<add>(%m, %c)
      {act_line}
      return %y
    }}"""
    dims = [int(d) for d in bias_shape.strip("[]").split(",") if d]
    weights = {"w": rng.standard_normal([int(d) for d in w_shape.strip("[]").split(",")]).astype(np.float32)}
    if bias_const:
        weights["c"] = rng.standard_normal(dims).astype(np.float32)
    return parse(text, weights)


@pytest.mark.parametrize("bias_shape", ["[8]", "[1,8]", "[1,1,8]", "[]"])
def test_batched_matmul_bias_becomes_fused_matmul(bias_shape):
    g = bert_dense(bias_shape)
    check_pass(g, P)
    assert ops(g) == ["aiacc::FusedMatMul", "Identity"]
    assert g.nodes[0].inputs[2].shape == (8,)


@pytest.mark.parametrize("act,name", [("Relu", "Relu"), ("Gelu", "Gelu"), ("Tanh", "Tanh")])
def test_batched_matmul_bias_activation_fuses(act, name):
    g = bert_dense(act=act)
    check_pass(g, P)
    assert ops(g) == ["aiacc::FusedMatMul"] and g.nodes[0].attrs["activation"] == name


def test_matmul_activation_without_bias_fuses():
    g = parse("""graph g(%x: float32[2,5,6]) {
      %w: float32[6,8] = const
      %m: float32[2,5,8] = MatMul<mm>(%x, %w)
      %y: float32[2,5,8] = Relu<act>(%m)
      return %y
    }""", {"w": rng.standard_normal((6, 8)).astype(np.float32)})
    check_pass(g, P)
    assert ops(g) == ["aiacc::FusedMatMul"] and g.nodes[0].inputs[2:] in ((), (None,))


def test_non_constant_bias_vector_fuses_but_not_a_bias_varying_over_rows():
    g = bert_dense(bias_const=False)
    check_pass(g, P)
    assert ops(g) == ["aiacc::FusedMatMul", "Identity"]
    g = bert_dense(bias_shape="[5,8]")
    assert "is not a bias over the 8 output columns" in RULES["matmul_bias"].explain(g, "add")
    g = bert_dense(bias_shape="[5,8]", bias_const=False)
    assert "not a bias vector" in RULES["matmul_bias"].explain(g, "add")
    check_pass(g, P)
    assert ops(g) == ["MatMul", "Add", "Identity"]


def test_batched_right_operand_is_not_a_fused_matmul():
    """Attention scores (q @ k^T, both batched) stay MatMuls."""
    g = parse("""graph g(%q: float32[2,5,6], %k: float32[2,6,5], %mask: float32[5]) {
      %s: float32[2,5,5] = MatMul<mm>(%q, %k)
      %y: float32[2,5,5] = Add<add>(%s, %mask)
      return %y
    }""")
    assert "FusedMatMul takes a weight matrix" in RULES["matmul_bias"].explain(g, "add")
    run_passes(g, passes=P)
    assert ops(g) == ["MatMul", "Add"]


def keras_einsum_dense(bias_shape="[4,2]", target="[-1,5,4,2]"):
    """Keras EinsumDense 'abc,cde->abde' as TF hands it over: MatMul, Reshape splitting the last axis, bias."""
    dims = [int(d) for d in bias_shape.strip("[]").split(",") if d]
    return parse(f"""graph g(%x: float32[N,5,6]) {{
      %w: float32[6,8] = const
      %s: int64[4] = const {target}
      %c: float32{bias_shape} = const
      %m: float32[N,5,8] = MatMul<mm>(%x, %w)
      %r: float32[?,5,4,2] = Reshape<rs>(%m, %s)
      %y: float32[?,5,4,2] = Add<add>(%r, %c)
      return %y
    }}""", {"w": rng.standard_normal((6, 8)).astype(np.float32), "c": rng.standard_normal(dims).astype(np.float32)})


def test_bias_after_a_reshape_splitting_the_last_axis_fuses():
    g = keras_einsum_dense()
    check_pass(g, P)
    assert ops(g) == ["aiacc::FusedMatMul", "Reshape"] and g.nodes[0].inputs[2].shape == (8,)
    g = keras_einsum_dense(bias_shape="[2]")
    check_pass(g, P)
    assert ops(g) == ["aiacc::FusedMatMul", "Reshape"]


def test_bias_after_a_reshape_that_moves_rows_does_not_fuse():
    g = keras_einsum_dense(bias_shape="[5,1,1]")
    assert "varies along axes the Reshape did not split" in RULES["matmul_reshape_bias"].explain(g, "add")
    g = parse("""graph g(%x: float32[2,5,6]) {
      %w: float32[6,8] = const
      %s: int64[3] = const [2,8,5]
      %c: float32[5] = const
      %m: float32[2,5,8] = MatMul<mm>(%x, %w)
      %r: float32[2,8,5] = Reshape<rs>(%m, %s)
      %y: float32[2,8,5] = Add<add>(%r, %c)
      return %y
    }""", {"w": rng.standard_normal((6, 8)).astype(np.float32), "c": rng.standard_normal(5).astype(np.float32)})
    assert "changes the leading axes" in RULES["matmul_reshape_bias"].explain(g, "add")
    check_pass(g, P)
    assert ops(g) == ["MatMul", "Reshape", "Add"]


def test_fused_matmul_decomposes_into_what_it_replaced():
    from aiacc.core import run
    from aiacc.core.ops.fused import decompose_all

    g = bert_dense(act="Relu")
    run_passes(g, passes=P)
    feeds = {"x": rng.standard_normal((2, 5, 6)).astype(np.float32)}
    before = run(g, feeds)["y"]
    assert decompose_all(g) == 1
    assert ops(g) == ["MatMul", "Add", "Relu"]
    np.testing.assert_array_equal(run(g, feeds)["y"], before)


def test_activation_after_a_batched_product_or_an_activated_fused_matmul_does_not_fuse():
    g = parse("""graph g(%q: float32[2,5,6], %k: float32[2,6,5], %x: float32[2,5,6]) {
      %w: float32[6,8] = const
      %s: float32[2,5,5] = MatMul<mm>(%q, %k)
      %y: float32[2,5,5] = Relu<act>(%s)
      %f: float32[2,5,8] = aiacc::FusedMatMul<fm>(%x, %w) {activation="Relu"}
      %z: float32[2,5,8] = Tanh<act2>(%f)
      return %y, %z
    }""", {"w": rng.standard_normal((6, 8)).astype(np.float32)})
    assert "not a matrix" in RULES["matmul_activation"].explain(g, "act")
    assert "already has activation Relu" in RULES["matmul_activation"].explain(g, "act2")
    check_pass(g, P)
    assert ops(g) == ["MatMul", "Relu", "aiacc::FusedMatMul", "Tanh"]


def flattened_dense(target="[2,4,5]", bias="[5]", act=""):
    """GPT-2's Conv1D as traced: x [2,4,3] flattened to [8,3], MatMul, a bias, reshaped back (then `act`)."""
    dims = [int(d) for d in bias.strip("[]").split(",") if d]
    out = target.strip("[]").split(",")
    tail = f"""      %y: float32[{",".join(out)}] = {act}<act>(%r)
      return %y""" if act else "      return %r"
    return parse(f"""graph g(%x: float32[2,4,3]) {{
      %w: float32[3,5] = const
      %c: float32{bias} = const
      %s1: int64[2] = const [8,3]
      %s2: int64[{len(out)}] = const {target}
      %f: float32[8,3] = Reshape<flat>(%x, %s1)
      %m: float32[8,5] = MatMul<mm>(%f, %w)
      %a: float32[8,5] = Add<add>(%m, %c)
      %r: float32[{",".join(out)}] = Reshape<rs>(%a, %s2)
{tail}
    }}""", {"w": W["w"], "c": rng.standard_normal(dims).astype(np.float32)})


def test_a_product_on_the_flattened_operand_reshaped_back_is_one_fused_matmul_with_its_activation():
    g = flattened_dense(act="Relu")
    check_pass(g, P)
    assert ops(g) == ["aiacc::FusedMatMul"] and g.nodes[0].attrs["activation"] == "Relu"
    assert g.nodes[0].inputs[0] is g.inputs[0]
    g = flattened_dense(bias="[1,5]")
    check_pass(g, P)
    assert ops(g) == ["aiacc::FusedMatMul"] and g.nodes[0].inputs[2].shape == (5,)


def test_a_flattened_product_reshaped_to_other_axes_or_with_a_row_bias_stays_a_gemm():
    g = flattened_dense(target="[4,2,5]")
    assert "does not restore the leading axes [2, 4]" in RULES["flattened_matmul_bias"].explain(g, "rs")
    check_pass(g, P)
    assert ops(g) == ["Reshape", "Gemm", "Reshape"]
    g = flattened_dense(bias="[8,1]")
    assert "not a bias over the 5 output columns" in RULES["flattened_matmul_bias"].explain(g, "rs")
    check_pass(g, P)
    assert ops(g) == ["Reshape", "Gemm", "Reshape"]
