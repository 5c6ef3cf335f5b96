"""Interfaces kept: input names, dtypes and dynamic dimensions survive optimize. A model traced at batch 1
runs at batch 5 (torch: checked by verify and said in the report); where the optimized model is specialized
to the example's batch size, calling it with another size is a ShapeError, never a wrong answer."""
from __future__ import annotations

import importlib.util
import inspect
import warnings

import numpy as np
import pytest

import aiacc
from aiacc.errors import ShapeError


def _quiet_optimize(model, x, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return aiacc.optimize(model, x, **kw)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_traced_at_batch_1_runs_at_batch_5_and_says_so():
    import torch

    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, tokens, scale):
            return self.fc(self.emb(tokens).mean(1) * scale)
    model = Net().eval()
    fast = _quiet_optimize(model, (torch.tensor([[1, 2, 3]]), torch.ones(1, 1)))
    assert list(inspect.signature(fast.forward).parameters) == ["tokens", "scale"]  # the names
    assert fast.aiacc_report.interface == ["batch: traced at 1, runs at other sizes (checked at batch 5: same "
                                           "outputs)"]
    tokens, scale = torch.randint(0, 10, (5, 3)), torch.rand(5, 1)  # int64 and float32, as traced
    torch.testing.assert_close(fast(tokens, scale=scale), model(tokens, scale), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_specialized_to_its_batch_refuses_another_size_instead_of_a_wrong_answer():
    import torch

    class PerRow(torch.nn.Module):  # torch.arange of a size: a constant of the trace
        def forward(self, x):
            return x + torch.arange(x.shape[0]).float()[:, None]
    model, x = PerRow().eval(), torch.randn(1, 4)
    fast = _quiet_optimize(model, (x,))
    assert fast.aiacc_report.interface[0].startswith("batch: specialized to 1 (at batch 5: output 0 differs")
    torch.testing.assert_close(fast(x), model(x))
    with pytest.raises(ShapeError, match=r"input of shape \[5, 4\].*specialized to batch 1"):
        fast(torch.randn(5, 4))


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="tensorflow is not installed")
def test_tf_function_signature_keeps_its_names_and_dynamic_batch():
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="feat")])
    def f(x):
        return {"score": tf.nn.relu(x @ tf.reshape(tf.range(12, dtype=tf.float32), [4, 3]))}
    x1 = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    fast = _quiet_optimize(f, [x1])
    (spec,) = fast.__call__.input_signature
    assert spec.name == "feat" and spec.shape.as_list() == [None, 4] and spec.dtype == tf.float32
    x5 = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    out = fast(x5)
    assert list(out) == ["score"]
    np.testing.assert_allclose(out["score"].numpy(), f(x5)["score"].numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("mxnet") is None, reason="mxnet is not installed")
def test_gluon_symbol_block_runs_at_another_batch():
    from aiacc.plugins.mxnet._import import import_mxnet

    mx = import_mxnet()
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(3, in_units=4, activation="relu"))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x1 = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    fast = _quiet_optimize(net, [x1])
    x5 = mx.nd.array(np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32))
    np.testing.assert_allclose(fast(x5).asnumpy(), net(x5).asnumpy(), rtol=1e-5, atol=1e-6)
