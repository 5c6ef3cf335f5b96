"""One MXNet op at a time: the importer's IR (run by the reference executor) and the exported SymbolBlock
both reproduce MXNet's own output, and the op is translated (not left opaque)."""
import numpy as np
import pytest

import aiacc
from aiacc.core import run
from aiacc.plugins.mxnet._import import import_mxnet
from aiacc.plugins.mxnet.import_ops.basic import mx_reshape_shape
from aiacc.plugins.mxnet.translator import MXNetTranslator

from tests.plugins.mxnet.conftest import rel_err

mx = import_mxnet()
S = mx.sym


def check(out, shapes, *, seed=0, opaque=(), ints=None, positive=False):
    """Trace `out` with random inputs/params, compare IR and exported block with MXNet."""
    rng = np.random.default_rng(seed)
    arg_shapes, _, aux_shapes = out.infer_shape(**shapes)
    feeds = {}
    for name, shape in shapes.items():
        if ints and name in ints:
            feeds[name] = rng.integers(-ints[name] if name.startswith("neg") else 0, ints[name], shape).astype("float32")
        else:
            a = rng.standard_normal(shape).astype("float32")
            feeds[name] = np.abs(a) + 0.1 if positive else a
    args = {n: mx.nd.array(rng.standard_normal(s).astype("float32")) for n, s in zip(out.list_arguments(), arg_shapes)
            if n not in shapes}
    aux = {n: mx.nd.array(rng.uniform(0.5, 1.5, s).astype("float32")) for n, s in
           zip(out.list_auxiliary_states(), aux_shapes)}
    model = (out, args, aux)
    g = aiacc.trace(model, feeds)
    assert sorted(n.op for n in g if n.is_opaque) == sorted(opaque)
    expected = MXNetTranslator().run(model, feeds)
    got = list(run(g, feeds).values())
    for a, e in zip(got, expected):
        assert a.shape == e.shape and rel_err(a, e) < 1e-4
    block = aiacc.export(g, "mxnet")
    exported = MXNetTranslator().run(block, [feeds[v.name] for v in g.inputs])
    for a, e in zip(exported, expected):
        assert a.shape == e.shape and rel_err(a, e) < 1e-4
    return g


X = S.var("x")


@pytest.mark.parametrize("spec,reverse", [((0, -1), False), ((-2,), False), ((0, -3), False), ((-3, -2), False),
                                          ((-4, 2, -1, -2), False), ((-4, -1, 3, 0, 0), False), ((0, 0, -1), True),
                                          ((-1, 0), True), ((4, 0, -1), False), ((2, -1, 0), True)])
def test_reshape_codes_match_mxnet(spec, reverse):
    shape = (6, 5, 4)
    expected = mx.nd.zeros(shape).reshape(shape=spec, reverse=reverse).shape
    assert mx_reshape_shape(shape, spec, reverse) == expected
    check(S.reshape(X, shape=spec, reverse=reverse), {"x": shape})


@pytest.mark.parametrize("kw", [
    dict(pool_type="max", kernel=(3, 3), stride=(2, 2)),
    dict(pool_type="max", kernel=(3, 3), stride=(2, 2), pad=(1, 1), pooling_convention="full"),
    dict(pool_type="avg", kernel=(3, 3), stride=(2, 2), pad=(1, 1)),
    dict(pool_type="avg", kernel=(3, 3), stride=(2, 2), pad=(1, 1), count_include_pad=False),
    dict(pool_type="avg", kernel=(2, 2), stride=(2, 2), pooling_convention="full"),
    dict(pool_type="max", global_pool=True, kernel=(1, 1)),
    dict(pool_type="avg", global_pool=True, kernel=(1, 1)),
])
def test_pooling(kw):
    check(S.Pooling(X, **kw), {"x": (2, 3, 9, 9)})


def test_pooling_1d():
    check(S.Pooling(X, pool_type="avg", kernel=(3,), stride=(2,), pad=(1,)), {"x": (2, 3, 10)})


@pytest.mark.parametrize("kw", [dict(num_filter=6, kernel=(3, 3), stride=(2, 2), pad=(1, 1), no_bias=True),
                                dict(num_filter=6, kernel=(3, 3), num_group=3, dilate=(2, 1)),
                                dict(num_filter=4, kernel=(1, 1))])
