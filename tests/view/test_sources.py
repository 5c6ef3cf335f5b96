"""The framework layer each node came from: every importer records node.meta["source"] (torch: the module's
qualified name or the call and its module, TF: the op name, MXNet: the symbol node, Caffe: the layer), the
rewrite engine carries them to fused nodes (meta["sources"]), and the view's node panel shows them."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from aiacc.core.passes import run_passes


def _torch_net():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(8, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x))) + x

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.block = Block()
            self.head = nn.Linear(8, 4)

        def forward(self, x):
            return self.head(self.block(self.stem(x)).mean((2, 3)))

    torch.manual_seed(0)
    return Net().eval(), (torch.randn(1, 3, 16, 16),)


def test_torch_nodes_name_their_module_or_call():
    import aiacc

    model, x = _torch_net()
    g = aiacc.trace(model, x)
    src = {n.name: n.meta.get("source") for n in g}
    assert all(src.values()), src
    by_op = {n.op: n.meta["source"] for n in g}
    assert by_op["Gemm"] == "head (Linear)"
    assert by_op["BatchNormalization"] == "block.bn (BatchNorm2d)"
    assert sorted(n.meta["source"] for n in g if n.op == "Conv") == ["block.conv (Conv2d)", "stem (Conv2d)"]
    # a function call inside a module's forward names the module too
    assert by_op["Relu"] == "block (Block): relu (torch.relu)"
    assert by_op["Add"] == "block (Block): add (operator.add)"


def test_fused_nodes_carry_the_sources_of_what_they_replaced():
    import aiacc

    model, x = _torch_net()
    g = aiacc.trace(model, x)
    run_passes(g, level=2)
    fused = [n for n in g if n.domain == "aiacc" and n.meta.get("replaced")]
    assert fused
    conv = next(n for n in fused if "block_conv" in n.meta["replaced"])
    assert {"block.conv (Conv2d)", "block.bn (BatchNorm2d)", "block (Block): relu (torch.relu)"} <= \
        set(conv.meta["sources"])


def test_tf_nodes_name_their_op():
    tf = pytest.importorskip("tensorflow")
    import aiacc

    inp = tf.keras.Input((8, 8, 3))
    y = tf.keras.layers.Conv2D(4, 3, padding="same", name="conv_a")(inp)
    y = tf.keras.layers.ReLU(name="relu_a")(y)
    y = tf.keras.layers.Dense(5, name="dense_a")(tf.keras.layers.GlobalAveragePooling2D(name="gap")(y))
    g = aiacc.trace(tf.keras.Model(inp, y), np.zeros((1, 8, 8, 3), np.float32))
    assert all(n.meta.get("source") for n in g)
    conv = next(n for n in g if n.op == "Conv")
    assert re.fullmatch(r".*conv_a[^/]*/convolution \(Conv2D\)", conv.meta["source"]), conv.meta["source"]
    assert re.fullmatch(r".*dense_a[^/]*/MatMul \(MatMul\)", next(n for n in g if n.op == "MatMul").meta["source"])
    assert "relu_a" in next(n for n in g if n.op == "Relu").meta["source"]


def test_mxnet_nodes_name_their_symbol_node():
    try:
        from aiacc.plugins.mxnet._import import import_mxnet

        mx = import_mxnet()
    except Exception as e:  # noqa: BLE001 - MXNet missing or unloadable here
        pytest.skip(f"mxnet unavailable: {e}")
    import aiacc

    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3, padding=1), mx.gluon.nn.BatchNorm(), mx.gluon.nn.Activation("relu"),
            mx.gluon.nn.Dense(3))
    net.initialize()
    x = mx.nd.zeros((1, 3, 8, 8))
    net(x)
    g = aiacc.trace(net, x)
    src = {n.op: n.meta.get("source") for n in g}
    assert re.fullmatch(r"conv\d+_fwd \(Convolution\)", src["Conv"]), src
    assert re.fullmatch(r"batchnorm\d+_fwd \(BatchNorm\)", src["BatchNormalization"]), src
    assert re.fullmatch(r"dense\d+_fwd \(FullyConnected\)", src["Gemm"]), src


def test_caffe_nodes_name_their_layer():
    from google.protobuf import text_format

    import aiacc.plugins.caffe.import_ops  # noqa: F401  (the layer translators)
    from aiacc.plugins.caffe.importer import import_net
    from aiacc.plugins.caffe.proto import array_to_blob
    from aiacc.plugins.caffe.schema import pb

    net = text_format.Parse("""
        name: "n" input: "data" input_shape { dim: 1 dim: 3 dim: 8 dim: 8 }
        layer { name: "c1" type: "Convolution" bottom: "data" top: "c1"
                convolution_param { num_output: 4 kernel_size: 3 } }
        layer { name: "r1" type: "ReLU" bottom: "c1" top: "c1" }
    """, pb.NetParameter())
    rng = np.random.default_rng(0)
    for a in (rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)):
        array_to_blob(a.astype(np.float32), net.layer[0].blobs.add())
    g = import_net(net)
    assert {n.op: n.meta["source"] for n in g} == {"Conv": "c1 (Convolution)", "Relu": "r1 (ReLU)"}


def _page_data(page: str) -> dict:
    m = re.search(r'<script id="aiacc-data" type="application/json">(.*?)</script>', page, re.S)
    assert m, "the page embeds its data"
    return json.loads(m.group(1))


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is missing: apt-get install graphviz")
def test_the_page_has_each_nodes_layers(tmp_path):
    import aiacc

    model, x = _torch_net()
    out = aiacc.view(model, x, optimize=True, output=tmp_path / "net.html")
    data = _page_data(out.read_text())
    before = {f["name"]: f for f in data["graphs"]["before"]["nodes"].values()}
    assert before["head"]["source"] == "head (Linear)" and before["head"]["sources"] == ["head (Linear)"]
    after = [f for f in data["graphs"]["after"]["nodes"].values() if f["fused_from"]]
    conv = next(f for f in after if "block_conv" in f["fused_from"])
    assert {"block.conv (Conv2d)", "block.bn (BatchNorm2d)"} <= set(conv["sources"])
