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
