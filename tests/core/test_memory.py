"""Static memory planning (aiacc.core.memory): lifetimes, lower bound, arena offsets, in-place reuse,
schedule search, and the checker that proves a plan sound."""
from dataclasses import replace

import numpy as np
import pytest

from aiacc.core import Graph, check_plan, format_memory_plan, parse, plan_memory
from aiacc.core.ir import TensorType
from aiacc.errors import ShapeError, VerificationError
from tests.zoo import ir_models as zoo

MIB = 1 << 20


@pytest.fixture(scope="module")
def full_plans():
    """Plans of the full-size zoo at batch 1 (planning only: nothing runs)."""
    return {name: plan_memory(build(), dims={"N": 1}) for name, build in zoo.FULL.items()}


@pytest.mark.parametrize("name", list(zoo.FULL))
def test_zoo_plan_is_sound_and_near_the_bound(full_plans, name):
    plan = full_plans[name]
    check_plan(plan)  # no two live-overlapping values overlap in memory
    assert plan.lower_bound_bytes <= plan.arena_bytes <= 1.01 * plan.lower_bound_bytes
    assert plan.arena_bytes <= 0.25 * plan.naive_bytes  # "well under naive"
    assert len(plan.allocations) == sum(len(n.outputs) for n in plan.graph)


def test_resnet50_figures_match_the_known_ones(full_plans):
    plan = full_plans["resnet50"]
    # the import-order bound of ResNet-50 at bs1 is ~9.2 MiB (conv output + BN output of the stem)
    assert 9.0 * MIB < plan.import_order_bound_bytes < 9.4 * MIB
    # in-place BN and ReLU leave the stem's conv output and the max-pool output live: 3.06 + 0.77 MiB ... x1.8
    assert plan.lower_bound_bytes < 0.8 * plan.import_order_bound_bytes


@pytest.mark.parametrize("name", ["inception", "densenet"])
def test_chosen_schedule_at_least_10_percent_under_import_order(full_plans, name):
    plan = full_plans[name]
    assert plan.lower_bound_bytes <= 0.9 * plan.import_order_bound_bytes
    assert plan.inplace_count > 0


def _branchy(order_breadth_first=True):
    """x -> 4 branches (expand 16 -> 128 channels, reduce to 16) -> concat; breadth-first order keeps all
    four expanded tensors live at once; branch by branch keeps one."""
    b = zoo.Builder("branches")
    x = b.g.add_input("x", "float32", ("N", 16, 32, 32))
    outs = [b.conv(b.conv(x, 128, 1), 16, 1) for _ in range(4)]
    g = b.done(b.g.op("Concat", *outs, axis=1))
    return zoo.breadth_first(g) if order_breadth_first else g


def test_schedule_search_lowers_the_peak_of_parallel_branches():
    g = _branchy()
    plain = plan_memory(g, dims={"N": 1}, search=False, inplace=False)
    searched = plan_memory(g, dims={"N": 1}, inplace=False)
    check_plan(searched)
    assert searched.schedule_source == "search"
    expanded = 128 * 32 * 32 * 4
    assert plain.lower_bound_bytes >= 4 * expanded  # four expansions at once
    assert searched.lower_bound_bytes < 2 * expanded  # one at a time
    assert searched.arena_bytes <= 1.01 * searched.lower_bound_bytes
    # the schedule is the graph's nodes, topologically ordered, and the graph itself is unchanged
    assert [n.name for n in g] == [n.name for n in plain.schedule]
    assert sorted(n.name for n in searched.schedule) == sorted(n.name for n in g)


def test_search_recovers_a_breadth_first_inception():
    g = zoo.breadth_first(zoo.inception(size=64, scale=1.0, classes=10))
    plain = plan_memory(g, dims={"N": 1}, search=False)
    searched = plan_memory(g, dims={"N": 1})
    check_plan(searched)
    assert searched.lower_bound_bytes <= plain.lower_bound_bytes
    assert searched.arena_bytes <= plain.arena_bytes


def _chain():
    g = Graph("chain")
    x = g.add_input("x", "float32", (2, 8))
    a = g.op("Relu", x, name="r1")
    bb = g.op("Exp", a, name="e")
    c = g.op("Reshape", bb, g.add_initializer("shape", np.array([16], dtype=np.int64)), name="flat")
    d = g.op("Neg", c, name="n")
    col = g.op("Reshape", d, g.add_initializer("col_shape", np.array([16, 1], dtype=np.int64)), name="col")
    row = g.op("Reshape", d, g.add_initializer("row_shape", np.array([1, 16], dtype=np.int64)), name="row")
    g.add_output(g.op("MatMul", col, row, name="outer"))
    return g


def test_inplace_chain_shares_one_buffer_and_respects_later_readers():
    g = _chain()
    plan = plan_memory(g, alignment=64)
    check_plan(plan)
    al = plan.allocations
    # Relu's input is a graph input (not in the arena): Relu gets its own buffer; Exp, the reshape and Neg
    # take it over one after the other
    assert al["r1"].shares is None
    assert (al["e"].shares, al["flat"].shares, al["n"].shares) == ("r1", "e", "flat")
    assert len({al[k].offset for k in ("r1", "e", "flat", "n")}) == 1
    # %n is read by two reshapes: the first one cannot take it over (it is still needed), the second can
    shares = {al["col"].shares, al["row"].shares}
    assert shares == {None, "n"}
    # the outer product needs both of its inputs and its own 16x16 output
    assert plan.lower_bound_bytes == 64 + 64 + 1024
    assert plan.arena_bytes == plan.lower_bound_bytes
    off = plan_memory(g, inplace=False)
    check_plan(off)
    assert off.inplace_count == 0 and off.lower_bound_bytes >= plan.lower_bound_bytes


