import numpy as np

from aiacc.core import parse
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
