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
