"""aiacc.optimize on MXNet models: a gluon.SymbolBlock with the original's outputs, which export()s and
re-imports with SymbolBlock.imports; fused ops lowered to MXNet's own ops; opaque nodes back unchanged."""
import json
import os

import numpy as np
import pytest

import aiacc
from aiacc.plugins.mxnet._import import import_mxnet
from aiacc.plugins.mxnet.translator import MXNetTranslator

from tests.plugins.mxnet.conftest import rel_err

mx = import_mxnet()
ZOO_NAMES = ["resnet50_v1", "mobilenet_v2", "bert_encoder", "mlp", "with_opaque", "symbol_ops"]


def _check_same(out, expected):
    assert len(out) == len(expected)
    for a, e in zip(out, expected):
        assert a.shape == e.shape
        assert rel_err(a, e) < 1e-4


@pytest.mark.parametrize("level", [0, 2])
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_optimize_and_reimport(zoo, name, level, tmp_path):
    model, ex = zoo(name)
    t = MXNetTranslator()
    expected = t.run(model, ex)
    fast = aiacc.optimize(model, ex, level=level)
    assert isinstance(fast, mx.gluon.SymbolBlock)
    out = t.run(fast, ex)
    _check_same(out, expected)
    # export, re-import with Gluon's own loader, same outputs (the re-imported block runs MXNet's plain
    # kernels, `fast` MKLDNN's fused ones where available: equal up to float rounding)
    fast.export(str(tmp_path / "m"))
    names = [v.name for v in fast.aiacc_graph.inputs]
    again = mx.gluon.SymbolBlock.imports(str(tmp_path / "m-symbol.json"), names, str(tmp_path / "m-0000.params"))
    again_out = t.run(again, ex)
    assert len(again_out) == len(out)
    for a, b in zip(again_out, out):
        assert a.shape == b.shape and rel_err(a, b) < 1e-5


def _exported_ops(block_dir, prefix="m"):
    with open(os.path.join(block_dir, f"{prefix}-symbol.json")) as f:
        return [n for n in json.load(f)["nodes"] if n["op"] != "null"]


def test_resnet_lowered_to_folded_convolution_and_activation(zoo, tmp_path):
    model, ex = zoo("resnet50_v1")
    fast = aiacc.optimize(model, ex, level=2)
    fast.export(str(tmp_path / "m"))
    ops = [n["op"] for n in _exported_ops(tmp_path)]
    assert "BatchNorm" not in ops  # folded into the convolution weights
    assert ops.count("Convolution") == 53
    assert ops.count("Activation") == 49 and ops.count("elemwise_add") == 16
    assert ops.count("FullyConnected") == 1


def test_opaque_node_comes_back_unchanged(zoo, tmp_path):
    model, ex = zoo("with_opaque")
    fast = aiacc.optimize(model, ex, level=2)
    fast.export(str(tmp_path / "m"))
    (l2,) = [n for n in _exported_ops(tmp_path) if n["op"] == "smooth_l1"]
    original = [n for n in json.loads(model(mx.sym.var("data")).tojson())["nodes"] if n["op"] == "smooth_l1"]
    assert l2["name"] == original[0]["name"] and l2["attrs"] == original[0]["attrs"]


def test_bert_dense_layers_become_fully_connected(zoo, tmp_path):
    model, ex = zoo("bert_encoder")
    fast = aiacc.optimize(model, ex, level=2)
    fast.export(str(tmp_path / "m"))
    ops = [n["op"] for n in _exported_ops(tmp_path)]
    # 2 layers x (qkv, proj, ffn1, ffn2) + pooler: MatMul + bias on a constant weight -> FullyConnected
    assert ops.count("FullyConnected") == 9
    assert ops.count("batch_dot") == 4 and ops.count("LayerNorm") == 5 and "Embedding" in ops


def test_symbol_triple_returns_symbol_block(zoo):
    triple, ex = zoo("symbol_ops")
    fast = aiacc.optimize(triple, ex, level=2)
    assert isinstance(fast, mx.gluon.SymbolBlock)
    _check_same(MXNetTranslator().run(fast, ex), MXNetTranslator().run(triple, ex))


def test_export_of_a_traced_graph_via_aiacc_export(zoo):
    model, ex = zoo("mlp")
    g = aiacc.trace(model, ex)
    block = aiacc.export(g, "mxnet")
    _check_same(MXNetTranslator().run(block, ex), MXNetTranslator().run(model, ex))


def test_debug_mode_checks_numerics_per_pass(zoo):
    model, ex = zoo("bert_encoder")
    fast = aiacc.optimize(model, ex, level=2, debug=True)
    assert fast.aiacc_report is not None
    _check_same(MXNetTranslator().run(fast, ex), MXNetTranslator().run(model, ex))


def test_bare_symbol_with_params_keyword(zoo):
    (sym, args, aux), ex = zoo("symbol_ops")
    g = aiacc.trace(sym, ex, arg_params=args, aux_params=aux)
    assert not [n for n in g if n.is_opaque]
