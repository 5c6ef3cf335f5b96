"""verify's float64 re-check for TF (TFPlugin.float64_outputs): a Keras model whose float32 rounding is
amplified beyond the tolerance is not refused for a correct optimization that rounds differently (a conv bias
the BatchNorm's moving mean cancels: folded, the optimized model is the more accurate one), a wrong
optimization still is, and what cannot be widened (a subclassed model) says so."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = tf.keras

import aiacc  # noqa: E402
from aiacc.core.compare import compare_outputs  # noqa: E402
from aiacc.core.passes.manager import FunctionPass  # noqa: E402
from aiacc.errors import VerificationError  # noqa: E402
from aiacc.plugins import get_plugin  # noqa: E402
from tests.core.passes.helpers import scale_first_conv_weight  # noqa: E402


def _cancelling():
    """Conv2D whose bias 1e5 the BatchNormalization's moving mean takes away again: in float32 the conv output
    rounds to the spacing of floats at 1e5 (0.0078) before the subtraction, the folded conv does not."""
    inp = keras.Input((8, 8, 3))
    conv = keras.layers.Conv2D(4, 3, padding="same")
    bn = keras.layers.BatchNormalization()
    model = keras.Model(inp, bn(conv(inp)))
    rng = np.random.default_rng(0)
    kernel, _ = conv.get_weights()
    conv.set_weights([rng.normal(size=kernel.shape).astype(np.float32), np.full(4, 1e5, np.float32)])
    bn.set_weights([rng.uniform(0.5, 1.5, 4).astype(np.float32), np.zeros(4, np.float32),
                    np.full(4, 1e5, np.float32), rng.uniform(0.5, 2.0, 4).astype(np.float32)])
    return model


def _x(seed=1):
    return np.random.default_rng(seed).normal(size=(2, 8, 8, 3)).astype(np.float32)


def test_a_correct_fold_of_an_ill_conditioned_keras_model_verifies():
    model, x = _cancelling(), _x()
    fast = aiacc.optimize(model, x)  # refused by the float32 comparison alone before the re-check
    plugin = get_plugin("tf")
    expected, got = plugin.run(model, x), plugin.run(fast, x)
    assert compare_outputs(expected, got, plugin.rtol, plugin.atol) is not None  # float32 alone: refused
    truth = plugin.float64_outputs(model, x)
    assert [t.dtype for t in truth] == [np.float64]
    # the folded model is the more accurate one: the float32 difference is the original's rounding
    assert np.abs(got[0] - truth[0]).max() < np.abs(expected[0] - truth[0]).max() / 10
    assert plugin.outputs_agree(model, fast, x) is None
    assert plugin.outputs_agree(model, fast, _x(2)) is None  # an input it was not optimized on


def test_a_wrong_pass_is_still_refused_with_the_float64_verdict():
    bad = FunctionPass("scale_conv_weight", scale_first_conv_weight, level=2)
    with pytest.raises(VerificationError, match=r"float64 re-check: in float64 too: output 0 differs by"):
        aiacc.optimize(_cancelling(), _x(), passes=[bad])


def test_float64_outputs_leave_the_models_alone_and_a_subclassed_model_has_none():
    model, x = _cancelling(), _x()
    fast = aiacc.optimize(model, x)
    plugin = get_plugin("tf")
    before = [w.copy() for w in model.get_weights()]
    for m in (model, fast):
        assert [o.dtype for o in plugin.float64_outputs(m, x)] == [np.float64]
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(before, model.get_weights()))
    assert [o.dtype for o in plugin.run(fast, x)] == [np.float32]

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)
    sub = Sub()
    sub(np.ones((1, 3), np.float32))
    assert plugin.float64_outputs(sub, np.ones((1, 3), np.float32)) is None


def test_float64_outputs_of_a_model_taking_a_dict():
    inputs = {"a": keras.Input((4,), name="a"), "b": keras.Input((4,), name="b")}
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Add()([inputs["a"], inputs["b"]])))
    x = {"a": np.ones((2, 4), np.float32), "b": np.full((2, 4), 0.5, np.float32)}
    fast = aiacc.optimize(model, x)
    plugin = get_plugin("tf")
    truth, got = plugin.float64_outputs(model, x), plugin.float64_outputs(fast, x)
    assert truth[0].dtype == got[0].dtype == np.float64
    np.testing.assert_allclose(got[0], truth[0], rtol=1e-12, atol=1e-12)
