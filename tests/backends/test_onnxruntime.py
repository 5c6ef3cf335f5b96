"""OrtGraphRunner: supported runs go to onnxruntime sessions, opaque nodes run through node.meta["kernel"]
between them; the result equals aiacc's reference executor."""
from __future__ import annotations

import numpy as np
import pytest

from aiacc.core import parse, run
from aiacc.errors import KernelError

pytest.importorskip("onnxruntime")
from aiacc.backends.onnxruntime import OrtGraphRunner, default_providers  # noqa: E402
from tests.backends.split_graph import split_feeds, split_graph  # noqa: E402

def graph():
    return split_graph(second_opaque=True)


def feeds(batch=2, seed=1):
    return split_feeds(batch, seed)


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
