"""MXNet models -> IR: the reference executor on the traced graph reproduces MXNet's outputs."""
import numpy as np
import pytest

import aiacc
from aiacc.core import run
from aiacc.plugins.mxnet.translator import MXNetTranslator

from tests.plugins.mxnet.conftest import rel_err

ZOO_NAMES = ["resnet50_v1", "mobilenet_v2", "bert_encoder", "mlp", "with_opaque", "symbol_ops"]


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_traced_graph_matches_mxnet(zoo, name):
    model, ex = zoo(name)
    g = aiacc.trace(model, ex)
    g.verify()
    out = run(g, {v.name: a for v, a in zip(g.inputs, ex)})
    expected = MXNetTranslator().run(model, ex)
    assert len(out) == len(expected)
    for a, e in zip(out.values(), expected):
        assert a.shape == e.shape
        assert rel_err(a, e) < 1e-4


@pytest.mark.parametrize("name", ["resnet50_v1", "bert_encoder", "mobilenet_v2", "mlp", "symbol_ops"])
def test_no_opaque_nodes(zoo, name):
    model, ex = zoo(name)
    g = aiacc.trace(model, ex)
    assert [n.qualified_op for n in g if n.is_opaque] == []


def test_resnet_graph_shape(zoo):
    model, ex = zoo("resnet50_v1")
    g = aiacc.trace(model, ex)
    hist = g.op_histogram()
    assert hist["Conv"] == 53 and hist["BatchNormalization"] == 53 and hist["Add"] == 16
    assert [v.name for v in g.inputs] == ["data"] and g.inputs[0].shape == (1, 3, 64, 64)
    assert g.outputs[0].shape == (1, 1000)
    # parameter names are Gluon's, so they map back to the block's parameters
    # (the prefix counts the blocks built in the process: resnetv10_, resnetv11_, ... so ask the block)
    assert f"{model.prefix}conv0_weight" in g.initializers
    assert set(g.initializers) <= set(model.collect_params())


def test_unknown_op_stays_opaque_with_its_json(zoo):
    model, ex = zoo("with_opaque")
    g = aiacc.trace(model, ex)
    (node,) = [n for n in g if n.is_opaque]
    assert node.qualified_op == "mxnet::smooth_l1"
    assert node.attrs == {"scalar": "1.5"}
    assert node.meta["mxnet_node"]["op"] == "smooth_l1"
    assert node.output.shape == node.inputs[0].shape  # typed through MXNet's shape inference
    # text form round trip keeps the opaque node
    assert aiacc.core.parse(str(g), {k: v.const for k, v in g.initializers.items()}).equals(g)


def test_bert_uses_attention_ops(zoo):
    model, ex = zoo("bert_encoder")
    g = aiacc.trace(model, ex)
    hist = g.op_histogram()
    # batch_dot -> MatMul, split -> Split, LayerNorm -> LayerNormalization, Embedding -> Gather
    assert hist["MatMul"] == 12 and hist["Split"] == 2 and hist["LayerNormalization"] == 5
    assert hist["Gather"] == 1 and hist["Softmax"] == 2 and hist["Gelu"] == 2
    assert [v.name for v in g.inputs] == ["data0", "data1"]
    assert [tuple(v.shape) for v in g.outputs] == [(2, 8, 32), (2, 32)]


def test_fix_gamma_holds_gamma_at_one(zoo):
    (sym, args, aux), ex = zoo("symbol_ops")
    g = aiacc.trace((sym, args, aux), ex)
    (bn,) = g.find_nodes("BatchNormalization")
    np.testing.assert_array_equal(bn.inputs[1].const, np.ones(8, np.float32))
    assert not np.allclose(args["bn_gamma"].asnumpy(), 1.0)  # the stored gamma is ignored, as in MXNet


def test_symbol_triple_with_dict_inputs(zoo):
    (sym, args, aux), (x,) = zoo("symbol_ops")
    g = aiacc.trace((sym, args, aux), {"data": x})
    assert [v.name for v in g.inputs] == ["data"]
    out = run(g, {"data": x})
    expected = MXNetTranslator().run((sym, args, aux), (x,))
    assert rel_err(list(out.values())[0], expected[0]) < 1e-4
