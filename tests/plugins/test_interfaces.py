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
    fast = _quiet_optimize(model, (x,), max_shapes=1)  # by default another size is optimized again (test_shapes)
    assert fast.aiacc_report.interface[0].startswith("batch: specialized to 1 (at batch 5: output 0 differs")
    torch.testing.assert_close(fast(x), model(x))
    with pytest.raises(ShapeError, match=r"input 'x' of shape \[5, 4\]: its dimension 0 must be 1, the batch size the model "
                                          r"was built for \(.*specialized to batch 1"):
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


# ------------------------------------------------------------------------------------ output names kept
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
needs_tf = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="tensorflow is not installed")
needs_mxnet = pytest.mark.skipif(importlib.util.find_spec("mxnet") is None, reason="mxnet is not installed")


def _torch_dict_model():
    import collections

    import torch

    Pair = collections.namedtuple("Pair", ["low", "high"])

    class Heads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            h = torch.relu(self.fc(x))
            return {"logits": h, "extra": Pair(h.min(1).values, h.max(1).values)}
    torch.manual_seed(0)
    return Heads().eval(), (torch.randn(2, 4),)


@needs_torch
def test_torch_dict_and_namedtuple_outputs_keep_their_structure():
    from aiacc.plugins.torch.translator import PLUGIN

    model, x = _torch_dict_model()
    fast = _quiet_optimize(model, x)
    out = fast(*x)
    assert list(out) == ["logits", "extra"] and type(out["extra"]).__name__ == "Pair"
    names = PLUGIN.run_named(model, x)[1]
    assert names == ["dict['logits']", "dict['extra']/Pair.low", "dict['extra']/Pair.high"]
    assert PLUGIN.run_named(fast, x)[1] == names


@needs_torch
def test_torch_verify_refuses_a_renamed_output(monkeypatch):
    import torch

    from aiacc.errors import VerificationError
    from aiacc.plugins.torch.translator import TorchPlugin

    class Renamed(torch.nn.Module):  # the optimized module with one output key changed, values equal
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            out = self.inner(x)
            return {"scores" if k == "logits" else k: v for k, v in out.items()}
    real = TorchPlugin.export_native
    monkeypatch.setattr(TorchPlugin, "export_native", lambda self, g, **kw: Renamed(real(self, g, **kw)))
    model, x = _torch_dict_model()
    with pytest.raises(VerificationError, match=r"output 0 is dict\['scores'\], the original's is dict\['logits'\]"):
        _quiet_optimize(model, x)


@needs_torch
def test_torch_dataclass_output_is_compared_field_by_field():
    import dataclasses

    import torch

    from aiacc.plugins.torch.translator import PLUGIN

    @dataclasses.dataclass
    class Out:
        y: torch.Tensor
        z: torch.Tensor

    class M(torch.nn.Module):
        def forward(self, x):
            return Out(x * 2, x + 1)
    x = (torch.randn(2, 3),)
    arrays, names = PLUGIN.run_named(M(), x)
    assert names == ["Out.y", "Out.z"] and len(arrays) == 2  # tensors inside a dataclass are compared too
    try:
        fast = _quiet_optimize(M().eval(), x)
    except aiacc.AiaccError:
        return  # refused is acceptable; a wrong answer is not
    out = fast(torch.full((2, 3), 5.0))
    torch.testing.assert_close(out.y, torch.full((2, 3), 10.0))


def _keras_named_outputs():
    import keras

    inp = keras.Input((4,), name="feat")
    h = keras.layers.Dense(3, activation="relu", name="body")(inp)
    model = keras.Model(inp, {"score": keras.layers.Dense(2, name="score")(h),
                              "aux": keras.layers.Dense(1, activation="sigmoid", name="aux")(h)})
    return model, [np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)]


@needs_tf
def test_keras_named_outputs_dict_keeps_its_keys():
    from aiacc.plugins.tf.translator import PLUGIN

    model, x = _keras_named_outputs()
    fast = _quiet_optimize(model, x)
    assert sorted(fast(x[0])) == ["aux", "score"]
    names = PLUGIN.run_named(model, x)[1]
    assert names == ["dict['aux']", "dict['score']"] and PLUGIN.run_named(fast, x)[1] == names


@needs_tf
def test_tf_verify_refuses_a_renamed_output(monkeypatch):
    import tensorflow as tf

    from aiacc.errors import VerificationError
    from aiacc.plugins.tf.translator import TFPlugin

    class Renamed(tf.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def __call__(self, x):
            return {("prob" if k == "aux" else k): v for k, v in self.inner(x).items()}
    real = TFPlugin.export_native
    monkeypatch.setattr(TFPlugin, "export_native", lambda self, g, **kw: Renamed(real(self, g, **kw)))
    model, x = _keras_named_outputs()
    with pytest.raises(VerificationError, match=r"output 0 is dict\['prob'\], the original's is dict\['aux'\]"):
        _quiet_optimize(model, x)


@needs_mxnet
def test_gluon_nested_outputs_keep_structure_and_symbol_names():
    from aiacc.plugins.mxnet._import import import_mxnet
    from aiacc.plugins.mxnet.translator import PLUGIN

    mx = import_mxnet()

    class Heads(mx.gluon.HybridBlock):
        def __init__(self):
            super().__init__(prefix="heads_")
            with self.name_scope():
                self.fc = mx.gluon.nn.Dense(4)
                self.fc2 = mx.gluon.nn.Dense(3)

        def hybrid_forward(self, F, x):
            h = F.relu(self.fc(x))  # Dense + relu fuse into one node named after the Dense
            return h, (self.fc2(h), h * 2)
    block = Heads()
    block.initialize(mx.init.Xavier())
    x = [np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)]
    fast = _quiet_optimize(block, x)
    out = fast(mx.nd.array(x[0]))
    assert len(out) == 2 and len(out[1]) == 2  # nested as the original, not flattened to three
    names = PLUGIN.run_named(block, x)[1]
    assert names[0] == "seq[0] (heads_relu0_output)" and names[1].startswith("seq[1]/seq[0] (")
    assert PLUGIN.run_named(fast, x)[1] == names


@needs_mxnet
def test_mxnet_symbol_output_name_kept_through_fusion_and_checked(monkeypatch):
    from aiacc.errors import VerificationError
    from aiacc.plugins.mxnet import exporter
    from aiacc.plugins.mxnet._import import import_mxnet

    mx = import_mxnet()
    data = mx.sym.var("data")
    act = mx.sym.Activation(mx.sym.FullyConnected(data, num_hidden=4, name="fc1"), act_type="relu", name="relu1")
    rng = np.random.default_rng(0)
    args = {"fc1_weight": mx.nd.array(rng.standard_normal((4, 5))), "fc1_bias": mx.nd.zeros(4)}
    x = [rng.standard_normal((2, 5)).astype(np.float32)]
    fast = _quiet_optimize((act, args, {}), x)
    assert fast.aiacc_graph.find_nodes("FusedGemm", "aiacc")  # the relu was fused into the FullyConnected
    assert fast.plain_symbol.list_outputs() == ["relu1_output"]
    # without the exporter keeping it, the output would come back under the fused node's name: refused
    monkeypatch.setattr(exporter, "_keep_output_names", lambda em, graph, heads: None)
    with pytest.raises(VerificationError, match=r"output 0 is output \(fc1\w*_output\), the original's is "
                                                r"output \(relu1_output\)"):
        _quiet_optimize((act, args, {}), x)
