"""The canonicalize pass, rule by rule on small graphs: each idiom becomes the canonical form with the same
numerics, and `canonical_text` tells apart what must stay apart."""
from __future__ import annotations

import numpy as np
import pytest

from aiacc.core import Graph, run
from aiacc.core.canonical_text import canonical_text
from aiacc.core.passes import canonicalize, random_feeds, run_passes

RNG = np.random.default_rng(0)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def canon(g, feeds=None, rtol=1e-5, atol=1e-5, **kw):
    """Canonicalize g in place; assert the outputs did not change (inputs fed in the canonical layout)."""
    feeds = feeds if feeds is not None else random_feeds(g)
    before = [run(g, feeds)[v.name] for v in g.outputs]
    canonicalize(g, **kw)
    g.verify()
    layout = g.meta.get("canonical_layout", {})
    cfeeds = {k: (a.transpose(layout[k]["input_perm"]) if k in layout and "input_perm" in layout[k] else a)
              for k, a in feeds.items()}
    after = [run(g, cfeeds)[v.name] for v in g.outputs]
    for b, a in zip(before, after):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return g


def ops(g):
    return [n.qualified_op for n in g]


def test_matmul_add_becomes_gemm_with_out_in_weight():
    g = Graph("t")
    x = g.add_input("x", "float32", ("N", 6))
    w = f32(6, 4)
    y = g.op("Add", g.op("MatMul", x, g.add_initializer("w", w)), g.add_initializer("b", f32(4)))
    g.add_output(y)
    canon(g)
    assert ops(g) == ["Gemm"]
    gemm = g.nodes[0]
    assert gemm.attrs == {"transB": 1}
    np.testing.assert_array_equal(gemm.inputs[1].const, w.T)


def test_tensordot_is_a_batched_matmul():
    g = Graph("t")
    x = g.add_input("x", "float32", (2, 3, 6))
    r = g.op("Reshape", x, g.add_initializer("s1", np.array([-1, 6])))
    m = g.op("MatMul", r, g.add_initializer("w", f32(6, 5)))
    g.add_output(g.op("Reshape", m, g.add_initializer("s2", np.array([2, 3, 5]))))
    canon(g)
    assert ops(g) == ["MatMul"] and g.nodes[0].inputs[0] is g.inputs[0]


def test_nhwc_flatten_before_dense_becomes_nchw_flatten_with_permuted_rows():
    g = Graph("t")
    x = g.add_input("x", "float32", (2, 3, 2, 2))  # NCHW
    t = g.op("Transpose", x, perm=[0, 2, 3, 1])
    r = g.op("Reshape", t, g.add_initializer("s", np.array([-1, 12])))
    g.add_output(g.op("MatMul", r, g.add_initializer("w", f32(12, 5))))
    canon(g)
    assert ops(g) == ["Flatten", "MatMul"]


def test_nhwc_input_transpose_becomes_the_input_layout():
    g = Graph("t")
    x = g.add_input("x", "float32", ("N", 5, 5, 3))
    t = g.op("Transpose", x, perm=[0, 3, 1, 2])
    g.add_output(g.op("Conv", t, g.add_initializer("w", f32(4, 3, 3, 3)), kernel_shape=[3, 3]))
    canon(g)
    assert g.inputs[0].shape == ("N", 3, 5, 5) and ops(g) == ["Conv"]
    assert g.meta["canonical_layout"] == {"x": {"input_perm": [0, 3, 1, 2]}}


def test_batchnorm_and_per_channel_affine_print_the_same():
    c = 3
    gamma, beta, mean = f32(c), f32(c), f32(c)
    var = RNG.uniform(0.5, 1.5, c).astype(np.float32)

    def base():
        g = Graph("t")
        return g, g.add_input("x", "float32", (2, c, 4, 4))

    g1, x1 = base()
    g1.add_output(g1.op("BatchNormalization", x1, *[g1.add_initializer(n, a) for n, a in
                                                    (("g", gamma), ("b", beta), ("m", mean), ("v", var))],
                        epsilon=1e-3))
    g2, x2 = base()
    scale = (gamma / np.sqrt(var + 1e-3)).astype(np.float32)
    shift = (beta - mean * scale).astype(np.float32)
    mul = g2.op("Mul", x2, g2.add_initializer("s", scale.reshape(c, 1, 1)))
    g2.add_output(g2.op("Add", mul, g2.add_initializer("t", shift.reshape(c, 1, 1))))
    canon(g1)
    canon(g2)
    assert canonical_text(g1) == canonical_text(g2)
    assert ops(g1) == ["BatchNormalization"] and g1.nodes[0].attrs == {"epsilon": 0.0}


