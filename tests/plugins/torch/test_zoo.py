"""Every zoo model through aiacc.optimize: inference outputs and training gradients equal the original's."""
from __future__ import annotations

import copy

import pytest
import torch

import aiacc
from tests.plugins.torch._helpers import assert_close_rel, assert_same_training_step
from tests.zoo.torch_models import ZOO

torch.set_num_threads(2)


@pytest.mark.parametrize("level", [0, 2])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_eval_outputs_equal(name, level):
    model, inputs = ZOO[name]()
    fast = aiacc.optimize(model, inputs, level=level)
    assert isinstance(fast, torch.nn.Module)
    with torch.no_grad():
        expected, actual = model(*inputs), fast(*inputs)
    assert type(actual) is type(expected)
    assert_close_rel(expected, actual, 1e-5)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_train_gradients_equal(name):
    model, inputs = ZOO[name]()
    model.train()
    reference = copy.deepcopy(model)
    fast = aiacc.optimize(model, inputs)  # the model is in train(): training semantics
    graph_ops = {n.op for n in aiacc.trace(model, inputs)}
    if any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()) and name != "with_opaque":
        assert "BatchNormalization" in graph_ops
    assert_same_training_step(reference, fast, inputs)


def test_train_mode_bn_updates_running_stats_and_dropout_is_active():
    model, inputs = ZOO["resnet18"]()
    model.train()
    fast = aiacc.optimize(model, inputs)
    before = fast.bn1.running_mean.clone()
    torch.manual_seed(0)
    fast(*inputs)
    assert not torch.equal(before, fast.bn1.running_mean)
    assert int(fast.bn1.num_batches_tracked) == int(model.bn1.num_batches_tracked) + 1
    mlp, x = ZOO["mlp"]()
    mlp.train()
    fast_mlp = aiacc.optimize(mlp, x)
    torch.manual_seed(1)
    a = fast_mlp(*x)[1]
    torch.manual_seed(2)
    b = fast_mlp(*x)[1]
    assert not torch.allclose(a, b)  # dropout draws differ between seeds: it is active


@pytest.mark.parametrize("name", ["resnet50", "bert_encoder"])
def test_no_opaque_nodes(name):
    model, inputs = ZOO[name]()
    for mode in ("inference", "train"):
        graph = aiacc.trace(model, inputs, mode=mode)
        opaque = [n.qualified_op for n in graph if n.is_opaque]
        assert opaque == [], f"{name} ({mode}) has opaque nodes {opaque}"


def test_bert_traced_without_fast_path_under_no_grad():
    model, inputs = ZOO["bert_encoder"]()
    with torch.no_grad():
        graph = aiacc.trace(model, inputs)
    hist = graph.op_histogram()
    assert hist.get("Softmax") == 2 and hist.get("LayerNormalization") == 5
    assert not [n for n in graph if n.is_opaque]
