import numpy as np
import pytest

from aiacc.core import Graph, parse
from aiacc.core.passes import random_feeds, run_passes
from aiacc.core.passes.batchnorm_folding import RULE
from aiacc.errors import AiaccError
from tests.core.passes.helpers import check_pass, ops

P = ["batchnorm_folding"]
rng = np.random.default_rng(0)


def bn_weights(c, prefix="bn"):
    return {f"{prefix}_s": rng.uniform(0.5, 1.5, c).astype(np.float32),
            f"{prefix}_b": rng.standard_normal(c).astype(np.float32),
            f"{prefix}_m": rng.standard_normal(c).astype(np.float32),
            f"{prefix}_v": rng.uniform(0.5, 2.0, c).astype(np.float32)}


CONV_BN = """graph g(%x: float32[N,3,6,6]) {
  %w: float32[4,3,3,3] = const
  %cb: float32[4] = const
  %bn_s: float32[4] = const
  %bn_b: float32[4] = const
  %bn_m: float32[4] = const
  %bn_v: float32[4] = const
  %c: float32[N,4,6,6] = Conv<conv>(%x, %w, %cb) {pads=[1,1,1,1]}
  %y: float32[N,4,6,6] = BatchNormalization<bn>(%c, %bn_s, %bn_b, %bn_m, %bn_v) {epsilon=0.001}
  return %y
}"""


def conv_bn_weights():
    return {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
            "cb": rng.standard_normal(4).astype(np.float32), **bn_weights(4)}


def test_conv_bn_folds():
    g = parse(CONV_BN, conv_bn_weights())
    report = check_pass(g, P)
    assert ops(g) == ["Conv"] and g.outputs[0].name == "y"
    assert report["batchnorm_folding"].removed == 2 and report["batchnorm_folding"].const_bytes_saved > 0


def test_conv_without_bias_and_grouped_convtranspose():
    g = parse("""graph g(%x: float32[2,4,5,5]) {
      %w: float32[4,3,2,2] = const
      %bn_s: float32[6] = const
      %bn_b: float32[6] = const
      %bn_m: float32[6] = const
      %bn_v: float32[6] = const
      %c: float32[2,6,10,10] = ConvTranspose<ct>(%x, %w) {group=2, strides=[2,2]}
      %y: float32[2,6,10,10] = BatchNormalization<bn>(%c, %bn_s, %bn_b, %bn_m, %bn_v)
      return %y
    }""", {"w": rng.standard_normal((4, 3, 2, 2)).astype(np.float32), **bn_weights(6)})
    check_pass(g, P)
    assert ops(g) == ["ConvTranspose"]


@pytest.mark.parametrize("transB", [0, 1])
def test_gemm_and_matmul_bn_fold(transB):
    wshape = "[5,3]" if transB else "[3,5]"
    g = parse(f"""graph g(%x: float32[4,3]) {{
      %w: float32{wshape} = const
      %c: float32[5] = const
      %w2: float32[5,5] = const
      %bn_s: float32[5] = const
      %bn_b: float32[5] = const
      %bn_m: float32[5] = const
      %bn_v: float32[5] = const
      %g: float32[4,5] = Gemm<gemm>(%x, %w, %c) {{beta=0.5, transB={transB}}}
      %y: float32[4,5] = BatchNormalization<bn>(%g, %bn_s, %bn_b, %bn_m, %bn_v)
      %m: float32[4,5] = MatMul<mm>(%y, %w2)
      %z: float32[4,5] = BatchNormalization<bn2>(%m, %bn_s, %bn_b, %bn_m, %bn_v)
      return %z
    }}""", {"w": rng.standard_normal((5, 3) if transB else (3, 5)).astype(np.float32),
            "c": rng.standard_normal(5).astype(np.float32),
            "w2": rng.standard_normal((5, 5)).astype(np.float32), **bn_weights(5)})
    check_pass(g, P)
    assert ops(g) == ["Gemm", "Gemm"]


def test_training_mode_bn_does_not_fold():
    g = parse(CONV_BN.replace("{epsilon=0.001}", "{epsilon=0.001, training_mode=1}"), conv_bn_weights())
    assert "training mode" in RULE.explain(g, "bn")
    run_passes(g, passes=P)
    assert ops(g) == ["Conv", "BatchNormalization"]


def test_training_pipeline_mode_skips_the_pass():
    g = parse(CONV_BN, conv_bn_weights())
    with pytest.raises(AiaccError, match="batchnorm_folding does not apply in training mode"):
        run_passes(g, passes=P, mode="training")
    report = run_passes(g, level=2, mode="training")
    assert ops(g) == ["Conv", "BatchNormalization"]
    assert "batchnorm_folding" not in [r.name for r in report.records]


def test_conv_output_used_twice_does_not_fold():
    text = CONV_BN.replace("return %y", "%z: float32[N,4,6,6] = Relu<r>(%c)\n  return %y, %z")
    g = parse(text, conv_bn_weights())
    assert "also used by Relu<r>" in RULE.explain(g, "bn")
    run_passes(g, passes=P)
    assert ops(g) == ["Conv", "BatchNormalization", "Relu"]


def test_non_constant_weight_does_not_fold():
    g = parse(CONV_BN.replace("graph g(%x: float32[N,3,6,6])", "graph g(%x: float32[N,3,6,6], %wx: float32[4,3,3,3])")
              .replace("Conv<conv>(%x, %w, %cb)", "Conv<conv>(%x, %wx, %cb)"), conv_bn_weights())
    assert "is not a constant" in RULE.explain(g, "bn")
    run_passes(g, passes=P)
    assert ops(g) == ["Conv", "BatchNormalization"]


