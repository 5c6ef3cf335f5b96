"""Architectures beyond the zoo: every model optimizes with the native and the onnxruntime backend and
gives the original's outputs (1e-4 relative); layers with an IR form are translated (no opaque node left
for them); control flow and TensorLists stay opaque regions that run, print, parse, export and save.

Models are small and built once per module (TF tracing is the slow part)."""
import collections

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
pytest.importorskip("onnxruntime")

import aiacc  # noqa: E402
from aiacc.core import parse, run  # noqa: E402
from aiacc.errors import AiaccError, UnsupportedError  # noqa: E402
from aiacc.plugins.tf import translator  # noqa: E402

L = keras.layers


# ------------------------------------------------------------------------------------------ the models
def unet():
    """Conv2DTranspose (VALID and SAME), UpSampling2D, SeparableConv2D, GlobalMaxPooling2D, skip concat."""
    i = keras.Input((16, 16, 3))
    a = L.Conv2D(8, 3, padding="same", activation="relu")(i)
    b = L.SeparableConv2D(16, 3, padding="same")(L.MaxPooling2D()(a))
    b = L.BatchNormalization()(b)
    u = L.Conv2DTranspose(8, 2, strides=2)(b)
    u3 = L.Conv2DTranspose(4, 3, strides=2, padding="same")(b)
    o = L.Conv2D(2, 1)(L.Concatenate()([a, u, u3]))
    o2 = L.GlobalMaxPooling2D()(L.UpSampling2D(2)(b))
    return keras.Model(i, [o, o2]), [(2, 16, 16, 3)]


def lstm_gru():
    """Keras LSTM and GRU: While loops over TensorLists."""
    i = keras.Input((5, 8))
    y = L.LSTM(16, return_sequences=True)(i)
    y = L.GRU(8)(y)
    return keras.Model(i, L.Dense(4, activation="softmax")(y)), [(2, 5, 8)]


def seq1d():
    """Causal dilated Conv1D, Conv1D, LayerNormalization (axis -1 of 3-D), PReLU, 1-D pools, swish, elu."""
    i = keras.Input((12, 4))
    y = L.Conv1D(8, 3, padding="causal", dilation_rate=2)(i)
    y = L.PReLU()(L.LayerNormalization()(y))
    y = L.Activation("elu")(L.Activation("swish")(L.AveragePooling1D(2)(y)))
    y = L.GlobalAveragePooling1D()(L.MaxPooling1D(2)(L.Conv1D(6, 3, padding="same")(y)))
    return keras.Model(i, L.Dense(3, activation="gelu")(y)), [(2, 12, 4)]


def activations():
    i = keras.Input((10,))
    outs = [L.Activation(a)(L.Dense(6)(i)) for a in ("selu", "softplus", "hard_sigmoid", "elu", "swish",
                                                      "softsign", "relu6", "leaky_relu", "tanh", "exponential")]
    outs.append(L.Dense(6, activation=lambda x: keras.activations.gelu(x, approximate=True))(i))
    outs.append(L.Dense(6, activation=lambda x: keras.activations.gelu(x, approximate=False))(i))
    outs.append(L.PReLU()(L.Dense(6)(i)))
    outs.append(L.ELU(0.5)(L.Dense(6)(i)))
    outs.append(L.ReLU(max_value=3.0, negative_slope=0.1, threshold=0.5)(L.Dense(6)(i)))
    return keras.Model(i, L.Concatenate()(outs)), [(3, 10)]


def spatial():
    """Dilated Conv2D (SAME and VALID), Cropping2D, bilinear UpSampling2D, Resizing, align_corners resizes,
    DepthwiseConv2D, Permute, grouped Conv2D (an XLA function call in Keras)."""
    i = keras.Input((12, 12, 4))
    y = L.Conv2D(6, 3, dilation_rate=2, padding="same")(i)
    y2 = L.Conv2D(4, 3, dilation_rate=2)(y)
    g = L.Conv2D(8, 3, groups=2, padding="same")(i)
    y = L.UpSampling2D(2, interpolation="bilinear")(L.Cropping2D(((1, 2), (2, 1)))(y))
    r = L.Resizing(7, 9, interpolation="bilinear")(y)
    r2 = L.Resizing(5, 5, interpolation="nearest")(y)
    r3 = L.Lambda(lambda t: tf.compat.v1.image.resize(t, (10, 10), align_corners=True))(y)
    r4 = L.Lambda(lambda t: tf.compat.v1.image.resize_nearest_neighbor(t, (10, 10), align_corners=True))(y)
    y = L.Permute((3, 1, 2))(L.DepthwiseConv2D(3, padding="same", depth_multiplier=2)(y))
    return keras.Model(i, [y, y2, g, r, r2, r3, r4, L.GlobalMaxPooling2D(keepdims=True)(r)]), [(2, 12, 12, 4)]


