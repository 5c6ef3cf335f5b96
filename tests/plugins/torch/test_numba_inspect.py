"""`aiacc inspect --optimize --level 3` shows, per FusedElementwise node, the choice the torch native export
makes for it (numba op, convolution post-op or level 2's torch ops), measured at inspect time."""
from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("torch")
pytest.importorskip("numba")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from aiacc import cli  # noqa: E402


def test_inspect_optimize_shows_the_measured_kept_dropped_notes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AIACC_CACHE_DIR", str(tmp_path))
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[w])
    path = tmp_path / "silu.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    assert cli.main(["inspect", str(path), "--optimize", "--level", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rec = next(r for r in doc["passes"]["passes"] if r["name"] == "elementwise_fusion")
    notes = [n for n in rec["notes"] if "as the torch native export would choose" in n and "as a whole" not in n]
    assert len(notes) == 1, rec["notes"]
    assert (": kept: conv epilogue swish " in notes[0] or ": kept: numba " in notes[0]
            or ": dropped: " in notes[0]), notes
    assert cli.main(["inspect", str(path), "--optimize", "--level", "3"]) == 0
    assert "as the torch native export would choose" in capsys.readouterr().out
    # the whole-network guard's verdict is shown as the export would reach it (timed now; faked here)
    from aiacc.plugins.torch import level3_guard

    monkeypatch.setattr(level3_guard, "graph_note", lambda graph: "kept 0.90x of level 2 (measured now)")
    assert cli.main(["inspect", str(path), "--optimize", "--level", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rec = next(r for r in doc["passes"]["passes"] if r["name"] == "elementwise_fusion")
    assert "level 3 as a whole: kept 0.90x of level 2 (measured now)" in rec["notes"], rec["notes"]