def test_conv_plus_channel_add_and_zero_pad_fold_into_conv():
    g = Graph("t")
    x = g.add_input("x", "float32", (1, 3, 6, 6))
    p = g.op("Pad", x, g.add_initializer("p", np.array([0, 0, 1, 1, 0, 0, 1, 1])), mode="constant")
    y = g.op("Conv", p, g.add_initializer("w", f32(4, 3, 3, 3)), kernel_shape=[3, 3], strides=[2, 2])
    g.add_output(g.op("Add", y, g.add_initializer("b", f32(4, 1, 1))))
    canon(g)
    assert ops(g) == ["Conv"]
    conv = g.nodes[0]
    assert conv.attrs["pads"] == [1, 1, 1, 1] and conv.inputs[2].shape == (4,)


@pytest.mark.parametrize("form", ["reducemean", "reducemean_squeeze", "avgpool"])
def test_global_pooling_forms(form):
    g = Graph("t")
    x = g.add_input("x", "float32", (2, 3, 4, 4))
    if form == "avgpool":
        y = g.op("AveragePool", x, kernel_shape=[4, 4])
    else:
        y = g.op("ReduceMean", x, g.add_initializer("a", np.array([2, 3])), keepdims=int(form == "reducemean"))
    g.add_output(y)
    canon(g)
    assert ops(g) == (["GlobalAveragePool", "Flatten"] if form == "reducemean_squeeze" else ["GlobalAveragePool"])


def test_reshape_to_rows_is_flatten_and_targets_are_normalized():
    g = Graph("t")
    x = g.add_input("x", "float32", (2, 4, 1, 1))
    f = g.op("Reshape", x, g.add_initializer("s", np.array([2, -1])))
    r = g.op("Reshape", f, g.add_initializer("s2", np.array([-1, 2, 2])))
    g.add_output(r)
    canon(g)
    assert ops(g) == ["Flatten", "Reshape"]
    assert canonical_text(g).count("$int64[3]{0, 2, 2}") == 1


def test_ceil_mode_without_effect_is_dropped_and_kept_where_it_matters():
    def pool(size):
        g = Graph("t")
        x = g.add_input("x", "float32", (1, 1, size, size))
        g.add_output(g.op("MaxPool", x, kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1))
        return canon(g)

    assert "ceil_mode" not in pool(4).nodes[0].attrs
    assert pool(5).nodes[0].attrs["ceil_mode"] == 1


def test_keras_gelu_and_layernorm_are_recognized():
    g = Graph("t")
    x = g.add_input("x", "float32", (2, 3, 8))
    c = lambda v: g.add_initializer("c", np.array(v, np.float32))  # noqa: E731
    # Keras LayerNormalization frozen by TF: x * m + (beta - mean * m), m = rsqrt(var + eps) * gamma
    mean = g.op("ReduceMean", x, g.add_initializer("a1", np.array([2])), keepdims=1)
    d = g.op("Sub", x, mean)
    var = g.op("ReduceMean", g.op("Mul", d, d), g.add_initializer("a2", np.array([2])), keepdims=1)
    m = g.op("Mul", g.op("Reciprocal", g.op("Sqrt", g.op("Add", var, c(1e-3)))), g.add_initializer("gm", f32(1, 1, 8)))
    ln = g.op("Add", g.op("Mul", x, m), g.op("Add", g.op("Mul", g.op("Neg", mean), m), g.add_initializer("bt", f32(1, 1, 8))))
    # exact GELU as tf.nn.gelu writes it: 0.5 * x * erfc(-x / sqrt 2), erfc imported as 1 - erf
    half = g.op("Mul", c(0.5), ln)
    erfc = g.op("Sub", c(1.0), g.op("Erf", g.op("Mul", g.op("Neg", ln), c(1 / np.sqrt(2)))))
    g.add_output(g.op("Mul", half, erfc))
    canon(g, rtol=1e-4)
    assert ops(g) == ["LayerNormalization", "Gelu"]