def merges():
    """Minimum/Maximum/Average/Multiply/Subtract, RepeatVector, Permute, Lambda layers with tf.math ops."""
    i, j = keras.Input((8,)), keras.Input((8,))
    a, b = L.Dense(8)(i), L.Dense(8)(j)
    y = L.Concatenate()([L.Minimum()([a, b]), L.Maximum()([a, b]), L.Average()([a, b]), L.Multiply()([a, b]),
                         L.Subtract()([a, b])])
    r = L.Permute((2, 1))(L.RepeatVector(3)(y))
    t = L.Lambda(lambda x: tf.math.reduce_logsumexp(x, axis=1) + tf.math.sqrt(tf.math.abs(x[:, 0, :])) *
                 tf.math.tanh(x[:, 1, :]) - tf.math.square(x[:, 2, :]))(r)
    t2 = L.Lambda(lambda x: tf.reduce_max(x, axis=-1, keepdims=True) *
                  tf.math.rsqrt(1.0 + tf.reduce_sum(tf.square(x), axis=-1, keepdims=True)))(y)
    t3 = L.Lambda(lambda x: tf.clip_by_value(x, -0.5, 0.5) + tf.math.cumsum(x, axis=1))(y)
    t4 = L.Lambda(lambda x: tf.tile(x[:, None, :], [1, 2, 1]) + tf.reverse(x, [1])[..., None, :])(a)
    return keras.Model([i, j], [t, t2, t3, L.Flatten()(t4)]), [(2, 8), (2, 8)]


def attention():
    """Embedding with int32 ids, Attention (dot and concat scores), AdditiveAttention, causal MHA."""
    ids = keras.Input((6,), dtype="int32")
    e = L.Embedding(20, 8)(ids)
    q, v = L.Dense(8)(e), L.Dense(8)(e)
    a = L.Concatenate()([L.Attention()([q, v]), L.AdditiveAttention()([q, v]),
                         L.Attention(use_scale=True, score_mode="concat")([q, v, e]),
                         L.MultiHeadAttention(2, 4)(e, e, use_causal_mask=True)])
    y = L.LayerNormalization()(a)
    return keras.Model(ids, L.GlobalAveragePooling1D()(y)), [((2, 6), "int32")]


def more_ops():
    """Dilated SeparableConv2D / DepthwiseConv2D, tf.nn.lrn, tf.slice, tf.one_hot (two axes), divide_no_nan
    (with zero divisors), rint."""
    i, j = keras.Input((10, 10, 4)), keras.Input((5,), dtype="int32")
    a = L.SeparableConv2D(6, 3, dilation_rate=2, padding="same")(i)
    b = L.DepthwiseConv2D(3, dilation_rate=2)(i)
    c = L.Lambda(lambda t: tf.nn.lrn(t, 2, 1.0, 0.1, 0.75))(a)
    d = L.Lambda(lambda t: tf.slice(t, [0, 1, 2, 0], [-1, 5, 4, 3]))(c)
    oh = L.Lambda(lambda t: tf.one_hot(t, 7, 2.0, -1.0), output_shape=(5, 7))(j)
    oh2 = L.Lambda(lambda t: tf.one_hot(t, 4, axis=1), output_shape=(4, 5))(j)
    e = L.Lambda(lambda t: tf.math.divide_no_nan(t, tf.math.rint(t * 3.0)))(L.Flatten()(d))
    return keras.Model([i, j], [L.Flatten()(b), e, L.Flatten()(oh), L.Flatten()(oh2)]), \
        [(2, 10, 10, 4), ((2, 5), "int32")]


