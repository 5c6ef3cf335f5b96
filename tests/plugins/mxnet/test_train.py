"""MXNet Gluon mode="train": the optimized block shares the original's Parameters; autograd.record() +
backward() + gluon.Trainer.step update the same parameters as on the original, BatchNorm's running
statistics move as in Gluon, and one and three steps end with the same parameters."""
import warnings

import numpy as np
import pytest

from aiacc.plugins.mxnet._import import import_mxnet

try:
    mx = import_mxnet()
except ImportError:
    pytest.skip("mxnet is not installed", allow_module_level=True)
from mxnet import autograd, gluon  # noqa: E402

import aiacc  # noqa: E402
from aiacc.errors import AiaccError  # noqa: E402

warnings.filterwarnings("ignore", category=DeprecationWarning)


def net(seed=0, dropout=0.0):
    """A tiny Conv + BatchNorm + Dense block, the same weights for the same seed."""
    mx.random.seed(seed)
    np.random.seed(seed)
    n = gluon.nn.HybridSequential()
    n.add(gluon.nn.Conv2D(4, 3, in_channels=3), gluon.nn.BatchNorm(in_channels=4, momentum=0.8),
          gluon.nn.Activation("relu"), gluon.nn.Dense(16, in_units=144, activation="tanh"))
    if dropout:
        n.add(gluon.nn.Dropout(dropout))
    n.add(gluon.nn.Dense(5, in_units=16))
    n.initialize(mx.init.Xavier())
    return n


def data(seed=1, n=4):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3, 8, 8)).astype(np.float32), rng.integers(0, 5, n).astype(np.float32)


def close(a, b, tol=1e-5):
    scale = max(1.0, float(np.max(np.abs(a))))
    return float(np.max(np.abs(a - b))) <= tol * scale


def steps(block, n, x, y):
    """n SGD-momentum steps (softmax cross-entropy); the parameters afterwards, in the block's order."""
    trainer = gluon.Trainer(block.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    xs, ys = mx.nd.array(x), mx.nd.array(y)
    for _ in range(n):
        with autograd.record():
            loss = loss_fn(block(xs), ys)
        loss.backward()
        trainer.step(x.shape[0])
    return [p.data().asnumpy() for p in block.collect_params().values()]


def test_shares_the_parameters_and_reports_what_training_skips():
    m = net()
    x, _ = data()
    fast = aiacc.optimize(m, x, mode="train")
    assert isinstance(fast, gluon.SymbolBlock)
    ours, theirs = fast.collect_params(), m.collect_params()
    assert set(theirs) <= set(ours)
    assert all(ours[k] is theirs[k] for k in theirs)
    assert fast.aiacc_report.mode == "train" and "batchnorm_folding" in fast.aiacc_report.skipped
    # BatchNorm stays a training-mode BatchNorm (not folded into the convolution)
    assert any(n.op == "BatchNormalization" and n.attr("training_mode") for n in fast.aiacc_graph)


def test_training_alias_and_gradients_equal():
    x, y = data()
    m = net()
    fast = aiacc.optimize(m, x, mode="training")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    grads = []
    for block in (m, fast):
        saved = {k: p.data().copy() for k, p in m.collect_params().items()}
        with autograd.record():
            loss = loss_fn(block(mx.nd.array(x)), mx.nd.array(y))
        loss.backward()
        grads.append({k: p.grad().asnumpy().copy() for k, p in m.collect_params().items() if p.grad_req != "null"})
        for k, p in m.collect_params().items():
            p.set_data(saved[k])
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for k in grads[0]:
        assert close(grads[0][k], grads[1][k]), k


@pytest.mark.parametrize("n", [1, 3])
def test_steps_end_with_the_same_parameters_and_bn_statistics(n):
    x, y = data()
    ref = steps(net(seed=0), n, x, y)
    m = net(seed=0)
    fast = aiacc.optimize(m, x, mode="train")
    steps(fast, n, x, y)
    names = list(m.collect_params())
    theirs = [p.data().asnumpy() for p in m.collect_params().values()]
    assert len(ref) == len(theirs)
    for k, a, b in zip(names, ref, theirs):
        assert close(a, b), (k, float(np.max(np.abs(a - b))))
    mean = [v for k, v in zip(names, theirs) if k.endswith("running_mean")][0]
    assert not np.allclose(mean, 0)  # the running statistics moved, on the original's Parameter


def test_dropout_follows_autograd_and_mxnet_rng():
    x, y = data()
    r = net(seed=2, dropout=0.5)
    mx.random.seed(7)  # the masks: MXNet's global RNG seeded the same way before each run
    ref = steps(r, 2, x, y)
    m = net(seed=2, dropout=0.5)
    fast = aiacc.optimize(m, x, mode="train")
    mx.random.seed(7)
    steps(fast, 2, x, y)
    for (k, p), a in zip(m.collect_params().items(), ref):
        assert close(a, p.data().asnumpy()), k
    xs = mx.nd.array(x)
    with autograd.record():
        a, b = fast(xs).asnumpy(), fast(xs).asnumpy()
    assert not np.allclose(a, b)  # dropout is on in training
    assert np.allclose(fast(xs).asnumpy(), fast(xs).asnumpy())  # and off at inference


def test_refusals_name_the_problem():
    x, _ = data()
    with pytest.raises(AiaccError, match="memory_budget with mode='train' is not implemented for MXNet: .*Gluon"):
        aiacc.optimize(net(), x, mode="train", memory_budget=1 << 20)
    with pytest.raises(AiaccError, match="memory_budget applies to mode='train'"):  # not silently ignored
        aiacc.optimize(net(), x, memory_budget=1 << 20)
    with pytest.raises(AiaccError, match="unknown mode 'learn'"):
        aiacc.optimize(net(), x, mode="learn")
    with pytest.raises(AiaccError, match="onnxruntime"):
        aiacc.optimize(net(), x, mode="train", backend="onnxruntime")


@pytest.mark.parametrize("setting", [False, True, "auto"])
def test_every_step_path_ends_with_the_same_parameters(setting):
    """aiacc's graph (static_alloc), with static_shape too, or whatever 'auto' measured fastest (Gluon's
    own graph among them): three steps end with the original's parameters and statistics."""
    x, y = data()
    ref = steps(net(seed=0), 3, x, y)
    m = net(seed=0)
    fast = aiacc.optimize(m, x, mode="train", framework_compile=setting)
    if setting is False:
        assert fast.aiacc_train_path == "aiacc graph (static_alloc)"
    elif setting is True:
        assert fast.aiacc_train_path == "aiacc graph (static_alloc) + hybridize static_shape"
    else:
        assert fast.aiacc_train_path in fast.aiacc_train_choice.ms and len(fast.aiacc_train_choice.ms) == 3
    steps(fast, 3, x, y)
    for k, a, b in zip(m.collect_params(), ref, [p.data().asnumpy() for p in m.collect_params().values()]):
        assert close(a, b), (k, float(np.max(np.abs(a - b))))
