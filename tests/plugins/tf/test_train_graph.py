"""TF mode="train": the exported training step is no heavier than Keras' own. Keras 3 BatchNormalization in
training is tf.nn.moments (whose variance reads the mean through a StopGradient) + tf.nn.batch_normalization
(Rsqrt); the step keeps that StopGradient (no extra, exactly zero, gradient path through the mean), emits
Rsqrt, SquaredDifference and BiasAdd as Keras does, and leaves no dead kernel Transpose. Counted on the
tf.function training step (forward + GradientTape backward) against Keras' own, gradients equal."""
import collections
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import aiacc  # noqa: E402
from aiacc.core import Graph  # noqa: E402
from tests.plugins.tf.test_export import _check as export_checked, _ops as export_ops_of  # noqa: E402


def resnet_block(seed=0):
    """Conv + BN + ReLU twice with a 1x1 projection shortcut, pooled, Dense + rank-2 BatchNormalization
    (moments over the batch axis) + Dense: Keras 3, same weights for the same seed."""
    keras.utils.set_random_seed(seed)
    L = keras.layers
    inp = keras.Input((8, 8, 3))
    y = L.ReLU()(L.BatchNormalization()(L.Conv2D(8, 3, padding="same", use_bias=False)(inp)))
    y = L.BatchNormalization()(L.Conv2D(8, 3, padding="same", use_bias=False)(y))
    short = L.BatchNormalization()(L.Conv2D(8, 1, use_bias=False)(inp))
    t = L.GlobalAveragePooling2D()(L.ReLU()(L.Add()([y, short])))
    t = L.BatchNormalization()(L.Dense(6)(t))
    return keras.Model(inp, L.Dense(3)(t))


def example(seed=1, n=4):
    return np.random.default_rng(seed).standard_normal((n, 8, 8, 3)).astype(np.float32)


def close(a, b, tol=1e-5):
    """Within tol relative to max(1, |a|max) (the tolerance of test_train.py)."""
    a, b = np.asarray(a), np.asarray(b)
    scale = max(1.0, float(np.max(np.abs(a))) if a.size else 1.0)
    return float(np.max(np.abs(a - b))) <= tol * scale if a.size else True


def train_step(model, call):
    """The tf.function of forward + GradientTape backward on `model`'s trainable variables."""
    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(call(x)))
        return loss, tape.gradient(loss, model.trainable_variables)
    return step


def op_counts(step, x):
    return collections.Counter(op.type for op in step.get_concrete_function(tf.constant(x)).graph.get_operations())


@pytest.fixture(scope="module")
def steps():
    m = resnet_block()
    x = example()
    fast = aiacc.optimize(m, x, mode="train", framework_compile=False)
    return m, fast, x


def test_training_step_has_keras_op_counts(steps):
    m, fast, x = steps
    mine = op_counts(train_step(m, lambda a: fast(a, training=True)), x)
    keras_ = op_counts(train_step(m, lambda a: m(a, training=True)), x)
    n_bn = sum(isinstance(layer, keras.layers.BatchNormalization) for layer in m.layers)
    # the StopGradient of each BatchNormalization's moments is kept: no gradient through the stopped mean
    # (without it: an AddN, a Neg and a Sum more per BatchNormalization in the backward)
    assert mine["StopGradient"] == keras_["StopGradient"] == n_bn, (mine, keras_)
    for op in ("AddN", "Neg", "Mul", "Rsqrt", "RsqrtGrad", "SquaredDifference", "Transpose"):
        assert mine[op] == keras_[op], (op, mine[op], keras_[op])
    # a vector added along the last axis is a BiasAdd: Keras' Dense bias, and also BatchNormalization's shift
    # (x * inv + (beta - mean * inv)), which Keras adds with AddV2: one BiasAddGrad in place of Sum + Reshape
    assert mine["BiasAdd"] == mine["BiasAddGrad"] >= keras_["BiasAdd"], (mine, keras_)
    for op in ("Sum", "Reshape", "AddV2"):
        assert mine[op] <= keras_[op], (op, mine[op], keras_[op])
    for op in ("Sqrt", "Reciprocal", "SqrtGrad", "ReciprocalGrad"):
        assert mine[op] == 0, (op, mine)
    assert sum(v for k, v in mine.items() if k != "Const") <= sum(v for k, v in keras_.items() if k != "Const")