def pooling():
    """NASNet's reduction cells: a zero-padded AveragePooling2D whose padding counts in the average (folded
    into the pool at level 2 with pads equal to TF's SAME ones), next to SAME pools that exclude it."""
    i = keras.Input((15, 15, 3))
    y = L.Conv2D(4, 1)(i)
    a = L.AveragePooling2D(3, strides=2)(L.ZeroPadding2D(1)(y))
    b = L.AveragePooling2D(3, strides=2, padding="same")(y)
    c = L.MaxPooling2D(3, strides=2)(L.ZeroPadding2D(1)(y))
    return keras.Model(i, L.Concatenate()([a, b, c])), [(2, 15, 15, 3)]


def dynamic_transformer():
    """Ids of any length: EinsumDense, causal mask and Tensordot reshapes on run-time sizes."""
    ids = keras.Input((None,), dtype="int32")
    e = L.Embedding(50, 16)(ids)
    a = L.MultiHeadAttention(2, 8)(e, e, use_causal_mask=True)
    y = L.LayerNormalization()(e + a)
    return keras.Model(ids, L.Dense(16, activation="gelu")(y)), [((2, 9), "int32")]


def dynamic_image():
    """Images of any size: Keras cannot trace bilinear UpSampling2D on unknown sizes, so the example's
    sizes are used (batch left free)."""
    i = keras.Input((None, None, 3))
    y = L.Conv2D(4, 3, padding="same", dilation_rate=2)(i)
    u = L.UpSampling2D(2, interpolation="bilinear")(y)
    t = L.Conv2DTranspose(3, 3, strides=2, padding="same")(y)
    return keras.Model(i, [L.GlobalAveragePooling2D()(u), L.GlobalMaxPooling2D()(t)]), [(2, 10, 12, 3)]


def dynamic_rnn():
    """Sequences of any length through LSTMs and a dilated causal Conv1D."""
    i = keras.Input((None, 8))
    y = L.LSTM(6, return_sequences=True)(i)
    y = L.Conv1D(4, 3, padding="causal", dilation_rate=2)(y)
    return keras.Model(i, L.LSTM(5)(y)), [(2, 7, 8)]


def control_flow():
    """tf.cond and tf.while_loop in a tf.function: StatelessIf and StatelessWhile."""

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def f(x):
        y = tf.cond(tf.reduce_sum(x) > 0, lambda: x * 2.0, lambda: tf.nn.relu(x) - 1.0)
        _, acc = tf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, a * 0.5 + 1.0), [tf.constant(0), x])
        return y + acc

    return f, [(3, 4)]


BUILDERS = {f.__name__: f for f in (unet, lstm_gru, seq1d, activations, spatial, merges, attention, more_ops, pooling,
                                    dynamic_transformer, dynamic_image, dynamic_rnn, control_flow)}
# what each model keeps opaque (untranslatable TF ops); everything else must be translated
OPAQUE = {"lstm_gru": {"tf::While"}, "merges": {"tf::Cumsum"},
          "control_flow": {"tf::StatelessIf", "tf::StatelessWhile"},
          "dynamic_rnn": {"tf::While"}}


class Case:
    def __init__(self, name):
        keras.utils.set_random_seed(0)
        self.model, specs = BUILDERS[name]()
        rng = np.random.default_rng(0)
        self.x = [rng.integers(0, 5, s[0]).astype(s[1]) if isinstance(s[1], str) else
                  rng.standard_normal(s).astype(np.float32) for s in specs]
        self.example = self.x[0] if len(self.x) == 1 else self.x
        self.expected = translator.run(self.model, self.example)
        self.graph = aiacc.trace(self.model, self.example)
        self._fast = {}

    def optimized(self, backend):
        if backend not in self._fast:
            self._fast[backend] = aiacc.optimize(self.model, self.example, backend=backend)
        return self._fast[backend]


@pytest.fixture(scope="module")
def case():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = Case(name)
        return cache[name]

    return get


def _close(expected, actual, rtol=1e-4):
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        a = np.asarray(a)
        assert e.shape == a.shape
        assert float(np.max(np.abs(e - a))) <= 1e-5 + rtol * max(float(np.max(np.abs(e))), 1e-30)


def _call(module, case_):
    return [np.asarray(o) for o in tf.nest.flatten(module(*case_.x))]


