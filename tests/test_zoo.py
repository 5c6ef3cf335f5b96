"""aiacc.zoo (the bundled models): every framework's builders give the documented forms, deterministic
weights and inputs, and run; small sizes keep it quick."""
from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from aiacc import zoo
from aiacc.demo import runner

SMALL = {"mobilenet_v2": {"size": 32}, "resnet50": {"size": 32},
         "bert_encoder": {"seq": 8, "vocab": 50, "hidden": 16, "heads": 2, "layers": 1, "ffn": 32}}
OUT_SHAPES = {"mobilenet_v2": [(2, 1000)], "resnet50": [(2, 1000)], "bert_encoder": [(2, 8, 16), (2, 16)]}
CASES = [(fw, m) for fw in ("torch", "tf", "mxnet", "caffe", "onnx") for m in zoo.MODELS
         if zoo.has(fw, m) and not (fw == "tf" and m == "resnet50")]  # keras ResNet50 alone takes ~10 s


def test_importing_the_zoo_imports_no_framework():
    code = ("import sys, aiacc.zoo, aiacc.zoo.small, aiacc.zoo.ir_models, aiacc.examples; "
            "print(any(m in sys.modules for m in ('torch', 'tensorflow', 'mxnet', 'onnx')))")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("framework, name", CASES)
def test_builders_run_and_are_deterministic(framework, name):
    if not zoo.installed(framework) or (framework == "onnx" and importlib.util.find_spec("onnxruntime") is None):
        pytest.skip(f"{framework} not installed")
    model, inputs = zoo.build(framework, name, batch=2, **SMALL[name])
    out = runner(framework, model, inputs)()
    expected = OUT_SHAPES[name][:1] if framework == "caffe" else OUT_SHAPES[name]
    assert [o.shape for o in out] == expected
    assert all(np.isfinite(o).all() for o in out)
    model2, inputs2 = zoo.build(framework, name, batch=2, **SMALL[name])
    flat = inputs.values() if isinstance(inputs, dict) else (inputs if isinstance(inputs, tuple) else (inputs,))
    flat2 = inputs2.values() if isinstance(inputs2, dict) else (inputs2 if isinstance(inputs2, tuple) else (inputs2,))
    for a, b in zip(flat, flat2):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(out, runner(framework, model2, inputs2)()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_caffe_resnet50_has_the_reference_layout():
    model, inputs = zoo.build("caffe", "resnet50", size=32)
    types = model.layer_types
    assert types.count("Convolution") == 53 and types.count("BatchNorm") == 53 and types.count("Scale") == 53
    assert types.count("Eltwise") == 16 and model.outputs == ["prob"] and list(inputs) == ["data"]


def test_one_catalogue_under_one_set_of_names():
    """The example files, the ONNX zoo and the test zoo build from the same builders; "bert" is an alias of
    the catalogue's bert_encoder wherever a model name is taken."""
    from aiacc import examples
    from aiacc.errors import UnsupportedError
    from aiacc.zoo import onnx_models, small

    assert examples.resnet50_onnx is onnx_models.resnet50_onnx
    assert examples.bert_encoder_onnx is onnx_models.bert_encoder_onnx
    assert zoo.canonical_name("bert") == "bert_encoder" and zoo.has("onnx", "bert")
    for a, b in zip(examples.example_feeds("bert", batch=2, seq=8).values(),
                    examples.example_feeds("bert_encoder", batch=2, seq=8).values()):
        np.testing.assert_array_equal(a, b)
    kw = dict(batch=1, seq=8, vocab=50, hidden=16, heads=2, layers=1, ffn=32)
    assert zoo.build("onnx", "bert", **kw)[0] == zoo.build("onnx", "bert_encoder", **kw)[0]
    assert small.module("caffe").OPENCV_MODELS == tuple(small.module("caffe").PROTOTXTS)
    with pytest.raises(UnsupportedError, match="no test-size models for 'onnx'"):
        small.module("onnx")


def test_example_files_are_written_under_either_name(tmp_path):
    """write_example takes an example's name or its catalogue name and writes the same model."""
    import onnx

    from aiacc import examples
    from aiacc.errors import UnsupportedError

    examples.write_example("bert", tmp_path / "a.onnx")
    examples.write_example("bert_encoder", tmp_path / "b.onnx")
    assert onnx.load(tmp_path / "a.onnx") == onnx.load(tmp_path / "b.onnx")
    with pytest.raises(UnsupportedError, match="unknown example 'gpt'"):
        examples.write_example("gpt", tmp_path / "c.onnx")