def test_the_ir_keeps_batchnorms_stop_gradient(steps):
    m, fast, _ = steps
    graph = fast.aiacc_graph.unwrap()
    stops = [n for n in graph if n.domain == "tf" and n.attr("tf_op") == "StopGradient"]
    assert len(stops) == sum(isinstance(layer, keras.layers.BatchNormalization) for layer in m.layers)
    # each one reads its moments' mean
    assert all(n.inputs[0].producer is not None for n in stops)


def test_gradients_and_moving_statistics_equal_keras(steps):
    m, fast, x = steps
    saved = [v.numpy() for v in m.variables]
    ref_loss, ref_grads = train_step(m, lambda a: m(a, training=True))(tf.constant(x))
    ref_vars = [v.numpy() for v in m.variables]  # the moving statistics after one training forward
    for v, a in zip(m.variables, saved):
        v.assign(a)
    loss, grads = train_step(m, lambda a: fast(a, training=True))(tf.constant(x))
    assert close(ref_loss.numpy(), loss.numpy())
    for var, a, b in zip(m.trainable_variables, ref_grads, grads):
        assert b is not None and close(a.numpy(), b.numpy()), (var.path, float(np.max(np.abs(a - b))))
    for var, a in zip(m.variables, ref_vars):
        assert close(a, var.numpy()), var.path


# ------------------------------------------------------------------------------------------ the exporter
def _check(graph, feeds):
    """The op counts of the TF module exported for `graph`, its outputs checked equal to the reference (1e-6)."""
    return export_ops_of(export_checked(graph, feeds, rtol=1e-6))


@pytest.mark.parametrize("sqrt_read_elsewhere", [False, True])
def test_reciprocal_of_sqrt_lowers_to_rsqrt(sqrt_read_elsewhere):
    g = Graph("rsqrt")
    x = g.add_input("x", "float32", ("N", 5))
    s = g.op("Sqrt", x)
    g.add_output(g.op("Reciprocal", s))
    if sqrt_read_elsewhere:
        g.add_output(g.op("Neg", s))
    ops = _check(g, {"x": np.random.default_rng(0).uniform(0.1, 4.0, (3, 5)).astype(np.float32)})
    assert ops["Rsqrt"] == 1 and ops["Reciprocal"] == 0, ops
    assert ops["Sqrt"] == int(sqrt_read_elsewhere), ops  # built only when something else reads it


def test_square_of_a_difference_lowers_to_squared_difference():
    g = Graph("sqdiff")
    a = g.add_input("a", "float32", ("N", 5))
    b = g.add_input("b", "float32", (1, 5))
    d = g.op("Sub", a, b)
    g.add_output(g.op("Mul", d, d))
    rng = np.random.default_rng(1)
    ops = _check(g, {"a": rng.standard_normal((3, 5)).astype(np.float32),
                     "b": rng.standard_normal((1, 5)).astype(np.float32)})
    assert ops["SquaredDifference"] == 1 and ops["Sub"] == 0 and ops["Mul"] == 0, ops


def test_unread_transpose_and_gemm_bias_input():
    """A Transpose whose result nothing reads is no TF op; a Gemm's non-constant vector C is a BiasAdd."""
    rng = np.random.default_rng(2)
    g = Graph("gemm")
    a = g.add_input("a", "float32", ("N", 4))
    c = g.add_input("c", "float32", (3,))
    w = g.add_initializer("w", rng.standard_normal((4, 3)).astype(np.float32))
    g.op("Transpose", a, perm=[1, 0])  # dead: read by nothing
    g.add_output(g.op("Gemm", a, w, c, alpha=1.0, beta=1.0))
    ops = _check(g, {"a": rng.standard_normal((2, 4)).astype(np.float32),
                     "c": rng.standard_normal(3).astype(np.float32)})
    assert ops["Transpose"] == 0 and ops["BiasAdd"] == 1 and ops["AddV2"] == 0 and ops["Mul"] == 0, ops


def test_add_of_a_vector_input_along_the_last_axis_is_a_bias_add():
    """(..., C) + a (C,) value that is not a constant (a Dense bias variable in mode="train"): BiasAdd."""
    rng = np.random.default_rng(3)
    g = Graph("bias")
    x = g.add_input("x", "float32", ("N", 3, 4))
    c = g.add_input("c", "float32", (4,))
    g.add_output(g.op("Add", x, c))
    g.add_output(g.op("Add", c, g.op("Relu", x)))
    ops = _check(g, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32),
                     "c": rng.standard_normal(4).astype(np.float32)})
    assert ops["BiasAdd"] == 2 and ops["AddV2"] == 0, ops
