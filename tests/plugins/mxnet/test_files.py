"""-symbol.json + .params files: load_graph for `aiacc inspect/dump`, optimize_file for `aiacc optimize`."""
import pytest

from aiacc.core import run
from aiacc.plugins.mxnet import files
from aiacc.plugins.mxnet._import import import_mxnet
from aiacc.plugins.mxnet.translator import MXNetTranslator

from tests.plugins.mxnet.conftest import rel_err

mx = import_mxnet()


@pytest.fixture(scope="module")
def exported(zoo, tmp_path_factory):
    model, ex = zoo("with_opaque")
    model.hybridize()
    model(mx.nd.array(ex[0]))
    d = tmp_path_factory.mktemp("mx")
    model.export(str(d / "net"))
    return str(d / "net-symbol.json"), model, ex


def test_params_found_beside_symbol(exported):
    path, _, _ = exported
    assert files.params_path_for(path).endswith("net-0000.params")


def test_load_graph_with_shapes(exported):
    path, model, ex = exported
    g = files.load_graph(path, input_shapes={"data": ex[0].shape})
    assert [v.name for v in g.inputs] == ["data"] and g.inputs[0].shape == ex[0].shape
    out = run(g, {"data": ex[0]})
    assert rel_err(list(out.values())[0], model(mx.nd.array(ex[0])).asnumpy()) < 1e-4


def test_load_graph_without_shapes_gives_symbolic_input(exported):
    path, _, _ = exported
    g = files.load_graph(path)  # the input feeds a 3x3 convolution over 3 channels
    assert g.inputs[0].shape == ("N", 3, "H", "W")
    assert g.outputs[0].shape == ("N", 5)
    assert not [n for n in g if n.is_opaque and n.op != "smooth_l1"]


def test_optimize_file_without_shapes_works_at_any_size(exported, tmp_path):
    path, model, ex = exported
    files.optimize_file(path, str(tmp_path / "dyn"))
    sym_path, params_path = files.written_paths(str(tmp_path / "dyn"))
    block = mx.gluon.SymbolBlock.imports(sym_path, ["data"], params_path)
    for shape in [(1, 3, 8, 8), (3, 3, 10, 14)]:
        x = mx.nd.random.normal(shape=shape)
        assert rel_err(block(x).asnumpy(), model(x).asnumpy()) < 1e-4


def test_optimize_file_writes_loadable_files(exported, tmp_path):
    path, model, ex = exported
    report = files.optimize_file(path, str(tmp_path / "out" / "net-opt"), input_shapes={"data": ex[0].shape})
    assert report is not None
    written = files.written_paths(str(tmp_path / "out" / "net-opt"))
    assert [p.rsplit("/", 1)[1] for p in written] == ["net-opt-symbol.json", "net-opt-0000.params"]
    block = mx.gluon.SymbolBlock.imports(written[0], ["data"], written[1])
    expected = model(mx.nd.array(ex[0])).asnumpy()
    assert rel_err(block(mx.nd.array(ex[0])).asnumpy(), expected) < 1e-4
    ops = [n.op for n in files.load_graph(written[0], input_shapes={"data": ex[0].shape})]
    # the BatchNorm after conv2 is folded; the one after the opaque node has no conv to fold into
    assert ops.count("BatchNormalization") == 1 and ops.count("Conv") == 2
    assert "smooth_l1" in ops


def test_trace_accepts_a_path(exported):
    path, model, ex = exported
    out = MXNetTranslator().run(path, ex)
    assert rel_err(out[0], model(mx.nd.array(ex[0])).asnumpy()) < 1e-6


def test_cli_inspect_reads_symbol_files(exported, capsys):
    from aiacc import cli

    path, _, _ = exported
    g = cli.load_graph(path)
    assert g.op_histogram()["Conv"] == 2
