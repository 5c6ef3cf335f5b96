"""partition(): maximal runs of supported nodes become self-contained subgraphs that keep the parent's value
names and export exactly the values read later; unsupported nodes stand alone."""
from __future__ import annotations

import numpy as np

from aiacc.core import parse, run
from aiacc.core.partition import partition

TEXT = """graph g(%x: float32[N,4,6,6]) {
  %w: float32[4,4,3,3] = const
  %c: float32[N,4,6,6] = Conv<conv>(%x, %w) {pads=[1, 1, 1, 1]}
  %r: float32[N,4,6,6] = Relu<relu>(%c)
  %gate: float32[4] = const [0.5, 1.0, 1.5, 2.0]
  %q: float32[N,4,6,6] = custom::Gate<gate>(%r, %gate)
  %s: float32[N,4,6,6] = Add<add>(%q, %r)
  %t: float32[N,4,6,6] = Sigmoid<sig>(%s)
  return %t, %c
}
"""


def gate_kernel(x, gate):
    return x * gate.reshape(1, -1, 1, 1)


def graph():
    w = np.random.default_rng(0).standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3
    g = parse(TEXT, {"w": w})
    g.nodes[2].meta["kernel"] = gate_kernel
    return g


def supported(node):
    return node.schema is not None


def test_runs_and_opaque_nodes_in_order():
    segs = partition(graph(), supported)
    assert [(None if s.graph is None else [n.name for n in s.graph], s.node and s.node.name) for s in segs] == [
        (["conv", "relu"], None), (None, "gate"), (["add", "sig"], None)]


def test_segment_interfaces_keep_parent_names_and_export_only_what_is_read_later():
    first, gate, last = partition(graph(), supported)
    assert first.input_names == ["x"]
    # %c is a graph output, %r is read by the gate and by the Add: both leave the first run
    assert first.output_names == ["c", "r"]
    assert gate.input_names == ["r"]                 # the constant gate is not an input
    assert gate.output_names == ["q"]
    assert last.input_names == ["q", "r"]
    assert last.output_names == ["t"]                 # %s stays inside
    # constants used by a run are copied into it
    assert set(first.graph.initializers) == {"w"}
    for seg in (first, last):
        seg.graph.verify()


def test_segments_chained_equal_the_whole_graph():
    g = graph()
    x = np.random.default_rng(1).standard_normal((2, 4, 6, 6)).astype(np.float32)
    env = {"x": x}
    for seg in partition(g, supported):
        if seg.graph is not None:
            outs = run(seg.graph, {n: env[n] for n in seg.input_names})
            env.update({n: outs[n] for n in seg.output_names})
        else:
            node = seg.node
            args = [v.const if v.is_constant else env[v.name] for v in node.inputs]
            env[seg.output_names[0]] = node.meta["kernel"](*args)
    expected = run(g, {"x": x})
    for name in ("t", "c"):
        np.testing.assert_allclose(env[name], expected[name], rtol=1e-6, atol=1e-6)


def test_all_supported_is_one_segment_and_adjacent_opaque_nodes_stay_apart():
    g = graph()
    segs = partition(g, lambda n: True)
    assert len(segs) == 1 and [n.name for n in segs[0].graph] == [n.name for n in g]
    assert segs[0].output_names == ["c", "t"]  # in schedule order
    segs = partition(g, lambda n: n.name in ("conv", "sig"))
    assert [s.graph is not None for s in segs] == [True, False, False, False, True]
    assert [s.node.name for s in segs if s.node is not None] == ["relu", "gate", "add"]