def test_convolution(kw):
    check(S.Convolution(X, name="c", **kw), {"x": (2, 6, 9, 9)})


def test_convolution_1d():
    check(S.Convolution(X, num_filter=4, kernel=(3,), pad=(1,), name="c"), {"x": (2, 3, 10)})


def test_deconvolution_with_adj():
    check(S.Deconvolution(X, num_filter=4, kernel=(3, 3), stride=(2, 2), pad=(1, 1), adj=(1, 1), name="d"),
          {"x": (1, 3, 5, 5)})


@pytest.mark.parametrize("fix_gamma", [True, False])
def test_batchnorm(fix_gamma):
    g = check(S.BatchNorm(X, fix_gamma=fix_gamma, eps=2e-5, name="bn"), {"x": (2, 3, 4, 4)})
    assert g.find_nodes("BatchNormalization")[0].attrs["epsilon"] == pytest.approx(2e-5)


@pytest.mark.parametrize("act", ["relu", "sigmoid", "tanh", "softrelu", "softsign"])
def test_activation(act):
    check(S.Activation(X, act_type=act), {"x": (2, 7)})


@pytest.mark.parametrize("kw", [dict(act_type="leaky", slope=0.3), dict(act_type="elu", slope=0.5),
                                dict(act_type="selu"), dict(act_type="gelu")])
def test_leaky_relu(kw):
    check(S.LeakyReLU(X, **kw), {"x": (2, 3, 4)})


def test_rrelu_stays_opaque():
    # rrelu exposes a second output (its mask); kept as MXNet's own op
    check(S.LeakyReLU(X, act_type="rrelu", lower_bound=0.1, upper_bound=0.3)[0] * 1.0, {"x": (2, 3, 4)},
          opaque=["LeakyReLU"])


def test_prelu_per_channel():
    check(S.LeakyReLU(X, S.var("gamma", shape=(3,)), act_type="prelu"), {"x": (2, 3, 4, 4)})


@pytest.mark.parametrize("flatten", [True, False])
def test_fully_connected(flatten):
    check(S.FullyConnected(X, num_hidden=5, flatten=flatten, name="fc"), {"x": (2, 3, 4)})


def test_fully_connected_no_bias():
    check(S.FullyConnected(X, num_hidden=5, no_bias=True, name="fc"), {"x": (2, 4)})


@pytest.mark.parametrize("op", ["elemwise_add", "elemwise_sub", "elemwise_mul", "elemwise_div"])
def test_elemwise(op):
    check(getattr(S, op)(X, S.var("y")), {"x": (2, 3), "y": (2, 3)}, positive=True)


@pytest.mark.parametrize("op", ["broadcast_add", "broadcast_sub", "broadcast_mul", "broadcast_div",
                                "broadcast_maximum", "broadcast_minimum", "broadcast_power"])
def test_broadcast(op):
    check(getattr(S, op)(X, S.var("y")), {"x": (2, 3, 4), "y": (1, 3, 1)}, positive=True)


@pytest.mark.parametrize("expr", [lambda x: x + 2.0, lambda x: x - 2.0, lambda x: 2.0 - x, lambda x: x * 3.0,
                                  lambda x: x / 4.0, lambda x: 4.0 / x, lambda x: x ** 3.0, lambda x: 2.0 ** x,
                                  lambda x: S.maximum(x, 0.5), lambda x: S.minimum(x, 0.5)])
def test_scalar_ops(expr):
    check(expr(X), {"x": (2, 5)}, positive=True)


@pytest.mark.parametrize("op", ["sqrt", "exp", "log", "abs", "negative", "reciprocal", "floor", "ceil", "sign",
                                "sin", "cos", "rsqrt", "square", "erf", "relu", "sigmoid", "identity", "BlockGrad"])
def test_unary(op):
    check(getattr(S, op)(X), {"x": (3, 4)}, positive=op in ("sqrt", "log", "rsqrt"))


def test_add_n():
    check(S.add_n(X, S.var("y"), S.var("z")), {"x": (2, 3), "y": (2, 3), "z": (2, 3)})


@pytest.mark.parametrize("kw", [dict(axis=1), dict(axis=0, temperature=2.0)])
def test_softmax(kw):
    check(S.softmax(X, **kw), {"x": (3, 5)})


