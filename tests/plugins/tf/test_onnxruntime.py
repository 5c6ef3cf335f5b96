"""backend="onnxruntime": the IR runs in onnxruntime behind a tf.function; opaque TF ops run between
onnxruntime sessions."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("onnxruntime")

import aiacc  # noqa: E402
from aiacc.plugins.tf import translator  # noqa: E402
from tests.zoo import tf_models as zoo  # noqa: E402


def _close(e, a, rtol=1e-4):
    assert e.shape == a.shape
    assert float(np.max(np.abs(e - a))) <= 1e-5 + rtol * max(float(np.max(np.abs(e))), 1e-30)


@pytest.mark.parametrize("name", ["mlp", "small_cnn", "bert_encoder", "opaque_function"])
def test_onnxruntime_backend_matches(name):
    model, x = zoo.TF_ZOO[name]()
    fast = aiacc.optimize(model, x, backend="onnxruntime")
    assert isinstance(fast, tf.Module)
    out = fast(x)
    assert out.shape.as_list()[1:] == list(translator.run(model, x)[0].shape[1:])
    _close(translator.run(model, x)[0], out.numpy())
    if name == "opaque_function":
        assert fast.aiacc_graph.find_nodes("Cumsum", "tf")
        assert fast.aiacc_runner.num_opaque == 1
