"""The MXNet plugin on constructs beyond the zoo: recurrent layers, ops with several outputs or state, ops
whose shapes MXNet infers backwards or only at run time, and the less common ops an unseen architecture
uses. For each: the traced graph reproduces MXNet, optimize() with the native and the onnxruntime backend
reproduces it (within 1e-4 relative), the exported files re-import with SymbolBlock.imports, and ops
aiacc does not translate stay opaque and come back unchanged."""
import json
import warnings

import numpy as np
import pytest

import aiacc
from aiacc.core import run
from aiacc.errors import AiaccError
from aiacc.plugins.mxnet._import import import_mxnet
from aiacc.plugins.mxnet.translator import MXNetTranslator

from tests.plugins.mxnet.conftest import rel_err

mx = import_mxnet()
S = mx.sym
X, Y = S.var("x"), S.var("y")
nn, rnn = mx.gluon.nn, mx.gluon.rnn
T = MXNetTranslator()


def _same(actual, expected, what):
    assert len(actual) == len(expected), what
    for a, e in zip(actual, expected):
        assert a.shape == e.shape, f"{what}: shape {a.shape} vs {e.shape}"
        assert rel_err(a, e) < 1e-4, f"{what}: differs by {rel_err(a, e):.2e}"


def _reimport(block, names, tmp_path):
    block.export(str(tmp_path / "m"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = mx.gluon.SymbolBlock.imports(str(tmp_path / "m-symbol.json"), names, str(tmp_path / "m-0000.params"))
    with open(tmp_path / "m-symbol.json") as f:
        return again, json.load(f)["nodes"]


def check(model, feeds, tmp_path, *, opaque=()):
    """Trace, run the IR, optimize with both backends, export and re-import: all equal MXNet's outputs.
    `opaque`: the MXNet ops expected to stay opaque (and to be written back by the export)."""
    g = aiacc.trace(model, feeds)
    assert sorted({n.op for n in g if n.is_opaque}) == sorted(set(opaque))
    expected = T.run(model, feeds)
    result = run(g, {v.name: feeds[v.name] if isinstance(feeds, dict) else feeds[i] for i, v in enumerate(g.inputs)})
    _same([result[v.name] for v in g.outputs], expected, "reference executor")
    blocks = {}
    for backend in ("onnxruntime", "native"):
        blocks[backend] = aiacc.optimize(model, feeds, backend=backend)  # verifies against MXNet itself
        _same(T.run(blocks[backend], feeds), expected, f"backend={backend}")
    names = [v.name for v in g.inputs]
    again, nodes = _reimport(blocks["native"], names, tmp_path)
    arrays = [feeds[n] for n in names] if isinstance(feeds, dict) else list(feeds)
    _same(T.run(again, arrays), expected, "re-imported export")
    # every opaque node is written back as it was read: same op, same attributes
    kept = {(n.meta["mxnet_node"]["op"], json.dumps(n.meta["mxnet_node"]["attrs"], sort_keys=True))
            for n in g if n.is_opaque}
    written = {(n["op"], json.dumps(n.get("attrs", {}), sort_keys=True)) for n in nodes}
    assert kept <= written
    return g


def _triple(out, shapes, seed=0, ints=None):
    """A (Symbol, args, aux) triple with random parameters, and random feeds for `shapes`."""
    rng = np.random.default_rng(seed)
    ints = ints or {}
    arg_shapes, _, aux_shapes = out.infer_shape_partial(**shapes)
    feeds = {k: (rng.integers(0, ints[k], s).astype("float32") if k in ints else
                 rng.standard_normal(s).astype("float32")) for k, s in shapes.items()}
    args = {n: mx.nd.array(rng.standard_normal(s).astype("float32"))
            for n, s in zip(out.list_arguments(), arg_shapes) if n not in shapes}
    aux = {n: mx.nd.array(rng.uniform(0.5, 1.5, s).astype("float32"))
           for n, s in zip(out.list_auxiliary_states(), aux_shapes)}
    return (out, args, aux), feeds


F4 = (2, 3, 6, 6)

# op -> (symbol, input shapes): translated into the IR, no opaque node left
TRANSLATED = {
    "upsampling_nearest": (lambda: S.UpSampling(X, scale=2, sample_type="nearest", num_args=1), {"x": F4}),
    "upsampling_nearest_x3": (lambda: S.UpSampling(X, scale=3, sample_type="nearest", num_args=1), {"x": F4}),
    "upsampling_bilinear": (lambda: S.UpSampling(X, S.var("w", shape=(3, 1, 4, 4)), scale=2, num_filter=3,
                                                 sample_type="bilinear", num_args=2), {"x": F4}),
    "instance_norm": (lambda: S.InstanceNorm(X, S.var("g"), S.var("b"), eps=1e-3), {"x": F4}),
    "instance_norm_1d": (lambda: S.InstanceNorm(X, S.var("g"), S.var("b")), {"x": (2, 3, 7)}),
    "group_norm": (lambda: S.GroupNorm(X, S.var("g"), S.var("b"), num_groups=2), {"x": (2, 4, 3, 3)}),
    "l2_normalization": (lambda: S.L2Normalization(X, mode="instance") + S.L2Normalization(X, mode="channel")
                         + S.L2Normalization(X, mode="spatial"), {"x": (2, 3, 4, 5)}),
    "deconvolution_adj_bias": (lambda: S.Deconvolution(X, num_filter=4, kernel=(4, 4), stride=(2, 2), pad=(1, 1),
                                                       adj=(1, 1), no_bias=False, name="d"), {"x": F4}),
    "deconvolution_groups": (lambda: S.Deconvolution(X, num_filter=6, kernel=(3, 3), num_group=3, name="d"),
                             {"x": F4}),
    "pooling_full_avg": (lambda: S.Pooling(X, kernel=(3, 3), stride=(2, 2), pool_type="avg",
                                           pooling_convention="full"), {"x": (2, 3, 8, 8)}),
    "pooling_global_max_sum": (lambda: S.Pooling(X, kernel=(1, 1), global_pool=True, pool_type="max")
                               + S.Pooling(X, kernel=(1, 1), global_pool=True, pool_type="sum"), {"x": F4}),
    "pooling_sum": (lambda: S.Pooling(X, kernel=(2, 2), stride=(2, 2), pad=(1, 1), pool_type="sum"), {"x": F4}),
    "leaky_relu_variants": (lambda: S.LeakyReLU(X, act_type="leaky", slope=0.1)
                            + S.LeakyReLU(X, act_type="elu", slope=0.7)
                            + S.LeakyReLU(X, act_type="selu") + S.LeakyReLU(X, act_type="gelu")
                            + S.LeakyReLU(X, S.var("gm", shape=(3,)), act_type="prelu"), {"x": F4}),
    "activations": (lambda: S.Activation(X, act_type="softrelu") + S.Activation(X, act_type="softsign")
                    + S.hard_sigmoid(X, alpha=0.3, beta=0.4) + S.hard_sigmoid(X), {"x": F4}),
    "broadcast_like": (lambda: S.broadcast_like(X, Y) + S.broadcast_like(X, S.var("z"), lhs_axes=(1,), rhs_axes=(0,)),
                       {"x": (2, 1, 4), "y": (2, 3, 4), "z": (3, 5)}),
    "maximum_minimum": (lambda: S.maximum(X, Y) + S.minimum(X, Y) + S.maximum(X, 0.2) + S.minimum(X, 0.1)
                        + S.broadcast_maximum(X, S.var("z")), {"x": (2, 3), "y": (2, 3), "z": (1, 3)}),
    "comparisons_where": (lambda: S.where(X > 0, X, Y) + S.broadcast_greater(X, Y) + S.broadcast_not_equal(X, Y)
                          + (X < 0.1) + (X != 0.3) + S.logical_not(X > 0.5), {"x": (2, 5), "y": (2, 5)}),
    "slice_none_and_steps": (lambda: S.slice(X, begin=(None, 1), end=(None, None), step=(None, 2))
                             + S.slice(X, begin=(None, 6), end=(None, 1), step=(1, -2))
                             + S.slice(X, begin=(-2, None), end=(None, -4)), {"x": (2, 7)}),
    "slice_like_reverse": (lambda: S.slice_like(X, Y) + S.slice_like(X, Y, axes=(0,)).slice_axis(axis=1, begin=0, end=3)
                           + S.reverse(S.slice_like(X, Y), axis=1), {"x": (4, 7), "y": (2, 3)}),
    "take_clip_and_wrap": (lambda: S.take(S.var("w", shape=(6, 4)), S.var("idx") - 3.0)
                           + S.take(S.var("w2", shape=(6, 4)), S.var("idx"), mode="wrap"), {"idx": (2, 5)}),
    "take_axis1": (lambda: S.take(X, S.var("idx"), axis=1), {"x": (3, 6), "idx": (2, 2)}),
    "tile_repeat_stack": (lambda: S.Group([S.tile(X, reps=(2, 1, 3)), S.tile(S.var("v"), reps=(2, 3, 1)),
                                           S.tile(S.var("v"), reps=(2,)),
                                           S.repeat(S.stack(S.var("v"), S.var("v"), axis=-1), repeats=3, axis=1)]),
                          {"x": (2, 3, 4), "v": (2, 4)}),
    "repeat_flat": (lambda: S.repeat(X, repeats=2), {"x": (2, 3)}),
    "squeeze_expand_swap": (lambda: S.SwapAxis(S.expand_dims(S.squeeze(X), axis=-1), dim1=0, dim2=2),
                            {"x": (2, 1, 3, 1)}),
    "norms": (lambda: S.norm(X, ord=2, axis=1, keepdims=True).sum() + S.norm(X) + S.norm(X, ord=1, axis=(1, 2)).sum(),
              {"x": (2, 3, 4)}),
    "reductions": (lambda: S.sum(X, axis=1, exclude=True).sum() + S.mean(X) + S.max(X, axis=-1, keepdims=True).sum()
                   + S.min(X, axis=(0, 2), exclude=True, keepdims=True).sum(), {"x": (2, 3, 4)}),
    "softmaxes": (lambda: S.log_softmax(X, axis=1) + S.softmax(X, axis=-1, temperature=2.0)
                  + S.log_softmax(X, axis=-1, temperature=0.5) + S.SoftmaxActivation(X), {"x": (2, 3, 4)}),
    "softmax_output": (lambda: S.SoftmaxOutput(X, name="so")
                       + S.SoftmaxOutput(S.var("m"), multi_output=True).sum(axis=2),
                       {"x": (2, 5), "m": (2, 5, 3)}),
    "loss_heads": (lambda: S.MakeLoss(X * 2) + S.LinearRegressionOutput(X) + S.LogisticRegressionOutput(X)
                   + S.BlockGrad(X) + S.stop_gradient(X) + S.identity(X), {"x": (2, 3)}),
    "crop": (lambda: S.Crop(X, h_w=(3, 4), offset=(1, 1), num_args=1) + S.Crop(X, Y, num_args=2, center_crop=True),
             {"x": F4, "y": (2, 3, 3, 4)}),
    "pad_modes": (lambda: S.Pad(X, mode="constant", pad_width=(0, 0, 0, 0, 1, 2, 2, 1), constant_value=0.5)
                  + S.Pad(X, mode="edge", pad_width=(0, 0, 0, 0, 1, 2, 2, 1))
                  + S.Pad(X, mode="reflect", pad_width=(0, 0, 0, 0, 1, 2, 2, 1)), {"x": F4}),
    "casts": (lambda: S.Cast(S.Cast(X, dtype="int32"), dtype="float32")
              + S.amp_cast(S.amp_cast(X, dtype="float16"), dtype="float32"), {"x": (2, 3)}),
    "creation": (lambda: S.zeros_like(X) + S.ones_like(X) * X + S.zeros(shape=(2, 3)) + S.full(shape=(2, 3), val=0.5)
                 + S.broadcast_add(X, S.arange(0, 3, 1)) + S.broadcast_add(X, S.ones(shape=(3,))), {"x": (2, 3)}),
    "depth_space": (lambda: S.space_to_depth(S.depth_to_space(X, block_size=2), block_size=2), {"x": (2, 8, 3, 3)}),
    "reshape_like_split_v2": (lambda: S.reshape_like(X, Y) + S.split_v2(X.reshape((3, 4)), indices_or_sections=(1, 3),
                                                                          axis=1)[1].tile(reps=(1, 2)),
                              {"x": (2, 6), "y": (3, 4)}),
    "argmax_argmin": (lambda: S.argmax(X, axis=1) + S.argmin(X, axis=-1)
                      + S.argmax(X, axis=1, keepdims=True).sum(axis=1),
                      {"x": (2, 5)}),
    "lrn_batchnorm_last_axis": (lambda: S.LRN(X, nsize=3).mean(axis=(2, 3)) + S.BatchNorm(S.var("z"), axis=-1,
                                                                                           fix_gamma=False).sum(axis=1),
                                {"x": (2, 4, 3, 3), "z": (2, 3, 4)}),
    "div_sqrt_dim": (lambda: S.contrib.div_sqrt_dim(X), {"x": (2, 4)}),
    "sequence_ops": (lambda: S.Group([S.SequenceLast(X), S.SequenceLast(X, axis=1), S.SequenceReverse(X),
                                      S.SequenceMask(X), S.shape_array(X)]), {"x": (5, 2, 3)}),
    "arange_like": (lambda: S.broadcast_add(X, S.contrib.arange_like(X, axis=1)) + S.contrib.arange_like(X, repeat=3)
                    + S.broadcast_mul(X, S.contrib.arange_like(X, start=1.5, step=2.0, repeat=2, axis=1)),
                    {"x": (2, 5)}),
    "legacy_reshape": (lambda: S.Group([S.Reshape(X, target_shape=(0, 6)), S.Reshape(X, target_shape=(2, 0)),
                                        S.Reshape(X, target_shape=(7, 0, 2), keep_highest=True)]), {"x": (2, 3, 4)}),
    "layer_norm_channel_axis": (lambda: S.LayerNorm(X, S.var("g"), S.var("b"), axis=1, eps=1e-4), {"x": (2, 3, 4, 5)}),
    "softmax_dtype": (lambda: S.Cast(S.softmax(X, axis=1, dtype="float64"), dtype="float32")
                      + S.log_softmax(X, axis=1, dtype="float64").astype("float32"), {"x": (2, 3)}),
    "bilinear_resize": (lambda: S.Group([S.contrib.BilinearResize2D(X, height=8, width=10),
                                         S.contrib.BilinearResize2D(X, height=3, width=7, align_corners=False),
                                         S.contrib.BilinearResize2D(X, Y, mode="like")]),
                        {"x": (2, 3, 4, 5), "y": (1, 1, 6, 2)}),
    "adaptive_avg_pool_sync_bn": (lambda: S.Group([
        S.contrib.AdaptiveAvgPooling2D(X, output_size=1), S.contrib.AdaptiveAvgPooling2D(X, output_size=(2, 3)),
        S.contrib.SyncBatchNorm(X, S.var("g"), S.var("b"), S.var("m"), S.var("v"), key="k", fix_gamma=False)]),
        {"x": (2, 3, 4, 6)}),
}


@pytest.mark.parametrize("name", sorted(TRANSLATED))
def test_translated_op(name, tmp_path):
    fn, shapes = TRANSLATED[name]
    model, feeds = _triple(fn(), shapes, ints={"idx": 9})
    check(model, feeds, tmp_path)


# op -> (symbol, input shapes, ops that stay opaque): MXNet semantics aiacc keeps as they are
OPAQUE = {
    "lp_pooling": (lambda: S.Pooling(X, kernel=(2, 2), stride=(2, 2), pool_type="lp", p_value=2), {"x": F4},
                   ["Pooling"]),
    "rrelu": (lambda: S.LeakyReLU(X, act_type="rrelu")[0] * 1.0, {"x": (2, 3)}, ["LeakyReLU"]),
    # MKLDNN builds take a 4-d SoftmaxOutput over the last axis, others over all but the batch axis
    "softmax_output_4d": (lambda: S.SoftmaxOutput(X), {"x": (2, 5, 3, 3)}, ["SoftmaxOutput"]),
    "prod_nansum": (lambda: S.prod(X, axis=1) + S.nansum(X, axis=1), {"x": (2, 3, 4)}, ["prod", "nansum"]),
    "topk_both_outputs": (lambda: S.Group(list(S.topk(X, k=2, ret_typ="both", axis=-1))), {"x": (2, 5)}, ["topk"]),
    "multi_output_opaque_feeding_split": (lambda: S.Group([S.topk(X, k=2, ret_typ="both")[1] + 1.0,
                                                           S.SliceChannel(X, num_outputs=5, axis=1)[3]]),
                                          {"x": (2, 5)}, ["topk"]),
    "data_dependent_shape": (lambda: S.contrib.boolean_mask(X, S.var("m")) * 2.0, {"x": (4, 3), "m": (4,)},
                             ["_contrib_boolean_mask"]),
    "detection_ops": (lambda: S.broadcast_add(S.contrib.MultiBoxPrior(X, sizes=(0.5,), ratios=(1, 2)),
                                              S.zeros((1, 1, 4))), {"x": (1, 3, 4, 4)}, ["_contrib_MultiBoxPrior"]),
    "adaptive_avg_pool_uneven": (lambda: S.contrib.AdaptiveAvgPooling2D(X, output_size=(3, 4)), {"x": (2, 3, 4, 6)},
                                 ["_contrib_AdaptiveAvgPooling2D"]),
    "bilinear_resize_by_scale": (lambda: S.contrib.BilinearResize2D(X, scale_height=2.0, scale_width=1.5),
                                 {"x": (2, 3, 4, 6)}, ["_contrib_BilinearResize2D"]),
    "sequence_ops_with_lengths": (lambda: S.SequenceLast(X, S.var("n"), use_sequence_length=True)
                                  + S.SequenceReverse(X, S.var("n"), use_sequence_length=True).sum(axis=0)
                                  + S.SequenceMask(X, S.var("n"), use_sequence_length=True).sum(axis=0),
                                  {"x": (5, 2, 3), "n": (2,)}, ["SequenceLast", "SequenceReverse", "SequenceMask"]),
}


@pytest.mark.parametrize("name", sorted(OPAQUE))
def test_opaque_op_round_trips(name, tmp_path):
    fn, shapes, opaque = OPAQUE[name]
    model, feeds = _triple(fn(), shapes, ints={"m": 2, "n": 6})
    if "n" in feeds:
        feeds["n"] = np.maximum(feeds["n"], 1)  # sequence lengths
    check(model, feeds, tmp_path, opaque=opaque)


def test_full_reduction_keeps_mxnet_shape():
    """MXNet 1.x has no 0-d arrays: mean over every axis is shape (1,), in the IR too."""
    model, feeds = _triple(S.mean(X) + S.norm(X), {"x": (2, 3)})
    g = aiacc.trace(model, feeds)
    assert g.outputs[0].shape == (1,) and not [n for n in g if n.is_opaque]


def test_data_dependent_output_has_unknown_shape():
    model, feeds = _triple(S.contrib.boolean_mask(X, S.var("m")), {"x": (4, 3), "m": (4,)}, ints={"m": 2})
    g = aiacc.trace(model, feeds)
    (node,) = [n for n in g if n.is_opaque]
    assert node.output.shape is None and node.output.dtype == "float32"  # MXNet's () means "not known"


def test_deconvolution_target_shape_gives_pad_and_adj():
    """MXNet derives pad/adj from target_shape (total = stride*(in-1) + kernel - target; pad = ceil(total/2),
    adj = total % 2). MKLDNN builds cannot run target_shape themselves, so compare with the explicit form."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 6, 6)).astype("float32")
    w = mx.nd.array(rng.standard_normal((3, 4, 4, 4)).astype("float32"))
    out = S.Deconvolution(X, num_filter=4, kernel=(4, 4), stride=(2, 3), target_shape=(13, 14), name="d")
    g = aiacc.trace((out, {"d_weight": w}, {}), {"x": x})
    (conv,) = g.find_nodes("ConvTranspose")
    # H: total = 2*5 + 4 - 13 = 1 -> pad 1, adj 1;  W: total = 3*5 + 4 - 14 = 5 -> pad 3, adj 1
    assert conv.attrs["pads"] == [1, 3, 1, 3] and conv.attrs["output_padding"] == [1, 1]
    explicit = S.Deconvolution(X, num_filter=4, kernel=(4, 4), stride=(2, 3), pad=(1, 3), adj=(1, 1), name="d")
    expected = T.run((explicit, {"d_weight": w}, {}), {"x": x})
    got = list(run(g, {"x": x}).values())
    assert got[0].shape == (2, 4, 13, 14)
    _same(got, expected, "reference executor")
    block = aiacc.export(g, "mxnet")  # written with explicit pad/adj: runs on MKLDNN builds too
    _same(T.run(block, [x]), expected, "exported")


# -- Gluon blocks -------------------------------------------------------------------------------------

class _Seq(nn.HybridBlock):
    def __init__(self, layer, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.layer = layer
            self.fc = nn.Dense(4, flatten=False)

    def hybrid_forward(self, F, x):
        return self.fc(self.layer(x))


class _Unrolled(nn.HybridBlock):
    def __init__(self, cell, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.cell = cell

    def hybrid_forward(self, F, x):
        return self.cell.unroll(4, x, layout="NTC", merge_outputs=True)[0]


def _gluon(block, shape, seed=0):
    block.initialize(mx.init.Xavier(magnitude=2.0))
    block.hybridize()
    x = np.random.default_rng(seed).standard_normal(shape).astype("float32")
    block(mx.nd.array(x))
    return block, [x]


RECURRENT = {
    "lstm": (lambda: _Seq(rnn.LSTM(16, layout="NTC")), (2, 5, 8), ["RNN", "_zeros"]),
    "lstm_2_layers_bidirectional": (lambda: _Seq(rnn.LSTM(8, num_layers=2, bidirectional=True, layout="NTC")),
                                    (2, 5, 6), ["RNN", "_zeros"]),
    "lstm_projection": (lambda: _Seq(rnn.LSTM(8, projection_size=4, layout="NTC")), (2, 5, 6), ["RNN", "_zeros"]),
    "gru_tnc": (lambda: _Seq(rnn.GRU(8)), (5, 2, 6), ["RNN", "_zeros"]),
    "rnn_tanh": (lambda: _Seq(rnn.RNN(8, activation="tanh")), (5, 2, 6), ["RNN", "_zeros"]),
    "lstm_cell_unrolled": (lambda: _Unrolled(rnn.LSTMCell(8)), (2, 4, 6), ["_zeros"]),
    "gru_cell_unrolled": (lambda: _Unrolled(rnn.GRUCell(8)), (2, 4, 6), ["_zeros"]),
}


@pytest.mark.parametrize("name", sorted(RECURRENT))
def test_recurrent_layers(name, tmp_path):
    """Fused RNN ops stay opaque (several outputs, parameters packed by _rnn_param_concat); their begin
    states are `_zeros(shape=(L, 0, H))` whose batch size MXNet infers backwards from the RNN."""
    build, shape, opaque = RECURRENT[name]
    model, ex = _gluon(build(), shape)
    g = check(model, ex, tmp_path, opaque=opaque)
    batch = shape[0] if shape != (5, 2, 6) else 2
    for n in g:
        if n.is_opaque and n.op == "_zeros":  # e.g. shape=(1, 0, 16): the 0 is the batch size
            declared = [int(d) for d in n.attrs["shape"].strip("()").split(",") if d.strip()]
            assert 0 in declared and n.output.shape == tuple(batch if d == 0 else d for d in declared)
        if n.is_opaque and n.op == "RNN":
            assert all(v.shape is not None and None not in v.shape for v in n.outputs)


def test_lstm_opaque_types_come_from_mxnet():
    model, ex = _gluon(_Seq(rnn.LSTM(16, layout="NTC")), (2, 5, 8))
    g = aiacc.trace(model, ex)
    (rnn_node,) = [n for n in g if n.op == "RNN"]
    # output, final hidden state, final cell state (the time-major layout MXNet's RNN op works in)
    assert [v.shape for v in rnn_node.outputs] == [(5, 2, 16), (1, 2, 16), (1, 2, 16)]
    assert g.find_nodes("Transpose") and g.find_nodes("Concat")  # SwapAxis and _rnn_param_concat translated


class _UNet(nn.HybridBlock):
    """Encoder-decoder with the ops segmentation nets use: Conv2DTranspose, UpSampling, InstanceNorm,
    PReLU, concat skip connections, reductions and a log_softmax head."""

    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.c1 = nn.Conv2D(8, 3, padding=1, activation="relu")
            self.pool = nn.MaxPool2D()
            self.c2 = nn.Conv2D(16, 3, padding=1)
            self.bn = nn.BatchNorm()
            self.up = nn.Conv2DTranspose(8, 2, strides=2)
            self.out = nn.Conv2D(2, 1)
            self.dense = nn.Dense(3)
            self.prelu = nn.PReLU()
            self.inorm = nn.InstanceNorm()
            self.pad = nn.ReflectionPad2D(1)

    def hybrid_forward(self, F, x):
        a = self.c1(x)
        b = self.bn(self.c2(self.pool(a)))
        o = self.out(F.concat(a, self.up(b), dim=1))
        up = F.UpSampling(b, scale=2, sample_type="nearest")
        return (F.broadcast_add(o, F.mean(up, axis=1, keepdims=True)), self.dense(self.prelu(self.inorm(b))),
                F.max(self.pad(b), axis=(2, 3)), F.log_softmax(F.tanh(o), axis=1))


def test_unet_style_block_fully_translated(tmp_path):
    model, ex = _gluon(_UNet(), (2, 3, 16, 16))
    check(model, ex, tmp_path)


# -- failures inside the importer never escape as foreign exceptions ---------------------------------

def _replace_converter(monkeypatch, importer, op, fn):
    """For this test only, the importer's table with `fn` converting `op`."""
    from aiacc.core.translate import OpTable

    table = OpTable("mxnet import (test)")
    table.update(importer.converters)
    table.add(op, fn, replace=True)
    monkeypatch.setattr(importer, "converters", table)


def test_failing_converter_leaves_node_opaque(monkeypatch):
    from aiacc.plugins.mxnet import importer

    def broken(ctx):
        ctx.op("Relu", ctx.inputs[0])  # half a translation, then a bug
        raise IndexError("converter bug")

    _replace_converter(monkeypatch, importer, "Activation", broken)
    model, feeds = _triple(S.Activation(X, act_type="tanh") * 2.0, {"x": (2, 3)})
    with pytest.warns(UserWarning, match="kept opaque.*IndexError"):
        g = aiacc.trace(model, feeds)
    g.verify()
    assert [n.qualified_op for n in g] == ["mxnet::Activation", "Mul"]  # the half translation is gone
    _same(list(run(g, feeds).values()), T.run(model, feeds), "reference executor")


def test_mxnet_failure_running_the_model_is_an_aiacc_error():
    # a variable the caller declares as an input but feeds with the wrong rank: MXNet fails at run time
    model, feeds = _triple(S.FullyConnected(X, num_hidden=3, name="fc"), {"x": (2, 4)})
    with pytest.raises(AiaccError):
        T.run(model, {"x": np.zeros((2, 5), "float32")})


def test_block_that_reads_shapes_is_refused_with_a_clear_error():
    class ReadsShape(nn.HybridBlock):
        def hybrid_forward(self, F, x):
            return x.reshape((x.shape[0], -1))

    block = ReadsShape()
    block.initialize()
    with pytest.raises(AiaccError, match="ReadsShape cannot be called on MXNet Symbols"):
        aiacc.optimize(block, [np.zeros((2, 3, 4), "float32")])


# -- control flow and graph structure -----------------------------------------------------------------

class _Foreach(nn.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.fc = nn.Dense(4, flatten=False)

    def hybrid_forward(self, F, x):
        def step(data, states):
            out = data * 2 + states[0]
            return out, [out]

        init = F.zeros_like(F.slice_axis(x, axis=0, begin=0, end=1).reshape((-3, -2)))
        outs, _ = F.contrib.foreach(step, x, [init])
        return self.fc(outs)


class _Cond(nn.HybridBlock):
    def hybrid_forward(self, F, x):
        return F.contrib.cond(F.sum(x) > 0, lambda: x * 2, lambda: x - 1)


@pytest.mark.parametrize("block,op", [(_Foreach, "_foreach"), (_Cond, "_cond")])
def test_control_flow_ops_keep_their_subgraphs(block, op, tmp_path):
    model, ex = _gluon(block(), (4, 2, 3))
    check(model, ex, tmp_path, opaque=[op])


@pytest.mark.parametrize("outputs", [
    lambda: S.Group([X, X * 2]),                                           # an output that is an input
    lambda: (lambda r: S.Group([r, r]))(S.relu(X)),                        # one value returned twice
    lambda: S.Group([S.var("w", shape=(2, 3)) * 1.0, X + S.var("w", shape=(2, 3))]),  # one parameter, two nodes
    lambda: S.Group([X * 1.0, S.zeros(shape=(2, 2))]),                     # an output computed from nothing
])
def test_graph_structure_edge_cases(outputs, tmp_path):
    model, feeds = _triple(outputs(), {"x": (2, 3)})
    check(model, feeds, tmp_path)


class _NumpyStyle(nn.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.conv = nn.Conv2D(3, 3)
            self.dense = nn.Dense(4)

    def hybrid_forward(self, F, x):
        y = F.np.maximum(F.np.exp(x) * 2 - x / 3, F.npx.sigmoid(x)) + F.np.tanh(x) ** 2
        return self.dense(F.np.mean(F.npx.relu(self.conv(y)), axis=(2, 3)) + 1)


def test_numpy_interface_block():
    """A block written for mx.np (under npx.set_np()): traced through legacy symbols, its classic-equivalent
    ops translated, the others (here np.mean, which returns 0-d arrays) opaque."""
    mx.npx.set_np()
    try:
        block = _NumpyStyle()
        block.initialize()
        block.hybridize()
        x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype("float32")
        block(mx.np.array(x))
        g = aiacc.trace(block, [x])
        assert sorted({n.op for n in g if n.is_opaque}) == ["_npi_mean"]
        expected = T.run(block, [x])
        for backend in ("native", "onnxruntime"):
            _same(T.run(aiacc.optimize(block, [x], backend=backend), [x]), expected, backend)
    finally:
        mx.npx.reset_np()


def test_pre_1_0_symbol_file(tmp_path):
    """A file in MXNet 0.x form ("param" instead of "attrs", backward_source_id, no version)."""
    from aiacc.plugins import mxnet as plugin

    out = S.smooth_l1(S.FullyConnected(S.var("data"), num_hidden=3, name="fc"), scalar=1.0, name="s")
    doc = json.loads(out.tojson())
    for n in doc["nodes"]:
        if "attrs" in n:
            n["param"] = n.pop("attrs")
        n["backward_source_id"] = -1
    doc.pop("attrs", None)
    (tmp_path / "m-symbol.json").write_text(json.dumps(doc))
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((3, 4)).astype("float32"), rng.standard_normal(3).astype("float32")
    mx.nd.save(str(tmp_path / "m-0000.params"), {"arg:fc_weight": mx.nd.array(w), "arg:fc_bias": mx.nd.array(b)})
    x = rng.standard_normal((2, 4)).astype("float32")
    path = str(tmp_path / "m-symbol.json")
    g = plugin.trace(path, [x])
    assert [n.qualified_op for n in g] == ["Gemm", "mxnet::smooth_l1"]
    fast = plugin.optimize(path, [x])
    y = x @ w.T + b
    expected = np.where(np.abs(y) < 1, 0.5 * y * y, np.abs(y) - 0.5)  # smooth_l1 with sigma 1
    _same(T.run(fast, [x]), [expected], "optimized")


def test_ops_downstream_of_a_data_dependent_shape(tmp_path):
    """After boolean_mask no shape is known: converters that need one keep their node opaque, the rest
    translate, and both backends and the export still reproduce MXNet."""
    h = S.contrib.boolean_mask(X, S.var("m"))
    h = S.squeeze(S.expand_dims(h, axis=1), axis=1)
    h = S.reverse(S.where(h > 0, h, -h), axis=1)
    h = S.FullyConnected(h, S.var("w", shape=(3, 3)), num_hidden=3, flatten=False, no_bias=True)
    h = S.softmax(S.slice(h, begin=(None, None), end=(None, None), step=(None, -1)), axis=-1)
    h = S.Pad(h.reshape((0, 1, 1, -1)), mode="edge", pad_width=(0, 0, 0, 0, 0, 0, 1, 1)).reshape((0, -1))
    model, feeds = _triple(S.relu(h) + S.transpose(S.transpose(h)), {"x": (4, 3), "m": (4,)})
    feeds["m"] = np.array([1, 0, 1, 1], "float32")
    check(model, feeds, tmp_path, opaque=["_contrib_boolean_mask", "expand_dims", "where", "reverse",
                                          "FullyConnected", "slice", "Pad"])


class _PlusSquare(mx.operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], in_data[0] * in_data[0] + 1)


@mx.operator.register("aiacc_test_plus_square")
class _PlusSquareProp(mx.operator.CustomOpProp):
    def list_arguments(self):
        return ["data"]

    def list_outputs(self):
        return ["output"]

    def infer_shape(self, in_shape):
        return in_shape, [in_shape[0]], []

    def create_operator(self, ctx, shapes, dtypes):
        return _PlusSquare()


class _WithCustomOp(nn.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.dense = nn.Dense(4)

    def hybrid_forward(self, F, x):
        return self.dense(F.Custom(x, op_type="aiacc_test_plus_square"))


def test_python_custom_op_stays_opaque(tmp_path):
    model, ex = _gluon(_WithCustomOp(), (2, 3))
    g = check(model, ex, tmp_path, opaque=["Custom"])
    (node,) = [n for n in g if n.is_opaque]
    assert node.attrs["op_type"] == "aiacc_test_plus_square" and node.output.shape == (2, 3)


def test_attribute_aiacc_cannot_read_but_mxnet_runs_stays_opaque(monkeypatch):
    from aiacc.errors import ParseError
    from aiacc.plugins.mxnet import importer

    def strict(ctx):
        raise ParseError("attribute act_type='tanh' is not understood")

    _replace_converter(monkeypatch, importer, "Activation", strict)
    model, feeds = _triple(S.Activation(X, act_type="tanh") * 2.0, {"x": (2, 3)})
    with pytest.warns(UserWarning, match=r"node 'activation\d+' \(Activation\) kept opaque.*not understood"):
        g = aiacc.trace(model, feeds)
    assert [n.qualified_op for n in g] == ["mxnet::Activation", "Mul"]
    _same(list(run(g, feeds).values()), T.run(model, feeds), "reference executor")


def test_attribute_neither_aiacc_nor_mxnet_reads_is_named(tmp_path):
    from aiacc.errors import ParseError
    from aiacc.plugins import mxnet as plugin

    doc = {"nodes": [{"op": "null", "name": "data", "inputs": []},
                     {"op": "Pooling", "name": "poolZ", "attrs": {"kernel": "(2, 2.5)"}, "inputs": [[0, 0, 0]]}],
           "arg_nodes": [0], "heads": [[1, 0, 0]]}
    with pytest.raises(ParseError, match=r"node 'poolZ' \(Pooling\): attribute kernel=.*not an integer"):
        (tmp_path / "m-symbol.json").write_text(json.dumps(doc))
        plugin.trace(str(tmp_path / "m-symbol.json"), [np.zeros((1, 1, 4, 4), "float32")])


# -- random compositions: whatever the mix, optimize() succeeds and reproduces MXNet ------------------------

_CHAIN = [
    lambda h: S.relu(h), lambda h: S.log_softmax(h, axis=1),
    lambda h: S.broadcast_add(S.sum(h, axis=1, keepdims=True), h),
    lambda h: S.broadcast_mul(S.mean(h, axis=0, exclude=True, keepdims=True), h),
    lambda h: S.L2Normalization(h, mode="instance"),
    lambda h: S.expand_dims(h, axis=1).squeeze(axis=1), lambda h: S.SwapAxis(h, dim1=0, dim2=1).transpose(),
    lambda h: S.stack(h, h, axis=-1).sum(axis=-1), lambda h: S.reverse(h, axis=1), lambda h: S.broadcast_like(h, h),
    lambda h: S.where(h > 0, h, -h), lambda h: S.zeros_like(h) + h, lambda h: S.reshape(h, shape=(0, -1)),
    lambda h: S.clip(h, -1, 1), lambda h: S.hard_sigmoid(h), lambda h: S.smooth_l1(h, scalar=1.0),
    lambda h: S.broadcast_add(S.topk(h, k=1, axis=1, ret_typ="value"), h), lambda h: S.MakeLoss(h),
    lambda h: S.slice(h, begin=(None, None), end=(None, None), step=(None, -1)),
    lambda h: S.broadcast_add(S.argmax(h, axis=1, keepdims=True), h),
    lambda h: S.tile(h, reps=(1, 2)).slice_axis(axis=1, begin=0, end=3),
]


@pytest.mark.parametrize("seed", range(10))
def test_random_op_chains(seed):
    """Chains of translated and opaque ops, half of them behind a data-dependent shape (boolean_mask)."""
    import random

    rng = random.Random(seed)
    h = S.contrib.boolean_mask(X, S.var("m")) if seed % 2 == 0 else X
    for _ in range(rng.randint(3, 6)):
        h = _CHAIN[rng.randrange(len(_CHAIN))](h)
    feeds = {"x": np.random.default_rng(seed).standard_normal((4, 3)).astype("float32")}
    if seed % 2 == 0:
        feeds["m"] = np.array([1, 0, 1, 1], "float32")
    model = (h, {}, {})
    expected = T.run(model, feeds)
    for backend in ("native", "onnxruntime"):
        _same(T.run(aiacc.optimize(model, feeds, backend=backend), feeds), expected, backend)