def test_log_softmax_and_softmax_activation():
    check(S.log_softmax(X, axis=-1) + S.SoftmaxActivation(S.var("y"), mode="channel").sum(axis=(2, 3)),
          {"x": (2, 4), "y": (2, 4, 3, 3)})


def test_layernorm():
    check(S.LayerNorm(X, eps=1e-3, name="ln"), {"x": (2, 3, 6)})


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_batch_dot(ta, tb):
    a = (2, 4, 3) if ta else (2, 3, 4)
    b = (2, 5, 4) if tb else (2, 4, 5)
    check(S.batch_dot(X, S.var("y"), transpose_a=ta, transpose_b=tb), {"x": a, "y": b})


@pytest.mark.parametrize("tb", [False, True])
def test_dot(tb):
    check(S.dot(X, S.var("y"), transpose_b=tb), {"x": (2, 3, 4), "y": (5, 4) if tb else (4, 5)})


def test_embedding_and_take():
    emb = S.Embedding(X, S.var("w", shape=(10, 4)), input_dim=10, output_dim=4)
    check(emb, {"x": (2, 3)}, ints={"x": 10})
    check(S.take(S.var("w", shape=(10, 4)), S.var("neg_idx"), axis=0, mode="wrap"), {"neg_idx": (5,)},
          ints={"neg_idx": 10})


def test_concat_split_squeeze():
    parts = S.split(X, num_outputs=3, axis=2, squeeze_axis=True)
    check(S.Concat(parts[2], parts[0], parts[1], dim=1), {"x": (2, 2, 3)})


def test_slicing():
    check(S.slice_axis(X, axis=-1, begin=1, end=-1) * 1.0, {"x": (2, 3, 6)})
    check(S.slice(X, begin=(None, 1, 0), end=(None, 3, 6), step=(None, 1, 2)), {"x": (2, 3, 6)})


def test_expand_squeeze_transpose_flatten():
    y = S.transpose(S.expand_dims(X, axis=1), axes=(0, 3, 1, 2))
    check(S.Flatten(S.squeeze(y, axis=2)) + 0.0, {"x": (2, 3, 4)})


def test_clip_cast_where():
    c = S.clip(X, a_min=-0.3, a_max=0.4)
    cond = S.relu(S.sign(X))
    check(S.where(cond, c, S.var("y")), {"x": (3, 4), "y": (3, 4)})
    check(S.Cast(S.Cast(X, dtype="float16"), dtype="float32"), {"x": (3, 4)})


@pytest.mark.parametrize("op", ["mean", "sum", "max", "min"])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(op, keepdims):
    check(getattr(S, op)(X, axis=(1, 2), keepdims=keepdims), {"x": (2, 3, 4, 5)})


def test_broadcast_to_and_axis():
    check(S.broadcast_to(X, shape=(0, 4, 0)), {"x": (2, 1, 3)})
    check(S.broadcast_axis(X, axis=1, size=4), {"x": (2, 1, 3)})


def test_dropout_is_identity_at_inference():
    g = check(S.Dropout(X, p=0.3), {"x": (2, 5)})
    assert g.find_nodes("Dropout")


def test_unknown_op_is_opaque_and_runs():
    check(S.smooth_l1(X, scalar=1.5) + S.rcbrt(S.abs(X) + 1.0), {"x": (2, 6)}, opaque=["rcbrt", "smooth_l1"])


def test_opaque_shape_inference_keeps_symbols():
    from aiacc.core.ir import TensorType
    from aiacc.plugins.mxnet.mxrun import OpaqueBackend
    from aiacc.plugins.mxnet.symjson import MxNode

    backend = OpaqueBackend()
    l2 = MxNode(1, "L2Normalization", "l2", {"mode": "channel"})
    assert backend.infer(l2, [TensorType("float32", ("N", 3, None, "W"))]) == \
        [TensorType("float32", ("N", 3, None, "W"))]
    pool = MxNode(1, "Pooling", "p", {"kernel": "(2, 2)", "stride": "(2, 2)", "pool_type": "max"})
    # H/2 is derived from a symbol: unknown, not a made-up number
    assert backend.infer(pool, [TensorType("float32", ("N", 3, "H", 8))]) == \
        [TensorType("float32", ("N", 3, None, 4))]
