"""Planned execution in one arena (aiacc.core.runtime.arena): same outputs as the reference executor,
a measurably lower peak (tracemalloc sees numpy's allocations), and a clear error for a wrong shape."""
import tracemalloc

import numpy as np
import pytest

from aiacc.core import Graph, check_plan, plan_memory, run
from aiacc.core.ir import TensorType
from aiacc.core.runtime.arena import ArenaInterpreter, run_planned
from aiacc.errors import ShapeError
from tests.zoo import ir_models as zoo


def _peak(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _max_rel_err(ref, out):
    return max(float(np.max(np.abs(ref[k].astype(np.float64) - out[k])) / (np.max(np.abs(ref[k])) + 1e-30))
               for k in ref)


@pytest.mark.parametrize("name", list(zoo.SMALL))
def test_planned_equals_unplanned_with_lower_peak(name):
    g = zoo.SMALL[name]()
    feeds = zoo.example_feeds(g, batch=1)
    plan = plan_memory(g, dims={"N": 1})
    check_plan(plan)
    ref = run(g, feeds)
    out = ArenaInterpreter(g, plan).run(feeds)
    assert set(out) == set(ref)
    assert _max_rel_err(ref, out) < 1e-5  # float32 sums in another order (conv as W @ patches)
    run(g, feeds), ArenaInterpreter(g, plan).run(feeds)  # warm caches before measuring
    unplanned = _peak(lambda: run(g, feeds))
    planned = _peak(lambda: ArenaInterpreter(g, plan).run(feeds))  # the arena allocation is counted
    assert planned <= 0.9 * unplanned, (planned, unplanned)


def test_arena_is_allocated_once_and_reused():
    g = zoo.SMALL["inception"]()
    interp = ArenaInterpreter(g, dims={"N": 1})
    arena = interp.arena
    a = interp.run(zoo.example_feeds(g, seed=1))
    b = interp.run(zoo.example_feeds(g, seed=2))
    again = interp.run(zoo.example_feeds(g, seed=1))
    assert interp.arena is arena and interp.arena.nbytes == interp.plan.arena_bytes
    out = g.outputs[0].name
    assert np.array_equal(a[out], again[out]) and not np.array_equal(a[out], b[out])
    assert not np.shares_memory(a[out], arena)  # outputs are copied out of the arena
    assert interp.arena.ctypes.data % interp.plan.alignment == 0


def test_batch_of_two_and_wrong_shape():
    g = zoo.SMALL["resnet50"]()
    feeds = zoo.example_feeds(g, batch=2)
    ref = run(g, feeds)
    out = run_planned(g, feeds, dims={"N": 2})
    assert _max_rel_err(ref, out) < 1e-5
    with pytest.raises(ShapeError, match="plan was made for"):
        ArenaInterpreter(g, dims={"N": 1}).run(feeds)


def test_opaque_node_kernel_runs_and_is_copied_into_its_slot():
    g = Graph("opaque")
    x = g.add_input("x", "float32", (4, 5))
    y = g.op("Relu", x)
    z = g.add_node("Double", [y], domain="custom", name="double",
                   output_types=[TensorType("float32", (4, 5))])
    z.meta["kernel"] = lambda a: a * 2
    g.add_output(g.op("Exp", z.output))
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)}
    interp = ArenaInterpreter(g)
    out = interp.run(feeds)
    np.testing.assert_allclose(out[g.outputs[0].name], run(g, feeds)[g.outputs[0].name], rtol=1e-6)
    assert interp.copied == 1  # only the opaque node ran aside


def test_kernels_into_views_match_reference_on_edge_cases():
    rng = np.random.default_rng(0)
    g = Graph("edges")
    x = g.add_input("x", "float32", (2, 6, 9, 9))
    s1 = g.op("Sum", x)  # one-input variadic
    dw = g.op("Conv", s1, g.add_initializer("wd", rng.standard_normal((6, 1, 3, 3)).astype(np.float32)),
              group=6, pads=[1, 1, 1, 1], strides=[2, 2])  # depthwise, strided
    gc = g.op("Conv", dw, g.add_initializer("wg", rng.standard_normal((4, 3, 2, 2)).astype(np.float32)),
              g.add_initializer("bg", rng.standard_normal(4).astype(np.float32)), group=2, dilations=[2, 2])
    mp = g.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    ap = g.op("AveragePool", mp, kernel_shape=[2, 2], strides=[1, 1])
    big = g.op("Gelu", g.op("Concat", *([x] * 12), axis=0))  # more than one chunk of elements
    sm = g.op("Softmax", g.op("Reshape", big, g.add_initializer("shp", np.array([-1, 81], dtype=np.int64))))
    for v in (gc, ap, sm):
        g.add_output(v)
    feeds = {"x": rng.standard_normal((2, 6, 9, 9)).astype(np.float32)}
    ref = run(g, feeds)
    out = run_planned(g, feeds)
    for k in ref:
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-5, atol=2e-5, err_msg=k)  # float32 sum order
