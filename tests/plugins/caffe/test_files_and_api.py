"""The plugin API (aiacc.trace / aiacc.optimize on a CaffeModel) and the CLI's file entry points."""
import numpy as np

import aiacc
from aiacc import cli
from aiacc.core.ir import Graph
from aiacc.plugins.caffe import CaffeModel
from aiacc.plugins.caffe.files import load_graph, optimize_file
from tests.zoo import caffe_models as zoo


def test_trace_and_optimize_dispatch_on_a_caffe_model():
    model = zoo.build("resnet")
    g = aiacc.trace(model)
    assert isinstance(g, Graph) and g.meta["framework"] == "caffe"
    # each BatchNorm + Scale pair is one BatchNormalization
    bns = g.find_nodes("BatchNormalization")
    assert len(bns) == 3 and all(u.op != "Mul" for bn in bns for u in bn.output.users())
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    fast = aiacc.optimize(model, {"data": x})
    assert isinstance(fast, CaffeModel)
    np.testing.assert_allclose(fast.forward(data=x)["prob"], model.forward(data=x)["prob"], rtol=1e-4, atol=1e-6)
    # level 0 only translates and gives the same layers back
    same = aiacc.optimize(model, x, level=0)
    assert same.layer_types == ["Input"] + model.layer_types


def test_load_graph_finds_the_caffemodel_beside_the_prototxt(tmp_path):
    model = zoo.build("alexnet")
    prototxt, _ = zoo.write(model, str(tmp_path), "alex")
    g = load_graph(prototxt)
    assert g.equals(model.graph)
    assert cli.load_graph(prototxt).equals(model.graph)


def test_optimize_file_writes_both_files(tmp_path):
    prototxt, _ = zoo.write(zoo.build("lenet"), str(tmp_path), "lenet")
    out = tmp_path / "out" / "fast.prototxt"
    report = optimize_file(prototxt, str(out))
    assert report is not None
    fast = CaffeModel.load(out, tmp_path / "out" / "fast.caffemodel")
    assert "Dropout" not in fast.layer_types
    x = np.random.default_rng(0).standard_normal((2, 1, 28, 28)).astype(np.float32)
    original = CaffeModel.load(prototxt, tmp_path / "lenet.caffemodel")
    np.testing.assert_allclose(fast.forward(data=x)["prob"], original.forward(data=x)["prob"], rtol=1e-4, atol=1e-6)


def test_cli_inspect_dump_and_optimize_a_prototxt(tmp_path, capsys):
    prototxt, _ = zoo.write(zoo.build("squeezenet"), str(tmp_path), "sq")
    assert cli.main(["inspect", prototxt]) == 0
    assert "Conv" in capsys.readouterr().out
    assert cli.main(["dump", prototxt]) == 0
    text = capsys.readouterr().out
    assert "Split<slice>" in text and "Concat<fire2/concat>" in text
    assert cli.main(["optimize", prototxt, "-o", str(tmp_path / "o.prototxt"), "-q"]) == 0
    assert CaffeModel.load(tmp_path / "o.prototxt", tmp_path / "o.caffemodel").outputs == ["prob", "side"]


def test_an_intermediate_graph_output_survives_export():
    # %c is a graph output that a later node also reads: Caffe would not list it as a net output, so the
    # exported CaffeModel names its outputs explicitly
    from aiacc.core import parse

    g = parse("""
    graph g(%x: float32[1,2,4,4]) {
      %w: float32[2,2,1,1] = const [1.0, 0.5, -0.5, 2.0]
      %c: float32[1,2,4,4] = Conv<c>(%x, %w)
      %r: float32[1,2,4,4] = Relu<r>(%c)
      %s: float32[1,2,4,4] = Sigmoid<s>(%c)
      return %r, %c, %s
    }""")
    model = aiacc.plugins.caffe.export(g)
    assert model.outputs == ["r", "c", "s"]
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32)
    expected = aiacc.core.run(g, {"x": x})
    got = model.forward(x=x)
    for k in ("r", "c", "s"):
        np.testing.assert_allclose(got[k], expected[k], rtol=1e-6, atol=1e-6)
    # ReLU did not overwrite %c in place: the conv output is still needed
    assert list(model.layer("r").top) == ["r"]
