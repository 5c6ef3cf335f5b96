"""TF mode='train', the FUSED_BN candidate: each Keras BatchNormalization in training (tf.nn.moments, then
x * inv + (beta - mean * inv)) runs as one FusedBatchNormV3 (training.TrainEmitter); the moving statistics
get Keras' biased batch variance and the steps end with the original's parameters within 1e-5."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import aiacc  # noqa: E402
from aiacc.plugins.tf.exporter import lowerable_copy  # noqa: E402
from aiacc.plugins.tf.training import FIT_GRAPH, FUSED_BN, has_fusable_batchnorm  # noqa: E402

from tests.plugins.tf.test_train import close, cnn, data, fit_variables, train_steps  # noqa: E402


def op_types(step):
    ops: dict[str, int] = {}
    for op in step.get_concrete_function().graph.get_operations():
        ops[op.type] = ops.get(op.type, 0) + 1
    return ops


@pytest.mark.parametrize("steps", [1, 3])
def test_fused_batchnorm_steps_end_with_the_originals_parameters_and_statistics(steps):
    """FUSED_BN pinned: `steps` GradientTape steps equal the original's (weights, moving mean and variance)
    within 1e-5, and the step really is the fused one: one FusedBatchNormV3 and no moments of its own (the
    Means and SquaredDifference left are the LayerNormalization's)."""
    x, y = data()
    ref = train_steps(cnn(seed=3), steps, x, y)
    m = cnn(seed=3)
    fast = aiacc.optimize(m, x, mode="train", framework_compile=FUSED_BN)
    assert fast.aiacc_train_path == FUSED_BN
    got = train_steps(fast, steps, x, y)
    for v, a, b in zip(m.variables, ref, got):
        assert close(a, b), (v.path, float(np.max(np.abs(a - b))))
    fused = op_types(fast._aiacc_step)
    plain = op_types(aiacc.optimize(cnn(seed=3), x, mode="train", framework_compile=False)._aiacc_step)
    assert fused.get("FusedBatchNormV3") == 1 and "FusedBatchNormV3" not in plain
    assert fused["Mean"] == plain["Mean"] - 2 and fused["SquaredDifference"] == plain["SquaredDifference"] - 1


def test_fit_with_fused_batchnorm_trains_as_keras_fit():
    x, y = data(n=12)
    ref = fit_variables(cnn(seed=4), x, y, jit_compile=False)
    m = cnn(seed=4)
    fast = aiacc.optimize(m, x[:4], mode="train", framework_compile=FUSED_BN)
    assert fast.aiacc_fit_choice.path == FIT_GRAPH
    fit_variables(fast, x, y)
    for a, b in zip(ref.variables, m.variables):
        assert close(a.numpy(), b.numpy()), (a.path, float(np.max(np.abs(a.numpy() - b.numpy()))))


def test_the_choice_measures_fused_batchnorm_only_where_it_matches():
    """'auto' measures FUSED_BN where a BatchNormalization matches; a BatchNormalization without beta
    (center=False: no shift to fuse) and a BatchNormalization-free net offer no such candidate."""
    x, _ = data()
    fast = aiacc.optimize(cnn(seed=3), x, mode="train")
    assert FUSED_BN in fast.aiacc_train_choice.ms
    keras.utils.set_random_seed(0)
    no_center = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3),
                                  keras.layers.BatchNormalization(center=False), keras.layers.Flatten(),
                                  keras.layers.Dense(3)])
    fast = aiacc.optimize(no_center, x, mode="train", framework_compile=False)
    assert not has_fusable_batchnorm(lowerable_copy(fast.aiacc_graph.unwrap()))
    dense = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(3)])
    fast = aiacc.optimize(dense, x, mode="train")
    assert FUSED_BN not in fast.aiacc_train_choice.ms
