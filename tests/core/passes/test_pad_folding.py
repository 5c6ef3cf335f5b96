import numpy as np

from aiacc.core import Graph, parse
from aiacc.core.passes import run_passes
from aiacc.core.passes.pad_folding import RULES
from tests.core.passes.helpers import check_pass, ops

P = ["pad_folding"]
rng = np.random.default_rng(3)
W = {"w": rng.standard_normal((2, 3, 3, 3)).astype(np.float32)}


def graph(op_line, pads="[0, 0, 1, 2, 0, 0, 1, 0]", value="[0.0]"):
    return parse(f"""graph g(%x: float32[2,3,6,6]) {{
      %w: float32[2,3,3,3] = const
      %p: int64[8] = const {pads}
      %v: float32[] = const {value}
      %xp: float32[2,3,?,?] = Pad<pad>(%x, %p, %v)
      {op_line}
      return %y
    }}""", W)


def test_pad_into_conv():
    g = graph("%y: float32[2,2,?,?] = Conv<conv>(%xp, %w) {pads=[1,0,0,1]}")
    check_pass(g, P)
    assert ops(g) == ["Conv"] and g.nodes[0].attrs["pads"] == [2, 2, 1, 1]


def test_pad_into_avgpool_counts_padding():
    g = graph("%y: float32[2,3,?,?] = AveragePool<pool>(%xp) {kernel_shape=[3,3]}")
    check_pass(g, P)
    assert ops(g) == ["AveragePool"] and g.nodes[0].attrs["count_include_pad"] == 1


def test_maxpool_folds_only_minus_inf_padding():
    g = graph("%y: float32[2,3,?,?] = MaxPool<pool>(%xp) {kernel_shape=[2,2]}")
    assert "differs" in RULES["pad_into_maxpool"].explain(g, "pool")
    run_passes(g, passes=P)
    assert ops(g) == ["Pad", "MaxPool"]
    g = graph("%y: float32[2,3,?,?] = MaxPool<pool>(%xp) {kernel_shape=[2,2]}", value="[-inf]")
    check_pass(g, P)
    assert ops(g) == ["MaxPool"]


def test_channel_padding_and_nonzero_value_do_not_fold():
    g = graph("%y: float32[2,2,?,?] = Conv<conv>(%xp, %w)", pads="[0, 1, 0, 0, 0, 0, 0, 0]")
    assert "channel" in RULES["pad_into_conv"].explain(g, "conv")
    g = graph("%y: float32[2,2,?,?] = Conv<conv>(%xp, %w)", value="[1.0]")
    assert "pad value 1.0" in RULES["pad_into_conv"].explain(g, "conv")
    run_passes(g, passes=P)
    assert ops(g) == ["Pad", "Conv"]


def test_nhwc_pad_before_a_transpose_folds_into_the_conv():
    """TF: ZeroPadding2D pads NHWC, then the importer transposes to NCHW for the Conv."""
    g = parse("""graph g(%x: float32[2,6,6,3]) {
      %w: float32[2,3,3,3] = const
      %p: int64[8] = const [0, 3, 1, 0, 0, 2, 3, 0]
      %xp: float32[2,11,10,3] = Pad<pad>(%x, %p)
      %t: float32[2,3,11,10] = Transpose<t>(%xp) {perm=[0, 3, 1, 2]}
      %y: float32[2,2,9,8] = Conv<conv>(%t, %w)
      return %y
    }""", W)
    check_pass(g, P)
    assert ops(g) == ["Transpose", "Conv"] and g.nodes[1].attrs["pads"] == [3, 1, 2, 3]


def test_transpose_of_pad_keeps_a_pad_read_elsewhere():
    g = parse("""graph g(%x: float32[2,6,6,3]) {
      %p: int64[8] = const [0, 1, 1, 0, 0, 1, 1, 0]
      %xp: float32[2,8,8,3] = Pad<pad>(%x, %p)
      %t: float32[2,3,8,8] = Transpose<t>(%xp) {perm=[0, 3, 1, 2]}
      return %t, %xp
    }""")
    assert "also used" in RULES["transpose_of_pad"].explain(g, "t") or "graph output" in \
        RULES["transpose_of_pad"].explain(g, "t")
    check_pass(g, P)
    assert ops(g) == ["Pad", "Transpose"]


def nonneg_pool(pads="[0, 0, 1, 1, 0, 0, 1, 1]", act="Relu<act>(%x)", pool_attrs="kernel_shape=[3,3], strides=[2,2]"):
    return parse(f"""graph g(%x: float32[2,3,6,6]) {{
      %lo: float32[] = const [0.0]
      %p: int64[8] = const {pads}
      %a: float32[2,3,6,6] = {act}
      %xp: float32[2,3,?,?] = Pad<pad>(%a, %p)
      %y: float32[2,3,?,?] = MaxPool<pool>(%xp) {{{pool_attrs}}}
      return %y
    }}""")


def test_zero_pad_of_relu_output_folds_into_maxpool():
    g = nonneg_pool()
    check_pass(g, P)
    assert ops(g) == ["Relu", "MaxPool"] and g.nodes[1].attrs["pads"] == [1, 1, 1, 1]
    g = nonneg_pool(act="Clip<act>(%x, %lo)")
    check_pass(g, P)
    assert ops(g) == ["Clip", "MaxPool"]


def test_zero_pad_folds_into_maxpool_only_for_nonnegative_values_and_real_windows():
    g = nonneg_pool(act="Tanh<act>(%x)")
    assert "differs" in RULES["pad_into_maxpool"].explain(g, "pool")
    g = nonneg_pool(pads="[0, 0, 3, 0, 0, 0, 0, 0]")  # a whole window of padding: its max is 0, not -inf
    assert "could hold only padding" in RULES["pad_into_maxpool"].explain(g, "pool")
    check_pass(g, P)
    assert ops(g) == ["Relu", "Pad", "MaxPool"]
    g = nonneg_pool(pool_attrs="kernel_shape=[3,3], strides=[2,2], ceil_mode=1")
    assert "ceil_mode" in RULES["pad_into_maxpool"].explain(g, "pool")


def test_pads_from_a_constant_node_and_explicit_zero_value_fold():
    g = Graph("g")
    x = g.add_input("x", "float32", (2, 3, 6, 6))
    pads = g.op("Constant", value=np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), name="pads")
    zero = g.op("Constant", value=np.array(0.0, np.float32), name="zero")
    xp = g.op("Pad", x, pads, zero, name="pad")
    g.add_output(g.op("Conv", xp, g.add_initializer("w", W["w"]), name="conv"))
    check_pass(g, P + ["dce"])
    assert ops(g) == ["Conv"] and g.nodes[0].attrs["pads"] == [1, 1, 1, 1]


def test_transpose_of_pad_moves_only_in_inference_mode():
    text = """graph g(%x: float32[2,6,6,3]) {
      %w: float32[2,3,3,3] = const
      %p: int64[8] = const [0, 1, 1, 0, 0, 1, 1, 0]
      %xp: float32[2,8,8,3] = Pad<pad>(%x, %p)
      %t: float32[2,3,8,8] = Transpose<t>(%xp) {perm=[0, 3, 1, 2]}
      %y: float32[2,2,6,6] = Conv<conv>(%t, %w)
      return %y
    }"""
    g = parse(text, W)
    check_pass(g, P, mode="training")
    assert ops(g) == ["Pad", "Transpose", "Conv"]
    g = parse(text, W)
    check_pass(g, P)
    assert ops(g) == ["Transpose", "Conv"]
