"""TF/Keras mode="train": the optimized model trains the original's own variables, with Keras' training
semantics (BatchNormalization on batch statistics with its moving averages updated, dropout from the same
seed generator), the same gradients and the same parameters after one and three optimizer steps."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import aiacc  # noqa: E402
from aiacc.errors import AiaccError  # noqa: E402


def cnn(dropout=0.0, seed=0):
    """A tiny Conv + BatchNorm + Dense net (Keras 3), same weights for the same seed."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.BatchNormalization(momentum=0.9),
        keras.layers.Flatten(),
        keras.layers.Dropout(dropout),
        keras.layers.Dense(16, activation="gelu"),
        keras.layers.LayerNormalization(),
        keras.layers.Dense(5),
    ])


def data(seed=1, n=4):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 8, 8, 3)).astype(np.float32), rng.integers(0, 5, n)


def close(a, b, tol=1e-5):
    a, b = np.asarray(a), np.asarray(b)
    scale = max(1.0, float(np.max(np.abs(a))) if a.size else 1.0)
    return float(np.max(np.abs(a - b))) <= tol * scale if a.size else True


def train_steps(model, steps, x, y):
    """`steps` SGD-momentum steps through a GradientTape on model(x, training=True)."""
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
    return [v.numpy() for v in model.variables]


def test_variables_are_the_originals_and_the_report_says_what_training_skips():
    m = cnn()
    x, _ = data()
    fast = aiacc.optimize(m, x, mode="train")
    assert isinstance(fast, keras.Model)
    assert len(fast.trainable_variables) == len(m.trainable_variables) > 0
    assert all(a is b for a, b in zip(fast.trainable_variables, m.trainable_variables))
    report = fast.aiacc_report
    assert report.mode == "train" and "batchnorm_folding" in report.skipped
    graph = fast.aiacc_graph.unwrap()
    assert graph.meta["tf_mode"] == "train"
    # no parameter became a constant: every variable is a graph input, none was folded into an initializer
    assert len([v for v in graph.inputs if v.name.startswith("var_")]) == len(m.variables)
    # fusions valid in training ran on the variables: GELU into the Dense (FusedGemm), Keras LayerNorm
    ops = graph.op_histogram()
    assert ops.get("LayerNormalization") == 1 and ops.get("aiacc::FusedGemm") == 1, ops
    kernel_shape = tuple(m.layers[0].kernel.shape)
    assert not any(v.shape in (kernel_shape, kernel_shape[::-1]) for v in graph.initializers.values())


def test_training_alias_and_gradients_equal():
    m = cnn()
    x, y = data()
    fast = aiacc.optimize(m, x, mode="training")
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    saved = [v.numpy() for v in m.variables]
    with tf.GradientTape() as tape:
        ref = loss_fn(y, m(x, training=True))
    g_ref = tape.gradient(ref, m.trainable_variables)
    for v, a in zip(m.variables, saved):
        v.assign(a)
    with tf.GradientTape() as tape:
        got = loss_fn(y, fast(x, training=True))
    g_got = tape.gradient(got, fast.trainable_variables)
    assert close(ref, got)
    assert all(g is not None for g in g_got)
    for a, b in zip(g_ref, g_got):
        assert close(a, b), float(np.max(np.abs(a.numpy() - b.numpy())))


@pytest.mark.parametrize("steps", [1, 3])
def test_steps_end_with_the_same_parameters_and_bn_statistics(steps):
    x, y = data()
    ref_model = cnn(seed=0)
    ref = train_steps(ref_model, steps, x, y)
    m = cnn(seed=0)
    fast = aiacc.optimize(m, x, mode="train")
    got = train_steps(fast, steps, x, y)
    names = [v.path for v in m.variables]
    for name, a, b in zip(names, ref, got):
        assert close(a, b), (name, float(np.max(np.abs(a - b))))
    # the moving statistics moved (training semantics), on the original's variables
    bn = m.layers[1]
    assert not np.allclose(bn.moving_mean.numpy(), 0) and not np.allclose(bn.moving_variance.numpy(), 1)


