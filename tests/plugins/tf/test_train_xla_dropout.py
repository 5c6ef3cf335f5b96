"""TF mode='train' under XLA keeps Keras' dropout masks: aiacc/plugins/tf/philox.py computes TensorFlow's
stateless Philox draws (StatelessRandomGetKeyCounter, StatelessRandomUniformV2) in integer ops, bit for bit
as TensorFlow's kernels do, also under jit_compile=True, where XLA's own lowering of those ops draws other
numbers; a step that XLA compiles (aiacc's XLA candidate, Keras' fit step under jit_compile) uses them, so
it trains with the original's masks."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import aiacc  # noqa: E402
from aiacc.plugins.tf import philox  # noqa: E402

from tests.plugins.tf.test_train import close, cnn, data, fit_variables, train_steps  # noqa: E402


def kernel_draw(seed, shape, alg=3):
    from tensorflow.python.ops import gen_stateless_random_ops_v2 as g2

    key, counter = g2.stateless_random_get_key_counter(seed)
    return key, counter, g2.stateless_random_uniform_v2(shape, key, counter, tf.constant(alg, tf.int32),
                                                        dtype=tf.float32)


def emulated_draw(seed, shape):
    key, counter = philox.key_counter(seed)
    return key, counter, philox.uniform_float32(shape, key, counter)


@pytest.mark.parametrize("seed", [[1234, 5678], [-5, 2**31 - 2], [0, -1], [-2**31, 7]])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_philox_equals_tensorflows_kernels_with_and_without_xla(seed, dtype):
    """Key, counter and uniform (a shape whose size is not a multiple of 4) equal TF's kernels' bit for bit
    in a tf.function and under jit_compile=True; XLA's own lowering of the same ops does not (so the test
    would catch a step that left them to XLA)."""
    s = tf.constant(seed, dtype)
    shape = tf.constant([3, 5, 7], tf.int32)
    ref = [t.numpy() for t in tf.function(lambda: kernel_draw(s, shape))()]
    for jit in (None, True):
        got = [t.numpy() for t in tf.function(lambda: emulated_draw(s, shape), jit_compile=jit)()]
        for a, b in zip(ref, got):
            assert a.dtype == b.dtype and np.array_equal(a, b), (seed, dtype, jit)
    xla_own = tf.function(lambda: kernel_draw(s, shape), jit_compile=True)()[2].numpy()
    assert not np.array_equal(ref[2], xla_own)


def test_philox_counter_carries_into_its_high_word():
    key = tf.constant([123], tf.uint64)
    counter = tf.constant([2**64 - 3, 7], tf.uint64)  # the low 64 bits wrap within the draw
    shape = tf.constant([64], tf.int32)
    from tensorflow.python.ops import gen_stateless_random_ops_v2 as g2

    ref = g2.stateless_random_uniform_v2(shape, key, counter, tf.constant(1, tf.int32), dtype=tf.float32)
    got = tf.function(lambda: philox.uniform_float32(shape, key, counter), jit_compile=True)()
    assert np.array_equal(ref.numpy(), got.numpy())


def test_fit_under_xla_with_dropout_trains_as_keras_fit_without_xla():
    """The fit step pinned to one XLA program: three fit steps of a model with dropout 0.5 end with the
    parameters and BatchNorm statistics of Keras' own fit without XLA within 1e-5 (the same masks); Keras'
    own fit under XLA ends elsewhere (XLA's masks)."""
    from aiacc.plugins.tf.training import FIT_XLA

    x, y = data(n=12)
    ref = fit_variables(cnn(dropout=0.5, seed=4), x, y, jit_compile=False)
    m = cnn(dropout=0.5, seed=4)
    fast = aiacc.optimize(m, x[:4], mode="train", framework_compile=FIT_XLA)
    assert fast.aiacc_fit_choice.path == FIT_XLA
    fit_variables(fast, x, y)
    assert fast.jit_compile is True
    for a, b in zip(ref.variables, m.variables):
        assert close(a.numpy(), b.numpy()), (a.path, float(np.max(np.abs(a.numpy() - b.numpy()))))
    keras_xla = fit_variables(cnn(dropout=0.5, seed=4), x, y, jit_compile=True)
    assert not all(close(a.numpy(), b.numpy()) for a, b in zip(ref.variables, keras_xla.variables))


def test_the_xla_step_with_dropout_trains_as_the_original():
    """aiacc's step compiled by XLA (pinned by name): three GradientTape steps with dropout 0.5 equal the
    original's within 1e-5."""
    x, y = data()
    ref = train_steps(cnn(dropout=0.5, seed=3), 3, x, y)
    m = cnn(dropout=0.5, seed=3)
    fast = aiacc.optimize(m, x, mode="train", framework_compile="aiacc graph + XLA (jit_compile=True)")
    assert fast.aiacc_train_path == "aiacc graph + XLA (jit_compile=True)"
    got = train_steps(fast, 3, x, y)
    for a, b in zip(ref, got):
        assert close(a, b), float(np.max(np.abs(a - b)))