def test_text_form_graph_plans():
    g = parse("""
    graph t(%x: float32[N,4]) {
      %y: float32[N,4] = Relu<r>(%x)
      %z: float32[N,4] = Sigmoid<s>(%y)
      %w: float32[N,4] = Add<a>(%y, %z)
      return %w
    }
    """)
    plan = plan_memory(g, dims={"N": 3}, alignment=16)
    check_plan(plan)
    # %y is still needed by Add when Sigmoid runs: Sigmoid cannot take it over, Add can (both die there)
    assert plan.allocations["z"].shares is None
    assert plan.allocations["w"].shares in ("y", "z")
    assert plan.allocations["y"].shape == (3, 4) and plan.allocations["y"].nbytes == 48
    assert plan.lower_bound_bytes == plan.arena_bytes == 2 * 48


def test_symbolic_dims_must_be_bound():
    g = zoo.resnet50(size=32, width=8, classes=10)
    with pytest.raises(ShapeError, match="'N'"):
        plan_memory(g)
    one = plan_memory(g, dims={"N": 1})
    four = plan_memory(g, dims={"N": 4})
    check_plan(four)
    assert four.allocations[g.outputs[0].name].shape == (4, 10)
    assert 3.5 * one.lower_bound_bytes <= four.lower_bound_bytes <= 4 * one.lower_bound_bytes


def test_opaque_node_without_types_is_refused_by_name():
    g = Graph("opaque")
    x = g.add_input("x", "float32", (2, 3))
    y = g.add_node("MyOp", [x], domain="custom", name="mystery").output
    g.add_output(g.op("Relu", y))
    with pytest.raises(ShapeError, match="mystery"):
        plan_memory(g)
    g2 = Graph("opaque_typed")
    x = g2.add_input("x", "float32", ("N", 3))
    y = g2.add_node("MyOp", [x], domain="custom", name="mystery",
                    output_types=[TensorType("float32", ("N", 3))]).output
    g2.add_output(g2.op("Relu", y))
    plan = plan_memory(g2, dims={"N": 2})
    check_plan(plan)
    assert plan.allocations["mystery"].nbytes == 24


def test_checker_catches_overlap_and_bad_schedules():
    g = zoo.inception(size=32, scale=0.125, classes=10)
    plan = plan_memory(g, dims={"N": 1})
    check_plan(plan)
    # move one value onto another that is live at the same time
    peak = plan.peak_values
    a, b = plan.allocations[peak[0]], plan.allocations[peak[1]]
    bad = replace(plan, allocations=dict(plan.allocations, **{b.value: replace(b, offset=a.offset)}))
    with pytest.raises(VerificationError, match="live together and overlap"):
        check_plan(bad)
    # sharing memory with the input at the node where it dies is only allowed as a recorded hand-over
    victim = next(x for x in plan.allocations.values() if x.shares is not None)
    bad = replace(plan, allocations=dict(plan.allocations, **{victim.value: replace(victim, shares=None)}))
    with pytest.raises(VerificationError, match=victim.value):
        check_plan(bad)
    # a schedule that runs a node before its input's producer
    sched = list(plan.schedule)
    sched[0], sched[1] = sched[1], sched[0]
    with pytest.raises(VerificationError, match="before the producer"):
        check_plan(replace(plan, schedule=sched))
    # out of the arena
    bad = replace(plan, arena_bytes=plan.arena_bytes // 2)
    with pytest.raises(VerificationError, match="outside the arena"):
        check_plan(bad)


def test_summary_and_table(full_plans):
    plan = full_plans["densenet"]
    text = plan.summary()
    assert "arena" in text and "lower bound" in text and "naive" in text and "peak at step" in text
    assert plan.peak_node is not None and plan.peak_node.name in text
    table = format_memory_plan(plan)
    assert table.row_count == 5
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(table)
    out = console.export_text()
    assert f"{plan.arena_bytes / MIB:.2f}" in out and "peak point" in out


def test_bad_alignment():
    with pytest.raises(ValueError, match="power of two"):
        plan_memory(_chain(), alignment=48)


def test_search_defers_value_projection_past_long_attention_softmax():
    # at seq 512 the attention scores dominate: computing V after the softmax keeps it out of the peak
    g = zoo.bert_encoder(seq=512, hidden=128, heads=4, layers=1, vocab=50)
    plain = plan_memory(g, dims={"N": 1}, search=False)
    searched = plan_memory(g, dims={"N": 1})
    check_plan(searched)
    assert searched.schedule_source == "search"
    v_bytes = 512 * 128 * 4
    assert searched.lower_bound_bytes <= plain.lower_bound_bytes - v_bytes
    assert searched.peak_node.op in ("Softmax", "MatMul", "Mul")