def test_canonical_text_ignores_names_and_order_but_not_structure():
    def build(names, swap, pads=(1, 1, 1, 1)):
        g = Graph(names)
        x = g.add_input(names + "_x", "float32", (1, 2, 4, 4))
        w1, w2 = g.add_initializer(names + "w1", f32(2, 2, 3, 3)), g.add_initializer(names + "w2", f32(2, 2, 3, 3))
        mk = [lambda: g.op("Conv", x, w1, pads=list(pads), name=names + "a"),
              lambda: g.op("Conv", x, w2, pads=[1] * 4, name=names + "b")]
        a, b = (mk[1](), mk[0]()) if swap else (mk[0](), mk[1]())
        g.add_output(g.op("Add", a, b) if not swap else g.op("Add", b, a))
        return g

    assert canonical_text(build("p", False)) == canonical_text(build("q", True))
    assert canonical_text(build("p", False)) != canonical_text(build("p", False, pads=(2, 2, 0, 0)))


def test_registered_as_a_pass_outside_the_levels():
    from aiacc.core.passes import passes_by_level

    g = Graph("t")
    x = g.add_input("x", "float32", (2, 6))
    g.add_output(g.op("Identity", g.op("Div", x, g.add_initializer("c", np.array(2.0, np.float32)))))
    run_passes(g, passes=["canonicalize"])
    assert ops(g) == ["Mul"]
    assert all("canonicalize" not in names for names in passes_by_level().values())


def test_every_idiom_is_a_rule_that_explains_why_it_does_not_fire():
    """The idioms are rewrite rules; explain() names the reason one does not apply at a node."""
    from aiacc.core.passes.canonicalize import RULES

    g = Graph("t")
    x = g.add_input("x", "int64", (4,))
    g.add_output(g.op("Div", x, g.add_initializer("c", np.array([2], np.int64)), name="div"))
    assert "not floating point" in RULES.explain(g, "div")["div_by_constant"]
    canon(g)
    assert ops(g) == ["Div"]  # integer division does not become a multiplication

    g = Graph("t")
    x = g.add_input("x", "float32", (1, 3, 6, 6))
    y = g.op("Conv", x, g.add_initializer("w", f32(4, 3, 3, 3)), kernel_shape=[3, 3], name="conv")
    g.add_output(g.op("Add", y, g.add_initializer("c", f32(4)), name="add"))  # broadcasts over the last axis
    why = RULES.explain(g, "add")
    assert "not a per-channel bias" in why["conv_add_bias"]
    assert why["mul_add_to_batchnorm"] == "expected Mul to produce %conv, found Conv<conv>"
    canon(g)
    assert ops(g) == ["Conv", "Add"]


def test_conv_rules_are_conv_fusion_and_pad_folding_rules():
    """canonicalize runs conv_fusion's bias rule and pad_folding's Pad-into-Conv rule themselves: a Conv with a
    bias absorbs a per-channel Add into that bias, and a Pad also read elsewhere stays for that reader."""
    from aiacc.core.passes import conv_fusion, pad_folding
    from aiacc.core.passes.canonicalize import PHASES

    conv_rules = dict(PHASES)["conv"].rules
    assert conv_fusion.conv_add_bias in conv_rules and pad_folding.RULES["pad_into_conv"] in conv_rules

    g = Graph("t")
    x = g.add_input("x", "float32", (1, 3, 6, 6))
    p = g.op("Pad", x, g.add_initializer("p", np.array([0, 0, 1, 1, 0, 0, 1, 1])), mode="constant")
    y = g.op("Conv", p, g.add_initializer("w", f32(4, 3, 3, 3)), g.add_initializer("b", f32(4)), kernel_shape=[3, 3])
    g.add_output(g.op("Add", y, g.add_initializer("c", f32(1, 4, 1, 1))))
    g.add_output(g.op("Relu", p))
    canon(g)
    assert sorted(ops(g)) == ["Conv", "Pad", "Relu"]
    conv = g.find_nodes("Conv")[0]
    assert conv.inputs[0] is x and conv.attrs["pads"] == [1, 1, 1, 1]


def test_a_no_op_reshape_of_an_input_keeps_the_output_name():
    """A graph output that is a no-op Reshape of a graph input keeps its name (an Identity carries it)."""
    g = Graph("t")
    x = g.add_input("x", "float32", (2, 6))
    g.add_output(g.op("Reshape", x, g.add_initializer("s", np.array([2, 6])), name="r"))
    name = g.outputs[0].name
    canon(g)
    assert ops(g) == ["Identity"] and g.outputs[0].name == name
