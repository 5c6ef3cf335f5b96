import numpy as np
import pytest

from aiacc.core import parse
from aiacc.core.ops.fused import decompose_all
from aiacc.core.passes import random_feeds, run_passes
from aiacc.core import run
from aiacc.core.passes.attention import RULE
from tests.core.passes.helpers import check_pass, ops

P = ["attention_recognition"]


def graph(scale="Div<sc>(%qk, %c)", mask=True, kt="Transpose<kt>(%k) {perm=[0,1,3,2]}", axis=-1):
    mask_line = "%sm_in: float32[B,2,5,5] = Add<mask>(%s, %m)" if mask else ""
    sm_in = "%sm_in" if mask else "%s"
    return parse(f"""graph g(%q: float32[B,2,5,8], %k: float32[B,2,5,8], %v: float32[B,2,5,8], %m: float32[B,1,1,5]) {{
  %c: float32[] = const [2.8284271]
  %ktv: float32[B,2,8,5] = {kt}
  %qk: float32[B,2,5,5] = MatMul<qk>(%q, %ktv)
  %s: float32[B,2,5,5] = {scale}
  {mask_line}
  %p: float32[B,2,5,5] = Softmax<sm>({sm_in}) {{axis={axis}}}
  %y: float32[B,2,5,8] = MatMul<y>(%p, %v)
  return %y
}}""")


@pytest.mark.parametrize("kw", [{}, {"mask": False}, {"scale": "Mul<sc>(%qk, %c)"}, {"scale": "Identity<sc>(%qk)"}])
def test_attention_forms(kw):
    g = graph(**kw)
    check_pass(g, ["identity_removal"] + P, rtol=1e-5, atol=1e-6)  # no scale: the Identity goes first
    assert ops(g) == ["aiacc::Attention"]
    n = g.nodes[0]
    expect = {"Div": 1 / 2.8284271, "Mul": 2.8284271, "Ide": 1.0}[kw.get("scale", "Div")[:3]]
    assert n.attrs["scale"] == pytest.approx(expect, rel=1e-6)
    assert (len(n.inputs) == 4) == kw.get("mask", True)


def test_already_transposed_key():
    g = parse("""graph g(%q: float32[3,4], %kt: float32[4,6], %v: float32[6,2]) {
  %s: float32[3,6] = MatMul<qk>(%q, %kt)
  %p: float32[3,6] = Softmax<sm>(%s)
  %y: float32[3,2] = MatMul<y>(%p, %v)
  return %y
}""")
    check_pass(g, P)
    assert ops(g) == ["aiacc::Attention"] and g.nodes[0].attrs["k_transposed"] == 1


def test_softmax_over_other_axis_or_odd_transpose_does_not_fire():
    g = graph(axis=2)
    assert "not the last axis" in RULE.explain(g, "y")
    run_passes(g, passes=P)
    assert "aiacc::Attention" not in ops(g)
    # a Transpose that does more than swap the last two axes stays, feeding an already-transposed key
    g = parse(str(graph()).replace("perm=[0, 1, 3, 2]", "perm=[1, 0, 3, 2]").replace("float32[B,2,8,5]", "?")
              .replace("%k: float32[B,2,5,8]", "%k: float32[2,B,5,8]"))
    check_pass(g, P)
    assert ops(g) == ["Transpose", "aiacc::Attention"] and g.nodes[1].attrs["k_transposed"] == 1


def test_decompose_attention():
    g = graph()
    feeds = random_feeds(g)
    ref = run(g, feeds)["y"]
    run_passes(g, passes=P)
    decompose_all(g)
    assert ops(g) == ["Transpose", "MatMul", "Mul", "Add", "Softmax", "MatMul"]
    np.testing.assert_allclose(run(g, feeds)["y"], ref, rtol=1e-5, atol=1e-6)


