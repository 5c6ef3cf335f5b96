"""The plugin protocol (aiacc.plugins.base.Plugin): every plugin package has the same shape, detection asks
each plugin's detect, the base dispatches the export backends (with providers), verifies with the one
comparator, and optimize_file returns one report type."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import aiacc
from aiacc.core import parse, run
from aiacc.errors import UnsupportedError, VerificationError
from aiacc.plugins import FRAMEWORKS, framework_of, get_plugin, load_plugin
from aiacc.plugins.base import FileReport, Plugin

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROTOCOL = ("detect", "trace", "export_native", "export_onnxruntime", "run")
TEXT = """graph g(%x: float32[2,3]) {
  %i: float32[2,3] = Identity<i>(%x)
  %y: float32[2,3] = Relu<r>(%i)
  return %y
}"""


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_every_plugin_package_has_the_same_shape(name):
    mod = load_plugin(name)
    assert {"plugin", "trace", "optimize", "export"} <= set(mod.__all__)
    plugin = mod.plugin
    assert isinstance(plugin, Plugin) and plugin.name == name and get_plugin(name) is plugin
    assert (mod.trace, mod.optimize, mod.export) == (plugin.trace, plugin.optimize, plugin.export)
    for method in PROTOCOL:  # each plugin implements the framework-specific half itself
        assert getattr(type(plugin), method) is not getattr(Plugin, method), (name, method)
    # the backend dispatch is the base's, written once
    assert type(plugin).export is Plugin.export
    assert plugin.install_hint and plugin.title != "?"


def test_plugin_packages_and_detection_import_no_framework():
    code = ("import sys, json; import aiacc.plugins as P\n"
            "for n in P.FRAMEWORKS: P.load_plugin(n)\n"
            "try: P.framework_of(object())\n"
            "except Exception as e: err = type(e).__name__\n"
            "print(json.dumps({'err': err, 'mods': sorted({m.split('.')[0] for m in sys.modules})}))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["err"] == "UnsupportedError"
    heavy = {"torch", "tensorflow", "keras", "mxnet", "onnx", "onnxruntime", "cv2", "google"}
    assert not heavy & set(doc["mods"]), heavy & set(doc["mods"])


def test_framework_of_asks_each_plugins_detect(monkeypatch):
    marker = object()
    with pytest.raises(UnsupportedError, match="does not know what framework a builtins.object"):
        framework_of(marker)
    caffe = get_plugin("caffe")
    monkeypatch.setattr(caffe, "detect", lambda model: model is marker)
    assert framework_of(marker) == "caffe"


class Recording(Plugin):
    """A plugin whose 'models' are IR graphs run on the reference executor; it records its exporters."""

    name = "recording"
    title = "Recording"

    def __init__(self, drift: float = 0.0, dtype: str | None = None):
        self.calls: list[tuple] = []
        self.drift, self.dtype = drift, dtype

    def detect(self, model):
        return False

    def trace(self, model, example_inputs=None, **options):
        return model.copy()

    def export_native(self, graph, *, original=None, **options):
        self.calls.append(("native", sorted(options)))
        return ("exported", graph)

    def export_onnxruntime(self, graph, *, original=None, providers=None, **options):
        self.calls.append(("onnxruntime", providers, sorted(options)))
        return ("exported", graph)

    def feeds(self, graph, example_inputs):
        return {"x": example_inputs}

    def run(self, model, example_inputs):
        exported = isinstance(model, tuple)
        graph = model[1] if exported else model
        outs = run(graph, {"x": example_inputs})
        outs = [outs[v.name] for v in graph.outputs]
        if exported:
            outs = [o + np.asarray(self.drift, o.dtype) for o in outs]
            if self.dtype:
                outs = [o.astype(self.dtype) for o in outs]
        return outs


def test_the_base_dispatches_the_backends_and_passes_providers_on():
    p = Recording()
    g = parse(TEXT)
    assert p.export(g) == ("exported", g)
    assert p.export(g, backend="onnxruntime", providers=["CPUExecutionProvider"], original=g, name="n") == \
        ("exported", g)
    assert p.calls == [("native", []), ("onnxruntime", ["CPUExecutionProvider"], ["name"])]
    with pytest.raises(UnsupportedError, match="the Recording plugin has no backend 'tensorrt'"):
        p.export(g, backend="tensorrt")


def test_optimize_passes_providers_to_the_onnxruntime_exporter_and_verifies():
    p = Recording()
    x = np.array([[-1, 2, 3], [4, -5, 6]], np.float32)
    out = p.optimize(parse(TEXT), x, level=1, backend="onnxruntime", providers=["CUDAExecutionProvider"])
    assert p.calls == [("onnxruntime", ["CUDAExecutionProvider"], [])]
    assert [n.op for n in out[1]] == ["Relu"]  # the passes ran before the export


def test_verification_uses_the_one_comparator():
    x = np.array([[-1, 2, 3], [4, -5, 6]], np.float32)
    with pytest.raises(VerificationError, match=r"aiacc.optimize \(recording, backend=native\): output 0 differs by "
                                                r"0.01 .*every pass preserves numerics"):
        Recording(drift=0.01).optimize(parse(TEXT), x, level=1)
    with pytest.raises(VerificationError, match="output 0 has dtype float64 instead of float32"):
        Recording(dtype="float64").optimize(parse(TEXT), x, level=1)
    # a NaN the original computes is no error of the optimization
    nan = np.array([[np.nan, 2, 3], [4, -5, 6]], np.float32)
    Recording().optimize(parse(TEXT), nan, level=1)


def test_optimize_file_of_an_onnx_file_is_a_file_report(tmp_path):
    from aiacc.core.onnx import load, save

    src, out = str(tmp_path / "g.onnx"), str(tmp_path / "fast.onnx")
    save(parse(TEXT), src)
    report = get_plugin("onnx").optimize_file(src, out, level=1)
    assert isinstance(report, FileReport)
    assert (report.source, report.framework, report.written) == (src, "onnx", [out])
    assert report.passes.nodes_before == 2 and report.passes.nodes_after == 1
    assert load(out).equals(report.model) and [n.op for n in report.model] == ["Relu"]
    assert get_plugin("onnx").load_file(out).equals(report.model)


NET = """name: "tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 dim: 6 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 3 kernel_size: 3 pad: 1 } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "drop" type: "Dropout" bottom: "conv" top: "conv" }
"""


def test_optimize_file_of_a_caffe_net_is_a_file_report(tmp_path):
    from aiacc.plugins.caffe import CaffeModel

    prototxt = str(tmp_path / "tiny.prototxt")
    CaffeModel.from_text(NET).fill_random().save(prototxt, str(tmp_path / "tiny.caffemodel"))
    report = get_plugin("caffe").optimize_file(prototxt, str(tmp_path / "out" / "fast.prototxt"))
    assert isinstance(report, FileReport) and report.framework == "caffe" and report.source == prototxt
    assert report.written == [str(tmp_path / "out" / "fast.prototxt"), str(tmp_path / "out" / "fast.caffemodel")]
    assert all(os.path.exists(p) for p in report.written)
    assert isinstance(report.model, CaffeModel) and report.passes is report.model.aiacc_report
    assert "Dropout" not in report.model.layer_types and report.passes.nodes_after < report.passes.nodes_before


def test_aiacc_export_goes_to_the_named_plugin():
    g = parse(TEXT)
    model = aiacc.export(g, "onnx")
    assert framework_of(model) == "onnx"
    with pytest.raises(UnsupportedError, match="unknown framework 'jax'"):
        aiacc.export(g, "jax")
