import numpy as np
import pytest

from aiacc.core import parse
from aiacc.core.ops.fused import decompose_all
from aiacc.core.passes import random_feeds, run_passes
from aiacc.core.passes.conv_fusion import RULES
from aiacc.core import run
from tests.core.passes.helpers import check_pass, ops

P = ["conv_fusion"]
rng = np.random.default_rng(1)
W = {"w": rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32),
     "c": rng.standard_normal((1, 4, 1, 1)).astype(np.float32)}

HEAD = """graph g(%x: float32[N,4,5,5]) {
  %w: float32[4,4,3,3] = const
  %b: float32[4] = const
  %c: float32[1,4,1,1] = const
  %lo: float32[] = const [0.0]
  %hi: float32[] = const [6.0]
"""


def build(body):
    return parse(HEAD + body + "\n}", W)


def test_conv_bias_residual_relu_is_one_fused_conv():
    g = build("""  %y: float32[N,4,5,5] = Conv<conv>(%x, %w, %b) {pads=[1,1,1,1]}
  %yb: float32[N,4,5,5] = Add<bias>(%y, %c)
  %s: float32[N,4,5,5] = Add<res>(%x, %yb)
  %r: float32[N,4,5,5] = Relu<relu>(%s)
  return %r""")
    report = check_pass(g, P)
    assert ops(g) == ["aiacc::FusedConv"]
    n = g.nodes[0]
    assert n.attrs["activation"] == "Relu" and n.inputs[3].name == "x" and g.outputs[0].name == "r"
    assert report["conv_fusion"].fused == 1


@pytest.mark.parametrize("act,attrs,inputs,expect", [
    ("Clip", "", ", %lo, %hi", [0.0, 6.0]),
    ("LeakyRelu", " {alpha=0.2}", "", [0.2]),
    ("HardSigmoid", " {alpha=0.3, beta=0.4}", "", [0.3, 0.4]),
    ("Sigmoid", "", "", None),
])
def test_activations(act, attrs, inputs, expect):
    g = build(f"""  %y: float32[N,4,3,3] = Conv<conv>(%x, %w, %b)
  %r: float32[N,4,3,3] = {act}<act>(%y{inputs}){attrs}
  return %r""")
    check_pass(g, P)
    assert ops(g) == ["aiacc::FusedConv"]
    assert g.nodes[0].attrs["activation"] == act
    assert g.nodes[0].attrs.get("activation_params") == (None if expect is None else pytest.approx(expect))


def test_conv_output_used_twice_is_not_fused():
    g = build("""  %y: float32[N,4,3,3] = Conv<conv>(%x, %w, %b)
  %r: float32[N,4,3,3] = Relu<relu>(%y)
  %z: float32[N,4,3,3] = Add<z>(%r, %y)
  return %z""")
    why = RULES["conv_activation"].explain(g, "relu")
    assert "also used by Add<z>" in why
    check_pass(g, P)
    assert ops(g) == ["Conv", "Relu", "Add"]


def test_relu_before_residual_add_keeps_add_outside():
    # Add(Relu(conv), x) is not act(conv + x): only the Relu fuses
    g = build("""  %y: float32[N,4,5,5] = Conv<conv>(%x, %w, %b) {pads=[1,1,1,1]}
  %r: float32[N,4,5,5] = Relu<relu>(%y)
  %s: float32[N,4,5,5] = Add<res>(%r, %x)
  return %s""")
    check_pass(g, P)
    assert ops(g) == ["aiacc::FusedConv", "Add"]


def test_broadcast_add_is_not_a_residual_and_clip_needs_constant_bounds():
    g = parse("""graph g(%x: float32[1,4,3,3], %t: float32[1,4,1,1], %hi: float32[]) {
  %w: float32[4,4,1,1] = const
  %y: float32[1,4,3,3] = Conv<conv>(%x, %w)
  %s: float32[1,4,3,3] = Add<add>(%y, %t)
  %y2: float32[1,4,3,3] = Conv<conv2>(%x, %w)
  %c: float32[1,4,3,3] = Clip<clip>(%y2, _, %hi)
  return %s, %c
}""", {"w": rng.standard_normal((4, 4, 1, 1)).astype(np.float32)})
    assert "not the conv output shape" in RULES["conv_residual"].explain(g, "add")
    assert "not a constant scalar" in RULES["conv_activation"].explain(g, "clip")
    check_pass(g, P)
    assert ops(g) == ["Conv", "Add", "Conv", "Clip"]


def test_decompose_restores_standard_ops_with_same_numerics():
    g = build("""  %y: float32[N,4,5,5] = Conv<conv>(%x, %w, %b) {pads=[1,1,1,1]}
  %s: float32[N,4,5,5] = Add<res>(%y, %x)
  %r: float32[N,4,5,5] = Clip<relu>(%s, %lo, %hi)
  return %r""")
    feeds = random_feeds(g)
    ref = run(g, feeds)["r"]
    run_passes(g, passes=P)
    assert ops(g) == ["aiacc::FusedConv"]
    assert decompose_all(g) == 1
    assert ops(g) == ["Conv", "Add", "Clip"] and g.outputs[0].name == "r"
    g.verify()
    np.testing.assert_allclose(run(g, feeds)["r"], ref, rtol=1e-6, atol=1e-6)
