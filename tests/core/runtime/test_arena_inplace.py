"""Every op that may work in place, with its output over each of its inputs in turn: the planner takes the
input over exactly when the op's aliasing rule allows it (`inplace_inputs`), `check_plan` accepts exactly
those plans, and arena execution equals the reference executor either way (the variadic Sum / Max / Min /
Mean fold inputs 2.. into the output after writing it: an output over those would be wrong)."""
from dataclasses import replace

import numpy as np
import pytest

from aiacc.core import Graph, check_plan, plan_memory, run
from aiacc.core.memory import inplace_inputs, inplace_kind
from aiacc.core.ops import registry
from aiacc.core.runtime.arena import CHUNK_ELEMENTS, ArenaInterpreter
from aiacc.errors import VerificationError

BOOL_OPS = {"And", "Or", "Xor", "Not"}
#: input count used for the variadic ops (enough to reach the folded inputs 2..)
VARIADIC = 4
#: constant inputs the reshaping ops need after their data input
ALIAS_EXTRA = {"Reshape": [np.array([-1], dtype=np.int64)], "Unsqueeze": [np.array([0], dtype=np.int64)],
               "Flatten": [], "Squeeze": [], "Identity": []}


def _node_specs():
    """(op, domain, input count, attrs) of every registered op that may work in place."""
    specs = []
    for s in sorted(registry.all_schemas(), key=lambda s: (s.domain, s.op)):
        if s.outputs[0] != 1:
            continue
        if s.domain == "" and s.op in ALIAS_EXTRA:
            specs.append((s.op, "", 1, {}))
        elif s.domain == "" and s.op == "BatchNormalization":
            specs.append((s.op, "", 5, {}))
        elif s.elementwise:
            lo, hi = s.inputs
            n = VARIADIC if hi < 0 else (3 if s.op == "Clip" else max(lo, min(hi, 3)))
            attrs = {"program": "t0=Mul(i0,i1);t1=Add(t0,i2);t2=Sub(t1,i3);t3=Relu(t2)"} if s.op == "FusedElementwise" else {}
            specs.append((s.op, s.domain, n, attrs))
    return specs


SPECS = _node_specs()
CASES = [(op, dom, n, attrs, k, big) for op, dom, n, attrs in SPECS for k in range(n) for big in (False, True)]


def _input_array(op, k, shape, rng):
    if op in BOOL_OPS or (op == "Where" and k == 0):
        return rng.random(shape) < 0.5
    if op == "BatchNormalization" and k > 0:
        a = rng.uniform(0.5, 2.0, shape[1]).astype(np.float32)
        return a
    if op == "Clip" and k > 0:
        return np.array(-0.5 if k == 1 else 0.5, dtype=np.float32)
    return rng.uniform(0.5, 2.0, shape).astype(np.float32) * (1 if op in ("Log", "Sqrt", "Pow") else
                                                               rng.choice([-1, 1], shape).astype(np.float32))


def _graph(op, domain, n, attrs, k, big):
    """x_j = Identity(in_j) (intermediates in the arena); y = op(x_0..x_{n-1}); only x_k dies at op, the
    others are graph outputs too (live to the end), so x_k is the one input y can take over."""
    shape = (2, 4, 8, CHUNK_ELEMENTS // 16) if big else (2, 3, 4, 5)
    rng = np.random.default_rng(k)
    g = Graph(f"inplace_{op}_{k}")
    feeds, xs = {}, []
    for j in range(n):
        a = _input_array(op, j, shape, rng)
        v = g.add_input(f"in{j}", a.dtype.name, a.shape)
        feeds[v.name] = a
        xs.append(g.op("Identity", v))
    extra = [g.add_initializer(f"c{j}", c) for j, c in enumerate(ALIAS_EXTRA.get(op, []))] if not domain else []
    y = g.add_node(op, xs + extra, attrs, domain=domain, name="target").output
    g.add_output(y)
    for j, x in enumerate(xs):
        if j != k:
            g.add_output(x)
    return g, feeds, xs[k], y


@pytest.mark.parametrize("op,domain,n,attrs,k,big", CASES,
                         ids=[f"{c[0]}-in{c[4]}{'-big' if c[5] else ''}" for c in CASES])
def test_output_over_each_input(op, domain, n, attrs, k, big):
    g, feeds, xk, y = _graph(op, domain, n, attrs, k, big)
    node = y.producer
    assert inplace_kind(node) is not None
    plan = plan_memory(g)
    check_plan(plan)
    same = y.type == xk.type or (inplace_kind(node) == "alias" and y.type.nbytes() == xk.type.nbytes())
    allowed = k in inplace_inputs(node) and same
    assert (plan.allocations[y.name].shares == xk.name) == allowed
    if op in ("Sum", "Max", "Min", "Mean"):
        assert allowed == (k < 2)
    ref = run(g, feeds)
    out = ArenaInterpreter(g, plan).run(feeds)
    for name in ref:
        np.testing.assert_allclose(out[name], ref[name], rtol=1e-6, atol=1e-6, err_msg=name)
    if not allowed and same:
        # a plan putting y over x_k anyway is unsound, and the checker says so (naming the node's rule)
        forged = replace(plan.allocations[y.name], offset=plan.allocations[xk.name].offset, shares=xk.name)
        bad = replace(plan, allocations=dict(plan.allocations, **{y.name: forged}))
        with pytest.raises(VerificationError, match="may not write its output over input"):
            check_plan(bad)


def test_variadic_sum_over_a_folded_input_would_be_wrong():
    """The bug this rule fixes: Sum(a, b, c) written over c gives a + b + (a + b)."""
    g, feeds, xk, y = _graph("Sum", "", 3, {}, 2, False)
    plan = plan_memory(g)
    assert plan.allocations[y.name].shares is None
    forged = replace(plan.allocations[y.name], offset=plan.allocations[xk.name].offset, shares=xk.name)
    bad = replace(plan, allocations=dict(plan.allocations, **{y.name: forged}))
    wrong = ArenaInterpreter(g, bad).run(feeds)[y.name]
    assert not np.allclose(wrong, run(g, feeds)[y.name])  # what the old plan computed


def test_an_input_read_twice_is_only_taken_over_where_every_read_is_allowed():
    g = Graph("twice")
    a_in, b_in = g.add_input("a", "float32", (3, 4)), g.add_input("b", "float32", (3, 4))
    a, b = g.op("Identity", a_in), g.op("Identity", b_in)
    y = g.op("Sum", a, b, a)  # a at position 2 is read after the output is written
    g.add_output(y)
    g.add_output(b)
    plan = plan_memory(g)
    check_plan(plan)
    assert plan.allocations[y.name].shares is None
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((3, 4)).astype(np.float32), "b": rng.standard_normal((3, 4)).astype(np.float32)}
    np.testing.assert_allclose(ArenaInterpreter(g, plan).run(feeds)[y.name], run(g, feeds)[y.name], rtol=1e-6)
