"""The shape guard of an optimized TF module, on every backend: right answers at the shapes it was built for
(any size where the signature's None dimension stayed dynamic in aiacc's graph), and at a sequence length or
an image size it was specialized to another one an aiacc ShapeError in torch's wording (the input, the
dimension, the size it was built for, why), never TF's binding error. A SavedModel keeps the guarded shapes."""
from __future__ import annotations


import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import aiacc  # noqa: E402
from aiacc.errors import ShapeError  # noqa: E402
from tests.plugins._guard_helpers import optimize_quietly as _optimize, rand as _rand  # noqa: E402

BACKENDS = ["native", "onnxruntime", "aiacc"]
WHY = r"the TF plugin does not optimize it again for other shapes; optimize the original with an example"


def _ids(*shape, seed=0):
    return np.random.default_rng(seed).integers(0, 50, shape).astype(np.int32)


def _tagger(seq):
    """Embedding + Dense over a sequence of `seq` tokens (None: any length)."""
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input((seq,), dtype="int32", name="ids")
    h = tf.keras.layers.Embedding(50, 8)(ids)
    return tf.keras.Model(ids, tf.keras.layers.Dense(4)(h))


def _cnn(size):
    tf.keras.utils.set_random_seed(1)
    image = tf.keras.Input((size, size, 3), name="image")
    h = tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu")(image)
    h = tf.keras.layers.GlobalAveragePooling2D()(h)
    return tf.keras.Model(image, tf.keras.layers.Dense(2)(h))


def _close(fast, model, x):
    np.testing.assert_allclose(np.asarray(fast(x)), model(x).numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sequence_length_fixed_by_the_model_is_a_shape_error_and_the_batch_stays_free(backend):
    model = _tagger(16)
    fast = _optimize(model, [_ids(2, 16)], backend=backend)
    assert fast.aiacc_report.interface[0].startswith("batch: traced at 2, runs at other sizes")
    assert fast.aiacc_report.shapes == ["optimized for ids [None, 16] (None: any size); a call at other shapes "
                                        "is a ShapeError"]
    _close(fast, model, _ids(2, 16, seed=1))
    _close(fast, model, _ids(5, 16, seed=2))  # verify found the batch free
    with pytest.raises(ShapeError, match=r"^Functional: input 'ids' of shape \[2, 32\]: its dimension 1 must be "
                                         r"16, the size the model was built for \(built: ids \[None, 16\]\); " + WHY):
        fast(_ids(2, 32))
    with pytest.raises(ShapeError, match=r"input 'ids' of shape \[2\] has 1 dimensions, the model was built for "
                                         r"\[None, 16\]"):
        fast(_ids(2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dynamic_sequence_length_stays_dynamic(backend):
    model = _tagger(None)
    fast = _optimize(model, [_ids(2, 16)], backend=backend)
    assert [v.shape for v in fast.aiacc_graph.inputs] == [("N", "ids_1")]  # the graph kept it symbolic
    for shape in [(2, 32), (3, 5)]:
        _close(fast, model, _ids(*shape, seed=3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_image_size_fixed_by_the_model_is_a_shape_error_a_dynamic_one_is_not(backend):
    fixed, dynamic = _cnn(8), _cnn(None)
    x = _rand(2, 8, 8, 3)
    fast = _optimize(fixed, [x], backend=backend)
    _close(fast, fixed, x)
    with pytest.raises(ShapeError, match=r"input 'image' of shape \[2, 12, 12, 3\]: its dimension 1 must be 8, "
                                         r"the size the model was built for \(built: image \[None, 8, 8, 3\]\)"):
        fast(_rand(2, 12, 12, 3))
    fast = _optimize(dynamic, [x], backend=backend)
    _close(fast, dynamic, _rand(3, 12, 10, 3, seed=4))


class _Tokens(tf.keras.Model):
    """A subclassed model: no declared input, traced at the example's sequence length (any batch)."""

    def __init__(self):
        super().__init__()
        self.emb, self.fc = tf.keras.layers.Embedding(50, 8), tf.keras.layers.Dense(4)

    def call(self, x):
        return self.fc(self.emb(x))


def test_a_subclassed_model_traced_at_its_example_length_refuses_another_one():
    """The original runs at any length; the optimized graph holds the example's (16): another length is a
    ShapeError, not TF's 'Binding inputs to tf.function failed' (nor a wrong answer)."""
    tf.keras.utils.set_random_seed(2)
    model = _Tokens()
    model(_ids(2, 16))
    fast = _optimize(model, [_ids(2, 16)])
    _close(fast, model, _ids(2, 16, seed=5))
    with pytest.raises(ShapeError, match=r"^_Tokens: input '\w+' of shape \[2, 17\]: its dimension 1 must be 16"):
        fast(_ids(2, 17))


def test_a_specialized_batch_is_fixed_in_the_guard_and_in_the_saved_signature(tmp_path):
    """A tf.function without a signature is traced at the example's shapes: the guard says which dimension
    and why; the SavedModel of the guarded module enforces the same shapes in its own signature."""

    class Scale(tf.Module):
        @tf.function
        def __call__(self, x):
            return x * 2.0 + 1.0
    model, x = Scale(), _rand(1, 3, 4)
    fast = _optimize(model, [x])
    with pytest.raises(ShapeError, match=r"input 'x' of shape \[5, 3, 4\]: its dimension 0 must be 1, the batch "
                                         r"size the model was built for \(the optimized model was specialized to "
                                         r"batch 1 .*\); " + WHY):
        fast(_rand(5, 3, 4))
    with pytest.raises(ShapeError, match=r"input 'x' of shape \[1, 3, 5\]: its dimension 2 must be 4"):
        fast(_rand(1, 3, 5))
    tf.saved_model.save(fast, str(tmp_path / "m"))
    loaded = tf.saved_model.load(str(tmp_path / "m"))
    np.testing.assert_allclose(loaded(x).numpy(), x * 2.0 + 1.0, rtol=1e-6)
    with pytest.raises((TypeError, ValueError), match=r"(?i)TensorSpec|shape"):
        loaded(_rand(1, 3, 5))


def test_saved_model_of_a_fixed_sequence_length_keeps_its_signature(tmp_path):
    model = _tagger(16)
    fast = _optimize(model, [_ids(2, 16)])
    tf.saved_model.save(fast, str(tmp_path / "tagger"))
    loaded = tf.saved_model.load(str(tmp_path / "tagger"))
    x = _ids(3, 16, seed=6)
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), rtol=1e-4, atol=1e-5)
    (spec,) = loaded.__call__.concrete_functions[0].structured_input_signature[0]
    assert spec.shape.as_list() == [None, 16]
    with pytest.raises((TypeError, ValueError)):
        loaded(_ids(3, 32))


def test_the_tightened_saved_signature_fixes_a_batch_only_the_guard_fixed():
    """A signature whose batch is None while verify found the graph specialized to one: the SavedModel's
    __call__ gets that batch in its signature (what the guard fixes, the file enforces)."""
    from aiacc.plugins.shape_guard import ShapeCheck, ShapeSpec
    from aiacc.plugins.tf.guard import _tightened

    signature = [tf.TensorSpec([None, 16], tf.int32, name="ids")]
    guard = ShapeCheck(ShapeSpec({"ids": (2, 16)}, batch_why="specialized"), ["ids"], "M", "why")
    (tight,) = _tightened(signature, guard)
    assert tight.shape.as_list() == [2, 16] and tight.name == "ids"
    free = ShapeCheck(ShapeSpec({"ids": (None, 16)}), ["ids"], "M", "why")
    assert _tightened(signature, free) is None