def test_dropout_masks_come_from_the_same_seed_generator():
    x, y = data()
    ref = train_steps(cnn(dropout=0.5, seed=3), 2, x, y)
    m = cnn(dropout=0.5, seed=3)
    fast = aiacc.optimize(m, x, mode="train")
    got = train_steps(fast, 2, x, y)
    for a, b in zip(ref, got):
        assert close(a, b)
    # dropout is really on: two calls draw different masks
    a, b = fast(x, training=True).numpy(), fast(x, training=True).numpy()
    assert not np.allclose(a, b)


def test_traces_under_tf_function_and_jit_compile():
    x, y = data()
    m = cnn()
    fast = aiacc.optimize(m, x, mode="train")
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def grads(model):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return loss, tape.gradient(loss, model.trainable_variables)

    saved = [v.numpy() for v in m.variables]
    eager_loss, eager_g = grads(fast)
    for v, a in zip(m.variables, saved):
        v.assign(a)
    xla_loss, xla_g = tf.function(lambda: grads(fast), jit_compile=True)()
    assert close(eager_loss, xla_loss, 1e-4)
    for a, b in zip(eager_g, xla_g):
        assert close(a, b, 1e-4)


def test_fit_trains_the_original_variables():
    x, y = data(n=8)
    ref_model = cnn(seed=5)
    ref_model.compile(optimizer=keras.optimizers.SGD(0.05), loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), jit_compile=False)
    ref_model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    m = cnn(seed=5)
    fast = aiacc.optimize(m, x[:4], mode="train")
    before = [v.numpy() for v in m.trainable_variables]
    fast.compile(optimizer=keras.optimizers.SGD(0.05), loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), jit_compile=False)
    fast.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    assert any(not np.allclose(a, v.numpy()) for a, v in zip(before, m.trainable_variables))
    for a, b in zip(ref_model.variables, m.variables):
        assert close(a.numpy(), b.numpy()), a.path
    # inference (predict: training=False) runs with the moving statistics, like the original
    assert close(fast.predict(x, verbose=0), ref_model.predict(x, verbose=0), 1e-4)


def fit_variables(model, x, y, steps=3, jit_compile="auto"):
    """`steps` batches of model.fit (SGD, momentum; compile's jit_compile as given): the variables after."""
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), jit_compile=jit_compile,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=len(x) // steps, epochs=1, shuffle=False, verbose=0)
    return model


@pytest.mark.parametrize("setting", [True, "Keras fit step (tf.function) + XLA (jit_compile=True)"])
def test_fit_step_under_xla_is_built_and_trains_as_keras_does(setting):
    """The fit step choice (choose_fit) forced to XLA: compile()'s default jit_compile='auto' resolves to
    True, so model.fit runs one XLA program of the whole step, and three fit steps end with the parameters
    and BatchNorm statistics Keras' own fit (no XLA) gives, within 1e-5; compile(jit_compile=False) is
    still obeyed."""
    from aiacc.plugins.tf.training import FIT_XLA

    x, y = data(n=12)
    ref = fit_variables(cnn(seed=4), x, y, jit_compile=False)
    m = cnn(seed=4)
    fast = aiacc.optimize(m, x[:4], mode="train", framework_compile=setting)
    assert fast.aiacc_fit_choice.path == FIT_XLA
    fit_variables(fast, x, y)
    assert fast.jit_compile is True and fast.train_function is not None
    for a, b in zip(ref.variables, m.variables):
        assert close(a.numpy(), b.numpy()), (a.path, float(np.max(np.abs(a.numpy() - b.numpy()))))
    other = aiacc.optimize(cnn(seed=4), x[:4], mode="train", framework_compile=setting)
    assert fit_variables(other, x, y, jit_compile=False).jit_compile is False


