"""`aiacc inspect MODEL` shows the memory plan: naive, lower bound, arena, the peak point of the schedule and
the values live there; with --optimize the plan before and after optimization."""
from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from aiacc import cli  # noqa: E402
from aiacc.core.memory import plan_memory  # noqa: E402
from aiacc.core.onnx import load  # noqa: E402
from aiacc.core.passes import run_passes  # noqa: E402


@pytest.fixture
def model_file(tmp_path):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    scale, bias, mean = (numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), n)
                         for n in ("s", "b", "m"))
    var = numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "v")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[w, scale, bias, mean, var])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return str(path)


def test_tables_show_peak_values_and_before_and_after(model_file, capsys):
    assert cli.main(["inspect", model_file]) == 0
    out = capsys.readouterr().out
    for expected in ("arena", "lower bound", "naive", "peak point", "live at peak"):
        assert expected in out, expected
    plan = plan_memory(load(model_file))
    assert all(f"%{v}" in out for v in plan.peak_values)  # the values live at the peak, by name
    assert cli.main(["inspect", model_file, "--optimize"]) == 0
    out = capsys.readouterr().out
    assert "memory plan before optimization" in out and "memory plan after optimization" in out
    assert out.count("live at peak") == 2


def test_json_has_both_plans_and_the_peak_values(model_file, capsys):
    assert cli.main(["inspect", model_file, "--optimize", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    before = plan_memory(load(model_file))
    after_graph = load(model_file)
    run_passes(after_graph, level=2)
    after = plan_memory(after_graph)
    assert doc["memory_before"]["arena_bytes"] == before.arena_bytes
    assert doc["memory_before"]["peak_values"] == before.peak_values
    assert doc["memory"]["naive_bytes"] == after.naive_bytes < before.naive_bytes  # BN folded: fewer values
    assert doc["memory"]["peak_node"] == after.peak_node.name