# ------------------------------------------------------------------------------------------ the tests
@pytest.mark.parametrize("backend", ["native", "onnxruntime"])
@pytest.mark.parametrize("name", list(BUILDERS))
def test_optimized_outputs_equal_the_original(name, backend, case):
    c = case(name)
    fast = c.optimized(backend)
    assert isinstance(fast, tf.Module)
    _close(c.expected, _call(fast, c))


@pytest.mark.parametrize("name", list(BUILDERS))
def test_only_untranslatable_ops_stay_opaque(name, case):
    g = case(name).graph
    assert {n.qualified_op for n in g if n.is_opaque} == OPAQUE.get(name, set())


@pytest.mark.parametrize("name", list(BUILDERS))
def test_text_round_trip(name, case):
    g = case(name).graph
    assert parse(str(g), {k: v.const for k, v in g.initializers.items()}).equals(g)


def test_translated_forms(case):
    ops = {name: collections.Counter(n.op for n in case(name).graph) for name in ("unet", "spatial", "seq1d")}
    assert ops["unet"]["ConvTranspose"] == 2
    convt = [n for n in case("unet").graph if n.op == "ConvTranspose"]
    assert sorted(tuple(n.outputs[0].shape[1:]) for n in convt) == [(4, 16, 16), (8, 16, 16)]
    dilated = [n.attr("dilations") for n in case("spatial").graph if n.op == "Conv" and n.attr("dilations") != [1, 1]]
    assert dilated == [[2, 2], [2, 2]]
    assert [n.attr("dilations") for n in case("seq1d").graph if n.op == "Conv"] == [[1, 2], [1, 1]]
    modes = sorted((n.attr("mode"), n.attr("coordinate_transformation_mode")) for n in case("spatial").graph
                   if n.op == "Resize")
    assert modes == [("linear", "align_corners"), ("linear", "half_pixel"), ("linear", "half_pixel"),
                     ("nearest", "align_corners"), ("nearest", "half_pixel")]
    for name in ("seq1d", "attention"):  # Keras' layer norm on the last axis of a 3-D tensor, fused at level 2
        optimized = case(name).optimized("native").aiacc_graph.unwrap()
        assert [n.attr("axis") for n in optimized if n.op == "LayerNormalization"] == [-1]
    # two dilated convolutions, the grouped one (Keras calls an XLA function: inlined) and the depthwise one
    assert sorted(n.attr("group") for n in case("spatial").graph if n.op == "Conv") == [1, 1, 2, 6]


def test_dynamic_shapes(case):
    g = case("dynamic_transformer").graph
    assert g.inputs[0].shape == ("N", g.inputs[0].shape[1]) and isinstance(g.inputs[0].shape[1], str)
    # the exported signature keeps the free length: a longer sequence runs
    c = case("dynamic_transformer")
    longer = np.random.default_rng(1).integers(0, 50, (3, 13)).astype(np.int32)
    for backend in ("native", "onnxruntime"):
        _close(translator.run(c.model, longer), [np.asarray(c.optimized(backend)(longer))])
    # the dilated Conv1D on a run-time length: TF computes paddings and crops from the length at run
    # time; their difference (the conv's pads) is static: one Conv, no SpaceToBatchND left (Keras pads
    # causally with a Pad of its own before)
    convs = [n for n in case("dynamic_rnn").graph if n.op == "Conv"]
    assert [(n.attr("dilations"), n.attr("pads")) for n in convs] == [([1, 2], [0, 0, 0, 0])]
    assert convs[0].inputs[0].producer.inputs[0].producer.op == "Unsqueeze"
    img = case("dynamic_image")
    assert img.graph.inputs[0].shape == ("N", 10, 12, 3)
    assert sorted(n.op for n in img.graph if n.op in ("ConvTranspose", "Resize")) == ["ConvTranspose", "Resize"]


def test_region_carries_its_functions_and_runs(case):
    c = case("lstm_gru")
    (lstm, gru) = [n for n in c.graph if n.is_opaque]
    for node in (lstm, gru):
        gd = node.meta["graph_def"]
        types = collections.Counter(n.op for n in gd.node)
        assert types["While"] == 1 and types["TensorListFromTensor"] == 1 and types["TensorListStack"] == 1
        bodies = {f.signature.name for f in gd.library.function}
        assert len(bodies) == 2 and all("while" in b for b in bodies)  # cond and body
        assert all(v.dtype == "float32" for v in node.outputs)
    feeds = translator.feeds(c.graph, c.example)
    out = run(c.graph, feeds)
    _close(c.expected, [out[v.name] for v in c.graph.outputs])


