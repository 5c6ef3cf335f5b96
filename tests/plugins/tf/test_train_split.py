"""TF mode='train' with dropout drawn outside XLA (training.SplitStep): the dropout uniforms come from
TensorFlow's own kernels in a plain tf.function (so the masks are the original's, bit for bit) and the rest
of the step runs as one jit_compile=True function that takes them as inputs: in model.fit the whole
forward, backward and optimizer update (FIT_SPLIT), in a GradientTape step the forward as a nested XLA
function (SPLIT_XLA). One and three steps end with the original's parameters within 1e-5."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import aiacc  # noqa: E402
from aiacc.errors import AiaccError  # noqa: E402
from aiacc.plugins.tf.training import FIT_GRAPH, FIT_SPLIT, SPLIT_XLA, set_fit_path  # noqa: E402

from tests.plugins.tf.test_train import close, cnn, data, fit_variables, train_steps  # noqa: E402


def assert_same(ref, got):
    for a, b in zip(ref, got):
        a, b = np.asarray(a), np.asarray(b)
        assert close(a, b), float(np.max(np.abs(a - b)))


@pytest.mark.parametrize("steps", [1, 3])
def test_fit_with_dropout_drawn_outside_xla_trains_as_keras_fit(steps):
    """FIT_SPLIT pinned: `steps` fit steps with dropout 0.5 end with the parameters and BatchNorm statistics
    of Keras' own fit (no XLA) within 1e-5; the fit step really ran the XLA program (traced, and compile's
    jit_compile stayed False: the draws are outside it)."""
    x, y = data(n=4 * steps)
    ref = fit_variables(cnn(dropout=0.5, seed=4), x, y, steps=steps, jit_compile=False)
    m = cnn(dropout=0.5, seed=4)
    fast = aiacc.optimize(m, x[:4], mode="train", framework_compile=FIT_SPLIT)
    assert fast.aiacc_fit_choice.path == FIT_SPLIT and fast._aiacc_fit_split is not None
    fit_variables(fast, x, y, steps=steps)
    assert fast.jit_compile is False and fast._aiacc_split_traces >= 1
    assert_same([v.numpy() for v in ref.variables], [v.numpy() for v in m.variables])
    # the variables the fit trained are the original's own objects
    assert [id(v) for v in fast.trainable_variables] == [id(v) for v in m.trainable_variables]


@pytest.mark.parametrize("steps", [1, 3])
def test_gradient_tape_step_with_dropout_drawn_outside_xla_trains_as_the_original(steps):
    """SPLIT_XLA pinned: a GradientTape loop over the model draws the masks in TF's kernels and runs the
    forward as a nested XLA function (traced once), ending with the original's parameters within 1e-5."""
    x, y = data()
    ref = train_steps(cnn(dropout=0.5, seed=3), steps, x, y)
    m = cnn(dropout=0.5, seed=3)
    fast = aiacc.optimize(m, x, mode="train", framework_compile=SPLIT_XLA)
    assert fast.aiacc_train_path == SPLIT_XLA
    got = train_steps(fast, steps, x, y)
    assert fast._aiacc_step.aiacc_split_traces["xla_traces"] >= 1
    assert_same(ref, got)


def test_a_users_xla_step_over_the_split_model_keeps_the_masks():
    """Inside a user's jit_compile=True step the split model runs as one program with TF's Philox draws
    in integer ops (no nested XLA function, whose gradient would recompile every step): the same masks,
    three steps equal to the original's eager GradientTape steps."""
    x, y = data()
    ref = train_steps(cnn(dropout=0.5, seed=6), 3, x, y)
    m = cnn(dropout=0.5, seed=6)
    fast = aiacc.optimize(m, x, mode="train", framework_compile=SPLIT_XLA)
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(jit_compile=True)
    def step(a, b):
        with tf.GradientTape() as tape:
            loss = loss_fn(b, fast(a, training=True))
        grads = tape.gradient(loss, fast.trainable_variables)
        opt.apply_gradients(zip(grads, fast.trainable_variables))

    for _ in range(3):
        step(tf.constant(x), tf.constant(y))
    assert fast._aiacc_step.aiacc_split_traces["xla_traces"] == 0  # the nested XLA part was not used
    assert_same(ref, [v.numpy() for v in m.variables])


def test_the_choice_measures_the_split_candidates_only_where_dropout_is_drawn():
    """framework_compile='auto': with dropout both split candidates are measured (times in the choices);
    without dropout neither is offered, and pinning FIT_SPLIT there says why."""
    x, y = data(n=8)
    fast = aiacc.optimize(cnn(dropout=0.5, seed=4), x[:4], mode="train")
    assert SPLIT_XLA in fast.aiacc_train_choice.ms and FIT_SPLIT in fast.aiacc_fit_choice.ms
    plain = aiacc.optimize(cnn(seed=4), x[:4], mode="train")
    assert SPLIT_XLA not in plain.aiacc_train_choice.ms and FIT_SPLIT not in plain.aiacc_fit_choice.ms
    pinned = aiacc.optimize(cnn(seed=4), x[:4], mode="train", framework_compile=FIT_SPLIT)
    assert pinned.aiacc_fit_choice.path == FIT_GRAPH and "draws no random numbers" in pinned.aiacc_fit_choice.reason


def test_set_fit_path_pins_the_split_and_refuses_what_cannot_run():
    x, y = data(n=8)
    fast = aiacc.optimize(cnn(dropout=0.5, seed=4), x[:4], mode="train", framework_compile=False)
    assert fast.aiacc_fit_choice.path == FIT_GRAPH
    set_fit_path(fast, FIT_SPLIT)
    assert fast.aiacc_fit_choice.path == FIT_SPLIT and fast._aiacc_fit_split is not None
    with pytest.raises(AiaccError, match="fit path must be one of"):
        set_fit_path(fast, "fast please")
    plain = aiacc.optimize(cnn(seed=4), x[:4], mode="train", framework_compile=False)
    with pytest.raises(AiaccError, match="draws no random numbers"):
        set_fit_path(plain, FIT_SPLIT)
