import numpy as np
import pytest

from aiacc.core import parse
from aiacc.core.passes import run_passes
from aiacc.core.passes.layernorm import RULE
from tests.core.passes.helpers import check_pass, ops

P = ["layernorm_recognition"]
rng = np.random.default_rng(4)


def graph(sq="Pow<sq>(%d, %two)", div="Div<norm>(%d, %std)", axes="[-1]", axes2="[-1]", scale_shape="[16]",
          bias=True, rec=False):
    norm = div if not rec else "Mul<norm>(%d, %rstd)"
    rec_line = "%rstd: float32[B,S,1] = Reciprocal<rstd>(%std)" if rec else ""
    tail = ("%ys: float32[B,S,16] = Mul<ys>(%n, %scale)\n  %y: float32[B,S,16] = Add<y>(%ys, %bias)" if bias else
            "%y: float32[B,S,16] = Mul<y>(%n, %scale)")
    n_ax, n_ax2 = len(axes.split(",")), len(axes2.split(","))
    return parse(f"""graph g(%x: float32[B,S,16]) {{
  %ax1: int64[{n_ax}] = const {axes}
  %ax2: int64[{n_ax2}] = const {axes2}
  %two: float32[] = const [2.0]
  %eps: float32[] = const [1e-05]
  %scale: float32{scale_shape} = const
  %bias: float32[16] = const
  %mean: float32[B,S,1] = ReduceMean<mean>(%x, %ax1)
  %d: float32[B,S,16] = Sub<d>(%x, %mean)
  %sq: float32[B,S,16] = {sq}
  %var: float32[B,S,1] = ReduceMean<var>(%sq, %ax2)
  %ve: float32[B,S,1] = Add<ve>(%var, %eps)
  %std: float32[B,S,1] = Sqrt<std>(%ve)
  {rec_line}
  %n: float32[B,S,16] = {norm}
  {tail}
  return %y
}}""", {"scale": rng.uniform(0.5, 1.5, (16,) if scale_shape == "[16]" else (1, 1, 16)).astype(np.float32),
        "bias": rng.standard_normal(16).astype(np.float32)})


@pytest.mark.parametrize("kw", [{}, {"sq": "Mul<sq>(%d, %d)"}, {"rec": True}, {"bias": False},
                                {"scale_shape": "[1,1,16]"}])
def test_layernorm_forms(kw):
    g = graph(**kw)
    check_pass(g, P, rtol=1e-4, atol=1e-5)
    assert ops(g) == ["LayerNormalization"]
    n = g.nodes[0]
    assert n.attrs["axis"] == -1 and n.attrs["epsilon"] == pytest.approx(1e-5)
    assert n.inputs[1].shape == (16,)


def test_non_trailing_or_mismatched_axes_do_not_fire():
    g = graph(axes="[1]", axes2="[1]")
    assert "not the trailing axes" in RULE.explain(g, "y")
    g = graph(axes2="[-2]")
    assert "different axes" in RULE.explain(g, "y")
    run_passes(g, passes=P)
    assert "LayerNormalization" not in ops(g)


def test_centered_value_read_elsewhere_does_not_fire():
    g = graph()
    g.add_output(g.value("d"))
    assert "graph output" in RULE.explain(g, "y")


def tf_graph(rstd="Reciprocal<rstd>(%std)", gamma=True, shift="neg", sq="Mul<sq>(%d, %d)"):
    """Keras LayerNormalization as the TF importer hands it over (tf.nn.batch_normalization arithmetic)."""
    s_line = "%s: float32[B,S,16] = Mul<s>(%rstd, %scale)" if gamma else ""
    s = "%s" if gamma else "%rstd"
    ms = "[B,S,16]" if gamma else "[B,S,1]"
    shift_lines = {
        "neg": f"""%neg: float32[B,S,1] = Neg<neg>(%mean)
  %ms: float32{ms} = Mul<ms>(%neg, {s})
  %shift: float32[B,S,16] = Add<shift>(%ms, %bias)
  %y: float32[B,S,16] = Add<y>(%xs, %shift)""",
        "sub": f"""%ms: float32{ms} = Mul<ms>(%mean, {s})
  %shift: float32[B,S,16] = Sub<shift>(%bias, %ms)
  %y: float32[B,S,16] = Add<y>(%shift, %xs)""",
        "nobeta": f"""%ms: float32{ms} = Mul<ms>(%mean, {s})
  %y: float32[B,S,16] = Sub<y>(%xs, %ms)"""}[shift]
    return parse(f"""graph g(%x: float32[B,S,16]) {{
  %ax: int64[1] = const [-1]
  %two: float32[] = const [2.0]
  %mhalf: float32[] = const [-0.5]
  %eps: float32[] = const [0.001]
  %scale: float32[16] = const
  %bias: float32[16] = const
  %mean: float32[B,S,1] = ReduceMean<mean>(%x, %ax)
  %d: float32[B,S,16] = Sub<d>(%x, %mean)
  %sq: float32[B,S,16] = {sq}
  %var: float32[B,S,1] = ReduceMean<var>(%sq, %ax)
  %ve: float32[B,S,1] = Add<ve>(%var, %eps)
  %std: float32[B,S,1] = Sqrt<std>(%ve)
  %rstd: float32[B,S,1] = {rstd}
  {s_line}
  %xs: float32[B,S,16] = Mul<xs>(%x, {s})
  {shift_lines}
  return %y
}}""", {"scale": rng.uniform(0.5, 1.5, 16).astype(np.float32), "bias": rng.standard_normal(16).astype(np.float32)})


@pytest.mark.parametrize("kw", [{}, {"shift": "sub"}, {"shift": "nobeta"}, {"gamma": False},
                                {"rstd": "Pow<rstd>(%ve, %mhalf)"}, {"sq": "Pow<sq>(%d, %two)"}])
def test_tf_scale_shift_forms(kw):
    from aiacc.core.passes.layernorm import TF_RULE  # noqa: F401

    g = tf_graph(**kw)
    check_pass(g, ["dce"] + P, rtol=1e-4, atol=1e-5)  # (the Pow form leaves the Sqrt unread)
    assert ops(g) == ["LayerNormalization"] and g.outputs[0].name == "y"
    assert g.nodes[0].attrs["epsilon"] == pytest.approx(0.001)
    assert (g.nodes[0].inputs[2] is not None) == (kw.get("shift") != "nobeta")


def test_tf_form_with_a_different_mean_does_not_fire():
    from aiacc.core.passes.layernorm import TF_RULE

    g = parse(str(tf_graph()).replace("Neg<neg>(%mean)", "Neg<neg>(%var)"))
    assert TF_RULE.explain(g, "y") is not None
    run_passes(g, passes=P)
    assert "LayerNormalization" not in ops(g)
