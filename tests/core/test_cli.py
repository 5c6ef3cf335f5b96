"""The `aiacc` command: inspect, dump, optimize, example, and the dispatch of other frameworks' files."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from aiacc import cli
from aiacc.core import parse
from aiacc.errors import UnsupportedError
from aiacc.plugins import get_plugin
from aiacc.plugins.base import FileReport

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def bert_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "bert.onnx"
    assert cli.main(["example", "bert", "-o", str(path)]) == 0
    return str(path)


def test_inspect_prints_inputs_ops_parameters_flops(bert_file, capsys):
    assert cli.main(["inspect", bert_file, "--bind", "N=1", "--bind", "S=16"]) == 0
    out = capsys.readouterr().out
    for expected in ("input_ids", "int64[N,S]", "last_hidden_state", "float32[N,S,64]", "LayerNormalization",
                     "MatMul", "parameters", "FLOPs (N=1, S=16)", "constant bytes"):
        assert expected in out, expected


def test_inspect_json_numbers(bert_file, capsys):
    from aiacc.core.onnx import load
    from aiacc.core.stats import graph_stats

    assert cli.main(["inspect", bert_file, "--json", "--bind", "S=16"]) == 0
    doc = json.loads(capsys.readouterr().out)
    st = graph_stats(load(bert_file), {"S": 16})
    assert doc["parameters"] == st.parameters > 100_000
    assert doc["flops"] == st.flops > 0
    assert doc["op_histogram"]["LayerNormalization"] == 5
    assert doc["inputs"][0] == {"name": "input_ids", "type": "int64[N,S]"}


def test_inspect_example_with_optimize(capsys):
    pytest.importorskip("aiacc.core.passes")
    assert cli.main(["inspect", "--example", "resnet50", "--optimize", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nodes"] == 175
    assert doc["optimized"]["nodes"] < doc["nodes"]
    assert doc["optimized"]["op_histogram"].get("BatchNormalization", 0) == 0
    assert abs(doc["optimized"]["flops"] - doc["flops"]) < 0.02 * doc["flops"]


def test_dump_text_json_dot(bert_file, tmp_path):
    from aiacc.core.onnx import load
    from aiacc.core.serialize import load as load_json

    g = load(bert_file)
    assert cli.main(["dump", bert_file, "--format", "text", "-o", str(tmp_path / "g.aiacc")]) == 0
    with np.load(tmp_path / "g.npz") as z:
        weights = {k: z[k] for k in z.files}
    assert parse((tmp_path / "g.aiacc").read_text(), weights).equals(g)
    assert cli.load_graph(str(tmp_path / "g.aiacc")).equals(g)
    assert cli.main(["dump", bert_file, "--format", "json", "-o", str(tmp_path / "g.json")]) == 0
    assert load_json(tmp_path / "g.json").equals(g)
    assert cli.main(["dump", bert_file, "--format", "dot", "-o", str(tmp_path / "g.dot")]) == 0
    dot = (tmp_path / "g.dot").read_text()
    assert dot.startswith('digraph "bert_encoder"') and dot.count("[shape=box") == len(g)


def test_optimize_onnx_file(bert_file, tmp_path):
    pytest.importorskip("aiacc.core.passes")
    ort = pytest.importorskip("onnxruntime")
    from aiacc import examples

    out = tmp_path / "fast.onnx"
    assert cli.main(["optimize", bert_file, "-o", str(out), "-q"]) == 0
    feeds = examples.example_feeds("bert", batch=2, seq=8)
    ref = ort.InferenceSession(bert_file, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)
    for r, a in zip(ref, got):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4 * np.abs(r).max())


def test_errors_exit_1_with_message(tmp_path, capsys):
    assert cli.main(["inspect", str(tmp_path / "model.xyz")]) == 1
    assert "unknown model format" in capsys.readouterr().err
    assert cli.main(["inspect", str(tmp_path / "missing.onnx")]) == 1
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf at all")
    assert cli.main(["inspect", str(bad)]) == 1
    assert "not a readable ONNX model" in capsys.readouterr().err


@pytest.mark.parametrize("path, fw", [("net.prototxt", "caffe"), ("model-symbol.json", "mxnet"),
                                      ("model.pt2", "torch"), ("torchvision.models:resnet18", "torch"),
                                      ("model.keras", "tf"), ("model.onnx", "onnx"), ("g.json", "aiacc-json")])
def test_detect_format(path, fw):
    assert cli.detect_format(path) == fw


def test_saved_model_directory(tmp_path):
    (tmp_path / "saved_model.pb").write_bytes(b"")
    assert cli.detect_format(str(tmp_path)) == "tf"
    with pytest.raises(UnsupportedError, match="not a TensorFlow SavedModel"):
        cli.detect_format(str(tmp_path / ".."))


def test_dispatch_to_plugin_files(monkeypatch):
    # other frameworks' files go through the plugin protocol: the plugin's load_file / optimize_file
    calls = []
    report = FileReport("net.prototxt", "caffe", ["out.prototxt", "out.caffemodel"])
    plugin = get_plugin("caffe")
    monkeypatch.setattr(plugin, "load_file", lambda path, **kw: calls.append(("load", path)) or "graph")
    monkeypatch.setattr(plugin, "optimize_file",
                        lambda path, out, **kw: calls.append(("opt", path, out, kw)) or report)
    assert cli.load_graph("net.prototxt") == "graph"
    assert cli.optimize_file("net.prototxt", "out.prototxt", level=1) is report
    assert calls == [("load", "net.prototxt"), ("opt", "net.prototxt", "out.prototxt", {"level": 1})]


def test_optimize_aiacc_text_file_gives_a_file_report_and_prints_the_passes(tmp_path, capsys):
    pytest.importorskip("aiacc.core.passes")
    g = parse("""graph g(%x: float32[2,3]) {
  %i: float32[2,3] = Identity<i>(%x)
  %y: float32[2,3] = Relu<r>(%i)
  return %y
}""")
    src, out = str(tmp_path / "g.aiacc"), str(tmp_path / "o.aiacc")
    cli.write_text(g, src)
    report = cli.optimize_file(src, out, level=1)
    assert isinstance(report, FileReport) and report.framework == "onnx" and report.source == src
    assert report.written == [out, str(tmp_path / "o.npz")] and all(os.path.exists(p) for p in report.written)
    assert report.passes.nodes_before == 2 and report.passes.nodes_after == 1
    assert [n.op for n in report.model] == ["Relu"] and cli.load_graph(out).equals(report.model)
    assert cli.main(["optimize", src, "-o", out]) == 0
    assert "identity_removal" in capsys.readouterr().out


def test_missing_plugin_or_framework_is_a_clear_error(monkeypatch):
    real = importlib.import_module

    def missing(module):
        def import_module(name, *args):
            if name.endswith(".files"):  # the plugin packages themselves import nothing heavy
                raise ModuleNotFoundError(f"No module named {module!r}", name=module)
            return real(name, *args)
        return import_module

    monkeypatch.setattr(importlib, "import_module", missing("aiacc.plugins.caffe.files"))
    with pytest.raises(UnsupportedError, match="reading caffe models needs aiacc.plugins.caffe.files"):
        cli.load_graph("net.prototxt")
    monkeypatch.setattr(importlib, "import_module", missing("mxnet"))
    with pytest.raises(UnsupportedError, match=r"needs the 'mxnet' package \(pip install 'aiacc\[mxnet\]'\)"):
        cli.load_graph("model-symbol.json")


def test_module_entry_point_runs(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = tmp_path / "r.onnx"
    r = subprocess.run([sys.executable, "-m", "aiacc.cli", "example", "bert", "-o", str(out)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "aiacc.cli", "inspect", str(out)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "input_ids" in r.stdout and "Softmax" in r.stdout
