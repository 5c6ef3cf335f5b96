import numpy as np
import pytest

from aiacc.core import parse
from aiacc.core.passes import run_passes
from aiacc.core.passes.rewrite import Const, Op, Opt, RewritePass, Rule, RuleFailure, RuleSet, Scalar, Var
from tests.core.passes.helpers import check_pass, ops

TEXT = """graph g(%x: float32[4], %z: float32[4]) {
  %two: float32[] = const [2.0]
  %a: float32[4] = Mul<a>(%x, %two)
  %b: float32[4] = Add<b>(%a, %x)
  %c: float32[4] = Add<c>(%z, %a)
  return %b
}"""

# x * 2 + x  ->  x * 3
triple = Rule("triple", Op("Add", Op("Mul", Var("x"), Scalar(2.0), name="m"), Var("x")),
              lambda m, b: b.op("Mul", m["x"], b.const(np.float32(3.0), "three")))


def test_rule_fires_in_either_operand_order_and_keeps_names():
    g = parse(TEXT.replace("  %c: float32[4] = Add<c>(%z, %a)\n", ""))
    assert triple.explain(g, "b") is None
    check_pass(g, [RewritePass("t", [triple])])
    assert ops(g) == ["Mul"] and g.outputs[0].name == "b"


def test_explain_gives_the_reason():
    g = parse(TEXT)
    assert "also used by Add<c>" in triple.explain(g, "b")
    why = triple.explain(g, "c")  # Add(z, x*2): whichever operand order gets furthest is reported
    assert "not the same value as x" in why or "not a constant" in why
    assert "is not Add" in triple.explain(g, "a")
    with pytest.raises(Exception, match="no node named 'nope'"):
        triple.explain(g, "nope")


def test_check_reason_and_rule_failure_in_rewrite():
    g = parse(TEXT.replace("  %c: float32[4] = Add<c>(%z, %a)\n", ""))
    picky = Rule("picky", triple.patterns, triple.rewrite_fn, check=lambda m: "I do not like %s" % m["x"].name)
    assert picky.explain(g, "b") == "I do not like x"

    def give_up(m, b):
        b.op("Neg", m["x"])  # created, then rolled back
        raise RuleFailure("changed my mind")

    quitter = Rule("quitter", triple.patterns, give_up)
    assert RuleSet([quitter]).run(g) == 0
    assert ops(g) == ["Mul", "Add"]
    g.verify()


def test_rule_sets_compose_and_run_to_fixed_point():
    g = parse("""graph g(%x: float32[4]) {
  %n1: float32[4] = Neg<n1>(%x)
  %n2: float32[4] = Neg<n2>(%n1)
  %n3: float32[4] = Neg<n3>(%n2)
  %n4: float32[4] = Neg<n4>(%n3)
  %r: float32[4] = Relu<r>(%n4)
  %r2: float32[4] = Relu<r2>(%r)
  return %r2
}""")
    double_neg = RuleSet([Rule("neg_neg", Op("Neg", Op("Neg", Var("x"))), lambda m, b: m["x"])])
    relu_relu = RuleSet([Rule("relu_relu", Op("Relu", Op("Relu", Var("x"), name="inner")), lambda m, b: m["inner"])])
    both = double_neg + relu_relu
    assert [r.name for r in both] == ["neg_neg", "relu_relu"]
    report = check_pass(g, [RewritePass("cleanup", both)])
    assert ops(g) == ["Relu"] and g.outputs[0].name == "r2"
    assert report["cleanup"].counters == {"rule:neg_neg": 2, "rule:relu_relu": 1}


def test_const_opt_and_attr_constraints():
    g = parse("""graph g(%x: float32[2,3]) {
  %w: float32[3] = const [1.0, 2.0, 3.0]
  %a: float32[2,3] = LeakyRelu<a>(%x) {alpha=0.5}
  %b: float32[2,3] = Mul<b>(%a, %w)
  %y: float32[2,3] = Clip<y>(%b)
  return %y
}""")
    r = Rule("r", Op("Clip", Op("Mul", Op("LeakyRelu", Var("x"), attrs={"alpha": 0.1}), Const("w")), Opt("lo")),
             lambda m, b: m["x"])
    assert "alpha=0.5" in r.explain(g, "y")
    r2 = Rule("r2", Op("Clip", Op("Mul", Op("LeakyRelu", Var("x"), attrs={"alpha": 0.5}), Const("w")), Opt("lo")),
              lambda m, b: m["x"])
    assert r2.explain(g, "y") is None
    r3 = Rule("r3", Op("Clip", Op("Mul", Var("x"), Const("w", where=lambda c: "too big" if c.max() > 2 else None))),
              lambda m, b: m["x"])
    assert r3.explain(g, "y") == "too big"


def test_rule_rewriting_into_a_graph_input_keeps_output_name():
    g = parse("""graph g(%x: float32[4]) {
  %n1: float32[4] = Neg<n1>(%x)
  %n2: float32[4] = Neg<n2>(%n1)
  return %n2
}""")
    RuleSet([Rule("neg_neg", Op("Neg", Op("Neg", Var("x"))), lambda m, b: m["x"])]).run(g)
    g.verify()
    assert ops(g) == ["Identity"] and g.outputs[0].name == "n2"
    run_passes(g, passes=["identity_removal"])
    assert ops(g) == ["Identity"]


def test_a_commuted_match_is_tried_when_the_first_order_fails_the_checks():
    """Add(a, b) where a's producer is shared: the rule must still fire with the operands the other way."""
    from aiacc.core.passes.conv_fusion import conv_residual

    g = parse("""graph g(%x: float32[1,2,4,4]) {
      %w: float32[2,2,1,1] = const
      %a: float32[1,2,4,4] = Conv<c1>(%x, %w)
      %b: float32[1,2,4,4] = Conv<c2>(%x, %w)
      %s: float32[1,2,4,4] = Add<add>(%a, %b)
      %t: float32[1,2,4,4] = Relu<r>(%a)
      return %s, %t
    }""", {"w": np.ones((2, 2, 1, 1), np.float32)})
    assert conv_residual.explain(g, "add") is None
    RuleSet([conv_residual]).run(g)
    fused = [n for n in g if n.op == "FusedConv"]
    assert len(fused) == 1 and fused[0].inputs[3].name == "a"


def test_a_rule_limited_to_inference_is_skipped_in_training_mode():
    rule = Rule("neg_neg", Op("Neg", Op("Neg", Var("x"), name="inner"), name="outer"), lambda m, b: m["x"],
                modes=("inference",))
    text = """graph g(%x: float32[3]) {
      %a: float32[3] = Neg<inner>(%x)
      %b: float32[3] = Neg<outer>(%a)
      %y: float32[3] = Relu<r>(%b)
      return %y
    }"""
    from aiacc.core.passes.manager import PassContext

    g = parse(text)
    assert RuleSet([rule]).run(g, PassContext("training")) == 0 and ops(g) == ["Neg", "Neg", "Relu"]
    assert RuleSet([rule]).run(g, PassContext("inference")) == 1 and ops(g) == ["Relu"]
