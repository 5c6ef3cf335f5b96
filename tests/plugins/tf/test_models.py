"""Every TF zoo model: optimized outputs equal the original's (1e-4 relative), the optimized tf.Module
saves as a SavedModel whose reload gives the same outputs, and the exported CNN graphs are NHWC with no
Transpose op. ResNet50 is built and traced once per module (module-scope fixtures)."""
import collections

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import aiacc  # noqa: E402
from aiacc.plugins.tf import translator  # noqa: E402
from tests.zoo import tf_models as zoo  # noqa: E402

ZOO = ["resnet50", "mobilenet_v2", "bert_encoder", "mlp", "small_cnn", "mlp_module", "opaque_function"]


def _close(expected, actual, rtol=1e-4):
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        assert e.shape == a.shape
        scale = max(float(np.max(np.abs(e))), 1e-30)
        assert float(np.max(np.abs(e - a))) <= 1e-5 + rtol * scale


def _ops(module):
    graph = module.__call__.get_concrete_function().graph
    return collections.Counter(op.type for op in graph.get_operations())


@pytest.fixture(scope="module")
def optimized():
    """name -> (model, example, optimized at level 0, optimized at level 2); built lazily."""
    cache = {}

    def get(name):
        if name not in cache:
            model, x = zoo.TF_ZOO[name]()
            cache[name] = (model, x, aiacc.optimize(model, x, level=0), aiacc.optimize(model, x, level=2))
        return cache[name]

    return get


@pytest.mark.parametrize("name", ZOO)
def test_optimized_outputs_equal_the_original(name, optimized):
    model, x, fast0, fast2 = optimized(name)
    expected = translator.run(model, x)
    assert isinstance(fast0, tf.Module) and isinstance(fast2, tf.Module)
    _close(expected, translator.run(fast0, x))
    _close(expected, translator.run(fast2, x))


@pytest.mark.parametrize("name", ZOO)
def test_saved_model_round_trip(name, optimized, tmp_path):
    model, x, _, fast = optimized(name)
    tf.saved_model.save(fast, str(tmp_path / name))
    loaded = tf.saved_model.load(str(tmp_path / name))
    _close(translator.run(model, x), [np.asarray(o) for o in tf.nest.flatten(loaded(x))])


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "small_cnn"])
def test_exported_cnn_has_no_transpose(name, optimized):
    _, _, fast0, fast2 = optimized(name)
    for fast in (fast0, fast2):
        ops = _ops(fast)
        assert ops["Transpose"] == 0, ops
        assert ops["Conv2D"] > 0


def test_resnet50_export_is_conv_biasadd_relu(optimized):
    _, _, fast, _ = optimized("resnet50")
    ops = _ops(fast)
    assert ops["Conv2D"] == 53 and ops["Relu"] == 49
    graph = fast.__call__.get_concrete_function().graph
    for op in graph.get_operations():
        if op.type == "Conv2D":
            assert op.get_attr("data_format") == b"NHWC"
            consumers = [c.type for c in op.outputs[0].consumers()]
            assert consumers == ["BiasAdd"], consumers


def test_traced_resnet50_and_bert_have_no_opaque_node():
    for name in ("resnet50", "bert_encoder"):
        model, x = zoo.TF_ZOO[name]()
        graph = aiacc.trace(model, x)
        assert not [n.qualified_op for n in graph if n.is_opaque], name
        if name == "resnet50":
            hist = graph.op_histogram()
            assert hist["Conv"] == 53 and hist["Transpose"] == 1  # one layout change, at the input


def test_opaque_op_comes_back_unchanged(optimized):
    _, _, fast, _ = optimized("opaque_function")
    graph = fast.__call__.get_concrete_function().graph
    (cumsum,) = [op for op in graph.get_operations() if op.type == "Cumsum"]
    assert cumsum.get_attr("exclusive") is False and cumsum.get_attr("reverse") is False


def test_optimized_module_keeps_the_dynamic_batch(optimized):
    model, x, fast, _ = optimized("mobilenet_v2")
    x3 = np.concatenate([x, x[:1]])
    _close(translator.run(model, x3), translator.run(fast, x3))
    spec = fast.__call__.input_signature[0]
    assert spec.shape.as_list() == [None, 64, 64, 3]
