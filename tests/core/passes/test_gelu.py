import math

import numpy as np
import pytest

from aiacc.core import Graph
from aiacc.core import parse
from aiacc.core.passes import run_passes
from aiacc.core.passes.gelu import gelu_erf, gelu_tanh
from tests.core.passes.helpers import check_pass, ops

P = ["gelu_recognition"]

ERF_FORMS = {
    # torch.onnx: Mul(Mul(x, Add(Erf(Div(x, sqrt2)), 1)), 0.5)
    "torch": """%d: float32[N,8] = Div<d>(%x, %s2)
      %e: float32[N,8] = Erf<e>(%d)
      %a: float32[N,8] = Add<a>(%e, %one)
      %m: float32[N,8] = Mul<m>(%x, %a)
      %y: float32[N,8] = Mul<y>(%m, %half)""",
    # keras: 0.5 * x * (1 + erf(x * 0.7071))
    "keras": """%d: float32[N,8] = Mul<d>(%x, %rs2)
      %e: float32[N,8] = Erf<e>(%d)
      %a: float32[N,8] = Add<a>(%one, %e)
      %h: float32[N,8] = Mul<h>(%half, %x)
      %y: float32[N,8] = Mul<y>(%h, %a)""",
}


def graph(body):
    return parse(f"""graph g(%x: float32[N,8]) {{
      %s2: float32[] = const [{math.sqrt(2)}]
      %rs2: float32[] = const [{1 / math.sqrt(2)}]
      %one: float32[] = const [1.0]
      %half: float32[] = const [0.5]
      %c: float32[] = const [{math.sqrt(2 / math.pi)}]
      %k: float32[] = const [0.044715]
      %three: float32[] = const [3.0]
      {body}
      return %y
    }}""")


@pytest.mark.parametrize("form", sorted(ERF_FORMS))
def test_erf_forms(form):
    g = graph(ERF_FORMS[form])
    check_pass(g, P, rtol=1e-5, atol=1e-6)
    assert ops(g) == ["Gelu"] and g.nodes[0].attr("approximate") == "none" and g.outputs[0].name == "y"


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_tanh_form(cube):
    cube_lines = ("%p: float32[N,8] = Pow<p>(%x, %three)" if cube == "pow" else
                  "%xx: float32[N,8] = Mul<xx>(%x, %x)\n      %p: float32[N,8] = Mul<p>(%xx, %x)")
    g = graph(f"""{cube_lines}
      %pk: float32[N,8] = Mul<pk>(%p, %k)
      %in: float32[N,8] = Add<in>(%x, %pk)
      %ic: float32[N,8] = Mul<ic>(%in, %c)
      %t: float32[N,8] = Tanh<t>(%ic)
      %a: float32[N,8] = Add<a>(%t, %one)
      %h: float32[N,8] = Mul<h>(%x, %half)
      %y: float32[N,8] = Mul<y>(%h, %a)""")
    check_pass(g, P, rtol=1e-5, atol=1e-6)
    assert ops(g) == ["Gelu"] and g.nodes[0].attr("approximate") == "tanh"


def test_wrong_constant_or_different_x_does_not_fire():
    g = graph(ERF_FORMS["torch"].replace("Div<d>(%x, %s2)", "Div<d>(%x, %half)"))
    why = gelu_erf.explain(g, "y")
    assert why is not None and "not 1.414" in why
    run_passes(g, passes=P)
    assert "Gelu" not in ops(g)
    g = Graph("g")
    x, z = g.add_input("x", "float32", (4,)), g.add_input("z", "float32", (4,))
    e = g.op("Erf", g.op("Div", z, g.add_initializer("s2", np.float32(math.sqrt(2)))))
    a = g.op("Add", e, g.add_initializer("one", np.float32(1)))
    g.add_output(g.op("Mul", g.op("Mul", x, a), g.add_initializer("half", np.float32(0.5)), name="y"))
    assert "not the same value as x" in gelu_erf.explain(g, "y")


def test_intermediate_read_elsewhere_blocks_the_rewrite():
    g = graph(ERF_FORMS["torch"].replace("return %y", ""))
    g.add_output(g.value("e"))
    assert "graph output" in gelu_erf.explain(g, "y")
    assert gelu_tanh.explain(g, "y") is not None


TF_ERFC_FORMS = {
    # TF: 0.5 * x * erfc(-x / sqrt 2), Erfc imported as 1 - erf
    "neg_then_scale": """%n: float32[N,8] = Neg<n>(%x)
      %d: float32[N,8] = Mul<d>(%n, %rs2)
      %e: float32[N,8] = Erf<e>(%d)
      %a: float32[N,8] = Sub<a>(%one, %e)
      %h: float32[N,8] = Mul<h>(%half, %x)
      %y: float32[N,8] = Mul<y>(%h, %a)""",
    "scale_then_neg": """%d0: float32[N,8] = Div<d0>(%x, %s2)
      %d: float32[N,8] = Neg<d>(%d0)
      %e: float32[N,8] = Erf<e>(%d)
      %a: float32[N,8] = Sub<a>(%one, %e)
      %m: float32[N,8] = Mul<m>(%x, %a)
      %y: float32[N,8] = Mul<y>(%m, %half)""",
}


@pytest.mark.parametrize("form", sorted(TF_ERFC_FORMS))
def test_tf_erfc_forms(form):
    g = graph(TF_ERFC_FORMS[form])
    check_pass(g, P, rtol=1e-5, atol=1e-6)
    assert ops(g) == ["Gelu"] and g.nodes[0].attr("approximate") == "none" and g.outputs[0].name == "y"


def test_one_minus_erf_of_positive_argument_is_not_gelu():
    g = graph(TF_ERFC_FORMS["neg_then_scale"].replace("Mul<d>(%n, %rs2)", "Mul<d>(%x, %rs2)"))
    assert gelu_erf.explain(g, "y") is not None
    run_passes(g, passes=P)
    assert "Gelu" not in ops(g)
