"""Parameter counts and FLOP estimates."""
from __future__ import annotations

import numpy as np

from aiacc import examples
from aiacc.core import Graph
from aiacc.core.stats import graph_stats, node_flops


def test_conv_and_gemm_flops_by_formula():
    g = Graph("s")
    x = g.add_input("x", "float32", ("N", 8, 16, 16))
    w = g.add_initializer("w", np.zeros((32, 4, 3, 3), np.float32))  # 2 groups
    b = g.add_initializer("b", np.zeros(32, np.float32))
    y = g.op("Conv", x, w, b, group=2, pads=[1, 1, 1, 1], strides=[2, 2])  # out N,32,8,8
    f = g.op("Flatten", y)
    fc = g.add_initializer("fc", np.zeros((10, 2048), np.float32))
    z = g.op("Gemm", f, fc, transB=1)
    g.add_output(z)
    conv, _, gemm = g.nodes
    assert node_flops(conv, {"N": 2}) == 2 * (2 * 32 * 8 * 8) * (4 * 3 * 3) + 2 * 32 * 8 * 8
    assert node_flops(gemm, {"N": 2}) == 2 * 2 * 10 * 2048
    st = graph_stats(g, {"N": 2})
    assert st.parameters == 32 * 4 * 9 + 32 + 10 * 2048
    assert st.constant_bytes == 4 * st.parameters
    assert st.flops == node_flops(conv, {"N": 2}) + node_flops(gemm, {"N": 2})
    assert st.unknown_flops_nodes == []
    assert graph_stats(g).bind == {"N": 1}


def test_resnet50_numbers():
    from aiacc.core.onnx import from_onnx

    st = graph_stats(from_onnx(examples.resnet50_onnx()))
    # 25.5 M weights + 4 x 26,560 batch-norm values; about 4.1 G multiply-adds at 224 x 224
    assert st.parameters == 25_610_152
    assert 8.1e9 < st.flops < 8.3e9
    assert st.unknown_flops_nodes == []


def test_unknown_shapes_are_reported_not_guessed():
    g = Graph("u")
    x = g.add_input("x", "float32", None)
    g.add_output(g.op("Relu", x, name="r"))
    st = graph_stats(g)
    assert st.unknown_flops_nodes == ["r"] and st.flops == 0
