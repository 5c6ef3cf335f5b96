"""Shared by the pass tests: run a pass and check the numerics did not move."""
from __future__ import annotations

import numpy as np

from aiacc.core import run
from aiacc.core.passes import random_feeds, run_passes


def check_pass(g, passes, *, rtol=1e-5, atol=1e-6, feeds=None, mode="inference", seed=0):
    """Run `passes` on g (in place, debug mode) and assert outputs before/after agree; returns the report."""
    feeds = feeds if feeds is not None else random_feeds(g, seed=seed)
    before = run(g, feeds)
    before = [before[v.name] for v in g.outputs]
    names = [v.name for v in g.outputs]
    report = run_passes(g, passes=passes, debug=True, feeds=feeds, mode=mode)
    g.verify()
    after = run(g, feeds)
    assert [v.name for v in g.outputs] == names, "graph outputs were renamed"
    for b, a in zip(before, [after[n] for n in names]):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return report


def ops(g):
    return [n.qualified_op for n in g]


def scale_first_conv_weight(graph, ctx):
    """A wrong pass (a FunctionPass body) for the verify tests: the first Conv's weight 0.1% larger, so the
    function changes, in float64 as in float32."""
    conv = next(n for n in graph if n.op == "Conv")
    w = conv.inputs[1]
    conv.set_input(1, graph.add_initializer(f"{w.name}_scaled", np.asarray(w.const) * np.float32(1.001)))
    return 1
