"""The reference executor: frees values at their last use, runs plugin kernels of opaque nodes, and runs
ResNet-50 at a small resolution quickly enough for tests."""
from __future__ import annotations

import time

import numpy as np
import pytest

from aiacc import examples
from aiacc.core import Graph, Interpreter, run
from aiacc.errors import KernelError


def chain_graph():
    g = Graph("chain")
    x = g.add_input("x", "float32", (4,))
    a = g.op("Relu", x, name="a")
    b = g.op("Neg", a, name="b")
    c = g.op("Add", b, a, name="c")  # a's last use
    d = g.op("Exp", c, name="d")
    g.add_output(d)
    g.add_output(b)  # a graph output lives to the end
    return g


def test_values_are_freed_after_their_last_use():
    g = chain_graph()
    live = {}

    class Spy(Interpreter):
        def after_node(self, node, pos, env):
            live[node.name] = sorted(v.name for v in g.values() if id(v) in env and v.producer is not None)

    out = Spy(g).run({"x": np.array([1, -2, 3, -4], np.float32)})
    # after_node sees the env before the node's dead inputs are dropped: a is gone once c has run
    assert live == {"a": ["a"], "b": ["a", "b"], "c": ["a", "b", "c"], "d": ["b", "c", "d"]}
    np.testing.assert_allclose(out["d"], np.exp(np.array([0, 0, 0, 0], np.float32)))
    assert list(out) == ["d", "b"]


def test_opaque_node_needs_a_kernel():
    g = Graph("o")
    x = g.add_input("x", "float32", (2,))
    n = g.add_node("Frobnicate", [x], domain="vendor", name="frob", output_types=[None])
    g.add_output(n.output)
    with pytest.raises(KernelError, match="no kernel for vendor::Frobnicate at node frob"):
        run(g, {"x": np.zeros(2, np.float32)})
    n.meta["kernel"] = lambda a: a + 1
    assert run(g, {"x": np.zeros(2, np.float32)})[n.output.name].tolist() == [1.0, 1.0]


def test_kernel_failure_names_node_and_shapes():
    g = Graph("k")
    a = g.add_input("a", "float32", None)
    b = g.add_input("b", "float32", None)
    g.add_output(g.op("MatMul", a, b, name="mm"))
    with pytest.raises(KernelError, match=r"node mm \(MatMul\) failed on inputs \(float32\[2, 3\], float32\[4, 5\]\)"):
        run(g, {"a": np.zeros((2, 3), np.float32), "b": np.zeros((4, 5), np.float32)})


def test_resnet50_small_resolution_runs_in_seconds():
    from aiacc.core.onnx import from_onnx

    g = from_onnx(examples.resnet50_onnx(image_size=64))
    feeds = examples.example_feeds("resnet50", batch=1, image_size=64)
    t = time.perf_counter()
    out = run(g, feeds)["fc"]
    elapsed = time.perf_counter() - t
    assert out.shape == (1, 1000) and np.isfinite(out).all()
    print(f"ResNet-50 64x64 on the reference executor: {elapsed:.2f} s")