def test_rank3_matmul_does_not_fold():
    g = Graph("g")
    x = g.add_input("x", "float32", (2, 3, 4))
    m = g.op("MatMul", x, g.add_initializer("w", rng.standard_normal((4, 3)).astype(np.float32)), name="mm")
    params = [g.add_initializer(k, v) for k, v in bn_weights(3).items()]
    g.add_output(g.op("BatchNormalization", m, *params, name="bn"))
    assert "rank 3" in RULE.explain(g, "bn")


# -- batchnorm_decomposition: a BatchNorm with nothing to fold into --------------------------------------
STANDALONE = """graph g(%x: float32[N,4,5,5], %r: float32[N,4,5,5]) {
  %bn_s: float32[4] = const
  %bn_b: float32[4] = const
  %bn_m: float32[4] = const
  %bn_v: float32[4] = const
  %a: float32[N,4,5,5] = Add<add>(%x, %r)
  %y: float32[N,4,5,5] = BatchNormalization<bn>(%a, %bn_s, %bn_b, %bn_m, %bn_v) {epsilon=0.001}
  %z: float32[N,4,5,5] = Relu<relu>(%y)
  return %z
}"""


def test_standalone_batchnorm_becomes_mul_add_and_fuses_at_level3():
    from aiacc.core.passes.batchnorm_folding import STANDALONE_RULE  # noqa: F401

    g = parse(STANDALONE, bn_weights(4))
    check_pass(g, ["batchnorm_decomposition"])
    assert ops(g) == ["Add", "Mul", "Add", "Relu"]
    g = parse(STANDALONE, bn_weights(4))
    check_pass(g, [p.name for p in __import__("aiacc.core.passes", fromlist=["pipeline"]).pipeline(3)])
    assert ops(g) == ["aiacc::FusedElementwise"]


def test_standalone_batchnorm_stays_at_level2_and_in_training_mode():
    from aiacc.core.passes.batchnorm_folding import STANDALONE_RULE

    g = parse(STANDALONE, bn_weights(4))
    run_passes(g, level=2)
    assert "BatchNormalization" in ops(g)
    g = parse(STANDALONE.replace("{epsilon=0.001}", "{epsilon=0.001, training_mode=1}"), bn_weights(4))
    assert "training mode" in STANDALONE_RULE.explain(g, "bn")
    run_passes(g, level=3)
    assert "BatchNormalization" in ops(g)


def test_standalone_batchnorm_after_a_shared_conv_still_folds_its_scale_at_level3():
    text = CONV_BN.replace("return %y", "%z: float32[N,4,6,6] = Relu<r>(%c)\n  return %y, %z")
    g = parse(text, conv_bn_weights())
    check_pass(g, ["batchnorm_folding", "batchnorm_decomposition", "affine_folding"])
    assert ops(g) == ["Conv", "Mul", "Add", "Relu"]  # the conv output is shared: nothing folds into it


def _cancelling_conv_bn(dtype, w):
    """CONV_BN (weights `w`) with a conv bias of 1e5 that the BatchNorm's mean takes away again (the ill-conditioned form
    behind timm visformer_tiny's refused verify): in float32 the unfolded graph rounds the conv output to the
    float spacing at 1e5 (0.0078) before the subtraction; the fold computes b' = (b - mean) * s + beta in
    float64, where 1e5 - 1e5 is exact."""
    w = dict(w)
    w["cb"] = np.full(4, 1e5, np.float32)
    w["bn_m"] = np.full(4, 1e5, np.float32)
    return parse(CONV_BN.replace("float32", dtype), {k: v.astype(dtype) for k, v in w.items()})


def test_fold_of_a_cancelling_bias_is_exact_and_the_float32_difference_is_the_originals_rounding():
    from aiacc.core import run

    weights = conv_bn_weights()
    feeds = random_feeds(_cancelling_conv_bn("float32", weights), seed=3)
    outs = {}
    for dtype in ("float32", "float64"):
        g = _cancelling_conv_bn(dtype, weights)
        fd = {k: v.astype(dtype) for k, v in feeds.items()}
        before = run(g, fd)["y"].astype(np.float64)
        # debug mode: its float32 check alone refused the fold; the float64 re-check accepts it
        run_passes(g, passes=P, debug=True, feeds=fd)
        assert ops(g) == ["Conv"]
        outs[dtype] = before, run(g, fd)["y"].astype(np.float64)
    before64, after64 = outs["float64"]
    np.testing.assert_allclose(after64, before64, rtol=1e-12, atol=1e-9)  # the same function
    before32, after32 = outs["float32"]
    scale = np.abs(before64).max()
    # float32: the graphs differ by more than verify's rtol, and the folded one is the one near the exact result
    assert np.abs(after32 - before32).max() > 1e-4 * scale
    assert np.abs(after32 - before64).max() < np.abs(before32 - before64).max() / 10


def test_debug_mode_still_refuses_a_wrong_fold_of_the_cancelling_form(monkeypatch):
    import aiacc.core.passes.batchnorm_folding as bf
    from aiacc.errors import VerificationError

    right = bf._bn_params
    monkeypatch.setattr(bf, "_bn_params", lambda m: (right(m)[0] * 1.001, right(m)[1]))  # the scale 0.1% off
    g = _cancelling_conv_bn("float32", conv_bn_weights())
    with pytest.raises(VerificationError, match="batchnorm_folding changed the numerics: .*float64 re-check: "
                                                "in float64 too"):
        run_passes(g, passes=P, debug=True)
