"""aiacc's runtime runs 2-d pooling and LRN in its numba kernels (aiacc.core.runtime.numba_nn), written
into the arena: equal to the reference kernels on every form ONNX and Caffe give them (pads, ceil_mode,
dilations, count_include_pad, NaN inputs), and the runtime really calls them (nothing computed aside)."""
import itertools

import numpy as np
import pytest

pytest.importorskip("numba")

from aiacc.core import Graph, run  # noqa: E402
from aiacc.core.ops.nn import average_pool, lrn, max_pool  # noqa: E402
from aiacc.core.runtime import numba_nn  # noqa: E402
from aiacc.core.runtime.backend import AiaccRuntime  # noqa: E402

FORMS = list(itertools.product([(3, 3), (2, 2), (1, 3)], [(1, 1), (2, 2), (2, 1)],
                               [[0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0]], [0, 1]))


def _graph(op, shape, **attrs):
    g = Graph(op.lower())
    x = g.add_input("x", "float32", shape)
    g.add_output(g.op(op, x, **attrs))
    return g


def _runtime_calls(g, feeds, fn_name, monkeypatch):
    """Run g on aiacc's runtime, counting the calls of numba_nn.<fn_name>; (outputs, calls, copied)."""
    calls = []
    real = getattr(numba_nn, fn_name)

    def counted(*a):
        calls.append(1)
        return real(*a)
    from aiacc.core.runtime import backend

    monkeypatch.setitem(backend.STANDARD_INTO, g.nodes[0].op, counted)
    rt = AiaccRuntime(g)
    out = rt.run_dict(feeds)
    return out, len(calls), next(iter(rt._interps.values())).copied


@pytest.mark.parametrize("kernel,strides,pads,ceil", FORMS)
@pytest.mark.parametrize("dilations", [(1, 1), (2, 1)])
def test_max_pool_equals_the_reference(kernel, strides, pads, ceil, dilations):
    x = np.random.default_rng(0).standard_normal((2, 3, 11, 10)).astype(np.float32)
    attrs = dict(kernel_shape=list(kernel), strides=list(strides), pads=pads, ceil_mode=ceil,
                 dilations=list(dilations))
    want = max_pool(x, auto_pad="NOTSET", storage_order=0, **attrs)[0]
    g = _graph("MaxPool", x.shape, **attrs)
    out = np.full_like(want, 7.0)
    assert numba_nn.pool_into(g.nodes[0], [x], out)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("kernel,strides,pads,ceil", FORMS)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool_equals_the_reference(kernel, strides, pads, ceil, include_pad):
    x = np.random.default_rng(1).standard_normal((2, 3, 11, 10)).astype(np.float32)
    attrs = dict(kernel_shape=list(kernel), strides=list(strides), pads=pads, ceil_mode=ceil,
                 count_include_pad=include_pad)
    with np.errstate(invalid="ignore"):  # a window wholly in the padding: 0 / 0 in both
        want = average_pool(x, auto_pad="NOTSET", dilations=None, **attrs)
    g = _graph("AveragePool", x.shape, **attrs)
    out = np.empty_like(want)
    assert numba_nn.pool_into(g.nodes[0], [x], out)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-7, equal_nan=True)


def test_max_pool_propagates_nan_and_padding_never_wins():
    x = -np.ones((1, 1, 4, 4), np.float32) * 5
    x[0, 0, 1, 2] = np.nan
    g = _graph("MaxPool", x.shape, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)
    want = max_pool(x, auto_pad="NOTSET", storage_order=0, kernel_shape=[3, 3], strides=[2, 2],
                    pads=[1, 1, 1, 1], ceil_mode=1, dilations=None)[0]
    out = np.empty_like(want)
    assert numba_nn.pool_into(g.nodes[0], [x], out)
    np.testing.assert_array_equal(out, want)  # NaN where the window holds it, -5 elsewhere (not 0 / -inf)
    assert np.isnan(out).any() and (out[~np.isnan(out)] == -5).all()


@pytest.mark.parametrize("size", [1, 3, 4, 5])
def test_lrn_equals_the_reference(size):
    x = np.random.default_rng(2).standard_normal((2, 16, 7, 5)).astype(np.float32)
    want = lrn(x, alpha=1e-2, beta=0.75, bias=2.0, size=size)
    g = _graph("LRN", x.shape, size=size, alpha=1e-2, beta=0.75, bias=2.0)
    out = np.empty_like(want)
    assert numba_nn.lrn_into(g.nodes[0], [x], out)
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_other_forms_are_left_to_the_caller():
    x = np.zeros((1, 2, 4, 4, 4), np.float32)  # 3-d pooling
    g = _graph("MaxPool", x.shape, kernel_shape=[2, 2, 2])
    assert not numba_nn.pool_into(g.nodes[0], [x], np.empty((1, 2, 3, 3, 3), np.float32))
    x = np.zeros((1, 2, 4, 4), np.float32)
    g = _graph("LRN", x.shape, size=3)
    assert not numba_nn.lrn_into(g.nodes[0], [x], x)  # in place: the window reads what it overwrote


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),  # Caffe's default rounding
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1)),
    ("LRN", dict(size=5, alpha=1e-4, beta=0.75)),
])
def test_the_runtime_runs_them_into_the_arena(op, attrs, monkeypatch):
    x = np.random.default_rng(3).standard_normal((1, 8, 13, 13)).astype(np.float32)
    g = _graph(op, x.shape, **attrs)
    out, calls, copied = _runtime_calls(g, {"x": x}, "lrn_into" if op == "LRN" else "pool_into", monkeypatch)
    assert calls == 1 and copied == 0
    want = run(g, {"x": x})
    name = g.outputs[0].name
    np.testing.assert_allclose(out[name], want[name], rtol=1e-5, atol=1e-7)