def test_region_text_round_trip_exports_without_payloads(case):
    c = case("lstm_gru")
    text = str(c.graph)
    parsed = parse(text, {k: v.const for k, v in c.graph.initializers.items()})
    assert parsed.equals(c.graph)
    assert all("graph_def" not in n.meta for n in parsed if n.is_opaque)
    module = aiacc.export(parsed, "tf")
    _close(c.expected, _call(module, c))


@pytest.mark.parametrize("name", ["lstm_gru", "control_flow", "spatial"])
def test_saved_model_round_trip(name, case, tmp_path):
    c = case(name)
    tf.saved_model.save(c.optimized("native"), str(tmp_path / name))
    loaded = tf.saved_model.load(str(tmp_path / name))
    _close(c.expected, _call(loaded, c))


def test_exported_graph_keeps_the_loop_and_no_tensorlist_crosses_the_ir(case):
    c = case("lstm_gru")
    graph = c.optimized("native").__call__.get_concrete_function().graph
    types = collections.Counter(op.type for op in graph.get_operations())
    assert types["While"] == 2 and types["TensorListStack"] == 2
    assert c.optimized("onnxruntime").aiacc_runner.num_opaque == 2


def test_handle_leaving_the_graph_is_an_aiacc_error():
    @tf.function(input_signature=[tf.TensorSpec([3, 2], tf.float32)])
    def to_list(x):
        return tf.raw_ops.TensorListFromTensor(tensor=x * 2.0, element_shape=tf.constant([2]))

    with pytest.raises(UnsupportedError, match=r"TensorListFromTensor.*dtype variant is not supported"):
        aiacc.trace(to_list)


def test_wrong_shape_for_a_recurrent_model_is_an_aiacc_error(case):
    c = case("lstm_gru")
    with pytest.raises(AiaccError, match="expects shape"):
        aiacc.optimize(c.model, np.zeros((2, 6, 8), np.float32))


def test_named_inputs_and_outputs_keep_their_structure(tmp_path):
    """A Keras model on a dict of inputs: the optimized module takes the same dict (SavedModel too)."""
    keras.utils.set_random_seed(0)
    b, a = keras.Input((2,), name="b"), keras.Input((4,), name="a")  # declared out of key order
    model = keras.Model({"b": b, "a": a}, {"s": L.Dense(3)(L.Concatenate()([a, b])), "t": L.Dense(1)(b)})
    rng = np.random.default_rng(0)
    x = {"a": rng.standard_normal((2, 4)).astype(np.float32), "b": rng.standard_normal((2, 2)).astype(np.float32)}
    expected = model(x)
    for backend in ("native", "onnxruntime"):
        fast = aiacc.optimize(model, x, backend=backend)
        out = fast(x)
        assert sorted(out) == ["s", "t"]
        for k in out:
            _close([np.asarray(expected[k])], [out[k]])
    fast = aiacc.optimize(model, x)
    tf.saved_model.save(fast, str(tmp_path / "named"))
    loaded = tf.saved_model.load(str(tmp_path / "named"))
    out = loaded(x)
    _close([np.asarray(expected["s"]), np.asarray(expected["t"])], [out["s"], out["t"]])
    assert fast.aiacc_graph.unwrap().meta["tf_input_structure"] == [{"a": 0, "b": 1}]


def test_exported_keras_lstm_savedmodel_through_the_file_path(case, tmp_path):
    """model.export() gives a SavedModel whose serving signature holds its variables weakly: loading it by
    path, tracing and optimizing must keep them alive; the While loops survive as regions."""
    from aiacc.plugins.tf import files

    c = case("lstm_gru")
    c.model.export(str(tmp_path / "sm"), verbose=False)
    g = files.load_graph(str(tmp_path / "sm"))
    assert sorted(n.qualified_op for n in g if n.is_opaque) == ["tf::While", "tf::While"]
    files.optimize_file(str(tmp_path / "sm"), str(tmp_path / "out"))
    loaded = tf.saved_model.load(str(tmp_path / "out"))
    _close(c.expected, [np.asarray(o) for o in tf.nest.flatten(loaded(c.x[0]))])
