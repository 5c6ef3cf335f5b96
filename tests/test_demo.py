"""`aiacc demo`: the helpers it shares with the benchmark, and a small end-to-end run on Caffe (no heavy
framework import) whose table shows the numeric check passing for both backends."""
from __future__ import annotations

import numpy as np
import pytest

from aiacc import zoo
from aiacc.cli import main
from aiacc.demo import demo_one, max_rel_error, time_interleaved, to_numpy_list
from aiacc.errors import UnsupportedError


def test_max_rel_error_is_relative_to_each_outputs_scale():
    e = [np.array([100.0, -200.0], np.float32), np.array([1.0, 0.5], np.float32)]
    a = [np.array([100.02, -200.0], np.float32), np.array([1.0, 0.5001], np.float32)]
    assert max_rel_error(e, a) == pytest.approx(1e-4, rel=1e-2)  # output 1: 1e-4 / 1.0 beats 0.02 / 200
    assert max_rel_error(e, a[:1]) == float("inf")
    assert max_rel_error([np.ones(3)], [np.ones(4)]) == float("inf")
    assert max_rel_error([np.ones(3)], [np.array([1.0, np.nan, 1.0])]) == float("inf")
    assert max_rel_error([np.arange(3)], [np.arange(3)]) == 0.0


def test_time_interleaved_runs_round_robin():
    calls = []
    times = time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, iters=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert [len(v) for v in times.values()] == [3, 3]


def test_to_numpy_list_flattens_nested_outputs():
    out = to_numpy_list({"x": np.zeros(2), "y": (np.ones(1), [np.full(3, 2.0)])})
    assert [a.shape for a in out] == [(2,), (1,), (3,)]


def test_demo_one_caffe_both_backends():
    # 64: at 32 the last stages are 1x1, where OpenCV dnn departs (by 0.4 relative)
    # from aiacc's executor and onnxruntime, which agree
    res = demo_one("caffe", "mobilenet_v2", size=64, iters=2, warmup=0)
    assert not res.failed, res.failed
    assert set(res.ms) == {"native", "onnxruntime"} and res.original_ms > 0
    assert all(e <= 1e-4 for e in res.error.values()) and res.passed
    assert res.nodes_after < res.nodes_before


def test_cli_demo_prints_the_table(capsys):
    rc = main(["demo", "--frameworks", "caffe", "--models", "resnet50,bert_encoder", "--size", "32",
               "--iters", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "skipped bert_encoder for caffe" in out
    row = [line for line in out.splitlines() if "resnet50" in line and "caffe" in line]
    assert len(row) == 2 and "pass" in row[1]  # the progress line, then the table row


def test_cli_demo_rejects_unknown_names(capsys):
    assert main(["demo", "--models", "vgg16"]) == 1
    assert "unknown model 'vgg16'" in capsys.readouterr().err


def test_zoo_refuses_what_a_framework_cannot_express():
    with pytest.raises(UnsupportedError, match="no bert_encoder for caffe"):
        zoo.build("caffe", "bert_encoder")
    with pytest.raises(UnsupportedError, match="unknown framework 'jax'"):
        zoo.module("jax")


def test_runner_and_install_hints_come_from_the_plugin(monkeypatch):
    from aiacc import demo
    from aiacc.plugins import get_plugin

    plugin = get_plugin("caffe")
    monkeypatch.setattr(plugin, "runner", lambda model, inputs: lambda: [np.asarray(inputs["data"]) * 2])
    assert demo.runner("caffe", object(), {"data": np.ones(2)})()[0].tolist() == [2.0, 2.0]
    monkeypatch.setattr(zoo, "installed", lambda fw: False)
    assert demo.framework_available("caffe") == f"not installed ({plugin.install_hint})"
    assert demo.framework_available("mxnet") == "not installed (pip install 'aiacc[mxnet]')"