def prescaled(q_scale="Mul<qs>(%q, %c)", k_scale=None, q_move=None):
    """q (and maybe k) scaled before the scores product, as torch's MultiheadAttention decomposition and
    Keras MultiHeadAttention do it."""
    lines = [f"%q1: float32[B,2,5,8] = {q_scale}"]
    q = "%q1"
    if q_move:
        lines.append(f"%q2: float32[B,2,5,8] = {q_move}")
        q = "%q2"
    k = "%k"
    if k_scale:
        lines.append(f"%k1: float32[B,2,5,8] = {k_scale}")
        k = "%k1"
    body = "\n  ".join(lines)
    return parse(f"""graph g(%q: float32[B,2,5,8], %k: float32[B,2,5,8], %v: float32[B,2,5,8]) {{
  %c: float32[] = const [0.35355339]
  %r: float32[] = const [0.59460356]
  %sq: float32[] = const [1.68179283]
  %perm: int64[4] = const [0, 2, 1, 3]
  {body}
  %ktv: float32[B,2,8,5] = Transpose<kt>({k}) {{perm=[0,1,3,2]}}
  %qk: float32[B,2,5,5] = MatMul<qk>({q}, %ktv)
  %p: float32[B,2,5,5] = Softmax<sm>(%qk) {{axis=-1}}
  %y: float32[B,2,5,8] = MatMul<y>(%p, %v)
  return %y
}}""")


@pytest.mark.parametrize("kw,scale", [
    ({}, 0.35355339),
    ({"q_scale": "Div<qs>(%q, %sq)", "k_scale": "Div<ks>(%k, %sq)"}, 1 / 1.68179283 ** 2),
    ({"q_scale": "Mul<qs>(%r, %q)", "k_scale": "Mul<ks>(%k, %r)"}, 0.59460356 ** 2),
    ({"q_move": "Transpose<qt>(%q1) {perm=[0,1,2,3]}"}, 0.35355339),
])
def test_prescaled_q_and_k(kw, scale):
    g = prescaled(**kw)
    check_pass(g, P, rtol=1e-5, atol=1e-6)
    assert ops(g)[-1] == "aiacc::Attention" and "Mul" not in ops(g) and "Div" not in ops(g)
    assert g.nodes[-1].attrs["scale"] == pytest.approx(scale, rel=1e-5)


def test_scaled_operand_of_a_product_without_softmax_stays():
    from aiacc.core.passes.attention import scale_after_scores

    g = parse("""graph g(%q: float32[2,5,8], %k: float32[2,8,5]) {
  %c: float32[] = const [0.5]
  %q1: float32[2,5,8] = Mul<qs>(%q, %c)
  %y: float32[2,5,5] = MatMul<qk>(%q1, %k)
  return %y
}""")
    assert "does not feed a Softmax" in scale_after_scores.explain(g, "qk")
    check_pass(g, P)
    assert ops(g) == ["Mul", "MatMul"]


def test_keras_einsum_attention_is_recognized_after_transpose_cancellation():
    """TF lowers Keras MHA's scores einsum to Transpose(MatMul(Transpose(k), Transpose(q * c)))."""
    g = parse("""graph g(%q: float32[B,5,2,8], %k: float32[B,5,2,8], %v: float32[B,2,5,8]) {
  %c: float32[] = const [0.35355339]
  %qs: float32[B,5,2,8] = Mul<qs>(%q, %c)
  %kt: float32[B,2,5,8] = Transpose<kt>(%k) {perm=[0,2,1,3]}
  %qt: float32[B,2,8,5] = Transpose<qt>(%qs) {perm=[0,2,3,1]}
  %s: float32[B,2,5,5] = MatMul<s>(%kt, %qt)
  %st: float32[B,2,5,5] = Transpose<st>(%s) {perm=[0,1,3,2]}
  %p: float32[B,2,5,5] = Softmax<sm>(%st) {axis=-1}
  %y: float32[B,2,5,8] = MatMul<y>(%p, %v)
  return %y
}""")
    check_pass(g, ["transpose_propagation"] + P, rtol=1e-5, atol=1e-6)
    assert sorted(ops(g)) == ["Transpose", "Transpose", "aiacc::Attention"]
    assert g.nodes[-1].attrs["scale"] == pytest.approx(0.35355339, rel=1e-5)


def test_two_scales_of_a_product_without_softmax_stay():
    from aiacc.core.passes.attention import merge_scales

    g = parse("""graph g(%q: float32[2,5,8], %k: float32[2,8,5]) {
  %c: float32[] = const [0.5]
  %s: float32[2,5,5] = MatMul<qk>(%q, %k)
  %a: float32[2,5,5] = Mul<m1>(%s, %c)
  %y: float32[2,5,5] = Mul<m2>(%a, %c)
  return %y
}""")
    assert "do not feed a Softmax" in merge_scales.explain(g, "m2")
    check_pass(g, P)
    assert ops(g) == ["MatMul", "Mul", "Mul"]
