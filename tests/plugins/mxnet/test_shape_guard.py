"""The shape guard of an optimized Gluon block, on every backend: right answers at the shapes it was built
for; a dimension verify ran at another size with the same outputs (a native block's batch, sequence length,
image size) stays free; any other size is an aiacc ShapeError in torch's wording (the input, the dimension,
the size it was built for, why), never onnxruntime's 'invalid dimensions' or a crash inside MXNet."""
from __future__ import annotations

import importlib.util
import pickle

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mxnet") is None, reason="mxnet is not installed")

import aiacc  # noqa: E402
from aiacc.errors import ShapeError  # noqa: E402
from tests.plugins._guard_helpers import optimize_quietly as _optimize, rand as _rand  # noqa: E402

BACKENDS = ["native", "onnxruntime", "aiacc"]
WHY = r"the MXNet plugin does not optimize it again for other shapes; optimize the original with an example"


def _mx():
    from aiacc.plugins.mxnet._import import import_mxnet

    return import_mxnet()


def _ids(*shape, seed=0):
    return np.random.default_rng(seed).integers(0, 50, shape).astype(np.float32)


def _tagger():
    mx = _mx()
    nn = mx.gluon.nn

    class Tagger(mx.gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            self.emb, self.fc = nn.Embedding(50, 8), nn.Dense(4, flatten=False)

        def hybrid_forward(self, F, x):
            return self.fc(self.emb(x))
    mx.random.seed(0)
    block = Tagger()
    block.initialize(mx.init.Xavier())
    block.hybridize()
    return block


def _cnn(flatten):
    mx = _mx()
    nn = mx.gluon.nn
    mx.random.seed(1)
    net = nn.HybridSequential()
    net.add(nn.Conv2D(4, 3, padding=1), nn.Activation("relu"), nn.Flatten() if flatten else nn.GlobalAvgPool2D(),
            nn.Dense(2))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    return net


def _close(fast, block, x):
    mx = _mx()
    np.testing.assert_allclose(fast(mx.nd.array(x)).asnumpy(), block(mx.nd.array(x)).asnumpy(), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sequence_length(backend):
    mx = _mx()
    block, x = _tagger(), _ids(2, 16)
    block(mx.nd.array(x))
    fast = _optimize(block, [x], backend=backend)
    _close(fast, block, _ids(2, 16, seed=1))
    shapes = fast.aiacc_report.shapes
    if backend == "native":  # MXNet infers the symbol's shapes at each call: verify ran it at 6 rows, 17 tokens
        assert shapes == ["optimized for data [2, None] (None: any size) (any batch size); a call at other shapes "
                          "is a ShapeError", "dimension 1 (16 in the example): runs at other sizes (checked at 17: "
                                             "same outputs)"]
        _close(fast, block, _ids(3, 32, seed=2))
        return
    assert shapes == ["optimized for data [2, 16]; a call at other shapes is a ShapeError"]
    with pytest.raises(ShapeError, match=r"^Tagger: input 'data' of shape \[2, 32\]: its dimension 1 must be 16, "
                                         r"the size the model was built for \(built: data \[2, 16\]\); " + WHY):
        fast(mx.nd.array(_ids(2, 32)))
    with pytest.raises(ShapeError, match=r"input 'data' of shape \[6, 16\]: its dimension 0 must be 2, the batch "
                                         r"size the model was built for \(the optimized model was specialized to "
                                         r"batch 2"):
        fast(mx.nd.array(_ids(6, 16)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_image_size(backend):
    mx = _mx()
    net, x = _cnn(flatten=False), _rand(2, 3, 8, 8)
    net(mx.nd.array(x))
    fast = _optimize(net, [x], backend=backend)
    _close(fast, net, x)
    if backend == "native":  # global pooling: any height and width, verified at 9
        _close(fast, net, _rand(3, 3, 12, 10, seed=3))
        with pytest.raises(ShapeError, match=r"input 'data' of shape \[2, 4, 8, 8\]: its dimension 1 must be 3"):
            fast(mx.nd.array(_rand(2, 4, 8, 8)))  # channels: the original does not run there either
        return
    with pytest.raises(ShapeError, match=r"^HybridSequential: input 'data' of shape \[2, 3, 12, 12\]: its "
                                         r"dimension 2 must be 8, the size the model was built for"):
        fast(mx.nd.array(_rand(2, 3, 12, 12)))


def test_a_flattened_image_size_is_fixed_natively_too():
    """Flatten + Dense: the original itself takes only its example's height and width, so the native block
    is guarded there (a ShapeError instead of MXNet's shape-inference error) and its batch stays free."""
    mx = _mx()
    net, x = _cnn(flatten=True), _rand(2, 3, 8, 8)
    net(mx.nd.array(x))
    fast = _optimize(net, [x])
    assert fast.aiacc_report.shapes[0] == ("optimized for data [2, 3, 8, 8] (any batch size); a call at other "
                                           "shapes is a ShapeError")
    assert "dimension 2 (8 in the example): the original does not run at 9 either" in fast.aiacc_report.shapes[2]
    _close(fast, net, _rand(5, 3, 8, 8, seed=4))
    with pytest.raises(ShapeError, match=r"input 'data' of shape \[2, 3, 12, 12\]: its dimension 2 must be 8"):
        fast(mx.nd.array(_rand(2, 3, 12, 12)))
    with pytest.raises(ShapeError, match=r"input 'data' of shape \[2, 3, 8\] has 3 dimensions, the model was "
                                         r"built for \[2, 3, 8, 8\]"):
        fast(mx.nd.array(_rand(2, 3, 8)))


def test_the_hook_pickles_with_its_spec():
    """The guard is a class holding plain data (a ShapeSpec), not a closure: it pickles and still refuses."""
    from aiacc.plugins.mxnet.guard import ShapeGuardHook

    mx = _mx()
    block, x = _tagger(), _ids(2, 16)
    block(mx.nd.array(x))
    fast = _optimize(block, [x], backend="onnxruntime")
    (hook,) = [h for h in fast._forward_pre_hooks.values() if isinstance(h, ShapeGuardHook)]
    again = pickle.loads(pickle.dumps(hook))
    with pytest.raises(ShapeError, match=r"input 'data' of shape \[2, 32\]: its dimension 1 must be 16"):
        again(fast, (mx.nd.array(_ids(2, 32)),))
    again(fast, (mx.nd.array(x),))


def test_a_saved_native_block_reloads_and_keeps_its_shapes(tmp_path):
    """HybridBlock.export of the optimized native block writes the symbol and parameters; the reloaded
    SymbolBlock computes the same outputs at the built shapes."""
    mx = _mx()
    net, x = _cnn(flatten=True), _rand(2, 3, 8, 8)
    net(mx.nd.array(x))
    fast = _optimize(net, [x])
    fast.export(str(tmp_path / "net"))
    loaded = mx.gluon.SymbolBlock.imports(str(tmp_path / "net-symbol.json"), ["data"],
                                          str(tmp_path / "net-0000.params"))
    np.testing.assert_allclose(loaded(mx.nd.array(x)).asnumpy(), net(mx.nd.array(x)).asnumpy(), rtol=1e-4,
                               atol=1e-5)


def test_a_native_block_inside_a_hybridized_parent_is_traced_on_symbols():
    # hybridizing a parent calls the optimized child with MXNet Symbols, which have no concrete shape: the guard
    # has nothing to compare there (MXNet infers the shapes when the parent runs) and must not refuse the call
    mx = _mx()
    net, x = _cnn(flatten=False), _rand(2, 3, 8, 8)
    net(mx.nd.array(x))
    fast = _optimize(net, [x], backend="native")

    class Parent(mx.gluon.HybridBlock):
        def __init__(self, child):
            super().__init__()
            self.child = child

        def hybrid_forward(self, F, data):
            return self.child(data) * 2

    parent = Parent(fast)
    parent.hybridize()
    np.testing.assert_allclose(parent(mx.nd.array(x)).asnumpy(), 2 * net(mx.nd.array(x)).asnumpy(), rtol=1e-4,
                               atol=1e-5)
    with pytest.raises(ShapeError, match=r"input 'data' of shape \[2, 4, 8, 8\]: its dimension 1 must be 3"):
        fast(mx.nd.array(_rand(2, 4, 8, 8)))  # called on arrays, the guard still checks
