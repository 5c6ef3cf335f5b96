"""`aiacc inspect/dump` inputs for PyTorch: torch.export .pt2 files and package.module:factory references."""
from __future__ import annotations

import pytest
import torch

from aiacc.errors import ParseError
from aiacc.plugins.torch.files import load_graph, optimize_file
from tests.zoo.torch_models import mlp


def factory():
    return mlp()


def test_factory_reference(tmp_path):
    graph = load_graph("tests.zoo.torch_models:resnet18")
    assert not [n for n in graph if n.is_opaque] and graph.find_nodes("Conv")
    out = tmp_path / "mlp.pt"
    fast = optimize_file("tests.zoo.torch_models:mlp", out).model  # a FileReport; .model: the optimized module
    loaded = torch.load(out, weights_only=False)
    model, (x,) = mlp()
    with torch.no_grad():
        assert torch.allclose(loaded(x)[0], model(x)[0], rtol=1e-5, atol=1e-6)
        assert torch.allclose(fast(x)[0], model(x)[0], rtol=1e-5, atol=1e-6)


def test_pt2_file(tmp_path):
    model, (x,) = mlp()
    path = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(model, (x,)), path)
    graph = load_graph(str(path))
    assert graph.find_nodes("LayerNormalization") and len(graph.outputs) == 2
    from aiacc.core import run

    out = run(graph, {graph.inputs[0].name: x.numpy()})
    with torch.no_grad():
        expected = model(x)[0].numpy()
    assert abs(list(out.values())[0] - expected).max() <= 1e-5 * abs(expected).max()


def test_bad_references():
    with pytest.raises(ParseError, match="no such file"):
        load_graph("missing.pt2")
    with pytest.raises(ParseError, match="cannot import"):
        load_graph("tests.zoo.torch_models:nope")


def test_pt2_conv_net_has_no_opaque_nodes(tmp_path):
    from tests.zoo.torch_models import resnet18

    model, (x,) = resnet18()
    path = tmp_path / "r18.pt2"
    torch.export.save(torch.export.export(model, (x,)), path)
    graph = load_graph(str(path))
    assert [n.qualified_op for n in graph if n.is_opaque] == []
    assert len(graph.find_nodes("BatchNormalization")) == 20