def test_fit_step_choice_measures_xla_and_says_it():
    """framework_compile='auto': the fit step is measured in a plain tf.function and as one XLA program
    (both times in the choice and the pass report's fit_step note, the XLA compile time in the reason);
    False measures nothing and leaves fit as Keras runs it (no XLA on a CPU)."""
    from aiacc.plugins.tf.training import FIT_GRAPH, FIT_XLA

    x, y = data(n=12)
    fast = aiacc.optimize(cnn(seed=4), x[:4], mode="train")
    fit = fast.aiacc_fit_choice
    assert set(fit.ms) == {FIT_GRAPH, FIT_XLA} and fit.path in (FIT_GRAPH, FIT_XLA)
    assert "XLA's compile of the step took" in fit.reason
    notes = fast.aiacc_report["fit_step"].notes
    assert notes[0] == f"model.fit: {fit.path}" and len(notes) == 4
    fit_variables(fast, x, y)
    assert fast.jit_compile is (fit.path == FIT_XLA)
    off = aiacc.optimize(cnn(seed=4), x[:4], mode="train", framework_compile=False)
    assert off.aiacc_fit_choice.path == FIT_GRAPH and not off.aiacc_fit_choice.ms
    assert fit_variables(off, x, y).jit_compile is False


def test_tf_module_trains_its_variables():
    class Net(tf.Module):
        def __init__(self):
            super().__init__()
            rng = np.random.default_rng(0)
            self.w = tf.Variable(rng.standard_normal((6, 3)).astype(np.float32))
            self.b = tf.Variable(np.zeros(3, np.float32))
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False)

        @tf.function(input_signature=[tf.TensorSpec((None, 6), tf.float32)])
        def __call__(self, x):
            self.steps.assign_add(1)
            return tf.nn.relu(x @ self.w + self.b)

    net = Net()
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    fast = aiacc.optimize(net, x, mode="train")
    assert {id(v) for v in fast.trainable_variables} == {id(net.w), id(net.b)}
    assert net.steps.numpy() == 0  # the verification restored the counter
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(fast(x) ** 2)
    g = tape.gradient(loss, [net.w, net.b])
    with tf.GradientTape() as tape:
        ref = tf.reduce_sum(tf.nn.relu(x @ net.w + net.b) ** 2)
    g_ref = tape.gradient(ref, [net.w, net.b])
    for a, b in zip(g, g_ref):
        assert close(a, b)
    assert net.steps.numpy() == 1  # the state update ran on the original's variable


def test_refusals_name_the_problem():
    m = cnn()
    x, _ = data()
    with pytest.raises(AiaccError, match="unknown mode 'fit'"):
        aiacc.optimize(m, x, mode="fit")
    with pytest.raises(AiaccError, match="framework_compile must be"):
        aiacc.optimize(m, x, mode="train", framework_compile="fast")
    with pytest.raises(AiaccError, match="onnxruntime"):
        aiacc.optimize(m, x, mode="train", backend="onnxruntime")
    fn = tf.function(lambda t: t * 2.0, input_signature=[tf.TensorSpec((2,), tf.float32)])
    with pytest.raises(AiaccError, match="mode='train' takes a Keras model or a tf.Module"):
        aiacc.optimize(fn, np.ones(2, np.float32), mode="train")


def resnetish(seed=0):
    """Conv stem + four residual Conv-BatchNorm blocks + Dense: cut points between the blocks."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
    for _ in range(4):
        r = keras.layers.BatchNormalization(momentum=0.9)(keras.layers.Conv2D(8, 3, padding="same")(h))
        h = keras.layers.Activation("relu")(h + r)
    return keras.Model(inp, keras.layers.Dense(5)(keras.layers.Flatten()(h)))


def test_unmeetable_memory_budget_names_the_smallest_figure():
    from aiacc.core.memory_checkpoint import MemoryBudgetError

    x, _ = data()
    smallest = r"smallest activation memory reachable .* is [0-9.]+ MiB \(\d+ bytes"
    with pytest.raises(MemoryBudgetError, match=smallest) as e:
        aiacc.optimize(resnetish(), x, mode="train", memory_budget=1000)
    assert e.value.smallest > 1000
    # the figure it names is achievable: a budget of exactly that much is accepted
    fast = aiacc.optimize(resnetish(), x, mode="train", memory_budget=e.value.smallest)
    assert fast.aiacc_memory_plan.memory <= e.value.smallest


@pytest.mark.parametrize("steps", [1, 3])
def test_memory_budget_recomputes_with_tf_recompute_grad_and_steps_match(steps, monkeypatch):
    x, y = data()
    ref = resnetish()
    want = train_steps(ref, steps, x, y)
    m = resnetish()
    baseline = aiacc.optimize(resnetish(), x, mode="train", memory_budget=1 << 40).aiacc_memory_plan.baseline
    wrapped = []
    real = tf.recompute_grad

    def spy(f):
        wrapped.append(f)
        return real(f)
    monkeypatch.setattr(tf, "recompute_grad", spy)
    fast = aiacc.optimize(m, x, mode="train", memory_budget=baseline // 2)
    plan = fast.aiacc_memory_plan
    assert plan.segments and plan.memory <= baseline // 2 < plan.baseline
    ranges = fast.aiacc_graph.meta["tf_recompute"]
    assert len(ranges) == len(plan.segments)
    assert fast.aiacc_train_path == "aiacc graph"  # XLA is not tried on a recomputing step
    got = train_steps(fast, steps, x, y)
    # every planned segment went through tf.recompute_grad when the step was traced
    assert len(wrapped) >= len(ranges)
    for v, a, b in zip(m.variables, want, got):
        assert close(a, b), (v.path, float(np.max(np.abs(a - b))))


def shared_conv(seed=0):
    """resnetish with one Conv2D layer applied in all four blocks: one kernel Transpose, read by four Convs."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
    conv = keras.layers.Conv2D(8, 3, padding="same")
    for _ in range(4):
        r = keras.layers.BatchNormalization(momentum=0.9)(conv(h))
        h = keras.layers.Activation("relu")(h + r)
    return keras.Model(inp, keras.layers.Dense(5)(keras.layers.Flatten()(h)))


