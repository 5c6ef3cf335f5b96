"""OrtGraphRunner: supported runs go to onnxruntime sessions, opaque nodes run through node.meta["kernel"]
between them; the result equals aiacc's reference executor."""
from __future__ import annotations

import numpy as np
import pytest

from aiacc.core import parse, run
from aiacc.errors import KernelError

pytest.importorskip("onnxruntime")
from aiacc.backends.onnxruntime import OrtGraphRunner, default_providers  # noqa: E402

TEXT = """graph g(%x: float32[N,3,8,8], %y: float32[N,8]) {
  %w: float32[8,3,3,3] = const
  %b: float32[8] = const
  %c: float32[N,8,8,8] = Conv<conv>(%x, %w, %b) {pads=[1, 1, 1, 1]}
  %r: float32[N,8,8,8] = Relu<relu>(%c)
  %k: float32[N,8,8,8] = custom::Cumsum<cum>(%r)
  %p: float32[N,8,1,1] = GlobalAveragePool<pool>(%k)
  %f: float32[N,8] = Flatten<flat>(%p) {axis=1}
  %m: float32[N,8] = custom::Scale<scale>(%f, %y)
  %o: float32[N,8] = Softmax<soft>(%m) {axis=-1}
  return %o, %r
}
"""


def graph():
    rng = np.random.default_rng(0)
    g = parse(TEXT, {"w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
                     "b": rng.standard_normal(8).astype(np.float32) * 0.1})
    nodes = {n.name: n for n in g}
    nodes["cum"].meta["kernel"] = lambda a: np.cumsum(a, axis=-1).astype(np.float32)
    nodes["scale"].meta["kernel"] = lambda a, s: (a * s, )  # a tuple of outputs is accepted too
    return g


def feeds(batch=2, seed=1):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, 3, 8, 8)).astype(np.float32),
            "y": rng.standard_normal((batch, 8)).astype(np.float32)}


def test_split_across_sessions_equals_the_reference_executor():
    g = graph()
    runner = OrtGraphRunner(g, providers=["CPUExecutionProvider"])
    kinds = ["ort" if s.graph is not None else s.node.name for s in runner.segments]
    assert kinds == ["ort", "cum", "ort", "scale", "ort"]
    assert runner.num_opaque == 2 and sum(s is not None for s in runner.sessions) == 3
    for batch in (1, 3):  # the batch dimension stays symbolic in every session
        x = feeds(batch)
        expected = run(g, x)
        outs = runner.run(x)
        assert [o.shape for o in outs] == [(batch, 8), (batch, 8, 8, 8)]
        for name, o in zip(("o", "r"), outs):
            np.testing.assert_allclose(o, expected[name], rtol=1e-5, atol=1e-6)


def test_opaque_node_without_kernel_is_named():
    g = graph()
    del [n for n in g if n.name == "cum"][0].meta["kernel"]
    runner = OrtGraphRunner(g)
    with pytest.raises(KernelError, match="custom::Cumsum at node cum"):
        runner.run(feeds())


def test_custom_opaque_runner_and_thread_option():
    g = graph()
    seen = []

    def run_opaque(node, arrays):
        seen.append(node.name)
        return node.meta["kernel"](*arrays) if node.name == "scale" else [np.cumsum(arrays[0], axis=-1)]

    runner = OrtGraphRunner(g, intra_op_threads=1, run_opaque=run_opaque)
    out = runner.run(feeds())
    assert seen == ["cum", "scale"]
    np.testing.assert_allclose(out[0], run(g, feeds())["o"], rtol=1e-5, atol=1e-6)


def test_cpu_provider_is_always_available():
    assert default_providers()[-1] == "CPUExecutionProvider"


def test_sessions_do_not_spin_or_pin_by_default():
    import os

    runner = OrtGraphRunner(graph())
    opts = [s.get_session_options() for s in runner.sessions if s is not None]
    assert all(o.intra_op_num_threads == len(os.sched_getaffinity(0)) for o in opts)
    assert all(o.get_session_config_entry("session.intra_op.allow_spinning") == "0" for o in opts)
    spinning = OrtGraphRunner(graph(), spinning=True, intra_op_threads=1)
    o = spinning.sessions[0].get_session_options()
    assert o.intra_op_num_threads == 1
    with pytest.raises(Exception):  # the entry is not set: onnxruntime's default (spin) applies
        o.get_session_config_entry("session.intra_op.allow_spinning")


def test_nodes_onnxruntime_cannot_build_fall_back_to_reference_kernels():
    """onnxruntime has no bool Where kernel: that node runs on aiacc's kernel, the rest in onnxruntime."""
    import warnings

    g = parse("""
graph main(%c: bool[4], %a: bool[4], %b: bool[4], %x: float32[4]) {
  %w: bool[4] = Where<where>(%c, %a, %b)
  %n: bool[4] = Not<not>(%w)
  %y: float32[4] = Relu<relu>(%x)
  return %n, %y
}
""")
    rng = np.random.default_rng(0)
    feeds = {"c": rng.random(4) > 0.5, "a": rng.random(4) > 0.5, "b": rng.random(4) > 0.5,
             "x": rng.standard_normal(4).astype(np.float32)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner = OrtGraphRunner(g)
    assert runner.fallback_nodes == ["where"]
    assert any("where" in str(w.message) for w in caught)
    expected = run(g, feeds)
    got = runner.run(feeds)
    np.testing.assert_array_equal(got[0], expected["n"])
    np.testing.assert_array_equal(got[1], expected["y"])
