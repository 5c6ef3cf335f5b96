"""SavedModel directories and .keras files: load_graph, optimize_file, and the aiacc command on them."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from aiacc import cli  # noqa: E402
from aiacc.core import run  # noqa: E402
from aiacc.errors import ParseError, UnsupportedError  # noqa: E402
from aiacc.plugins.tf import files, translator  # noqa: E402
from tests.zoo import tf_models as zoo  # noqa: E402


def _close(e, a, rtol=1e-4):
    assert e.shape == a.shape
    assert float(np.max(np.abs(e - a))) <= 1e-5 + rtol * max(float(np.max(np.abs(e))), 1e-30)


@pytest.fixture(scope="module")
def keras_file(tmp_path_factory):
    model, x = zoo.small_cnn()
    path = str(tmp_path_factory.mktemp("keras") / "small_cnn.keras")
    model.save(path)
    return path, model, x


@pytest.fixture(scope="module")
def saved_model_dir(tmp_path_factory):
    module, x = zoo.mlp_module()
    path = str(tmp_path_factory.mktemp("sm") / "mlp_module")
    tf.saved_model.save(module, path)
    return path, module, x


def test_load_graph_keras_file(keras_file):
    path, model, x = keras_file
    graph = cli.load_graph(path)
    assert graph.name == "small_cnn"
    out = run(graph, {graph.inputs[0].name: x})[graph.outputs[0].name]
    _close(translator.run(model, x)[0], out)


def test_load_graph_saved_model(saved_model_dir):
    path, module, x = saved_model_dir
    graph = files.load_graph(path)
    out = run(graph, {graph.inputs[0].name: x})[graph.outputs[0].name]
    _close(module(x).numpy(), out)


def test_optimize_file_writes_a_saved_model(keras_file, tmp_path):
    path, model, x = keras_file
    out = str(tmp_path / "fast")
    assert cli.optimize_file(path, out).written == [out]
    loaded = tf.saved_model.load(out)
    _close(translator.run(model, x)[0], loaded(x).numpy())


def test_cli_inspect_and_dump(saved_model_dir, tmp_path, capsys):
    path, _, _ = saved_model_dir
    assert cli.main(["inspect", path]) == 0
    printed = capsys.readouterr().out
    assert "MatMul" in printed
    out = str(tmp_path / "g.aiacc")
    assert cli.main(["dump", path, "--format", "text", "-o", out]) == 0
    assert "MatMul" in open(out).read()


def test_bad_paths(tmp_path):
    with pytest.raises(ParseError, match="no such file"):
        files.load_graph(str(tmp_path / "missing.keras"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ParseError, match="without saved_model.pb"):
        files.load_graph(str(tmp_path / "empty"))
    bad = tmp_path / "broken.keras"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ParseError, match="cannot load the Keras file"):
        files.load_graph(str(bad))
    with pytest.raises(UnsupportedError, match="expected a SavedModel directory or a .keras file"):
        files.load_model(__file__)