def test_a_recomputed_conv_reads_its_kernel_transpose_from_outside_the_segment():
    """A segment under tf.recompute_grad whose Conv reads a kernel Transpose placed before it (the shared
    layer's, emitted once): the Transpose is repeated inside the segment, so the variable behind it is an
    argument (was: 'value %var_..._kernel is read before it is defined'); gradients equal Keras'."""
    x, y = data()
    baseline = aiacc.optimize(shared_conv(), x, mode="train", memory_budget=1 << 40).aiacc_memory_plan.baseline
    m = shared_conv()
    fast = aiacc.optimize(m, x, mode="train", memory_budget=baseline // 2)
    graph = fast.aiacc_graph.unwrap()
    nodes = list(graph)
    pos = {id(n): i for i, n in enumerate(nodes)}
    outside = []  # (segment, conv) where the Conv's kernel Transpose is before the segment
    for a, b in graph.meta["tf_recompute"]:
        for n in nodes[a:b + 1]:
            p = n.inputs[1].producer if n.op == "Conv" else None
            if p is not None and p.op == "Transpose" and pos[id(p)] < a:
                outside.append(((a, b), n.name))
    assert outside, "the case under test: a recomputed Conv whose kernel Transpose is outside its segment"
    ref = shared_conv()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    grads = []
    for model in (ref, fast):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads.append(tape.gradient(loss, model.trainable_variables))
    assert len(grads[0]) == len(grads[1]) == len(m.trainable_variables)
    for v, a, b in zip(m.trainable_variables, *grads):
        assert b is not None, v.path
        assert close(a.numpy(), b.numpy()), (v.path, float(np.max(np.abs(a.numpy() - b.numpy()))))
    # and three optimizer steps on from there (both already ran one training forward) end the same
    want, got = train_steps(ref, 3, x, y), train_steps(fast, 3, x, y)
    for v, a, b in zip(m.variables, want, got):
        assert close(a, b), (v.path, float(np.max(np.abs(a - b))))


def test_xla_step_three_steps_match_and_choice_is_recorded():
    x, y = data()
    ref = cnn(seed=0)
    want = train_steps(ref, 3, x, y)
    m = cnn(seed=0)
    fast = aiacc.optimize(m, x, mode="train", framework_compile=True)
    assert fast.aiacc_train_path == "aiacc graph + XLA (jit_compile=True)"
    got = train_steps(fast, 3, x, y)
    for v, a, b in zip(m.variables, want, got):
        assert close(a, b), (v.path, float(np.max(np.abs(a - b))))
    auto = aiacc.optimize(cnn(seed=0), x, mode="train")
    assert set(auto.aiacc_train_choice.ms) == {"aiacc graph", "aiacc graph + XLA (jit_compile=True)",
                                               "original model in tf.function",
                                               "original model in XLA (jit_compile=True)",
                                               "aiacc graph, BatchNorm as FusedBatchNormV3"}
    notes = auto.aiacc_report["train_step"].notes
    assert notes[0] == f"runs: {auto.aiacc_train_path}" and len(notes) == 7


def test_the_original_in_xla_runs_when_it_measures_fastest_and_trains_the_same(monkeypatch):
    """aiacc's step made slow and its XLA form refused: the step runs the original's own forward under XLA
    (never slower than plain XLA by choice), says so with the times, and trains (BatchNorm) as the original
    does, on the original's variables, eagerly and inside a caller's tf.function. (With dropout on, XLA draws
    other masks than TF's kernels, so an XLA candidate's loss differs and it is left out, warned.)"""
    import time
    import warnings

    from aiacc.plugins import train_choice

    real = train_choice.choose

    def slow_base(base, make, step_of, base_model, *args, **kw):
        def refuse():
            raise RuntimeError("XLA refused the graph")

        def timed(m):
            step = step_of(m)
            return (lambda: (time.sleep(0.05), step())[1]) if m is base_model else step
        # the original in a plain tf.function (the same original_step without jit_compile) and aiacc's
        # fused-BatchNorm graph (unslowed) left out, so the original in XLA is the one that measures fastest
        kw["more"] = {k: v for k, v in kw["more"].items()
                      if k not in ("original model in tf.function", "aiacc graph, BatchNorm as FusedBatchNormV3")}
        return real(base, refuse, timed, base_model, *args, **kw)

    monkeypatch.setattr(train_choice, "choose", slow_base)
    x, y = data()
    for wrap in (False, True):
        want = train_steps(cnn(seed=3), 3, x, y)
        m = cnn(seed=3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fast = aiacc.optimize(m, x, mode="train")
        assert fast.aiacc_train_path == "original model in XLA (jit_compile=True)", fast.aiacc_train_choice.summary()
        assert "aiacc graph + XLA (jit_compile=True) failed" in fast.aiacc_train_choice.reason
        assert any("runs the step as original model in XLA" in str(w.message) for w in caught)
        got = train_steps(fast, 3, x, y) if not wrap else None
        if wrap:  # a caller's tf.function: the original's call is inlined into it
            opt = keras.optimizers.SGD(0.1, momentum=0.9)
            loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

            @tf.function
            def step(a, b):
                with tf.GradientTape() as tape:
                    loss = loss_fn(b, fast(a, training=True))
                grads = tape.gradient(loss, fast.trainable_variables)
                opt.apply_gradients(zip(grads, fast.trainable_variables))

            for _ in range(3):
                step(tf.constant(x), tf.constant(y))
            got = [v.numpy() for v in m.variables]
        for v, a, b in zip(m.variables, want, got):
            assert close(a, b), (wrap, v.path, float(np.max(np.abs(a - b))))


def test_conv_bias_and_activation_fusion_is_kept_in_training():
    """A Keras Conv2D's bias is a trained variable (not a constant) in training: it still becomes the conv's
    bias input and the ReLU its activation (aiacc::FusedConv), with the gradients of the original."""
    m = cnn()
    x, _ = data()
    fast = aiacc.optimize(m, x, mode="train", framework_compile=False)
    graph = fast.aiacc_graph.unwrap()
    fused = [n for n in graph if n.qualified_op == "aiacc::FusedConv"]
    assert fused and fused[0].attr("activation") == "Relu"
    bias = fused[0].inputs[2]
    assert bias is not None and bias.const is None  # the bias variable's value, not a folded constant
    assert fast.aiacc_report["conv_fusion"].fused >= 1
    with tf.GradientTape(persistent=True) as tape:
        ref = tf.reduce_sum(m(x, training=True) ** 2)
        got = tf.reduce_sum(fast(x, training=True) ** 2)
    for a, b in zip(tape.gradient(ref, m.trainable_variables), tape.gradient(got, m.trainable_variables)):
        assert close(a.numpy(), b.numpy(), 1e-4)


def test_xla_candidates_with_dropout_are_left_out_naming_xlas_own_random_numbers():
    """XLA's own lowering draws other values than TensorFlow's kernels from the same seed (other dropout
    masks): the original model under XLA has another loss than aiacc's step, is left out, and the reason
    says so and how to pin it; aiacc's own XLA candidate draws TensorFlow's Philox numbers in integer ops
    (XlaRandomEmitter) and is not left out."""
    import warnings

    x, _ = data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = aiacc.optimize(cnn(dropout=0.5), x, mode="train")
    choice = fast.aiacc_train_choice
    reason = choice.reason
    assert "original model in XLA (jit_compile=True) failed: ValueError: the loss differs" in reason
    assert "XLA draws its own random numbers: the original model's StatelessRandom" in reason
    assert "aiacc's own XLA candidates draw TensorFlow's Philox numbers exactly" in reason
    assert "framework_compile='original model in XLA (jit_compile=True)' runs the original under XLA anyway" in reason
    assert "aiacc graph + XLA (jit_compile=True)" not in choice.left_out
    assert "aiacc graph + XLA (jit_compile=True)" in choice.ms


def test_the_choice_measures_the_gradients_rounding_noise_on_perturbed_inputs(monkeypatch):
    """choose_step hands the train choice aiacc's own step on its inputs perturbed at rounding level
    (train_choice.perturb): the noise floor that lets a near-tie-moved gradient differ (TF's resnet_small
    under XLA); on this net without ties rounding moves every gradient, by far less than GRAD_RTOL."""
    from aiacc.plugins import train_choice

    seen = {}
    real = train_choice.choose

    def spy(base, make, step_of, base_model, *args, **kw):
        seen.update(step_of=step_of, model=base_model, perturbed=kw.get("perturbed"))
        return real(base, make, step_of, base_model, *args, **kw)

    monkeypatch.setattr(train_choice, "choose", spy)
    x, _ = data()
    aiacc.optimize(cnn(), x, mode="train", framework_compile=False)

    def arrays(r):
        return [r[0].numpy()] + [g.numpy() for g in r[1]]

    base, noisy = arrays(seen["step_of"](seen["model"])()), arrays(seen["perturbed"]())
    floor = train_choice.noise_floor(base, noisy)
    norms = [float(np.linalg.norm(g)) for g in base[1:]]
    assert len(floor) == len(cnn().trainable_variables) and any(f > 0 for f in floor)
    assert all(f < 1e-3 * n for f, n in zip(floor, norms)), [f / n for f, n in zip(floor, norms)]


def test_the_choice_measures_each_candidate_inside_one_tf_function_step(monkeypatch):
    """choose_step measures a candidate as a Keras fit step runs it: forward and backward in one tf.function
    with the candidate's Python body inlined (no nested call of the aiacc step: measured eagerly, the
    gradient's separate call hid Keras' own graph being faster); an XLA candidate stays a nested XLA
    function. Each measured step puts the BatchNorm statistics back and gives aiacc's gradients."""
    from aiacc.plugins import train_choice

    seen = {}
    real = train_choice.choose

    def spy(base, make, step_of, base_model, *args, **kw):
        seen.update(step_of=step_of, model=base_model, make=make)
        return real(base, make, step_of, base_model, *args, **kw)

    monkeypatch.setattr(train_choice, "choose", spy)
    x, _ = data()
    m = cnn()
    fast = aiacc.optimize(m, x, mode="train", framework_compile=False)

    def calls(step):
        ops = step.get_concrete_function().graph.get_operations()
        return [op for op in ops if op.type in ("PartitionedCall", "StatefulPartitionedCall")]

    step = seen["step_of"](seen["model"])
    assert not calls(step), [op.type for op in calls(step)]
    xla = seen["step_of"](seen["make"]())
    assert calls(xla)  # the XLA-compiled step, called as a function
    stats = [v.numpy().copy() for v in m.variables if "moving" in v.name]
    loss, grads = step()
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(stats, [v for v in m.variables if "moving" in v.name]))
    with tf.GradientTape() as tape:
        ref = tf.reduce_mean(tf.square(m(x, training=True)))
    want = tape.gradient(ref, m.trainable_variables)
    assert abs(float(loss) - float(ref)) <= 1e-5 * abs(float(ref))
    for a, b in zip(want, grads):
        assert close(a.numpy(), b.numpy(), 1e-4)
