import numpy as np

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


def test_batched_matmul_and_shared_product_do_not_fuse():
    g = parse("""graph g(%x: float32[2,4,3]) {
      %w: float32[3,5] = const
      %c: float32[5] = const
      %m: float32[2,4,5] = MatMul<mm>(%x, %w)
      %a: float32[2,4,5] = Add<add>(%m, %c)
      return %a
    }""", W)
    assert "ranks 3 and 2" in RULES["matmul_add_to_gemm"].explain(g, "add")
    run_passes(g, passes=P)
    assert ops(g) == ["MatMul", "Add"]
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
