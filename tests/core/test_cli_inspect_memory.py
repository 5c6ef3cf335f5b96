"""`aiacc inspect` shows the memory plan (arena, bounds, naive, peak) and names ops the IR does not know."""
from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from aiacc import cli  # noqa: E402
from aiacc.core.memory import plan_memory  # noqa: E402
from aiacc.core.onnx import load  # noqa: E402


def _write(tmp_path, nodes, inits=(), name="m.onnx"):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=list(inits))
    path = tmp_path / name
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return str(path)


@pytest.fixture
def conv_file(tmp_path):
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    return _write(tmp_path, [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])], [w])


def test_inspect_json_memory_plan_equals_the_planner(conv_file, capsys):
    assert cli.main(["inspect", conv_file, "--bind", "N=2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    plan = plan_memory(load(conv_file), dims={"N": 2})
    assert doc["memory"]["arena_bytes"] == plan.arena_bytes > 0
    assert doc["memory"]["naive_bytes"] == plan.naive_bytes > plan.arena_bytes
    assert doc["memory"]["lower_bound_bytes"] == plan.lower_bound_bytes
    assert doc["memory"]["assumed"] == {} and doc["unknown_ops"] == []


def test_inspect_tables_show_the_plan_and_say_what_was_assumed(conv_file, capsys):
    assert cli.main(["inspect", conv_file]) == 0
    out = capsys.readouterr().out
    for expected in ("memory plan", "arena", "lower bound", "naive", "peak point", "memory plan for N=1"):
        assert expected in out, expected


def test_inspect_names_unknown_default_domain_ops(tmp_path, capsys):
    path = _write(tmp_path, [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NoSuchOp", ["r"], ["y"])])
    assert cli.main(["inspect", path]) == 1  # issue 16: a default-domain op that is not ONNX is an error
    out, err = capsys.readouterr()
    assert "unknown ops (kept opaque, not checked): NoSuchOp" in out
    assert "default (ONNX) domain are unknown: NoSuchOp" in err
    assert cli.main(["inspect", path, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["unknown_ops"] == ["NoSuchOp"]
    assert "error" in doc["memory"]  # an opaque op of unknown output shape: no plan, and it says why
